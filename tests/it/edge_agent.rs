//! The whole edge agent (`edgeloop_edge_agent::run`: model sync, ONNX
//! Runtime serving over the Open Inference Protocol v2, telemetry and
//! heartbeats together) against a real control plane, with a real MNIST
//! model: assign → download → verify → activate → infer gives ONNX
//! Runtime's own outputs; a new version swaps in under load with no failed
//! request; feedback and telemetry flow; a restart with the control plane
//! down serves from disk.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use edgeloop_control_plane::fleet::assignments::{self, AssignmentRecord};
use edgeloop_control_plane::fleet::telemetry::AssignmentState;
use edgeloop_edge_agent::AgentConfig;
use edgeloop_models::manifest::{Manifest, ManifestKey};
use edgeloop_models::runtime::{OrtRuntime, SessionOptions};
use edgeloop_models::tensor::Tensor;
use edgeloop_models::Digest;
use edgeloop_registry::models::ModelVersionRecord;
use edgeloop_tests::mnist::{digits, mnist_dir, probe_npz};
use edgeloop_tests::{eventually, ControlPlane};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

fn manifest(version: &str, model: &[u8], probe: Digest) -> Manifest {
    edgeloop_tests::manifests::mnist_manifest("digits", version, model, probe, 1000.0)
}

/// Registers `version` of "digits": the MLP, its probe inputs and a signed manifest.
async fn register(cp: &ControlPlane, key: &ManifestKey, version: &str) -> ModelVersionRecord {
    let model = std::fs::read(mnist_dir().join("mlp.onnx")).unwrap();
    let probe = cp.upload(&probe_npz(4)).await;
    let registered = cp
        .register_signed(key, manifest(version, &model, probe), &model)
        .await;
    serde_json::from_value(registered).unwrap()
}

async fn assign(cp: &ControlPlane, v: &ModelVersionRecord) {
    assignments::replace(
        &cp.core.store,
        &cp.core.events,
        "edge-1",
        vec![AssignmentRecord::for_version(
            v,
            format!("dep-{}", v.version),
            120,
        )],
    )
    .await
    .unwrap();
}

async fn wait_active(cp: &ControlPlane, version: &str) -> Value {
    eventually(WAIT, &format!("digits {version} active"), || async {
        cp.core
            .store
            .fleet
            .assignment_status
            .get("edge-1/digits")
            .unwrap()
            .filter(|s| s.model_version == version && s.state == AssignmentState::Active)
            .map(|s| serde_json::to_value(s).unwrap())
    })
    .await
}

fn agent_config(
    cp: &ControlPlane,
    dir: &Path,
    token: Option<String>,
    key: &ManifestKey,
) -> AgentConfig {
    let mut config = AgentConfig::new(cp.member_config(dir, token), vec![key.public()]);
    config.telemetry.interval = Duration::from_secs(1);
    config
}

async fn inference_url(dir: &Path) -> String {
    let addr = eventually(WAIT, "the inference address file", || async {
        std::fs::read_to_string(dir.join(edgeloop_edge_agent::INFERENCE_ADDR_FILE)).ok()
    })
    .await;
    format!("http://{}", addr.trim())
}

/// One ModelInfer over the agent's gRPC service, found through its address
/// file, with `rows` as raw_input_contents.
async fn grpc_infer(
    dir: &Path,
    rows: &ndarray::ArrayD<f32>,
    id: &str,
) -> edgeloop_proto::inference::ModelInferResponse {
    use edgeloop_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use edgeloop_proto::inference::model_infer_request::InferInputTensor;
    use edgeloop_proto::inference::ModelInferRequest;
    let addr = eventually(WAIT, "the gRPC inference address file", || async {
        std::fs::read_to_string(dir.join(edgeloop_edge_agent::GRPC_INFERENCE_ADDR_FILE)).ok()
    })
    .await;
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", addr.trim()))
        .await
        .unwrap();
    let request = ModelInferRequest {
        model_name: "digits".into(),
        id: id.into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: rows.shape().iter().map(|&d| d as i64).collect(),
            parameters: Default::default(),
            contents: None,
        }],
        raw_input_contents: vec![rows.iter().flat_map(|v| v.to_le_bytes()).collect()],
        ..Default::default()
    };
    client.model_infer(request).await.unwrap().into_inner()
}

fn infer_body(rows: &ndarray::ArrayD<f32>, id: &str) -> Value {
    json!({
        "id": id,
        "inputs": [{
            "name": "input",
            "shape": rows.shape(),
            "datatype": "FP32",
            "data": rows.iter().copied().collect::<Vec<f32>>(),
        }]
    })
}

#[tokio::test]
async fn an_assigned_model_is_synced_served_swapped_under_load_and_served_from_disk_offline() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (status, body) = cp
        .api()
        .post("/api/v1/models", json!({"name": "digits"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let key = ManifestKey::generate();
    let v1 = register(&cp, &key, "1.0.0").await;
    let v2 = register(&cp, &key, "2.0.0").await;

    let device_dir = dir.path().join("device");
    let token = cp.token("device", "edge-1").await;
    let stop = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(
        agent_config(&cp, &device_dir, Some(token), &key),
        stop.clone(),
    ));
    eventually(WAIT, "edge-1 enrolled", || async {
        (cp.api().get("/api/v1/devices/edge-1").await.0 == 200).then_some(())
    })
    .await;
    assign(&cp, &v1).await;
    let status = wait_active(&cp, "1.0.0").await;
    assert_eq!(
        status["execution_provider"], "CPUExecutionProvider",
        "{status}"
    );
    // The console API tells what the device serves.
    let (_, device) = cp.api().get("/api/v1/devices/edge-1").await;
    assert_eq!(
        device["serving"],
        json!([{"model": "digits", "assigned_version": "1.0.0", "serving_version": "1.0.0",
                "state": "active", "execution_provider": "CPUExecutionProvider",
                "reported_at": device["serving"][0]["reported_at"]}]),
        "{device}"
    );
    let (status, body) = cp.api().get("/api/v1/devices?include=everything").await;
    assert_eq!(status, 400, "{body}");

    // The agent answers what ONNX Runtime answers for the same model and inputs.
    let url = inference_url(&device_dir).await;
    let http = reqwest::Client::new();
    let rows = digits(8);
    let got: Value = http
        .post(format!("{url}/v2/models/digits/infer"))
        .json(&infer_body(&rows, "first"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["model_version"], "1.0.0", "{got}");
    assert_eq!(got["id"], "first");
    let ort = OrtRuntime::load(None).unwrap();
    let mut session = ort
        .session(
            &std::fs::read(mnist_dir().join("mlp.onnx")).unwrap(),
            &SessionOptions::default(),
        )
        .unwrap();
    let want = session
        .run(&[("input", &Tensor::F32(rows.clone()))])
        .unwrap();
    let Tensor::F32(want) = &want[0].1 else {
        panic!()
    };
    let got_logits: Vec<f64> = got["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got["outputs"][0]["shape"], json!([8, 10]));
    assert_eq!(got_logits.len(), want.len());
    for (g, w) in got_logits.iter().zip(want.iter()) {
        assert!((g - f64::from(*w)).abs() < 1e-5, "{g} vs {w}");
    }

    // The gRPC service, on the port in its address file, answers the same
    // request with the same numbers (one request path, one session).
    let over_grpc = grpc_infer(&device_dir, &rows, "grpc-first").await;
    assert_eq!(over_grpc.model_version, "1.0.0");
    assert_eq!(over_grpc.id, "grpc-first");
    assert_eq!(over_grpc.outputs[0].shape, vec![8, 10]);
    let grpc_logits: Vec<f32> = over_grpc.raw_output_contents[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // REST writes each f32 in the shortest text that reads back as it.
    let rest_logits: Vec<f32> = got_logits.iter().map(|&v| v as f32).collect();
    assert_eq!(grpc_logits, rest_logits, "gRPC = REST");

    // Version 2 swaps in through the control plane while clients hammer
    // the agent: not one request fails.
    let failures = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let load_stop = CancellationToken::new();
    let mut clients = vec![];
    for c in 0..4 {
        let (http, url, rows) = (http.clone(), url.clone(), digits(2));
        let (failures, served, load_stop) = (failures.clone(), served.clone(), load_stop.clone());
        clients.push(tokio::spawn(async move {
            let mut versions = std::collections::BTreeSet::new();
            let mut i = 0;
            while !load_stop.is_cancelled() {
                i += 1;
                let r = http
                    .post(format!("{url}/v2/models/digits/infer"))
                    .json(&infer_body(&rows, &format!("c{c}-{i}")))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => {
                        let v: Value = r.json().await.unwrap();
                        versions.insert(v["model_version"].as_str().unwrap().to_string());
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            versions
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assign(&cp, &v2).await;
    wait_active(&cp, "2.0.0").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    load_stop.cancel();
    let mut versions = std::collections::BTreeSet::new();
    for c in clients {
        versions.extend(c.await.unwrap());
    }
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "failed requests during the swap"
    );
    assert!(served.load(Ordering::Relaxed) > 50, "the load was real");
    assert_eq!(
        versions.into_iter().collect::<Vec<_>>(),
        vec!["1.0.0".to_string(), "2.0.0".to_string()]
    );

    // Labels for an earlier request give a rolling accuracy.
    let fb: Value = http
        .post(format!("{url}/v2/models/digits/feedback"))
        .json(&json!({"labels": [
            {"id": "first/0", "label": 3},
            {"id": "grpc-first/0", "label": 3},
            {"id": "nope", "label": 1},
        ]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The gRPC request reached telemetry like the REST one.
    assert_eq!(fb["matched"], 2, "{fb}");
    assert_eq!(fb["unknown_ids"], json!(["nope"]), "{fb}");

    // Metrics name the version and the provider in use.
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("edgeloop_model_info")
            && l.contains("version=\"2.0.0\"")
            && l.contains("CPUExecutionProvider")),
        "{metrics}"
    );

    // The device reports its providers; its telemetry reaches the control plane.
    let (_, device) = cp.api().get("/api/v1/devices/edge-1").await;
    assert!(
        device.to_string().contains("CPUExecutionProvider"),
        "{device}"
    );
    eventually(
        WAIT,
        "sketches of version 2 at the control plane",
        || async {
            let (status, body) = cp
                .api()
                .get("/api/v1/models/digits/sketches?version=2.0.0")
                .await;
            (status == 200 && body.as_array().is_some_and(|a| !a.is_empty())).then_some(())
        },
    )
    .await;
    // The listing tells it too, on request, with when its last telemetry
    // report arrived and how long after the device recorded it.
    let (_, listed) = cp
        .api()
        .get("/api/v1/devices?include=serving&limit=10")
        .await;
    assert_eq!(
        listed[0]["serving"][0]["serving_version"], "2.0.0",
        "{listed}"
    );
    assert_eq!(listed[0]["serving"][0]["state"], "active", "{listed}");
    assert!(
        listed[0]["telemetry"]["received_at"].is_string(),
        "{listed}"
    );
    assert!(
        listed[0]["telemetry"]["lag_seconds"].as_f64().unwrap() >= 0.0,
        "{listed}"
    );
    let (_, plain) = cp.api().get("/api/v1/devices").await;
    assert!(
        plain[0].get("serving").is_none(),
        "only on request: {plain}"
    );

    stop.cancel();
    agent.await.unwrap().unwrap();

    // The control plane is down; a restarted agent serves version 2 from disk.
    let offline = agent_config(&cp, &device_dir, None, &key);
    cp.stop().await;
    std::fs::remove_file(device_dir.join(edgeloop_edge_agent::INFERENCE_ADDR_FILE)).unwrap();
    let stop = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(offline, stop.clone()));
    let url = inference_url(&device_dir).await;
    let got: Value = eventually(WAIT, "version 2 served from disk", || {
        let (http, url, rows) = (http.clone(), url.clone(), digits(1));
        async move {
            let r = http
                .post(format!("{url}/v2/models/digits/infer"))
                .json(&infer_body(&rows, "offline"))
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(())?;
            r.json::<Value>().await.ok()
        }
    })
    .await;
    assert_eq!(got["model_version"], "2.0.0", "{got}");
    stop.cancel();
    agent.await.unwrap().unwrap();
}

/// With `--api-token-file`, the inference API (REST and gRPC), feedback
/// and metrics refuse a caller without the token; the health probes stay
/// open.
#[tokio::test]
async fn with_a_token_the_device_apis_refuse_callers_without_it() {
    use edgeloop_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use edgeloop_proto::inference::ServerLiveRequest;

    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    assert_eq!(
        cp.api()
            .post("/api/v1/models", json!({"name": "digits"}))
            .await
            .0,
        201
    );
    let key = ManifestKey::generate();
    let v1 = register(&cp, &key, "1.0.0").await;
    let device_dir = dir.path().join("device");
    let secret = "device-api-token-0123456789";
    let mut config = agent_config(
        &cp,
        &device_dir,
        Some(cp.token("device", "edge-1").await),
        &key,
    );
    config.api.token_hash = Some(Digest::of(secret.as_bytes()));
    let stop = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(config, stop.clone()));
    eventually(WAIT, "edge-1 enrolled", || async {
        (cp.api().get("/api/v1/devices/edge-1").await.0 == 200).then_some(())
    })
    .await;
    assign(&cp, &v1).await;
    wait_active(&cp, "1.0.0").await;

    let url = inference_url(&device_dir).await;
    let http = reqwest::Client::new();
    let body = infer_body(&digits(1), "r1");
    let feedback = json!({"labels": [{"id": "r1", "label": 3}]});
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            "/v2/models/digits/infer",
            Some(&body),
        ),
        (
            reqwest::Method::POST,
            "/v2/models/digits/feedback",
            Some(&feedback),
        ),
        (reqwest::Method::GET, "/v2/models/digits", None),
        (reqwest::Method::GET, "/metrics", None),
    ] {
        let call = |token: Option<&str>| {
            let mut r = http.request(method.clone(), format!("{url}{path}"));
            if let Some(b) = body {
                r = r.json(b);
            }
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            r.send()
        };
        assert_eq!(call(None).await.unwrap().status(), 401, "{path}");
        assert_eq!(
            call(Some("wrong-token-0123456789")).await.unwrap().status(),
            401,
            "{path}"
        );
        let ok = call(Some(secret)).await.unwrap();
        assert!(ok.status().is_success(), "{path}: {}", ok.status());
    }
    for path in ["/v2/health/live", "/v2/health/ready"] {
        let r = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} stays open");
    }

    let addr =
        std::fs::read_to_string(device_dir.join(edgeloop_edge_agent::GRPC_INFERENCE_ADDR_FILE))
            .unwrap();
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", addr.trim()))
        .await
        .unwrap();
    let refused = grpc.server_live(ServerLiveRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    let mut req = tonic::Request::new(ServerLiveRequest {});
    req.metadata_mut()
        .insert("authorization", format!("Bearer {secret}").parse().unwrap());
    assert!(grpc.server_live(req).await.unwrap().into_inner().live);

    stop.cancel();
    agent.await.unwrap().unwrap();
    cp.stop().await;
}

/// With `--api-tls-cert` and `--api-client-ca` (mTLS), the inference API
/// (REST and gRPC) is served over TLS and admits a caller by a client
/// certificate from those CAs, as an alternative to the bearer token: no
/// certificate (and no token) gets 401 (gRPC: UNAUTHENTICATED), a
/// certificate from another CA fails the handshake, plain TCP gets nothing,
/// and the health probes stay open.
#[tokio::test]
async fn with_client_cas_the_device_apis_admit_callers_by_certificate_over_tls() {
    use edgeloop_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use edgeloop_proto::inference::ServerLiveRequest;
    use edgeloop_tests::test_pki::{https_client, TestCa};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    assert_eq!(
        cp.api()
            .post("/api/v1/models", json!({"name": "digits"}))
            .await
            .0,
        201
    );
    let key = ManifestKey::generate();
    let v1 = register(&cp, &key, "1.0.0").await;
    // The device's API identity, the callers' CA, and a stranger's CA.
    let device_ca = TestCa::new("device API CA");
    let callers = TestCa::new("callers CA");
    let stranger = TestCa::new("stranger CA");
    let server = device_ca.server();
    let caller = callers.client("scorer-1");
    let impostor = stranger.client("scorer-1");
    let secret = "device-api-token-0123456789";

    let device_dir = dir.path().join("device");
    let mut config = agent_config(
        &cp,
        &device_dir,
        Some(cp.token("device", "edge-1").await),
        &key,
    );
    config.api.tls = Some(edgeloop_edge_agent::config::ApiTls {
        cert_pem: server.cert.clone().into_bytes(),
        key_pem: server.key.clone().into_bytes(),
        client_ca_pem: Some(callers.pem.clone().into_bytes()),
    });
    // Beside the certificates: either one admits.
    config.api.token_hash = Some(Digest::of(secret.as_bytes()));
    let stop = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(config, stop.clone()));
    eventually(WAIT, "edge-1 enrolled", || async {
        (cp.api().get("/api/v1/devices/edge-1").await.0 == 200).then_some(())
    })
    .await;
    assign(&cp, &v1).await;
    wait_active(&cp, "1.0.0").await;

    let plain = inference_url(&device_dir).await;
    let url = plain.replacen("http://", "https://", 1);
    let infer = |client: reqwest::Client, token: Option<&'static str>| {
        let url = url.clone();
        async move {
            let mut r = client
                .post(format!("{url}/v2/models/digits/infer"))
                .json(&infer_body(&digits(1), "r1"));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            r.send().await
        }
    };
    let certified = https_client(&device_ca.pem, Some(&caller));
    let anonymous = https_client(&device_ca.pem, None);
    let r = infer(certified.clone(), None).await.unwrap();
    assert_eq!(r.status(), 200, "a client certificate admits");
    let r = infer(anonymous.clone(), None).await.unwrap();
    assert_eq!(r.status(), 401, "no certificate, no token");
    let r = infer(anonymous.clone(), Some(secret)).await.unwrap();
    assert_eq!(r.status(), 200, "the token still admits");
    let refused = infer(https_client(&device_ca.pem, Some(&impostor)), None).await;
    assert!(refused.is_err(), "another CA's certificate: {refused:?}");
    let over_tcp = reqwest::Client::new()
        .get(format!("{plain}/v2/health/live"))
        .send()
        .await;
    assert!(
        over_tcp.map_or(true, |r| !r.status().is_success()),
        "plain HTTP on a TLS port"
    );
    for path in ["/v2/health/live", "/v2/health/ready"] {
        let r = anonymous.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} stays open");
    }

    let addr =
        std::fs::read_to_string(device_dir.join(edgeloop_edge_agent::GRPC_INFERENCE_ADDR_FILE))
            .unwrap();
    let channel = |identity: Option<&edgeloop_tests::test_pki::Pem>| {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&device_ca.pem))
            .domain_name("localhost");
        if let Some(p) = identity {
            tls = tls.identity(Identity::from_pem(&p.cert, &p.key));
        }
        Endpoint::from_shared(format!("https://{}", addr.trim()))
            .unwrap()
            .tls_config(tls)
            .unwrap()
    };
    let mut grpc = GrpcInferenceServiceClient::new(channel(Some(&caller)).connect().await.unwrap());
    assert!(
        grpc.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    let mut grpc = GrpcInferenceServiceClient::new(channel(None).connect().await.unwrap());
    let refused = grpc.server_live(ServerLiveRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    let mut req = tonic::Request::new(ServerLiveRequest {});
    req.metadata_mut()
        .insert("authorization", format!("Bearer {secret}").parse().unwrap());
    assert!(grpc.server_live(req).await.unwrap().into_inner().live);
    let impostor_channel = channel(Some(&impostor)).connect().await;
    let refused = match impostor_channel {
        Err(e) => e.to_string(),
        Ok(c) => GrpcInferenceServiceClient::new(c)
            .server_live(ServerLiveRequest {})
            .await
            .unwrap_err()
            .to_string(),
    };
    assert!(!refused.is_empty());

    stop.cancel();
    agent.await.unwrap().unwrap();
    cp.stop().await;
}
