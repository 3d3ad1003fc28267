//! The setup of a retraining pipeline, shared by the tests that drive one:
//! a model, its base dataset, a retraining policy, and labelled samples
//! reported by a device over the agents' gRPC API (as
//! `tests/it/retrain.rs` sets them up).

use std::path::Path;

use edgeloop_client_core::Role;
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use serde_json::{json, Value};

use crate::rows::rows_npz;
use crate::ControlPlane;

/// A retraining policy: `job` trains on the base dataset `base` (its last
/// 60 rows) and the device samples; the newest quarter evaluates; the
/// rollout goes to `site=lab`.
pub fn policy(job: Value, base: &str) -> Value {
    json!({
        "job": job,
        "base_dataset": base,
        "base_window_rows": 60,
        "eval_fraction": 0.25,
        "min_eval_samples": 10,
        "max_attempts": 2,
        "rollout": {"selector": "site=lab"}
    })
}

/// Model `model`, its base dataset (100 rows of 8 features), a retraining
/// policy with `job` (and `extra`'s fields over [`policy`]'s), and 40
/// labelled samples reported by device `edge-1` (labels `site=lab`, its
/// identity kept under `dir`).
pub async fn setup(cp: &ControlPlane, dir: &Path, model: &str, job: Value, extra: Value) {
    let (status, body) = cp
        .api()
        .post("/api/v1/models", json!({"name": model}))
        .await;
    assert_eq!(status, 201, "{body}");
    let base = cp.upload(&rows_npz(100)).await;
    let mut policy = policy(job, &base.to_string());
    for (k, v) in extra.as_object().into_iter().flatten() {
        policy[k] = v.clone();
    }
    let (status, body) = cp
        .api()
        .put(&format!("/api/v1/models/{model}/retraining"), policy)
        .await;
    assert_eq!(status, 200, "{body}");

    let token = cp
        .labelled_token("device", "edge-1", json!({"site": "lab"}))
        .await;
    let mut client =
        AgentServiceClient::new(cp.connect(Role::Device, &token, &dir.join("edge-1")).await);
    cp.assigned("edge-1", model, "1");
    let samples = (0..40)
        .map(|i| {
            let x: Vec<u8> = (0..8)
                .flat_map(|f| ((i * 8 + f) as f32).to_le_bytes())
                .collect();
            pb::Sample {
                kind: pb::SampleKind::Feedback as i32,
                model_name: model.into(),
                model_version: "1".into(),
                request_id: format!("r{i}"),
                observed_at: Some(edgeloop_proto::Timestamp {
                    seconds: 1_796_083_200 + i64::from(i),
                    nanos: 0,
                }),
                inputs: vec![pb::SampleTensor {
                    name: "input".into(),
                    dtype: "float32".into(),
                    shape: vec![1, 8],
                    data: x,
                }],
                predicted_class: Some(0),
                confidence: Some(0.7),
                label: Some(i64::from(i % 2)),
            }
        })
        .collect();
    client
        .report_telemetry(pb::TelemetryReport {
            sequence: 1,
            samples,
            ..Default::default()
        })
        .await
        .unwrap();
}
