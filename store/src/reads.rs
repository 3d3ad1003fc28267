//! What the store's readers asked of the backend, per tree: calls, records
//! and bytes. Counted under every backend by a thin [`KvTree`] wrapper, so
//! a claim such as "a trigger tick reads O(windows), not O(samples)" is a
//! number a benchmark prints and a test checks, not a reading of the code.
//! Relaxed atomics: a count is a statistic, never a decision.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::backend::{Entry, KvTree, Range};
use super::StoreError;

/// One tree's reads so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeReads {
    /// `get` and range calls.
    pub calls: u64,
    /// Records returned (a `get` that found nothing returns none).
    pub records: u64,
    /// Key and value bytes returned.
    pub bytes: u64,
}

impl TreeReads {
    fn minus(self, earlier: TreeReads) -> TreeReads {
        TreeReads {
            calls: self.calls.saturating_sub(earlier.calls),
            records: self.records.saturating_sub(earlier.records),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }

    fn plus(self, other: TreeReads) -> TreeReads {
        TreeReads {
            calls: self.calls + other.calls,
            records: self.records + other.records,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// Every tree's reads at one moment, by tree name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadCounts(pub BTreeMap<String, TreeReads>);

impl ReadCounts {
    /// What was read between `earlier` and this snapshot; trees that read
    /// nothing in between are left out.
    pub fn since(&self, earlier: &ReadCounts) -> ReadCounts {
        ReadCounts(
            self.0
                .iter()
                .map(|(name, now)| {
                    let before = earlier.0.get(name).copied().unwrap_or_default();
                    (name.clone(), now.minus(before))
                })
                .filter(|(_, d)| d.calls > 0)
                .collect(),
        )
    }

    pub fn total(&self) -> TreeReads {
        self.0
            .values()
            .fold(TreeReads::default(), |a, b| a.plus(*b))
    }
}

#[derive(Default)]
struct Counter {
    calls: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
}

impl Counter {
    fn add(&self, records: u64, bytes: u64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn get(&self) -> TreeReads {
        TreeReads {
            calls: self.calls.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The store's counters, one per tree opened.
#[derive(Default)]
pub struct ReadCounters(Mutex<BTreeMap<String, Arc<Counter>>>);

impl ReadCounters {
    /// `tree`, counted under `name`.
    pub fn wrap(&self, name: &str, tree: Arc<dyn KvTree>) -> Arc<dyn KvTree> {
        let counter = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone();
        Arc::new(CountedTree { tree, counter })
    }

    pub fn snapshot(&self) -> ReadCounts {
        ReadCounts(
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(name, c)| (name.clone(), c.get()))
                .collect(),
        )
    }
}

struct CountedTree {
    tree: Arc<dyn KvTree>,
    counter: Arc<Counter>,
}

fn size(entries: &[Entry]) -> u64 {
    entries
        .iter()
        .map(|(k, v)| (k.len() + v.len()) as u64)
        .sum()
}

impl KvTree for CountedTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let found = self.tree.get(key)?;
        match &found {
            Some(v) => self.counter.add(1, (key.len() + v.len()) as u64),
            None => self.counter.add(0, 0),
        }
        Ok(found)
    }

    /// One call, however many keys: what it costs on PostgreSQL.
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let found = self.tree.get_many(keys)?;
        let (mut records, mut bytes) = (0, 0);
        for (k, v) in keys.iter().zip(&found) {
            if let Some(v) = v {
                records += 1;
                bytes += (k.len() + v.len()) as u64;
            }
        }
        self.counter.add(records, bytes);
        Ok(found)
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.tree.insert(key, value)
    }

    fn insert_many(&self, entries: &[(&[u8], &[u8])]) -> Result<(), StoreError> {
        self.tree.insert_many(entries)
    }

    fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        self.tree.compare_and_swap(key, old, new)
    }

    fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.tree.remove(key)
    }

    fn range(&self, range: Range<'_>) -> Result<Vec<Entry>, StoreError> {
        let entries = self.tree.range(range)?;
        self.counter.add(entries.len() as u64, size(&entries));
        Ok(entries)
    }

    fn len(&self) -> Result<usize, StoreError> {
        self.tree.len()
    }
}
