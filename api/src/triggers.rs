//! A model's retraining triggers as the console API takes and shows them
//! (`PUT|GET /api/v1/models/{name}/triggers`): the triggers themselves,
//! and what the trigger task last saw and decided.

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::drift::DriftConfig;
use crate::error::field_error;
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

/// One trigger: its id and what fires it. In JSON one flat object, whose
/// `kind` says which other fields apply ([`TRIGGER_KINDS`]); its schema is
/// one object per kind (`crate::schema::triggers::trigger_spec`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TriggerSpec {
    pub id: String,
    #[serde(flatten)]
    pub condition: TriggerCondition,
}

/// What fires a trigger, by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TriggerCondition {
    Drift {
        /// The severity (largest PSI) that counts (default 0.2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_severity: Option<f64>,
        /// For at least this long (default 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_duration_seconds: Option<i64>,
        /// And, when labels exist, accuracy at least this many points down.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_accuracy_drop_points: Option<f64>,
    },
    AccuracyDrop {
        /// Points under the evaluated accuracy.
        points: f64,
    },
    NewLabels {
        /// Labelled samples since the last retrain.
        min: u64,
    },
    Schedule {
        /// Five-field cron, UTC.
        cron: String,
        /// Only inside this daily UTC window, `HH:MM-HH:MM`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<String>,
    },
}

impl TriggerCondition {
    /// The `kind` the JSON writes.
    pub fn kind(&self) -> &'static str {
        match self {
            TriggerCondition::Drift { .. } => "drift",
            TriggerCondition::AccuracyDrop { .. } => "accuracy_drop",
            TriggerCondition::NewLabels { .. } => "new_labels",
            TriggerCondition::Schedule { .. } => "schedule",
        }
    }
}

/// Every field a trigger's object may have, in the order refusals list them.
const TRIGGER_FIELDS: &[&str] = &[
    "id",
    "kind",
    "min_severity",
    "min_duration_seconds",
    "min_accuracy_drop_points",
    "points",
    "min",
    "cron",
    "window",
];

/// Read from the flat object, checked against [`TRIGGER_KINDS`] so that
/// each refusal names its field: an unknown `kind`, another kind's field
/// (`null` counts as absent), a required field missing, a value of the
/// wrong type. A derived internally tagged enum refuses the same objects
/// but cannot name these fields (serde reads the object whole before it
/// knows the kind), so the checks are written out here.
impl<'de> Deserialize<'de> for TriggerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut fields = Map::<String, Value>::deserialize(d)?;
        if let Some(unknown) = fields
            .keys()
            .find(|k| !TRIGGER_FIELDS.contains(&k.as_str()))
        {
            return Err(de::Error::unknown_field(unknown, TRIGGER_FIELDS));
        }
        let id: String = field(&mut fields, "id")?.ok_or_else(|| de::Error::missing_field("id"))?;
        let kind: String =
            field(&mut fields, "kind")?.ok_or_else(|| de::Error::missing_field("kind"))?;
        let Some((kind, required, optional)) = TRIGGER_KINDS.iter().find(|(k, _, _)| *k == kind)
        else {
            let kinds: Vec<&str> = TRIGGER_KINDS.iter().map(|(k, _, _)| *k).collect();
            return Err(field_error(
                "kind",
                format!(
                    "unknown kind {kind:?}; expected one of {kinds:?} (a manual retrain is \
                     POST /api/v1/models/{{name}}/retrain)"
                ),
            ));
        };
        for (name, value) in &fields {
            let own = required.contains(&name.as_str()) || optional.contains(&name.as_str());
            if own || value.is_null() {
                continue;
            }
            if let Some((owner, _, _)) = TRIGGER_KINDS
                .iter()
                .find(|(_, r, o)| r.contains(&name.as_str()) || o.contains(&name.as_str()))
            {
                return Err(field_error(name, format!("applies to kind {owner:?} only")));
            }
        }
        let condition = match *kind {
            "accuracy_drop" => TriggerCondition::AccuracyDrop {
                points: needed(&mut fields, "points", kind)?,
            },
            "new_labels" => TriggerCondition::NewLabels {
                min: needed(&mut fields, "min", kind)?,
            },
            "schedule" => TriggerCondition::Schedule {
                cron: needed(&mut fields, "cron", kind)?,
                window: field(&mut fields, "window")?,
            },
            _ => TriggerCondition::Drift {
                min_severity: field(&mut fields, "min_severity")?,
                min_duration_seconds: field(&mut fields, "min_duration_seconds")?,
                min_accuracy_drop_points: field(&mut fields, "min_accuracy_drop_points")?,
            },
        };
        Ok(TriggerSpec { id, condition })
    }
}

/// Field `name` taken out of `fields`, typed; `None` when absent or `null`.
fn field<T: DeserializeOwned, E: de::Error>(
    fields: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<T>, E> {
    match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => typed(name, v).map(Some),
    }
}

/// Field `name`, which kind `kind` requires, taken out of `fields`, typed.
fn needed<T: DeserializeOwned, E: de::Error>(
    fields: &mut Map<String, Value>,
    name: &str,
    kind: &str,
) -> Result<T, E> {
    field(fields, name)?.ok_or_else(|| field_error(name, format!("is required for kind {kind:?}")))
}

/// `value` as field `name`'s type, or a refusal naming the field.
fn typed<T: DeserializeOwned, E: de::Error>(name: &str, value: Value) -> Result<T, E> {
    T::deserialize(value).map_err(|e| field_error(name, e))
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TriggerSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::schema::triggers::trigger_spec().into()
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

    /// The OpenAPI schema of a trigger and its reading are built from
    /// [`TRIGGER_KINDS`]: each kind's fields there are the ones its variant
    /// writes.
    #[test]
    fn each_kind_writes_the_fields_of_the_kind_table() {
        let every = [
            TriggerCondition::Drift {
                min_severity: Some(0.2),
                min_duration_seconds: Some(0),
                min_accuracy_drop_points: Some(1.0),
            },
            TriggerCondition::AccuracyDrop { points: 1.0 },
            TriggerCondition::NewLabels { min: 1 },
            TriggerCondition::Schedule {
                cron: "* * * * *".into(),
                window: Some("01:00-02:00".into()),
            },
        ];
        assert_eq!(every.len(), TRIGGER_KINDS.len());
        for condition in every {
            let kind = condition.kind();
            let spec = TriggerSpec {
                id: "t".into(),
                condition,
            };
            let serde_json::Value::Object(fields) = serde_json::to_value(&spec).unwrap() else {
                panic!("a trigger is an object")
            };
            assert_eq!(fields["kind"], kind);
            let mut written: Vec<&str> = fields.keys().map(String::as_str).collect();
            let (_, required, optional) = TRIGGER_KINDS.iter().find(|(k, ..)| *k == kind).unwrap();
            let mut table: Vec<&str> = required.iter().chain(optional.iter()).copied().collect();
            table.extend(["id", "kind"]);
            written.sort_unstable();
            table.sort_unstable();
            assert_eq!(written, table, "{kind}");
            let back: TriggerSpec =
                serde_json::from_value(serde_json::Value::Object(fields)).unwrap();
            assert_eq!(back, spec);
        }
        let mut fields: Vec<&str> = TRIGGER_KINDS
            .iter()
            .flat_map(|(_, required, optional)| required.iter().chain(optional.iter()))
            .copied()
            .chain(["id", "kind"])
            .collect();
        let mut listed = TRIGGER_FIELDS.to_vec();
        fields.sort_unstable();
        listed.sort_unstable();
        assert_eq!(fields, listed);
    }

    /// A trigger stored before the kinds were typed (the same JSON).
    #[test]
    fn a_stored_trigger_config_reads_back_and_writes_the_same_json() {
        let stored = serde_json::json!({
            "cooldown_seconds": 3600, "accuracy_window": 200, "accuracy_min_samples": 50,
            "triggers": [
                {"id": "hurts", "kind": "drift", "min_severity": 0.2,
                 "min_duration_seconds": 60, "min_accuracy_drop_points": 5.0},
                {"id": "calm", "kind": "drift"},
                {"id": "acc", "kind": "accuracy_drop", "points": 5.0},
                {"id": "labels", "kind": "new_labels", "min": 1000},
                {"id": "nightly", "kind": "schedule", "cron": "0 2 * * *", "window": "02:00-04:00"}
            ]
        });
        let config: TriggersConfig = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(
            config.triggers[3].condition,
            TriggerCondition::NewLabels { min: 1000 }
        );
        assert_eq!(serde_json::to_value(&config).unwrap(), stored);
    }

    /// Each refusal names its field (the server's body parser reads the
    /// name back, see [`crate::error::field_of`]).
    #[test]
    fn refusals_name_the_field() {
        let refused = |t: serde_json::Value| {
            serde_json::from_value::<TriggerSpec>(t)
                .unwrap_err()
                .to_string()
        };
        let named = |t: serde_json::Value| {
            let message = refused(t.clone());
            let (field, why) =
                crate::error::field_of(&message).unwrap_or_else(|| panic!("{t}: {message}"));
            (field.to_string(), why.to_string())
        };
        let (field, why) = named(serde_json::json!({"id": "a", "kind": "manual"}));
        assert_eq!(field, "kind");
        assert!(
            why.starts_with("unknown kind \"manual\"; expected one of"),
            "{why}"
        );
        assert!(why.contains("POST /api/v1/models/{name}/retrain"), "{why}");
        assert_eq!(
            named(serde_json::json!({"id": "a", "kind": "drift", "points": 3})),
            (
                "points".into(),
                "applies to kind \"accuracy_drop\" only".into()
            )
        );
        assert_eq!(
            named(serde_json::json!({"id": "a", "kind": "schedule", "window": "01:00-02:00"})),
            ("cron".into(), "is required for kind \"schedule\"".into())
        );
        assert_eq!(
            named(serde_json::json!({"id": "a", "kind": "new_labels", "min": -1})).0,
            "min"
        );
        assert_eq!(named(serde_json::json!({"id": 5, "kind": "drift"})).0, "id");
        // Another kind's field may be null: it is absent.
        let t: TriggerSpec = serde_json::from_value(
            serde_json::json!({"id": "a", "kind": "accuracy_drop", "points": 2, "min": null, "cron": null}),
        )
        .unwrap();
        assert_eq!(t.condition, TriggerCondition::AccuracyDrop { points: 2.0 });
        // What serde itself says, as before.
        assert!(
            refused(serde_json::json!({"id": "a", "kind": "drift", "typo": 1}))
                .starts_with("unknown field `typo`")
        );
        assert_eq!(
            refused(serde_json::json!({"kind": "drift"})),
            "missing field `id`"
        );
    }
}
