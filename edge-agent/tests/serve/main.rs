//! Serving against the real ONNX Runtime and real models, over real HTTP
//! and gRPC on loopback. One test binary: ONNX Runtime loads once per process.

#![allow(clippy::unwrap_used)]

mod activation;
mod big_model;
mod big_model_gen;
mod common;
mod fuzz;
mod grpc_api;
mod http_api;
mod load;
mod metrics;
