//! `edgeloop demo`: the whole loop on real data, as real processes on
//! loopback, on embedded defaults only (sled, the local artifact store, the
//! local training engine, ONNX Runtime on CPU). It starts a control plane,
//! a trainer bridge and three edge agents, trains v1 on the early years of
//! the NOAA rainfall stream, quantizes it behind the accuracy gate, rolls
//! it out in waves, replays the later days through the agents with a label
//! after each, and lets the control plane notice the drift, retrain, gate
//! and roll out v2 on its own. See docs/demo.md.

mod console;
mod data;
mod procs;
mod replay;
mod summary;
mod trainer;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use edgeloop_models::dataset::Dataset;
use edgeloop_models::manifest::Lineage as ManifestLineage;
use edgeloop_models::npz::Npz;
use edgeloop_models::onnx;
use edgeloop_models::quantize::gate::GateOptions;
use edgeloop_models::runtime::OrtRuntime;
use serde_json::{json, Value};

use console::{wait_for, Console};
use edgeloop_api::deployments::{DeploymentState, DeploymentView};
use edgeloop_api::fleet::{CreatedToken, MemberStatus, MemberView};
use edgeloop_api::jobs::{JobState, JobView};
use edgeloop_api::pipelines::{PipelineStatus, PipelineView};
use edgeloop_api::registry::{ModelVersionView, ModelView};
use procs::{free_port, Procs};
use serde::de::IgnoredAny;
use summary::{Latency, ModelBytes, PipelineSummary, Summary, VersionSummary};
use trainer::{Trainer, TrainerKind};

use edgeloop_models::package::{self, Identity};

const MODEL: &str = "rainfall";
const SELECTOR: &str = "demo=rainfall";
const AGENTS: usize = 3;
const V1: &str = "1.0.0";

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Where the processes keep their data and logs (replaced each run;
    /// default `$EDGELOOP_HOME/demo`, else `~/.edgeloop/demo`).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// The first day replayed through the agents (v1 trains on days
    /// 0..10 000 and evaluates on 10 000..12 000).
    #[arg(long, default_value_t = 11_000)]
    pub from_row: usize,
    /// One past the last day replayed (default: the end of the table).
    #[arg(long)]
    pub to_row: Option<usize>,
    /// Days replayed per second (the replay compresses time: a day is a
    /// request and its label).
    #[arg(long, default_value_t = 60.0)]
    pub rows_per_second: f64,
    /// The no-drift control: replay only days from before the shift.
    #[arg(long)]
    pub control: bool,
    /// Training steps of v1's job.
    #[arg(long, default_value_t = 600)]
    pub train_steps: u64,
    /// Training steps of each retrain: its window holds a few hundred
    /// post-shift rows, which take more passes than v1's 10 000 days
    /// (docs/demo.md).
    #[arg(long, default_value_t = 1500)]
    pub retrain_steps: u64,
    /// The rainfall table (default: where scripts/fetch-rainfall.sh puts it).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The trainer of v1 and of the retrains: the Rust reference trainer,
    /// or the PyTorch one (DDP over 2 processes; needs torch, which
    /// scripts/torch-env.sh installs).
    #[arg(long, value_enum, default_value_t = TrainerKind::Reference)]
    pub trainer: TrainerKind,
    /// The Python with torch for `--trainer pytorch` (default:
    /// `$EDGELOOP_TORCH_PYTHON`, else scripts/torch-env.sh's).
    #[arg(long)]
    pub torch_python: Option<PathBuf>,
    /// After the summary, keep the processes running (the web console
    /// stays at the URL printed at the start) until Ctrl-C or SIGTERM.
    #[arg(long)]
    pub keep_running: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let json_out = args.json;
    let keep_running = args.keep_running;
    match runtime.block_on(demo(args)) {
        Ok((summary, ok, mut running)) => {
            if json_out {
                println!("{}", summary.json());
            } else {
                print!("{}", summary.table());
            }
            if keep_running {
                use std::io::Write as _;
                // Whoever reads the summary from a pipe sees it now, not
                // when the demo ends.
                std::io::stdout().flush()?;
                say(&format!(
                    "the demo keeps running: the console is at {} (log in with the token in {}); Ctrl-C or SIGTERM stops it",
                    running.console_url,
                    running.token_file.display()
                ));
                let stopped = runtime.block_on(async { running.watch_until_stopped().await });
                running.procs.stop();
                if let Err(e) = stopped {
                    eprintln!("demo failed while it kept running: {e:#}");
                    return Ok(ExitCode::FAILURE);
                }
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The demo's processes after its summary, and where its console is.
struct Running {
    procs: Procs,
    console_url: String,
    token_file: PathBuf,
}

impl Running {
    /// Waits for Ctrl-C or SIGTERM; fails if a process exits meanwhile.
    async fn watch_until_stopped(&mut self) -> anyhow::Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                r = tokio::signal::ctrl_c() => return r.context("waiting for Ctrl-C"),
                _ = term.recv() => return Ok(()),
                _ = tick.tick() => self.procs.check().context("a process died while the demo kept running")?,
            }
        }
    }
}

fn say(msg: &str) {
    eprintln!("==> {msg}");
}

fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .context("the edgeloop binary has no directory")?;
    let p = dir.join(name);
    anyhow::ensure!(
        p.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace --bins`; scripts/demo.sh does it)",
        p.display()
    );
    Ok(p)
}

fn workdir(args: &DemoArgs) -> PathBuf {
    args.workdir.clone().unwrap_or_else(|| {
        std::env::var_os("EDGELOOP_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".edgeloop")
            })
            .join("demo")
    })
}

fn rollout_template() -> Value {
    json!({
        "selector": SELECTOR,
        "strategy": {"waves": {"count": [1, AGENTS]}, "min_soak_seconds": 2},
        // p99 over a couple of seconds of traffic is noisy on a busy 2-core box.
        "gates": {"max_error_rate": 0.05, "max_p99_latency_ratio": 5.0}
    })
}

/// Starts the processes; returns the console API and the agents' base
/// URLs.
async fn start(
    procs: &mut Procs,
    work: &Path,
    trusted_key: &str,
) -> anyhow::Result<(Console, Vec<String>)> {
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let (grpc, http) = (free_port()?, free_port()?);
    let cp_dir = work.join("control-plane");
    say(&format!(
        "starting the control plane (gRPC 127.0.0.1:{grpc}, HTTP 127.0.0.1:{http})"
    ));
    procs.spawn(
        "control-plane",
        &bin("control-plane")?,
        &[
            "serve".into(),
            "--data-dir".into(),
            cp_dir.display().to_string(),
            "--grpc-listen".into(),
            format!("127.0.0.1:{grpc}"),
            "--http-listen".into(),
            format!("127.0.0.1:{http}"),
            "--rollout-tick-ms".into(),
            "200".into(),
            "--heartbeat-interval-secs".into(),
            "1".into(),
        ],
        &logs,
    )?;
    let base = format!("http://127.0.0.1:{http}");
    let probe = reqwest::Client::new();
    wait_for(
        "the control plane to be ready",
        Duration::from_secs(60),
        || {
            let r = probe.get(format!("{base}/readyz")).send();
            let alive = procs.check();
            async move {
                alive?;
                Ok(r.await.ok().filter(|r| r.status().is_success()).map(|_| ()))
            }
        },
    )
    .await?;
    let token_file = cp_dir.join("admin.token");
    let token =
        std::fs::read_to_string(&token_file).context("reading the control plane's admin token")?;
    say(&format!(
        "the web console: {base}/ui/ (log in with the token in {})",
        token_file.display()
    ));
    let console = Console::new(base, token.trim().to_string())?;
    let endpoint = format!("https://localhost:{grpc}");

    let t: CreatedToken = console
        .post(
            "/api/v1/tokens",
            json!({"kind": "cluster", "name": "demo-bridge"}),
        )
        .await?;
    say("starting a trainer bridge (local engine)");
    procs.spawn(
        "trainer-bridge",
        &bin("trainer-bridge")?,
        &[
            "run".into(),
            "--data-dir".into(),
            work.join("trainer-bridge").display().to_string(),
            "--control-plane".into(),
            endpoint.clone(),
            "--bootstrap-token".into(),
            t.token,
        ],
        &logs,
    )?;
    let mut agents = vec![];
    for i in 1..=AGENTS {
        let name = format!("edge-{i}");
        let t: CreatedToken = console
            .post(
                "/api/v1/tokens",
                json!({"kind": "device", "name": name,
                       "labels": {"demo": "rainfall", "site": format!("site-{i}")}}),
            )
            .await?;
        let port = free_port()?;
        // Each agent's gRPC service needs a port of its own too: the
        // default (8001) can serve only one agent per machine.
        let grpc_port = free_port()?;
        procs.spawn(
            &name,
            &bin("edge-agent")?,
            &[
                "run".into(),
                "--data-dir".into(),
                work.join(&name).display().to_string(),
                "--control-plane".into(),
                endpoint.clone(),
                "--bootstrap-token".into(),
                t.token,
                "--inference-listen".into(),
                format!("127.0.0.1:{port}"),
                "--grpc-inference-listen".into(),
                format!("127.0.0.1:{grpc_port}"),
                "--trusted-keys".into(),
                trusted_key.to_string(),
                "--telemetry-interval-secs".into(),
                "1".into(),
            ],
            &logs,
        )?;
        agents.push(format!("http://127.0.0.1:{port}"));
    }
    say(&format!(
        "starting {AGENTS} edge agents; waiting for them and the bridge to enroll"
    ));
    wait_for(
        "the agents and the bridge to come online",
        Duration::from_secs(90),
        || {
            let c = console.clone();
            let alive = procs.check();
            async move {
                alive?;
                let devices: Vec<MemberView> = c
                    .get(&format!("/api/v1/devices?selector={SELECTOR}"))
                    .await?;
                let online = |m: &MemberView| m.status == MemberStatus::Online;
                let devices_online = devices.iter().filter(|d| online(d)).count();
                let bridge: Option<MemberView> = c.get("/api/v1/clusters/demo-bridge").await.ok();
                Ok((devices_online == AGENTS && bridge.as_ref().is_some_and(online)).then_some(()))
            }
        },
    )
    .await?;
    Ok((console, agents))
}

async fn wait_job(console: &Console, id: &str) -> anyhow::Result<JobView> {
    let job = wait_for(
        &format!("training job {id}"),
        Duration::from_secs(600),
        || async {
            let j: JobView = console.get(&format!("/api/v1/jobs/{id}")).await?;
            Ok(j.job.state.is_terminal().then_some(j))
        },
    )
    .await?;
    // Each part as JSON writes it, as the demo always reported it.
    anyhow::ensure!(
        job.job.state == JobState::Succeeded,
        "training job {id} ended {}: {}",
        as_json(&job.job.state),
        as_json(&job.job.last_message)
    );
    Ok(job)
}

async fn wait_deployment(console: &Console, id: &str) -> anyhow::Result<DeploymentView> {
    let d = wait_for(
        &format!("deployment {id}"),
        Duration::from_secs(300),
        || async {
            let d: DeploymentView = console.get(&format!("/api/v1/deployments/{id}")).await?;
            Ok(d.state.is_terminal().then_some(d))
        },
    )
    .await?;
    anyhow::ensure!(
        d.state == DeploymentState::Succeeded,
        "deployment {id} ended {}: {}",
        as_json(&d.state),
        as_json(&d)
    );
    Ok(d)
}

fn zip_file(zip: &[u8], name: &str) -> anyhow::Result<Vec<u8>> {
    let mut a =
        zip::ZipArchive::new(std::io::Cursor::new(zip)).context("the checkpoint is not a zip")?;
    let mut f = a
        .by_name(name)
        .with_context(|| format!("the final checkpoint has no {name}"))?;
    let mut out = vec![];
    f.read_to_end(&mut out)?;
    Ok(out)
}

struct V1 {
    fp32_bytes: usize,
    /// The smallest int8 candidate the gate built, shipped or not.
    int8_bytes: Option<u64>,
    shipped_bytes: usize,
    method: String,
    /// What v1 ships, to score it on the days v2 served (the counterfactual).
    artifact: Vec<u8>,
}

/// Trains v1 on the early years through the bridge, quantizes the final
/// checkpoint's model behind the gate (signed with the control plane's
/// key), registers it with its lineage, and rolls it out in waves.
async fn first_version(
    console: &Console,
    trainer: &Trainer,
    key_path: &Path,
    steps: u64,
    feature_names: Vec<String>,
) -> anyhow::Result<V1> {
    let _: ModelView = console
        .post(
            "/api/v1/models",
            json!({"name": MODEL, "description": "rain tomorrow? NOAA Bellevue, NE"}),
        )
        .await?;
    say(&format!(
        "training v1 on days 0..10 000 with the {} trainer ({steps} steps, checkpoints through the bridge)",
        trainer.kind().name()
    ));
    let job: JobView = console
        .post(
            "/api/v1/jobs",
            json!({"spec": trainer.job_spec("rainfall-v1", steps, true)}),
        )
        .await?;
    let job_id = job.job.id;
    let job = wait_job(console, &job_id).await?;
    let checkpoint_digest = job
        .checkpoints
        .last()
        .map(|c| c.digest)
        .context("the v1 job uploaded no checkpoint")?;
    let checkpoint = checkpoint_digest.to_string();
    let zip = console.download(&checkpoint_digest).await?;
    let model_bytes = zip_file(&zip, "model.onnx")?;
    let calib = zip_file(&zip, "calib.npz")?;
    let eval = zip_file(&zip, "eval.npz")?;
    say("quantizing v1 behind the accuracy gate (budget 1 point)");
    let key_path = key_path.to_path_buf();
    let (fp32_bytes, job_for_lineage) = (model_bytes.len(), job_id.clone());
    let packaged = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let model = onnx::decode(&model_bytes)?;
        let inputs = onnx::inspect(&model).inputs;
        // Drift is judged per feature, under the table's names; retrained
        // versions keep them.
        let names = inputs
            .first()
            .map(|i| (i.name.clone(), feature_names))
            .into_iter()
            .collect();
        let calib = Dataset::from_npz(&Npz::from_bytes(&calib)?, "calib.npz", &inputs, false)?;
        let eval = Dataset::from_npz(&Npz::from_bytes(&eval)?, "eval.npz", &inputs, true)?;
        let runtime = OrtRuntime::load(None)?;
        let key = package::load_or_create_key(&key_path)?;
        Ok(package::package(
            &runtime,
            &model,
            &calib,
            &eval,
            &GateOptions::default(),
            Identity {
                name: MODEL.into(),
                feature_names: names,
                version: V1.into(),
                lineage: ManifestLineage {
                    job: Some(job_for_lineage),
                    checkpoint: Some(checkpoint_digest),
                    dataset: None,
                    parent_version: None,
                },
                min_version: None,
                rollback: false,
            },
            None,
            &key,
        )?)
    })
    .await??;
    let evidence = serde_json::to_value(&packaged.outcome)?;
    // The demo's evaluation set is labelled: the metric is top-1 accuracy.
    let accuracy = Some(packaged.outcome.chosen_measurement().metric / 100.0);
    say(&format!("gate: {}", packaged.outcome.reason));
    let shipped_bytes = packaged.artifact.len();
    let int8_bytes = packaged
        .outcome
        .candidates
        .iter()
        .filter(|m| m.name.starts_with("int8"))
        .map(|m| m.size_bytes)
        .min();
    let shipped = packaged.artifact.clone();
    let artifact = console.upload(packaged.artifact).await?;
    let manifest = console
        .upload(packaged.manifest.to_json_pretty()?.into_bytes())
        .await?;
    let _: ModelVersionView = console
        .post(
            &format!("/api/v1/models/{MODEL}/versions"),
            json!({
                "version": V1,
                "artifact_digest": artifact.to_string(),
                "manifest_digest": manifest.to_string(),
                "metrics": {"eval_accuracy": accuracy},
                "lineage": {"job": job_id, "checkpoint": checkpoint,
                            "trigger": "initial training", "quantization": {"evidence": evidence}}
            }),
        )
        .await?;
    say("rolling v1 out in waves (1 device, then all)");
    let mut req = rollout_template();
    req["model"] = json!(MODEL);
    req["version"] = json!(V1);
    let d: DeploymentView = console.post("/api/v1/deployments", req).await?;
    wait_deployment(console, &d.id).await?;
    Ok(V1 {
        fp32_bytes,
        int8_bytes,
        shipped_bytes,
        method: packaged.outcome.chosen,
        artifact: shipped,
    })
}

/// How the loop closes on its own: the retraining policy and the trigger.
/// Why these numbers: docs/demo.md.
async fn close_the_loop(console: &Console, trainer: &Trainer, steps: u64) -> anyhow::Result<()> {
    let _: IgnoredAny = console
        .put(
            &format!("/api/v1/models/{MODEL}/retraining"),
            json!({
                "job": trainer.job_spec("rainfall-retrain", steps, false),
                "edge_window_rows": 600,
                // The trigger fires within days of the shift; the new
                // concept is learnt from rows seen after it fired.
                "min_fresh_edge_rows": 500,
                "eval_fraction": 0.3,
                "min_eval_samples": 50,
                "min_gain_points": 1.0,
                "rollout": rollout_template(),
                // Each new version also gets an fp16 variant for GPU
                // devices, through its own gate (the demo's devices are
                // CPUs: they get the version's own artifact).
                "variants": [{"name": "fp16-gpu", "candidates": ["fp16"],
                              "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider"]}],
                // Latency is judged where v2 will serve: a benchmark of
                // float and each candidate on one of the rollout's devices.
                "latency": {"benchmark_selector": SELECTOR, "runs": 30, "timeout_seconds": 120}
            }),
        )
        .await?;
    let _: IgnoredAny = console
        .put(
            &format!("/api/v1/models/{MODEL}/triggers"),
            json!({
                "cooldown_seconds": 3600,
                "drift": {"window_seconds": 2, "psi_watch": 0.1, "psi_act": 0.2, "js_act": 0.1,
                          "ks_alpha": 0.01, "min_requests": 40, "set_after": 3, "clear_after": 3},
                "accuracy_window": 250,
                "accuracy_min_samples": 125,
                "triggers": [{"id": "drift-that-hurts", "kind": "drift", "min_severity": 0.2,
                              "min_duration_seconds": 8, "min_accuracy_drop_points": 10}]
            }),
        )
        .await?;
    Ok(())
}

/// v1's accuracy on `rows` of the stream, run here: what the devices would
/// have scored had v2 never shipped.
fn counterfactual(model: &[u8], x: Vec<f32>, y: Vec<i64>) -> anyhow::Result<Option<f64>> {
    if y.is_empty() {
        return Ok(None);
    }
    let model = onnx::decode(model)?;
    let inputs = onnx::inspect(&model).inputs;
    let name = inputs.first().context("v1 has no inputs")?.name.clone();
    let mut npz = Npz::new();
    npz.insert(
        name,
        edgeloop_models::Tensor::F32(ndarray::ArrayD::from_shape_vec(
            ndarray::IxDyn(&[y.len(), data::FEATURES]),
            x,
        )?),
    );
    npz.insert(
        edgeloop_models::dataset::LABEL_KEY,
        edgeloop_models::Tensor::I64(ndarray::ArrayD::from_shape_vec(
            ndarray::IxDyn(&[y.len()]),
            y.clone(),
        )?),
    );
    let data = Dataset::from_npz(&npz, "replayed days", &inputs, true)?;
    let runtime = OrtRuntime::load(None)?;
    let pred = edgeloop_models::quantize::gate::predictions(&runtime, &model, &data)?;
    let hits = pred.iter().zip(&y).filter(|(p, l)| p == l).count();
    Ok(Some(hits as f64 / y.len() as f64))
}

fn accuracy(rows: &[&replay::RowResult]) -> Option<f64> {
    (!rows.is_empty()).then(|| rows.iter().filter(|r| r.correct).count() as f64 / rows.len() as f64)
}

fn as_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

async fn demo(args: DemoArgs) -> anyhow::Result<(Summary, bool, Running)> {
    anyhow::ensure!(
        args.rows_per_second.is_finite() && args.rows_per_second > 0.0,
        "--rows-per-second must be positive"
    );
    let data = args
        .data
        .clone()
        .or_else(data::default_path)
        .context("no rainfall table: run scripts/fetch-rainfall.sh or pass --data")?;
    let stream = data::load(&data)?;
    let end = args.to_row.unwrap_or(stream.y.len()).min(stream.y.len());
    let end = if args.control {
        end.min(data::SHIFT_ROW)
    } else {
        end
    };
    anyhow::ensure!(
        args.from_row < end,
        "--from-row {} is not before the last row {end}",
        args.from_row
    );
    for b in [
        "control-plane",
        "trainer-bridge",
        "edge-agent",
        "edgeloop-train",
    ] {
        bin(b)?;
    }
    tokio::task::spawn_blocking(|| OrtRuntime::load(None).map(|_| ()))
        .await?
        .context("ONNX Runtime (scripts/fetch-onnxruntime.sh installs it)")?;

    let work = workdir(&args);
    // Replaced each run, but only if an earlier run made it: a mistyped
    // --workdir must not cost anyone a directory.
    const MARKER: &str = ".edgeloop-demo";
    if work.exists() {
        let empty = std::fs::read_dir(&work)?.next().is_none();
        anyhow::ensure!(
            empty || work.join(MARKER).exists(),
            "refusing to replace {}: it is not empty and not a demo directory (no {MARKER})",
            work.display()
        );
        std::fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    std::fs::write(
        work.join(MARKER),
        b"made by edgeloop demo; replaced by the next run\n",
    )?;
    say(&format!("working in {} (logs in logs/)", work.display()));
    // The control plane signs retrained versions with this key; the agents
    // trust its public half.
    let key_path = work
        .join("control-plane")
        .join("keys")
        .join("manifest-signing.key");
    let key = package::load_or_create_key(&key_path)?;
    let trainer = Trainer::prepare(
        args.trainer,
        bin("edgeloop-train")?,
        &data,
        args.torch_python.as_deref(),
        &stream,
        &work,
    )?;
    let mut procs = Procs::new();
    let (console, agents) = start(&mut procs, &work, &key.public().to_hex()).await?;
    let v1 = first_version(
        &console,
        &trainer,
        &key_path,
        args.train_steps,
        stream.names.clone(),
    )
    .await?;
    close_the_loop(&console, &trainer, args.retrain_steps).await?;

    let rows: Vec<usize> = (args.from_row..end).collect();
    say(&format!(
        "replaying days {}..{end} at {} per second, a label after each{}",
        args.from_row,
        args.rows_per_second,
        if args.control {
            " (control: no shift)"
        } else {
            ""
        }
    ));
    let bar = indicatif::ProgressBar::new(rows.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} days {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let replayer = replay::Replay {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?,
        agents,
        model: MODEL,
        console: &console,
        stream: &stream,
        rows_per_second: args.rows_per_second,
    };
    let replayed = replayer
        .run(&rows, V1, |k| bar.set_position(k as u64))
        .await;
    bar.finish_and_clear();
    let (results, watch) = replayed?;
    // A retrain still running gets to finish (its rollout included).
    let pipelines = wait_for(
        "the retrain to finish",
        Duration::from_secs(300),
        || async {
            let ps: Vec<PipelineView> = console
                .get(&format!("/api/v1/pipelines?model={MODEL}"))
                .await?;
            let running = ps.iter().any(|p| p.status == PipelineStatus::Running);
            Ok((!running).then_some(ps))
        },
    )
    .await?;
    let versions: Vec<ModelVersionView> = console
        .get(&format!("/api/v1/models/{MODEL}/versions"))
        .await?;
    procs.check().context("a process died during the demo")?;
    if !args.keep_running {
        procs.stop();
    }

    let shift = data::SHIFT_ROW;
    let v2_row = watch.new_version_row;
    let pick = |f: &dyn Fn(&replay::RowResult) -> bool| -> Vec<&replay::RowResult> {
        results.iter().filter(|r| f(r)).collect()
    };
    let baseline = accuracy(&pick(&|r| r.row < shift && r.version == V1));
    let drift_v1 = accuracy(&pick(&|r| r.row >= shift && r.version == V1));
    let v2_rows = pick(&|r| v2_row.is_some_and(|v| r.row >= v) && r.version != V1);
    let recovered = accuracy(&v2_rows);
    let v2_days: Vec<usize> = v2_rows.iter().map(|r| r.row).collect();
    // The rows v2 served, copied out of the stream already in memory.
    let x: Vec<f32> = v2_days.iter().flat_map(|&r| stream.x[r]).collect();
    let y: Vec<i64> = v2_days.iter().map(|&r| stream.y[r]).collect();
    let artifact = v1.artifact.clone();
    let v1_on_v2_days =
        tokio::task::spawn_blocking(move || counterfactual(&artifact, x, y)).await??;
    let mut latencies: Vec<f64> = results.iter().map(|r| r.latency_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let ps = pipelines;
    // Each part as JSON writes it (strings quoted, an absent one `null`), as
    // the summary always showed them.
    let failed: Vec<String> = ps
        .iter()
        .filter(|p| matches!(p.status, PipelineStatus::Failed | PipelineStatus::Cancelled))
        .map(|p| {
            format!(
                "{} {} at {}: {}",
                as_json(&p.id),
                as_json(&p.status),
                as_json(&p.step),
                as_json(&p.reason)
            )
        })
        .collect();
    let versions_out: Vec<VersionSummary> = versions.into_iter().map(VersionSummary::new).collect();
    let summary = Summary {
        baseline_accuracy: baseline,
        drift_v1_accuracy: drift_v1,
        recovered_accuracy: recovered,
        v1_accuracy_on_v2_days: v1_on_v2_days,
        shift_row: shift,
        drift_flagged_row: watch.retrain_row,
        feature_drift_row: watch.drift_state_row,
        features_moved_first: watch.first_moved.clone(),
        features_moved_at_retrain: watch.retrain_moved.clone(),
        v2_serving_row: v2_row,
        retrains: ps.len(),
        pipelines: ps
            .iter()
            .map(|p| PipelineSummary {
                id: p.id.clone(),
                status: p.status,
                step: p.step,
                reason: p.reason.clone(),
                trigger: p.trigger.clone(),
            })
            .collect(),
        model_bytes: ModelBytes {
            fp32: v1.fp32_bytes,
            int8: v1.int8_bytes,
            shipped: v1.shipped_bytes,
            shipped_method: v1.method,
        },
        edge_latency_ms: Latency {
            p50: percentile(&latencies, 0.5),
            p99: percentile(&latencies, 0.99),
        },
        rows_replayed: results.len(),
        from_row: args.from_row,
        to_row: end,
        control: args.control,
        versions: versions_out,
        failures: failed.clone(),
        workdir: work.display().to_string(),
        trainer: trainer.kind().name(),
        goals: summary::Goals::of(shift, watch.retrain_row, baseline, recovered, v1_on_v2_days),
    };
    let running = Running {
        procs,
        console_url: format!("{}/ui/", console.base()),
        token_file: work.join("control-plane").join("admin.token"),
    };
    Ok((summary, failed.is_empty(), running))
}
