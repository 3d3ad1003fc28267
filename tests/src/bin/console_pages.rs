//! How long the web console's pages take to load (issue #18), served by an
//! in-process control plane, logged in as the admin: a demo-sized fleet
//! (3 devices, the baseline) and a big one (`--devices`, 10 000 by
//! default) are timed in the same run, each page `--repeat` times, and
//! printed as median and p95 with the ratio to the baseline and against
//! the goal (200 ms).
//!
//! Every device has a model assigned and a status report on it, so the
//! fleet page's "Serving" column reads what it reads in a real fleet. The
//! filtered fleet page asks for a label one device in a hundred has: the
//! server scans for a page of matches, the worst case of server-side
//! filtering. `--url` and `--token` time a console that already runs
//! (the demo's, with `edgeloop demo --keep-running`) instead.
//!
//! `cargo run --release -p edgeloop-tests --bin console-pages -- --devices 10000`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use edgeloop_control_plane::fleet::assignments::{AssignmentRecord, AssignmentSetRecord};
use edgeloop_control_plane::fleet::telemetry::{AssignmentState, AssignmentStatusRecord};
use edgeloop_models::Digest;
use edgeloop_tests::{ControlPlane, TestStore};
use time::OffsetDateTime;

/// The goal: each page under this, at the big fleet.
const GOAL: Duration = Duration::from_millis(200);

#[derive(Parser, Debug)]
struct Args {
    /// Devices in the big fleet.
    #[arg(long, default_value_t = 10_000)]
    devices: usize,
    /// Loads of each page.
    #[arg(long, default_value_t = 20)]
    repeat: usize,
    /// On a fresh PostgreSQL database (`$EDGELOOP_TEST_POSTGRES_URL`)
    /// instead of sled.
    #[arg(long)]
    postgres: bool,
    /// Time a console that runs already, at this base URL.
    #[arg(long, requires = "token")]
    url: Option<String>,
    /// An API token of that console.
    #[arg(long)]
    token: Option<String>,
}

/// The pages timed: what, and the path.
fn pages(model: &str) -> Vec<(&'static str, String)> {
    vec![
        ("fleet, first page", "/ui/fleet".into()),
        (
            "fleet filtered by a label 1 % have",
            "/ui/fleet?selector=site%3Dsite-7".into(),
        ),
        ("bridges", "/ui/bridges".into()),
        ("models", "/ui/models".into()),
        (
            "a model: versions, lineage, cost",
            format!("/ui/models/{model}"),
        ),
        ("drift", format!("/ui/models/{model}/drift")),
        (
            "drift of 1.0.0",
            format!("/ui/models/{model}/drift?version=1.0.0"),
        ),
        ("labelling queue", format!("/ui/models/{model}/labelling")),
        ("deployments", "/ui/deployments".into()),
        ("pipelines and jobs", "/ui/pipelines".into()),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    edgeloop_client_core::install_crypto_provider();
    if let (Some(url), Some(token)) = (&args.url, &args.token) {
        let times = time_pages(url, token, "rainfall", args.repeat).await?;
        println!("| page | median (ms) | p95 (ms) | goal | status, KiB |");
        println!("|---|---:|---:|---|---:|");
        for (what, t) in times {
            println!(
                "| {what} | {:.1} | {:.1} | {} | {} {:.1} |",
                ms(t.median),
                ms(t.p95),
                verdict(t.median),
                t.status,
                t.bytes as f64 / 1024.0
            );
        }
        return Ok(());
    }
    let base = seeded_run(3, &args).await?;
    let big = seeded_run(args.devices, &args).await?;
    println!(
        "console pages, {} store, {} loads each: 3 devices (baseline) against {}",
        if args.postgres { "PostgreSQL" } else { "sled" },
        args.repeat,
        args.devices
    );
    println!("| page | 3: median / p95 (ms) | {}: median / p95 (ms) | ratio (medians) | goal < 200 ms | {}: status, KiB |", args.devices, args.devices);
    println!("|---|---:|---:|---:|---|---:|");
    for ((what, b), (_, f)) in base.iter().zip(&big) {
        println!(
            "| {what} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2}× | {} | {} {:.1} |",
            ms(b.median),
            ms(b.p95),
            ms(f.median),
            ms(f.p95),
            f.median.as_secs_f64() / b.median.as_secs_f64().max(1e-9),
            verdict(f.median),
            f.status,
            f.bytes as f64 / 1024.0
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn verdict(d: Duration) -> String {
    format!(
        "{} ({:.2}×)",
        if d < GOAL { "✔" } else { "✘" },
        d.as_secs_f64() / GOAL.as_secs_f64()
    )
}

struct Timing {
    median: Duration,
    p95: Duration,
    /// The answer's status and size, to show what was timed.
    status: u16,
    bytes: usize,
}

/// A control plane with `devices` seeded devices, its pages timed.
async fn seeded_run(devices: usize, args: &Args) -> anyhow::Result<Vec<(&'static str, Timing)>> {
    let dir = tempfile::tempdir()?;
    let store = if args.postgres {
        TestStore::postgres("console_pages")
            .ok_or_else(|| anyhow::anyhow!("--postgres needs EDGELOOP_TEST_POSTGRES_URL"))?
    } else {
        TestStore::sled()
    };
    let cp = ControlPlane::start_with(store.settings(&dir.path().join("cp"))).await;
    let api = cp.api();
    let (s, b) = api
        .post("/api/v1/models", serde_json::json!({"name": "bench"}))
        .await;
    anyhow::ensure!(s == 201, "{b}");
    let digest = cp.upload(&[7u8; 1024]).await;
    let (s, b) = api
        .post(
            "/api/v1/models/bench/versions",
            serde_json::json!({"version": "1.0.0", "artifact_digest": digest.to_string()}),
        )
        .await;
    anyhow::ensure!(s == 201, "{b}");
    let store = cp.core.store.clone();
    tokio::task::spawn_blocking(move || seed(&store, devices, digest)).await??;
    let times = time_pages(&cp.http_base, &cp.admin_token, "bench", args.repeat).await?;
    cp.stop().await;
    Ok(times)
}

/// `n` devices (`site=site-<i % 100>`), each assigned `bench` 1.0.0 and
/// reporting it active; written a thousand at a time.
fn seed(store: &edgeloop_control_plane::db::Db, n: usize, digest: Digest) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    let ids: Vec<String> = (0..n).map(|i| format!("d-{i:06}")).collect();
    for chunk in ids.chunks(1000) {
        let members: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let labels = BTreeMap::from([("site".to_string(), format!("site-{}", i % 100))]);
                edgeloop_tests::seed::device(id, labels, now)
            })
            .collect();
        let sets: Vec<AssignmentSetRecord> = chunk
            .iter()
            .map(|_| AssignmentSetRecord {
                generation: 1,
                assignments: vec![AssignmentRecord {
                    model_name: "bench".into(),
                    model_version: "1.0.0".into(),
                    artifact_digest: digest,
                    artifact_size: 1024,
                    manifest_digest: None,
                    deployment_id: "seeded".into(),
                    activation_timeout_seconds: 60,
                    probe_inputs_digest: None,
                    deployment_seq: 1,
                    variant: None,
                }],
            })
            .collect();
        let statuses: Vec<AssignmentStatusRecord> = chunk
            .iter()
            .map(|id| AssignmentStatusRecord {
                device: id.clone(),
                generation: 1,
                model_name: "bench".into(),
                model_version: "1.0.0".into(),
                state: AssignmentState::Active,
                reason: String::new(),
                execution_provider: "CPUExecutionProvider".into(),
                at: now,
                running_version: Some("1.0.0".into()),
            })
            .collect();
        let status_keys: Vec<String> = chunk.iter().map(|id| format!("{id}/bench")).collect();
        store.fleet.devices.insert_many(&keyed(chunk, &members))?;
        store.fleet.assignments.insert_many(&keyed(chunk, &sets))?;
        store
            .fleet
            .assignment_status
            .insert_many(&keyed(&status_keys, &statuses))?;
    }
    Ok(())
}

/// `keys[i]` beside `values[i]`, as `insert_many` takes them.
fn keyed<'a, T>(keys: &'a [String], values: &'a [T]) -> Vec<(&'a str, &'a T)> {
    keys.iter().map(String::as_str).zip(values).collect()
}

/// Logs in at `base` with `token` and loads each page `repeat` times (after
/// one load to warm up), checking each answer is the page.
async fn time_pages(
    base: &str,
    token: &str,
    model: &str,
    repeat: usize,
) -> anyhow::Result<Vec<(&'static str, Timing)>> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let res = http
        .post(format!("{base}/ui/login"))
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(
            form_urlencoded::Serializer::new(String::new())
                .append_pair("token", token)
                .finish(),
        )
        .send()
        .await?;
    let cookie = res
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .ok_or_else(|| anyhow::anyhow!("login gave no session cookie ({})", res.status()))?
        .to_string();
    let mut out = Vec::new();
    for (what, path) in pages(model) {
        let mut took = Vec::with_capacity(repeat);
        let (mut last_status, mut bytes) = (0, 0);
        for i in 0..=repeat {
            let t0 = Instant::now();
            let res = http
                .get(format!("{base}{path}"))
                .header(reqwest::header::COOKIE, &cookie)
                .send()
                .await?;
            let status = res.status();
            let body = res.text().await?;
            let elapsed = t0.elapsed();
            // A page that shows the API's refusal (a model without drift
            // statistics) is still a page; a redirect to log in is not.
            anyhow::ensure!(
                !status.is_server_error() && body.contains("</html>"),
                "{path}: {status}"
            );
            if i > 0 {
                took.push(elapsed);
            }
            (last_status, bytes) = (status.as_u16(), body.len());
        }
        took.sort();
        let at = |p: f64| took[((took.len() as f64 * p).ceil() as usize).clamp(1, took.len()) - 1];
        out.push((
            what,
            Timing {
                median: at(0.5),
                p95: at(0.95),
                status: last_status,
                bytes,
            },
        ));
    }
    Ok(out)
}
