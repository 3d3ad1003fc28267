//! The seam under [`super::Tree`]: a byte-level, ordered key-value store
//! with compare-and-swap, one keyspace per named tree. Every wing's logic is
//! written once against `Tree<V>`'s typed API; only the implementations of
//! these two traits (sled, PostgreSQL) know what stores the bytes.

use std::ops::Bound;
use std::sync::Arc;

use super::StoreError;

/// A key and its value, as stored.
pub type Entry = (Vec<u8>, Vec<u8>);

/// One range read: keys within `lower..upper`, in key order (bytewise, as
/// sled orders them) or reversed, at most `limit`. Reads return a `Vec`
/// rather than an iterator so that no backend has to hold a cursor (a
/// PostgreSQL connection, a sled snapshot) across the caller's code;
/// [`super::Tree`] reads long scans a chunk at a time.
#[derive(Debug, Clone)]
pub struct Range<'a> {
    pub lower: Bound<&'a [u8]>,
    pub upper: Bound<&'a [u8]>,
    pub reverse: bool,
    pub limit: usize,
}

/// One named tree of a [`KvBackend`]. Every method is blocking, like sled's
/// own I/O: callers on async tasks use it as they use sled today.
pub trait KvTree: Send + Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError>;

    /// Sets `key` to `new` (`None`: removes it) only if it now holds `old`
    /// (`None`: is absent), atomically; whether it did. Values are compared
    /// by their bytes, as sled does.
    fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError>;

    /// Removes `key`, returning what it held.
    fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    fn range(&self, range: Range<'_>) -> Result<Vec<Entry>, StoreError>;

    /// What each of `keys` holds, in their order: one call, so that
    /// reading a rollout wave's records is one round trip on PostgreSQL
    /// rather than one per device. A key may repeat.
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// [`KvTree::remove`] of every key, as one call; how many of them were
    /// there. Not atomic as a whole: after an error, some may be gone.
    fn remove_many(&self, keys: &[&[u8]]) -> Result<u64, StoreError> {
        let mut removed = 0;
        for k in keys {
            if self.remove(k)?.is_some() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// [`KvTree::insert`] of every entry, as one call (a key that repeats
    /// ends with its last value).
    /// Not atomic as a whole: after an error, some may have been written.
    fn insert_many(&self, entries: &[(&[u8], &[u8])]) -> Result<(), StoreError> {
        entries.iter().try_for_each(|(k, v)| self.insert(k, v))
    }

    /// Records in the tree (may be O(n)).
    fn len(&self) -> Result<usize, StoreError>;
}

/// A record that must hold exactly `value` for a fenced write to apply: a
/// background task's fencing token (`leader`).
#[derive(Debug, Clone, Copy)]
pub struct FenceCheck<'a> {
    pub tree: &'a str,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// One compare-and-swap of a batch: [`KvTree::compare_and_swap`]'s
/// arguments.
#[derive(Debug, Clone, Copy)]
pub struct Swap<'a> {
    pub key: &'a [u8],
    pub old: Option<&'a [u8]>,
    pub new: Option<&'a [u8]>,
}

/// What a fenced compare-and-swap did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedCas {
    Swapped,
    /// The key did not hold `old`: read again and retry.
    Changed,
    /// The fence moved on: the writer is a stale leader.
    Fenced,
}

/// A whole store: its trees and the database-wide operations.
#[async_trait::async_trait]
pub trait KvBackend: Send + Sync {
    fn open_tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StoreError>;

    /// [`KvTree::compare_and_swap`] on `tree`, applied only while the
    /// fence record holds its value, in one atomic step with that check:
    /// a write that applied came before any change of the fence.
    fn compare_and_swap_fenced(
        &self,
        tree: &str,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
        fence: FenceCheck<'_>,
    ) -> Result<FencedCas, StoreError>;

    /// Compare-and-swaps of distinct keys of `tree`, each with its own
    /// result, in their order, applied in one atomic step (one
    /// transaction): with `fence`, only while the fence record holds its
    /// value, checked once for the whole batch, so either every result is
    /// [`FencedCas::Fenced`] and nothing was written, or none is. What a
    /// rollout wave writes, in one transaction instead of one per device.
    fn compare_and_swap_many(
        &self,
        tree: &str,
        swaps: &[Swap<'_>],
        fence: Option<FenceCheck<'_>>,
    ) -> Result<Vec<FencedCas>, StoreError>;

    /// A number never handed out before by this store, increasing, also
    /// across restarts.
    fn next_id(&self) -> Result<u64, StoreError>;

    /// Makes every write so far durable (see [`super::Store::flush`]).
    async fn flush(&self) -> Result<(), StoreError>;

    /// Cheap liveness probe.
    fn check(&self) -> Result<(), StoreError>;

    /// The record schema version this store was written with, if any yet.
    fn schema_version(&self) -> Result<Option<u32>, StoreError>;

    /// Records the record schema version, durably.
    fn set_schema_version(&self, version: u32) -> Result<(), StoreError>;

    /// Appends the backend's own statistics to `/metrics` text; nothing
    /// for one without any (sled has no queue in front of its calls).
    fn write_metrics(&self, _out: &mut String) {}
}

/// The smallest key above every key that starts with `prefix`; `None` when
/// there is none (an empty prefix, or one of only 0xff bytes).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Refuses a batch that names a key twice: a batch's swaps are each
/// checked against the value before the batch, which a repeat would make
/// ambiguous (and PostgreSQL's set-based writes apply one of the two).
pub fn distinct_keys(tree: &str, swaps: &[Swap<'_>]) -> Result<(), StoreError> {
    let mut seen = std::collections::HashSet::with_capacity(swaps.len());
    for s in swaps {
        if !seen.insert(s.key) {
            return Err(StoreError::DuplicateKey {
                tree: tree.to_string(),
                key: String::from_utf8_lossy(s.key).into_owned(),
            });
        }
    }
    Ok(())
}
