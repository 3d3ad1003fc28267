//! Replays rows of the stream through the agents' inference API in time
//! order, one request per day, round-robin over the agents, and sends each
//! day's label as feedback right after. Meanwhile it watches the control
//! plane: when the trigger task first saw drift, when a retrain started,
//! and which version answered each row.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;

use edgeloop_api::pipelines::PipelineView;
use edgeloop_api::triggers::{FeatureMove, TriggersView};

use super::console::Console;
use super::data::Stream;

pub struct RowResult {
    pub row: usize,
    pub version: String,
    pub correct: bool,
    pub latency_ms: f64,
}

#[derive(Default)]
pub struct Watch {
    /// The row being replayed when the drift state (hysteresis) was first set.
    pub drift_state_row: Option<usize>,
    /// The features that moved most when the drift state was first set.
    pub first_moved: Vec<FeatureMove>,
    /// The row being replayed when the first retrain started.
    pub retrain_row: Option<usize>,
    /// The features that moved most when the first retrain started: the
    /// drift that hurt.
    pub retrain_moved: Vec<FeatureMove>,
    pub pipelines: BTreeSet<String>,
    /// The first row a version other than the first one answered.
    pub new_version_row: Option<usize>,
}

pub struct Replay<'a> {
    pub http: reqwest::Client,
    pub agents: Vec<String>,
    pub model: &'a str,
    pub console: &'a Console,
    pub stream: &'a Stream,
    pub rows_per_second: f64,
}

fn argmax(v: &[f64]) -> Option<i64> {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as i64)
}

/// The part of an Open Inference Protocol v2 answer the replay reads.
#[derive(Debug, serde::Deserialize)]
struct InferResponse {
    #[serde(default)]
    model_version: String,
    outputs: Vec<InferOutput>,
}

#[derive(Debug, serde::Deserialize)]
struct InferOutput {
    data: Vec<f64>,
}

impl Replay<'_> {
    async fn infer(&self, agent: &str, row: usize) -> anyhow::Result<(String, i64, f64)> {
        let id = format!("day-{row}");
        let started = Instant::now();
        let resp = self
            .http
            .post(format!("{agent}/v2/models/{}/infer", self.model))
            .json(&json!({
                "id": id,
                "inputs": [{"name": "input", "shape": [1, super::data::FEATURES],
                            "datatype": "FP32", "data": self.stream.x[row].to_vec()}]
            }))
            .send()
            .await
            .with_context(|| format!("inference at {agent}"))?;
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        let text = || String::from_utf8_lossy(&body).into_owned();
        anyhow::ensure!(
            status.is_success(),
            "inference at {agent} (row {row}): {status}: {}",
            text()
        );
        let answer: InferResponse = serde_json::from_slice(&body).with_context(|| {
            format!("inference at {agent}: not an inference answer: {}", text())
        })?;
        let version = answer.model_version;
        let predicted = answer
            .outputs
            .first()
            .and_then(|o| argmax(&o.data))
            .with_context(|| format!("inference at {agent}: no output data in {}", text()))?;
        let resp = self
            .http
            .post(format!("{agent}/v2/models/{}/feedback", self.model))
            .json(&json!({"labels": [{"id": id, "label": self.stream.y[row]}]}))
            .send()
            .await
            .with_context(|| format!("feedback at {agent}"))?;
        anyhow::ensure!(
            resp.status().is_success(),
            "feedback at {agent}: {}",
            resp.status()
        );
        Ok((version, predicted, latency_ms))
    }

    async fn observe(&self, row: usize, watch: &mut Watch) -> anyhow::Result<()> {
        let moved = || async {
            let t: TriggersView = self
                .console
                .get(&format!("/api/v1/models/{}/triggers", self.model))
                .await?;
            anyhow::Ok(
                t.state
                    .last
                    .filter(|e| e.state.drifting_since.is_some())
                    .map(|e| e.state.drift_features),
            )
        };
        if watch.drift_state_row.is_none() {
            if let Some(features) = moved().await? {
                watch.drift_state_row = Some(row);
                watch.first_moved = features;
            }
        }
        let pipelines: Vec<PipelineView> = self
            .console
            .get(&format!("/api/v1/pipelines?model={}", self.model))
            .await?;
        for p in pipelines {
            if watch.pipelines.insert(p.id) && watch.retrain_row.is_none() {
                watch.retrain_row = Some(row);
                watch.retrain_moved = moved().await?.unwrap_or_default();
            }
        }
        Ok(())
    }

    /// Replays `rows` at the set pace; `tick` is called after each row.
    pub async fn run(
        &self,
        rows: &[usize],
        first_version: &str,
        mut tick: impl FnMut(usize),
    ) -> anyhow::Result<(Vec<RowResult>, Watch)> {
        let mut out = Vec::with_capacity(rows.len());
        let mut watch = Watch::default();
        let started = Instant::now();
        let mut last_look = Instant::now() - Duration::from_secs(1);
        for (k, &row) in rows.iter().enumerate() {
            let agent = &self.agents[k % self.agents.len()];
            let (version, predicted, latency_ms) = self.infer(agent, row).await?;
            if version != first_version && watch.new_version_row.is_none() {
                watch.new_version_row = Some(row);
            }
            out.push(RowResult {
                row,
                version,
                correct: predicted == self.stream.y[row],
                latency_ms,
            });
            if last_look.elapsed() >= Duration::from_millis(500) {
                self.observe(row, &mut watch).await?;
                last_look = Instant::now();
            }
            tick(k + 1);
            let due = started + Duration::from_secs_f64((k + 1) as f64 / self.rows_per_second);
            tokio::time::sleep_until(due.into()).await;
        }
        if let Some(&last) = rows.last() {
            self.observe(last, &mut watch).await?;
        }
        Ok((out, watch))
    }
}
