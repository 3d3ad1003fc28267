//! An in-memory cache of whole artifacts for device downloads. A rollout
//! sends the same model to thousands of devices at once; without a cache
//! each download reads the store again. With it the store is read once per
//! artifact (concurrent misses wait for one load), the bytes are checked
//! against their digest on the way in, and evicted least recently used
//! beyond a byte budget. Artifacts larger than one entry's limit stream
//! from the store as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use edgeloop_models::Digest;
use tokio::io::AsyncReadExt;
use tokio::sync::OnceCell;

use super::artifacts::{ArtifactError, ArtifactStore};

/// What the cache did, for `/metrics`.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Bytes read from the artifact store for device downloads, cached or not.
    pub store_read_bytes: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    /// Artifacts the compactor's garbage collection deleted from the store,
    /// and their bytes (the server's `retention::gc`).
    pub collected: AtomicU64,
    pub collected_bytes: AtomicU64,
}

struct Entry {
    cell: Arc<OnceCell<Bytes>>,
    /// A logical clock for least-recently-used eviction.
    used: u64,
}

struct Inner {
    entries: HashMap<Digest, Entry>,
    clock: u64,
}

pub struct ArtifactCache {
    budget_bytes: u64,
    max_entry_bytes: u64,
    inner: Mutex<Inner>,
    pub counters: CacheCounters,
}

impl ArtifactCache {
    /// `budget_bytes` 0 disables caching (every download reads the store).
    pub fn new(budget_bytes: u64) -> ArtifactCache {
        ArtifactCache {
            budget_bytes,
            // One artifact may take at most half the budget, so a second
            // one being rolled out at the same time still fits.
            max_entry_bytes: budget_bytes / 2,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                clock: 0,
            }),
            counters: CacheCounters::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether an artifact of `size` bytes is served from memory.
    pub fn admits(&self, size: u64) -> bool {
        size > 0 && size <= self.max_entry_bytes
    }

    /// The artifact if it is already in memory (a hit), without touching
    /// the store: the common case of a rollout, answered with no syscall.
    pub fn cached(&self, digest: Digest) -> Option<Bytes> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(&digest)?;
        let bytes = entry.cell.get()?.clone();
        entry.used = now;
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(bytes)
    }

    /// The whole artifact, from memory or loaded once from `store`.
    pub async fn get(
        &self,
        store: &dyn ArtifactStore,
        digest: Digest,
    ) -> Result<Bytes, ArtifactError> {
        let cell = {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            let entry = inner.entries.entry(digest).or_insert_with(|| Entry {
                cell: Arc::new(OnceCell::new()),
                used: now,
            });
            entry.used = now;
            entry.cell.clone()
        };
        if let Some(bytes) = cell.get() {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(bytes.clone());
        }
        let loaded = cell
            .get_or_try_init(|| async {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                self.load(store, digest).await
            })
            .await;
        match loaded {
            Ok(bytes) => {
                let bytes = bytes.clone();
                self.evict();
                Ok(bytes)
            }
            Err(e) => {
                // Nothing is kept for a failed load; the next call retries.
                let mut inner = self.lock();
                if inner
                    .entries
                    .get(&digest)
                    .is_some_and(|e| e.cell.get().is_none())
                {
                    inner.entries.remove(&digest);
                }
                Err(e)
            }
        }
    }

    async fn load(
        &self,
        store: &dyn ArtifactStore,
        digest: Digest,
    ) -> Result<Bytes, ArtifactError> {
        let (size, mut reader) = store.open_at(digest, 0).await?;
        let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        reader.read_to_end(&mut buf).await?;
        self.counters
            .store_read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        // The store checked the digest when it accepted the bytes; the disk
        // may have changed them since, and a device must never get that.
        let actual = Digest::of(&buf);
        if actual != digest {
            return Err(ArtifactError::DigestMismatch {
                expected: digest,
                actual,
            });
        }
        Ok(Bytes::from(buf))
    }

    /// Drops least recently used loaded entries beyond the budget.
    fn evict(&self) {
        let mut inner = self.lock();
        let mut total: u64 = inner
            .entries
            .values()
            .filter_map(|e| e.cell.get().map(|b| b.len() as u64))
            .sum();
        while total > self.budget_bytes {
            let oldest = inner
                .entries
                .iter()
                .filter(|(_, e)| e.cell.get().is_some())
                .min_by_key(|(_, e)| e.used)
                .map(|(d, e)| (*d, e.cell.get().map_or(0, |b| b.len() as u64)));
            let Some((digest, len)) = oldest else { break };
            inner.entries.remove(&digest);
            total -= len;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops `digest` (deleted from the store) if held; whether it was.
    /// A load in flight finishes for its callers and is not kept.
    pub fn forget(&self, digest: Digest) -> bool {
        self.lock().entries.remove(&digest).is_some()
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.lock()
            .entries
            .values()
            .filter_map(|e| e.cell.get().map(|b| b.len() as u64))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::LocalArtifactStore;

    async fn stored(store: &LocalArtifactStore, data: &[u8]) -> Digest {
        let digest = Digest::of(data);
        let chunk: Result<bytes::Bytes, ArtifactError> = Ok(bytes::Bytes::from(data.to_vec()));
        let body = Box::pin(futures::stream::iter([chunk]));
        let limits = crate::artifacts::UploadLimits {
            max_bytes: 1 << 30,
            declared_size: None,
        };
        store.put(digest, body, limits).await.unwrap();
        digest
    }

    #[tokio::test]
    async fn concurrent_downloads_read_the_store_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalArtifactStore::open(dir.path()).unwrap();
        let data = vec![7u8; 100_000];
        let digest = stored(&store, &data).await;
        let cache = Arc::new(ArtifactCache::new(1 << 20));
        let store = Arc::new(store);
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (cache, store) = (cache.clone(), store.clone());
            tasks.push(tokio::spawn(async move {
                cache.get(store.as_ref(), digest).await.unwrap()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().as_ref(), &data[..]);
        }
        let c = &cache.counters;
        assert_eq!(c.store_read_bytes.load(Ordering::Relaxed), 100_000);
        assert_eq!(c.misses.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn the_budget_evicts_least_recently_used_and_large_ones_stream() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalArtifactStore::open(dir.path()).unwrap();
        let a = stored(&store, &[1u8; 400]).await;
        let b = stored(&store, &[2u8; 400]).await;
        let c = stored(&store, &[3u8; 400]).await;
        let cache = ArtifactCache::new(1000);
        assert!(cache.admits(500) && !cache.admits(501) && !cache.admits(0));
        cache.get(&store, a).await.unwrap();
        cache.get(&store, b).await.unwrap();
        cache.get(&store, a).await.unwrap(); // a is now more recent than b
        cache.get(&store, c).await.unwrap(); // 1200 > 1000: b goes
        assert_eq!(cache.held_bytes(), 800);
        assert_eq!(cache.counters.evictions.load(Ordering::Relaxed), 1);
        let before = cache.counters.store_read_bytes.load(Ordering::Relaxed);
        cache.get(&store, a).await.unwrap();
        assert_eq!(
            cache.counters.store_read_bytes.load(Ordering::Relaxed),
            before
        );
        cache.get(&store, b).await.unwrap();
        assert_eq!(
            cache.counters.store_read_bytes.load(Ordering::Relaxed),
            before + 400
        );
    }

    #[tokio::test]
    async fn cached_answers_only_what_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalArtifactStore::open(dir.path()).unwrap();
        let digest = stored(&store, &[4u8; 200]).await;
        let cache = ArtifactCache::new(1 << 20);
        assert!(cache.cached(digest).is_none());
        cache.get(&store, digest).await.unwrap();
        assert_eq!(cache.cached(digest).unwrap().len(), 200);
        assert_eq!(cache.counters.hits.load(Ordering::Relaxed), 1);
        assert_eq!(cache.counters.store_read_bytes.load(Ordering::Relaxed), 200);
    }

    #[tokio::test]
    async fn a_forgotten_artifact_is_read_from_the_store_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalArtifactStore::open(dir.path()).unwrap();
        let digest = stored(&store, &[8u8; 100]).await;
        let cache = ArtifactCache::new(1 << 20);
        assert!(!cache.forget(digest), "not held yet");
        cache.get(&store, digest).await.unwrap();
        assert!(cache.forget(digest));
        assert_eq!(cache.held_bytes(), 0);
        assert!(cache.cached(digest).is_none());
        cache.get(&store, digest).await.unwrap();
        assert_eq!(cache.counters.misses.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_changed_file_is_refused_and_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalArtifactStore::open(dir.path()).unwrap();
        let digest = stored(&store, &[5u8; 300]).await;
        let cache = ArtifactCache::new(1 << 20);
        // Rot on disk after the store accepted the bytes.
        let path = walk(dir.path())
            .into_iter()
            .find(|p| p.ends_with(digest.to_hex()))
            .unwrap();
        std::fs::write(&path, [6u8; 300]).unwrap();
        let err = cache.get(&store, digest).await.unwrap_err();
        assert!(matches!(err, ArtifactError::DigestMismatch { .. }), "{err}");
        assert_eq!(cache.held_bytes(), 0);
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }
}
