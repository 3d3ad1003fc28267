//! Serving against the real ONNX Runtime and real models, over real HTTP
//! on loopback. One test binary: ONNX Runtime loads once per process.

#![allow(clippy::unwrap_used)]

mod activation;
mod common;
mod fuzz;
mod http_api;
mod load;
mod metrics;
