//! Edgeloop's CPU reference trainer (`edgeloop-train`): two small real
//! workloads that exercise the checkpoint contract end to end
//! (docs/checkpoint-contract.md).
//!
//! - `mnist-cnn`: tools/train_mnist.py's CNN on real MNIST digits.
//! - `rainfall-mlp`: a binary MLP on the NOAA rainfall table.
//!
//! A run checkpoints `step-<N>/` (`weights.safetensors`,
//! `optimizer.safetensors`, `state.json`, then `manifest.json`), reports
//! progress, and at its last step also exports `model.onnx` with the models
//! crate, with `eval.npz`, `calib.npz` and `metrics.json` beside it.
//!
//! # Bit-for-bit resume
//!
//! A run stopped after any checkpoint and resumed from it in a new process
//! produces the same per-step losses and byte-identical final weights as one
//! that never stopped. That holds because:
//! - every random draw is keyed by `(seed, purpose, step or epoch)`
//!   ([`rng`]), so the data order and augmentation of step `s` do not
//!   depend on where the process started;
//! - the optimizer's whole state (Adam's `m`, `v`, `t`) is saved
//!   ([`optim`]), and the learning rate is a pure function of the step;
//! - weights and moments are stored as raw f32 (safetensors) and hashed;
//! - candle's CPU kernels are deterministic for a given thread count: no
//!   atomics, each parallel task owns its output elements, and reductions
//!   run in a fixed order. With candle 0.9.2, 1 and 2 threads even gave
//!   identical weights, but nothing in candle promises that, and a restart
//!   on a node with more cores must not change the result. So the count is
//!   pinned to the `threads` hyperparameter (default 1, recorded in
//!   `state.json`) through `RAYON_NUM_THREADS`, which sizes rayon's pool and
//!   is what candle's matmul passes to gemm. (CPUs with other instruction
//!   sets, AVX-512 against AVX2 say, may still round differently: gemm
//!   picks its kernels at run time.)
//!
//! # Why candle
//!
//! Pure Rust on the CPU with autograd: no libtorch, no Python, no BLAS, no
//! system libraries, so the trainer builds wherever the workspace builds and
//! its arithmetic is the same on every run. Default features are off (no
//! MKL, accelerate, CUDA or Metal).

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod export;
pub mod model;
pub mod optim;
pub mod report;
pub mod rng;
pub mod stop;
pub mod train;

use serde::{Deserialize, Serialize};

/// Which model on which data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// tools/train_mnist.py's CNN on MNIST digits (10 classes).
    MnistCnn,
    /// An MLP on the NOAA rainfall table: rain or not (2 classes).
    RainfallMlp,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::MnistCnn => "mnist-cnn",
            Workload::RainfallMlp => "rainfall-mlp",
        }
    }

    pub fn classes(self) -> usize {
        match self {
            Workload::MnistCnn => 10,
            Workload::RainfallMlp => 2,
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
