//! Quantization: static int8 (QDQ, calibrated), dynamic int8, float16, and
//! the accuracy gate that picks which of them, if any, ships.

pub mod calibrate;
mod constants;
pub mod detect;
mod dynamic;
pub mod evaluate;
pub mod evidence;
mod fp16;
pub mod gate;
mod graph;
pub mod params;
mod qdq;
pub mod task;

use serde::{Deserialize, Serialize};

pub use calibrate::{calibrate, CalibrationMethod};
pub use constants::hoist_constants;
pub use dynamic::{quantize_dynamic, DynamicOptions};
pub use fp16::{convert_fp16, Fp16Options, KEEP_FP32};
pub use qdq::{calibration_targets, quantize_static, StaticOptions};

/// A node that stayed in float, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FloatNode {
    pub node: String,
    pub op_type: String,
    pub reason: String,
}

/// What a quantizer did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub quantized_nodes: Vec<String>,
    pub left_in_float: Vec<FloatNode>,
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error("model has no graph")]
    NoGraph,
    #[error("default opset {0} is too old for QuantizeLinear (need 10 or later)")]
    OpsetTooOld(i64),
    #[error("no calibration range for tensor {0:?}")]
    MissingRange(String),
    #[error("calibration data: {0}")]
    Data(String),
    #[error(transparent)]
    Tensor(#[from] crate::onnx::TensorError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Encode(#[from] crate::onnx::EncodeError),
    /// Writing a model over 2 GiB with external data, to run it from a file.
    #[error(transparent)]
    Save(#[from] crate::onnx::SaveError),
    #[error("temporary directory for a model over 2 GiB: {0}")]
    TempDir(std::io::Error),
}
