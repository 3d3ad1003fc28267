//! The console API's boundary: the request and response types that cross
//! it (views, kept apart from the control plane's store records), the
//! engine-neutral training job spec, and the one typed client that the
//! CLI, the demo and the integration tests use.

#[cfg(feature = "client")]
pub mod client;
pub mod cost;
pub mod error;
pub mod pipelines;
pub mod spec;

#[cfg(feature = "client")]
pub use client::{ApiError, Client, ErrorKind};
