//! The seam between model sync and serving: sync decides *what* serves
//! (downloads, verification, slots, status), serving decides *how* (ONNX
//! Runtime sessions, warm-up, health probe, the atomic swap).

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use edgeloop_models::manifest::Manifest;
use edgeloop_models::tensor::Tensor;

/// What to load next to the serving version of a model.
#[derive(Debug, Clone)]
pub struct PrepareSpec {
    pub model: String,
    pub version: String,
    /// The verified ONNX file in its slot.
    pub path: PathBuf,
    /// The verified manifest, when the version has one: its I/O signature is
    /// checked against the loaded session.
    pub manifest: Option<Manifest>,
    /// The health probe; `None` runs only a warm-up on zero inputs.
    pub probe: Option<ProbeSpec>,
}

/// The manifest's health probe with its sample inputs loaded.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    /// Named sample inputs (one batch).
    pub inputs: Vec<(String, Tensor)>,
    pub max_latency: Duration,
}

/// Why a version was not activated. The serving version is untouched.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ActivationError {
    #[error("loading the model: {0}")]
    Load(String),
    #[error("the model does not match its manifest: {0}")]
    Signature(String),
    #[error("health probe failed: {0}")]
    Probe(String),
}

/// A model timed as this device serves it ([`ModelServing::benchmark`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub runs: u32,
    /// The execution provider the session ran on.
    pub provider: String,
}

/// A version that serves now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    pub version: String,
    /// The execution provider in use (`CPUExecutionProvider`, `CUDAExecutionProvider`, ...).
    pub provider: String,
}

#[async_trait]
pub trait ModelServing: Send + Sync + 'static {
    /// Loads the version beside the serving one, warms it up and runs the
    /// probe; only when all pass does it swap atomically (requests in flight
    /// finish on the old version). Returns what now serves.
    async fn activate(&self, spec: PrepareSpec) -> Result<Serving, ActivationError>;
    /// What serves `model` now, if anything.
    fn serving(&self, model: &str) -> Option<Serving>;
    /// Stops serving `model` (it was unassigned).
    fn unload(&self, model: &str);
    /// Times the model at `path` as it would serve here, one call at a
    /// time on `inputs`, without serving it. The default cannot.
    async fn benchmark(
        &self,
        _path: PathBuf,
        _inputs: Vec<(String, Tensor)>,
        _runs: u32,
    ) -> Result<Timed, ActivationError> {
        Err(ActivationError::Load(
            "this serving backend cannot run benchmarks".into(),
        ))
    }
    /// This machine in words, for a benchmark's evidence.
    fn describe_host(&self) -> String {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!(
            "{} {}, {cpus} CPUs",
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    }
}
