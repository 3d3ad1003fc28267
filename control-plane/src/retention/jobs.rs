//! Finished training jobs and their checkpoints.
//!
//! A job that ended (succeeded, failed, cancelled) more than
//! `--retention-job-days` ago goes, with its progress history (part of its
//! record) and its checkpoint records, unless something still names it: a
//! model version's lineage (`job`), or a retraining pipeline that has not
//! ended (a pipeline's training step finds its job by id, and would start
//! it again if it were gone). Inside a job that stays, the checkpoints
//! older than the newest `checkpoint.keep_last` of its spec go, as its
//! bridge drops them from its own disk. In both cases a checkpoint whose
//! digest a record pins (a version's lineage or artifact, an unfinished
//! pipeline's output, see [`super::gc::pinned`]) stays, even alone under a
//! job that went. The artifacts of what went are then the sweep's to
//! collect.

use std::collections::HashSet;

use edgeloop_models::Digest;
use time::{Duration, OffsetDateTime};

use super::gc::{checkpoint_digest, each, Pinned};
use crate::db::Db;
use crate::lifecycle::jobs::{keep_last, JobRecord};
use edgeloop_errors::Result;
use edgeloop_registry::checkpoints::{self, CheckpointRecord};

/// Whether `job` goes: ended more than `max_age` before `now` (by its last
/// change, which for an ended job is when it ended), and not pinned. Pure.
pub fn job_expired(job: &JobRecord, pins: &Pinned, now: OffsetDateTime, max_age: Duration) -> bool {
    job.state.is_terminal() && now - job.updated_at > max_age && !pins.jobs.contains(&job.id)
}

/// Which of a job's checkpoints may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Its job went (or is gone): every one may.
    None,
    /// The newest this many stay.
    Newest(usize),
    /// Its spec does not say how many in a way this binary reads.
    All,
}

impl Keep {
    /// For a job's checkpoints: `None` when there is no job, or it expired.
    pub fn of(job: Option<&JobRecord>, expired: bool) -> Keep {
        match job {
            None => Keep::None,
            Some(_) if expired => Keep::None,
            Some(j) => keep_last(j).map_or(Keep::All, Keep::Newest),
        }
    }
}

/// The checkpoints (a job's, oldest step first) that go: all but the
/// newest `keep` says, and never a pinned one. Pure.
pub fn checkpoints_to_drop<'a>(
    oldest_first: &'a [CheckpointRecord],
    keep: Keep,
    pinned: &HashSet<Digest>,
) -> Vec<&'a CheckpointRecord> {
    let past = match keep {
        Keep::All => 0,
        Keep::None => oldest_first.len(),
        Keep::Newest(n) => oldest_first.len().saturating_sub(n),
    };
    oldest_first[..past]
        .iter()
        .filter(|c| !pinned.contains(&checkpoint_digest(c)))
        .collect()
}

/// The job id of a checkpoint key (`<job>/<step>`).
fn job_of(key: &str) -> Option<&str> {
    key.rsplit_once('/').map(|(job, _)| job)
}

/// Drops expired jobs and the checkpoints no job keeps; returns how many
/// of each went. Blocking; the caller flushes.
pub fn prune(
    store: &Db,
    pins: &Pinned,
    now: OffsetDateTime,
    max_age: Duration,
) -> Result<(u64, u64)> {
    let mut dropped_checkpoints = 0;
    // Each job with checkpoints (`<job>/<step>`), found by seeking past
    // the one before; a job gone since (an earlier pass kept a pinned
    // checkpoint of it) is walked too.
    let mut from = String::new();
    while let Some(key) = store.registry.checkpoints.first_key_from(&from)? {
        let Some(id) = job_of(&key).map(str::to_string) else {
            break;
        };
        let job = store.lifecycle.jobs.get(&id)?;
        let expired = job
            .as_ref()
            .is_some_and(|j| job_expired(j, pins, now, max_age));
        let keep = Keep::of(job.as_ref(), expired);
        if keep != Keep::All {
            let held = checkpoints::list(&store.registry, &id)?;
            for c in checkpoints_to_drop(&held, keep, &pins.digests) {
                store
                    .registry
                    .checkpoints
                    .remove(&checkpoints::key(&c.job_id, c.step))?;
                dropped_checkpoints += 1;
            }
        }
        // '0' is the byte after '/': the first key past this job's.
        from = format!("{id}0");
    }
    // The jobs themselves, after their checkpoints: a crash between leaves
    // a job with fewer checkpoints, which the next pass finishes.
    let mut expired = Vec::new();
    each(&store.lifecycle.jobs, |_, j| {
        if job_expired(&j, pins, now, max_age) {
            expired.push(j);
        }
        Ok(())
    })?;
    let mut dropped_jobs = 0;
    for j in expired {
        // Only as read: a job changed since is judged again next pass.
        if store.lifecycle.jobs.remove_if_eq(&j.id, &j)? {
            dropped_jobs += 1;
        }
    }
    Ok((dropped_jobs, dropped_checkpoints))
}

#[cfg(test)]
mod tests;
