//! The control plane's database: the record-agnostic [`Store`] and every
//! wing's trees over it, opened once at start.
//!
//! A wing's code reaches its own trees as `db.fleet.devices`,
//! `db.registry.model_versions`, …; what it needs of the store itself
//! (fenced updates, `flush`, `next_id`) through [`Db`]'s `Deref` to
//! [`Store`], so that `db.flush()` reads as it did when the store held the
//! trees. The store below knows bytes, trees, fences and backends only.

use std::ops::Deref;
use std::path::Path;

use crate::{fleet, leader, lifecycle};
use edgeloop_store::{PostgresUrl, Store, StoreError};

#[derive(Clone)]
pub struct Db {
    pub store: Store,
    pub fleet: fleet::Trees,
    pub registry: edgeloop_registry::Trees,
    pub drift: edgeloop_drift::Trees,
    pub lifecycle: lifecycle::Trees,
    pub auth: edgeloop_auth::Trees,
    pub console: edgeloop_console::Trees,
    pub leader: leader::Trees,
}

impl Db {
    /// Opens (or creates) the embedded sled store at `path` and its trees.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        Db::over(Store::open(path)?)
    }

    /// Opens the PostgreSQL store at `url` and its trees (see
    /// [`Store::open_postgres`]).
    pub fn open_postgres(url: &PostgresUrl) -> Result<Db, StoreError> {
        Db::over(Store::open_postgres(url)?)
    }

    /// Every wing's trees over `store`.
    pub fn over(store: Store) -> Result<Db, StoreError> {
        Ok(Db {
            fleet: fleet::Trees::open(&store)?,
            registry: edgeloop_registry::Trees::open(&store)?,
            drift: edgeloop_drift::Trees::open(&store)?,
            lifecycle: lifecycle::Trees::open(&store)?,
            auth: edgeloop_auth::Trees::open(&store)?,
            console: edgeloop_console::Trees::open(&store)?,
            leader: leader::Trees::open(&store)?,
            store,
        })
    }
}

impl Deref for Db {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}
