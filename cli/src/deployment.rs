//! `edgeloop deployment create | list | show | cancel`: staged rollouts
//! through the console API (`docs/rollouts.md`).

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use super::api::{block_on, client, segment, wait_for, CliError, Client, Reply, ServerArgs};
use super::table::{fields, when, Table};

#[derive(Debug, Subcommand)]
pub enum DeploymentCommand {
    /// Roll a model version out to a device group in waves.
    Create(Box<CreateArgs>),
    /// Every deployment, newest first.
    List,
    /// One deployment with its waves, gate evidence and events.
    Show { id: String },
    /// Stop a rollout; the devices it moved go back to their previous version.
    Cancel { id: String },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[arg(long)]
    pub model: String,
    #[arg(long)]
    pub version: String,
    /// The device group, e.g. `site=berlin,edgeloop.io/arch=aarch64`.
    #[arg(long)]
    pub selector: String,
    /// Cumulative wave percentages, e.g. `1,10,50,100`.
    #[arg(long, value_delimiter = ',', conflicts_with = "wave_counts")]
    pub waves: Option<Vec<u32>>,
    /// Cumulative wave sizes in devices, e.g. `1,5,20`.
    #[arg(long, value_delimiter = ',')]
    pub wave_counts: Option<Vec<usize>>,
    /// Seconds each wave runs on the new version before the next starts.
    #[arg(long)]
    pub soak: Option<i64>,
    #[arg(long)]
    pub wave_timeout: Option<i64>,
    #[arg(long)]
    pub rollback_timeout: Option<i64>,
    #[arg(long)]
    pub max_error_rate: Option<f64>,
    #[arg(long)]
    pub max_p99_ratio: Option<f64>,
    #[arg(long)]
    pub max_activation_failures: Option<u32>,
    #[arg(long)]
    pub min_accuracy: Option<f64>,
    #[arg(long)]
    pub min_requests: Option<u64>,
    #[arg(long)]
    pub offline_tolerance: Option<f64>,
    #[arg(long)]
    pub deadline: Option<i64>,
    #[arg(long)]
    pub seed: Option<String>,
    #[arg(long)]
    pub required_provider: Option<String>,
    /// Wait until the deployment ends; exit 0 only if it succeeded.
    #[arg(long)]
    pub wait: bool,
}

impl CreateArgs {
    /// The request body; only what was given, so the server's defaults apply.
    pub fn body(&self) -> Value {
        let mut strategy = Map::new();
        if let Some(p) = &self.waves {
            strategy.insert("waves".into(), json!({ "percent": p }));
        }
        if let Some(c) = &self.wave_counts {
            strategy.insert("waves".into(), json!({ "count": c }));
        }
        put(&mut strategy, "min_soak_seconds", self.soak);
        put(&mut strategy, "wave_timeout_seconds", self.wave_timeout);
        put(
            &mut strategy,
            "rollback_timeout_seconds",
            self.rollback_timeout,
        );
        let mut gates = Map::new();
        put(&mut gates, "max_error_rate", self.max_error_rate);
        put(&mut gates, "max_p99_latency_ratio", self.max_p99_ratio);
        put(
            &mut gates,
            "max_activation_failures",
            self.max_activation_failures,
        );
        put(&mut gates, "min_online_accuracy", self.min_accuracy);
        put(&mut gates, "min_requests", self.min_requests);
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert("version".into(), json!(self.version));
        body.insert("selector".into(), json!(self.selector));
        if !strategy.is_empty() {
            // Timings without waves keep the default waves.
            strategy
                .entry("waves")
                .or_insert_with(|| json!({ "percent": [10, 50, 100] }));
            body.insert("strategy".into(), Value::Object(strategy));
        }
        if !gates.is_empty() {
            body.insert("gates".into(), Value::Object(gates));
        }
        put(&mut body, "offline_tolerance", self.offline_tolerance);
        put(&mut body, "deadline_seconds", self.deadline);
        put(&mut body, "seed", self.seed.clone());
        put(
            &mut body,
            "required_provider",
            self.required_provider.clone(),
        );
        Value::Object(body)
    }
}

fn put<T: serde::Serialize>(map: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        map.insert(key.into(), json!(v));
    }
}

pub fn run(
    cmd: DeploymentCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        let json = server.json;
        match cmd {
            DeploymentCommand::Create(args) => create(&client, json, &args).await,
            DeploymentCommand::List => {
                let all = client.get("/api/v1/deployments").await?;
                Ok(Reply::show(&all, json, |all| {
                    table(all.as_array().map_or(&[][..], |a| a))
                }))
            }
            DeploymentCommand::Show { id } => {
                let d = client
                    .get(&format!("/api/v1/deployments/{}", path(&id)?))
                    .await?;
                Ok(Reply::show(&d, json, render))
            }
            DeploymentCommand::Cancel { id } => {
                let d = client
                    .post(
                        &format!("/api/v1/deployments/{}/cancel", path(&id)?),
                        &json!({}),
                    )
                    .await?;
                Ok(Reply::show(&d, json, render))
            }
        }
    })
}

fn path(id: &str) -> Result<&str, CliError> {
    segment("deployment id", id)
}

async fn create(client: &Client, json_out: bool, args: &CreateArgs) -> Result<Reply, CliError> {
    let created = client.post("/api/v1/deployments", &args.body()).await?;
    if !args.wait {
        return Ok(Reply::show(&created, json_out, render));
    }
    let id = created["id"].as_str().unwrap_or_default();
    if !json_out {
        eprintln!("deployment {id} created; waiting for it to end");
    }
    let d = wait_for(
        client,
        &format!("/api/v1/deployments/{}", path(id)?),
        json_out,
        progress,
        is_terminal,
    )
    .await?;
    let mut reply = Reply::show(&d, json_out, render);
    if d["state"] != "succeeded" {
        reply.code = ExitCode::FAILURE;
    }
    Ok(reply)
}

fn is_terminal(d: &Value) -> bool {
    matches!(
        d["state"].as_str(),
        Some("succeeded" | "rolled_back" | "failed" | "cancelled")
    )
}

/// `wave 2/3: 10 of 20 devices moved`, or the end state with its reason.
pub fn progress(d: &Value) -> String {
    let dep = &d["deployment"];
    let moved = dep["moved"].as_object().map_or(0, |m| m.len());
    let skipped = dep["skipped"].as_object().map_or(0, |m| m.len());
    let waves = match &dep["strategy"]["waves"] {
        Value::Object(o) => o
            .values()
            .next()
            .and_then(|v| v.as_array())
            .map_or(0, |a| a.len()),
        _ => 0,
    };
    let state = d["state"].as_str().unwrap_or("?");
    let reason = dep["state"]["reason"]
        .as_str()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    match state {
        "wave" => format!(
            "wave {}/{waves}: {moved} devices moved, {skipped} skipped",
            dep["state"]["index"].as_u64().unwrap_or(0) + 1
        ),
        other => format!("{other}{reason} ({moved} moved, {skipped} skipped)"),
    }
}

/// One deployment: what, where, how far, and its event log.
fn render(d: &Value) -> String {
    let dep = &d["deployment"];
    let mut pairs = vec![
        ("id", d["id"].as_str().unwrap_or("").to_string()),
        (
            "model",
            format!(
                "{} {}",
                dep["model"].as_str().unwrap_or(""),
                dep["target_version"].as_str().unwrap_or("")
            ),
        ),
        ("group", dep["group"].as_str().unwrap_or("").to_string()),
        ("state", progress(d)),
    ];
    if let Some(skipped) = dep["skipped"].as_object() {
        for (device, why) in skipped {
            pairs.push((
                "skipped",
                format!("{device}: {}", why.as_str().unwrap_or("")),
            ));
        }
    }
    let mut out = fields(&pairs);
    for e in d["events"].as_array().into_iter().flatten() {
        let ev = &e["event"];
        let what = match ev["event"].as_str().unwrap_or("") {
            "wave_started" => format!(
                "wave {} started: {} devices",
                ev["index"].as_u64().unwrap_or(0) + 1,
                ev["assigned"].as_array().map_or(0, |a| a.len())
            ),
            "wave_healthy" => format!(
                "wave {} healthy: {} requests, {} errors",
                ev["index"].as_u64().unwrap_or(0) + 1,
                ev["evidence"]["requests"],
                ev["evidence"]["errors"]
            ),
            "rollback_started" => format!(
                "rolling back {} devices: {}",
                ev["reverted"].as_array().map_or(0, |a| a.len()),
                ev["reason"].as_str().unwrap_or("")
            ),
            "finished" => format!("finished: {}", ev["state"]["state"].as_str().unwrap_or("")),
            other => other.to_string(),
        };
        out.push_str(&format!("  {}  {what}\n", when(&e["at"])));
    }
    out
}

/// The human table for `list`.
pub fn table(all: &[Value]) -> String {
    let mut t = Table::new(&["ID", "MODEL", "GROUP", "STATE", "CREATED"]);
    for d in all {
        let dep = &d["deployment"];
        t.row(vec![
            d["id"].as_str().unwrap_or("").to_string(),
            format!(
                "{} {}",
                dep["model"].as_str().unwrap_or(""),
                dep["target_version"].as_str().unwrap_or("")
            ),
            dep["group"].as_str().unwrap_or("").to_string(),
            d["state"].as_str().unwrap_or("").to_string(),
            when(&d["created_at"]),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn create_args(args: &[&str]) -> CreateArgs {
        let mut argv = vec!["edgeloop", "deployment", "create"];
        argv.extend(args);
        match Cli::parse_from(argv).command {
            Command::Deployment {
                cmd: DeploymentCommand::Create(a),
                ..
            } => *a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_given_fields_are_sent() {
        let a = create_args(&["--model", "m", "--version", "2", "--selector", "site=lab"]);
        assert_eq!(
            a.body(),
            json!({"model": "m", "version": "2", "selector": "site=lab"})
        );
        let a = create_args(&[
            "--model",
            "m",
            "--version",
            "2",
            "--selector",
            "a=b",
            "--waves",
            "1,10,100",
            "--soak",
            "60",
            "--max-error-rate",
            "0.01",
            "--required-provider",
            "CUDAExecutionProvider",
        ]);
        assert_eq!(
            a.body(),
            json!({"model": "m", "version": "2", "selector": "a=b",
                   "strategy": {"waves": {"percent": [1, 10, 100]}, "min_soak_seconds": 60},
                   "gates": {"max_error_rate": 0.01},
                   "required_provider": "CUDAExecutionProvider"})
        );
        let a = create_args(&[
            "--model",
            "m",
            "--version",
            "2",
            "--selector",
            "a=b",
            "--soak",
            "5",
        ]);
        assert_eq!(
            a.body()["strategy"]["waves"],
            json!({"percent": [10, 50, 100]})
        );
    }

    #[test]
    fn the_table_aligns_columns() {
        let rows = vec![json!({"id": "d-1", "state": "succeeded", "created_at": "t",
            "deployment": {"model": "digits", "target_version": "2.0.0", "group": "site=lab"}})];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].find("MODEL"), lines[1].find("digits"));
        assert_eq!(lines[0].find("STATE"), lines[1].find("succeeded"));
    }
}
