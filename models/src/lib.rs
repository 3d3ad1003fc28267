//! Model handling shared by every Edgeloop component: content digests today;
//! ONNX inspection, quantization and signed manifests as they land.
//!
//! This crate does no network I/O.

pub mod digest;
pub mod fs;

pub use digest::{Digest, DigestError, Sha256Writer};
