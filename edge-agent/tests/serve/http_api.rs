//! The REST API against real models: answers equal Python ONNX Runtime's,
//! metadata and health as the protocol has them, and every bad request
//! gets its status and `{"error": ...}`.

use std::process::Command;

use edgeloop_edge_agent::serving::ModelServing;
use serde_json::{json, Value};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_matches_python_onnxruntime() {
    let server = start(config()).await;
    for (name, item_shape) in [("mlp", vec![784]), ("cnn", vec![1, 28, 28])] {
        let path = mnist_model(name);
        server
            .host
            .activate(spec(name, "1", &path))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let batch = 5;
        let mut shape = vec![batch];
        shape.extend(&item_shape);
        let data = noise(batch * 784, 42);
        let request = json!({
            "id": format!("{name}-check"),
            "inputs": [{ "name": "input", "shape": shape, "datatype": "FP32", "data": data }],
        });
        let want = python_reference(&path, &request);
        let got = server
            .post(&format!("/v2/models/{name}/infer"), &request)
            .await;
        assert_eq!(got.status, 200, "{name}: {}", got.text);
        assert_eq!(got.body["model_name"], name);
        assert_eq!(got.body["model_version"], "1");
        assert_eq!(got.body["id"], format!("{name}-check"));
        assert_eq!(got.body["outputs"][0]["name"], want["outputs"][0]["name"]);
        assert_eq!(got.body["outputs"][0]["shape"], json!([batch, 10]));
        assert_eq!(got.body["outputs"][0]["datatype"], "FP32");
        let (ours, theirs) = (output_data(&got.body, 0), output_data(&want, 0));
        assert_eq!(ours.len(), theirs.len());
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{name}: max abs difference {worst}");

        // Nested data (one array level per dimension) reads the same.
        let nested: Vec<Value> = data
            .chunks(784)
            .map(|row| match name {
                "mlp" => json!(row),
                _ => json!([row.chunks(28).collect::<Vec<_>>()]),
            })
            .collect();
        let request = json!({
            "inputs": [{ "name": "input", "shape": shape, "datatype": "FP32", "data": nested }],
            "outputs": [{ "name": "logits" }],
        });
        let again = server
            .post(&format!("/v2/models/{name}/infer"), &request)
            .await;
        assert_eq!(again.status, 200, "{}", again.text);
        assert_eq!(output_data(&again.body, 0), ours, "{name}: nested data");
        let id = again.body["id"].as_str().unwrap();
        assert_eq!(id.len(), 36, "a generated id is a UUID: {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_health() {
    let server = start(config()).await;
    // Up and ready before any model (the agent is still syncing).
    assert_eq!(server.get("/v2/health/live").await.status, 200);
    let ready = server.get("/v2/health/ready").await;
    assert_eq!(
        (ready.status, &ready.body),
        (200, &json!({ "ready": true }))
    );
    let none = server.get("/v2/models/mlp/ready").await;
    assert_eq!(none.status, 404);
    assert!(none.body["error"].as_str().unwrap().contains("mlp"));

    server
        .host
        .activate(spec("mlp", "1.2.0", &mnist_model("mlp")))
        .await
        .unwrap();
    let want = json!({
        "name": "mlp",
        "versions": ["1.2.0"],
        "platform": "onnxruntime",
        "inputs": [{ "name": "input", "datatype": "FP32", "shape": [-1, 784] }],
        "outputs": [{ "name": "logits", "datatype": "FP32", "shape": [-1, 10] }],
    });
    let meta = server.get("/v2/models/mlp").await;
    assert_eq!((meta.status, &meta.body), (200, &want));
    let meta = server.get("/v2/models/mlp/versions/1.2.0").await;
    assert_eq!((meta.status, &meta.body), (200, &want));
    assert_eq!(server.get("/v2/models/mlp/versions/9").await.status, 404);
    let ready = server.get("/v2/models/mlp/ready").await;
    assert_eq!(
        (ready.status, &ready.body),
        (200, &json!({ "name": "mlp", "ready": true }))
    );
    assert_eq!(
        server
            .get("/v2/models/mlp/versions/1.2.0/ready")
            .await
            .status,
        200
    );
    assert_eq!(server.get("/v2").await.body["name"], "edgeloop-edge-agent");

    server.host.unload("mlp");
    assert_eq!(server.get("/v2/models/mlp").await.status, 404);
    assert_eq!(server.host.serving("mlp"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_a_protocol_error() {
    let mut cfg = config();
    cfg.max_request_bytes = 64 << 10;
    let server = start(cfg).await;
    server
        .host
        .activate(spec("mlp", "1", &mnist_model("mlp")))
        .await
        .unwrap();
    let row = noise(784, 1);
    let input = |shape: Value, datatype: &str, data: Value| json!({ "inputs": [{ "name": "input", "shape": shape, "datatype": datatype, "data": data }] });
    let ok = input(json!([1, 784]), "FP32", json!(row));
    let infer = "/v2/models/mlp/infer";
    let big = vec![0.5f32; 20_000];
    let mut two = ok.clone();
    two["inputs"]
        .as_array_mut()
        .unwrap()
        .push(ok["inputs"][0].clone());
    let mut extra = ok.clone();
    extra["inputs"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "name": "x", "shape": [1], "datatype": "FP32", "data": [1] }));
    let mut unknown_output = ok.clone();
    unknown_output["outputs"] = json!([{ "name": "probs" }]);

    // (what, path, body, status, part of the error)
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "not JSON",
            infer,
            b"{".to_vec(),
            400,
            "invalid request body",
        ),
        (
            "not an object",
            infer,
            b"[]".to_vec(),
            400,
            "invalid request body",
        ),
        (
            "no inputs field",
            infer,
            b"{}".to_vec(),
            400,
            "missing field `inputs`",
        ),
        ("empty body", infer, Vec::new(), 400, "invalid request body"),
        (
            "wrong fixed dim",
            infer,
            body(&input(json!([1, 783]), "FP32", json!(row[..783]))),
            400,
            "expects shape [-1, 784]",
        ),
        (
            "wrong rank",
            infer,
            body(&input(json!([784]), "FP32", json!(row))),
            400,
            "expects shape",
        ),
        (
            "wrong dtype",
            infer,
            body(&input(json!([1, 784]), "INT64", json!(vec![1; 784]))),
            400,
            "expects datatype FP32, got INT64",
        ),
        (
            "unsupported dtype",
            infer,
            body(&input(json!([1, 784]), "BYTES", json!(row))),
            400,
            "not supported",
        ),
        (
            "count differs from shape",
            infer,
            body(&input(json!([2, 784]), "FP32", json!(row))),
            400,
            "holds 1568 elements, but data has 784",
        ),
        (
            "negative dim",
            infer,
            body(&input(json!([-1, 784]), "FP32", json!(row))),
            400,
            "negative",
        ),
        (
            "string in data",
            infer,
            body(&input(json!([1, 1]), "FP32", json!(["a"]))),
            400,
            "data holds a string",
        ),
        (
            "bool as FP32",
            infer,
            body(&input(json!([1, 784]), "FP32", json!(vec![true; 784]))),
            400,
            "not a number",
        ),
        (
            "missing input",
            infer,
            body(&json!({ "inputs": [] })),
            400,
            "missing",
        ),
        ("duplicate input", infer, body(&two), 400, "more than once"),
        ("unknown input", infer, body(&extra), 400, "no such input"),
        (
            "unknown output",
            infer,
            body(&unknown_output),
            400,
            "no such output",
        ),
        (
            "unknown model",
            "/v2/models/nope/infer",
            body(&ok),
            404,
            "`nope` is not serving",
        ),
        (
            "version not serving",
            "/v2/models/mlp/versions/2/infer",
            body(&ok),
            404,
            "version `2` is not serving",
        ),
        (
            "over the size limit",
            infer,
            body(&input(json!([1, 20_000]), "FP32", json!(big))),
            413,
            "over the 65536-byte limit",
        ),
        (
            "no such endpoint",
            "/v2/nothing",
            body(&ok),
            404,
            "no such endpoint",
        ),
    ];
    for (what, path, request, status, message) in cases {
        let got = server.post_bytes(path, request).await;
        assert_eq!(got.status, status, "{what}: {}", got.text);
        let error = got.body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no error string in {}", got.text));
        assert!(
            error.contains(message),
            "{what}: {error:?} lacks {message:?}"
        );
    }
    let wrong_method = server.get(infer).await;
    assert_eq!(wrong_method.status, 405, "{}", wrong_method.text);
    assert!(wrong_method.body["error"].as_str().unwrap().contains("GET"));
    // And the good one still works, on the versioned path too.
    let got = server.post("/v2/models/mlp/versions/1/infer", &ok).await;
    assert_eq!(got.status, 200, "{}", got.text);
}

fn body(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// The binary tensor data extension, byte for byte: a JSON header of
/// `Inference-Header-Content-Length` bytes, then the tensors' bytes; JSON
/// and binary tensors mixed; sizes that disagree are a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_tensors_in_and_out() {
    let server = start(config()).await;
    let path = mnist_model("mlp");
    server.host.activate(spec("mlp", "1", &path)).await.unwrap();
    let data = noise(2 * 784, 7);
    let json_answer = server
        .post(
            "/v2/models/mlp/infer",
            &json!({"inputs": [{"name": "input", "shape": [2, 784], "datatype": "FP32", "data": data}]}),
        )
        .await;
    assert_eq!(json_answer.status, 200, "{}", json_answer.text);
    let want = output_data(&json_answer.body, 0);

    let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let header = serde_json::to_vec(&json!({
        "inputs": [{"name": "input", "shape": [2, 784], "datatype": "FP32",
                    "parameters": {"binary_data_size": raw.len()}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": true}}],
    }))
    .unwrap();
    let send = |header: Vec<u8>, raw: Vec<u8>, len: usize| {
        let mut body = header;
        body.extend_from_slice(&raw);
        server
            .client
            .post(format!("{}/v2/models/mlp/infer", server.base))
            .header("Inference-Header-Content-Length", len.to_string())
            .body(body)
            .send()
    };
    let r = send(header.clone(), raw.clone(), header.len())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let json_len: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = r.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&body[..json_len]).unwrap();
    let out = &head["outputs"][0];
    assert_eq!(out["parameters"]["binary_data_size"], 2 * 10 * 4, "{head}");
    assert!(out.get("data").is_none(), "{head}");
    let got: Vec<f32> = body[json_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got, want, "binary in, binary out: the same numbers as JSON");

    // One byte short, and one byte too many: refused, naming the input.
    let r = send(header.clone(), raw[1..].to_vec(), header.len())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("input") && text.contains("binary data left"),
        "{text}"
    );
    let mut long = raw.clone();
    long.push(0);
    let r = send(header.clone(), long, header.len()).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("not claimed"));
    let r = send(header.clone(), raw.clone(), header.len() + raw.len() + 1)
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// NVIDIA's tritonclient, the OIP client most users have, with its
/// defaults (binary tensors) and with JSON: both answer what ONNX Runtime
/// answers. The client comes from PyPI (scripts/python-clients.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_binary_and_json_match_onnxruntime() {
    let python = deps().join("pyclients/bin/python");
    assert!(
        python.is_file(),
        "{} not found: run scripts/python-clients.sh",
        python.display()
    );
    let server = start(config()).await;
    let path = mnist_model("mlp");
    server.host.activate(spec("mlp", "1", &path)).await.unwrap();
    let data = noise(3 * 784, 11);
    let request =
        json!({"inputs": [{"name": "input", "shape": [3, 784], "datatype": "FP32", "data": data}]});
    let want = output_data(&python_reference(&path, &request), 0);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.json");
    std::fs::write(&input, json!({"shape": [3, 784], "data": data}).to_string()).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tritonclient_infer.py");
    let host_port = server.base.trim_start_matches("http://").to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(fixture)
            .args([&host_port, "mlp", "input", "logits"])
            .arg(&input)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "tritonclient: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (label, binary) in [("binary", true), ("json", false), ("default", true)] {
        let a = &answers[label];
        assert_eq!(a["sent_binary"], binary, "{label}: {a}");
        let got: Vec<f32> = a["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(got.len(), want.len(), "{label}");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{label}: max abs difference {worst}");
    }
}
