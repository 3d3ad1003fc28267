//! The lifecycle wing's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
    /// Training jobs, by id.
    pub jobs: Tree<super::jobs::JobRecord>,
    /// Each model's retraining policy, by model.
    pub retraining: Tree<super::retrain::RetrainingConfig>,
    /// Retraining pipelines, by id (`p-<seq>`).
    pub pipelines: Tree<super::pipeline::Pipeline>,
    /// The pipeline that holds each model's one retraining slot, by model.
    pub pipeline_active: Tree<String>,
    /// What each model's drift is measured against, by model.
    pub drift_reference: Tree<super::retrain::ReferenceRecord>,
    /// Each model's retraining triggers, by model.
    pub triggers: Tree<super::triggers::config::TriggersConfig>,
    /// What the trigger task last saw and decided, by model.
    pub trigger_state: Tree<super::triggers::runner::TriggerStateRecord>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            jobs: store.tree("jobs")?,
            retraining: store.tree("retraining")?,
            pipelines: store.tree("pipelines")?,
            pipeline_active: store.tree("pipeline_active")?,
            drift_reference: store.tree("drift_reference")?,
            triggers: store.tree("triggers")?,
            trigger_state: store.tree("trigger_state")?,
        })
    }
}
