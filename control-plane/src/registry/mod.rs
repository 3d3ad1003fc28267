//! The registry wing: content-addressed artifacts, models and versions with
//! lineage, their aliases, and training checkpoints.

pub mod aliases;
pub mod artifact_cache;
pub mod artifacts;
pub mod checkpoints;
pub mod models;
pub mod unreliable;
