//! `edgeloop pipeline list [--model M] | show <id> [--wait] | cancel <id>`:
//! retraining pipelines through the console API, with every step's
//! attempt, status, timing and output (`GET /api/v1/pipelines/{id}`).

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use edgeloop_api::pipelines::{
    Output, PipelineState, PipelineStatus, PipelineView, Step, StepRecord,
};
use edgeloop_api::UnixSeconds;
use edgeloop_models::Digest;
use serde_json::json;

use super::api::{block_on, client, segment, wait_for, CliError, Client, Reply, ServerArgs};
use super::drift::at;
use super::table::{clip, duration, fields, fixed, text, Cell, Table};

#[derive(Debug, Subcommand)]
pub enum PipelineCommand {
    /// Retraining pipelines, newest first.
    List {
        /// Only this model's pipelines.
        #[arg(long)]
        model: Option<String>,
    },
    /// One pipeline: each step's attempt, status, timing and output.
    Show {
        id: String,
        /// Follow the pipeline until it ends; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
    },
    /// Cancel a running pipeline and what its step started (a training
    /// job, a rollout).
    Cancel { id: String },
}

/// The widest a step's outcome is shown in the table; longer ones are
/// printed in full under it.
const STATUS_WIDTH: usize = 40;

pub fn run(
    cmd: PipelineCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        let json = server.json;
        match cmd {
            PipelineCommand::List { model } => {
                let all: Vec<PipelineView> = client
                    .get_query("/api/v1/pipelines", &[("model", model)])
                    .await?;
                Reply::typed(&all, json, |all| table(all, now()))
            }
            PipelineCommand::Show { id, wait: false } => {
                let p: PipelineView = client
                    .get(&format!("/api/v1/pipelines/{}", path(&id)?))
                    .await?;
                Reply::typed(&p, json, render)
            }
            PipelineCommand::Show { id, wait: true } => follow(&client, &id, json).await,
            PipelineCommand::Cancel { id } => {
                let p: PipelineView = client
                    .post(
                        &format!("/api/v1/pipelines/{}/cancel", path(&id)?),
                        &json!({}),
                    )
                    .await?;
                Reply::typed(&p, json, render)
            }
        }
    })
}

fn path(id: &str) -> Result<&str, CliError> {
    segment("pipeline id", id)
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// A step as the API names it, e.g. `build_dataset`.
pub fn step_name(step: Step) -> String {
    serde_json::to_value(step)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Cell for Step {
    fn cell(&self) -> String {
        step_name(*self)
    }
}

impl Cell for PipelineStatus {
    fn cell(&self) -> String {
        self.as_str().into()
    }
}

/// A digest shortened to what a person compares by eye.
pub fn short(d: &Digest) -> String {
    d.to_string().chars().take(12).collect()
}

/// Follows pipeline `id` on the shared spinner until it ends; exits 0 only
/// if it succeeded, else 1 with the reason on stderr.
pub async fn follow(client: &Client, id: &str, json: bool) -> Result<Reply, CliError> {
    let p: PipelineView = wait_for(
        client,
        &format!("/api/v1/pipelines/{}", path(id)?),
        json,
        progress,
        is_terminal,
    )
    .await?;
    let mut reply = Reply::typed(&p, json, render)?;
    if p.status != PipelineStatus::Succeeded {
        eprintln!("error: pipeline {} {}", text(&p.id), progress(&p));
        reply.code = ExitCode::FAILURE;
    }
    Ok(reply)
}

pub fn is_terminal(p: &PipelineView) -> bool {
    p.status != PipelineStatus::Running
}

/// Where the current step falls among the steps the pipeline runs, e.g.
/// `2/8` for `train` (`2/9` when it signs offline).
fn position(p: &PipelineView) -> String {
    let steps = p.steps();
    match p.step.and_then(|s| steps.iter().position(|n| *n == s)) {
        Some(i) => format!("{}/{}", i + 1, steps.len()),
        None => "?".into(),
    }
}

/// `running: step 2/8 train, attempt 1` while it runs; `failed at train:
/// <reason>` or `succeeded` once it ended (what the spinner shows).
pub fn progress(p: &PipelineView) -> String {
    let step = p.step.map_or_else(|| "?".to_string(), step_name);
    match p.status {
        PipelineStatus::Running => format!(
            "running: step {} {step}, attempt {}",
            position(p),
            match p.state {
                PipelineState::Running { attempt, .. } => attempt,
                _ => 1,
            }
        ),
        PipelineStatus::Succeeded => "succeeded".into(),
        other => match &p.reason {
            Some(r) => format!("{} at {step}: {r}", other.as_str()),
            None => format!("{} at {step}", other.as_str()),
        },
    }
}

/// When the pipeline started, and how long it ran (so far).
fn span(p: &PipelineView, now: i64) -> (Option<UnixSeconds>, Option<i64>) {
    let h = &p.history;
    let Some(start) = h.first().map(|r| r.started_at) else {
        return (None, None);
    };
    let end = if is_terminal(p) {
        h.iter().filter_map(|r| r.ended_at).max()
    } else {
        Some(now)
    };
    (Some(start), end.map(|e| e - start))
}

/// A step's status: `running`, `succeeded`, or its outcome.
fn step_status(r: &StepRecord) -> String {
    match &r.outcome {
        None if r.ended_at.is_none() => "running".into(),
        None => "-".into(),
        Some(o) => clip(o.as_str(), STATUS_WIDTH),
    }
}

/// What a step handed on, in a line.
pub fn output(o: &Output) -> String {
    match o {
        Output::Dataset {
            digest,
            rows,
            eval_rows,
            edge_rows,
            hard_examples,
        } => format!(
            "{} rows, {} to evaluate, {} from devices{}; snapshot {}",
            text(rows),
            text(eval_rows),
            text(edge_rows),
            if *hard_examples > 0 {
                format!(" ({hard_examples} labelled hard examples)")
            } else {
                String::new()
            },
            short(digest)
        ),
        Output::Job { id, checkpoint } => {
            format!("job {}, checkpoint {}", text(id), short(checkpoint))
        }
        Output::Onnx { digest } => format!("model {}", short(digest)),
        Output::Quantized {
            digest,
            method,
            version,
            variants,
            ..
        } => {
            let mut line = format!(
                "version {}, {} {}",
                text(version),
                text(method),
                short(digest)
            );
            for v in variants {
                line.push_str(&format!(
                    "; variant {}: {} {}",
                    v.name,
                    v.method,
                    short(&v.digest)
                ));
            }
            line
        }
        Output::Unsigned {
            digest,
            method,
            version,
            variants,
            ..
        } => {
            let mut line = format!(
                "version {}, {} {}, unsigned",
                text(version),
                text(method),
                short(digest)
            );
            if !variants.is_empty() {
                line.push_str(&format!(" (and {} variants)", variants.len()));
            }
            line
        }
        Output::Version { version } => format!("version {}", text(version)),
        Output::Comparison {
            new,
            serving,
            serving_version,
            serving_alias,
        } => {
            let against = match (serving_version, serving_alias) {
                (Some(v), Some(a)) => format!(" ({a} = version {v})"),
                (Some(v), None) => format!(" (version {v})"),
                (None, _) => String::new(),
            };
            format!(
                "accuracy {} % new vs {} % serving{against}",
                percent(*new),
                percent(*serving)
            )
        }
        Output::Deployment { id } => format!("deployment {}", text(id)),
        Output::Reference => "drift reference reset".into(),
    }
}

fn percent(v: f64) -> String {
    fixed(v * 100.0, 2)
}

pub fn render(p: &PipelineView) -> String {
    render_at(p, now())
}

/// One pipeline at time `now` (running steps' durations run to it).
pub fn render_at(p: &PipelineView, now: i64) -> String {
    let status = match (p.status, p.step) {
        (PipelineStatus::Running, _) => progress(p),
        (PipelineStatus::AwaitingSignature, _) => format!(
            "awaiting a signature: edgeloop model sign {} --signing-key KEY",
            p.id
        ),
        (
            s @ (PipelineStatus::Stopped | PipelineStatus::Failed | PipelineStatus::Cancelled),
            Some(step),
        ) => format!("{} at {}", s.as_str(), step_name(step)),
        (s, _) => s.as_str().to_string(),
    };
    let (started, took) = span(p, now);
    let mut pairs = vec![
        ("id", text(&p.id)),
        ("model", text(&p.model)),
        ("status", status),
    ];
    if let Some(r) = &p.reason {
        pairs.push(("reason", r.to_string()));
    }
    pairs.push(("trigger", text(&p.trigger)));
    for c in &p.coalesced {
        pairs.push(("coalesced", format!("{} ({})", text(&c.trigger), at(c.at))));
    }
    pairs.push(("started", at(started)));
    pairs.push(("duration", took.map_or("-".into(), duration)));
    let mut out = fields(&pairs);
    let h = &p.history;
    if h.is_empty() {
        return out;
    }
    out.push('\n');
    let mut t = Table::new(&["STEP", "ATTEMPT", "STATUS", "STARTED", "DURATION", "OUTPUT"]);
    let mut notes = vec![];
    for r in h {
        let took = match r.ended_at {
            Some(e) => duration(e - r.started_at),
            None => duration(now - r.started_at),
        };
        if let Some(o) = &r.outcome {
            let o = o.as_str();
            // A long outcome the reason line does not already show.
            let shown = p.reason.as_deref().is_some_and(|why| why.starts_with(o));
            if o.chars().count() > STATUS_WIDTH && !shown {
                notes.push(format!(
                    "  {} attempt {}: {o}\n",
                    text(&r.step),
                    text(&r.attempt)
                ));
            }
        }
        t.row(vec![
            text(&r.step),
            text(&r.attempt),
            step_status(r),
            at(r.started_at),
            took,
            r.output.as_ref().map_or_else(|| "-".into(), output),
        ]);
    }
    out.push_str(&t.render());
    if !notes.is_empty() {
        out.push_str("\noutcomes:\n");
        out.extend(notes);
    }
    out
}

/// The human table for `list`.
pub fn table(all: &[PipelineView], now: i64) -> String {
    let mut t = Table::new(&[
        "ID", "MODEL", "STATUS", "STEP", "TRIGGER", "STARTED", "DURATION", "REASON",
    ]);
    for p in all {
        let (started, took) = span(p, now);
        t.row(vec![
            text(&p.id),
            text(&p.model),
            text(&p.status),
            text(&p.step),
            clip(&p.trigger, 30),
            at(started),
            took.map_or("-".into(), duration),
            clip(p.reason.as_deref().unwrap_or(""), 50),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    const T0: i64 = 1_796_083_200;

    fn record(
        step: &str,
        attempt: u32,
        start: i64,
        end: Option<i64>,
        outcome: Option<&str>,
        output: Value,
    ) -> Value {
        json!({"step": step, "attempt": attempt, "started_at": start, "ended_at": end,
               "outcome": outcome, "output": output})
    }

    /// What the API shows for a pipeline that failed at train on its
    /// second attempt, with the first attempt's long outcome.
    fn failed() -> Value {
        let long = "the trainer bridge lost its lease while uploading the checkpoint";
        json!({
            "id": "p-00000007", "model": "rain", "status": "failed", "step": "train",
            "reason": "training job p-00000007-train-2 failed: exit code 3",
            "trigger": "manual: cli",
            "state": {"state": "failed", "step": "train",
                      "reason": "training job p-00000007-train-2 failed: exit code 3"},
            "history": [
                record("build_dataset", 1, T0, Some(T0 + 2), Some("succeeded"),
                    json!({"output": "dataset", "digest": "ab".repeat(32), "rows": 90,
                           "eval_rows": 10, "edge_rows": 40})),
                record("train", 1, T0 + 2, Some(T0 + 65), Some(long), Value::Null),
                record("train", 2, T0 + 65, Some(T0 + 3600), Some("training job p-00000007-train-2 failed: exit code 3"), Value::Null),
            ],
            "coalesced": [{"trigger": "drift", "at": T0 + 30}],
            "max_attempts": 2, "step_timeout_seconds": 21600, "min_gain_points": 0.0
        })
    }

    fn typed(p: Value) -> PipelineView {
        serde_json::from_value(p).unwrap()
    }

    fn row<'a>(out: &'a str, first: &str, attempt: &str) -> &'a str {
        out.lines()
            .find(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.first() == Some(&first) && cells.get(1) == Some(&attempt)
            })
            .unwrap_or_else(|| panic!("no row {first} {attempt} in:\n{out}"))
    }

    #[test]
    fn show_has_a_row_per_step_attempt_and_the_reason() {
        let out = render_at(&typed(failed()), T0 + 10_000);
        assert!(out.contains("status:     failed at train\n"), "{out}");
        assert!(
            out.contains("reason:     training job p-00000007-train-2 failed: exit code 3\n"),
            "{out}"
        );
        assert!(
            out.contains("coalesced:  drift (2026-12-01T00:00:30Z)\n"),
            "{out}"
        );
        assert!(out.contains("started:    2026-12-01T00:00:00Z\n"), "{out}");
        assert!(out.contains("duration:   1h00m\n"), "{out}");
        let ds = row(&out, "build_dataset", "1");
        for want in [
            "succeeded",
            "2026-12-01T00:00:00Z",
            "2s",
            "90 rows, 10 to evaluate, 40 from devices; snapshot abababababab",
        ] {
            assert!(ds.contains(want), "{want}: {out}");
        }
        let header = out.lines().find(|l| l.starts_with("STEP")).unwrap();
        assert_eq!(header.find("STATUS"), ds.find("succeeded"), "{out}");
        let first = row(&out, "train", "1");
        assert!(
            first.contains("the trainer bridge lost its lease while…"),
            "{out}"
        );
        assert!(first.contains("1m03s"), "{out}");
        assert!(row(&out, "train", "2").contains("58m55s"), "{out}");
        // The clipped outcome in full, but not the one the reason shows.
        assert!(
            out.ends_with("outcomes:\n  train attempt 1: the trainer bridge lost its lease while uploading the checkpoint\n"),
            "{out}"
        );
    }

    #[test]
    fn an_offline_signing_pipeline_counts_its_sign_step_and_says_how_to_sign() {
        let key = "ab".repeat(32);
        let waiting = json!({
            "id": "p-2", "model": "rain", "status": "awaiting_signature", "step": "sign",
            "reason": null, "trigger": "drift",
            "state": {"state": "awaiting_signature", "since": T0 + 5},
            "history": [
                record("quantize", 1, T0, Some(T0 + 5), Some("succeeded"),
                    json!({"output": "unsigned", "digest": "ab".repeat(32), "method": "int8-dynamic",
                           "manifest": "cd".repeat(32), "version": "2.0.0"})),
                record("sign", 1, T0 + 5, None, None, Value::Null),
            ],
            "coalesced": [],
            "max_attempts": 3, "step_timeout_seconds": 21600, "min_gain_points": 0.0,
            "signing": {"mode": "offline", "public_keys": [key]}
        });
        let p = typed(waiting.clone());
        assert!(is_terminal(&p), "--wait ends: a person must sign");
        let out = render_at(&p, T0 + 65);
        assert!(
            out.contains("awaiting a signature: edgeloop model sign p-2 --signing-key KEY"),
            "{out}"
        );
        assert!(
            row(&out, "quantize", "1")
                .ends_with("version 2.0.0, int8-dynamic abababababab, unsigned"),
            "{out}"
        );
        // Running again after the signature: nine steps, register the 6th.
        let mut running = waiting;
        running["status"] = json!("running");
        running["step"] = json!("register");
        running["state"] =
            json!({"state": "running", "step": "register", "attempt": 1, "started_at": T0 + 9});
        assert_eq!(
            progress(&typed(running)),
            "running: step 6/9 register, attempt 1"
        );
    }

    #[test]
    fn a_running_pipeline_counts_up_to_now() {
        let p = json!({
            "id": "p-1", "model": "rain", "status": "running", "step": "compare",
            "reason": null, "trigger": "drift",
            "state": {"state": "running", "step": "compare", "attempt": 1, "started_at": T0 + 5},
            "history": [
                record("register", 1, T0, Some(T0 + 5), Some("succeeded"),
                    json!({"output": "version", "version": "3"})),
                record("compare", 1, T0 + 5, None, None, Value::Null),
            ],
            "coalesced": [],
            "max_attempts": 3, "step_timeout_seconds": 21600, "min_gain_points": 0.0
        });
        let p = typed(p);
        assert_eq!(progress(&p), "running: step 6/8 compare, attempt 1");
        assert!(!is_terminal(&p));
        let out = render_at(&p, T0 + 65);
        // No `coalesced:` line, so the keys are one column narrower.
        assert!(
            out.contains("status:    running: step 6/8 compare, attempt 1\n"),
            "{out}"
        );
        assert!(out.contains("duration:  1m05s\n"), "{out}");
        assert!(!out.contains("reason:"), "{out}");
        let r = row(&out, "compare", "1");
        assert!(r.contains("running") && r.contains("1m00s"), "{out}");
        assert!(row(&out, "register", "1").ends_with("version 3"), "{out}");
        let t = table(&[p, typed(failed())], T0 + 65);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert_eq!(lines[0].find("STATUS"), lines[1].find("running"), "{t}");
        assert!(
            lines[2].contains("failed") && lines[2].contains("1h00m"),
            "{t}"
        );
        assert!(
            lines[2].contains("training job p-00000007-train-2 failed"),
            "{t}"
        );
    }

    #[test]
    fn outputs_read_as_a_line() {
        let d = format!("sha256:{}", "cd".repeat(32));
        let cases = [
            (
                json!({"output": "job", "id": "p-1-train-1", "checkpoint": d}),
                "job p-1-train-1, checkpoint cdcdcdcdcdcd",
            ),
            (json!({"output": "onnx", "digest": d}), "model cdcdcdcdcdcd"),
            (
                json!({"output": "quantized", "digest": d, "method": "static_entropy",
                    "manifest": d, "version": "4"}),
                "version 4, static_entropy cdcdcdcdcdcd",
            ),
            (
                json!({"output": "comparison", "new": 0.912, "serving": 0.8805}),
                "accuracy 91.20 % new vs 88.05 % serving",
            ),
            (
                json!({"output": "deployment", "id": "d-00000003"}),
                "deployment d-00000003",
            ),
            (json!({"output": "reference"}), "drift reference reset"),
        ];
        for (o, want) in cases {
            assert_eq!(
                output(&serde_json::from_value(o.clone()).unwrap()),
                want,
                "{o}"
            );
        }
    }

    #[test]
    fn end_states_and_their_progress_line() {
        for (status, reason, line) in [
            ("succeeded", None, "succeeded"),
            (
                "stopped",
                Some("not better"),
                "stopped at compare: not better",
            ),
            ("failed", Some("boom"), "failed at compare: boom"),
            ("cancelled", None, "cancelled at compare"),
        ] {
            let p = typed(
                json!({"id": "p-1", "model": "rain", "status": status, "step": "compare",
                "reason": reason, "trigger": "manual", "state": {"state": "succeeded"},
                "history": [], "max_attempts": 3, "step_timeout_seconds": 21600,
                "min_gain_points": 0.0}),
            );
            assert!(is_terminal(&p), "{status}");
            assert_eq!(progress(&p), line);
        }
    }
}
