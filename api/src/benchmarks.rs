//! Device benchmarks as the console API shows them (`/api/v1/benchmarks`):
//! time candidate models on one enrolled device, over the channel the
//! device already keeps open to the control plane, as that device would
//! serve them. The quantization gate judges latency with these timings
//! (`edgeloop model quantize --benchmark-on`) instead of the quantizing
//! host's, which is not the device. The store's record and the rules are in
//! `control-plane/src/fleet/benchmarks/`.

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Most models one benchmark times.
pub const MAX_MODELS: usize = 16;
/// Timed calls per model: the default and the bounds.
pub const DEFAULT_RUNS: u32 = 50;
pub const MAX_RUNS: u32 = 10_000;
/// Seconds the device has before the benchmark fails: default and bounds.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 600;
pub const MIN_TIMEOUT_SECONDS: u32 = 5;
pub const MAX_TIMEOUT_SECONDS: u32 = 86_400;

/// One model to time: a name the results use, and its uploaded artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BenchmarkModel {
    /// Unique within the benchmark: `float`, `int8-static-entropy`, ...
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63,
            example = "fp16"
        )
    )]
    pub name: String,
    /// sha256 of an uploaded ONNX artifact (`PUT /api/v1/artifacts/{digest}`).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub artifact_digest: Digest,
    /// sha256 of an uploaded signed manifest describing the artifact. A
    /// device runs only models signed by a key it trusts (unless it allows
    /// unsigned ones), benchmarks too: without one it reports the model as
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub manifest_digest: Option<Digest>,
}

/// `POST /api/v1/benchmarks`. The device is named (`device`), or chosen
/// from a hardware class (`selector`, the deployment selector grammar):
/// the representative is the matching device seen most recently, online;
/// ties go to the lower id. Exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateBenchmark {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 1024,
            example = "edgeloop.io/provider=CUDAExecutionProvider"
        )
    )]
    pub selector: Option<String>,
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 16))]
    pub models: Vec<BenchmarkModel>,
    /// sha256 of an uploaded `.npz`: one array per model input, the tensors
    /// of one call (the health probe's inputs are such a file).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub inputs_digest: Digest,
    /// Timed calls per model, after warm-up (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
    pub runs: Option<u32>,
    /// Seconds the device has to report before the benchmark fails
    /// (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 5, maximum = 86400))]
    pub timeout_seconds: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BenchmarkState {
    /// Queued; the device has not received it yet.
    Pending,
    /// Sent to the device.
    Running,
    Succeeded,
    /// The device could not run it, or did not report in time.
    Failed,
}

impl BenchmarkState {
    pub fn is_finished(self) -> bool {
        matches!(self, BenchmarkState::Succeeded | BenchmarkState::Failed)
    }
}

/// One model's timing on the device. A model that could not be fetched,
/// loaded or run has `error` and no latencies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelTiming {
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub artifact_digest: Digest,
    /// Median single-call latency, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p90_ms: Option<f64>,
    pub runs: u32,
    /// The execution provider the session ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A benchmark and, once finished, its results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BenchmarkView {
    pub id: String,
    /// The device it runs on.
    pub device: String,
    /// The hardware class the device was chosen from, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// What asked for it when not the console API: a retraining
    /// pipeline's Quantize step (`p-7/quantize/1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    pub state: BenchmarkState,
    pub models: Vec<BenchmarkModel>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub inputs_digest: Digest,
    pub runs: u32,
    pub timeout_seconds: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When the device received it.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_at: Option<OffsetDateTime>,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub finished_at: Option<OffsetDateTime>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The device's machine in words, as it reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_on: Option<String>,
    /// One per model, in the request's order, once succeeded.
    #[serde(default)]
    pub results: Vec<ModelTiming>,
}

impl BenchmarkView {
    /// Each model's median latency by name, or the device's reason it could
    /// not run it: what the gate's `judge_latency_on` takes.
    pub fn timings(&self) -> std::collections::BTreeMap<String, Result<f64, String>> {
        self.results
            .iter()
            .map(|t| {
                let timing = match (t.latency_p50_ms, &t.error) {
                    (Some(ms), None) => Ok(ms),
                    (_, Some(e)) => Err(e.clone()),
                    (None, None) => Err("no latency reported".into()),
                };
                (t.name.clone(), timing)
            })
            .collect()
    }

    /// Where the timings were taken, in words, for the evidence.
    pub fn timed_on(&self) -> String {
        let provider = self
            .results
            .iter()
            .find_map(|t| t.execution_provider.clone())
            .unwrap_or_else(|| "unknown provider".into());
        format!(
            "device {} ({}; {provider}), benchmark {}, {} runs per model",
            self.device,
            self.timed_on.as_deref().unwrap_or("machine not reported"),
            self.id,
            self.runs
        )
    }
}
