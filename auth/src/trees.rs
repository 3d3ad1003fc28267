//! Authentication's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use std::ops::Deref;

use edgeloop_store::{Store, StoreError, Tree};

/// Auth's trees with the store they live in, which they `Deref` to for
/// `flush` and `next_id` (as the registry's do).
#[derive(Clone)]
pub struct Trees {
    pub store: Store,
    /// API tokens, by the sha256 of their secret.
    pub api_tokens: Tree<super::tokens::ApiTokenRecord>,
    /// The console audit log, by zero-padded sequence (append-only).
    pub audit: Tree<edgeloop_api::access::AuditEntry>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            store: store.clone(),
            api_tokens: store.tree("api_tokens")?,
            audit: store.tree("audit")?,
        })
    }
}

impl Deref for Trees {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}
