//! Model handling shared by every Edgeloop component: content digests, crash-safe
//! files, tensors, `.npz` data sets, the ONNX IR, and ONNX Runtime.
//!
//! This crate does no network I/O.

pub mod cuda;
pub mod dataset;
pub mod deps;
pub mod digest;
pub mod fs;
pub mod gpu_libs;
pub mod manifest;
pub mod names;
pub mod npz;
pub mod onnx;
pub mod package;
pub mod quantize;
pub mod runtime;
pub mod tensor;

pub use digest::{Digest, DigestError, Sha256Writer};
pub use tensor::{DType, Tensor};
