//! Latency judged where the model will run: `edgeloop model quantize
//! --benchmark-selector` has a real enrolled agent time float and every
//! candidate within the accuracy budget over its own gRPC channel, and the
//! gate chooses with those timings; the evidence says which device. Then
//! the API's rules: what a benchmark request may say, what a device may
//! fetch and report, and a benchmark no device takes failing at its
//! deadline.

use std::path::Path;
use std::time::Duration;

use edgeloop_client_core::Role;
use edgeloop_edge_agent::AgentConfig;
use edgeloop_models::npz::Npz;
use edgeloop_models::tensor::Tensor;
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_tests::mnist::{digits, mnist_dir};
use edgeloop_tests::{eventually, ControlPlane};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gate_judges_latency_on_the_device_that_timed_each_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let cp = ControlPlane::start(&work.join("cp")).await;
    let stop = CancellationToken::new();
    let token = cp
        .labelled_token("device", "edge-bench", json!({"class": "jetson-like"}))
        .await;
    let agent_dir = work.join("edge-bench");
    // The key `model quantize` signs with, which the device trusts: it
    // runs only signed models, benchmarks too.
    let home = work.join("home");
    let key_path = home.join("keys").join("manifest-signing.key");
    let key = edgeloop_models::package::load_or_create_key(&key_path).unwrap();
    let config = AgentConfig::new(
        cp.member_config(&agent_dir, Some(token)),
        vec![key.public()],
    );
    let agent = tokio::spawn(edgeloop_edge_agent::run(config, stop.clone()));
    eventually(WAIT, "the device online", || async {
        let (_, d) = cp.api().get("/api/v1/devices/edge-bench").await;
        (d["status"] == "online").then_some(())
    })
    .await;

    let mnist = mnist_dir();
    let out = work.join("digits.onnx");
    let mut quantize = cp.edgeloop_command();
    quantize
        .args([
            "model",
            "quantize",
            path(&mnist.join("mlp.onnx")),
            "--calibration",
            path(&mnist.join("calib_mlp.npz")),
            "--eval",
            path(&mnist.join("eval_mlp.npz")),
            "--out",
            path(&out),
            "--benchmark-selector",
            "class=jetson-like",
            "--benchmark-runs",
            "20",
            "--json",
        ])
        .env("EDGELOOP_HOME", &home);
    let quantized = edgeloop_tests::output_of(quantize).await;
    let stderr = String::from_utf8_lossy(&quantized.stderr);
    assert!(quantized.status.success(), "{stderr}");
    let outcome: Value = serde_json::from_slice(&quantized.stdout).unwrap();

    // The benchmark the command queued, on the class's one device, its
    // models signed.
    let (status, all) = cp.api().get("/api/v1/benchmarks").await;
    assert_eq!(status, 200, "{all}");
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    let bench = &all[0];
    assert_eq!(bench["state"], "succeeded", "{bench}");
    assert_eq!(bench["device"], "edge-bench", "{bench}");
    assert_eq!(bench["selector"], "class=jetson-like", "{bench}");
    assert_eq!(bench["runs"], 20, "{bench}");
    assert!(
        bench["timed_on"].as_str().unwrap().starts_with("device: "),
        "the agent describes its machine: {bench}"
    );
    let results = bench["results"].as_array().unwrap();
    let timed: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    // Float and exactly the candidates within the accuracy budget.
    let mut expected = vec!["float"];
    for c in outcome["candidates"].as_array().unwrap() {
        if c["within_budget"] == true {
            expected.push(c["name"].as_str().unwrap());
        }
    }
    assert!(
        expected.len() > 1,
        "some candidate is within budget: {outcome}"
    );
    assert_eq!(timed, expected, "{bench}");
    for m in bench["models"].as_array().unwrap() {
        assert!(m["manifest_digest"].is_string(), "{m}");
    }
    for r in results {
        assert_eq!(r["execution_provider"], "CPUExecutionProvider", "{r}");
        assert_eq!(r["runs"], 20, "{r}");
        let p50 = r["latency_p50_ms"].as_f64().unwrap();
        assert!(
            p50 > 0.0 && p50 <= r["latency_p90_ms"].as_f64().unwrap(),
            "{r}"
        );
    }

    // The gate decided with the device's numbers, and says so.
    let device_ms = |name: &str| {
        results
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["latency_p50_ms"].as_f64())
    };
    assert_eq!(outcome["float"]["latency_ms"].as_f64(), device_ms("float"));
    for c in outcome["candidates"].as_array().unwrap() {
        if c["within_budget"] == true {
            let name = c["name"].as_str().unwrap();
            assert_eq!(c["latency_ms"].as_f64(), device_ms(name), "{c}");
            // Under the default device rule: not slower than float + 10 %.
            let slower = device_ms(name).unwrap() > device_ms("float").unwrap() * 1.1;
            assert_eq!(c["accepted"] == false, slower, "{c}");
        }
    }
    assert_eq!(outcome["latency"]["policy"], "not_slower_than_float");
    let timed_on = outcome["latency"]["timed_on"].as_str().unwrap();
    let id = bench["id"].as_str().unwrap();
    assert!(
        timed_on.contains("device edge-bench") && timed_on.contains(id),
        "{timed_on}"
    );
    assert!(
        outcome["reason"]
            .as_str()
            .unwrap()
            .ends_with(&format!("latency judged on {timed_on}")),
        "{outcome}"
    );
    // In the signed evidence too.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(work.join("digits.onnx.manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest["manifest"]["quantization"]["evidence"]["latency"]["timed_on"], timed_on,
        "{manifest}"
    );
    // A model without a manifest, or signed by a key the device does not
    // trust, is refused by the device: reported as that model's error.
    let model = std::fs::read(mnist.join("mlp.onnx")).unwrap();
    let artifact = cp.upload(&model).await;
    let stranger = edgeloop_models::manifest::ManifestKey::generate()
        .sign(edgeloop_tests::manifests::mnist_manifest(
            "digits",
            "1.0.0",
            &model,
            Digest::of(b"unused"),
            1000.0,
        ))
        .unwrap();
    let foreign = cp
        .upload(stranger.to_json_pretty().unwrap().as_bytes())
        .await;
    let inputs = cp.upload(&edgeloop_tests::mnist::probe_npz(1)).await;
    let (status, made) = cp
        .api()
        .post(
            "/api/v1/benchmarks",
            json!({"device": "edge-bench", "inputs_digest": inputs.to_string(), "runs": 3,
                   "models": [{"name": "unsigned", "artifact_digest": artifact.to_string()},
                              {"name": "foreign", "artifact_digest": artifact.to_string(),
                               "manifest_digest": foreign.to_string()}]}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let refused_id = made["id"].as_str().unwrap().to_string();
    let refused = eventually(WAIT, "the unsigned benchmark ends", || async {
        let (_, b) = cp
            .api()
            .get(&format!("/api/v1/benchmarks/{refused_id}"))
            .await;
        (b["state"] == "succeeded" || b["state"] == "failed").then_some(b)
    })
    .await;
    assert_eq!(refused["state"], "succeeded", "{refused}");
    let error = |i: usize| {
        refused["results"][i]["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(error(0).starts_with("unsigned"), "{refused}");
    assert!(error(1).starts_with("bad signature"), "{refused}");
    assert!(
        refused["results"][0]["latency_p50_ms"].is_null(),
        "{refused}"
    );

    // The device's scratch space is empty again.
    let scratch = agent_dir.join("benchmarks");
    assert!(
        edgeloop_tests::files_under(&scratch).is_empty(),
        "{:?}",
        edgeloop_tests::files_under(&scratch)
    );

    stop.cancel();
    agent.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmark_requests_reports_and_fetches_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let model = std::fs::read(mnist_dir().join("mlp.onnx")).unwrap();
    let artifact = cp.upload(&model).await;
    let mut inputs = Npz::new();
    inputs.insert("input", Tensor::F32(digits(1)));
    let inputs = cp.upload(&inputs.to_bytes().unwrap()).await;
    let unrelated = cp.upload(b"not for benchmarks").await;
    let missing = Digest::of(b"never uploaded");
    let body = |extra: Value| {
        let mut b = json!({"models": [{"name": "float", "artifact_digest": artifact.to_string()}],
                           "inputs_digest": inputs.to_string()});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let refused = |status: u16, field: Option<&'static str>, extra: Value| {
        let api = cp.api();
        let request = body(extra);
        async move {
            let (got, answer) = api.post("/api/v1/benchmarks", request.clone()).await;
            assert_eq!(
                (got.as_u16(), answer["error"]["field"].as_str()),
                (status, field),
                "{request} -> {answer}"
            );
        }
    };
    refused(400, Some("device"), json!({})).await;
    refused(
        400,
        Some("selector"),
        json!({"device": "a", "selector": "x=y"}),
    )
    .await;
    refused(400, Some("device"), json!({"device": "Not_A_Name"})).await;
    refused(400, Some("runs"), json!({"device": "a", "runs": 0})).await;
    refused(
        400,
        Some("timeout_seconds"),
        json!({"device": "a", "timeout_seconds": 1}),
    )
    .await;
    refused(
        400,
        Some("models[1].name"),
        json!({"device": "a", "models": [
            {"name": "float", "artifact_digest": artifact.to_string()},
            {"name": "float", "artifact_digest": artifact.to_string()}]}),
    )
    .await;
    refused(400, Some("models"), json!({"device": "a", "models": []})).await;
    refused(404, None, json!({"device": "nobody"})).await;
    refused(409, None, json!({"selector": "class=none"})).await;

    // A device enrolled, whose agent never runs: its channel is this test.
    let token = cp.token("device", "edge-quiet").await;
    let channel = cp
        .connect(Role::Device, &token, &dir.path().join("edge-quiet"))
        .await;
    let mut device = AgentServiceClient::new(channel);
    refused(
        404,
        None,
        json!({"device": "edge-quiet", "models": [
            {"name": "float", "artifact_digest": missing.to_string()}]}),
    )
    .await;

    let (status, made) = cp
        .api()
        .post("/api/v1/benchmarks", body(json!({"device": "edge-quiet"})))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["state"], "pending");
    let id = made["id"].as_str().unwrap().to_string();
    let mut tasks = device
        .watch_benchmarks(pb::WatchBenchmarksRequest {})
        .await
        .unwrap()
        .into_inner();
    let task = tasks.next().await.unwrap().unwrap();
    assert_eq!(task.id, id);
    assert_eq!(task.models[0].artifact_digest, artifact.to_hex());
    assert_eq!(task.models[0].artifact_size, model.len() as u64);
    let (_, running) = cp.api().get(&format!("/api/v1/benchmarks/{id}")).await;
    assert_eq!(running["state"], "running", "{running}");

    // The benchmark's files may be fetched; nothing else unassigned may.
    let fetcher = device.clone();
    let fetch = |digest: Digest| {
        let mut device = fetcher.clone();
        async move {
            let mut s = device
                .fetch_artifact(pb::FetchArtifactRequest {
                    digest: digest.to_string(),
                    offset: 0,
                    max_chunk_bytes: 0,
                })
                .await?
                .into_inner();
            let mut n = 0;
            while let Some(chunk) = s.next().await {
                n += chunk?.data.len();
            }
            Ok::<usize, tonic::Status>(n)
        }
    };
    assert_eq!(fetch(artifact).await.unwrap(), model.len());
    assert!(fetch(inputs).await.is_ok());
    assert_eq!(
        fetch(unrelated).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );

    // Reports are checked: the benchmark's own models, once each, numbers.
    let timing = |name: &str, p50: f64| pb::ModelTiming {
        name: name.into(),
        latency_p50_ms: p50,
        latency_p90_ms: p50,
        runs: 5,
        execution_provider: "CPUExecutionProvider".into(),
        error: String::new(),
    };
    let report = |timings: Vec<pb::ModelTiming>| pb::BenchmarkReport {
        id: id.clone(),
        timings,
        timed_on: "test device".into(),
        error: String::new(),
    };
    for (bad, code) in [
        (
            report(vec![timing("other", 1.0)]),
            tonic::Code::InvalidArgument,
        ),
        (
            report(vec![timing("float", f64::NAN)]),
            tonic::Code::InvalidArgument,
        ),
        (report(vec![]), tonic::Code::InvalidArgument),
        (
            pb::BenchmarkReport {
                id: "b-999".into(),
                ..report(vec![timing("float", 1.0)])
            },
            tonic::Code::NotFound,
        ),
    ] {
        let got = device.report_benchmark(bad.clone()).await.unwrap_err();
        assert_eq!(got.code(), code, "{bad:?}: {got}");
    }
    device
        .report_benchmark(report(vec![timing("float", 0.25)]))
        .await
        .unwrap();
    let (_, done) = cp.api().get(&format!("/api/v1/benchmarks/{id}")).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["results"][0]["latency_p50_ms"], 0.25, "{done}");
    assert_eq!(done["timed_on"], "test device");
    let again = device
        .report_benchmark(report(vec![timing("float", 9.0)]))
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again}");
    // Finished: its files are no longer the device's to fetch.
    assert_eq!(
        fetch(artifact).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );

    // One no device takes fails at its deadline, saying why.
    let (status, late) = cp
        .api()
        .post(
            "/api/v1/benchmarks",
            body(json!({"device": "edge-quiet", "timeout_seconds": 5})),
        )
        .await;
    assert_eq!(status, 201, "{late}");
    let late_id = late["id"].as_str().unwrap().to_string();
    drop(tasks);
    let failed = eventually(Duration::from_secs(30), "the benchmark fails", || async {
        let (_, b) = cp.api().get(&format!("/api/v1/benchmarks/{late_id}")).await;
        (b["state"] == "failed").then_some(b)
    })
    .await;
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.contains("edge-quiet") && reason.contains("5 s"),
        "{failed}"
    );
    let (status, missing) = cp.api().get("/api/v1/benchmarks/b-999999999999").await;
    assert_eq!(status, 404, "{missing}");
    cp.stop().await;
}
