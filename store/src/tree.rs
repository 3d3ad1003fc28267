//! A tree whose values are one serde type, over a [`KvTree`] of bytes.
//! The JSON encoding, the compare-and-swap loop and the pagination rules
//! live here once, whichever backend stores the bytes.

use std::marker::PhantomData;
use std::ops::Bound;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::backend::{prefix_end, FenceCheck, FencedCas, KvBackend, KvTree, Range, Swap};
use super::reads::ReadCounters;
use super::{Fence, NotWritten, StoreError};

/// Records read per backend call by the scans that stop on a condition
/// (a filter, a page's end): big enough that a page is one or two calls,
/// small enough that a scan stopping early reads little past its end.
const CHUNK: usize = 256;

pub struct Tree<V> {
    name: String,
    tree: Arc<dyn KvTree>,
    _value: PhantomData<fn() -> V>,
}

impl<V> Clone for Tree<V> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            tree: self.tree.clone(),
            _value: PhantomData,
        }
    }
}

fn key_string(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

impl<V: Serialize + DeserializeOwned> Tree<V> {
    pub(super) fn open(
        db: &dyn KvBackend,
        reads: &ReadCounters,
        name: &str,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            name: name.to_string(),
            tree: reads.wrap(name, db.open_tree(name)?),
            _value: PhantomData,
        })
    }

    fn encode(&self, value: &V) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            tree: self.name.clone(),
            source,
        })
    }

    fn decode(&self, key: &[u8], raw: &[u8]) -> Result<V, StoreError> {
        serde_json::from_slice(raw).map_err(|source| StoreError::Corrupt {
            tree: self.name.clone(),
            key: key_string(key),
            source,
        })
    }

    fn entry(&self, (k, raw): (Vec<u8>, Vec<u8>)) -> Result<(String, V), StoreError> {
        let v = self.decode(&k, &raw)?;
        Ok((key_string(&k), v))
    }

    /// Up to `limit` records within the bounds, decoded.
    fn read(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(String, V)>, StoreError> {
        self.tree
            .range(Range {
                lower,
                upper,
                reverse,
                limit,
            })?
            .into_iter()
            .map(|e| self.entry(e))
            .collect()
    }

    /// Visits the records within the bounds in order (or reversed) until
    /// `visit` says stop, reading [`CHUNK`] at a time (the first read at
    /// most `wanted`, when the caller knows it wants fewer: a page of 50
    /// reads 50, not 256): each call resumes just past the last key seen,
    /// so nothing is held between calls.
    fn walk(
        &self,
        lower: Bound<Vec<u8>>,
        upper: Bound<Vec<u8>>,
        reverse: bool,
        wanted: usize,
        mut visit: impl FnMut(String, V) -> bool,
    ) -> Result<(), StoreError> {
        let (mut lower, mut upper) = (lower, upper);
        let mut limit = wanted.clamp(1, CHUNK);
        loop {
            let chunk = self.tree.range(Range {
                lower: as_ref(&lower),
                upper: as_ref(&upper),
                reverse,
                limit,
            })?;
            let full = chunk.len() == limit;
            // A filter may drop records: read on at the full chunk size.
            limit = CHUNK;
            let mut last = None;
            for (k, raw) in chunk {
                let v = self.decode(&k, &raw)?;
                if !visit(key_string(&k), v) {
                    return Ok(());
                }
                last = Some(k);
            }
            match last {
                Some(k) if full => {
                    if reverse {
                        upper = Bound::Excluded(k);
                    } else {
                        lower = Bound::Excluded(k);
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    pub fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        self.tree
            .get(key.as_bytes())?
            .map(|raw| self.decode(key.as_bytes(), &raw))
            .transpose()
    }

    pub fn contains(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.tree.get(key.as_bytes())?.is_some())
    }

    pub fn insert(&self, key: &str, value: &V) -> Result<(), StoreError> {
        self.tree.insert(key.as_bytes(), &self.encode(value)?)
    }

    /// Inserts only if `key` is absent; false if it was already there.
    pub fn insert_new(&self, key: &str, value: &V) -> Result<bool, StoreError> {
        self.tree
            .compare_and_swap(key.as_bytes(), None, Some(&self.encode(value)?))
    }

    /// What `key` holds now: the bytes (for compare-and-swap) and the value.
    fn current(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<V>), StoreError> {
        let raw = self.tree.get(key.as_bytes())?;
        let value = raw
            .as_ref()
            .map(|raw| self.decode(key.as_bytes(), raw))
            .transpose()?;
        Ok((raw, value))
    }

    /// Atomic read-modify-write. `f` sees the current value and returns the new
    /// one, or an error that aborts without writing. Retried on a race, so `f`
    /// must be pure.
    pub fn update<E>(
        &self,
        key: &str,
        mut f: impl FnMut(Option<V>) -> Result<V, E>,
    ) -> Result<Result<V, E>, StoreError> {
        loop {
            let (old_raw, old) = self.current(key)?;
            let new = match f(old) {
                Ok(new) => new,
                Err(e) => return Ok(Err(e)),
            };
            let new_raw = self.encode(&new)?;
            if self
                .tree
                .compare_and_swap(key.as_bytes(), old_raw.as_deref(), Some(&new_raw))?
            {
                return Ok(Ok(new));
            }
        }
    }

    /// [`Tree::update`] from a value the caller has just read: the first
    /// swap expects that value's encoding, which saves the read (on
    /// PostgreSQL, a round trip) when nothing changed it since. A value
    /// changed meanwhile, or stored in an older encoding, falls back to
    /// [`Tree::update`], so the result is the same.
    pub fn update_from<E>(
        &self,
        key: &str,
        known: &V,
        mut f: impl FnMut(Option<V>) -> Result<V, E>,
    ) -> Result<Result<V, E>, StoreError>
    where
        V: Clone,
    {
        let new = match f(Some(known.clone())) {
            Ok(new) => new,
            Err(e) => return Ok(Err(e)),
        };
        let (old_raw, new_raw) = (self.encode(known)?, self.encode(&new)?);
        if self
            .tree
            .compare_and_swap(key.as_bytes(), Some(&old_raw), Some(&new_raw))?
        {
            return Ok(Ok(new));
        }
        self.update(key, f)
    }

    /// [`Tree::update`], applied only while `fence` holds (a background
    /// task's fencing token, `leader`): `Ok(Err(None))` when it no longer
    /// does, and nothing was written.
    pub(super) fn update_fenced<E>(
        &self,
        db: &dyn KvBackend,
        fence: FenceCheck<'_>,
        key: &str,
        mut f: impl FnMut(Option<V>) -> Result<V, E>,
    ) -> Result<Result<V, Option<E>>, StoreError> {
        loop {
            let (old_raw, old) = self.current(key)?;
            let new = match f(old) {
                Ok(new) => new,
                Err(e) => return Ok(Err(Some(e))),
            };
            let new_raw = self.encode(&new)?;
            match db.compare_and_swap_fenced(
                &self.name,
                key.as_bytes(),
                old_raw.as_deref(),
                Some(&new_raw),
                fence,
            )? {
                FencedCas::Swapped => return Ok(Ok(new)),
                FencedCas::Changed => continue,
                FencedCas::Fenced => return Ok(Err(None)),
            }
        }
    }

    /// What each of `keys` holds, in their order, read in one backend call.
    pub fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<V>>, StoreError> {
        let raw: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        self.tree
            .get_many(&raw)?
            .into_iter()
            .zip(keys)
            .map(|(v, k)| v.map(|v| self.decode(k.as_bytes(), &v)).transpose())
            .collect()
    }

    /// Inserts every entry in one backend call; not atomic as a whole.
    pub fn insert_many(&self, entries: &[(&str, &V)]) -> Result<(), StoreError> {
        let encoded: Vec<(&[u8], Vec<u8>)> = entries
            .iter()
            .map(|(k, v)| Ok((k.as_bytes(), self.encode(v)?)))
            .collect::<Result<_, StoreError>>()?;
        let pairs: Vec<(&[u8], &[u8])> = encoded.iter().map(|(k, v)| (*k, &v[..])).collect();
        self.tree.insert_many(&pairs)
    }

    /// [`Tree::update`] of many distinct keys as batches: one read of every
    /// key still to write, then one atomic compare-and-swap of them all
    /// (under `fence` when given), again for the keys another writer
    /// changed meanwhile. `f(key, current)` as in `update`: pure, since it
    /// may run again for a key. Per key, in `keys`' order: the value
    /// written, or why nothing was: `f` refused, or the fence moved on
    /// (and nothing of that batch was written).
    #[allow(clippy::type_complexity)]
    pub(super) fn update_many<E>(
        &self,
        db: &dyn KvBackend,
        fence: Option<(Fence, FenceCheck<'_>)>,
        keys: &[&str],
        mut f: impl FnMut(&str, Option<V>) -> Result<V, E>,
    ) -> Result<Vec<Result<V, NotWritten<E>>>, StoreError> {
        let mut out: Vec<Option<Result<V, NotWritten<E>>>> = keys.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        while !pending.is_empty() {
            let wanted: Vec<&[u8]> = pending.iter().map(|&i| keys[i].as_bytes()).collect();
            let current = self.tree.get_many(&wanted)?;
            let mut writes: Vec<(usize, Option<Vec<u8>>, Vec<u8>, V)> = Vec::new();
            for (&i, raw) in pending.iter().zip(current) {
                let old = raw
                    .as_ref()
                    .map(|r| self.decode(keys[i].as_bytes(), r))
                    .transpose()?;
                match f(keys[i], old) {
                    Ok(new) => writes.push((i, raw, self.encode(&new)?, new)),
                    Err(e) => out[i] = Some(Err(NotWritten::Refused(e))),
                }
            }
            let swaps: Vec<Swap<'_>> = writes
                .iter()
                .map(|(i, old, new, _)| Swap {
                    key: keys[*i].as_bytes(),
                    old: old.as_deref(),
                    new: Some(new),
                })
                .collect();
            let results = db.compare_and_swap_many(&self.name, &swaps, fence.map(|f| f.1))?;
            drop(swaps);
            let mut again = Vec::new();
            for ((i, _, _, new), result) in writes.into_iter().zip(results) {
                match result {
                    FencedCas::Swapped => out[i] = Some(Ok(new)),
                    FencedCas::Changed => again.push(i),
                    FencedCas::Fenced => {
                        let Some((token, _)) = fence else {
                            return Err(StoreError::Unavailable(format!(
                                "{}: the backend fenced out a write that had no fence",
                                self.name
                            )));
                        };
                        out[i] = Some(Err(NotWritten::FencedOut(token)));
                    }
                }
            }
            pending = again;
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every key ends with a result"))
            .collect())
    }

    /// Removes `key` only if it still holds `expected`; false otherwise.
    pub fn remove_if_eq(&self, key: &str, expected: &V) -> Result<bool, StoreError>
    where
        V: PartialEq,
    {
        let Some(old_raw) = self.tree.get(key.as_bytes())? else {
            return Ok(false);
        };
        if self.decode(key.as_bytes(), &old_raw)? != *expected {
            return Ok(false);
        }
        self.tree
            .compare_and_swap(key.as_bytes(), Some(&old_raw), None)
    }

    pub fn remove(&self, key: &str) -> Result<Option<V>, StoreError> {
        self.tree
            .remove(key.as_bytes())?
            .map(|raw| self.decode(key.as_bytes(), &raw))
            .transpose()
    }

    /// Removes every one of `keys` in one backend call; how many were
    /// there. Not atomic as a whole.
    pub fn remove_many(&self, keys: &[&str]) -> Result<u64, StoreError> {
        let raw: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        self.tree.remove_many(&raw)
    }

    /// All records whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, V)>, StoreError> {
        self.first_with_prefix(prefix, usize::MAX)
    }

    /// The last record with `prefix`, by key order.
    pub fn last_with_prefix(&self, prefix: &str) -> Result<Option<(String, V)>, StoreError> {
        let end = prefix_end(prefix.as_bytes());
        Ok(self
            .read(Bound::Included(prefix.as_bytes()), upper_of(&end), true, 1)?
            .pop())
    }

    /// The first key at or after `start`, if any: for walking the distinct
    /// prefixes of a tree by seeking past each, never reading the rest.
    pub fn first_key_from(&self, start: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .tree
            .range(Range {
                lower: Bound::Included(start.as_bytes()),
                upper: Bound::Unbounded,
                reverse: false,
                limit: 1,
            })?
            .pop()
            .map(|(k, _)| key_string(&k)))
    }

    /// The last record with a key in `start..end`, by key order.
    pub fn last_in_range(&self, start: &str, end: &str) -> Result<Option<(String, V)>, StoreError> {
        Ok(self
            .read(
                Bound::Included(start.as_bytes()),
                Bound::Excluded(end.as_bytes()),
                true,
                1,
            )?
            .pop())
    }

    /// The first `n` records with `prefix`, in key order.
    pub fn first_with_prefix(
        &self,
        prefix: &str,
        n: usize,
    ) -> Result<Vec<(String, V)>, StoreError> {
        let end = prefix_end(prefix.as_bytes());
        self.read(Bound::Included(prefix.as_bytes()), upper_of(&end), false, n)
    }

    /// Records with `prefix`, newest key first, while `keep` says so: the
    /// tail of an append-only, sequence-keyed log without reading all of it.
    pub fn scan_prefix_rev_while(
        &self,
        prefix: &str,
        mut keep: impl FnMut(&V) -> bool,
    ) -> Result<Vec<V>, StoreError> {
        let mut out = Vec::new();
        let upper = prefix_end(prefix.as_bytes()).map_or(Bound::Unbounded, Bound::Excluded);
        self.walk(
            Bound::Included(prefix.as_bytes().to_vec()),
            upper,
            true,
            CHUNK,
            |_, v| {
                if !keep(&v) {
                    return false;
                }
                out.push(v);
                true
            },
        )?;
        Ok(out)
    }

    /// Up to `n` records with `prefix` and a key strictly above `after`
    /// (from the prefix's start when `None`) that `keep` accepts, in key
    /// order: key-range pagination that reads from the cursor on and stops
    /// at the page's end, never the whole prefix.
    pub fn page_after(
        &self,
        prefix: &str,
        after: Option<&str>,
        n: usize,
        mut keep: impl FnMut(&str, &V) -> bool,
    ) -> Result<Vec<(String, V)>, StoreError> {
        let lower = match after {
            // A cursor outside the prefix starts at the prefix (or past it).
            Some(a) if a.as_bytes() >= prefix.as_bytes() => Bound::Excluded(a.as_bytes().to_vec()),
            _ => Bound::Included(prefix.as_bytes().to_vec()),
        };
        let upper = prefix_end(prefix.as_bytes()).map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::with_capacity(n.min(1024));
        if n == 0 {
            return Ok(out);
        }
        self.walk(lower, upper, false, n, |key, v| {
            if keep(&key, &v) {
                out.push((key, v));
            }
            out.len() < n
        })?;
        Ok(out)
    }

    /// Up to `n` records with keys strictly below `before` (all keys when
    /// `None`), newest key first: key-range pagination over a
    /// sequence-keyed log, reading only the page.
    pub fn page_rev_before(
        &self,
        before: Option<&str>,
        n: usize,
    ) -> Result<Vec<(String, V)>, StoreError> {
        let upper = before.map_or(Bound::Unbounded, |b| Bound::Excluded(b.as_bytes()));
        self.read(Bound::Unbounded, upper, true, n)
    }

    /// Up to `n` records with `prefix` and a key strictly below `before`
    /// (from the prefix's end when `None`) that `keep` accepts, newest key
    /// first: [`Tree::page_after`] for lists shown newest first (records
    /// keyed by a growing sequence), reading from the cursor down to the
    /// page's end.
    pub fn page_before(
        &self,
        prefix: &str,
        before: Option<&str>,
        n: usize,
        mut keep: impl FnMut(&str, &V) -> bool,
    ) -> Result<Vec<(String, V)>, StoreError> {
        let start = prefix.as_bytes().to_vec();
        // The first key past the prefix, or the cursor if it is lower: the
        // reverse scan starts inside the prefix, never above it.
        let end = match (before.map(str::as_bytes), prefix_end(prefix.as_bytes())) {
            (Some(b), Some(e)) if b > e.as_slice() => Bound::Excluded(e),
            (Some(b), _) => Bound::Excluded(b.to_vec()),
            (None, Some(e)) => Bound::Excluded(e),
            (None, None) => Bound::Unbounded,
        };
        let mut out = Vec::with_capacity(n.min(1024));
        if n == 0 {
            return Ok(out);
        }
        if let Bound::Excluded(e) = &end {
            if *e <= start {
                return Ok(out);
            }
        }
        self.walk(Bound::Included(start), end, true, n, |key, v| {
            if keep(&key, &v) {
                out.push((key, v));
            }
            out.len() < n
        })?;
        Ok(out)
    }

    /// The first `n` records by key order.
    pub fn first(&self, n: usize) -> Result<Vec<(String, V)>, StoreError> {
        self.first_with_prefix("", n)
    }

    /// Records in the tree. O(n) on both backends (sled iterates,
    /// PostgreSQL counts the rows): for occasional housekeeping, not per
    /// request.
    pub fn len(&self) -> Result<usize, StoreError> {
        self.tree.len()
    }

    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self
            .tree
            .range(Range {
                lower: Bound::Unbounded,
                upper: Bound::Unbounded,
                reverse: false,
                limit: 1,
            })?
            .is_empty())
    }

    pub fn values(&self) -> Result<Vec<V>, StoreError> {
        Ok(self.scan_prefix("")?.into_iter().map(|(_, v)| v).collect())
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The upper bound of a prefix scan, from [`prefix_end`].
fn upper_of(end: &Option<Vec<u8>>) -> Bound<&[u8]> {
    end.as_deref().map_or(Bound::Unbounded, Bound::Excluded)
}
