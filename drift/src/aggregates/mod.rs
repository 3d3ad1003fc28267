//! Drift aggregates kept as telemetry arrives, so the trigger tick and the
//! drift API read O(windows) records, not every sketch and sample
//! (issue #16):
//!
//! - `windows`: each window's sum of sketches, for the model's own drift
//!   window (its triggers' `drift.window_seconds`, else the default): one
//!   record per window for all devices, and one per window and device
//!   (for `group_by`), added to with `Tree::update` as each sketch is
//!   stored.
//! - `labelled`: the labelled samples, once per device and request (the
//!   oldest key wins, as the full scan's dedup did), indexed by time per
//!   model (labels since a retrain: hourly counts plus the partial hour)
//!   and per version for the predictions that have a class (online
//!   accuracy: the newest `accuracy_window`).
//!
//! Everything here is derived and rebuildable: a mark per aggregate
//! (`agg_marks`) says which format version and which process built it.
//! A mark from another version or process is stale, and the first read
//! rebuilds the aggregate once from the raw records (holding off its
//! writers meanwhile). So an old data dir works, and a crash between a raw
//! write and its aggregate's (sled writes trees one at a time) costs one
//! rebuild at the next start, never a wrong count.
//!
//! Retention: window sums are dropped with the sketches they sum (by the
//! compactor, `prune`, once a whole window is past `--retention-sketch-days`);
//! the window at the edge keeps its whole sum until it is wholly past. The
//! label indexes follow the samples exactly: sample retention
//! (`drift::retention`) takes each dropped sample out of them.

#[cfg(test)]
pub(crate) mod full_scan;
pub mod labelled;
pub mod run;
pub mod windows;

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::Trees;
use edgeloop_errors::Result;

/// Bump when an aggregate's format or meaning changes: every mark goes
/// stale and each aggregate is rebuilt once from the raw records.
pub const AGGREGATE_VERSION: u32 = 1;

/// Who built an aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggMark {
    pub version: u32,
    pub process: u64,
}

/// This process's id for marks: random per process, so a restart
/// (perhaps after a crash between two writes) rebuilds.
fn process() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(rand::random)
}

fn current() -> AggMark {
    AggMark {
        version: AGGREGATE_VERSION,
        process: process(),
    }
}

fn is_current(store: &Trees, mark: &str) -> Result<bool> {
    Ok(store.agg_marks.get(mark)? == Some(current()))
}

fn set_current(store: &Trees, mark: &str) -> Result<()> {
    store.agg_marks.insert(mark, &current())?;
    Ok(())
}

/// Makes the aggregate behind `mark` rebuild on its next read (a write to
/// it failed half way).
fn invalidate(store: &Trees, mark: &str) {
    if let Err(e) = store.agg_marks.remove(mark) {
        tracing::warn!(mark, error = %e, "could not invalidate a drift aggregate");
    }
}

/// Removes every record under `prefix`, a batch at a time.
fn clear<V: Serialize + serde::de::DeserializeOwned>(
    tree: &edgeloop_store::Tree<V>,
    prefix: &str,
) -> Result<()> {
    loop {
        let batch = tree.first_with_prefix(prefix, 1024)?;
        if batch.is_empty() {
            return Ok(());
        }
        for (k, _) in batch {
            tree.remove(&k)?;
        }
    }
}

/// A signed time as a key part that sorts like the number.
fn ordered(t: i64) -> String {
    format!("{:020}", (t as u64) ^ (1 << 63))
}

fn unordered(s: &str) -> Option<i64> {
    s.parse::<u64>().ok().map(|u| (u ^ (1 << 63)) as i64)
}

pub use windows::prune;

#[cfg(test)]
mod tests;
