//! The registry wing's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
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
            models: store.tree("models")?,
            model_versions: store.tree("model_versions")?,
            model_aliases: store.tree("model_aliases")?,
            checkpoints: store.tree("checkpoints")?,
        })
    }
}
