//! A model's triggers as the API takes them (`PUT /api/v1/models/{name}/triggers`),
//! checked field by field and turned into the scheduler's [`Trigger`]s.

use super::{CronExpr, Trigger, TriggerKind};
use edgeloop_errors::{Error, Result};

/// The request body, stored as is: a console API type. Reading it checks
/// each trigger's fields against its kind (which apply, which are
/// required); the values are checked here.
pub use edgeloop_api::triggers::{TriggerCondition, TriggerSpec, TriggersConfig};

fn points_field(field: String, v: f64) -> Result<f64> {
    if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
        return Err(Error::bad_field(field, "must be between 0 and 100 points"));
    }
    Ok(v)
}

/// `HH:MM-HH:MM` as minutes since midnight.
fn parse_window(field: &str, text: &str) -> Result<(u32, u32)> {
    let bad = || Error::bad_field(field, format!("{text:?} is not HH:MM-HH:MM"));
    // Decimal digits only (`u32::from_str` would also take a sign).
    let number = |s: &str| -> Option<u32> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let minute = |s: &str| -> Option<u32> {
        let (h, m) = s.trim().split_once(':')?;
        let (h, m) = (number(h)?, number(m)?);
        (h < 24 && m < 60).then_some(h * 60 + m)
    };
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let (a, b) = (minute(a).ok_or_else(bad)?, minute(b).ok_or_else(bad)?);
    if a == b {
        return Err(Error::bad_field(
            field,
            "the window is empty (start equals end)",
        ));
    }
    Ok((a, b))
}

/// The checks of a [`TriggersConfig`] (a console API type, so its
/// server-side behaviour is a trait here).
pub trait TriggerPolicy {
    /// The scheduler's triggers, or a 400 naming the field at fault.
    fn triggers_for(&self, model: &str) -> Result<Vec<Trigger>>;
}

impl TriggerPolicy for TriggersConfig {
    fn triggers_for(&self, model: &str) -> Result<Vec<Trigger>> {
        if !(0..=90 * 86_400).contains(&self.cooldown_seconds) {
            return Err(Error::bad_field("cooldown_seconds", "must be 0 to 90 days"));
        }
        if self.accuracy_window == 0 || self.accuracy_window > 100_000 {
            return Err(Error::bad_field("accuracy_window", "must be 1 to 100000"));
        }
        if self.accuracy_min_samples == 0 || self.accuracy_min_samples > self.accuracy_window {
            return Err(Error::bad_field(
                "accuracy_min_samples",
                "must be 1 to accuracy_window",
            ));
        }
        if let Some(d) = &self.drift {
            edgeloop_drift::analysis::validate(d, "drift.")?;
        }
        let mut ids = std::collections::BTreeSet::new();
        let mut out = vec![];
        for (i, t) in self.triggers.iter().enumerate() {
            let at = |f: &str| format!("triggers[{i}].{f}");
            edgeloop_errors::validate::name(&at("id"), &t.id)?;
            if !ids.insert(t.id.clone()) {
                return Err(Error::bad_field(
                    at("id"),
                    format!("{:?} is used twice", t.id),
                ));
            }
            let kind = match &t.condition {
                TriggerCondition::Drift {
                    min_severity,
                    min_duration_seconds,
                    min_accuracy_drop_points,
                } => {
                    let min_severity = min_severity.unwrap_or(0.2);
                    if !(min_severity.is_finite() && min_severity > 0.0) {
                        return Err(Error::bad_field(at("min_severity"), "must be positive"));
                    }
                    let min_duration_seconds = min_duration_seconds.unwrap_or(0);
                    if !(0..=90 * 86_400).contains(&min_duration_seconds) {
                        return Err(Error::bad_field(
                            at("min_duration_seconds"),
                            "must be 0 to 90 days",
                        ));
                    }
                    TriggerKind::Drift {
                        min_severity,
                        min_duration_seconds,
                        min_accuracy_drop_points: min_accuracy_drop_points
                            .map(|p| points_field(at("min_accuracy_drop_points"), p))
                            .transpose()?,
                    }
                }
                TriggerCondition::AccuracyDrop { points } => TriggerKind::AccuracyDrop {
                    points: points_field(at("points"), *points)?,
                },
                TriggerCondition::NewLabels { min } => {
                    if *min == 0 {
                        return Err(Error::bad_field(
                            at("min"),
                            format!("is required for kind {:?}", t.condition.kind()),
                        ));
                    }
                    TriggerKind::NewLabels { min: *min }
                }
                TriggerCondition::Schedule { cron, window } => {
                    let cron: CronExpr = cron.parse().map_err(|e: super::CronError| {
                        Error::bad_field(at(&format!("cron.{}", e.field)), e.message)
                    })?;
                    let window = window
                        .as_deref()
                        .map(|w| parse_window(&at("window"), w))
                        .transpose()?;
                    TriggerKind::Schedule { cron, window }
                }
            };
            out.push(Trigger {
                id: t.id.clone(),
                model: model.to_string(),
                kind,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::rest::json::parse_body;

    fn config(triggers: serde_json::Value) -> TriggersConfig {
        serde_json::from_value(serde_json::json!({ "triggers": triggers })).unwrap()
    }

    /// `triggers` as the API takes them: the body read (which checks the
    /// fields each kind has), then the values checked.
    fn checked(triggers: serde_json::Value) -> Result<Vec<Trigger>> {
        let body = serde_json::json!({ "triggers": triggers }).to_string();
        parse_body::<TriggersConfig>(body.as_bytes())?.triggers_for("m")
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (
                serde_json::json!([{"id": "a", "kind": "nope"}]),
                "triggers[0].kind",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "accuracy_drop"}]),
                "triggers[0].points",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "accuracy_drop", "points": 200}]),
                "triggers[0].points",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "new_labels", "min": 0}]),
                "triggers[0].min",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "schedule", "cron": "61 * * * *"}]),
                "triggers[0].cron.minute",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "schedule", "cron": "0 * * * *", "window": "2-4"}]),
                "triggers[0].window",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "schedule", "cron": "0 * * * *", "window": "+2:00-4:00"}]),
                "triggers[0].window",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "drift", "points": 3}]),
                "triggers[0].points",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "drift"}, {"id": "a", "kind": "drift"}]),
                "triggers[1].id",
            ),
            (
                serde_json::json!([{"id": "A b", "kind": "drift"}]),
                "triggers[0].id",
            ),
        ];
        for (triggers, field) in cases {
            let e = checked(triggers.clone()).unwrap_err();
            match e {
                Error::BadRequest { field: Some(f), .. } => assert_eq!(f, field, "{triggers}"),
                other => panic!("{triggers}: {other}"),
            }
        }
    }

    /// The refusals that reading a trigger makes say what they said when
    /// the checks were here.
    #[test]
    fn the_refusals_read_as_before() {
        let cases = [
            (
                serde_json::json!([{"id": "a", "kind": "sometimes"}]),
                "triggers[0].kind",
                "unknown kind \"sometimes\"; expected one of [\"drift\", \"accuracy_drop\", \"new_labels\", \"schedule\"] (a manual retrain is POST /api/v1/models/{name}/retrain)",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "drift", "cron": "0 * * * *"}]),
                "triggers[0].cron",
                "applies to kind \"schedule\" only",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "accuracy_drop"}]),
                "triggers[0].points",
                "is required for kind \"accuracy_drop\"",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "new_labels", "min": 0}]),
                "triggers[0].min",
                "is required for kind \"new_labels\"",
            ),
            (
                serde_json::json!([{"id": "a", "kind": "accuracy_drop", "points": "five"}]),
                "triggers[0].points",
                "invalid type: string \"five\", expected f64",
            ),
        ];
        for (triggers, field, message) in cases {
            match checked(triggers.clone()) {
                Err(Error::BadRequest {
                    field: Some(f),
                    message: m,
                }) => assert_eq!((f.as_str(), m.as_str()), (field, message), "{triggers}"),
                other => panic!("{triggers}: {other:?}"),
            }
        }
    }

    /// The console API's table of each kind's fields (which its OpenAPI
    /// schema is built from) is the one these checks hold.
    #[test]
    fn each_kind_takes_the_fields_the_api_table_gives_it() {
        let value = |field: &str| match field {
            "cron" => serde_json::json!("0 2 * * *"),
            "window" => serde_json::json!("01:00-02:00"),
            "min" | "min_duration_seconds" => serde_json::json!(5),
            _ => serde_json::json!(5.0),
        };
        for (kind, required, optional) in edgeloop_api::triggers::TRIGGER_KINDS {
            let mut t = serde_json::json!({"id": "t", "kind": kind});
            for f in required.iter().chain(optional) {
                t[*f] = value(f);
            }
            checked(serde_json::json!([t.clone()])).unwrap_or_else(|e| panic!("{t}: {e}"));
            for f in required.iter() {
                let mut without = t.clone();
                without.as_object_mut().unwrap().remove(*f);
                assert!(checked(serde_json::json!([without])).is_err());
            }
            for (other, r, o) in edgeloop_api::triggers::TRIGGER_KINDS {
                for f in r.iter().chain(o).filter(|_| other != kind) {
                    let mut extra = t.clone();
                    extra[*f] = value(f);
                    match checked(serde_json::json!([extra])) {
                        Err(Error::BadRequest {
                            field: Some(at), ..
                        }) => {
                            assert_eq!(at, format!("triggers[0].{f}"), "{kind}")
                        }
                        other => panic!("{kind} with {f}: {other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn good_triggers_become_the_schedulers() {
        let t = config(serde_json::json!([
            {"id": "hurts", "kind": "drift", "min_severity": 0.25, "min_accuracy_drop_points": 5},
            {"id": "nightly", "kind": "schedule", "cron": "0 2 * * *", "window": "23:00-04:00"},
            {"id": "labels", "kind": "new_labels", "min": 1000}
        ]))
        .triggers_for("m")
        .unwrap();
        assert_eq!(
            t[0].kind,
            TriggerKind::Drift {
                min_severity: 0.25,
                min_duration_seconds: 0,
                min_accuracy_drop_points: Some(5.0)
            }
        );
        let TriggerKind::Schedule { window, .. } = &t[1].kind else {
            panic!()
        };
        assert_eq!(*window, Some((23 * 60, 4 * 60)));
        assert_eq!(t[2].kind, TriggerKind::NewLabels { min: 1000 });
    }

    fn field() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<f64>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[ -~]{0,24}".prop_map(serde_json::Value::from),
        ]
    }

    proptest::proptest! {
        /// Whatever a client sends, the answer is a config or a 400 naming
        /// a field; never a panic.
        #[test]
        fn any_trigger_body_is_accepted_or_refused_with_a_field(
            kind in proptest::sample::select(vec!["drift", "accuracy_drop", "new_labels", "schedule", "x"]),
            values in proptest::collection::vec(field(), 8),
            cooldown in proptest::prelude::any::<i64>(),
        ) {
            let keys = ["min_severity", "min_duration_seconds", "min_accuracy_drop_points",
                        "points", "min", "cron", "window", "id"];
            let mut t = serde_json::json!({"id": "t", "kind": kind});
            for (k, v) in keys.iter().zip(values) {
                if !v.is_null() {
                    t[*k] = v;
                }
            }
            let body = serde_json::json!({"cooldown_seconds": cooldown, "triggers": [t]});
            let checked = parse_body::<TriggersConfig>(body.to_string().as_bytes())
                .and_then(|c| c.triggers_for("m"));
            match checked {
                Ok(t) => proptest::prop_assert_eq!(t.len(), 1),
                Err(Error::BadRequest { field: Some(_), .. }) => {}
                Err(other) => proptest::prop_assert!(false, "{other}"),
            }
        }
    }
}
