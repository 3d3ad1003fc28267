//! `edgeloop trigger set <model> --file triggers.json | show <model>`: what
//! starts a model's retrains (`PUT|GET /api/v1/models/{name}/triggers`),
//! each trigger's condition in words, the cooldown, and what the trigger
//! task saw and decided when it last evaluated them.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use edgeloop_api::drift::DriftConfig;
use edgeloop_api::triggers::{
    DecisionKind, Evaluation, TriggerCondition, TriggerSpec, TriggersView,
};

use super::api::{block_on, client, read_json, segment, CliError, Reply, ServerArgs};
use super::drift::at;
use super::table::{duration, fields, fixed, text, Table};

#[derive(Debug, Subcommand)]
pub enum TriggerCommand {
    /// Set a model's retraining triggers from a JSON file, replacing the
    /// old ones: drift (that hurts accuracy), accuracy drop, new labels, a
    /// schedule; the cooldown, the drift thresholds and the online
    /// accuracy window.
    Set {
        model: String,
        /// The triggers (`TriggersConfig` JSON); `-` reads stdin.
        #[arg(long, short = 'f')]
        file: PathBuf,
    },
    /// A model's triggers, its cooldown, and the trigger task's last
    /// evaluation: drift, accuracy, new labels, the running pipeline, and
    /// the decision with its reasons.
    Show { model: String },
}

pub fn run(
    cmd: TriggerCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, execute(cmd, server))
}

/// The command's output, or why it failed (`run` prints either and maps
/// the failure to its exit code; tests read the message here).
pub async fn execute(cmd: TriggerCommand, server: &ServerArgs) -> Result<Reply, CliError> {
    let client = client(server)?;
    match cmd {
        TriggerCommand::Set { model, file } => {
            let name = segment("model name", &model)?;
            let config = read_json(&file)?;
            let view: TriggersView = client
                .put(&format!("/api/v1/models/{name}/triggers"), &config)
                .await?;
            Reply::typed(&view, server.json, |v| {
                format!("triggers of {name} set\n{}", render(v))
            })
        }
        TriggerCommand::Show { model } => {
            let name = segment("model name", &model)?;
            let view: TriggersView = client
                .get(&format!("/api/v1/models/{name}/triggers"))
                .await?;
            Reply::typed(&view, server.json, render)
        }
    }
}

/// A number as a person writes it: `5`, not `5.0`; `0.2`; `-` when absent.
fn number<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

/// A fraction (0..1) as a percentage, or `-`.
fn percent(v: Option<f64>) -> String {
    match v {
        Some(x) => format!("{:.1} %", x * 100.0),
        None => "-".into(),
    }
}

/// When a trigger fires, in words, e.g. `drift >= 0.2 for 60 s and
/// accuracy down >= 5 points` or `cron 0 2 * * * within 02:00-04:00 UTC`.
pub fn condition(t: &TriggerSpec) -> String {
    match &t.condition {
        TriggerCondition::Drift {
            min_severity,
            min_duration_seconds,
            min_accuracy_drop_points,
        } => {
            // An absent severity is the server's default
            // (`lifecycle/triggers/config.rs`).
            let severity = number(Some(min_severity.unwrap_or(0.2)));
            let mut out = format!("drift >= {severity}");
            if let Some(s) = min_duration_seconds.filter(|s| *s > 0) {
                out.push_str(&format!(" for {s} s"));
            }
            if min_accuracy_drop_points.is_some() {
                out.push_str(&format!(
                    " and accuracy down >= {} points",
                    number(*min_accuracy_drop_points)
                ));
            }
            out
        }
        TriggerCondition::AccuracyDrop { points } => {
            format!("accuracy down >= {} points", number(Some(points)))
        }
        TriggerCondition::NewLabels { min } => format!(">= {} new labels", number(Some(min))),
        TriggerCondition::Schedule { cron, window } => {
            let mut out = format!("cron {cron}");
            if let Some(w) = window {
                out.push_str(&format!(" within {w}"));
            }
            out.push_str(" UTC");
            out
        }
    }
}

fn drift_thresholds(d: Option<&DriftConfig>) -> String {
    let Some(d) = d else {
        return "the defaults (edgeloop drift shows them)".into();
    };
    format!(
        "window {}, PSI {} watch / {} act, JS {}, KS alpha {}, at least {} requests; \
         set after {} windows, cleared after {}",
        duration(d.window_seconds),
        number(Some(d.psi_watch)),
        number(Some(d.psi_act)),
        number(Some(d.js_act)),
        number(Some(d.ks_alpha)),
        text(&d.min_requests),
        text(&d.set_after),
        text(&d.clear_after),
    )
}

/// What the last evaluation decided, in words.
fn decision(e: &Evaluation) -> String {
    let pipeline = text(&e.pipeline);
    match e.decision {
        None => "none: no trigger fired".into(),
        Some(DecisionKind::Start) => format!("start: pipeline {pipeline} started"),
        Some(DecisionKind::Coalesce) => {
            format!("coalesce: recorded on the running pipeline {pipeline}")
        }
        Some(DecisionKind::Cooldown) => {
            let s = &e.state;
            let until = s.last_started.map(|at| at + s.cooldown_seconds);
            format!("cooldown: no automatic retrain until {}", at(until))
        }
    }
}

/// The trigger task's last evaluation as `key: value` lines.
pub fn evaluation(e: Option<&Evaluation>) -> String {
    let Some(e) = e else {
        return fields(&[(
            "last evaluation",
            "not yet (the trigger task evaluates each model's triggers every tick)".into(),
        )]);
    };
    let s = &e.state;
    let drifting = match s.drifting_since {
        Some(since) => format!(
            "since {}, severity {}",
            at(since),
            fixed(s.drift_severity, 3)
        ),
        None => "no".into(),
    };
    let mut accuracy = format!(
        "evaluated {}, online {}",
        percent(s.evaluated_accuracy),
        percent(s.online_accuracy)
    );
    if let (Some(ev), Some(on)) = (s.evaluated_accuracy, s.online_accuracy) {
        let drop = (ev - on) * 100.0;
        accuracy.push_str(&if drop >= 0.0 {
            format!(" ({drop:.1} points down)")
        } else {
            format!(" ({:.1} points up)", -drop)
        });
    }
    let mut pairs = vec![
        ("last evaluation", at(e.at)),
        ("serving version", text(&e.version)),
        ("drifting", drifting),
        ("accuracy", accuracy),
        (
            "new labels",
            format!("{} since the last retrain", text(&s.labels_since_last)),
        ),
        ("last retrain", at(s.last_started)),
        ("running pipeline", text(&s.running)),
        ("decision", decision(e)),
    ];
    for r in &e.reasons {
        pairs.push(("reason", text(r)));
    }
    fields(&pairs)
}

/// A model's triggers as a person reads them: settings, a row per
/// trigger with its condition, and the last evaluation.
pub fn render(v: &TriggersView) -> String {
    let c = &v.config;
    let cooldown = match c.cooldown_seconds {
        0 => "none".to_string(),
        s => format!("{} between automatic retrains", duration(s)),
    };
    let mut out = fields(&[
        ("model", text(&v.model)),
        ("cooldown", cooldown),
        (
            "online accuracy",
            format!(
                "over the newest {} labelled samples, once there are {}",
                text(&c.accuracy_window),
                text(&c.accuracy_min_samples)
            ),
        ),
        ("drift thresholds", drift_thresholds(c.drift.as_ref())),
    ]);
    out.push('\n');
    if c.triggers.is_empty() {
        out.push_str("no triggers: only `edgeloop retrain` starts a retrain\n");
    } else {
        let mut t = Table::new(&["ID", "KIND", "CONDITION"]);
        for tr in &c.triggers {
            t.row(vec![text(&tr.id), text(tr.condition.kind()), condition(tr)]);
        }
        out.push_str(&t.render());
    }
    out.push('\n');
    out.push_str(&evaluation(v.state.last.as_ref()));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn typed(v: &Value) -> TriggersView {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn spec(t: &Value) -> TriggerSpec {
        let mut t = t.clone();
        t["id"] = json!("t");
        serde_json::from_value(t).unwrap()
    }

    fn eval(e: &Value) -> String {
        evaluation(Some(&serde_json::from_value(e.clone()).unwrap()))
    }

    const T0: i64 = 1_796_083_200;

    fn view(last: Value) -> Value {
        json!({
            "model": "rain",
            "config": {
                "cooldown_seconds": 3600, "accuracy_window": 200, "accuracy_min_samples": 50,
                "triggers": [
                    {"id": "hurts", "kind": "drift", "min_severity": 0.2,
                     "min_duration_seconds": 60, "min_accuracy_drop_points": 5.0},
                    {"id": "acc", "kind": "accuracy_drop", "points": 5.0},
                    {"id": "labels", "kind": "new_labels", "min": 1000},
                    {"id": "nightly", "kind": "schedule", "cron": "0 2 * * *", "window": "02:00-04:00"}
                ]
            },
            "state": {"schedule_fired_minute": null, "last": last}
        })
    }

    fn row<'a>(out: &'a str, first: &str) -> &'a str {
        out.lines()
            .find(|l| l.split("  ").next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first:?} in:\n{out}"))
    }

    #[test]
    fn conditions_read_as_words() {
        let cases = [
            (
                json!({"kind": "drift", "min_severity": 0.2, "min_duration_seconds": 60,
                       "min_accuracy_drop_points": 5.0}),
                "drift >= 0.2 for 60 s and accuracy down >= 5 points",
            ),
            (json!({"kind": "drift"}), "drift >= 0.2"),
            (
                json!({"kind": "drift", "min_severity": 0.35, "min_duration_seconds": 0}),
                "drift >= 0.35",
            ),
            (
                json!({"kind": "accuracy_drop", "points": 2.5}),
                "accuracy down >= 2.5 points",
            ),
            (
                json!({"kind": "new_labels", "min": 1000}),
                ">= 1000 new labels",
            ),
            (
                json!({"kind": "schedule", "cron": "0 2 * * *", "window": "02:00-04:00"}),
                "cron 0 2 * * * within 02:00-04:00 UTC",
            ),
            (
                json!({"kind": "schedule", "cron": "*/15 * * * *"}),
                "cron */15 * * * * UTC",
            ),
        ];
        for (t, want) in cases {
            assert_eq!(condition(&spec(&t)), want, "{t}");
        }
    }

    #[test]
    fn show_has_a_row_per_trigger_and_says_when_nothing_was_evaluated() {
        let out = render(&typed(&view(Value::Null)));
        assert!(out.starts_with("model:             rain\n"), "{out}");
        for want in [
            "cooldown:          1h00m between automatic retrains\n",
            "online accuracy:   over the newest 200 labelled samples, once there are 50\n",
            "drift thresholds:  the defaults (edgeloop drift shows them)\n",
            "last evaluation:  not yet",
        ] {
            assert!(out.contains(want), "{want}: {out}");
        }
        let header = out.lines().find(|l| l.starts_with("ID")).unwrap();
        let hurts = row(&out, "hurts");
        assert_eq!(header.find("CONDITION"), hurts.find("drift >="), "{out}");
        assert!(
            hurts.ends_with("drift >= 0.2 for 60 s and accuracy down >= 5 points"),
            "{out}"
        );
        assert!(
            row(&out, "acc").ends_with("accuracy down >= 5 points"),
            "{out}"
        );
        assert!(row(&out, "labels").ends_with(">= 1000 new labels"), "{out}");
        assert!(
            row(&out, "nightly").ends_with("cron 0 2 * * * within 02:00-04:00 UTC"),
            "{out}"
        );
        let mut none = view(Value::Null);
        none["config"]["triggers"] = json!([]);
        none["config"]["cooldown_seconds"] = json!(0);
        none["config"]["drift"] = json!({"window_seconds": 60, "psi_watch": 0.1, "psi_act": 0.25,
            "js_act": 0.1, "ks_alpha": 0.01, "min_requests": 20, "set_after": 2, "clear_after": 3});
        let out = render(&typed(&none));
        for want in [
            "cooldown:          none\n",
            "drift thresholds:  window 1m00s, PSI 0.1 watch / 0.25 act, JS 0.1, KS alpha 0.01, \
             at least 20 requests; set after 2 windows, cleared after 3\n",
            "no triggers: only `edgeloop retrain` starts a retrain\n",
        ] {
            assert!(out.contains(want), "{want}: {out}");
        }
    }

    #[test]
    fn the_last_evaluation_says_what_was_seen_and_decided() {
        let last = json!({
            "at": T0 + 90, "version": "1.0.0",
            "state": {"running": "p-00000003", "last_started": T0, "cooldown_seconds": 3600,
                      "drifting_since": T0 + 30, "drift_severity": 0.41234,
                      "evaluated_accuracy": 0.91, "online_accuracy": 0.845,
                      "labels_since_last": 8, "manual_requested": false,
                      "schedule_fired_minute": null},
            "decision": "coalesce",
            "reasons": ["hurts: drifting (severity 0.412 >= 0.2) for 60s, online accuracy 6.5 points under evaluation",
                        "labels: 8 new labelled samples"],
            "pipeline": "p-00000003"
        });
        let out = render(&typed(&view(last.clone())));
        for want in [
            "last evaluation:   2026-12-01T00:01:30Z\n",
            "serving version:   1.0.0\n",
            "drifting:          since 2026-12-01T00:00:30Z, severity 0.412\n",
            "accuracy:          evaluated 91.0 %, online 84.5 % (6.5 points down)\n",
            "new labels:        8 since the last retrain\n",
            "last retrain:      2026-12-01T00:00:00Z\n",
            "running pipeline:  p-00000003\n",
            "decision:          coalesce: recorded on the running pipeline p-00000003\n",
            "reason:            hurts: drifting (severity 0.412 >= 0.2) for 60s, online accuracy 6.5 points under evaluation\n",
            "reason:            labels: 8 new labelled samples\n",
        ] {
            assert!(out.contains(want), "{want}: {out}");
        }

        let mut quiet = last.clone();
        quiet["decision"] = Value::Null;
        quiet["reasons"] = json!([]);
        quiet["pipeline"] = Value::Null;
        quiet["version"] = Value::Null;
        for k in [
            "running",
            "last_started",
            "drifting_since",
            "online_accuracy",
            "evaluated_accuracy",
        ] {
            quiet["state"][k] = Value::Null;
        }
        let out = eval(&quiet);
        for want in [
            "serving version:   -\n",
            "drifting:          no\n",
            "accuracy:          evaluated -, online -\n",
            "last retrain:      -\n",
            "running pipeline:  -\n",
            "decision:          none: no trigger fired\n",
        ] {
            assert!(out.contains(want), "{want}: {out}");
        }
        assert!(!out.contains("reason:"), "{out}");

        let mut waiting = last.clone();
        waiting["decision"] = json!("cooldown");
        waiting["pipeline"] = Value::Null;
        waiting["state"]["online_accuracy"] = json!(0.95);
        let out = eval(&waiting);
        assert!(
            out.contains(
                "decision:          cooldown: no automatic retrain until 2026-12-01T01:00:00Z\n"
            ),
            "{out}"
        );
        assert!(out.contains("(4.0 points up)"), "{out}");
        let mut started = last;
        started["decision"] = json!("start");
        assert!(eval(&started).contains("decision:          start: pipeline p-00000003 started\n"));
    }
}
