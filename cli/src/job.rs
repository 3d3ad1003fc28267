//! `edgeloop job list | show <id> [--wait] | cancel <id>`: training jobs
//! through the console API.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use edgeloop_api::jobs::{Job, JobState, JobView};
use serde_json::json;

use super::api::{block_on, client, segment, wait_for, CliError, Reply, ServerArgs};
use super::model_api::{short, size};
use super::table::{clip, fields, text, when, Cell, Table};

impl Cell for JobState {
    fn cell(&self) -> String {
        self.as_str().into()
    }
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Every training job, oldest first.
    List,
    /// One job with its progress history and checkpoints.
    Show {
        id: String,
        /// Follow the job until it ends; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
    },
    /// Cancel a job: at once if queued, through its bridge if running.
    Cancel { id: String },
}

/// Progress events shown by `show` (the newest); `--json` has them all.
const HISTORY_SHOWN: usize = 10;

pub fn run(cmd: JobCommand, server: &ServerArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        let json = server.json;
        match cmd {
            JobCommand::List => {
                let all: Vec<Job> = client.get("/api/v1/jobs").await?;
                Reply::typed(&all, json, |all| table(all))
            }
            JobCommand::Show { id, wait: false } => {
                let job: JobView = client.get(&format!("/api/v1/jobs/{}", path(&id)?)).await?;
                Reply::typed(&job, json, render)
            }
            JobCommand::Show { id, wait: true } => {
                let job: JobView = wait_for(
                    &client,
                    &format!("/api/v1/jobs/{}", path(&id)?),
                    json,
                    progress,
                    is_terminal,
                )
                .await?;
                let mut reply = Reply::typed(&job, json, render)?;
                if job.job.state != JobState::Succeeded {
                    reply.code = ExitCode::FAILURE;
                }
                Ok(reply)
            }
            JobCommand::Cancel { id } => {
                let job: JobView = client
                    .post(&format!("/api/v1/jobs/{}/cancel", path(&id)?), &json!({}))
                    .await?;
                Reply::typed(&job, json, render)
            }
        }
    })
}

fn path(id: &str) -> Result<&str, CliError> {
    segment("job id", id)
}

pub fn is_terminal(job: &JobView) -> bool {
    job.job.state.is_terminal()
}

/// `running, attempt 2, step 1200: loss=0.31` (what the spinner shows).
pub fn progress(job: &JobView) -> String {
    let job = &job.job;
    let mut line = format!(
        "{}, attempt {}, step {}",
        job.state.as_str(),
        job.attempt,
        job.step
    );
    let last = job.history.last();
    if let Some(m) = last.map(|e| &e.metrics).filter(|m| !text(*m).eq("-")) {
        line.push_str(&format!(": {}", text(m)));
    }
    if !job.last_message.is_empty() {
        line.push_str(&format!(" ({})", clip(&job.last_message, 60)));
    }
    line
}

pub fn table(all: &[Job]) -> String {
    let mut t = Table::new(&[
        "ID", "STATE", "ATTEMPT", "STEP", "CLUSTER", "UPDATED", "MESSAGE",
    ]);
    for j in all {
        t.row(vec![
            text(&j.id),
            text(&j.state),
            text(&j.attempt),
            text(&j.step),
            text(&j.leased_by),
            when(&j.updated_at),
            clip(&j.last_message, 50),
        ]);
    }
    t.render()
}

/// The spec's image and what it is pinned to, in full: the digest is what
/// a team compares with its registry.
fn image(job: &Job) -> String {
    match (
        &job.image,
        job.spec.rest.get("image").and_then(|i| i.as_str()),
    ) {
        (Some(pin), _) => pin.to_string(),
        (None, Some(reference)) => format!("{reference} (not pinned yet)"),
        (None, None) => "—".into(),
    }
}

pub fn render(view: &JobView) -> String {
    let job = &view.job;
    let cancel = if job.cancel_requested {
        " (cancel requested)"
    } else {
        ""
    };
    let mut out = fields(&[
        ("id", text(&job.id)),
        ("name", text(&job.spec.name)),
        ("state", format!("{}{cancel}", text(&job.state))),
        ("attempt", text(&job.attempt)),
        (
            "restarts",
            format!(
                "{} after failures, {} after preemptions",
                job.restarts, job.preemptions
            ),
        ),
        ("step", text(&job.step)),
        ("cluster", text(&job.cluster)),
        ("leased by", text(&job.leased_by)),
        ("lease until", when(&job.lease_expires_at)),
        ("engine job", text(&job.engine_job_id)),
        ("image", image(job)),
        ("exit code", text(&job.exit_code)),
        ("message", text(&job.last_message)),
        ("created", when(&job.created_at)),
        ("updated", when(&job.updated_at)),
    ]);
    let history = &job.history;
    if !history.is_empty() {
        let skip = history.len().saturating_sub(HISTORY_SHOWN);
        out.push_str(&format!(
            "\nprogress (last {} of {}):\n",
            history.len() - skip,
            history.len()
        ));
        let mut t = Table::new(&["AT", "ATTEMPT", "STATE", "STEP", "METRICS", "MESSAGE"]);
        for e in &history[skip..] {
            t.row(vec![
                when(&e.at),
                text(&e.attempt),
                text(&e.state),
                text(&e.step),
                text(&e.metrics),
                clip(&e.message, 50),
            ]);
        }
        out.push_str(&t.render());
    }
    if !view.checkpoints.is_empty() {
        out.push_str("\ncheckpoints:\n");
        let mut t = Table::new(&["STEP", "ATTEMPT", "DIGEST", "SIZE", "CLUSTER", "UPLOADED"]);
        for c in &view.checkpoints {
            t.row(vec![
                text(&c.step),
                text(&c.attempt),
                short(Some(&c.digest)),
                size(c.size),
                text(&c.cluster),
                when(&c.uploaded_at),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str) -> JobView {
        serde_json::from_value(json!({
            "id": "mnist-0000abcd", "spec": {"name": "mnist"}, "cluster": null,
            "state": state, "leased_by": "gpu-a", "lease_expires_at": null,
            "attempt": 2, "step": 1200, "engine_job_id": "local-1", "exit_code": null,
            "image": {"reference": "localhost/train:1", "digest": "d".repeat(64), "kind": "image_id"},
            "cancel_requested": false, "last_message": "step 1200",
            "history": [{"at": "2026-01-01T00:00:01Z", "attempt": 2, "state": "running", "step": 1200,
                         "metrics": {"loss": 0.25}, "message": "step 1200"}],
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:01Z",
            "checkpoints": [{"job_id": "mnist-0000abcd", "attempt": 2, "step": 1000,
                             "digest": format!("sha256:{}", "c".repeat(64)), "size": 4096,
                             "has_optimizer_state": true, "cluster": "gpu-a",
                             "uploaded_at": "2026-01-01T00:00:01Z"}]
        }))
        .unwrap()
    }

    #[test]
    fn show_has_progress_and_checkpoints() {
        let out = render(&job("running"));
        assert!(out.contains("state:        running\n"), "{out}");
        assert!(out.contains("leased by:    gpu-a\n"), "{out}");
        assert!(out.contains("progress (last 1 of 1):"), "{out}");
        assert!(out.contains("loss=0.25"), "{out}");
        assert!(out.contains("cccccccccccc  4.0 KiB"), "{out}");
        let pinned = format!(
            "image:        localhost/train:1 (image ID sha256:{})\n",
            "d".repeat(64)
        );
        assert!(out.contains(&pinned), "{out}");
    }

    #[test]
    fn progress_line_and_end_states() {
        assert_eq!(
            progress(&job("running")),
            "running, attempt 2, step 1200: loss=0.25 (step 1200)"
        );
        for (state, ended) in [
            ("queued", false),
            ("leased", false),
            ("running", false),
            ("succeeded", true),
            ("failed", true),
            ("cancelled", true),
        ] {
            assert_eq!(is_terminal(&job(state)), ended, "{state}");
        }
    }
}
