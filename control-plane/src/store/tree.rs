//! A sled tree whose values are one serde type.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::StoreError;

pub struct Tree<V> {
    name: String,
    tree: sled::Tree,
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

impl<V: Serialize + DeserializeOwned> Tree<V> {
    pub(super) fn open(db: &sled::Db, name: &str) -> Result<Self, StoreError> {
        Ok(Self {
            name: name.to_string(),
            tree: db.open_tree(name)?,
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
            key: String::from_utf8_lossy(key).into_owned(),
            source,
        })
    }

    pub fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        self.tree
            .get(key)?
            .map(|raw| self.decode(key.as_bytes(), &raw))
            .transpose()
    }

    pub fn contains(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.tree.contains_key(key)?)
    }

    pub fn insert(&self, key: &str, value: &V) -> Result<(), StoreError> {
        self.tree.insert(key, self.encode(value)?)?;
        Ok(())
    }

    /// Inserts only if `key` is absent; false if it was already there.
    pub fn insert_new(&self, key: &str, value: &V) -> Result<bool, StoreError> {
        let swapped = self
            .tree
            .compare_and_swap(key, None::<&[u8]>, Some(self.encode(value)?))?;
        Ok(swapped.is_ok())
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
            let old_raw = self.tree.get(key)?;
            let old = old_raw
                .as_ref()
                .map(|raw| self.decode(key.as_bytes(), raw))
                .transpose()?;
            let new = match f(old) {
                Ok(new) => new,
                Err(e) => return Ok(Err(e)),
            };
            let new_raw = self.encode(&new)?;
            if self
                .tree
                .compare_and_swap(key, old_raw, Some(new_raw))?
                .is_ok()
            {
                return Ok(Ok(new));
            }
        }
    }

    /// Removes `key` only if it still holds `expected`; false otherwise.
    pub fn remove_if_eq(&self, key: &str, expected: &V) -> Result<bool, StoreError>
    where
        V: PartialEq,
    {
        let Some(old_raw) = self.tree.get(key)? else {
            return Ok(false);
        };
        if self.decode(key.as_bytes(), &old_raw)? != *expected {
            return Ok(false);
        }
        Ok(self
            .tree
            .compare_and_swap(key, Some(old_raw), None::<&[u8]>)?
            .is_ok())
    }

    pub fn remove(&self, key: &str) -> Result<Option<V>, StoreError> {
        self.tree
            .remove(key)?
            .map(|raw| self.decode(key.as_bytes(), &raw))
            .transpose()
    }

    /// All records whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, V)>, StoreError> {
        self.tree
            .scan_prefix(prefix)
            .map(|item| {
                let (k, raw) = item?;
                let v = self.decode(&k, &raw)?;
                Ok((String::from_utf8_lossy(&k).into_owned(), v))
            })
            .collect()
    }

    /// The last record with `prefix`, by key order.
    pub fn last_with_prefix(&self, prefix: &str) -> Result<Option<(String, V)>, StoreError> {
        match self.tree.scan_prefix(prefix).next_back() {
            None => Ok(None),
            Some(item) => {
                let (k, raw) = item?;
                let v = self.decode(&k, &raw)?;
                Ok(Some((String::from_utf8_lossy(&k).into_owned(), v)))
            }
        }
    }

    /// The first key at or after `start`, if any: for walking the distinct
    /// prefixes of a tree by seeking past each, never reading the rest.
    pub fn first_key_from(&self, start: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .tree
            .range(start.as_bytes()..)
            .keys()
            .next()
            .transpose()?
            .map(|k| String::from_utf8_lossy(&k).into_owned()))
    }

    /// The last record with a key in `start..end`, by key order.
    pub fn last_in_range(&self, start: &str, end: &str) -> Result<Option<(String, V)>, StoreError> {
        match self.tree.range(start..end).next_back() {
            None => Ok(None),
            Some(item) => {
                let (k, raw) = item?;
                let v = self.decode(&k, &raw)?;
                Ok(Some((String::from_utf8_lossy(&k).into_owned(), v)))
            }
        }
    }

    /// The first `n` records with `prefix`, in key order.
    pub fn first_with_prefix(
        &self,
        prefix: &str,
        n: usize,
    ) -> Result<Vec<(String, V)>, StoreError> {
        let mut out = Vec::with_capacity(n.min(1024));
        for item in self.tree.scan_prefix(prefix).take(n) {
            let (k, raw) = item?;
            let v = self.decode(&k, &raw)?;
            out.push((String::from_utf8_lossy(&k).into_owned(), v));
        }
        Ok(out)
    }

    /// Records with `prefix`, newest key first, while `keep` says so: the
    /// tail of an append-only, sequence-keyed log without reading all of it.
    pub fn scan_prefix_rev_while(
        &self,
        prefix: &str,
        mut keep: impl FnMut(&V) -> bool,
    ) -> Result<Vec<V>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(prefix).rev() {
            let (k, raw) = item?;
            let v = self.decode(&k, &raw)?;
            if !keep(&v) {
                break;
            }
            out.push(v);
        }
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
        use std::ops::Bound;
        let start = match after {
            // A cursor outside the prefix starts at the prefix (or past it).
            Some(a) if a.as_bytes() >= prefix.as_bytes() => Bound::Excluded(a.as_bytes().to_vec()),
            _ => Bound::Included(prefix.as_bytes().to_vec()),
        };
        let mut out = Vec::with_capacity(n.min(1024));
        for item in self.tree.range::<Vec<u8>, _>((start, Bound::Unbounded)) {
            if out.len() >= n {
                break;
            }
            let (k, raw) = item?;
            if !k.starts_with(prefix.as_bytes()) {
                break;
            }
            let key = String::from_utf8_lossy(&k).into_owned();
            let v = self.decode(&k, &raw)?;
            if keep(&key, &v) {
                out.push((key, v));
            }
        }
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
        let iter = match before {
            Some(b) => self.tree.range(..b.as_bytes()),
            None => self.tree.range::<&[u8], _>(..),
        };
        let mut out = Vec::with_capacity(n.min(1024));
        for item in iter.rev().take(n) {
            let (k, raw) = item?;
            let v = self.decode(&k, &raw)?;
            out.push((String::from_utf8_lossy(&k).into_owned(), v));
        }
        Ok(out)
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
        use std::ops::Bound;
        let start = Bound::Included(prefix.as_bytes().to_vec());
        // The first key past the prefix, or the cursor if it is lower: the
        // reverse scan starts inside the prefix, never above it.
        let end = match (before.map(str::as_bytes), prefix_end(prefix.as_bytes())) {
            (Some(b), Some(e)) if b > e.as_slice() => Bound::Excluded(e),
            (Some(b), _) => Bound::Excluded(b.to_vec()),
            (None, Some(e)) => Bound::Excluded(e),
            (None, None) => Bound::Unbounded,
        };
        if let (Bound::Excluded(e), Bound::Included(s)) = (&end, &start) {
            if e <= s {
                return Ok(Vec::new());
            }
        }
        let mut out = Vec::with_capacity(n.min(1024));
        for item in self.tree.range::<Vec<u8>, _>((start, end)).rev() {
            if out.len() >= n {
                break;
            }
            let (k, raw) = item?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let v = self.decode(&k, &raw)?;
            if keep(&key, &v) {
                out.push((key, v));
            }
        }
        Ok(out)
    }

    /// The first `n` records by key order.
    pub fn first(&self, n: usize) -> Result<Vec<(String, V)>, StoreError> {
        self.first_with_prefix("", n)
    }

    /// Records in the tree. sled counts by iterating, so this is O(n):
    /// for occasional housekeeping, not per request.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    pub fn values(&self) -> Result<Vec<V>, StoreError> {
        Ok(self.scan_prefix("")?.into_iter().map(|(_, v)| v).collect())
    }
}

/// The smallest key above every key that starts with `prefix`; `None` when
/// there is none (an empty prefix, or one of only 0xff bytes).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
