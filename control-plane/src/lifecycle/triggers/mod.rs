//! Retraining triggers (issue #7): what may start a retrain of a model, and
//! the scheduler that decides, as a pure function of
//! `(triggers, model state, now)`, whether one starts now, waits for a
//! cooldown, or is coalesced into a retrain already running. A thin task
//! (to come with the pipelines) feeds it and acts on its decisions.

pub mod config;
pub mod cron;
pub mod runner;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use cron::{CronError, CronExpr};

pub use edgeloop_api::UnixSeconds;

#[derive(Debug, Clone, PartialEq)]
pub enum TriggerKind {
    /// The model has been drifting at `min_severity` or more for
    /// `min_duration_seconds` and, when labels say how it does, the drift
    /// hurts: online accuracy is at least `min_accuracy_drop_points` under
    /// the evaluated one. (Real inputs move without harm; a histogram that
    /// moved is not by itself a reason to spend GPU hours.)
    Drift {
        min_severity: f64,
        min_duration_seconds: i64,
        min_accuracy_drop_points: Option<f64>,
    },
    /// Online accuracy is this many points under the evaluated accuracy.
    AccuracyDrop { points: f64 },
    /// At least this many labelled samples arrived since the last retrain.
    NewLabels { min: u64 },
    /// On a cron schedule, optionally only inside a daily UTC window of
    /// minutes since midnight (`start <= minute < end`; wraps past midnight
    /// when `start > end`).
    Schedule {
        cron: CronExpr,
        window: Option<(u32, u32)>,
    },
    /// Asked for through the API or the CLI.
    Manual,
}

impl TriggerKind {
    /// Stronger reasons first: a person, then the data, then the clock.
    fn priority(&self) -> u8 {
        match self {
            TriggerKind::Manual => 0,
            TriggerKind::Drift { .. } => 1,
            TriggerKind::AccuracyDrop { .. } => 2,
            TriggerKind::NewLabels { .. } => 3,
            TriggerKind::Schedule { .. } => 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    pub id: String,
    pub model: String,
    pub kind: TriggerKind,
}

/// What the scheduler knows about one model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// The features that moved most in the latest window, by PSI, largest
    /// first (at most three): what the reason names.
    #[serde(default)]
    pub drift_features: Vec<(String, f64)>,
    pub evaluated_accuracy: Option<f64>,
    pub online_accuracy: Option<f64>,
    pub labels_since_last: u64,
    pub manual_requested: bool,
    /// The minute a schedule last fired, so it fires once per minute.
    pub schedule_fired_minute: Option<UnixSeconds>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start a retrain now; `reasons` lists every trigger that fired.
    Start {
        model: String,
        trigger: String,
        reasons: Vec<String>,
    },
    /// A retrain is running: record the triggers against it, start nothing.
    Coalesce {
        model: String,
        running: String,
        reasons: Vec<String>,
    },
    /// Triggers fired inside the cooldown.
    Cooldown {
        model: String,
        until: UnixSeconds,
        reasons: Vec<String>,
    },
}

/// Why `trigger` fires for `state` at `now`, if it does.
pub fn fires(trigger: &Trigger, state: &ModelState, now: UnixSeconds) -> Option<String> {
    match &trigger.kind {
        TriggerKind::Manual => state
            .manual_requested
            .then(|| "a retrain was requested".to_string()),
        TriggerKind::Drift {
            min_severity,
            min_duration_seconds,
            min_accuracy_drop_points,
        } => {
            let since = state.drifting_since?;
            let drop = state
                .evaluated_accuracy
                .zip(state.online_accuracy)
                .map(|(e, o)| (e - o) * 100.0);
            // Without labels nobody can tell whether it hurts: drift alone decides.
            let hurts = match (min_accuracy_drop_points, drop) {
                (Some(min), Some(drop)) => drop >= *min,
                _ => true,
            };
            (state.drift_severity >= *min_severity && now - since >= *min_duration_seconds && hurts)
                .then(|| {
                    let mut why = format!(
                        "drifting (severity {:.3} >= {min_severity}) for {}s",
                        state.drift_severity,
                        now - since
                    );
                    if !state.drift_features.is_empty() {
                        let named: Vec<String> = state
                            .drift_features
                            .iter()
                            .map(|(name, psi)| format!("{name} PSI {psi:.2}"))
                            .collect();
                        why.push_str(&format!(" ({})", named.join(", ")));
                    }
                    if let Some(drop) = drop {
                        why.push_str(&format!(
                            ", online accuracy {drop:.1} points under evaluation"
                        ));
                    }
                    why
                })
        }
        TriggerKind::AccuracyDrop { points } => {
            let drop = (state.evaluated_accuracy? - state.online_accuracy?) * 100.0;
            (drop >= *points).then(|| format!("online accuracy {drop:.1} points under evaluation"))
        }
        TriggerKind::NewLabels { min } => (state.labels_since_last >= *min)
            .then(|| format!("{} new labelled samples", state.labels_since_last)),
        TriggerKind::Schedule { cron, window } => {
            let minute = now - now.rem_euclid(60);
            let t = OffsetDateTime::from_unix_timestamp(minute).ok()?;
            let in_window = window.is_none_or(|(start, end)| {
                let m = u32::from(t.hour()) * 60 + u32::from(t.minute());
                if start <= end {
                    (start..end).contains(&m)
                } else {
                    m >= start || m < end
                }
            });
            (cron.matches(t) && in_window && state.schedule_fired_minute != Some(minute))
                .then(|| format!("schedule {:?}", cron.as_str()))
        }
    }
}

/// One decision per model with at least one firing trigger.
pub fn decide(
    triggers: &[Trigger],
    states: &std::collections::BTreeMap<String, ModelState>,
    now: UnixSeconds,
) -> Vec<Decision> {
    let mut out = Vec::new();
    for (model, state) in states {
        let mut fired: Vec<(&Trigger, String)> = triggers
            .iter()
            .filter(|t| &t.model == model)
            .filter_map(|t| fires(t, state, now).map(|why| (t, why)))
            .collect();
        if fired.is_empty() {
            continue;
        }
        fired.sort_by_key(|(t, _)| (t.kind.priority(), t.id.clone()));
        let reasons: Vec<String> = fired
            .iter()
            .map(|(t, why)| format!("{}: {why}", t.id))
            .collect();
        let model = model.clone();
        if let Some(running) = &state.running {
            out.push(Decision::Coalesce {
                model,
                running: running.clone(),
                reasons,
            });
            continue;
        }
        let manual = fired[0].0.kind == TriggerKind::Manual;
        let until = state.last_started.map(|s| s + state.cooldown_seconds);
        match until {
            Some(until) if now < until && !manual => out.push(Decision::Cooldown {
                model,
                until,
                reasons,
            }),
            _ => out.push(Decision::Start {
                model,
                trigger: fired[0].0.id.clone(),
                reasons,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const NOW: UnixSeconds = 1_796_083_200; // 2026-12-01 00:00:00 UTC

    fn trigger(id: &str, kind: TriggerKind) -> Trigger {
        Trigger {
            id: id.into(),
            model: "m".into(),
            kind,
        }
    }

    fn all() -> Vec<Trigger> {
        vec![
            trigger(
                "drift",
                TriggerKind::Drift {
                    min_severity: 0.2,
                    min_duration_seconds: 3600,
                    min_accuracy_drop_points: None,
                },
            ),
            trigger("accuracy", TriggerKind::AccuracyDrop { points: 5.0 }),
            trigger("labels", TriggerKind::NewLabels { min: 1000 }),
            trigger(
                "nightly",
                TriggerKind::Schedule {
                    cron: "0 * * * *".parse().unwrap(),
                    window: Some((2 * 60, 4 * 60)),
                },
            ),
            trigger("manual", TriggerKind::Manual),
        ]
    }

    fn decide_one(state: ModelState, now: UnixSeconds) -> Option<Decision> {
        let states = BTreeMap::from([("m".to_string(), state)]);
        let mut d = decide(&all(), &states, now);
        assert!(d.len() <= 1);
        d.pop()
    }

    fn started_by(d: Option<Decision>) -> Option<String> {
        match d {
            Some(Decision::Start { trigger, .. }) => Some(trigger),
            _ => None,
        }
    }

    #[test]
    fn each_kind_fires_on_its_condition_only() {
        let quiet = ModelState {
            cooldown_seconds: 86_400,
            ..Default::default()
        };
        assert_eq!(decide_one(quiet.clone(), NOW), None);
        let cases: Vec<(&str, ModelState, UnixSeconds, Option<&str>)> = vec![
            (
                "drift long enough",
                ModelState {
                    drifting_since: Some(NOW - 3600),
                    drift_severity: 0.25,
                    ..quiet.clone()
                },
                NOW,
                Some("drift"),
            ),
            (
                "drift too short",
                ModelState {
                    drifting_since: Some(NOW - 3599),
                    drift_severity: 0.25,
                    ..quiet.clone()
                },
                NOW,
                None,
            ),
            (
                "drift too mild",
                ModelState {
                    drifting_since: Some(NOW - 7200),
                    drift_severity: 0.15,
                    ..quiet.clone()
                },
                NOW,
                None,
            ),
            (
                "accuracy dropped 6 points",
                ModelState {
                    evaluated_accuracy: Some(0.95),
                    online_accuracy: Some(0.89),
                    ..quiet.clone()
                },
                NOW,
                Some("accuracy"),
            ),
            (
                "accuracy dropped 4 points",
                ModelState {
                    evaluated_accuracy: Some(0.95),
                    online_accuracy: Some(0.91),
                    ..quiet.clone()
                },
                NOW,
                None,
            ),
            (
                "enough labels",
                ModelState {
                    labels_since_last: 1000,
                    ..quiet.clone()
                },
                NOW,
                Some("labels"),
            ),
            // The schedule fires on the hour, only between 02:00 and 04:00.
            (
                "schedule at 03:00",
                quiet.clone(),
                NOW + 3 * 3600,
                Some("nightly"),
            ),
            (
                "schedule at 03:00:59",
                quiet.clone(),
                NOW + 3 * 3600 + 59,
                Some("nightly"),
            ),
            (
                "schedule at 03:01",
                quiet.clone(),
                NOW + 3 * 3600 + 60,
                None,
            ),
            ("schedule at 05:00", quiet.clone(), NOW + 5 * 3600, None),
            (
                "schedule already fired this minute",
                ModelState {
                    schedule_fired_minute: Some(NOW + 3 * 3600),
                    ..quiet.clone()
                },
                NOW + 3 * 3600 + 30,
                None,
            ),
            (
                "manual",
                ModelState {
                    manual_requested: true,
                    ..quiet.clone()
                },
                NOW,
                Some("manual"),
            ),
        ];
        for (name, state, now, want) in cases {
            assert_eq!(
                started_by(decide_one(state, now)).as_deref(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn a_drift_reason_names_the_features_that_moved() {
        let state = ModelState {
            drifting_since: Some(NOW - 60),
            drift_severity: 8.3,
            drift_features: vec![("dew_point".into(), 8.31), ("visibility".into(), 0.42)],
            evaluated_accuracy: Some(0.8),
            online_accuracy: Some(0.7),
            ..Default::default()
        };
        let trigger = Trigger {
            id: "drift-that-hurts".into(),
            model: "m".into(),
            kind: TriggerKind::Drift {
                min_severity: 0.2,
                min_duration_seconds: 0,
                min_accuracy_drop_points: Some(5.0),
            },
        };
        assert_eq!(
            fires(&trigger, &state, NOW).unwrap(),
            "drifting (severity 8.300 >= 0.2) for 60s (dew_point PSI 8.31, visibility PSI 0.42), \
             online accuracy 10.0 points under evaluation"
        );
    }

    #[test]
    fn cooldown_coalesce_and_priority() {
        let drifting = ModelState {
            drifting_since: Some(NOW - 7200),
            drift_severity: 0.3,
            labels_since_last: 5000,
            cooldown_seconds: 86_400,
            ..Default::default()
        };
        // Two triggers fire: drift leads, both are listed.
        match decide_one(drifting.clone(), NOW) {
            Some(Decision::Start {
                trigger, reasons, ..
            }) => {
                assert_eq!(trigger, "drift");
                assert_eq!(reasons.len(), 2, "{reasons:?}");
            }
            other => panic!("{other:?}"),
        }
        // Within the cooldown: wait, and say until when.
        let cooling = ModelState {
            last_started: Some(NOW - 3600),
            ..drifting.clone()
        };
        assert_eq!(
            decide_one(cooling.clone(), NOW),
            Some(Decision::Cooldown {
                model: "m".into(),
                until: NOW - 3600 + 86_400,
                reasons: vec![
                    "drift: drifting (severity 0.300 >= 0.2) for 7200s".into(),
                    "labels: 5000 new labelled samples".into()
                ],
            })
        );
        // Just after it: start.
        assert_eq!(
            started_by(decide_one(cooling.clone(), NOW - 3600 + 86_400)).as_deref(),
            Some("drift")
        );
        // A person overrides the cooldown.
        let asked = ModelState {
            manual_requested: true,
            ..cooling
        };
        assert_eq!(
            started_by(decide_one(asked, NOW)).as_deref(),
            Some("manual")
        );
        // Never two at once: a running retrain absorbs what fires.
        let running = ModelState {
            running: Some("p-1".into()),
            manual_requested: true,
            ..drifting
        };
        match decide_one(running, NOW) {
            Some(Decision::Coalesce {
                running, reasons, ..
            }) => {
                assert_eq!(running, "p-1");
                assert_eq!(reasons.len(), 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_window_may_wrap_past_midnight() {
        let t = trigger(
            "night",
            TriggerKind::Schedule {
                cron: "*/30 * * * *".parse().unwrap(),
                window: Some((23 * 60, 60)),
            },
        );
        let s = ModelState::default();
        assert!(fires(&t, &s, NOW - 1800).is_some(), "23:30");
        assert!(fires(&t, &s, NOW + 1800).is_some(), "00:30");
        assert!(fires(&t, &s, NOW + 3600).is_none(), "01:00 is the end");
        assert!(fires(&t, &s, NOW - 7200).is_none(), "22:00");
    }

    #[test]
    fn drift_that_does_not_hurt_accuracy_does_not_retrain() {
        let t = trigger(
            "drift",
            TriggerKind::Drift {
                min_severity: 0.2,
                min_duration_seconds: 0,
                min_accuracy_drop_points: Some(5.0),
            },
        );
        let drifting = ModelState {
            drifting_since: Some(NOW - 60),
            drift_severity: 0.4,
            ..Default::default()
        };
        let cases = [
            ("no labels: drift alone decides", None, None, true),
            ("accuracy holds", Some(0.80), Some(0.79), false),
            ("4.9 points down", Some(0.80), Some(0.751), false),
            ("5 points down", Some(0.80), Some(0.75), true),
            ("evaluation unknown", None, Some(0.5), true),
        ];
        for (what, evaluated, online, want) in cases {
            let state = ModelState {
                evaluated_accuracy: evaluated,
                online_accuracy: online,
                ..drifting.clone()
            };
            assert_eq!(fires(&t, &state, NOW).is_some(), want, "{what}");
        }
        let calm = ModelState {
            drifting_since: None,
            evaluated_accuracy: Some(0.8),
            online_accuracy: Some(0.5),
            ..drifting
        };
        assert_eq!(
            fires(&t, &calm, NOW),
            None,
            "accuracy alone is another trigger's job"
        );
    }
}
