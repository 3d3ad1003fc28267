//! The api wing: the console REST API (axum) and the gRPC services (tonic).
//! Handlers parse and authorise, then call into `fleet` and `registry`.

pub mod grpc;
pub mod rest;
