//! The registry wing: content-addressed artifacts, models and versions with
//! lineage, their aliases, and training checkpoints. Artifacts live in the
//! data dir (`artifacts`) or in S3 (`s3`).

pub mod aliases;
pub mod artifact_cache;
pub mod artifacts;
pub mod checkpoints;
pub mod models;
pub mod s3;
mod trees;
/// Fault injection for the crash tests: compiled only with the `testing`
/// feature (the integration tests turn it on), never into a release build.
#[cfg(any(test, feature = "testing"))]
pub mod unreliable;

pub use trees::Trees;

/// The crash tests' switch for [`unreliable`]; named here too so that a
/// binary built without it can refuse the setting instead of ignoring it.
pub const FAULT_INJECTION_ENV: &str = "EDGELOOP_FAULT_ARTIFACT_STORE";
