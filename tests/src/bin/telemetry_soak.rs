//! Telemetry soak benchmark (issue #16): N simulated days of telemetry
//! from M devices on an injected clock, against one in-process control
//! plane (`ControlPlane::start_with_clock`, the server the binary runs).
//!
//! Reports go through the same ingestion functions the gRPC
//! `ReportTelemetry` handler calls (`edgeloop_tests::soak`), called
//! directly: 1 000 devices over mTLS would measure the TLS stack on two
//! cores, not the store. Each device sends `--reports-per-day` reports a
//! day, each with one drift sketch, and now and then a labelled feedback
//! row and a hard example with its input bytes. The compactor's `prune`
//! runs once a simulated day, with `--retention-days` for reports and
//! sketches (the defaults, 30 and 90 days, would not level off within a
//! 30-day run).
//!
//! Printed: the store's size on disk per day; the trigger tick
//! (`lifecycle::triggers::runner::tick`) and the drift API
//! (`GET /api/v1/models/rain/drift`, over HTTP) on day 1 against the last
//! day, as a ratio (goal <= 1.5x); the same reads as the full scans they
//! replaced, for scale; what one tick read from the store per tree
//! (calls, records, bytes, as `Store::read_counts` counts them); and the
//! process's VmRSS at the end.
//!
//! `cargo run --release -p edgeloop-tests --bin telemetry-soak -- --devices 1000 --days 30`
//! (a small run: `--devices 50 --days 3`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use edgeloop_control_plane::lifecycle::triggers::runner;
use edgeloop_control_plane::retention::{self, Retention};
use edgeloop_control_plane::{Clock, ServeSettings};
use edgeloop_drift::analysis;
use edgeloop_store::ReadCounts;
use edgeloop_tests::soak::{self, at, register_rain, Fleet, BASE, DAY};
use edgeloop_tests::weather::manifest;
use edgeloop_tests::ControlPlane;
use serde_json::json;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    devices: u32,
    #[arg(long, default_value_t = 30)]
    days: u32,
    /// Reports (each one sketch) per device and day.
    #[arg(long, default_value_t = 24)]
    reports_per_day: u32,
    /// Labelled feedback rows per device and day.
    #[arg(long, default_value_t = 2)]
    labels_per_day: u32,
    /// Reports and sketches are kept this long.
    #[arg(long, default_value_t = 7)]
    retention_days: i64,
    /// Timed calls per measurement (after one untimed).
    #[arg(long, default_value_t = 5)]
    repeat: u32,
}

fn dir_bytes(dir: &Path) -> u64 {
    edgeloop_tests::files_under(dir)
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

fn vm_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

struct Timings {
    tick: Duration,
    /// What one tick read from the store, per tree.
    tick_reads: ReadCounts,
    api: Duration,
    /// Windows in the drift API's answer.
    windows: usize,
    /// The drift API over the last day (`from`), and its windows.
    api_day: Duration,
    day_windows: usize,
    full_scan: Duration,
}

async fn median<F, Fut>(repeat: u32, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f().await; // untimed: builds what a first read builds
    let mut times = Vec::new();
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        f().await;
        times.push(t.elapsed());
    }
    middle(times)
}

fn middle(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Medians of `a` and `b` timed in turns, so both see the same process
/// and the same moment of this shared machine: the baseline is measured
/// in the same run, not an hour earlier.
async fn interleaved<A, FA, B, FB>(repeat: u32, mut a: A, mut b: B) -> (Duration, Duration)
where
    A: FnMut() -> FA,
    FA: std::future::Future<Output = ()>,
    B: FnMut() -> FB,
    FB: std::future::Future<Output = ()>,
{
    a().await;
    b().await;
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        a().await;
        ta.push(t.elapsed());
        let t = Instant::now();
        b().await;
        tb.push(t.elapsed());
    }
    (middle(ta), middle(tb))
}

/// The day-1 store, copied while its control plane was stopped.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Times the tick and the drift API on the day-1 snapshot and on the last
/// day's store in turns, both control planes in this process.
async fn same_run(
    day1: (&ControlPlane, i64),
    last: (&ControlPlane, i64),
    repeat: u32,
) -> [(&'static str, Duration, Duration); 3] {
    let tick = |cp: &ControlPlane, now: i64| {
        let core = cp.core.clone();
        move || {
            let core = core.clone();
            async move {
                runner::tick(&core, at(now)).await.expect("tick");
            }
        }
    };
    let get = |cp: &ControlPlane, path: String| {
        let api = cp.api();
        move || {
            let (api, path) = (api.clone(), path.clone());
            async move {
                let (status, body) = api.get(&path).await;
                assert_eq!(status, 200, "{body}");
            }
        }
    };
    let (t1, t30) = interleaved(repeat, tick(day1.0, day1.1), tick(last.0, last.1)).await;
    let (d1, d30) = interleaved(
        repeat,
        get(day1.0, day_path(day1.1)),
        get(last.0, day_path(last.1)),
    )
    .await;
    let whole = "/api/v1/models/rain/drift".to_string();
    let (w1, w30) = interleaved(repeat, get(day1.0, whole.clone()), get(last.0, whole)).await;
    [
        ("trigger tick (ms)", t1, t30),
        ("drift API, day (ms)", d1, d30),
        ("drift API, whole (ms)", w1, w30),
    ]
}

/// The drift API over the day before `now`, as a chart asks for it.
fn day_path(now: i64) -> String {
    let from = time::OffsetDateTime::from_unix_timestamp(now - 86_400)
        .expect("a time")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    format!("/api/v1/models/rain/drift?from={from}")
}

async fn measure(cp: &ControlPlane, repeat: u32, now: i64) -> Timings {
    let core = cp.core.clone();
    let tick = median(repeat, || {
        let core = core.clone();
        async move {
            runner::tick(&core, at(now)).await.expect("tick");
        }
    })
    .await;
    // One more tick, counted: a steady tick's reads (the first tick of a
    // process builds the aggregates).
    let before = core.store.read_counts();
    runner::tick(&core, at(now)).await.expect("tick");
    let tick_reads = core.store.read_counts().since(&before);
    let api = cp.api();
    let (_, body) = api.get("/api/v1/models/rain/drift").await;
    let windows = body["series"][0]["windows"]
        .as_array()
        .map_or(0, |w| w.len());
    let api_whole = median(repeat, || {
        let api = api.clone();
        async move {
            let (status, body) = api.get("/api/v1/models/rain/drift").await;
            assert_eq!(status, 200, "{body}");
        }
    })
    .await;
    // The last day, as a chart asks: its windows are the whole answer's
    // last ones, hysteresis included.
    let day_path = day_path(now);
    let (status, day) = api.get(&day_path).await;
    assert_eq!(status, 200, "{day}");
    let day_windows = day["series"][0]["windows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let whole = body["series"][0]["windows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!day_windows.is_empty(), "the last day has windows");
    assert_eq!(
        whole[whole.len().saturating_sub(day_windows.len())..],
        day_windows[..],
        "the range answer is the whole answer's tail"
    );
    let api_day = median(repeat, || {
        let (api, path) = (api.clone(), day_path.clone());
        async move {
            let (status, body) = api.get(&path).await;
            assert_eq!(status, 200, "{body}");
        }
    })
    .await;
    // What a tick read before the aggregates: every sketch and sample of
    // the model, and the analysis over them.
    let store = core.store.clone();
    let reference = manifest(b"rain").reference_stats.expect("reference");
    let full_scan = median(repeat, || {
        let (store, reference) = (store.clone(), reference.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                let samples = store.drift.samples.scan_prefix("rain/").expect("samples");
                let sketches: Vec<_> = store
                    .drift
                    .sketches
                    .scan_prefix("rain/1.0.0/")
                    .expect("sketches")
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect();
                let series =
                    analysis::analyze(&reference, &sketches, &|_| None, &Default::default());
                std::hint::black_box((samples.len(), series.len()));
            })
            .await
            .expect("scan");
        }
    })
    .await;
    Timings {
        tick,
        tick_reads,
        api: api_whole,
        windows,
        api_day,
        day_windows: day_windows.len(),
        full_scan,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let dir = tempfile::tempdir()?;
    let settings = |data_dir: &Path| ServeSettings {
        // The server's own trigger loop would tick beside the timed ticks
        // (every second by default): once a minute it stays out of their
        // way.
        rollout_tick_ms: Some(60_000),
        ..edgeloop_tests::settings(data_dir)
    };
    let mut cp =
        ControlPlane::start_with_clock(settings(&dir.path().join("cp")), Clock::manual(at(BASE)))
            .await;
    let fleet = Fleet {
        devices: args.devices,
        reports_per_day: args.reports_per_day,
        labels_per_day: args.labels_per_day,
    };
    register_rain(
        &cp,
        fleet,
        json!({"triggers": [
            {"id": "drift", "kind": "drift", "min_severity": 1000.0},
            {"id": "labels", "kind": "new_labels", "min": 100000000u64}
        ]}),
    )
    .await?;
    let r = Retention {
        telemetry: time::Duration::days(args.retention_days),
        sketches: time::Duration::days(args.retention_days),
        ..Retention::default()
    };
    println!(
        "telemetry soak: {} devices, {} days, {} reports/device/day, {} labels/device/day, retention {} days",
        args.devices, args.days, args.reports_per_day, args.labels_per_day, args.retention_days
    );
    println!("day  reports  store_MiB  ingest_s  prune_s");
    let started = Instant::now();
    let mut seq = 0u64;
    let mut first: Option<Timings> = None;
    let mut last_now = BASE;
    for day in 0..i64::from(args.days) {
        let t0 = Instant::now();
        let hot = day >= i64::from(args.days) / 2;
        soak::day(&cp, fleet, day, &mut seq, hot).await;
        let ingest = t0.elapsed();
        let now = BASE + (day + 1) * DAY - 1;
        last_now = now;
        cp.core.clock.set(at(now));
        let t1 = Instant::now();
        let (store, artifacts) = (cp.core.store.clone(), cp.core.artifacts.clone());
        tokio::task::spawn_blocking(move || {
            retention::prune(&store, artifacts.as_ref(), r, at(now))
        })
        .await??;
        cp.core.store.flush().await?;
        let prune = t1.elapsed();
        println!(
            "{:>3}  {:>7}  {:>9.1}  {:>8.1}  {:>7.2}",
            day + 1,
            u64::from(args.devices) * u64::from(args.reports_per_day) * (day as u64 + 1),
            dir_bytes(&cp.data_dir) as f64 / (1 << 20) as f64,
            ingest.as_secs_f64(),
            prune.as_secs_f64()
        );
        if day == 0 {
            first = Some(measure(&cp, args.repeat, now).await);
            // A copy of the day-1 store, the baseline the last day is timed
            // against in turns at the end; its control plane is stopped
            // meanwhile, as an operator's backup would be taken.
            let data_dir = cp.data_dir.clone();
            cp.stop().await;
            copy_dir(&data_dir, &dir.path().join("day1"))?;
            cp = ControlPlane::start_with_clock(settings(&data_dir), Clock::manual(at(now))).await;
        }
    }
    let last = measure(&cp, args.repeat, last_now).await;
    let first = first.expect("day 1 measured");
    let day1_now = BASE + DAY - 1;
    let day1 = ControlPlane::start_with_clock(
        settings(&dir.path().join("day1")),
        Clock::manual(at(day1_now)),
    )
    .await;
    let same = same_run((&day1, day1_now), (&cp, last_now), args.repeat).await;
    day1.stop().await;
    println!(
        "\n                      day 1      day {}    ratio",
        args.days
    );
    for (what, a, b) in [
        ("trigger tick (ms)", first.tick, last.tick),
        ("drift API, day (ms)", first.api_day, last.api_day),
        ("drift API, whole (ms)", first.api, last.api),
        ("full scan, before (ms)", first.full_scan, last.full_scan),
    ] {
        println!(
            "{what:<22} {:>8.2}  {:>8.2}  {:>6.2}x",
            ms(a),
            ms(b),
            b.as_secs_f64() / a.as_secs_f64().max(1e-9)
        );
    }
    println!(
        "\nthe same, timed in turns at the end: the day-1 store (a copy taken then) against day {}",
        args.days
    );
    for (what, a, b) in same {
        println!(
            "{what:<22} {:>8.2}  {:>8.2}  {:>6.2}x",
            ms(a),
            ms(b),
            b.as_secs_f64() / a.as_secs_f64().max(1e-9)
        );
    }
    // The tick's work, as the store counts it: the same on day 1 and on
    // the last day when it reads only what its design says (the fold's
    // new windows, one label total, the newest labels, its state).
    println!(
        "\nwhat one trigger tick read (calls / records / bytes), day 1 -> day {}:",
        args.days
    );
    let trees: std::collections::BTreeSet<&String> = first
        .tick_reads
        .0
        .keys()
        .chain(last.tick_reads.0.keys())
        .collect();
    for tree in trees {
        let (a, b) = (
            first.tick_reads.0.get(tree).copied().unwrap_or_default(),
            last.tick_reads.0.get(tree).copied().unwrap_or_default(),
        );
        println!(
            "  {tree:<22} {:>4} / {:>5} / {:>8}  ->  {:>4} / {:>5} / {:>8}",
            a.calls, a.records, a.bytes, b.calls, b.records, b.bytes
        );
    }
    let (a, b) = (first.tick_reads.total(), last.tick_reads.total());
    println!(
        "  {:<22} {:>4} / {:>5} / {:>8}  ->  {:>4} / {:>5} / {:>8}  (records {:.2}x)",
        "total",
        a.calls,
        a.records,
        a.bytes,
        b.calls,
        b.records,
        b.bytes,
        b.records as f64 / (a.records as f64).max(1.0)
    );
    println!(
        "windows in the last day's answer: {} on day 1, {} on day {}",
        first.day_windows, last.day_windows, args.days
    );
    println!(
        "whole drift API per window (ms): {:.3} on day 1 ({} windows), {:.3} on day {} ({} windows)",
        ms(first.api) / first.windows.max(1) as f64,
        first.windows,
        ms(last.api) / last.windows.max(1) as f64,
        args.days,
        last.windows
    );
    println!(
        "goal: tick and drift API (a day's range) ratio <= 1.5x; control-plane RSS at day {} (in process): {:.0} MiB; total {:.0} s",
        args.days,
        vm_rss_mib(),
        started.elapsed().as_secs_f64()
    );
    cp.stop().await;
    Ok(())
}
