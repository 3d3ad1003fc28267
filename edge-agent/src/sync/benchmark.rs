//! Benchmarks the control plane queues for this device: fetch each model
//! and the inputs over the agent's own channel (the same verified, resumable
//! downloads as assignments), time each model as this device serves it
//! ([`ModelServing::benchmark`]), report, and delete the files.
//!
//! One benchmark at a time, each id once per process; the stream
//! reconnects with backoff. Timing never touches what serves: a failure
//! is reported as that model's error, never fatal to the agent.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgeloop_client_core::Backoff;
use edgeloop_models::npz::Npz;
use edgeloop_models::tensor::Tensor;
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::assignment::Content;
use super::client::{is_refusal, ControlPlaneClient};
use super::download::{Downloader, Want};
use super::verify::Trust;
use crate::serving::ModelServing;
use edgeloop_models::manifest::MAX_SIGNED_MANIFEST_BYTES;

/// Largest inputs file taken (the control plane's limit too).
const MAX_INPUTS_BYTES: u64 = 64 << 20;
/// Benchmark ids remembered as done, so a reconnect does not run one twice.
const REMEMBERED: usize = 256;

pub struct Benchmarker {
    pub client: Arc<dyn ControlPlaneClient>,
    pub serving: Arc<dyn ModelServing>,
    pub downloader: Downloader,
    /// The keys models must be signed by, as for assignments.
    pub trust: Trust,
    /// Scratch space, emptied after each benchmark.
    pub dir: PathBuf,
    pub backoff: Backoff,
}

impl Benchmarker {
    /// Follows the benchmark stream until `shutdown`, or until the control
    /// plane says it has none (`Unimplemented`) or refuses this device.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut done: VecDeque<String> = VecDeque::new();
        let mut attempt: u32 = 0;
        loop {
            let opened = tokio::select! {
                r = self.client.watch_benchmarks() => r,
                _ = shutdown.cancelled() => return,
            };
            match opened {
                Ok(mut stream) => loop {
                    let item = tokio::select! {
                        item = stream.next() => item,
                        _ = shutdown.cancelled() => return,
                    };
                    match item {
                        Some(Ok(task)) => {
                            attempt = 0;
                            if done.contains(&task.id) {
                                continue;
                            }
                            let id = task.id.clone();
                            tokio::select! {
                                () = self.run_one(task) => {}
                                _ = shutdown.cancelled() => return,
                            }
                            done.push_back(id);
                            if done.len() > REMEMBERED {
                                done.pop_front();
                            }
                        }
                        Some(Err(status)) => {
                            if ends(&status) {
                                return;
                            }
                            break;
                        }
                        None => break,
                    }
                },
                Err(status) if ends(&status) => return,
                Err(status) => tracing::debug!(%status, "benchmark watch failed; retrying"),
            }
            let delay = self.backoff.next(attempt);
            attempt = attempt.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Runs one benchmark within its deadline and reports it.
    async fn run_one(&self, task: pb::BenchmarkTask) {
        let dir = self.dir.join(safe_id(&task.id));
        let deadline = Duration::from_secs(u64::from(task.timeout_seconds.max(1)));
        tracing::info!(benchmark = %task.id, models = task.models.len(), runs = task.runs, "benchmark");
        let report = match tokio::time::timeout(deadline, self.time_all(&task, &dir)).await {
            Ok(report) => report,
            Err(_) => pb::BenchmarkReport {
                id: task.id.clone(),
                error: format!("did not finish within {} s", deadline.as_secs()),
                timed_on: self.serving.describe_host(),
                ..Default::default()
            },
        };
        let _ = tokio::fs::remove_dir_all(&dir).await;
        self.send(report, deadline).await;
    }

    async fn time_all(&self, task: &pb::BenchmarkTask, dir: &Path) -> pb::BenchmarkReport {
        let mut report = pb::BenchmarkReport {
            id: task.id.clone(),
            timed_on: self.serving.describe_host(),
            ..Default::default()
        };
        let inputs = match self.inputs(task, dir).await {
            Ok(inputs) => inputs,
            Err(e) => {
                report.error = format!("benchmark inputs: {e}");
                return report;
            }
        };
        for model in &task.models {
            let timing = match self.time_model(model, &inputs, task.runs, dir).await {
                Ok(t) => t,
                Err(e) => pb::ModelTiming {
                    name: model.name.clone(),
                    error: e,
                    ..Default::default()
                },
            };
            report.timings.push(timing);
        }
        report
    }

    async fn inputs(
        &self,
        task: &pb::BenchmarkTask,
        dir: &Path,
    ) -> Result<Vec<(String, Tensor)>, String> {
        let digest: Digest = task.inputs_digest.parse().map_err(|e| format!("{e}"))?;
        let want = Want {
            what: "benchmark inputs",
            digest,
            size: Some(task.inputs_size),
            max_size: MAX_INPUTS_BYTES,
        };
        let path = self
            .downloader
            .fetch(dir, want)
            .await
            .map_err(|e| e.to_string())?;
        let bytes = tokio::fs::read(&path).await.map_err(|e| e.to_string())?;
        let npz = Npz::from_bytes(&bytes).map_err(|e| e.to_string())?;
        Ok(npz
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect())
    }

    async fn time_model(
        &self,
        model: &pb::BenchmarkModel,
        inputs: &[(String, Tensor)],
        runs: u32,
        dir: &Path,
    ) -> Result<pb::ModelTiming, String> {
        let digest: Digest = model.artifact_digest.parse().map_err(|e| format!("{e}"))?;
        // The same trust as for what serves: signed by a trusted key and
        // describing exactly this artifact, checked before it is fetched.
        let manifest = match model.manifest_digest.as_str() {
            "" => None,
            d => Some(
                d.parse::<Digest>()
                    .map_err(|e| format!("manifest digest: {e}"))?,
            ),
        };
        let content = Content {
            version: format!("benchmark model {}", model.name),
            artifact: digest,
            artifact_size: model.artifact_size,
            manifest,
            probe_inputs: None,
        };
        match manifest {
            None => self
                .trust
                .admit_unsigned(&content)
                .map_err(|e| e.to_string())?,
            Some(m) => {
                let want = Want {
                    what: "benchmark manifest",
                    digest: m,
                    size: None,
                    max_size: MAX_SIGNED_MANIFEST_BYTES as u64,
                };
                let path = self
                    .downloader
                    .fetch(dir, want)
                    .await
                    .map_err(|e| format!("fetching its manifest: {e}"))?;
                let bytes = tokio::fs::read(&path).await.map_err(|e| e.to_string())?;
                let _ = tokio::fs::remove_file(&path).await;
                self.trust
                    .check_manifest(&bytes, &content)
                    .map_err(|e| e.to_string())?;
            }
        }
        let want = Want {
            what: "benchmark model",
            digest,
            size: Some(model.artifact_size),
            max_size: model.artifact_size,
        };
        let path = self
            .downloader
            .fetch(dir, want)
            .await
            .map_err(|e| format!("fetching: {e}"))?;
        let timed = self
            .serving
            .benchmark(path.clone(), inputs.to_vec(), runs)
            .await
            .map_err(|e| e.to_string());
        // One model on disk at a time.
        let _ = tokio::fs::remove_file(&path).await;
        let timed = timed?;
        Ok(pb::ModelTiming {
            name: model.name.clone(),
            latency_p50_ms: timed.p50_ms,
            latency_p90_ms: timed.p90_ms,
            runs: timed.runs,
            execution_provider: timed.provider,
            error: String::new(),
        })
    }

    /// Reports, retrying what may pass later, until `within` has passed
    /// (the control plane refuses a late report anyway).
    async fn send(&self, report: pb::BenchmarkReport, within: Duration) {
        let give_up = tokio::time::Instant::now() + within;
        let mut attempt = 0u32;
        loop {
            match self.client.report_benchmark(report.clone()).await {
                Ok(()) => return,
                Err(status)
                    if is_refusal(status.code()) || status.code() == Code::AlreadyExists =>
                {
                    tracing::warn!(benchmark = %report.id, %status, "benchmark report refused");
                    return;
                }
                Err(status) => {
                    tracing::debug!(benchmark = %report.id, %status, "benchmark report failed; retrying");
                }
            }
            let delay = self.backoff.next(attempt);
            attempt = attempt.saturating_add(1);
            if tokio::time::Instant::now() + delay > give_up {
                tracing::warn!(benchmark = %report.id, "benchmark report not delivered before its deadline");
                return;
            }
            tokio::time::sleep(delay).await;
        }
    }
}

/// Whether a failed watch ends the loop: a control plane without
/// benchmarks, or one that refuses this device (sync ends on that too).
fn ends(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unimplemented | Code::Unauthenticated | Code::PermissionDenied
    )
}

/// The id as one path component: nothing the server sends leaves `dir`.
fn safe_id(id: &str) -> String {
    let cleaned: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "benchmark".into()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_benchmark_id_stays_one_path_component() {
        assert_eq!(safe_id("b-000000000042"), "b-000000000042");
        assert_eq!(safe_id("../../etc"), "etc");
        assert_eq!(safe_id("/"), "benchmark");
    }
}
