//! Real pretrained models from PyPI wheels (scripts/fetch-zoo.sh,
//! docs/model-zoo.md) through the whole path a user's model takes: inspect
//! and validate; quantize behind the task's gate, every candidate accepted
//! or refused with its reason; sign; register; deploy to a real edge agent
//! through the console API; serve over the Open Inference Protocol v2, JSON
//! and binary tensors; answers equal to Python ONNX Runtime's on the same
//! artifact and inputs.
//!
//! magika (tf2onnx, int32 input, 214 classes, no labels: agreement with
//! float), NudeNet's YOLOv8n (detection: boxes after NMS), silero-vad at
//! opsets 15 and 18 (stateful: `state` fed back, a scalar int64 `sr`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use edgeloop_control_plane::fleet::telemetry::AssignmentState;
use edgeloop_edge_agent::AgentConfig;
use edgeloop_models::dataset::{Dataset, Layout};
use edgeloop_models::manifest::ManifestKey;
use edgeloop_models::onnx;
use edgeloop_models::package::{package, Identity, Packaged, ProbeInputs};
use edgeloop_models::quantize::detect::DetectionSpec;
use edgeloop_models::quantize::gate::{GateOptions, GateOutcome};
use edgeloop_models::quantize::task::{MetricKind, Task};
use edgeloop_models::runtime::OrtRuntime;
use edgeloop_models::tensor::Tensor;
use edgeloop_tests::{eventually, ControlPlane};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

fn zoo() -> PathBuf {
    let dir = edgeloop_models::deps::dir().unwrap().join("zoo");
    assert!(
        dir.join(".fetched").exists(),
        "{} missing: run scripts/fetch-zoo.sh",
        dir.display()
    );
    dir
}

fn python() -> PathBuf {
    edgeloop_models::deps::dir()
        .unwrap()
        .join("pyenv/bin/python")
}

struct Zoo {
    name: &'static str,
    task: Option<Task>,
    /// Samples sent over OIP (rows of a batch, or calls in order).
    served: usize,
    check: fn(&GateOutcome),
}

fn candidate<'a>(
    o: &'a GateOutcome,
    name: &str,
) -> &'a edgeloop_models::quantize::gate::Measurement {
    o.candidates.iter().find(|c| c.name == name).unwrap()
}

fn models() -> Vec<Zoo> {
    vec![
        Zoo {
            name: "magika",
            task: None,
            served: 6,
            check: |o| {
                assert_eq!(o.task, Task::Classification);
                assert_eq!(
                    o.metric.name,
                    MetricKind::Top1Agreement,
                    "no labels: agreement"
                );
                assert!(o.chosen.starts_with("int8-static"), "{}", o.reason);
                assert!(o.chosen_measurement().size_bytes * 3 < o.float.size_bytes);
            },
        },
        Zoo {
            name: "nudenet",
            task: Some(Task::Detection(DetectionSpec::default())),
            served: 2,
            check: |o| {
                assert_eq!(o.metric.name, MetricKind::BoxAgreementF1);
                assert!(
                    o.float.details["boxes_float"] > 0.0,
                    "the photographs hold detections"
                );
                // fp16 runs (its YOLOv8 head keeps its int64 shape chain)
                // and keeps every box; dynamic int8 has no MatMul to take.
                let fp16 = candidate(o, "fp16");
                assert!(fp16.accepted, "{}", fp16.verdict);
                assert!(candidate(o, "int8-dynamic")
                    .verdict
                    .starts_with("quantized nothing"));
                assert!(
                    o.chosen == "fp16" || o.chosen.starts_with("int8-static"),
                    "{}",
                    o.reason
                );
            },
        },
        Zoo {
            name: "silero-op15",
            task: None,
            served: 3,
            check: |o| {
                assert!(
                    matches!(&o.task, Task::Stateful { state } if state[0].input == "state" && state[0].output == "stateN"),
                    "{:?}",
                    o.task
                );
                assert_eq!(o.metric.name, MetricKind::StepRelativeL2);
                // Its fp16 conversion does not reach inside its If branches:
                // refused with ONNX Runtime's reason, not a crash.
                assert!(
                    candidate(o, "fp16").verdict.starts_with("could not be run"),
                    "{}",
                    candidate(o, "fp16").verdict
                );
            },
        },
        Zoo {
            name: "silero-op18",
            task: None,
            served: 3,
            check: |o| {
                assert!(matches!(o.task, Task::Stateful { .. }));
                // All of its weights live inside If branches.
                for c in &o.candidates {
                    assert!(
                        c.verdict.contains("inside If/Loop/Scan bodies"),
                        "{}: {}",
                        c.name,
                        c.verdict
                    );
                }
                assert_eq!(o.chosen, "float");
            },
        },
    ]
}

fn oip_datatype(t: &Tensor) -> &'static str {
    match t {
        Tensor::F32(_) => "FP32",
        Tensor::F64(_) => "FP64",
        Tensor::F16(_) => "FP16",
        Tensor::I8(_) => "INT8",
        Tensor::U8(_) => "UINT8",
        Tensor::I32(_) => "INT32",
        Tensor::I64(_) => "INT64",
        Tensor::Bool(_) => "BOOL",
    }
}

fn json_data(t: &Tensor) -> Value {
    match t {
        Tensor::F32(a) => json!(a.iter().collect::<Vec<_>>()),
        Tensor::I32(a) => json!(a.iter().collect::<Vec<_>>()),
        Tensor::I64(a) => json!(a.iter().collect::<Vec<_>>()),
        other => panic!("no zoo input is {}", other.dtype()),
    }
}

fn raw_bytes(t: &Tensor) -> Vec<u8> {
    match t {
        Tensor::F32(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Tensor::I32(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Tensor::I64(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        other => panic!("no zoo input is {}", other.dtype()),
    }
}

/// The OIP requests for `n` samples of `eval`: one batched request, or one
/// request per call in order.
fn requests(eval: &Dataset, n: usize) -> Vec<Vec<(String, Tensor)>> {
    match eval.layout {
        Layout::PerCall => eval.batches.iter().take(n).cloned().collect(),
        Layout::Batched => vec![eval.batches[0]
            .iter()
            .map(|(name, t)| (name.clone(), edgeloop_models::dataset::slice_rows(t, 0, n)))
            .collect()],
    }
}

fn json_request(inputs: &[(String, Tensor)]) -> Value {
    json!({"inputs": inputs.iter().map(|(name, t)| json!({
        "name": name, "shape": t.shape(), "datatype": oip_datatype(t), "data": json_data(t),
    })).collect::<Vec<_>>()})
}

/// The same request with every input as binary tensor data.
fn binary_request(inputs: &[(String, Tensor)]) -> (Vec<u8>, usize) {
    let header = json!({"inputs": inputs.iter().map(|(name, t)| json!({
        "name": name, "shape": t.shape(), "datatype": oip_datatype(t),
        "parameters": {"binary_data_size": raw_bytes(t).len()},
    })).collect::<Vec<_>>()});
    let mut body = serde_json::to_vec(&header).unwrap();
    let header_len = body.len();
    for (_, t) in inputs {
        body.extend(raw_bytes(t));
    }
    (body, header_len)
}

/// Python ONNX Runtime's outputs for the same request (tools/oip_reference.py).
fn python_reference(model: &Path, request: &Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("request.json");
    std::fs::write(&file, serde_json::to_vec(request).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/oip_reference.py");
    let out = Command::new(python())
        .arg(script)
        .arg(model)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oip_reference.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Every output of `got` (the agent) equals `want` (Python ORT), by name.
fn assert_same_outputs(what: &str, got: &Value, want: &Value) {
    let want = want["outputs"].as_array().unwrap();
    let got_outputs = got["outputs"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: {got}"));
    assert_eq!(got_outputs.len(), want.len(), "{what}: {got}");
    for w in want {
        let g = got_outputs.iter().find(|g| g["name"] == w["name"]).unwrap();
        assert_eq!(g["shape"], w["shape"], "{what} {}", w["name"]);
        assert_eq!(g["datatype"], w["datatype"], "{what} {}", w["name"]);
        let (g, w) = (floats(&g["data"]), floats(&w["data"]));
        assert_eq!(g.len(), w.len());
        let worst = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs() / (1e-4 + b.abs()))
            .fold(0.0, f64::max);
        assert!(worst < 1e-3, "{what}: worst relative difference {worst}");
    }
}

struct Built {
    zoo: Zoo,
    packaged: Packaged,
    artifact: PathBuf,
    eval: Dataset,
    probe: ProbeInputs,
}

fn quantize(runtime: &OrtRuntime, key: &ManifestKey, zoo: Zoo, out: &Path) -> Built {
    let dir = self::zoo();
    let path = dir.join(format!("{}.onnx", zoo.name));
    let model = onnx::read(&path).unwrap();
    onnx::validate(&model, Some(&dir)).unwrap_or_else(|e| panic!("{}: {e}", zoo.name));
    let summary = onnx::inspect(&model);
    assert!(!summary.inputs.is_empty() && !summary.outputs.is_empty());
    let data = dir.join("data").join(zoo.name);
    let calibration = Dataset::read(&data.join("calibration.npz"), &summary.inputs, false).unwrap();
    let eval = Dataset::read(&data.join("eval.npz"), &summary.inputs, false).unwrap();
    let opts = GateOptions {
        task: zoo.task.clone(),
        latency_runs: 5,
        ..GateOptions::default()
    };
    let identity = Identity {
        name: zoo.name.into(),
        feature_names: Default::default(),
        version: "1.0.0".into(),
        lineage: Default::default(),
        min_version: None,
        rollback: false,
    };
    let probe = ProbeInputs::first_call(&eval, 5000.0).unwrap();
    let packaged = package(
        runtime,
        &model,
        &calibration,
        &eval,
        &opts,
        identity,
        Some(&probe),
        key,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", zoo.name));
    let o = &packaged.outcome;
    for m in std::iter::once(&o.float).chain(&o.candidates) {
        println!(
            "{:<12} {:<24} {:>12.4} loss {:>8.4} size {:>9} {:>8.3} ms  {}",
            zoo.name, m.name, m.metric, m.loss, m.size_bytes, m.latency_ms, m.verdict
        );
        assert!(!m.verdict.is_empty());
    }
    println!("{:<12} chosen {}: {}", zoo.name, o.chosen, o.reason);
    assert!(o.chosen == "float" || o.chosen_measurement().accepted);
    (zoo.check)(o);
    // The metric is in the signed evidence.
    let evidence = &packaged
        .manifest
        .manifest
        .quantization
        .as_ref()
        .unwrap()
        .evidence;
    assert_eq!(
        evidence["metric"]["name"],
        o.metric.name.name(),
        "{evidence}"
    );
    assert_eq!(evidence["task"]["kind"], o.task.name());
    let artifact = out.join(format!("{}.onnx", zoo.name));
    std::fs::write(&artifact, &packaged.artifact).unwrap();
    Built {
        zoo,
        packaged,
        artifact,
        eval,
        probe,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_models_quantize_deploy_and_serve_what_onnxruntime_answers() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = OrtRuntime::load(None).unwrap();
    let key = ManifestKey::generate();
    let built: Vec<Built> = models()
        .into_iter()
        .map(|z| quantize(&runtime, &key, z, dir.path()))
        .collect();

    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    for b in &built {
        let name = b.zoo.name;
        let (status, body) = cp.api().post("/api/v1/models", json!({"name": name})).await;
        assert_eq!(status, 201, "{body}");
        cp.upload(&b.probe.npz).await;
        let signed = b.packaged.manifest.to_json_pretty().unwrap();
        cp.register_version(name, "1.0.0", &b.packaged.artifact, signed.as_bytes())
            .await;
    }

    let device_dir = dir.path().join("device");
    let token = cp
        .labelled_token("device", "edge-1", json!({"zoo": "yes"}))
        .await;
    let stop = CancellationToken::new();
    let mut config = AgentConfig::new(
        cp.member_config(&device_dir, Some(token)),
        vec![key.public()],
    );
    config.telemetry.interval = Duration::from_secs(1);
    let agent = tokio::spawn(edgeloop_edge_agent::run(config, stop.clone()));
    eventually(WAIT, "edge-1 enrolled", || async {
        (cp.api().get("/api/v1/devices/edge-1").await.0 == 200).then_some(())
    })
    .await;
    for b in &built {
        let (status, body) = cp
            .api()
            .post(
                "/api/v1/deployments",
                json!({"model": b.zoo.name, "version": "1.0.0", "selector": "zoo=yes",
                       "strategy": {"waves": {"count": [1]}, "min_soak_seconds": 0},
                       "gates": {"min_requests": 0}, "offline_tolerance": 0.0}),
            )
            .await;
        assert_eq!(status, 201, "{}: {body}", b.zoo.name);
    }
    let addr = eventually(WAIT, "the inference address", || async {
        std::fs::read_to_string(device_dir.join(edgeloop_edge_agent::INFERENCE_ADDR_FILE)).ok()
    })
    .await;
    let url = format!("http://{}", addr.trim());
    let http = reqwest::Client::new();
    for b in &built {
        let name = b.zoo.name;
        eventually(WAIT, &format!("{name} ready"), || async {
            let status = cp
                .core
                .store
                .fleet
                .assignment_status
                .get(&format!("edge-1/{name}"))
                .unwrap();
            if let Some(s) = status.filter(|s| s.state == AssignmentState::Failed) {
                panic!("{name} failed on the device: {}", s.reason);
            }
            let r = http
                .get(format!("{url}/v2/models/{name}/ready"))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        for (i, inputs) in requests(&b.eval, b.zoo.served).iter().enumerate() {
            let what = format!("{name} request {i}");
            let request = json_request(inputs);
            let want = python_reference(&b.artifact, &request);
            let got: Value = http
                .post(format!("{url}/v2/models/{name}/infer"))
                .json(&request)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_same_outputs(&format!("{what} (JSON)"), &got, &want);
            let (body, header_len) = binary_request(inputs);
            let got_binary: Value = http
                .post(format!("{url}/v2/models/{name}/infer"))
                .header("Inference-Header-Content-Length", header_len)
                .header("content-type", "application/octet-stream")
                .body(body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_same_outputs(&format!("{what} (binary)"), &got_binary, &want);
            assert_eq!(
                got_binary["outputs"], got["outputs"],
                "{what}: binary and JSON agree exactly"
            );
        }
    }
    stop.cancel();
    agent.await.unwrap().unwrap();
}
