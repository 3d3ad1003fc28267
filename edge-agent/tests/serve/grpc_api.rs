//! The gRPC service (`inference.GRPCInferenceService`) against real models
//! over real loopback connections, with tonic's client and with NVIDIA's
//! tritonclient.grpc: answers equal Python ONNX Runtime's and the REST
//! API's, every RPC answers as the protocol has it, every bad request gets
//! its code and a message naming what is wrong, a full queue is
//! RESOURCE_EXHAUSTED, and both front ends count in the same `/metrics`.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use edgeloop_edge_agent::serve::RETRY_PUSHBACK;
use edgeloop_edge_agent::serving::ModelServing;
use edgeloop_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use edgeloop_proto::inference::model_metadata_response::TensorMetadata;
use edgeloop_proto::inference::{
    InferTensorContents, ModelInferRequest, ModelInferResponse, ModelMetadataRequest,
    ModelMetadataResponse, ModelReadyRequest, ServerLiveRequest, ServerMetadataRequest,
    ServerReadyRequest,
};
use prost::bytes::Bytes;
use serde_json::{json, Value};
use tonic::Code;

use crate::common::*;

fn raw_f32(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        parameters: Default::default(),
        contents: None,
    }
}

/// One FP32 input as raw_input_contents, as tritonclient sends it.
fn raw_request(model: &str, name: &str, shape: &[i64], data: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![input(name, "FP32", shape)],
        raw_input_contents: vec![raw_f32(data)],
        ..Default::default()
    }
}

/// Output `i`'s floats, from raw_output_contents.
fn output_f32(response: &ModelInferResponse, i: usize) -> Vec<f32> {
    assert_eq!(
        response.raw_output_contents.len(),
        response.outputs.len(),
        "one raw_output_contents entry per output"
    );
    response.raw_output_contents[i]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn ready(name: &str, version: &str) -> ModelReadyRequest {
    ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    }
}

fn metadata(name: &str, version: &str) -> ModelMetadataRequest {
    ModelMetadataRequest {
        name: name.into(),
        version: version.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_and_metadata() {
    let server = start(config()).await;
    let mut grpc = server.grpc().await;
    // Live and ready before any model, like the REST API.
    let live = grpc.server_live(ServerLiveRequest {}).await.unwrap();
    assert!(live.into_inner().live);
    let r = grpc.server_ready(ServerReadyRequest {}).await.unwrap();
    assert!(r.into_inner().ready);
    let r = grpc.model_ready(ready("mlp", "")).await.unwrap();
    assert!(!r.into_inner().ready, "nothing serves yet");
    let e = grpc.model_metadata(metadata("mlp", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("`mlp` is not serving"), "{e:?}");

    let server_meta = grpc
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(server_meta.name, "edgeloop-edge-agent");
    assert_eq!(server_meta.version, env!("CARGO_PKG_VERSION"));
    // The same as REST's.
    assert_eq!(server.get("/v2").await.body["name"], server_meta.name);

    server
        .host
        .activate(spec("mlp", "1.2.0", &mnist_model("mlp")))
        .await
        .unwrap();
    let tensor = |name: &str, shape: Vec<i64>| TensorMetadata {
        name: name.into(),
        datatype: "FP32".into(),
        shape,
    };
    let want = ModelMetadataResponse {
        name: "mlp".into(),
        versions: vec!["1.2.0".into()],
        platform: "onnxruntime".into(),
        inputs: vec![tensor("input", vec![-1, 784])],
        outputs: vec![tensor("logits", vec![-1, 10])],
    };
    for version in ["", "1.2.0"] {
        let got = grpc.model_metadata(metadata("mlp", version)).await.unwrap();
        assert_eq!(got.into_inner(), want, "version {version:?}");
        let r = grpc.model_ready(ready("mlp", version)).await.unwrap();
        assert!(r.into_inner().ready, "version {version:?}");
    }
    let e = grpc.model_metadata(metadata("mlp", "9")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("version `9` is not serving"), "{e:?}");
    let r = grpc.model_ready(ready("mlp", "9")).await.unwrap();
    assert!(!r.into_inner().ready);
    let r = grpc.model_ready(ready("", "")).await.unwrap();
    assert!(!r.into_inner().ready);

    server.host.unload("mlp");
    let r = grpc.model_ready(ready("mlp", "")).await.unwrap();
    assert!(!r.into_inner().ready);
    let e = grpc.model_metadata(metadata("mlp", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

/// Raw and typed inputs give Python ONNX Runtime's answer, and exactly the
/// REST API's (one request path, one session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_infer_matches_python_onnxruntime_and_rest() {
    let server = start(config()).await;
    let mut grpc = server.grpc().await;
    for (name, item_shape) in [("mlp", vec![784i64]), ("cnn", vec![1, 28, 28])] {
        let path = mnist_model(name);
        server
            .host
            .activate(spec(name, "1", &path))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let batch = 5usize;
        let mut shape = vec![batch as i64];
        shape.extend(&item_shape);
        let data = noise(batch * 784, 42);
        let rest = json!({
            "inputs": [{ "name": "input", "shape": shape, "datatype": "FP32", "data": data }],
        });
        let want = output_data(&python_reference(&path, &rest), 0);
        let over_rest = server
            .post(&format!("/v2/models/{name}/infer"), &rest)
            .await;
        assert_eq!(over_rest.status, 200, "{}", over_rest.text);

        let mut request = raw_request(name, "input", &shape, &data);
        request.id = format!("{name}-check");
        let got = grpc.model_infer(request).await.unwrap().into_inner();
        assert_eq!(got.model_name, name);
        assert_eq!(got.model_version, "1");
        assert_eq!(got.id, format!("{name}-check"));
        assert_eq!(got.outputs.len(), 1);
        let out = &got.outputs[0];
        assert_eq!(
            (
                out.name.as_str(),
                out.datatype.as_str(),
                out.shape.as_slice()
            ),
            ("logits", "FP32", &[batch as i64, 10][..])
        );
        assert!(out.contents.is_none(), "outputs go as raw_output_contents");
        let ours = output_f32(&got, 0);
        let worst = max_abs_diff(&ours, &want);
        assert!(worst <= 1e-5, "{name}: max abs difference {worst}");
        assert_eq!(ours, output_data(&over_rest.body, 0), "{name}: gRPC = REST");

        // Typed contents, the version named, the output asked for, no id.
        let mut typed = input("input", "FP32", &shape);
        typed.contents = Some(InferTensorContents {
            fp32_contents: data.clone(),
            ..Default::default()
        });
        let request = ModelInferRequest {
            model_name: name.into(),
            model_version: "1".into(),
            inputs: vec![typed],
            outputs: vec![InferRequestedOutputTensor {
                name: "logits".into(),
                parameters: Default::default(),
            }],
            ..Default::default()
        };
        let again = grpc.model_infer(request).await.unwrap().into_inner();
        assert_eq!(output_f32(&again, 0), ours, "{name}: typed = raw");
        assert_eq!(again.id.len(), 36, "a generated id is a UUID: {}", again.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_bad_requests_get_their_code_and_name_the_input() {
    let mut cfg = config();
    cfg.max_request_bytes = 64 << 10;
    let server = start(cfg).await;
    server
        .host
        .activate(spec("mlp", "1", &mnist_model("mlp")))
        .await
        .unwrap();
    let mut grpc = server.grpc().await;
    let row = noise(784, 1);
    let ok = raw_request("mlp", "input", &[1, 784], &row);
    let with = |f: &dyn Fn(&mut ModelInferRequest)| {
        let mut r = ok.clone();
        f(&mut r);
        r
    };
    let fp32 = |v: &[f32]| {
        Some(InferTensorContents {
            fp32_contents: v.to_vec(),
            ..Default::default()
        })
    };
    let output = |name: &str| InferRequestedOutputTensor {
        name: name.into(),
        parameters: Default::default(),
    };
    let big = vec![0.5f32; 20_000];

    // (what, request, code, parts of the message)
    let cases: Vec<(&str, ModelInferRequest, Code, &[&str])> = vec![
        (
            "raw entries differ from inputs",
            with(&|r| r.raw_input_contents.push(raw_f32(&row))),
            Code::InvalidArgument,
            &["raw_input_contents has 2 entries for 1 inputs"],
        ),
        (
            "raw bytes short of the shape",
            with(&|r| r.raw_input_contents[0] = raw_f32(&row[1..])),
            Code::InvalidArgument,
            &[
                "input `input`",
                "needs 3136 bytes, its raw_input_contents has 3132",
            ],
        ),
        (
            "raw bytes over the shape",
            with(&|r| r.inputs[0].shape = vec![1, 783]),
            Code::InvalidArgument,
            &["input `input`", "needs 3132 bytes"],
        ),
        (
            "unknown datatype",
            with(&|r| r.inputs[0].datatype = "BYTES".into()),
            Code::InvalidArgument,
            &["input `input`", "\"BYTES\" is not supported"],
        ),
        (
            "negative dim",
            with(&|r| r.inputs[0].shape = vec![-1, 784]),
            Code::InvalidArgument,
            &["input `input`", "negative"],
        ),
        (
            "raw and typed contents",
            with(&|r| r.inputs[0].contents = fp32(&row)),
            Code::InvalidArgument,
            &["input `input`", "give one or the other"],
        ),
        (
            "no data at all",
            with(&|r| r.raw_input_contents.clear()),
            Code::InvalidArgument,
            &["input `input`", "has no data"],
        ),
        (
            "typed count differs from shape",
            with(&|r| {
                r.raw_input_contents.clear();
                r.inputs[0].contents = fp32(&row[..10]);
            }),
            Code::InvalidArgument,
            &[
                "input `input`",
                "holds 784 elements, but contents.fp32_contents has 10",
            ],
        ),
        (
            "typed contents in another dtype's field",
            with(&|r| {
                r.raw_input_contents.clear();
                r.inputs[0].contents = Some(InferTensorContents {
                    int64_contents: vec![1; 784],
                    ..Default::default()
                });
            }),
            Code::InvalidArgument,
            &["input `input`", "go in contents.fp32_contents"],
        ),
        (
            "wrong fixed dim",
            with(&|r| {
                r.inputs[0].shape = vec![2, 392];
            }),
            Code::InvalidArgument,
            &["input `input`", "expects shape [-1, 784]"],
        ),
        (
            "wrong rank",
            with(&|r| r.inputs[0].shape = vec![784]),
            Code::InvalidArgument,
            &["input `input`", "expects shape"],
        ),
        (
            "wrong dtype",
            with(&|r| {
                r.inputs[0].datatype = "INT64".into();
                r.inputs[0].shape = vec![1, 392];
            }),
            Code::InvalidArgument,
            &["input `input`", "expects datatype FP32, got INT64"],
        ),
        (
            "missing input",
            with(&|r| {
                r.inputs.clear();
                r.raw_input_contents.clear();
            }),
            Code::InvalidArgument,
            &["input `input`", "missing"],
        ),
        (
            "duplicate input",
            with(&|r| {
                r.inputs.push(r.inputs[0].clone());
                r.raw_input_contents.push(raw_f32(&row));
            }),
            Code::InvalidArgument,
            &["input `input`", "more than once"],
        ),
        (
            "unknown input",
            with(&|r| {
                r.inputs.push(input("x", "FP32", &[1]));
                r.raw_input_contents.push(raw_f32(&[1.0]));
            }),
            Code::InvalidArgument,
            &["input `x`", "no such input"],
        ),
        (
            "unknown output",
            with(&|r| r.outputs = vec![output("probs")]),
            Code::InvalidArgument,
            &["output `probs`", "no such output"],
        ),
        (
            "output asked twice",
            with(&|r| r.outputs = vec![output("logits"), output("logits")]),
            Code::InvalidArgument,
            &["output `logits`", "more than once"],
        ),
        (
            "unknown model",
            with(&|r| r.model_name = "nope".into()),
            Code::NotFound,
            &["`nope` is not serving"],
        ),
        (
            "version not serving",
            with(&|r| r.model_version = "2".into()),
            Code::NotFound,
            &["version `2` is not serving"],
        ),
        (
            "over the size limit",
            raw_request("mlp", "input", &[1, 20_000], &big),
            Code::OutOfRange,
            &["65536"],
        ),
    ];
    for (what, request, code, parts) in cases {
        let e = grpc.model_infer(request).await.unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
        for part in parts {
            assert!(e.message().contains(part), "{what}: {e:?} lacks {part:?}");
        }
    }
    // The connection survived every refusal, and the good one still works.
    let got = grpc.model_infer(ok).await.unwrap().into_inner();
    assert_eq!(output_f32(&got, 0).len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_resource_exhausted_with_a_retry_pushback() {
    let mut cfg = config();
    cfg.workers_per_model = 1;
    cfg.queue_capacity = 1;
    cfg.max_batch_size = 1;
    let server = start(cfg).await;
    let models = Models::new();
    let slow = models.write("slow", &slow_model(512, 60));
    server
        .host
        .activate(spec("slow", "1", &slow))
        .await
        .unwrap();
    let request = raw_request("slow", "x", &[1, 512], &noise(512, 9));
    let grpc = server.grpc().await;
    let started = Instant::now();
    // 16 at once, multiplexed on one connection as gRPC clients do.
    let calls = (0..16).map(|_| {
        let (mut grpc, request) = (grpc.clone(), request.clone());
        tokio::spawn(async move { grpc.model_infer(request).await })
    });
    let mut ok = 0;
    let mut full = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => full.push(e),
        }
    }
    assert!(ok >= 1, "some were served");
    assert!(
        !full.is_empty(),
        "the queue of 1 never overflowed in {:?}",
        started.elapsed()
    );
    for e in &full {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("retry later"), "{e:?}");
        assert_eq!(
            e.metadata()
                .get(RETRY_PUSHBACK)
                .map(|v| v.to_str().unwrap()),
            Some("1000"),
            "{e:?}"
        );
    }
    // Once drained it serves again.
    let mut grpc = grpc;
    grpc.model_infer(request).await.unwrap();
    let metrics = server.get("/metrics").await.text;
    assert!(
        metrics.contains("edgeloop_inference_queue_depth{model=\"slow\"} 0"),
        "{metrics}"
    );
}

/// One set of counters for both front ends, and the observer sees gRPC
/// requests with their ids like REST ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_rest_requests_count_in_the_same_metrics() {
    let recorder = Arc::new(Recorder::default());
    let server = start_observed(config(), recorder.clone()).await;
    let models = Models::new();
    let add = models.write("add", &add_model(1.0));
    server.host.activate(spec("add", "1", &add)).await.unwrap();
    let mut grpc = server.grpc().await;
    for _ in 0..3 {
        let got = server
            .post("/v2/models/add/infer", &infer_body("x", &[1, 4], &[0.0; 4]))
            .await;
        assert_eq!(got.status, 200, "{}", got.text);
    }
    for i in 0..4 {
        let mut request = raw_request("add", "x", &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
        request.id = format!("grpc-{i}");
        let got = grpc.model_infer(request).await.unwrap().into_inner();
        assert_eq!(output_f32(&got, 0), vec![2.0, 3.0, 4.0, 5.0]);
    }
    for _ in 0..2 {
        let bad = raw_request("add", "x", &[1, 3], &[1.0, 2.0, 3.0]);
        let e = grpc.model_infer(bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    // Not routed to a version: not counted, as over REST.
    let unknown = raw_request("nope", "x", &[1, 4], &[0.0; 4]);
    assert_eq!(
        grpc.model_infer(unknown).await.unwrap_err().code(),
        Code::NotFound
    );
    let metrics = server.get("/metrics").await.text;
    for line in [
        "edgeloop_inference_requests_total{model=\"add\",version=\"1\"} 9",
        "edgeloop_inference_errors_total{model=\"add\",version=\"1\"} 2",
        "edgeloop_inference_latency_seconds_count{model=\"add\",version=\"1\"} 9",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
    let observed = recorder.observed.lock().unwrap().clone();
    assert_eq!(observed.len(), 9);
    for i in 0..4 {
        let o = observed
            .iter()
            .find(|o| o.id == format!("grpc-{i}"))
            .unwrap_or_else(|| panic!("grpc-{i} not observed: {observed:?}"));
        assert!(o.ok);
        assert_eq!(
            (o.inputs.as_slice(), o.outputs.as_slice()),
            (&["x".to_string()][..], &["y".to_string()][..])
        );
    }
    assert_eq!(observed.iter().filter(|o| !o.ok).count(), 2);
}

/// NVIDIA's tritonclient.grpc, with its defaults: health, metadata, infer
/// (raw contents both ways) equal to ONNX Runtime's answer, and the codes
/// of two refusals. The client comes from PyPI (scripts/python-clients.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_grpc_matches_onnxruntime() {
    let python = deps().join("pyclients/bin/python");
    assert!(
        python.is_file(),
        "{} not found: run scripts/python-clients.sh",
        python.display()
    );
    let server = start(config()).await;
    let path = mnist_model("mlp");
    server.host.activate(spec("mlp", "1", &path)).await.unwrap();
    let data = noise(3 * 784, 13);
    let request =
        json!({"inputs": [{"name": "input", "shape": [3, 784], "datatype": "FP32", "data": data}]});
    let want = output_data(&python_reference(&path, &request), 0);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.json");
    std::fs::write(&input, json!({"shape": [3, 784], "data": data}).to_string()).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tritonclient_grpc_infer.py");
    let addr = server.grpc_addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(fixture)
            .args([&addr, "mlp", "input", "logits"])
            .arg(&input)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "tritonclient.grpc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            &a["live"],
            &a["ready"],
            &a["model_ready"],
            &a["unknown_model_ready"]
        ),
        (&json!(true), &json!(true), &json!(true), &json!(false)),
        "{a}"
    );
    assert_eq!(a["server"]["name"], "edgeloop-edge-agent", "{a}");
    assert_eq!(
        a["metadata"],
        json!({
            "name": "mlp", "versions": ["1"], "platform": "onnxruntime",
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 784]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
        })
    );
    for label in ["default", "named"] {
        let r = &a[label];
        assert_eq!(r["shape"], json!([3, 10]), "{label}: {r}");
        assert_eq!(r["datatype"], "FP32", "{label}");
        assert_eq!(r["model_version"], "1", "{label}");
        assert_eq!(r["raw_outputs"], 1, "{label}: outputs as raw contents");
        let got: Vec<f32> = r["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let worst = max_abs_diff(&got, &want);
        assert!(worst <= 1e-5, "{label}: max abs difference {worst}");
    }
    assert_eq!(a["named"]["id"], "tc-grpc-1");
    assert_eq!(a["default"]["id"].as_str().unwrap().len(), 36, "{a}");
    let refusal = |key: &str, status: &str, part: &str| {
        assert_eq!(a[key]["status"], status, "{key}: {a}");
        let message = a[key]["message"].as_str().unwrap();
        assert!(message.contains(part), "{key}: {message:?} lacks {part:?}");
    };
    refusal(
        "wrong_shape",
        "StatusCode.INVALID_ARGUMENT",
        "expects shape [-1, 784]",
    );
    refusal(
        "unknown_model",
        "StatusCode.NOT_FOUND",
        "`no-such-model` is not serving",
    );
    refusal(
        "unknown_metadata",
        "StatusCode.NOT_FOUND",
        "`no-such-model` is not serving",
    );
}
