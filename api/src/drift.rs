//! Drift as the console API shows it (`GET /api/v1/models/{name}/drift`):
//! the thresholds it used and, per device group, the series of windows
//! compared with the manifest's reference statistics. The server computes
//! them (`drift/src/analysis.rs`); `docs/drift.md` explains them.

use serde::{Deserialize, Serialize};

use crate::UnixSeconds;

/// Thresholds; every one is configurable per request (and, with the
/// triggers, per model). Defaults follow the usual rules of thumb.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DriftConfig {
    /// 1 s to 30 days.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 2_592_000))]
    pub window_seconds: i64,
    /// PSI at which a feature is worth watching (0.1) and acting on (0.2);
    /// the watch threshold does not exceed the act threshold.
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub psi_watch: f64,
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub psi_act: f64,
    /// Jensen–Shannon distance of the predicted classes that counts as drift.
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub js_act: f64,
    /// KS p-value under which a feature's shift is significant.
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub ks_alpha: f64,
    /// Windows with fewer requests are reported but not judged.
    #[cfg_attr(
        feature = "openapi",
        schema(format = "uint64", maximum = 18_446_744_073_709_551_615_u64)
    )]
    pub min_requests: u64,
    /// Windows over a threshold in a row that set the drift state, and
    /// under that clear it (at least 1).
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub set_after: u32,
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub clear_after: u32,
}

impl Default for DriftConfig {
    fn default() -> Self {
        DriftConfig {
            window_seconds: 3600,
            psi_watch: 0.1,
            psi_act: 0.2,
            js_act: 0.1,
            ks_alpha: 0.01,
            min_requests: 100,
            set_after: 3,
            clear_after: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FeatureDrift {
    pub name: String,
    pub psi: Option<f64>,
    pub ks_statistic: Option<f64>,
    pub ks_p_value: Option<f64>,
    /// Jensen–Shannon distance (base 2, in [0, 1]) of the window's
    /// histogram from the reference's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub js_distance: Option<f64>,
    /// By PSI against the watch and act thresholds.
    pub level: DriftLevel,
}

/// A feature's drift by PSI: under `psi_watch`, at least `psi_watch`, at
/// least `psi_act`; `unknown` when the window had no values for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DriftLevel {
    Stable,
    Watch,
    Act,
    Unknown,
}

impl DriftLevel {
    /// As the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftLevel::Stable => "stable",
            DriftLevel::Watch => "watch",
            DriftLevel::Act => "act",
            DriftLevel::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WindowDrift {
    /// Unix seconds at the window's start.
    pub start: UnixSeconds,
    pub requests: u64,
    pub devices: usize,
    pub features: Vec<FeatureDrift>,
    pub prediction_js: Option<f64>,
    /// Share of requests in the lowest confidence bins (top-class
    /// probability under 0.5).
    pub low_confidence_share: Option<f64>,
    /// Largest PSI over features: the window's severity.
    pub severity: f64,
    /// Whether this window alone is over a threshold; `None` when it had
    /// too few requests to judge.
    pub over: Option<bool>,
    /// The hysteresis state after this window.
    pub drifting: bool,
    /// Feedback labels for predictions made in this window, and the share
    /// the model got right.
    #[serde(default)]
    pub labelled: u64,
    #[serde(default)]
    pub accuracy: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DriftSeries {
    /// `all`, or the value of the grouping label.
    pub group: String,
    pub windows: Vec<WindowDrift>,
}

/// `GET /api/v1/models/{name}/drift`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DriftView {
    pub model: String,
    pub version: String,
    pub config: DriftConfig,
    pub series: Vec<DriftSeries>,
}
