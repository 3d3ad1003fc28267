//! Leadership's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
    /// What every replica of a shared store must agree on, by name
    /// (`check_shared_ca`).
    pub replica_settings: Tree<String>,
    /// Background tasks' leases, by task.
    pub leases: Tree<super::decide::Lease>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            replica_settings: store.tree("replica_settings")?,
            leases: store.tree("leases")?,
        })
    }
}
