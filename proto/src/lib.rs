//! Edgeloop's versioned gRPC packages, and the Open Inference Protocol's. Generated code only, plus a few
//! conversions; nothing here does I/O.

#![allow(clippy::all, clippy::unwrap_used, missing_docs, rust_2018_idioms)]

pub mod codec;

pub mod common {
    pub mod v1 {
        tonic::include_proto!("edgeloop.common.v1");
    }
}

pub mod agent {
    pub mod v1 {
        tonic::include_proto!("edgeloop.agent.v1");
    }
}

pub mod bridge {
    pub mod v1 {
        tonic::include_proto!("edgeloop.bridge.v1");
    }
}

/// The Open Inference Protocol v2 gRPC service (`inference.GRPCInferenceService`,
/// as KServe and Triton define it): upstream's package name, so standard
/// clients (tritonclient.grpc) call it unchanged.
pub mod inference {
    tonic::include_proto!("inference");
}

pub use prost_types::Timestamp;

/// Converts a wall-clock time into a protobuf timestamp.
pub fn timestamp(t: std::time::SystemTime) -> Timestamp {
    Timestamp::from(t)
}

/// A protobuf timestamp as a time, `None` when absent or out of range (a
/// device's clock is not trusted to be sane).
pub fn to_time(ts: Option<Timestamp>) -> Option<time::OffsetDateTime> {
    let ts = ts?;
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}
