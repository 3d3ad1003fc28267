//! The console's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
    /// Console sessions, by the sha256 of their id.
    pub sessions: Tree<super::session::SessionRecord>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            sessions: store.tree("console_sessions")?,
        })
    }
}
