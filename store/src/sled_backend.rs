//! The embedded backend: one sled database under `--data-dir`.

use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::backend::{distinct_keys, Entry, FenceCheck, FencedCas, KvBackend, KvTree, Range, Swap};
use super::StoreError;

/// Where sled keeps the schema version: its default tree, as before there
/// were backends, so existing data dirs read unchanged.
const SCHEMA_KEY: &[u8] = b"schema_version";
/// sled's page cache. Records are small JSON; the hot set (members,
/// assignments, statuses of 10 000 devices) is a few tens of MiB.
const STORE_CACHE_BYTES: u64 = 128 << 20;

pub struct SledBackend {
    db: sled::Db,
    flusher: Flusher,
}

/// Group commit: callers that ask for a flush while one runs share the
/// next one, so a burst of N acknowledged writes costs a few fsyncs, not
/// N flushes on N blocking threads.
#[derive(Default)]
struct Flusher {
    /// Flush requests so far; a request's number is taken after its write.
    requested: AtomicU64,
    /// Every request numbered up to this is durable.
    completed: AtomicU64,
    /// One flush at a time.
    running: tokio::sync::Mutex<()>,
}

impl SledBackend {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = edgeloop_client_core::sled_open::open_waiting_for_lock(
            &sled::Config::new()
                .path(path)
                // sled's default page cache is 1 GiB, which alone would
                // spend the control plane's memory budget at fleet scale.
                .cache_capacity(STORE_CACHE_BYTES),
        )?;
        Ok(Self {
            db,
            flusher: Flusher::default(),
        })
    }
}

#[async_trait::async_trait]
impl KvBackend for SledBackend {
    fn open_tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StoreError> {
        Ok(Arc::new(SledTree(self.db.open_tree(name)?)))
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        Ok(self.db.generate_id()?)
    }

    fn compare_and_swap_fenced(
        &self,
        tree: &str,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
        fence: FenceCheck<'_>,
    ) -> Result<FencedCas, StoreError> {
        use sled::transaction::{abort, TransactionError};
        use sled::Transactional;
        let (data, fences) = (self.db.open_tree(tree)?, self.db.open_tree(fence.tree)?);
        let r = (&data, &fences).transaction(|(d, f)| {
            if f.get(fence.key)?.as_deref() != Some(fence.value) {
                return abort(FencedCas::Fenced);
            }
            if d.get(key)?.as_deref() != old {
                return abort(FencedCas::Changed);
            }
            match new {
                Some(n) => d.insert(key, n)?,
                None => d.remove(key)?,
            };
            Ok(())
        });
        match r {
            Ok(()) => Ok(FencedCas::Swapped),
            Err(TransactionError::Abort(outcome)) => Ok(outcome),
            Err(TransactionError::Storage(e)) => Err(e.into()),
        }
    }

    /// One sled transaction over the tree and the fences: sled's
    /// transactions are serializable, so the batch sees one state of both.
    fn compare_and_swap_many(
        &self,
        tree: &str,
        swaps: &[Swap<'_>],
        fence: Option<FenceCheck<'_>>,
    ) -> Result<Vec<FencedCas>, StoreError> {
        use sled::transaction::{abort, TransactionError, TransactionalTree};
        use sled::Transactional;
        distinct_keys(tree, swaps)?;
        let apply = |d: &TransactionalTree| {
            let mut out = Vec::with_capacity(swaps.len());
            for s in swaps {
                if d.get(s.key)?.as_deref() != s.old {
                    out.push(FencedCas::Changed);
                    continue;
                }
                match s.new {
                    Some(n) => d.insert(s.key, n)?,
                    None => d.remove(s.key)?,
                };
                out.push(FencedCas::Swapped);
            }
            Ok(out)
        };
        let data = self.db.open_tree(tree)?;
        let r = match fence {
            None => data.transaction(|d| apply(d)),
            Some(fence) => {
                let fences = self.db.open_tree(fence.tree)?;
                (&data, &fences).transaction(|(d, f)| {
                    if f.get(fence.key)?.as_deref() != Some(fence.value) {
                        return abort(());
                    }
                    apply(d)
                })
            }
        };
        match r {
            Ok(out) => Ok(out),
            Err(TransactionError::Abort(())) => Ok(vec![FencedCas::Fenced; swaps.len()]),
            Err(TransactionError::Storage(e)) => Err(e.into()),
        }
    }

    /// sled 0.34's `flush_async` can leave concurrent callers waiting
    /// forever (spacejam/sled#1308; seen here with 1 000 devices reporting
    /// at once), so the blocking flush runs on the blocking pool, and
    /// concurrent callers share flushes ([`Flusher`]).
    async fn flush(&self) -> Result<(), StoreError> {
        let f = &self.flusher;
        let mine = f.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let _turn = f.running.lock().await;
        if f.completed.load(Ordering::SeqCst) >= mine {
            // A flush that began after this request covered it.
            return Ok(());
        }
        // Every request numbered up to `covers` wrote before this point.
        let covers = f.requested.load(Ordering::SeqCst);
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| StoreError::Sled(sled::Error::Io(std::io::Error::other(e))))??;
        f.completed.fetch_max(covers, Ordering::SeqCst);
        Ok(())
    }

    fn check(&self) -> Result<(), StoreError> {
        self.db.get(SCHEMA_KEY)?;
        Ok(())
    }

    fn schema_version(&self) -> Result<Option<u32>, StoreError> {
        let Some(raw) = self.db.get(SCHEMA_KEY)? else {
            return Ok(None);
        };
        let bytes: [u8; 4] = raw
            .as_ref()
            .try_into()
            .map_err(|_| StoreError::SchemaCorrupt(raw.len()))?;
        Ok(Some(u32::from_be_bytes(bytes)))
    }

    fn set_schema_version(&self, version: u32) -> Result<(), StoreError> {
        self.db.insert(SCHEMA_KEY, &version.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }
}

struct SledTree(sled::Tree);

impl KvTree for SledTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.0.get(key)?.map(|v| v.to_vec()))
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.0.insert(key, value)?;
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        Ok(self.0.compare_and_swap(key, old, new)?.is_ok())
    }

    fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.0.remove(key)?.map(|v| v.to_vec()))
    }

    fn range(&self, r: Range<'_>) -> Result<Vec<Entry>, StoreError> {
        // sled panics on a range whose start is above its end; an empty
        // range reads nothing.
        if is_empty(r.lower, r.upper) {
            return Ok(Vec::new());
        }
        let iter = self.0.range::<&[u8], _>((r.lower, r.upper));
        let mut out = Vec::with_capacity(r.limit.min(1024));
        let mut push = |item: sled::Result<(sled::IVec, sled::IVec)>| -> Result<bool, StoreError> {
            let (k, v) = item?;
            out.push((k.to_vec(), v.to_vec()));
            Ok(out.len() < r.limit)
        };
        if r.limit > 0 {
            if r.reverse {
                for item in iter.rev() {
                    if !push(item)? {
                        break;
                    }
                }
            } else {
                for item in iter {
                    if !push(item)? {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    fn len(&self) -> Result<usize, StoreError> {
        Ok(self.0.len())
    }
}

/// Whether no key lies within the bounds.
fn is_empty(lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> bool {
    match (lower, upper) {
        (Bound::Included(l), Bound::Included(u)) => l > u,
        (Bound::Included(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u))
        | (Bound::Excluded(l), Bound::Excluded(u)) => l >= u,
        _ => false,
    }
}
