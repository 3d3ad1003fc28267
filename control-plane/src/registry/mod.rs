//! The registry wing: content-addressed artifacts, models and versions with
//! lineage, and training checkpoints.

pub mod artifact_cache;
pub mod artifacts;
pub mod checkpoints;
pub mod models;
