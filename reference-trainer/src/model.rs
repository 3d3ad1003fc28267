//! The two models, as named candle variables in ONNX's layouts.
//!
//! Parameter names and layouts are the ONNX initializers' (the ones
//! tools/train_mnist.py exports): conv weights `[out, in, kh, kw]`, dense
//! weights `[out, in]` used as `x @ w^T + b` (ONNX `Gemm` with `transB=1`).
//! So `weights.safetensors` and `model.onnx` hold the same tensors under the
//! same names, and export is a copy, not a conversion.

use std::collections::HashMap;

use candle_core::{DType, Device, Module, Tensor, Var, D};

use crate::rng::{self, Purpose};
use crate::Workload;

/// One parameter: its name, shape, and He fan-in (`None` for a bias, which
/// starts at zero).
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub shape: &'static [usize],
    pub fan_in: Option<usize>,
}

const fn weight(name: &'static str, shape: &'static [usize], fan_in: usize) -> ParamSpec {
    ParamSpec {
        name,
        shape,
        fan_in: Some(fan_in),
    }
}

const fn bias(name: &'static str, shape: &'static [usize]) -> ParamSpec {
    ParamSpec {
        name,
        shape,
        fan_in: None,
    }
}

/// Conv(8,3x3,p1) Relu MaxPool2 Conv(16,3x3,p1) Relu MaxPool2 Flatten
/// Gemm(784->64) Relu Gemm(64->10): tools/train_mnist.py's CNN.
pub const CNN: &[ParamSpec] = &[
    weight("conv1.weight", &[8, 1, 3, 3], 9),
    bias("conv1.bias", &[8]),
    weight("conv2.weight", &[16, 8, 3, 3], 72),
    bias("conv2.bias", &[16]),
    weight("fc1.weight", &[64, 784], 784),
    bias("fc1.bias", &[64]),
    weight("fc2.weight", &[10, 64], 64),
    bias("fc2.bias", &[10]),
];

/// Gemm(8->32) Relu Gemm(32->16) Relu Gemm(16->2): two logits (no rain,
/// rain) rather than one sigmoid output, so that accuracy is the argmax over
/// the output as for MNIST and the quantizer's gate evaluates both models
/// the same way.
pub const MLP: &[ParamSpec] = &[
    weight("fc1.weight", &[32, 8], 8),
    bias("fc1.bias", &[32]),
    weight("fc2.weight", &[16, 32], 32),
    bias("fc2.bias", &[16]),
    weight("fc3.weight", &[2, 16], 16),
    bias("fc3.bias", &[2]),
];

pub fn specs(workload: Workload) -> &'static [ParamSpec] {
    match workload {
        Workload::MnistCnn => CNN,
        Workload::RainfallMlp => MLP,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("weights: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("weights: no tensor {0:?}")]
    Missing(String),
    #[error("weights: {name:?} is {found:?} {dtype:?}, expected {expected:?} f32")]
    Shape {
        name: String,
        found: Vec<usize>,
        dtype: DType,
        expected: Vec<usize>,
    },
    #[error("weights: unexpected tensor {0:?}")]
    Unexpected(String),
}

#[derive(Debug, Clone)]
pub struct Model {
    pub workload: Workload,
    /// In [`specs`] order.
    pub params: Vec<(&'static str, Var)>,
}

impl Model {
    /// He-normal weights (`N(0, 2 / fan_in)`) from the stream
    /// `(seed, Init, parameter index)`, zero biases.
    pub fn init(workload: Workload, seed: u64) -> Result<Model, ModelError> {
        let params = specs(workload)
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let n: usize = spec.shape.iter().product();
                let values: Vec<f32> = match spec.fan_in {
                    Some(fan_in) => {
                        let std = (2.0 / fan_in as f64).sqrt();
                        let mut r = rng::stream(seed, Purpose::Init, i as u64);
                        (0..n).map(|_| (r.normal() * std) as f32).collect()
                    }
                    None => vec![0.0; n],
                };
                let t = Tensor::from_vec(values, spec.shape, &Device::Cpu)?;
                Ok((spec.name, Var::from_tensor(&t)?))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Model { workload, params })
    }

    /// From named tensors (a loaded `weights.safetensors`): exactly the
    /// workload's parameters, each f32 of its shape.
    pub fn from_tensors(
        workload: Workload,
        mut tensors: HashMap<String, Tensor>,
    ) -> Result<Model, ModelError> {
        let mut params = Vec::new();
        for spec in specs(workload) {
            let t = tensors
                .remove(spec.name)
                .ok_or_else(|| ModelError::Missing(spec.name.to_string()))?;
            if t.dims() != spec.shape || t.dtype() != DType::F32 {
                return Err(ModelError::Shape {
                    name: spec.name.to_string(),
                    found: t.dims().to_vec(),
                    dtype: t.dtype(),
                    expected: spec.shape.to_vec(),
                });
            }
            params.push((spec.name, Var::from_tensor(&t)?));
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(ModelError::Unexpected(extra.clone()));
        }
        Ok(Model { workload, params })
    }

    /// `weights.safetensors` bytes: parameter name -> tensor. safetensors
    /// sorts tensors by name and this writes no metadata, so equal weights
    /// give equal bytes.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, safetensors::SafeTensorError> {
        let named: Vec<(&str, &Tensor)> = self
            .params
            .iter()
            .map(|(n, v)| (*n, v.as_tensor()))
            .collect();
        safetensors::serialize(named, None)
    }

    pub fn from_safetensors(workload: Workload, bytes: &[u8]) -> Result<Model, ModelError> {
        let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?;
        Model::from_tensors(workload, tensors)
    }

    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.params.iter().map(|(_, v)| v)
    }

    fn p(&self, i: usize) -> &Tensor {
        self.params[i].1.as_tensor()
    }

    /// Logits `[N, classes]` for a batch `[N, 1, 28, 28]` or `[N, 8]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self.workload {
            Workload::MnistCnn => {
                let h = conv3x3(x, self.p(0), self.p(1))?.relu()?.max_pool2d(2)?;
                let h = conv3x3(&h, self.p(2), self.p(3))?.relu()?.max_pool2d(2)?;
                // NCHW flatten: ONNX Flatten's (channel, row, column) order.
                let h = h.flatten_from(1)?;
                let h = gemm(&h, self.p(4), self.p(5))?.relu()?;
                gemm(&h, self.p(6), self.p(7))
            }
            Workload::RainfallMlp => {
                let h = gemm(x, self.p(0), self.p(1))?.relu()?;
                let h = gemm(&h, self.p(2), self.p(3))?.relu()?;
                gemm(&h, self.p(4), self.p(5))
            }
        }
    }

    /// The logits of `samples` (row-major features), in batches so that
    /// memory stays small, as a flat row-major `Vec`.
    pub fn logits(&self, x: &[f32], sample_shape: &[usize]) -> candle_core::Result<Vec<f32>> {
        let d: usize = sample_shape.iter().product();
        let mut out = Vec::new();
        for chunk in x.chunks(500 * d) {
            let mut shape = vec![chunk.len() / d];
            shape.extend_from_slice(sample_shape);
            let xb = Tensor::from_slice(chunk, shape, &Device::Cpu)?;
            out.extend(self.forward(&xb)?.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }
}

/// 3x3 convolution, stride 1, padding 1, plus a per-channel bias.
fn conv3x3(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let y = x.conv2d(w, 1, 1, 1, 1)?;
    y.broadcast_add(&b.reshape((1, b.dim(0)?, 1, 1))?)
}

/// ONNX `Gemm(x, w, b, transB=1)`: `x @ w^T + b`.
fn gemm(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::Linear::new(w.clone(), Some(b.clone())).forward(x)
}

/// Mean cross-entropy of `logits` against `labels`, and how many argmax
/// predictions are right.
pub fn loss_and_hits(logits: &Tensor, labels: &Tensor) -> candle_core::Result<(Tensor, usize)> {
    let loss = candle_nn::loss::cross_entropy(logits, labels)?;
    let hits = logits
        .argmax(D::Minus1)?
        .eq(labels)?
        .to_dtype(DType::U32)?
        .sum_all()?
        .to_scalar::<u32>()? as usize;
    Ok((loss, hits))
}

/// Argmax per row of flat `[N, classes]` logits.
pub fn argmax_rows(logits: &[f32], classes: usize) -> Vec<usize> {
    logits
        .chunks(classes)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                    if v > best.1 {
                        (i, v)
                    } else {
                        best
                    }
                })
                .0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_is_seeded_and_weights_round_trip_through_safetensors() {
        for workload in [Workload::MnistCnn, Workload::RainfallMlp] {
            let a = Model::init(workload, 1).unwrap();
            let b = Model::init(workload, 1).unwrap();
            let c = Model::init(workload, 2).unwrap();
            let bytes = a.to_safetensors().unwrap();
            assert_eq!(bytes, b.to_safetensors().unwrap());
            assert_ne!(bytes, c.to_safetensors().unwrap());
            let back = Model::from_safetensors(workload, &bytes).unwrap();
            assert_eq!(back.to_safetensors().unwrap(), bytes);
            // The other workload's weights are refused, naming the tensor.
            let other = match workload {
                Workload::MnistCnn => Workload::RainfallMlp,
                Workload::RainfallMlp => Workload::MnistCnn,
            };
            let e = Model::from_safetensors(other, &bytes).unwrap_err();
            assert!(e.to_string().contains("weights"), "{e}");
        }
    }

    #[test]
    fn forward_shapes() {
        let cnn = Model::init(Workload::MnistCnn, 0).unwrap();
        let x = Tensor::zeros((3, 1, 28, 28), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(cnn.forward(&x).unwrap().dims(), &[3, 10]);
        let mlp = Model::init(Workload::RainfallMlp, 0).unwrap();
        let x = Tensor::zeros((5, 8), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(mlp.forward(&x).unwrap().dims(), &[5, 2]);
        assert_eq!(mlp.logits(&vec![0.0; 8 * 1001], &[8]).unwrap().len(), 2002);
        assert_eq!(argmax_rows(&[0.0, 1.0, 3.0, -1.0], 2), vec![1, 0]);
    }
}
