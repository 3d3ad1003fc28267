//! `edgeloop retraining set <model> --file policy.json | show <model>` (how
//! a model is retrained: `PUT|GET /api/v1/models/{name}/retraining`) and
//! `edgeloop retrain <model> [--reason R] [--wait]` (a manual trigger:
//! `POST /api/v1/models/{name}/retrain`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use edgeloop_api::pipelines::{PipelineView, RetrainRequest, RetrainingConfig};
use serde::Deserialize;

use super::api::{block_on, client, read_json, segment, Reply, ServerArgs};
use super::pipeline;
use super::table::{duration, fields, text};

#[derive(Debug, Subcommand)]
pub enum RetrainingCommand {
    /// Set a model's retraining policy from a JSON file: the training job
    /// template, the base dataset, the eval split, the gates and the
    /// rollout template.
    Set {
        model: String,
        /// The policy (`RetrainingConfig` JSON); `-` reads stdin.
        #[arg(long, short = 'f')]
        file: PathBuf,
    },
    /// A model's retraining policy.
    Show { model: String },
}

#[derive(Debug, Args)]
pub struct RetrainArgs {
    pub model: String,
    /// Why, for the record: the trigger becomes `manual: <reason>`.
    #[arg(long)]
    pub reason: Option<String>,
    /// Follow the pipeline until it ends; exit 0 only if it succeeded.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub fn run(
    cmd: RetrainingCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        match cmd {
            RetrainingCommand::Set { model, file } => {
                let name = segment("model name", &model)?;
                let policy = read_json(&file)?;
                let saved: RetrainingConfig = client
                    .put(&format!("/api/v1/models/{name}/retraining"), &policy)
                    .await?;
                Reply::typed(&saved, server.json, |c| {
                    format!("retraining policy of {name} set\n{}", render(name, c))
                })
            }
            RetrainingCommand::Show { model } => {
                let name = segment("model name", &model)?;
                let c: RetrainingConfig = client
                    .get(&format!("/api/v1/models/{name}/retraining"))
                    .await?;
                Reply::typed(&c, server.json, |c| render(name, c))
            }
        }
    })
}

pub fn retrain(args: &RetrainArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let name = segment("model name", &args.model)?;
        let client = client(&args.server)?;
        let json = args.server.json;
        let body = RetrainRequest {
            reason: args.reason.clone(),
        };
        let p: PipelineView = client
            .post(&format!("/api/v1/models/{name}/retrain"), &body)
            .await?;
        let line = started(&p);
        if !args.wait {
            return Reply::typed(&p, json, |_| line.clone());
        }
        if !json {
            eprint!("{line}");
        }
        let mut reply = pipeline::follow(&client, &p.id, json).await?;
        if !json {
            reply.stdout = format!("{line}\n{}", reply.stdout);
        }
        Ok(reply)
    })
}

/// What a retrain request did: a new pipeline, or the running one it was
/// folded into.
pub fn started(p: &PipelineView) -> String {
    let (id, model) = (text(&p.id), text(&p.model));
    if p.coalesced_request {
        format!(
            "{model} is already retraining: the request was coalesced into pipeline {id} ({})\n",
            pipeline::progress(p)
        )
    } else {
        format!(
            "pipeline {id} started for {model} (trigger: {})\n",
            text(&p.trigger)
        )
    }
}

/// The parts of the job template a person reads (the template itself is
/// the trainer bridge's free-form job spec).
#[derive(Debug, Default, Deserialize)]
struct JobTemplate {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    command: Option<Vec<String>>,
}

/// A policy as a person reads it.
pub fn render(model: &str, c: &RetrainingConfig) -> String {
    let job: JobTemplate = serde_json::from_value(c.job.clone()).unwrap_or_default();
    let command = job.command.map_or("-".into(), |a| a.join(" "));
    let base = match (&c.base_dataset, c.base_window_rows) {
        (None, _) => "-".into(),
        (Some(d), Some(n)) => format!("{} (the last {n} rows)", pipeline::short(d)),
        (Some(d), None) => pipeline::short(d),
    };
    let fraction = format!("{}", (c.eval_fraction * 1000.0).round() / 10.0);
    fields(&[
        ("model", model.to_string()),
        ("job", text(&job.name)),
        ("command", command),
        ("cluster", text(&c.cluster)),
        ("base dataset", base),
        (
            "evaluate on",
            format!(
                "the newest {fraction} % of labelled edge samples (at least {})",
                text(&c.min_eval_samples)
            ),
        ),
        (
            "quantization",
            format!(
                "at most {} points of accuracy lost",
                text(&c.quantization_budget_points)
            ),
        ),
        (
            "promotion",
            format!(
                "more than {} points better than the serving version",
                text(&c.min_gain_points)
            ),
        ),
        (
            "rollout",
            serde_json::to_string(&c.rollout).unwrap_or_default(),
        ),
        ("attempts", format!("{} per step", text(&c.max_attempts))),
        ("step timeout", duration(c.step_timeout_seconds)),
    ])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_policy_reads_as_fields() {
        let c = json!({
            "job": {"name": "retrain-rain", "command": ["python3", "train.py", "--epochs", "3"]},
            "base_dataset": "ef".repeat(32), "base_window_rows": 60,
            "eval_fraction": 0.25, "min_eval_samples": 10,
            "quantization_budget_points": 1.0, "min_gain_points": 0.5,
            "rollout": {"selector": "site=lab"}, "max_attempts": 2,
            "step_timeout_seconds": 21600
        });
        let out = render("rain", &serde_json::from_value(c).unwrap());
        for want in [
            "model:         rain\n",
            "job:           retrain-rain\n",
            "command:       python3 train.py --epochs 3\n",
            "cluster:       -\n",
            "base dataset:  efefefefefef (the last 60 rows)\n",
            "evaluate on:   the newest 25 % of labelled edge samples (at least 10)\n",
            "quantization:  at most 1.0 points of accuracy lost\n",
            "promotion:     more than 0.5 points better than the serving version\n",
            "rollout:       {\"selector\":\"site=lab\"}\n",
            "attempts:      2 per step\n",
            "step timeout:  6h00m\n",
        ] {
            assert!(out.contains(want), "{want}: {out}");
        }
    }

    #[test]
    fn a_retrain_says_what_it_started_or_joined() {
        let p = json!({"id": "p-00000004", "model": "rain", "trigger": "manual: cli",
                       "status": "running", "step": "build_dataset",
                       "state": {"state": "running", "step": "build_dataset", "attempt": 1,
                                 "started_at": 0},
                       "history": [], "max_attempts": 3, "step_timeout_seconds": 21600,
                       "min_gain_points": 0.0});
        let typed =
            |p: &serde_json::Value| -> PipelineView { serde_json::from_value(p.clone()).unwrap() };
        assert_eq!(
            started(&typed(&p)),
            "pipeline p-00000004 started for rain (trigger: manual: cli)\n"
        );
        let mut joined = p.clone();
        joined["step"] = json!("train");
        joined["coalesced_request"] = json!(true);
        assert_eq!(
            started(&typed(&joined)),
            "rain is already retraining: the request was coalesced into pipeline p-00000004 \
             (running: step 2/8 train, attempt 1)\n"
        );
    }
}
