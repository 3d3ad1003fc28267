//! `edgeloop model quantize --benchmark-on DEVICE` (or
//! `--benchmark-selector SEL`): the gate's latency judged on the device
//! that will serve, not on this machine. Float and every candidate within
//! the accuracy budget are uploaded (content-addressed: a file the server
//! holds is not sent again) with one call's inputs (the health probe's),
//! the control plane queues a benchmark for the device, the device times
//! each model over its own channel as it would serve it, and the gate
//! chooses again with those timings (`judge_latency_on`).

use std::time::Duration;

use edgeloop_api::benchmarks::{BenchmarkModel, BenchmarkState, BenchmarkView, CreateBenchmark};
use edgeloop_api::client::poll_until;
use edgeloop_models::manifest::ManifestKey;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::package::{sign_for_benchmark, Identity};
use edgeloop_models::quantize::gate::{to_time_on_device, GateOutcome};

use super::api::{CliError, Client};

/// Which device times the models.
#[derive(Debug, Clone)]
pub enum Target {
    Device(String),
    Selector(String),
}

/// A model to time: its name, ONNX bytes and signed manifest (JSON).
pub struct ToTime {
    pub name: String,
    pub bytes: Vec<u8>,
    pub manifest: Vec<u8>,
}

/// Every model the device should time ([`to_time_on_device`]), encoded,
/// each with a manifest signed by `key`: a device runs only signed models,
/// benchmarks too.
pub fn models_to_time(
    outcome: &GateOutcome,
    float: &ir::ModelProto,
    identity: &Identity,
    key: &ManifestKey,
) -> anyhow::Result<Vec<ToTime>> {
    to_time_on_device(outcome, float)
        .into_iter()
        .map(|(name, model)| {
            let bytes = onnx::encode(model).map_err(|e| {
                anyhow::anyhow!("{name} cannot be sent to the device as one file: {e}")
            })?;
            let manifest = sign_for_benchmark(&bytes, model, identity.clone(), &name, key)?
                .to_json_pretty()?
                .into_bytes();
            Ok(ToTime {
                name,
                bytes,
                manifest,
            })
        })
        .collect()
}

/// Uploads the models and inputs, queues the benchmark and waits for it.
/// A benchmark that fails is an error naming why (fail closed: no choice
/// is made on timings that do not exist).
pub async fn time_on_device(
    client: &Client,
    target: &Target,
    models: Vec<ToTime>,
    inputs_npz: Vec<u8>,
    runs: u32,
    timeout_s: u32,
) -> Result<BenchmarkView, CliError> {
    let mut entries = Vec::with_capacity(models.len());
    for m in models {
        let artifact_digest = client.upload(m.bytes).await?;
        let manifest_digest = Some(client.upload(m.manifest).await?);
        entries.push(BenchmarkModel {
            name: m.name,
            artifact_digest,
            manifest_digest,
        });
    }
    let inputs_digest = client.upload(inputs_npz).await?;
    let (device, selector) = match target {
        Target::Device(d) => (Some(d.clone()), None),
        Target::Selector(s) => (None, Some(s.clone())),
    };
    let created: BenchmarkView = client
        .post(
            "/api/v1/benchmarks",
            &CreateBenchmark {
                device,
                selector,
                models: entries,
                inputs_digest,
                runs: Some(runs),
                timeout_seconds: Some(timeout_s),
            },
        )
        .await?;
    eprintln!(
        "benchmark {} queued on device {}; waiting for it to report",
        created.id, created.device
    );
    let path = format!("/api/v1/benchmarks/{}", created.id);
    // The server fails it at its deadline; a little longer here, so the
    // failure's reason is what this command reports.
    let wait = Duration::from_secs(u64::from(timeout_s) + 30);
    let done: BenchmarkView = poll_until(
        &format!("benchmark {}", created.id),
        Duration::from_millis(300),
        Some(wait),
        || async {
            let v: BenchmarkView = client.get(&path).await?;
            Ok::<_, CliError>(v.state.is_finished().then_some(v))
        },
    )
    .await?;
    if done.state == BenchmarkState::Failed {
        return Err(CliError::Server(format!(
            "benchmark {} on device {} failed: {}",
            done.id,
            done.device,
            done.reason.as_deref().unwrap_or("no reason given")
        )));
    }
    Ok(done)
}
