//! Staged rollouts as the console API shows them (`/api/v1/deployments`).
//!
//! The rollout's data types live here, not in the control plane, because
//! `GET /api/v1/deployments/{id}` shows the controller's state verbatim
//! (waves, gate evidence, the event log): one definition means the CLI
//! reads exactly what the controller wrote, and a renamed field fails to
//! compile on both sides. The controller's *logic* (and the validation that
//! needs the server's error type) stays in `control-plane/src/fleet/rollout`,
//! and the store's record around a deployment in
//! `control-plane/src/fleet/deployments.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::aliases::AliasName;
use crate::UnixSeconds;

/// Where each wave ends, cumulatively.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waves {
    /// Cumulative percentages of the group, e.g. `[1, 10, 50, 100]`. Each
    /// cut is rounded up, so a non-empty group puts at least one device in
    /// the first wave.
    Percent(Vec<u32>),
    /// Cumulative device counts, e.g. `[1, 5, 20]`. The last wave also takes
    /// every remaining device: a deployment targets the whole group.
    Count(Vec<usize>),
}

impl Waves {
    pub fn len(&self) -> usize {
        match self {
            Waves::Percent(p) => p.len(),
            Waves::Count(c) => c.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strategy {
    pub waves: Waves,
    /// How long a wave must run active on the new version before the next
    /// one starts.
    pub min_soak_seconds: i64,
    /// How long a wave may take, from its start, to become healthy.
    pub wave_timeout_seconds: i64,
    /// How long a rollback waits for online devices to confirm they are back.
    pub rollback_timeout_seconds: i64,
}

/// Health gates, read from agent telemetry while a wave soaks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gates {
    /// Errors / requests on the new version, over every moved device.
    pub max_error_rate: f64,
    /// New p99 latency / the previous version's p99 on the same devices.
    pub max_p99_latency_ratio: f64,
    /// Devices whose activation failed, over the whole deployment.
    pub max_activation_failures: u32,
    #[serde(default)]
    pub min_online_accuracy: Option<f64>,
    /// Traffic needed before the rate gates are judged and before a wave may
    /// pass: with a handful of requests one error would trip the gate, and a
    /// wave that saw no traffic has proven nothing.
    #[serde(default)]
    pub min_requests: u64,
}

/// The rollout controller's state for one deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    pub id: String,
    /// The device group's label selector, for the record; the fleet state
    /// the controller is given is already that group.
    pub group: String,
    pub model: String,
    pub target_version: String,
    /// Picks the wave order; a retry with the same seed picks the same devices.
    pub seed: String,
    pub strategy: Strategy,
    pub gates: Gates,
    /// Fraction of a wave's devices allowed to be offline when it passes.
    pub offline_tolerance: f64,
    /// The whole deployment must finish its waves by this time.
    pub deadline: UnixSeconds,
    pub state: RolloutState,
    /// Devices given the target, with what they ran before (captured when
    /// they were moved, so a rollback knows where to send each one back).
    #[serde(default)]
    pub moved: BTreeMap<String, Moved>,
    /// Devices the compatibility pre-check excluded, with the reason.
    #[serde(default)]
    pub skipped: BTreeMap<String, String>,
    #[serde(default)]
    pub cancel_requested: bool,
    /// Set when a newer deployment for the same group replaces this one.
    #[serde(default)]
    pub superseded_by: Option<String>,
    /// Bumped on every change, so the persisting task can compare and swap.
    #[serde(default)]
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub wave: usize,
    /// `None`: the device ran no version of this model before.
    pub previous: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RolloutState {
    Pending,
    Wave {
        index: usize,
        started_at: UnixSeconds,
        /// Set once every online device in the wave runs the target, so the
        /// soak measures time on the new version, not download time.
        soak_until: Option<UnixSeconds>,
    },
    /// Reverts were issued; waiting for online devices to confirm.
    RollingBack {
        started_at: UnixSeconds,
        /// The terminal state to end in.
        then: Box<RolloutState>,
    },
    Succeeded,
    RolledBack {
        reason: String,
        /// Boxed: the evidence is large, and the other states small.
        evidence: Box<Evidence>,
    },
    Failed {
        reason: String,
    },
    Cancelled {
        reason: CancelReason,
    },
}

impl RolloutState {
    pub fn is_terminal(&self) -> bool {
        self.name().is_terminal()
    }

    pub fn name(&self) -> DeploymentState {
        match self {
            RolloutState::Pending => DeploymentState::Pending,
            RolloutState::Wave { .. } => DeploymentState::Wave,
            RolloutState::RollingBack { .. } => DeploymentState::RollingBack,
            RolloutState::Succeeded => DeploymentState::Succeeded,
            RolloutState::RolledBack { .. } => DeploymentState::RolledBack,
            RolloutState::Failed { .. } => DeploymentState::Failed,
            RolloutState::Cancelled { .. } => DeploymentState::Cancelled,
        }
    }

    /// Why it ended, for the states that carry a reason.
    pub fn reason(&self) -> Option<&str> {
        match self {
            RolloutState::RolledBack { reason, .. } | RolloutState::Failed { reason } => {
                Some(reason)
            }
            _ => None,
        }
    }
}

/// [`RolloutState`] without its details: the view's top-level `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeploymentState {
    Pending,
    Wave,
    RollingBack,
    Succeeded,
    RolledBack,
    Failed,
    Cancelled,
}

impl DeploymentState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            DeploymentState::Succeeded
                | DeploymentState::RolledBack
                | DeploymentState::Failed
                | DeploymentState::Cancelled
        )
    }

    /// As the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentState::Pending => "pending",
            DeploymentState::Wave => "wave",
            DeploymentState::RollingBack => "rolling_back",
            DeploymentState::Succeeded => "succeeded",
            DeploymentState::RolledBack => "rolled_back",
            DeploymentState::Failed => "failed",
            DeploymentState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CancelReason {
    Requested,
    Superseded { by: String },
}

/// The numbers a gate decision was made on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub wave: usize,
    pub moved_devices: usize,
    pub requests: u64,
    pub errors: u64,
    pub error_rate: Option<f64>,
    /// Request-weighted mean of per-device p99s (p99s cannot be merged
    /// exactly), on the new version and on the previous one, over devices
    /// that have both.
    pub p99_latency_ms: Option<f64>,
    pub baseline_p99_latency_ms: Option<f64>,
    pub p99_latency_ratio: Option<f64>,
    /// `device: reason` for each device whose activation failed.
    pub activation_failures: Vec<String>,
    pub online_accuracy: Option<f64>,
    /// About the current wave only.
    pub wave_devices: usize,
    pub offline: Vec<String>,
    pub not_active: Vec<String>,
    /// Per variant (`own` for the version's own artifact), when the moved
    /// devices run more than the version's own: each is gated by itself,
    /// so a variant that fails on its hardware is not averaged away by the
    /// devices running another.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, TrafficEvidence>,
}

/// The traffic numbers of one group of moved devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrafficEvidence {
    pub devices: usize,
    pub requests: u64,
    pub errors: u64,
    pub error_rate: Option<f64>,
    pub p99_latency_ms: Option<f64>,
    pub baseline_p99_latency_ms: Option<f64>,
    pub p99_latency_ratio: Option<f64>,
    pub online_accuracy: Option<f64>,
}

/// The name per-variant evidence gives the version's own artifact.
pub const OWN_ARTIFACT: &str = "own";

/// An entry of a deployment's evidence log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    WaveStarted {
        index: usize,
        assigned: Vec<String>,
        /// `(device, reason)` for devices the compatibility check excluded.
        skipped: Vec<(String, String)>,
    },
    WaveHealthy {
        index: usize,
        evidence: Evidence,
    },
    RollbackStarted {
        reason: String,
        reverted: Vec<String>,
    },
    Finished {
        state: RolloutState,
        /// Online devices that had not confirmed the revert when the
        /// rollback timed out; they converge from their stored assignment.
        unconfirmed: Vec<String>,
    },
}

impl Event {
    /// One line for a person: what the CLI and the web console print.
    pub fn summary(&self) -> String {
        match self {
            Event::WaveStarted {
                index,
                assigned,
                skipped,
            } => {
                let mut s = format!("wave {} started: {} devices", index + 1, assigned.len());
                if !skipped.is_empty() {
                    s.push_str(&format!(", {} skipped", skipped.len()));
                }
                s
            }
            Event::WaveHealthy { index, evidence } => format!(
                "wave {} healthy: {} requests, {} errors",
                index + 1,
                evidence.requests,
                evidence.errors
            ),
            Event::RollbackStarted { reason, reverted } => {
                format!("rolling back {} devices: {reason}", reverted.len())
            }
            Event::Finished { state, unconfirmed } => {
                let mut s = format!("finished: {}", state.name().as_str());
                if let Some(r) = state.reason() {
                    s.push_str(&format!(" ({r})"));
                }
                if !unconfirmed.is_empty() {
                    s.push_str(&format!(", {} devices unconfirmed", unconfirmed.len()));
                }
                s
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventEntry {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub event: Event,
}

/// What a device must offer to take the version. Checked per device when
/// its wave starts; a device that fails is skipped with the reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Requirements {
    /// An execution provider the device's ONNX Runtime must ship, e.g.
    /// `CUDAExecutionProvider`.
    #[serde(default)]
    pub provider: Option<String>,
    /// The model's input element types, from its manifest.
    #[serde(default)]
    pub input_dtypes: Vec<String>,
    /// The artifact's size: the device keeps the serving version beside it.
    #[serde(default)]
    pub free_disk_bytes: u64,
}

/// One deployment: `POST`/`GET /api/v1/deployments...`. `events` is empty
/// in lists and on create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeploymentView {
    pub id: String,
    /// Creation order; a newer deployment's assignments win.
    pub seq: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub deployment: Deployment,
    pub requirements: Requirements,
    /// The alias the request named, if it named one; `deployment.target_version`
    /// is the version it pointed at when the deployment was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<AliasName>,
    pub activation_timeout_seconds: u32,
    /// The assignment-set generation at which each moved device got its
    /// assignment.
    #[serde(default)]
    pub assigned_generation: BTreeMap<String, u64>,
    /// The version's variant each moved device got (`GET
    /// /api/v1/models/{m}/versions/{v}`); a device not listed got the
    /// version's own artifact.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The state's name; the details are in `deployment.state`.
    pub state: DeploymentState,
    #[serde(default)]
    pub events: Vec<EventEntry>,
}

/// `POST /api/v1/deployments`: only `model`, `version` (or `alias`) and
/// `selector` are required; the server's defaults fill the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateDeployment {
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub model: String,
    /// The version to roll out. Give this or `alias`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
            min_length = 1,
            max_length = 64
        )
    )]
    pub version: Option<String>,
    /// An alias of the model (`production`), resolved to its version when
    /// the deployment is created: moving the alias later does not change
    /// what this deployment rolls out. Give this or `version`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<AliasName>,
    /// The device group, as a label selector (`GET /api/v1/devices?selector=`).
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::deployments::selector))]
    pub selector: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<GatesRequest>,
    /// Fraction of a wave's devices that may be offline when it passes
    /// (default 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, exclusive_maximum = 1.0))]
    pub offline_tolerance: Option<f64>,
    /// Seconds the waves may take in all (default: waves × wave timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub deadline_seconds: Option<i64>,
    /// Picks the wave order (default: the deployment id). Reuse a seed to
    /// have a retry move the same devices first.
    /// At most 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 128))]
    pub seed: Option<String>,
    /// At most 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 128))]
    pub required_provider: Option<String>,
    /// How long a device may take to download and activate (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub activation_timeout_seconds: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StrategyRequest {
    /// `{"percent": [1, 10, 50, 100]}` (cumulative, increasing, ending at
    /// 100) or `{"count": [1, 5, 20]}` (cumulative; the last wave takes the rest).
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::deployments::waves))]
    pub waves: Waves,
    /// Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub min_soak_seconds: Option<i64>,
    /// Default 1800; must be greater than `min_soak_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub wave_timeout_seconds: Option<i64>,
    /// Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub rollback_timeout_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GatesRequest {
    /// Default 0.05.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub max_error_rate: Option<f64>,
    /// Default 1.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub max_p99_latency_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub max_activation_failures: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub min_online_accuracy: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(format = "uint64", maximum = 18_446_744_073_709_551_615_u64)
    )]
    pub min_requests: Option<u64>,
}

impl GatesRequest {
    pub fn is_empty(&self) -> bool {
        *self == GatesRequest::default()
    }
}

pub const DEFAULT_WAVES: [u32; 3] = [10, 50, 100];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_name_matches_the_tag_the_state_is_written_with() {
        let states = [
            RolloutState::Pending,
            RolloutState::Wave {
                index: 0,
                started_at: 1,
                soak_until: None,
            },
            RolloutState::RollingBack {
                started_at: 1,
                then: Box::new(RolloutState::Succeeded),
            },
            RolloutState::Succeeded,
            RolloutState::RolledBack {
                reason: "r".into(),
                evidence: Box::default(),
            },
            RolloutState::Failed { reason: "r".into() },
            RolloutState::Cancelled {
                reason: CancelReason::Requested,
            },
        ];
        for s in states {
            let tag = serde_json::to_value(&s).unwrap()["state"].clone();
            assert_eq!(tag, s.name().as_str(), "{s:?}");
            assert_eq!(serde_json::to_value(s.name()).unwrap(), tag);
        }
    }

    #[test]
    fn a_request_writes_only_what_was_given() {
        let req = CreateDeployment {
            model: "m".into(),
            version: Some("1".into()),
            selector: "a=b".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            serde_json::json!({"model": "m", "version": "1", "selector": "a=b"})
        );
        let by_alias: CreateDeployment = serde_json::from_value(
            serde_json::json!({"model": "m", "alias": "production", "selector": "a=b"}),
        )
        .unwrap();
        assert_eq!(
            by_alias.alias.as_ref().map(AliasName::as_str),
            Some("production")
        );
        assert_eq!(by_alias.version, None);
        let bad = serde_json::from_value::<CreateDeployment>(
            serde_json::json!({"model": "m", "alias": "Prod", "selector": "a=b"}),
        );
        assert!(bad.unwrap_err().to_string().contains("not a valid alias"));
    }
}
