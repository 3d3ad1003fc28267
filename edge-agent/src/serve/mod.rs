//! Serving: ONNX Runtime sessions behind the Open Inference Protocol v2.
//!
//! [`ModelHost`] implements [`crate::serving::ModelServing`] (sync tells it
//! what to serve) and runs every request: checked against the model, queued
//! on a bounded per-version queue, batched with others along dim 0 when the
//! model allows, run by one of the version's session workers. [`router`]
//! is the REST API and `/metrics`; [`serve`] runs it on a listener.
//! [`grpc_service`] is the same protocol over gRPC, and [`serve_grpc`] runs
//! it on a listener of its own; both front ends share one request path.
//!
//! - `host`: the A/B swap and what serves now
//! - `loader`: sessions, signature check, warm-up
//! - `probe`: the manifest signature and health probe checks
//! - `pool`: per-version worker threads and their queue
//! - `policy`: when the batcher runs what is queued (pure)
//! - `batch`: joining and splitting tensors along dim 0
//! - `infer`: one request from arrival to answer
//! - `protocol`: the OIP v2 JSON bodies
//! - `http`: the axum routes
//! - `grpc`: the gRPC service (`inference.GRPCInferenceService`)
//! - `grpc_tensor`: gRPC tensors (raw bytes and typed contents) to and from [`Tensor`]s (pure)
//! - `metrics`: Prometheus counters and histograms
//! - `error`: request errors and their HTTP and gRPC answers
//! - `access`: the optional bearer token on both front ends
//!
//! [`Tensor`]: edgeloop_models::Tensor

pub mod access;
mod batch;
pub mod binary;
mod error;
mod grpc;
mod grpc_tensor;
mod host;
mod http;
mod infer;
mod loader;
mod metrics;
mod policy;
mod pool;
mod probe;
pub mod protocol;

pub use error::{ServeError, RETRY_AFTER_SECS, RETRY_PUSHBACK};
pub use grpc::{grpc_service, serve_grpc, serve_grpc_with_access, GrpcService};
pub use host::ModelHost;
pub use http::{router, serve, serve_app};
pub use infer::{new_request_id, InferRequest, InferResponse};
pub use policy::{decide, BatchPolicy, Flush};
