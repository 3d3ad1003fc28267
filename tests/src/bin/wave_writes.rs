//! Assignment writes of one rollout wave (issue #17): every device's set
//! written the way the rollout runner wrote it before it batched them,
//! device by device (the member read, the assignment history's check and
//! write, the set's read and fenced compare-and-swap), against
//! `assignments::set_models` (a few store calls for the whole wave). Both
//! run on the same store in the same run, in turns, each turn writing a
//! new version so every write is a real change; printed as medians, store
//! calls per wave, and the ratio.
//!
//! On PostgreSQL (`--postgres`: a fresh database on
//! `$EDGELOOP_TEST_POSTGRES_URL`, as the tests use) each store call is a
//! round trip; on sled (the default) an in-process call.
//!
//! `cargo run --release -p edgeloop-tests --bin wave-writes -- --devices 1000 --postgres`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use edgeloop_control_plane::db::Db;
use edgeloop_control_plane::fleet::admission;
use edgeloop_control_plane::fleet::assignments::{self, AssignmentRecord, AssignmentSetRecord};
use edgeloop_control_plane::fleet::members::Member;
use edgeloop_models::Digest;
use edgeloop_registry::models::ModelVersionRecord;
use edgeloop_store::{Fence, TestDatabase};
use serde_json::json;
use time::OffsetDateTime;

const MODEL: &str = "m";

#[derive(Parser, Debug)]
struct Args {
    /// Devices in the wave.
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    /// Timed waves per way of writing.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// On a fresh PostgreSQL database instead of sled.
    #[arg(long)]
    postgres: bool,
}

fn member(id: &str, now: OffsetDateTime) -> Member {
    edgeloop_tests::seed::device(id, BTreeMap::new(), now)
}

fn version(v: usize) -> anyhow::Result<ModelVersionRecord> {
    Ok(serde_json::from_value(json!({
        "model": MODEL, "version": v.to_string(),
        "artifact_digest": Digest::of(v.to_string().as_bytes()),
        "artifact_size": 1, "format": "onnx", "created_at": "2026-12-01T00:00:00Z"
    }))?)
}

/// What a wave assigns to device `m`.
fn entry(v: &ModelVersionRecord, m: &Member, seq: u64) -> AssignmentRecord {
    AssignmentRecord {
        deployment_seq: seq,
        ..AssignmentRecord::for_device(v, &m.capabilities.execution_providers, "dep", 60)
    }
}

/// The runner's writes before batching: device by device.
fn one_by_one(
    store: &Db,
    fence: Fence,
    devices: &[String],
    v: &ModelVersionRecord,
    seq: u64,
) -> anyhow::Result<()> {
    for d in devices {
        let m = store
            .fleet
            .devices
            .get(d)?
            .ok_or_else(|| anyhow::anyhow!("{d} is not enrolled"))?;
        let entry = entry(v, &m, seq);
        admission::remember(store, d, MODEL, &v.version)?;
        store
            .update_fenced(&store.fleet.assignments, Some(fence), d, |cur| {
                let cur = cur.unwrap_or_default();
                let mut assignments: Vec<AssignmentRecord> = cur
                    .assignments
                    .into_iter()
                    .filter(|a| a.model_name != MODEL)
                    .collect();
                assignments.push(entry.clone());
                Ok::<_, ()>(AssignmentSetRecord {
                    generation: cur.generation + 1,
                    assignments,
                })
            })?
            .map_err(|e| anyhow::anyhow!("not written: {e:?}"))?;
    }
    Ok(())
}

fn batched(
    store: &Db,
    fence: Fence,
    devices: &[String],
    v: &ModelVersionRecord,
    seq: u64,
) -> anyhow::Result<()> {
    let ids: Vec<&str> = devices.iter().map(String::as_str).collect();
    let out = assignments::set_models(store, MODEL, seq, Some(fence), &ids, |m| {
        Some(entry(v, m, seq))
    })?;
    let changed = out
        .iter()
        .filter(|(o, _)| matches!(o, assignments::SetOutcome::Changed(_)))
        .count();
    anyhow::ensure!(
        changed == devices.len(),
        "{changed} of {} changed",
        devices.len()
    );
    Ok(())
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.devices > 0 && args.repeat > 0,
        "--devices and --repeat must be positive"
    );
    let dir = tempfile::tempdir()?;
    let (store, backend, _db) = if args.postgres {
        let db = TestDatabase::from_env("wave-writes").ok_or_else(|| {
            anyhow::anyhow!("--postgres needs EDGELOOP_TEST_POSTGRES_URL (scripts/postgres-up.sh)")
        })?;
        (Db::open_postgres(db.url())?, "postgres", Some(db))
    } else {
        (Db::open(&dir.path().join("db"))?, "sled", None)
    };
    let now = OffsetDateTime::now_utc();
    let devices: Vec<String> = (0..args.devices).map(|i| format!("dev-{i:05}")).collect();
    for d in &devices {
        store.fleet.devices.insert(d, &member(d, now))?;
    }
    store.fences.insert("rollouts", &1)?;
    let fence = Fence {
        task: "rollouts",
        token: 1,
    };
    let (mut old, mut new) = (Vec::new(), Vec::new());
    let (mut old_calls, mut new_calls) = (0, 0);
    // One untimed turn each first; then in turns, each wave a new version
    // (and a newer deployment), so every set changes.
    for turn in 0..=args.repeat {
        for (way, times, calls) in [(0, &mut old, &mut old_calls), (1, &mut new, &mut new_calls)] {
            let n = 2 * turn + way + 1;
            let v = version(n)?;
            let before = store.read_counts();
            let t = Instant::now();
            if way == 0 {
                one_by_one(&store, fence, &devices, &v, n as u64)?;
            } else {
                batched(&store, fence, &devices, &v, n as u64)?;
            }
            let took = t.elapsed();
            if turn > 0 {
                times.push(took);
                *calls = store.read_counts().since(&before).total().calls;
            }
        }
    }
    let (old, new) = (median(old), median(new));
    println!(
        "wave writes, {} devices on {backend}, median of {} turns:",
        args.devices, args.repeat
    );
    println!(
        "  device by device: {:>9.1} ms  ({:.0} us a device, {old_calls} store reads a wave)",
        old.as_secs_f64() * 1e3,
        old.as_secs_f64() * 1e6 / args.devices as f64
    );
    println!(
        "  batched:          {:>9.1} ms  ({:.0} us a device, {new_calls} store reads a wave)",
        new.as_secs_f64() * 1e3,
        new.as_secs_f64() * 1e6 / args.devices as f64
    );
    println!(
        "  ratio (device by device / batched): {:.1}x",
        old.as_secs_f64() / new.as_secs_f64().max(1e-9)
    );
    Ok(())
}
