//! A model's retraining triggers as the console API takes and shows them
//! (`PUT|GET /api/v1/models/{name}/triggers`): the triggers themselves,
//! and what the trigger task last saw and decided.

use serde::{Deserialize, Serialize};

use crate::drift::DriftConfig;
use crate::UnixSeconds;

/// The trigger kinds, each with the fields it requires and those it may
/// have; another kind's fields must be absent (or `null`).
pub const TRIGGER_KINDS: [(&str, &[&str], &[&str]); 4] = [
    (
        "drift",
        &[],
        &[
            "min_severity",
            "min_duration_seconds",
            "min_accuracy_drop_points",
        ],
    ),
    ("accuracy_drop", &["points"], &[]),
    ("new_labels", &["min"], &[]),
    ("schedule", &["cron"], &["window"]),
];

/// A cron expression's five fields and their ranges (crontab(5); Sunday
/// is 0 or 7).
pub const CRON_FIELDS: [(&str, u32, u32); 5] = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

/// The request body of `PUT .../triggers` (and what is stored); the server
/// checks it field by field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TriggersConfig {
    /// No automatic retrain starts within this long of the last one
    /// (default 3600; up to 90 days).
    #[serde(default = "default_cooldown")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 7_776_000))]
    pub cooldown_seconds: i64,
    /// The model's drift thresholds (defaults: `GET .../drift` documents them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftConfig>,
    /// Online accuracy is measured over this many newest labelled samples
    /// of the serving version (default 200; up to 100000)...
    #[serde(default = "default_accuracy_window")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub accuracy_window: u64,
    /// ...and only once there are this many (default 50; at most
    /// `accuracy_window`).
    #[serde(default = "default_accuracy_min")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub accuracy_min_samples: u64,
    /// Ids are unique in the list.
    #[serde(default)]
    pub triggers: Vec<TriggerSpec>,
}

fn default_cooldown() -> i64 {
    3600
}
fn default_accuracy_window() -> u64 {
    200
}
fn default_accuracy_min() -> u64 {
    50
}

/// One trigger; which fields apply depends on `kind` ([`TRIGGER_KINDS`]).
/// Its schema is one object per kind (`crate::schema::trigger_spec`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerSpec {
    pub id: String,
    /// `drift`, `accuracy_drop`, `new_labels` or `schedule`.
    pub kind: String,
    /// drift: the severity (largest PSI) that counts (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_severity: Option<f64>,
    /// drift: for at least this long (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_duration_seconds: Option<i64>,
    /// drift: and, when labels exist, accuracy at least this many points down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_accuracy_drop_points: Option<f64>,
    /// accuracy_drop: points under the evaluated accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub points: Option<f64>,
    /// new_labels: labelled samples since the last retrain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// schedule: five-field cron, UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// schedule: only inside this daily UTC window, `HH:MM-HH:MM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TriggerSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::schema::trigger_spec().into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for TriggerSpec {}

/// What the scheduler knew about the model when it last evaluated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelState {
    /// The pipeline of a retrain in progress.
    pub running: Option<String>,
    pub last_started: Option<UnixSeconds>,
    /// No new retrain starts within this long of the last one, except a
    /// manual one.
    pub cooldown_seconds: i64,
    /// When the current drift state was set, and its severity (e.g. the
    /// largest PSI); `None` when not drifting.
    pub drifting_since: Option<UnixSeconds>,
    pub drift_severity: f64,
    /// The features that moved most in the latest window (PSI, largest
    /// first, at most three) while drifting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift_features: Vec<FeatureMove>,
    pub evaluated_accuracy: Option<f64>,
    pub online_accuracy: Option<f64>,
    pub labels_since_last: u64,
    pub manual_requested: bool,
    /// The minute a schedule last fired, so it fires once per minute.
    pub schedule_fired_minute: Option<UnixSeconds>,
}

/// A feature and how far it moved (its PSI against the reference).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FeatureMove {
    pub name: String,
    pub psi: f64,
}

/// One evaluation of a model's triggers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Evaluation {
    pub at: UnixSeconds,
    /// The serving version the drift and accuracy are about.
    pub version: Option<String>,
    pub state: ModelState,
    /// None when nothing fired.
    pub decision: Option<DecisionKind>,
    pub reasons: Vec<String>,
    pub pipeline: Option<String>,
}

/// The trigger task's memory of a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TriggerState {
    /// The minute a schedule last fired, so it fires once per minute.
    pub schedule_fired_minute: Option<UnixSeconds>,
    pub last: Option<Evaluation>,
}

/// `GET|PUT /api/v1/models/{name}/triggers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TriggersView {
    pub model: String,
    pub config: TriggersConfig,
    /// The last evaluation: the state the scheduler saw (drift, online and
    /// evaluated accuracy, labels since the last retrain, the running
    /// pipeline) and its decision.
    pub state: TriggerState,
}

/// What an evaluation that fired decided: start a retrain, record the
/// trigger on the one running, or wait out the cooldown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    Start,
    Coalesce,
    Cooldown,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OpenAPI schema of a trigger is built from [`TRIGGER_KINDS`], not
    /// derived: every field of [`TriggerSpec`] must be in the table.
    #[test]
    fn every_trigger_field_is_in_the_kind_table() {
        let all = TriggerSpec {
            id: "t".into(),
            kind: "drift".into(),
            min_severity: Some(0.2),
            min_duration_seconds: Some(0),
            min_accuracy_drop_points: Some(1.0),
            points: Some(1.0),
            min: Some(1),
            cron: Some("* * * * *".into()),
            window: Some("01:00-02:00".into()),
        };
        let serde_json::Value::Object(fields) = serde_json::to_value(all).unwrap() else {
            panic!("a trigger is an object")
        };
        let mut written: Vec<&str> = fields.keys().map(String::as_str).collect();
        let mut table: Vec<&str> = TRIGGER_KINDS
            .iter()
            .flat_map(|(_, required, optional)| required.iter().chain(optional.iter()))
            .copied()
            .chain(["id", "kind"])
            .collect();
        written.sort_unstable();
        table.sort_unstable();
        assert_eq!(written, table);
    }
}
