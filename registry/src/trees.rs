//! The registry wing's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use std::ops::Deref;

use edgeloop_store::{Store, StoreError, Tree};

/// The registry's trees with the store they live in: what the registry's
/// functions take, so they need nothing of the server. `Deref`s to the
/// store for its `flush` and fenced updates, as the server's `Db` does.
#[derive(Clone)]
pub struct Trees {
    pub store: Store,
    /// Registered models, by name.
    pub models: Tree<super::models::ModelRecord>,
    /// Model versions, by `<model>/<version>`.
    pub model_versions: Tree<super::models::ModelVersionRecord>,
    /// Each model's aliases with their history, by `<model>/<alias>`.
    pub model_aliases: Tree<super::aliases::AliasRecord>,
    /// Training checkpoints, by job and step.
    pub checkpoints: Tree<super::checkpoints::CheckpointRecord>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            store: store.clone(),
            models: store.tree("models")?,
            model_versions: store.tree("model_versions")?,
            model_aliases: store.tree("model_aliases")?,
            checkpoints: store.tree("checkpoints")?,
        })
    }
}

impl Deref for Trees {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}
