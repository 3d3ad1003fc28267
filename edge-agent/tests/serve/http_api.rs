//! The REST API against real models: answers equal Python ONNX Runtime's,
//! metadata and health as the protocol has them, and every bad request
//! gets its status and `{"error": ...}`.

use std::process::Command;

use edgeloop_edge_agent::serving::ModelServing;
use serde_json::{json, Value};

use crate::common::*;

/// Python ONNX Runtime's answer to the same request (tools/oip_reference.py).
fn python_reference(model: &std::path::Path, request: &Value) -> Value {
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
        "oip_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

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
