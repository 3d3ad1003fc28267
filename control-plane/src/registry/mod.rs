//! The registry wing: content-addressed artifacts, models and versions with
//! lineage, training checkpoints, and what serving a model costs.

pub mod artifact_cache;
pub mod artifacts;
pub mod checkpoints;
pub mod cost;
pub mod models;
pub mod package;
