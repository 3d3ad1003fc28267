//! The console API's boundary: the request and response types that cross
//! it (views, kept apart from the control plane's store records), the
//! engine-neutral training job spec, and the one typed client that the
//! CLI, the demo and the integration tests use.

pub mod access;
pub mod aliases;
pub mod benchmarks;
#[cfg(feature = "client")]
pub mod client;
pub mod cost;
pub mod deployments;
pub mod drift;
pub mod error;
pub mod fleet;
pub mod images;
pub mod jobs;
pub mod pipelines;
pub mod registry;
pub mod samples;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod spec;
#[cfg(feature = "tls")]
pub mod tls;
pub mod triggers;

#[cfg(feature = "client")]
pub use client::{ApiError, Client, ErrorKind, Trust};

/// The response header that carries a list's next page cursor (the next
/// request's `after`).
pub const NEXT_CURSOR: &str = "edgeloop-next-cursor";

/// Unix seconds: how the lifecycle's records and views write times.
pub type UnixSeconds = i64;
