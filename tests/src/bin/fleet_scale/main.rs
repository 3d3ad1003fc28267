//! Fleet scale benchmark: one control plane (the real binary, as a child
//! process, so its RSS is its own) and N simulated agents in this process.
//! The agents are lightweight but speak the real protocol: each one enrolls
//! with its own key and CSR, holds its own mTLS connection, heartbeats,
//! watches its assignments, downloads the assigned artifact in chunks and
//! reports it active (with the serving version), as the real agent does.
//!
//! Measured: heartbeat round trip p50/p99 under the whole fleet's load, the
//! delay from creating a deployment to each agent receiving its
//! assignment (p50/p99), the time until the deployment has reached every
//! agent (`succeeded`), artifact bytes sent per device and read from the
//! store per device (`/metrics`), and the control plane's peak RSS. Printed as ratios against the goals (p99 < 50 ms,
//! RSS < 1 GiB) and against the same numbers measured with one agent in
//! the same run (the baseline).
//!
//! Options separate the two sides and try the scale-out store:
//! `--cp-cpus 0` pins the control plane (through `taskset`) to the CPUs
//! given, so the agents' work can be pinned elsewhere (start the
//! benchmark itself under `taskset -c 1`); `--postgres`/`--artifact-url`
//! run it on PostgreSQL and S3, and `--replicas 2` starts a second
//! control plane on the same store, with the agents split between them.
//! Beside each client-side heartbeat figure it prints the control plane's
//! own time to answer (`edgeloop_heartbeat_handling_seconds` in
//! `/metrics`, as a bucket bound), so a slow figure says which side is
//! slow.
//!
//! `cargo run --release -p edgeloop-tests --bin fleet-scale -- [agents]`
//! (default 10 000; needs `ulimit -n` above twice that).

mod control_plane;
mod probes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use control_plane::{
    handling_quantile, histogram_buckets, proc_status, start_control_plane, Stores,
    HEARTBEAT_HANDLING, STORE_SERIES,
};
use edgeloop_client_core::tls::mtls_endpoint;
use edgeloop_client_core::{enroll, BootstrapToken, IdentityStore, Role};
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::common::v1 as common;
use probes::{probe_timeline, probe_window, start_probes, PROBES};
use serde_json::json;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

const MODEL: &str = "bench";
const ARTIFACT_BYTES: usize = 1 << 20;
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

#[derive(clap::Parser, Debug, Clone)]
struct Args {
    /// Simulated agents in the measured run.
    #[arg(default_value_t = 10_000)]
    agents: usize,
    /// CPUs for each control plane (`taskset -c`), e.g. `0`.
    #[arg(long)]
    cp_cpus: Option<String>,
    /// A PostgreSQL server (an admin URL, e.g. `$EDGELOOP_TEST_POSTGRES_URL`):
    /// each run gets a new database on it, as the control planes'
    /// `--store-url`. Sled in each data dir when absent.
    #[arg(long)]
    postgres: Option<String>,
    /// An S3 location (`s3://bucket/prefix`, with the AWS_* environment):
    /// each run gets its own prefix under it, as the control planes'
    /// `--artifact-url`. Each data dir when absent.
    #[arg(long)]
    artifact_url: Option<String>,
    /// More flags for each control plane, e.g.
    /// `--cp-arg=--max-concurrent-downloads=8`.
    #[arg(long = "cp-arg", allow_hyphen_values = true)]
    cp_args: Vec<String>,
    /// Control-plane replicas (more than one needs `--postgres` and
    /// `--artifact-url`).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Environment for each control plane only, e.g.
    /// `--cp-env MALLOC_ARENA_MAX=2`.
    #[arg(long = "cp-env", value_parser = parse_env_pair)]
    cp_env: Vec<(String, String)>,
}

fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[derive(Default)]
struct Samples {
    heartbeats: Vec<Duration>,
    delivered: Vec<Duration>,
    bytes: u64,
    fetched: usize,
    reported: usize,
}

/// One simulated agent from enrollment to an active assignment; it keeps
/// heartbeating until `done`.
async fn agent(
    cp_url: String,
    token: String,
    dir: PathBuf,
    deployed_at: Arc<Mutex<Option<Instant>>>,
    samples: Arc<Mutex<Samples>>,
    done: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let token: BootstrapToken = token.parse()?;
    let caps = common::Capabilities {
        agent_version: "bench".into(),
        execution_providers: vec!["CPUExecutionProvider".into()],
        free_disk_bytes: 1 << 30,
        ..Default::default()
    };
    let identity = enroll(
        Role::Device,
        &cp_url,
        &token,
        &IdentityStore::new(&dir),
        caps.clone(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("enroll: {e:?}"))?;
    let channel = mtls_endpoint(&cp_url, &identity)?.connect().await?;
    let mut client = AgentServiceClient::new(channel);
    let mut hb = client.clone();
    let hb_samples = samples.clone();
    let hb_done = done.clone();
    let heartbeats = tokio::spawn(async move {
        // Spread the fleet's heartbeats over the interval.
        tokio::time::sleep(HEARTBEAT_EVERY.mul_f64(rand::random::<f64>())).await;
        while !hb_done.is_cancelled() {
            let start = Instant::now();
            if hb
                .heartbeat(common::HeartbeatRequest {
                    sent_at: None,
                    capabilities: Some(caps.clone()),
                })
                .await
                .is_ok()
            {
                hb_samples.lock().await.heartbeats.push(start.elapsed());
            }
            tokio::select! {
                _ = hb_done.cancelled() => {}
                _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
            }
        }
    });
    let mut watch = client
        .watch_assignments(pb::WatchAssignmentsRequest {
            known_generation: 0,
        })
        .await?
        .into_inner();
    while let Some(set) = watch.message().await? {
        let Some(a) = set.assignments.iter().find(|a| a.model_name == MODEL) else {
            continue;
        };
        if let Some(t) = *deployed_at.lock().await {
            samples.lock().await.delivered.push(t.elapsed());
        }
        let mut stream = client
            .fetch_artifact(pb::FetchArtifactRequest {
                digest: a.artifact_digest.clone(),
                offset: 0,
                max_chunk_bytes: 256 << 10,
            })
            .await?
            .into_inner();
        let mut got = 0u64;
        while let Some(chunk) = stream.message().await? {
            got += chunk.data.len() as u64;
        }
        {
            let mut s = samples.lock().await;
            s.bytes += got;
            s.fetched += 1;
        }
        client
            .report_assignment_status(pb::AssignmentStatusReport {
                generation: set.generation,
                model_name: a.model_name.clone(),
                model_version: a.model_version.clone(),
                state: pb::AssignmentState::Active as i32,
                execution_provider: "CPUExecutionProvider".into(),
                serving_version: a.model_version.clone(),
                ..Default::default()
            })
            .await?;
        samples.lock().await.reported += 1;
        break;
    }
    done.cancelled().await;
    heartbeats.await?;
    Ok(())
}

struct Run {
    agents: usize,
    steady_p50: Duration,
    steady_p99: Duration,
    heartbeat_p50: Duration,
    heartbeat_p99: Duration,
    delivered_p50: Duration,
    delivered_p99: Duration,
    reach_all: Duration,
    bytes_per_device: f64,
    store_bytes_per_device: f64,
    rest_rss_mib: f64,
    /// The peak over the whole run, enrollment of the fleet included.
    enroll_peak_mib: f64,
    /// The peak from the deployment's creation on (`VmHWM` reset then).
    rss_mib: f64,
    /// OS threads of the (larger) control plane at rest, and the most
    /// sampled during the rollout.
    rest_threads: u64,
    peak_threads: u64,
    /// The control plane's own time to answer a heartbeat during the
    /// rollout (bucket bounds).
    handled_p50: Duration,
    handled_p99: Duration,
    /// PostgreSQL store calls during the rollout, from the pool's
    /// histograms: what, p50 and p99 (bucket bounds). Empty on sled.
    store_calls: Vec<(&'static str, Duration, Duration)>,
    /// The probe devices' round trips, at rest and during the rollout.
    probe_steady_p99: Duration,
    probe_p50: Duration,
    probe_p99: Duration,
    /// Probe heartbeats that failed, at rest and during the rollout.
    probe_failed_steady: usize,
    probe_failed: usize,
}

async fn run(agents: usize, dir: &Path, args: &Args) -> anyhow::Result<Run> {
    // A database of its own, dropped with the run.
    let db = match &args.postgres {
        Some(admin) => Some(tokio::task::block_in_place(|| {
            edgeloop_store::TestDatabase::create(&edgeloop_store::PostgresUrl::parse(admin)?)
                .context("a database for the run")
        })?),
        None => None,
    };
    let stores = Stores {
        store_url: db.as_ref().map(|d| d.url().expose().to_string()),
        artifact_url: args.artifact_url.as_ref().map(|u| {
            format!(
                "{}/fleet-scale-{agents}-{}",
                u.trim_end_matches('/'),
                std::process::id()
            )
        }),
    };
    let mut cps = vec![start_control_plane(&dir.join("cp-0"), args, &stores).await?];
    for r in 1..args.replicas {
        let to = dir.join(format!("cp-{r}"));
        edgeloop_tests::share_secrets(&dir.join("cp-0"), &to);
        cps.push(start_control_plane(&to, args, &stores).await?);
    }
    let api = &cps[0].api.clone();
    let (s, b) = api.post("/api/v1/models", json!({"name": MODEL})).await;
    anyhow::ensure!(s == 201, "{b}");
    let artifact: Vec<u8> = (0..ARTIFACT_BYTES).map(|i| (i * 31 % 251) as u8).collect();
    let digest = edgeloop_models::Digest::of(&artifact);
    let (s, b) = api
        .raw(
            reqwest::Method::PUT,
            &format!("/api/v1/artifacts/{digest}"),
            artifact,
        )
        .await;
    anyhow::ensure!(s == 201 || s == 200, "{b}");
    let (s, b) = api
        .post(
            &format!("/api/v1/models/{MODEL}/versions"),
            json!({"version": "1.0.0", "artifact_digest": digest.to_string()}),
        )
        .await;
    anyhow::ensure!(s == 201, "{b}");

    let deployed_at = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let done = tokio_util::sync::CancellationToken::new();
    let mut set = JoinSet::new();
    let started = Instant::now();
    for i in 0..agents {
        let name = format!("sim-{i:05}");
        let (s, b) = api
            .post(
                "/api/v1/tokens",
                json!({"kind": "device", "name": name, "labels": {"fleet": "bench"}}),
            )
            .await;
        anyhow::ensure!(s == 201, "{b}");
        set.spawn(agent(
            // Split between the replicas.
            cps[i % cps.len()].grpc_url.clone(),
            b["token"].as_str().context("token")?.to_string(),
            dir.join(&name),
            deployed_at.clone(),
            samples.clone(),
            done.clone(),
        ));
        // Enrollments in bounded bursts, as a fleet coming up would.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let epoch = Instant::now();
    let probes_done = tokio_util::sync::CancellationToken::new();
    let mut probe_tokens = Vec::new();
    for i in 0..PROBES {
        let (s, b) = api
            .post(
                "/api/v1/tokens",
                json!({"kind": "device", "name": format!("probe-{i:02}"), "labels": {"fleet": "probe"}}),
            )
            .await;
        anyhow::ensure!(s == 201, "{b}");
        probe_tokens.push(b["token"].as_str().context("token")?.to_string());
    }
    let probes = start_probes(
        PROBES,
        cps.iter().map(|cp| cp.grpc_url.clone()).collect(),
        probe_tokens,
        dir.to_path_buf(),
        epoch,
        probes_done.clone(),
    );
    loop {
        let (_, body) = api.get("/api/v1/devices?selector=fleet%3Dbench").await;
        let online = body
            .as_array()
            .map_or(0, |a| a.iter().filter(|d| d["status"] == "online").count());
        if online == agents {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "only {online} of {agents} online after 30 min"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("{agents} agents online after {:?}", started.elapsed());
    // Heartbeats of the whole fleet at rest, then during the rollout.
    samples.lock().await.heartbeats.clear();
    let steady_from = epoch.elapsed();
    tokio::time::sleep(HEARTBEAT_EVERY * 2).await;
    let steady_until = epoch.elapsed();
    let mut steady = std::mem::take(&mut samples.lock().await.heartbeats);
    let rest_rss_mib = cps
        .iter()
        .map(|cp| proc_status(cp.child.id(), "VmRSS:") as f64 / 1024.0)
        .fold(0.0, f64::max);
    let pids: Vec<u32> = cps.iter().map(|cp| cp.child.id()).collect();
    let rest_threads = pids
        .iter()
        .map(|p| proc_status(*p, "Threads:"))
        .max()
        .unwrap_or(0);
    let thread_sampler = tokio::spawn({
        let done = probes_done.clone();
        async move {
            let mut peak = 0;
            while !done.is_cancelled() {
                peak = pids
                    .iter()
                    .map(|p| proc_status(*p, "Threads:"))
                    .fold(peak, u64::max);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            peak
        }
    });
    let enroll_peak_mib = cps
        .iter()
        .map(|cp| proc_status(cp.child.id(), "VmHWM:") as f64 / 1024.0)
        .fold(0.0, f64::max);
    // From here `VmHWM` is the rollout's own peak (Linux: writing 5 to
    // clear_refs resets it to the current RSS).
    for cp in &cps {
        std::fs::write(format!("/proc/{}/clear_refs", cp.child.id()), "5")
            .context("resetting the control plane's peak RSS")?;
    }
    steady.sort();
    let handled_before = histogram_buckets(&cps, HEARTBEAT_HANDLING)
        .await?
        .context("no heartbeat histogram in /metrics")?;
    let mut store_before = Vec::new();
    for (_, series) in STORE_SERIES {
        store_before.push(histogram_buckets(&cps, series).await?);
    }
    *deployed_at.lock().await = Some(Instant::now());
    let t0 = Instant::now();
    let rollout_from = epoch.elapsed();
    let (s, b) = api
        .post(
            "/api/v1/deployments",
            json!({"model": MODEL, "version": "1.0.0", "selector": "fleet=bench",
                   "strategy": {"waves": {"percent": [100]}, "min_soak_seconds": 0,
                                "wave_timeout_seconds": 1800},
                   "offline_tolerance": 0.0}),
        )
        .await;
    anyhow::ensure!(s == 201, "{b}");
    let id = b["id"].as_str().context("id")?.to_string();
    let reach_all = loop {
        let (_, body) = api.get(&format!("/api/v1/deployments/{id}")).await;
        match body["state"].as_str() {
            Some("succeeded") => break t0.elapsed(),
            Some("failed" | "rolled_back" | "cancelled") => {
                anyhow::bail!("deployment ended {}", body["deployment"]["state"])
            }
            _ => {
                if t0.elapsed().as_millis() % 5000 < 250 {
                    let s = samples.lock().await;
                    eprintln!(
                        "{:?}: {} assignments delivered, {} downloaded, {} reported active",
                        t0.elapsed(),
                        s.delivered.len(),
                        s.fetched,
                        s.reported
                    );
                }
                tokio::time::sleep(Duration::from_millis(250)).await
            }
        }
    };
    // More heartbeats during and after the rollout.
    tokio::time::sleep(HEARTBEAT_EVERY).await;
    let rollout_until = epoch.elapsed();
    probes_done.cancel();
    let peak_threads = thread_sampler.await?;
    let probe_samples = tokio::task::spawn_blocking(move || probes.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the probe thread panicked"))??;
    let probe_steady = probe_window(&probe_samples.ok, steady_from, steady_until);
    let probe_rollout = probe_window(&probe_samples.ok, rollout_from, rollout_until);
    if agents > 1 {
        let line: Vec<String> = probe_timeline(&probe_samples.ok, rollout_from, rollout_until)
            .iter()
            .map(|(s, max, n)| format!("{s}s:{:.0}ms/{n}", ms(*max)))
            .collect();
        eprintln!(
            "probes' slowest round trip per second from the deployment (second:ms/samples): {}",
            line.join(" ")
        );
    }
    let handled_after = histogram_buckets(&cps, HEARTBEAT_HANDLING)
        .await?
        .context("no heartbeat histogram in /metrics")?;
    let mut store_calls = Vec::new();
    for ((what, series), before) in STORE_SERIES.into_iter().zip(store_before) {
        if let (Some(before), Some(after)) = (before, histogram_buckets(&cps, series).await?) {
            store_calls.push((
                what,
                handling_quantile(&before, &after, 0.5),
                handling_quantile(&before, &after, 0.99),
            ));
        }
    }
    let rss_mib = cps
        .iter()
        .map(|cp| proc_status(cp.child.id(), "VmHWM:") as f64 / 1024.0)
        .fold(0.0, f64::max);
    let mut store_read = 0;
    for cp in &cps {
        store_read += cp
            .api
            .metric("edgeloop_artifact_store_read_bytes_total")
            .await
            .context("edgeloop_artifact_store_read_bytes_total in /metrics")?;
    }
    done.cancel();
    while let Some(r) = set.join_next().await {
        r??;
    }
    drop(cps);
    let mut s = std::mem::take(&mut *samples.lock().await);
    s.heartbeats.sort();
    s.delivered.sort();
    Ok(Run {
        agents,
        steady_p50: percentile(&steady, 0.5),
        steady_p99: percentile(&steady, 0.99),
        heartbeat_p50: percentile(&s.heartbeats, 0.5),
        heartbeat_p99: percentile(&s.heartbeats, 0.99),
        delivered_p50: percentile(&s.delivered, 0.5),
        delivered_p99: percentile(&s.delivered, 0.99),
        reach_all,
        bytes_per_device: s.bytes as f64 / agents as f64,
        store_bytes_per_device: store_read as f64 / agents as f64,
        rest_rss_mib,
        enroll_peak_mib,
        rss_mib,
        rest_threads,
        peak_threads,
        handled_p50: handling_quantile(&handled_before, &handled_after, 0.5),
        handled_p99: handling_quantile(&handled_before, &handled_after, 0.99),
        store_calls,
        probe_steady_p99: percentile(&probe_steady, 0.99),
        probe_p50: percentile(&probe_rollout, 0.5),
        probe_p99: percentile(&probe_rollout, 0.99),
        probe_failed_steady: probe_samples.failed_within(steady_from, steady_until),
        probe_failed: probe_samples.failed_within(rollout_from, rollout_until),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    edgeloop_client_core::install_crypto_provider();
    let args = <Args as clap::Parser>::parse();
    anyhow::ensure!(
        args.replicas >= 1
            && (args.replicas == 1 || (args.postgres.is_some() && args.artifact_url.is_some())),
        "--replicas above 1 needs --postgres and --artifact-url (a shared store and artifacts)"
    );
    println!(
        "fleet scale: store {}, artifacts {}, {} replica(s), control plane on CPUs {}, flags {:?}",
        if args.postgres.is_some() {
            "PostgreSQL"
        } else {
            "sled"
        },
        if args.artifact_url.is_some() {
            "S3"
        } else {
            "local"
        },
        args.replicas,
        args.cp_cpus.as_deref().unwrap_or("any"),
        args.cp_args,
    );
    let dir = tempfile::tempdir()?;
    let base = run(1, &dir.path().join("baseline"), &args).await?;
    let fleet = run(args.agents, &dir.path().join("fleet"), &args).await?;
    println!(
        "| measure | 1 agent (baseline) | {} agents | ratio | goal |",
        fleet.agents
    );
    println!("|---|---|---|---|---|");
    let row = |name: &str, b: f64, f: f64, goal: &str| {
        println!(
            "| {name} | {b:.2} | {f:.2} | {:.2}× | {goal} |",
            f / b.max(1e-9)
        );
    };
    row(
        "heartbeat p50, at rest (ms)",
        ms(base.steady_p50),
        ms(fleet.steady_p50),
        "",
    );
    row(
        "heartbeat p99, at rest (ms)",
        ms(base.steady_p99),
        ms(fleet.steady_p99),
        &format!("< 50 ms ({:.2}× of goal)", ms(fleet.steady_p99) / 50.0),
    );
    row(
        "heartbeat p50, during the rollout (ms)",
        ms(base.heartbeat_p50),
        ms(fleet.heartbeat_p50),
        "",
    );
    row(
        "heartbeat p99, during the rollout (ms)",
        ms(base.heartbeat_p99),
        ms(fleet.heartbeat_p99),
        &format!("< 50 ms ({:.2}× of goal)", ms(fleet.heartbeat_p99) / 50.0),
    );
    row(
        "probe heartbeat p99, at rest (ms)",
        ms(base.probe_steady_p99),
        ms(fleet.probe_steady_p99),
        &format!(
            "< 50 ms ({:.2}× of goal)",
            ms(fleet.probe_steady_p99) / 50.0
        ),
    );
    row(
        "probe heartbeat p50, during the rollout (ms)",
        ms(base.probe_p50),
        ms(fleet.probe_p50),
        "",
    );
    row(
        "probe heartbeat p99, during the rollout (ms)",
        ms(base.probe_p99),
        ms(fleet.probe_p99),
        &format!("< 50 ms ({:.2}× of goal)", ms(fleet.probe_p99) / 50.0),
    );
    row(
        "probe heartbeats failed, at rest",
        base.probe_failed_steady as f64,
        fleet.probe_failed_steady as f64,
        "none",
    );
    row(
        "probe heartbeats failed, during the rollout (the percentiles are of the answered ones)",
        base.probe_failed as f64,
        fleet.probe_failed as f64,
        "none",
    );
    row(
        "heartbeat handled p50, during the rollout (ms, the control plane's own time, bucket bound)",
        ms(base.handled_p50),
        ms(fleet.handled_p50),
        "",
    );
    row(
        "heartbeat handled p99, during the rollout (ms, the control plane's own time, bucket bound)",
        ms(base.handled_p99),
        ms(fleet.handled_p99),
        "",
    );
    for ((what, base_p50, base_p99), (_, p50, p99)) in
        base.store_calls.iter().zip(&fleet.store_calls)
    {
        row(
            &format!("{what} p50, during the rollout (ms, bucket bound)"),
            ms(*base_p50),
            ms(*p50),
            "",
        );
        row(
            &format!("{what} p99, during the rollout (ms, bucket bound)"),
            ms(*base_p99),
            ms(*p99),
            "",
        );
    }
    row(
        "assignment delivered p50 (ms)",
        ms(base.delivered_p50),
        ms(fleet.delivered_p50),
        "",
    );
    row(
        "assignment delivered p99 (ms)",
        ms(base.delivered_p99),
        ms(fleet.delivered_p99),
        "",
    );
    row(
        "deployment reached all (s)",
        base.reach_all.as_secs_f64(),
        fleet.reach_all.as_secs_f64(),
        "",
    );
    row(
        "artifact bytes sent per device",
        base.bytes_per_device,
        fleet.bytes_per_device,
        "",
    );
    row(
        "artifact store bytes read per device",
        base.store_bytes_per_device,
        fleet.store_bytes_per_device,
        "read once, then cached",
    );
    row(
        "control-plane RSS, fleet at rest (MiB)",
        base.rest_rss_mib,
        fleet.rest_rss_mib,
        &format!("< 1024 MiB ({:.2}× of goal)", fleet.rest_rss_mib / 1024.0),
    );
    row(
        "control-plane peak RSS, enrolling the fleet (MiB)",
        base.enroll_peak_mib,
        fleet.enroll_peak_mib,
        "",
    );
    row(
        "control-plane peak RSS during the rollout (MiB)",
        base.rss_mib,
        fleet.rss_mib,
        &format!("< 1024 MiB ({:.2}× of goal)", fleet.rss_mib / 1024.0),
    );
    row(
        "control-plane threads, fleet at rest",
        base.rest_threads as f64,
        fleet.rest_threads as f64,
        "",
    );
    row(
        "control-plane threads, most during the rollout",
        base.peak_threads as f64,
        fleet.peak_threads as f64,
        "",
    );
    Ok(())
}
