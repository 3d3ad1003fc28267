//! Hard examples → labels → training: a device reports low-confidence rows
//! (unlabelled hard examples) over the agents' gRPC API; they show in the
//! labelling queue with their provenance; `edgeloop sample label` labels
//! one and `sample export` / `sample import` (the round trip a labelling
//! tool makes) the others; the next retraining snapshot holds them,
//! weighted as the policy says, and its training job is given that
//! snapshot. Refusals name what is wrong and label nothing.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgeloop_client_core::Role;
use edgeloop_models::npz::Npz;
use edgeloop_models::{Digest, Tensor};
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_tests::rows::rows_npz;
use edgeloop_tests::{eventually, ControlPlane};
use serde_json::{json, Value};

const MODEL: &str = "rain";
const HARD: usize = 3;

/// A row of 8 features, all `v`.
fn row(v: f32) -> Vec<u8> {
    (0..8).flat_map(|_| v.to_le_bytes()).collect()
}

fn sample(kind: pb::SampleKind, i: usize, label: Option<i64>) -> pb::Sample {
    pb::Sample {
        kind: kind as i32,
        model_name: MODEL.into(),
        model_version: "1".into(),
        request_id: format!("r{i}"),
        observed_at: Some(edgeloop_proto::Timestamp {
            seconds: 1_796_083_200 + i as i64,
            nanos: 0,
        }),
        inputs: vec![pb::SampleTensor {
            name: "input".into(),
            dtype: "float32".into(),
            shape: vec![1, 8],
            data: row(if kind == pb::SampleKind::HardExample {
                100.0 + i as f32
            } else {
                i as f32
            }),
        }],
        predicted_class: Some(0),
        confidence: Some(if kind == pb::SampleKind::HardExample {
            0.31
        } else {
            0.9
        }),
        label,
    }
}

/// Sets a retraining policy (a job that does nothing, 10 uploaded base
/// rows, 20 % held out, and `extra`'s fields) and starts a retrain; the
/// pipeline's id.
async fn retrain_on_ten_base_rows(cp: &ControlPlane, extra: Value, reason: &str) -> String {
    let api = cp.api();
    let base = cp.upload(&rows_npz(10)).await;
    let mut policy = json!({"job": {"name": "retrain-rain", "command": ["true"],
                                    "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1}},
                            "base_dataset": base.to_string(), "eval_fraction": 0.2,
                            "rollout": {"selector": "site=lab"}});
    for (k, v) in extra.as_object().unwrap() {
        policy[k] = v.clone();
    }
    let (status, body) = api
        .put(&format!("/api/v1/models/{MODEL}/retraining"), policy)
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, started) = api
        .post(
            &format!("/api/v1/models/{MODEL}/retrain"),
            json!({"reason": reason}),
        )
        .await;
    assert!(status.is_success(), "{started}");
    started["id"].as_str().unwrap().to_string()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_examples_are_labelled_through_the_cli_and_reach_the_next_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let cp = ControlPlane::start(&work.join("cp")).await;
    let api = cp.api();
    let (status, body) = api.post("/api/v1/models", json!({"name": MODEL})).await;
    assert_eq!(status, 201, "{body}");

    // A device's report: 3 hard examples (no label: the device had none)
    // and 20 labelled feedback rows.
    let token = cp
        .labelled_token("device", "edge-1", json!({"site": "lab"}))
        .await;
    let mut device =
        AgentServiceClient::new(cp.connect(Role::Device, &token, &work.join("edge-1")).await);
    cp.assigned("edge-1", MODEL, "1");
    let mut samples: Vec<pb::Sample> = (0..HARD)
        .map(|i| sample(pb::SampleKind::HardExample, i, None))
        .collect();
    samples.extend(
        (HARD..HARD + 20).map(|i| sample(pb::SampleKind::Feedback, i, Some((i % 2) as i64))),
    );
    device
        .report_telemetry(pb::TelemetryReport {
            sequence: 1,
            samples,
            ..Default::default()
        })
        .await
        .unwrap();

    // The queue: unlabelled hard examples, with where they came from.
    let (status, queue) = api
        .get(&format!(
            "/api/v1/models/{MODEL}/samples?kind=hard_example&state=unlabelled"
        ))
        .await;
    assert_eq!(status, 200, "{queue}");
    let queue = queue.as_array().unwrap().clone();
    assert_eq!(queue.len(), HARD, "{queue:?}");
    for s in &queue {
        assert_eq!(s["device"], "edge-1");
        assert_eq!(s["model_version"], "1");
        assert_eq!(s["confidence"], 0.31);
        assert!(s["observed_at"].is_string(), "{s}");
        assert!(s["label"].is_null(), "{s}");
    }
    let ids: Vec<String> = queue
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let listed = cp.edgeloop(&["sample", "list", MODEL]).await;
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    for id in &ids {
        assert!(table.contains(id.as_str()), "{table}");
    }

    // One labelled by hand, the rest through a labelling tool's round trip.
    let one = cp.edgeloop(&["sample", "label", MODEL, &ids[0], "1"]).await;
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let export = work.join("queue.jsonl");
    let exported = cp
        .edgeloop(&["sample", "export", MODEL, "-o", path(&export)])
        .await;
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        HARD - 1,
        "the one labelled left the queue: {lines:?}"
    );
    assert_eq!(
        lines[0]["inputs"][0]["values"].as_array().unwrap().len(),
        8,
        "{}",
        lines[0]
    );
    assert_eq!(lines[0]["inputs"][0]["shape"], json!([1, 8]));
    // A tool with a bad line: the whole import is refused (65), nothing
    // labelled.
    let labelled: String = lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            l["label"] = json!(1);
            format!("{l}\n")
        })
        .collect();
    let broken = work.join("broken.jsonl");
    std::fs::write(
        &broken,
        format!("{labelled}{{\"id\": \"1:edge-1:1:999\", \"label\": 0}}\n"),
    )
    .unwrap();
    let refused = cp
        .edgeloop(&["sample", "import", MODEL, path(&broken)])
        .await;
    assert_eq!(
        refused.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("labels[2].id"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let (_, still) = api
        .get(&format!(
            "/api/v1/models/{MODEL}/samples?kind=hard_example&state=unlabelled"
        ))
        .await;
    assert_eq!(still.as_array().unwrap().len(), HARD - 1, "{still}");
    let filled = work.join("labelled.jsonl");
    std::fs::write(&filled, labelled).unwrap();
    let imported = cp
        .edgeloop(&["sample", "import", MODEL, path(&filled), "--json"])
        .await;
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let report: Value = serde_json::from_slice(&imported.stdout).unwrap();
    assert_eq!(report["labelled"], HARD as u64 - 1);
    let (_, left) = api
        .get(&format!(
            "/api/v1/models/{MODEL}/samples?kind=hard_example&state=unlabelled"
        ))
        .await;
    assert_eq!(left, json!([]));
    let (_, done) = api
        .get(&format!("/api/v1/models/{MODEL}/samples/{}", ids[0]))
        .await;
    assert_eq!(
        (done["label"].as_i64(), done["labelled_by"].as_str()),
        (Some(1), Some("admin")),
        "{done}"
    );
    let missing = cp
        .edgeloop(&["sample", "label", MODEL, "1:edge-1:9:0", "1"])
        .await;
    assert_eq!(missing.status.code(), Some(66));
    let (status, bad) = api
        .post(
            &format!("/api/v1/models/{MODEL}/samples/{}/label", ids[0]),
            json!({"label": -1}),
        )
        .await;
    assert_eq!(
        (status.as_u16(), bad["error"]["field"].as_str()),
        (400, Some("label")),
        "{bad}"
    );

    // The next snapshot: 20 feedback and 3 hard rows from the device, the
    // hard ones counted twice in training as the policy weights them.
    let id = retrain_on_ten_base_rows(
        &cp,
        json!({"min_eval_samples": 4, "hard_example_weight": 2}),
        "labels",
    )
    .await;
    let p = eventually(
        Duration::from_secs(60),
        "the dataset step's output",
        || async {
            let (_, p) = api.get(&format!("/api/v1/pipelines/{id}")).await;
            (p["history"][0]["output"]["output"] == "dataset").then_some(p)
        },
    )
    .await;
    let out = &p["history"][0]["output"];
    // 23 edge rows, the newest 5 (feedback) evaluate; 10 base + 15 older
    // feedback + 3 hard × 2 train.
    assert_eq!(out["edge_rows"], 23, "{out}");
    assert_eq!(out["hard_examples"], HARD as u64, "{out}");
    assert_eq!(out["eval_rows"], 5, "{out}");
    assert_eq!(out["rows"], 10 + 15 + 2 * HARD as u64, "{out}");
    let digest: Digest = out["digest"].as_str().unwrap().parse().unwrap();
    let snapshot = Npz::from_bytes(&api.typed.download(&digest).await.unwrap()).unwrap();
    let Some(Tensor::F32(x)) = snapshot.get("input") else {
        panic!("no input in the snapshot")
    };
    let hard_rows = x
        .outer_iter()
        .filter(|r| r.iter().all(|v| *v >= 100.0))
        .count();
    assert_eq!(hard_rows, 2 * HARD, "each labelled hard example twice");
    // A PyTorch user's trainer reads the same snapshot with the contract
    // helper (workloads/pytorch/contract.py, standard library only).
    let snap_path = work.join("snapshot.npz");
    std::fs::write(&snap_path, snapshot.to_bytes().unwrap()).unwrap();
    let python = edgeloop_models::deps::dir()
        .unwrap()
        .join("pyenv/bin/python");
    let workloads = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/pytorch");
    let read = Command::new(&python)
        .arg("-c")
        .arg(
            "import contract, json, sys; s = contract.read_snapshot(sys.argv[1]); \
             print(json.dumps([s.input_shape, list(s.label), s.eval_input_shape, s.row(0)]))",
        )
        .arg(&snap_path)
        .env("PYTHONPATH", &workloads)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/python-env.sh installs it)",
                python.display()
            )
        });
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let seen: Value = serde_json::from_slice(&read.stdout).unwrap();
    let Some(Tensor::I64(y)) = snapshot.get("label") else {
        panic!("no label in the snapshot")
    };
    assert_eq!(seen[0], json!([x.shape()[0], 8]), "{seen}");
    assert_eq!(seen[1], json!(y.iter().collect::<Vec<_>>()), "{seen}");
    assert_eq!(seen[2], json!([5, 8]), "{seen}");
    assert_eq!(
        seen[3],
        json!(x
            .outer_iter()
            .next()
            .unwrap()
            .iter()
            .map(|v| f64::from(*v))
            .collect::<Vec<_>>())
    );
    // The training job is given that snapshot.
    let job_id = format!("{id}-train-1");
    let job = eventually(Duration::from_secs(60), "the training job", || async {
        let (status, job) = api.get(&format!("/api/v1/jobs/{job_id}")).await;
        (status == 200).then_some(job)
    })
    .await;
    assert!(job.to_string().contains(&digest.to_hex()), "{job}");
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_keeps_its_newest_samples_up_to_the_cap_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        max_samples_per_model: Some(5),
        ..edgeloop_tests::settings(&dir.path().join("cp"))
    })
    .await;
    let api = cp.api();
    let (status, body) = api.post("/api/v1/models", json!({"name": MODEL})).await;
    assert_eq!(status, 201, "{body}");
    let token = cp.token("device", "edge-1").await;
    let mut device = AgentServiceClient::new(
        cp.connect(Role::Device, &token, &dir.path().join("edge-1"))
            .await,
    );
    cp.assigned("edge-1", MODEL, "1");
    // Two reports of 4; the second's rows say they were observed first,
    // but arrival decides: the control plane's clock, not a device's (a
    // device could otherwise keep its rows forever by dating them ahead).
    for (sequence, first) in [(1u64, 10usize), (2, 0)] {
        let samples = (first..first + 4)
            .map(|i| sample(pb::SampleKind::HardExample, i, None))
            .collect();
        let report = pb::TelemetryReport {
            sequence,
            samples,
            ..Default::default()
        };
        device.report_telemetry(report.clone()).await.unwrap();
        // A replay stores and counts nothing twice.
        device.report_telemetry(report).await.unwrap();
    }
    let (status, summary) = api
        .get(&format!("/api/v1/models/{MODEL}/samples/summary"))
        .await;
    assert_eq!(status, 200, "{summary}");
    assert_eq!(
        summary,
        json!({"stored": 5, "dropped": 3, "max_per_model": 5})
    );
    let (_, kept) = api.get(&format!("/api/v1/models/{MODEL}/samples")).await;
    let mut requests: Vec<&str> = kept
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["request_id"].as_str().unwrap())
        .collect();
    requests.sort();
    assert_eq!(
        requests,
        ["r0", "r1", "r13", "r2", "r3"],
        "the newest five by arrival: the second report, and the last row of the first"
    );
    cp.stop().await;
}

/// A policy's `min_fresh_edge_rows`: the dataset step waits for labelled
/// rows received after the pipeline started (an early drift trigger leaves
/// few rows of the new concept), then builds the snapshot with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dataset_step_waits_for_rows_observed_since_the_pipeline_started() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let api = cp.api();
    let (status, body) = api.post("/api/v1/models", json!({"name": MODEL})).await;
    assert_eq!(status, 201, "{body}");
    let token = cp.token("device", "edge-1").await;
    let mut device = AgentServiceClient::new(
        cp.connect(Role::Device, &token, &dir.path().join("edge-1"))
            .await,
    );
    cp.assigned("edge-1", MODEL, "1");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    // Labelled rows observed `at` (Unix seconds).
    let rows = |range: std::ops::Range<usize>, at: i64| -> Vec<pb::Sample> {
        range
            .map(|i| pb::Sample {
                observed_at: Some(edgeloop_proto::Timestamp {
                    seconds: at + i as i64,
                    nanos: 0,
                }),
                ..sample(pb::SampleKind::Feedback, i, Some((i % 2) as i64))
            })
            .collect()
    };
    device
        .report_telemetry(pb::TelemetryReport {
            sequence: 1,
            samples: rows(0..10, now - 3_600),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = retrain_on_ten_base_rows(
        &cp,
        json!({"min_eval_samples": 2, "edge_window_rows": 20, "min_fresh_edge_rows": 4}),
        "drift",
    )
    .await;
    // Ten labelled rows, none of them fresh: the step waits (the pipeline
    // ticks every second; three ticks pass).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, p) = api.get(&format!("/api/v1/pipelines/{id}")).await;
    assert_eq!(
        (p["status"].as_str(), p["step"].as_str()),
        (Some("running"), Some("build_dataset")),
        "{p}"
    );
    assert!(p["history"][0]["output"].is_null(), "{p}");
    // Three fresh rows are not enough either; the fourth is.
    device
        .report_telemetry(pb::TelemetryReport {
            sequence: 2,
            samples: rows(10..13, now + 1),
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, p) = api.get(&format!("/api/v1/pipelines/{id}")).await;
    assert!(p["history"][0]["output"].is_null(), "{p}");
    device
        .report_telemetry(pb::TelemetryReport {
            sequence: 3,
            samples: rows(13..14, now + 1),
            ..Default::default()
        })
        .await
        .unwrap();
    let p = eventually(
        Duration::from_secs(30),
        "the dataset step's output",
        || async {
            let (_, p) = api.get(&format!("/api/v1/pipelines/{id}")).await;
            (p["history"][0]["output"]["output"] == "dataset").then_some(p)
        },
    )
    .await;
    let out = &p["history"][0]["output"];
    assert_eq!(out["edge_rows"], 14, "{out}");
    cp.stop().await;
}
