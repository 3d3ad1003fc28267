//! Bounded sample retention: each model keeps at most `max_samples_per_model`
//! samples; past it the oldest (by when the device observed them) are
//! deleted, and counted, so a fleet sending hard examples for years never
//! fills the store, and nobody wonders where the old ones went.
//!
//! A time index (`sample_index`: `<model>/<observed, unix ns, 20
//! digits>/<sample key>` → the sample key) finds the oldest without reading
//! the samples, and a per-model count (`sample_counts`) says when the cap is
//! passed without scanning. Samples stored before the index existed are
//! neither counted nor dropped.

use serde::{Deserialize, Serialize};

use super::aggregates;
use super::records::SampleRecord;
use crate::Trees;
use edgeloop_errors::Result;

/// What a model's samples are: kept, and dropped for the cap so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleCounts {
    pub stored: u64,
    pub dropped: u64,
}

fn index_key(model: &str, r: &SampleRecord, key: &str) -> String {
    // Before the epoch or unknown: oldest.
    let at = r
        .at()
        .map_or(0, |t| u64::try_from(t.unix_timestamp_nanos()).unwrap_or(0));
    format!("{model}/{at:020}/{key}")
}

/// Stores a sample under `key`, indexed and counted when it is new (a
/// replayed report writes the same keys again and counts nothing twice).
pub fn store_sample(store: &Trees, key: &str, r: &SampleRecord) -> Result<()> {
    let fresh = !store.samples.contains(key)?;
    store.samples.insert(key, r)?;
    if fresh {
        store
            .sample_index
            .insert(&index_key(&r.model_name, r, key), &key.to_string())?;
        store
            .sample_counts
            .update(&r.model_name, |c| {
                let mut c = c.unwrap_or_default();
                c.stored += 1;
                Ok::<_, ()>(c)
            })?
            .ok();
    }
    // A retried report stores the same label again: indexing is idempotent.
    aggregates::labelled::on_labelled(store, key, r)?;
    Ok(())
}

/// Deletes `model`'s oldest samples past `max`; how many it deleted.
pub fn enforce(store: &Trees, model: &str, max: u64) -> Result<u64> {
    let counts = store.sample_counts.get(model)?.unwrap_or_default();
    let over = counts.stored.saturating_sub(max);
    if over == 0 {
        return Ok(0);
    }
    let oldest = store
        .sample_index
        .first_with_prefix(&format!("{model}/"), over as usize)?;
    let mut dropped = 0;
    for (index, key) in oldest {
        if let Some(gone) = store.samples.remove(&key)? {
            aggregates::labelled::on_removed(store, &key, &gone)?;
        }
        store.sample_index.remove(&index)?;
        dropped += 1;
    }
    store
        .sample_counts
        .update(model, |c| {
            let mut c = c.unwrap_or_default();
            c.stored = c.stored.saturating_sub(dropped);
            c.dropped += dropped;
            Ok::<_, ()>(c)
        })?
        .ok();
    if dropped > 0 {
        tracing::info!(
            model,
            dropped,
            max,
            "dropped the oldest samples over the cap"
        );
    }
    Ok(dropped)
}

pub fn counts(store: &Trees, model: &str) -> Result<SampleCounts> {
    Ok(store.sample_counts.get(model)?.unwrap_or_default())
}
