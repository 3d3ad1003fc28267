//! Authentication's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
    /// API tokens, by the sha256 of their secret.
    pub api_tokens: Tree<super::tokens::ApiTokenRecord>,
    /// The console audit log, by zero-padded sequence (append-only).
    pub audit: Tree<edgeloop_api::access::AuditEntry>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            api_tokens: store.tree("api_tokens")?,
            audit: store.tree("audit")?,
        })
    }
}
