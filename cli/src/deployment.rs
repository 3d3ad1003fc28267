//! `edgeloop deployment create | list | show | cancel`: staged rollouts
//! through the console API (`docs/rollouts.md`).

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use edgeloop_api::aliases::AliasName;
use edgeloop_api::deployments::{
    CreateDeployment, DeploymentState, DeploymentView, GatesRequest, RolloutState, StrategyRequest,
    Waves, DEFAULT_WAVES,
};

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
#[command(group(clap::ArgGroup::new("target").required(true).args(["version", "alias"])))]
pub struct CreateArgs {
    #[arg(long)]
    pub model: String,
    #[arg(long)]
    pub version: Option<String>,
    /// An alias of the model (e.g. `production`) instead of a version:
    /// resolved to its version when the deployment is created.
    #[arg(long)]
    pub alias: Option<AliasName>,
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
    /// The request; only what was given, so the server's defaults apply.
    pub fn body(&self) -> CreateDeployment {
        let waves = match (&self.waves, &self.wave_counts) {
            (Some(p), _) => Some(Waves::Percent(p.clone())),
            (None, Some(c)) => Some(Waves::Count(c.clone())),
            (None, None) => None,
        };
        let timings =
            self.soak.is_some() || self.wave_timeout.is_some() || self.rollback_timeout.is_some();
        let strategy = (waves.is_some() || timings).then(|| StrategyRequest {
            // Timings without waves keep the default waves.
            waves: waves.unwrap_or_else(|| Waves::Percent(DEFAULT_WAVES.to_vec())),
            min_soak_seconds: self.soak,
            wave_timeout_seconds: self.wave_timeout,
            rollback_timeout_seconds: self.rollback_timeout,
        });
        let gates = GatesRequest {
            max_error_rate: self.max_error_rate,
            max_p99_latency_ratio: self.max_p99_ratio,
            max_activation_failures: self.max_activation_failures,
            min_online_accuracy: self.min_accuracy,
            min_requests: self.min_requests,
        };
        CreateDeployment {
            model: self.model.clone(),
            version: self.version.clone(),
            alias: self.alias.clone(),
            selector: self.selector.clone(),
            strategy,
            gates: (!gates.is_empty()).then_some(gates),
            offline_tolerance: self.offline_tolerance,
            deadline_seconds: self.deadline,
            seed: self.seed.clone(),
            required_provider: self.required_provider.clone(),
            activation_timeout_seconds: None,
        }
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
                let all: Vec<DeploymentView> = client.get("/api/v1/deployments").await?;
                Reply::typed(&all, json, |all| table(all))
            }
            DeploymentCommand::Show { id } => {
                let d: DeploymentView = client
                    .get(&format!("/api/v1/deployments/{}", path(&id)?))
                    .await?;
                Reply::typed(&d, json, render)
            }
            DeploymentCommand::Cancel { id } => {
                let d: DeploymentView = client
                    .post(
                        &format!("/api/v1/deployments/{}/cancel", path(&id)?),
                        &serde_json::json!({}),
                    )
                    .await?;
                Reply::typed(&d, json, render)
            }
        }
    })
}

fn path(id: &str) -> Result<&str, CliError> {
    segment("deployment id", id)
}

async fn create(client: &Client, json_out: bool, args: &CreateArgs) -> Result<Reply, CliError> {
    let created: DeploymentView = client.post("/api/v1/deployments", &args.body()).await?;
    if !args.wait {
        return Reply::typed(&created, json_out, render);
    }
    if !json_out {
        eprintln!("deployment {} created; waiting for it to end", created.id);
    }
    let d: DeploymentView = wait_for(
        client,
        &format!("/api/v1/deployments/{}", path(&created.id)?),
        json_out,
        progress,
        |d: &DeploymentView| d.state.is_terminal(),
    )
    .await?;
    let mut reply = Reply::typed(&d, json_out, render)?;
    if d.state != DeploymentState::Succeeded {
        reply.code = ExitCode::FAILURE;
    }
    Ok(reply)
}

/// `wave 2/3: 10 of 20 devices moved`, or the end state with its reason.
pub fn progress(d: &DeploymentView) -> String {
    let dep = &d.deployment;
    let moved = dep.moved.len();
    let skipped = dep.skipped.len();
    let waves = dep.strategy.waves.len();
    match &dep.state {
        RolloutState::Wave { index, .. } => format!(
            "wave {}/{waves}: {moved} devices moved, {skipped} skipped",
            index + 1
        ),
        other => {
            let reason = other.reason().map(|r| format!(": {r}")).unwrap_or_default();
            format!(
                "{}{reason} ({moved} moved, {skipped} skipped)",
                d.state.as_str()
            )
        }
    }
}

/// `digits 2.0.0`, or `digits 2.0.0 (production)` when an alias named it.
fn target(d: &DeploymentView) -> String {
    let dep = &d.deployment;
    match &d.alias {
        Some(a) => format!("{} {} ({a})", dep.model, dep.target_version),
        None => format!("{} {}", dep.model, dep.target_version),
    }
}

/// One deployment: what, where, how far, and its event log.
fn render(d: &DeploymentView) -> String {
    let dep = &d.deployment;
    let mut pairs = vec![
        ("id", d.id.clone()),
        ("model", target(d)),
        ("group", dep.group.clone()),
        ("state", progress(d)),
    ];
    for (device, why) in &dep.skipped {
        pairs.push(("skipped", format!("{device}: {why}")));
    }
    // Devices not listed got the version's own artifact.
    for (device, variant) in &d.variants {
        pairs.push(("variant", format!("{device}: {variant}")));
    }
    let mut out = fields(&pairs);
    for e in &d.events {
        let what = e.event.summary();
        out.push_str(&format!("  {}  {what}\n", when(&e.at)));
    }
    out
}

/// The human table for `list`.
pub fn table(all: &[DeploymentView]) -> String {
    let mut t = Table::new(&["ID", "MODEL", "GROUP", "STATE", "CREATED"]);
    for d in all {
        let dep = &d.deployment;
        t.row(vec![
            d.id.clone(),
            target(d),
            dep.group.clone(),
            d.state.as_str().to_string(),
            when(&d.created_at),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use serde_json::{json, Value};

    use super::*;
    use crate::{Cli, Command};

    fn body(a: &CreateArgs) -> Value {
        serde_json::to_value(a.body()).unwrap()
    }

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
            body(&a),
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
            body(&a),
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
            body(&a)["strategy"]["waves"],
            json!({"percent": [10, 50, 100]})
        );
        let a = create_args(&["--model", "m", "--alias", "production", "--selector", "a=b"]);
        assert_eq!(
            body(&a),
            json!({"model": "m", "alias": "production", "selector": "a=b"})
        );
    }

    #[test]
    fn a_version_or_an_alias_is_required_but_not_both() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["edgeloop", "deployment", "create", "--model", "m"];
            argv.extend(args);
            argv.extend(["--selector", "a=b"]);
            Cli::try_parse_from(argv)
        };
        assert!(parse(&[]).is_err());
        assert!(parse(&["--version", "1", "--alias", "production"]).is_err());
        let bad = parse(&["--alias", "Production"]).unwrap_err().to_string();
        assert!(bad.contains("not a valid alias"), "{bad}");
    }

    fn view(state: RolloutState) -> DeploymentView {
        serde_json::from_value(json!({
            "id": "d-1", "seq": 1, "activation_timeout_seconds": 600,
            "created_at": "2026-12-01T09:00:00.5Z", "updated_at": "2026-12-01T09:00:00Z",
            "state": state.name(), "requirements": {},
            "deployment": {"id": "d-1", "group": "site=lab", "model": "digits",
                "target_version": "2.0.0", "seed": "d-1",
                "strategy": {"waves": {"percent": [10, 50, 100]}, "min_soak_seconds": 1,
                    "wave_timeout_seconds": 2, "rollback_timeout_seconds": 3},
                "gates": {"max_error_rate": 0.1, "max_p99_latency_ratio": 2.0,
                    "max_activation_failures": 0},
                "offline_tolerance": 0.0, "deadline": 10, "state": state,
                "moved": {"dev-1": {"wave": 0, "previous": null}},
                "skipped": {"dev-2": "no disk"}},
        }))
        .unwrap()
    }

    #[test]
    fn the_table_aligns_columns() {
        let rows = vec![view(RolloutState::Succeeded)];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].find("MODEL"), lines[1].find("digits"));
        assert_eq!(lines[0].find("STATE"), lines[1].find("succeeded"));
        assert!(lines[1].ends_with("2026-12-01T09:00:00Z"), "{t}");
    }

    #[test]
    fn progress_names_the_wave_or_the_end_and_its_reason() {
        let wave = RolloutState::Wave {
            index: 1,
            started_at: 0,
            soak_until: None,
        };
        assert_eq!(
            progress(&view(wave)),
            "wave 2/3: 1 devices moved, 1 skipped"
        );
        let failed = RolloutState::Failed {
            reason: "deadline passed".into(),
        };
        assert_eq!(
            progress(&view(failed)),
            "failed: deadline passed (1 moved, 1 skipped)"
        );
        let mut done = view(RolloutState::Succeeded);
        done.variants.insert("dev-1".into(), "fp16-gpu".into());
        done.alias = Some(AliasName::new("production").unwrap());
        let shown = render(&done);
        assert!(shown.contains("digits 2.0.0 (production)"), "{shown}");
        assert!(shown.contains("skipped:  dev-2: no disk"), "{shown}");
        assert!(shown.contains("variant:  dev-1: fp16-gpu"), "{shown}");
    }
}
