//! The compactor: records that would otherwise grow forever are dropped
//! by age, at start and then hourly, on the blocking pool.
//!
//! - Telemetry reports (`--retention-telemetry-days`, 30): per device,
//!   oldest first, but never a device's newest, which anchors its ack.
//! - Drift sketches (`--retention-sketch-days`, 90): per model version and
//!   device, oldest first. Drift windows read the recent ones.
//! - Bootstrap tokens (`--retention-token-days`, 30) once used or expired
//!   that long ago: a member retrying an enrollment whose reply it lost
//!   does so within minutes, not a month.
//! - Interrupted checkpoint uploads (`--retention-partial-upload-days`, 7)
//!   nobody wrote to for that long: a bridge back after that starts over.
//!
//! - Finished training jobs (`--retention-job-days`, 90) with their
//!   progress history and checkpoint records, unless a model version's
//!   lineage or an unfinished pipeline names them; and in every job, the
//!   checkpoints past its spec's `checkpoint.keep_last`, as its bridge
//!   drops them. A checkpoint a record pins always stays ([`jobs`]).
//! - Ended retraining pipelines, deployments (with their event logs) and
//!   device benchmarks (`--retention-history-days`, 180), but never a
//!   model's newest pipeline, its serving (newest succeeded) or newest
//!   deployment, or what an unfinished pipeline names ([`history`]).
//! - Artifacts no record references, last stored more than
//!   `--retention-artifact-grace-hours` (24) ago: mark and sweep, after
//!   the records above are pruned, so what they held goes in the same
//!   pass ([`gc`], which lists every record kind it reads).
//!
//! Samples have their own count-based retention (`drift::retention`), the
//! audit log its own (`auth::audit`). Each decision is a pure function of
//! the records' times and `now`; the passes around them only read and
//! delete.

use std::sync::Arc;

use time::{Duration, OffsetDateTime};
use tokio_util::sync::CancellationToken;

pub mod audit;
pub mod gc;
pub mod history;
pub mod jobs;

use crate::db::Db;
use crate::fleet::members::BootstrapTokenRecord;
use crate::Core;
use edgeloop_errors::Result;

/// How long each kind is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub telemetry: Duration,
    pub sketches: Duration,
    pub tokens: Duration,
    pub partial_uploads: Duration,
    /// Finished jobs, by when they ended.
    pub jobs: Duration,
    /// Ended pipelines, deployments and benchmarks, by when they ended.
    pub history: Duration,
    /// How long an artifact nothing references is kept after it was last
    /// stored: a client uploads first, then registers what names it.
    pub artifact_grace: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            telemetry: Duration::days(30),
            sketches: Duration::days(90),
            tokens: Duration::days(30),
            partial_uploads: Duration::days(7),
            jobs: Duration::days(90),
            history: Duration::days(180),
            artifact_grace: Duration::hours(24),
        }
    }
}

/// How many of the oldest records (their times, oldest first) go: those
/// older than `max_age`, but never the last one when `keep_last`. Pure.
pub fn oldest_to_drop(
    times: &[OffsetDateTime],
    now: OffsetDateTime,
    max_age: Duration,
    keep_last: bool,
) -> usize {
    let old = times.iter().take_while(|t| now - **t > max_age).count();
    if keep_last && old == times.len() {
        old.saturating_sub(1)
    } else {
        old
    }
}

/// Whether a bootstrap token is done with: used, or expired unused, more
/// than `keep` ago. Pure.
pub fn token_done(t: &BootstrapTokenRecord, now: OffsetDateTime, keep: Duration) -> bool {
    let ended = t.used_at.unwrap_or(t.expires_at);
    (t.used_at.is_some() || now >= t.expires_at) && now - ended > keep
}

/// What a pass dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub telemetry: u64,
    pub sketches: u64,
    pub tokens: u64,
    pub partial_uploads: u64,
    pub jobs: u64,
    pub checkpoints: u64,
    pub history: history::DroppedHistory,
}

const BATCH: usize = 1024;

/// Drops the oldest records under `prefix` of `tree` that `oldest_to_drop`
/// says go, a batch at a time. Blocking.
fn prune_prefix<V: serde::Serialize + serde::de::DeserializeOwned>(
    tree: &edgeloop_store::Tree<V>,
    prefix: &str,
    time_of: impl Fn(&V) -> OffsetDateTime,
    now: OffsetDateTime,
    max_age: Duration,
    keep_last: bool,
) -> Result<u64> {
    let mut dropped = 0;
    loop {
        // One more than a batch: if it is there, the batch's last is not
        // the prefix's newest.
        let mut oldest = tree.first_with_prefix(prefix, BATCH + 1)?;
        let seen_all = oldest.len() <= BATCH;
        oldest.truncate(BATCH);
        let times: Vec<_> = oldest.iter().map(|(_, v)| time_of(v)).collect();
        let n = oldest_to_drop(&times, now, max_age, keep_last && seen_all);
        for (k, _) in oldest.iter().take(n) {
            tree.remove(k)?;
        }
        dropped += n as u64;
        if n < BATCH {
            return Ok(dropped);
        }
    }
}

/// One pass over every kind of record, by `now`; the artifacts they held
/// are [`gc::sweep`]'s, once what went here is durable. Blocking; the
/// caller flushes.
pub fn prune(
    store: &Db,
    artifacts: &dyn edgeloop_registry::artifacts::ArtifactStore,
    r: Retention,
    now: OffsetDateTime,
) -> Result<Dropped> {
    let mut d = prune_records(store, artifacts, r, now)?;
    // Before the pins: an ended pipeline pins nothing, but what it ran
    // is read through the records that stay.
    d.history = history::prune(store, now, r.history)?;
    let pins = gc::pinned(store)?;
    (d.jobs, d.checkpoints) = jobs::prune(store, &pins, now, r.jobs)?;
    Ok(d)
}

/// Telemetry, sketches, tokens and partial uploads. Blocking.
fn prune_records(
    store: &Db,
    artifacts: &dyn edgeloop_registry::artifacts::ArtifactStore,
    r: Retention,
    now: OffsetDateTime,
) -> Result<Dropped> {
    let mut d = Dropped::default();
    let idle = std::time::Duration::try_from(r.partial_uploads).unwrap_or(std::time::Duration::MAX);
    d.partial_uploads = artifacts.prune_partials(idle)?;
    // Each device with reports (`<device>/...`), found by seeking past the
    // one before: a member deleted since still has its reports pruned.
    let mut from = String::new();
    while let Some(key) = store.fleet.telemetry.first_key_from(&from)? {
        let Some((device, _)) = key.split_once('/') else {
            break;
        };
        d.telemetry += prune_prefix(
            &store.fleet.telemetry,
            &format!("{device}/"),
            |t| t.received_at,
            now,
            r.telemetry,
            true,
        )?;
        // '0' is the byte after '/': the first key past this device's.
        from = format!("{device}0");
    }
    // Every (device, model, version) that may have sketches.
    for (key, ()) in store.fleet.assigned_history.scan_prefix("")? {
        let mut parts = key.splitn(3, '/');
        let (Some(device), Some(model), Some(version)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        d.sketches += prune_prefix(
            &store.drift.sketches,
            &format!("{model}/{version}/{device}/"),
            |s| s.window_time().unwrap_or(now),
            now,
            r.sketches,
            false,
        )?;
    }
    // Window sums go with their windows' sketches (drift::aggregates).
    edgeloop_drift::aggregates::prune(&store.drift, now, r.sketches)?;
    for (id, t) in store.fleet.tokens.scan_prefix("")? {
        if token_done(&t, now, r.tokens) {
            store.fleet.tokens.remove(&id)?;
            d.tokens += 1;
        }
    }
    Ok(d)
}

/// Runs [`prune`], then garbage collection ([`gc::mark`], [`gc::sweep`]), at start and then hourly, until
/// `shutdown`.
pub async fn run(core: Arc<Core>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Another replica compacts while it holds the lease.
        if !core.leader.leads(crate::leader::Task::Compactor) {
            continue;
        }
        if let Err(e) = pass(&core).await {
            tracing::warn!(error = %e, "retention failed; retrying in an hour");
        }
    }
}

/// One pass: the records, the live set, a flush, then the artifacts. The
/// flush makes what the live set was read from durable (the records this
/// pass dropped, and any other write it saw) before anything is deleted,
/// so a crash never brings back a record whose artifact is gone.
async fn pass(core: &Arc<Core>) -> anyhow::Result<()> {
    let c = core.clone();
    let (d, marked) = tokio::task::spawn_blocking(move || {
        let d = prune(&c.store, c.artifacts.as_ref(), c.config.retention, c.now())?;
        Ok::<_, edgeloop_errors::Error>((d, gc::mark(&c.store, c.artifacts.as_ref())?))
    })
    .await??;
    core.store.flush().await?;
    let c = core.clone();
    let swept = tokio::task::spawn_blocking(move || {
        let grace = c.config.retention.artifact_grace;
        let now = OffsetDateTime::now_utc();
        gc::sweep(
            c.artifacts.as_ref(),
            &marked,
            Some(&c.artifact_cache),
            grace,
            now,
        )
    })
    .await??;
    if d != Dropped::default() || !swept.deleted.is_empty() {
        tracing::info!(
            telemetry = d.telemetry,
            sketches = d.sketches,
            tokens = d.tokens,
            partial_uploads = d.partial_uploads,
            jobs = d.jobs,
            checkpoints = d.checkpoints,
            pipelines = d.history.pipelines,
            deployments = d.history.deployments,
            benchmarks = d.history.benchmarks,
            artifacts = swept.deleted.len(),
            artifact_bytes = swept.bytes,
            "retention"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn the_oldest_past_their_age_go_but_the_newest_may_stay() {
        let now = datetime!(2026-06-01 0:00 UTC);
        let days = |n: i64| now - Duration::days(n);
        let age = Duration::days(30);
        // (times oldest first, keep the last) -> how many go
        let table: &[(&[OffsetDateTime], bool, usize)] = &[
            (&[], true, 0),
            (&[days(40), days(35), days(10)], true, 2),
            (&[days(40), days(35)], true, 1),
            (&[days(40), days(35)], false, 2),
            (&[days(30), days(40)], false, 0),
            (&[days(10)], false, 0),
        ];
        for (times, keep_last, want) in table {
            assert_eq!(
                oldest_to_drop(times, now, age, *keep_last),
                *want,
                "{times:?} {keep_last}"
            );
        }
    }

    #[test]
    fn a_token_goes_a_while_after_it_was_used_or_expired() {
        let now = datetime!(2026-06-01 0:00 UTC);
        let days = |n: i64| now - Duration::days(n);
        let token = |expires: OffsetDateTime, used: Option<OffsetDateTime>| BootstrapTokenRecord {
            id: "t".into(),
            kind: crate::fleet::members::MemberKind::Device,
            member_id: "m".into(),
            labels: Default::default(),
            project: "default".into(),
            secret_hash: edgeloop_models::Digest::of(b"s"),
            created_at: days(100),
            expires_at: expires,
            used_at: used,
            enrolled: None,
        };
        let keep = Duration::days(30);
        let table = [
            (token(days(40), Some(days(45))), true),
            (token(days(40), Some(days(10))), false),
            (token(days(40), None), true),
            (token(days(10), None), false),
            // Unused and still valid: never.
            (token(now + Duration::days(1), None), false),
        ];
        for (t, want) in table {
            assert_eq!(token_done(&t, now, keep), want, "{t:?}");
        }
    }
}
