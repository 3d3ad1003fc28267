//! A model over protobuf's 2 GiB (weights in external data) through the
//! registry path a user takes: `edgeloop model quantize` on the two files,
//! `edgeloop model push` of what it wrote, a staged deployment to a real
//! agent, and answers over the Open Inference Protocol (JSON and binary)
//! equal to ONNX Runtime's on the pushed file, and within the gate's
//! budget of float run from its own files.
//!
//! Heavy (2.2 GB written, the gate's copies in memory), so `cargo test`
//! skips it and `scripts/test-big-model.sh` runs it alone after the rest.
//! The library-level path (every candidate, signing, serving from a file
//! without a control plane) is `edge-agent/tests/serve/big_model.rs`, on
//! the very same generated model.

#[path = "../../edge-agent/tests/serve/big_model_gen.rs"]
mod big_model_gen;

use std::path::Path;
use std::time::{Duration, Instant};

use big_model_gen::{f32s, relative_l2, write_big_model, IN, OUT};
use edgeloop_edge_agent::AgentConfig;
use edgeloop_models::manifest::ManifestKey;
use edgeloop_models::npz::Npz;
use edgeloop_models::onnx;
use edgeloop_models::runtime::{OrtRuntime, SessionOptions};
use edgeloop_models::tensor::Tensor;
use edgeloop_tests::{eventually, ControlPlane};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(300);

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `rows` × 1024 floats in [-1, 1), deterministic.
fn x(rows: usize, seed: u64) -> Tensor {
    let mut state = seed;
    let values: Vec<f32> = (0..rows * IN)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    Tensor::F32(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[rows, IN]), values).unwrap())
}

fn ok(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "heavy: 2.2 GB model; scripts/test.sh runs it alone (scripts/test-big-model.sh)"]
async fn a_model_over_2_gib_is_quantized_pushed_deployed_and_served_by_the_cli() {
    let t0 = Instant::now();
    let lap = |what: &str| {
        eprintln!(
            "[big model loop] {what}: {:.1} s",
            t0.elapsed().as_secs_f64()
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let model = write_big_model(work);
    let on_disk = std::fs::metadata(&model).unwrap().len()
        + std::fs::metadata(work.join("model.onnx.data"))
            .unwrap()
            .len();
    assert!(on_disk > onnx::MAX_MODEL_BYTES as u64);
    let mut sets = Npz::new();
    sets.insert("x", x(4, 1));
    sets.write(&work.join("calibration.npz")).unwrap();
    let mut eval = Npz::new();
    eval.insert("x", x(4, 2));
    eval.write(&work.join("eval.npz")).unwrap();
    let key_path = work.join("signing.key");
    let key = ManifestKey::generate();
    key.write_to(&key_path).unwrap();
    lap("written");

    let cp = ControlPlane::start(&work.join("cp")).await;
    // The CLI reads both files (validating that the external data stays in
    // the model's directory) and gates the int8 candidate, which ships as
    // one file.
    let out = work.join("out").join("big.onnx");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let outcome = ok(&cp
        .edgeloop(&[
            "model",
            "quantize",
            path(&model),
            "--calibration",
            path(&work.join("calibration.npz")),
            "--eval",
            path(&work.join("eval.npz")),
            "--task",
            "regression",
            "--method",
            "dynamic",
            "--signing-key",
            path(&key_path),
            "--out",
            path(&out),
            "--name",
            "big",
            "--version",
            "1.0.0",
            "--json",
        ])
        .await);
    lap("quantized by the CLI");
    assert_eq!(outcome["chosen"], "int8-dynamic", "{}", outcome["reason"]);
    // Float's size is its weights inline (the external-data entries, a few
    // bytes, gone): still over 2 GiB.
    let float_size = outcome["float"]["size_bytes"].as_u64().unwrap();
    assert!(
        float_size > onnx::MAX_MODEL_BYTES as u64 && float_size.abs_diff(on_disk) < 4096,
        "{float_size} vs {on_disk} on disk"
    );
    let shipped = std::fs::metadata(&out).unwrap().len();
    assert!(shipped < on_disk / 3, "{shipped}");
    let budget = outcome["metric"]["budget"].as_f64().unwrap();

    // Pushed: the model, and the manifest and probe quantize wrote beside it.
    let pushed = ok(&cp
        .edgeloop(&[
            "model",
            "push",
            path(&out),
            "--name",
            "big",
            "--version",
            "1.0.0",
            "--json",
        ])
        .await);
    assert_eq!(pushed["files"].as_array().unwrap().len(), 3, "{pushed}");
    let (_, version) = cp.api().get("/api/v1/models/big/versions/1.0.0").await;
    assert_eq!(
        version["artifact_size"].as_u64(),
        Some(shipped),
        "{version}"
    );
    lap("pushed");

    let device_dir = work.join("device");
    let token = cp
        .labelled_token("device", "edge-big", json!({"big": "yes"}))
        .await;
    let stop = CancellationToken::new();
    let config = AgentConfig::new(
        cp.member_config(&device_dir, Some(token)),
        vec![key.public()],
    );
    let agent = tokio::spawn(edgeloop_edge_agent::run(config, stop.clone()));
    eventually(WAIT, "edge-big online", || async {
        let (_, d) = cp.api().get("/api/v1/devices/edge-big").await;
        (d["status"] == "online").then_some(())
    })
    .await;
    let (status, d) = cp
        .api()
        .post(
            "/api/v1/deployments",
            json!({"model": "big", "version": "1.0.0", "selector": "big=yes",
                   "strategy": {"waves": {"count": [1]}, "min_soak_seconds": 0,
                                "wave_timeout_seconds": 280},
                   "gates": {"min_requests": 0}}),
        )
        .await;
    assert_eq!(status, 201, "{d}");
    let id = d["id"].as_str().unwrap().to_string();
    let ended = eventually(WAIT, "the deployment ends", || async {
        let (_, d) = cp.api().get(&format!("/api/v1/deployments/{id}")).await;
        matches!(
            d["state"].as_str(),
            Some("succeeded" | "rolled_back" | "failed" | "cancelled")
        )
        .then_some(d)
    })
    .await;
    assert_eq!(ended["state"], "succeeded", "{ended}");
    lap("deployed");

    // Served: the same answers as ONNX Runtime on the pushed file, JSON
    // and binary, and within the budget of float from its own files.
    let addr =
        std::fs::read_to_string(device_dir.join(edgeloop_edge_agent::INFERENCE_ADDR_FILE)).unwrap();
    let url = format!("http://{}/v2/models/big/infer", addr.trim());
    let probe = x(2, 99);
    let data = f32s(&probe);
    let request =
        json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, IN], "data": data}]});
    let http = reqwest::Client::new();
    let reply: Value = http
        .post(&url)
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let served: Vec<f32> = reply["outputs"][0]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(served.len(), 2 * OUT);
    let header = serde_json::to_vec(&json!({"inputs": [{"name": "x", "datatype": "FP32",
        "shape": [2, IN], "parameters": {"binary_data_size": data.len() * 4}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": true}}]}))
    .unwrap();
    let mut body = header.clone();
    body.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    let binary = http
        .post(&url)
        .header("Inference-Header-Content-Length", header.len())
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(binary.status(), 200);
    let json_len: usize = binary
        .headers()
        .get("Inference-Header-Content-Length")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = binary.bytes().await.unwrap();
    let served_binary: Vec<f32> = bytes[json_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(served_binary, served, "binary and JSON agree exactly");
    lap("served");

    let runtime = OrtRuntime::load(None).unwrap();
    let run = |file: &Path| {
        let mut s = runtime
            .session_from_file(file, &SessionOptions::default())
            .unwrap();
        f32s(&s.run(&[("x", &probe)]).unwrap()[0].1)
    };
    let reference = run(&out);
    let rel = relative_l2(&reference, &served);
    assert!(
        rel < 1e-5,
        "served vs ONNX Runtime on the pushed file: relative L2 {rel}"
    );
    let float = run(&model);
    let rel = relative_l2(&float, &served);
    assert!(
        rel <= budget,
        "served vs float: relative L2 {rel} over the budget {budget}"
    );
    lap("checked against ONNX Runtime");

    stop.cancel();
    agent.await.unwrap().unwrap();
    cp.stop().await;
}
