//! The registry wing: content-addressed artifacts, models and versions with
//! lineage, their aliases, and training checkpoints. Artifacts live in the
//! data dir (`artifacts`) or in S3 (`s3`).

pub mod aliases;
pub mod artifact_cache;
pub mod artifacts;
pub mod checkpoints;
pub mod models;
pub mod s3;
pub mod unreliable;
