//! The store: typed trees of JSON values, fences, ids and a schema version,
//! over a byte-level key-value backend ([`backend::KvBackend`]): embedded
//! sled under `--data-dir` by default, or PostgreSQL with `--store-url`.
//! Values are JSON so that fields can be added without a migration.
//!
//! The store names no record type: each wing opens the trees it owns
//! ([`Store::tree`], e.g. `fleet::Trees`), and the control plane's `db::Db`
//! holds them all.

mod backend;
pub mod latency;
mod pg;
mod reads;
mod sled_backend;
#[cfg(test)]
mod tests;
mod tree;

use std::path::Path;
use std::sync::Arc;

pub use pg::{urgent, PostgresUrl, StoreUrlError, TestDatabase};
pub use reads::{ReadCounts, TreeReads};
pub use tree::Tree;

use backend::{FenceCheck, KvBackend};

/// The record schema this binary reads and writes. Bump it with a migration
/// in [`Store::open_backend`] when a change is not additive. (PostgreSQL's
/// tables have their own versioned migrations, `store/pg/schema.rs`.)
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the store was written by a newer Edgeloop (schema {found}); this binary knows schema {supported}. \
         Upgrade the binary, or point it at another --data-dir or --store-url"
    )]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("schema version key is corrupt ({0} bytes)")]
    SchemaCorrupt(usize),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    /// PostgreSQL answered with an error, or the connection broke during
    /// the call (then whether a write happened is unknown, and the next
    /// call reconnects).
    #[error("store (PostgreSQL): {0}")]
    Postgres(#[from] ::postgres::Error),
    /// The store cannot be reached: no connection to PostgreSQL could be
    /// made, or its connection threads are gone.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("record {key} in {tree} is corrupt: {source}")]
    Corrupt {
        tree: String,
        key: String,
        source: serde_json::Error,
    },
    /// A batch named one key twice (see [`backend::Swap`]).
    #[error("a batch of writes to {tree} names {key} twice")]
    DuplicateKey { tree: String, key: String },
    #[error("encoding a record for {tree}: {source}")]
    Encode {
        tree: String,
        source: serde_json::Error,
    },
}

/// A background task's fencing token, as its leader writes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The task's lease name (the control plane's `leader::Task::name`).
    pub task: &'static str,
    pub token: u64,
}

impl Fence {
    /// The value the fence record holds while this token is current.
    fn encoded(self) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(&self.token).map_err(|source| StoreError::Encode {
            tree: "fences".into(),
            source,
        })
    }

    fn check(self, encoded: &[u8]) -> FenceCheck<'_> {
        FenceCheck {
            tree: "fences",
            key: self.task.as_bytes(),
            value: encoded,
        }
    }
}

/// Why [`Store::update_fenced`] wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotWritten<E> {
    /// The update function refused.
    Refused(E),
    /// The fence has moved on: a newer leader holds the task.
    FencedOut(Fence),
}

#[derive(Clone)]
pub struct Store {
    db: Arc<dyn KvBackend>,
    reads: Arc<reads::ReadCounters>,
    /// Background tasks' fencing tokens, by task (`leader`): raised before
    /// a new leader acts, checked by its writes ([`Store::update_fenced`]).
    pub fences: Tree<u64>,
}

impl Store {
    /// Opens (or creates) the embedded sled store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_backend(Arc::new(sled_backend::SledBackend::open(path)?))
    }

    /// Opens the PostgreSQL store at `url`, migrating its tables first (see
    /// `store/pg/schema.rs`). Blocking, like [`Store::open`].
    pub fn open_postgres(url: &PostgresUrl) -> Result<Self, StoreError> {
        Self::open_backend(Arc::new(pg::PostgresBackend::open(url)?))
    }

    fn open_backend(db: Arc<dyn KvBackend>) -> Result<Self, StoreError> {
        match db.schema_version()? {
            None => db.set_schema_version(SCHEMA_VERSION)?,
            Some(found) if found > SCHEMA_VERSION => {
                return Err(StoreError::SchemaTooNew {
                    found,
                    supported: SCHEMA_VERSION,
                })
            }
            // found < SCHEMA_VERSION: migrations go here when there are any.
            Some(_) => {}
        }
        let db_ref: &dyn KvBackend = &*db;
        let reads = Arc::new(reads::ReadCounters::default());
        Ok(Self {
            fences: Tree::open(db_ref, &reads, "fences")?,
            db,
            reads,
        })
    }

    /// `tree.update(key, f)` as a background task's leader holding the
    /// fencing token `fence` (`None`: not a leased task's write, a plain
    /// update): applied only while the task's fence still holds that
    /// token, atomically with the check.
    pub fn update_fenced<V, E>(
        &self,
        tree: &Tree<V>,
        fence: Option<Fence>,
        key: &str,
        f: impl FnMut(Option<V>) -> Result<V, E>,
    ) -> Result<Result<V, NotWritten<E>>, StoreError>
    where
        V: serde::Serialize + serde::de::DeserializeOwned,
    {
        let Some(fence) = fence else {
            return Ok(tree.update(key, f)?.map_err(NotWritten::Refused));
        };
        let value = fence.encoded()?;
        Ok(tree
            .update_fenced(&*self.db, fence.check(&value), key, f)?
            .map_err(|e| e.map_or(NotWritten::FencedOut(fence), NotWritten::Refused)))
    }

    /// [`Store::update_fenced`] of many distinct keys of one tree in a few
    /// backend calls instead of a few per key (see [`Tree::update_many`]):
    /// a rollout wave's assignments. Per key, in `keys`' order.
    #[allow(clippy::type_complexity)]
    pub fn update_many_fenced<V, E>(
        &self,
        tree: &Tree<V>,
        fence: Option<Fence>,
        keys: &[&str],
        f: impl FnMut(&str, Option<V>) -> Result<V, E>,
    ) -> Result<Vec<Result<V, NotWritten<E>>>, StoreError>
    where
        V: serde::Serialize + serde::de::DeserializeOwned,
    {
        let value = fence.map(|f| f.encoded()).transpose()?;
        let check = fence.zip(value.as_deref()).map(|(f, v)| (f, f.check(v)));
        tree.update_many(&*self.db, check, keys, f)
    }

    /// The tree `name` of values `V`, created when new. A wing opens its
    /// trees once (e.g. `fleet::Trees::open`); the name is part of the
    /// on-disk format.
    pub fn tree<V>(&self, name: &str) -> Result<Tree<V>, StoreError>
    where
        V: serde::Serialize + serde::de::DeserializeOwned,
    {
        Tree::open(&*self.db, &self.reads, name)
    }

    /// Makes every write so far durable. Called before acknowledging a write
    /// that the caller must not lose (a token, an enrollment, a record).
    ///
    /// sled: a group commit of its log on the blocking pool
    /// (`SledBackend::flush`). PostgreSQL: nothing to do, every write is
    /// its own transaction, durable when it returns (`synchronous_commit`
    /// on); callers keep calling it, so each write path is correct on both.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().await
    }

    /// A number never handed out before by this store, increasing, also
    /// across restarts (sled persists its counter; PostgreSQL: a sequence).
    /// What every tree has read from the backend so far (calls, records,
    /// bytes): diff two snapshots to see what one piece of work read.
    pub fn read_counts(&self) -> ReadCounts {
        self.reads.snapshot()
    }

    /// Appends the backend's statistics (PostgreSQL: how long store calls
    /// waited for a connection and ran, by lane) to `/metrics` text.
    pub fn write_metrics(&self, out: &mut String) {
        self.db.write_metrics(out);
    }

    pub fn next_id(&self) -> Result<u64, StoreError> {
        self.db.next_id()
    }

    /// Cheap liveness probe for `/readyz`.
    pub fn check(&self) -> Result<(), StoreError> {
        self.db.check()
    }

    #[doc(hidden)]
    /// For tests of the schema check: pretend a newer binary wrote this store.
    pub fn force_schema_version(&self, v: u32) -> Result<(), StoreError> {
        self.db.set_schema_version(v)
    }
}
