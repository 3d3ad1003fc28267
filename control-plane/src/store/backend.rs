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
