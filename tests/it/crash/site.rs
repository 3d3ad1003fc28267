//! What every crash test shares: the imports, versions whose answers say
//! which version computed them, and the console and fleet helpers.

pub use std::collections::{BTreeMap, BTreeSet};
pub use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub use std::sync::{Arc, Mutex};
pub use std::time::Duration;

pub use edgeloop_client_core::{enroll, BootstrapToken, IdentityStore, Role};
pub use edgeloop_models::manifest::ManifestKey;
pub use edgeloop_models::onnx::{self, ir};
pub use edgeloop_models::{Digest, Tensor};
pub use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
pub use edgeloop_proto::agent::v1::{Event, TelemetryReport};
pub use edgeloop_tests::crash::{retry, seeded, AgentProcess, CpProcess, Tally};
pub use edgeloop_tests::eventually;
pub use futures::StreamExt;
pub use rand::Rng;
pub use reqwest::Method;
pub use serde_json::{json, Value};
pub use tokio_util::sync::CancellationToken;

pub const MODEL: &str = "crashy";
pub const WAIT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// Versions whose answers say which version computed them
// ---------------------------------------------------------------------------

pub fn value_info(name: &str) -> ir::ValueInfoProto {
    let mut v = ir::ValueInfoProto::new();
    v.set_name(name.into());
    let mut t = ir::type_proto::Tensor::new();
    t.set_elem_type(1);
    let shape = t.shape.mut_or_insert_default();
    for d in [
        ir::tensor_shape_proto::dimension::Value::DimParam("N".into()),
        ir::tensor_shape_proto::dimension::Value::DimValue(4),
    ] {
        let mut dim = ir::tensor_shape_proto::Dimension::new();
        dim.value = Some(d);
        shape.dim.push(dim);
    }
    v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(t));
    v
}

pub fn f32s(shape: &[usize], values: Vec<f32>) -> Tensor {
    Tensor::F32(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values).unwrap())
}

/// `y = x + k` for version `k.0.0`, with `pad` unused floats, so that a
/// download takes long enough to be killed in.
pub fn version_model(k: u32, pad: usize) -> Vec<u8> {
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut o = ir::OperatorSetIdProto::new();
    o.set_version(17);
    m.opset_import.push(o);
    let g = m.graph.mut_or_insert_default();
    g.set_name(format!("v{k}"));
    g.input.push(value_info("x"));
    g.output.push(value_info("y"));
    let noise: Vec<f32> = (0..pad)
        .map(|i| (i as f32 * 0.37 + k as f32).sin())
        .collect();
    g.initializer = vec![
        onnx::from_tensor("c", &f32s(&[4], vec![k as f32; 4])),
        onnx::from_tensor("pad", &f32s(&[pad], noise)),
    ];
    let mut add = ir::NodeProto::new();
    add.set_op_type("Add".into());
    add.set_name("add".into());
    add.input = vec!["x".into(), "c".into()];
    add.output = vec!["y".into()];
    g.node = vec![add];
    onnx::validate(&m, None).unwrap();
    onnx::encode(&m).unwrap()
}

pub fn version(k: u32) -> String {
    format!("{k}.0.0")
}

/// Uploads version `k` and its signed manifest and registers it.
pub async fn register(cp: &CpProcess, key: &ManifestKey, k: u32, pad: usize) {
    let model = version_model(k, pad);
    let manifest =
        edgeloop_tests::manifests::manifest(MODEL, &version(k), &model, ("x", 4), ("y", 4));
    let signed = key.sign(manifest).unwrap().to_json_pretty().unwrap();
    let artifact = cp.upload(&model).await;
    let manifest = cp.upload(signed.as_bytes()).await;
    let body = json!({"version": version(k), "artifact_digest": artifact.to_string(),
                      "manifest_digest": manifest.to_string()});
    retry(&format!("register {}", version(k)), || async {
        let r = cp
            .api()
            .request(Method::POST, &format!("/api/v1/models/{MODEL}/versions"))
            .json(&body)
            .send()
            .await
            .ok()?;
        // A retry after a reply lost to a fault finds it registered.
        (r.status() == 201 || r.status() == 409).then_some(())
    })
    .await;
}

pub async fn create_model(cp: &CpProcess, name: &str) {
    retry(&format!("model {name}"), || async {
        let r = cp
            .api()
            .request(Method::POST, "/api/v1/models")
            .json(&json!({"name": name}))
            .send()
            .await
            .ok()?;
        (r.status() == 201 || r.status() == 409).then_some(())
    })
    .await;
}

/// A deployment of `k` to the `site=crash` devices in `waves` (device
/// counts), with short soaks and no traffic needed.
pub async fn deploy(cp: &CpProcess, k: u32, waves: &[u32]) -> String {
    let request = json!({
        "model": MODEL, "version": version(k), "selector": "site=crash",
        "strategy": {"waves": {"count": waves}, "min_soak_seconds": 1,
                     "wave_timeout_seconds": 60, "rollback_timeout_seconds": 30},
        "gates": {"max_error_rate": 0.5, "max_p99_latency_ratio": 1000.0,
                  "max_activation_failures": 0, "min_requests": 0},
        "offline_tolerance": 0.0,
    });
    let body = retry(&format!("deploy {}", version(k)), || async {
        created(cp, "/api/v1/deployments", &request).await
    })
    .await;
    body["id"].as_str().unwrap().to_string()
}

/// An acknowledged artifact's bytes through the console, retried past the
/// unreliable store's errors; a 404 fails the test with `lost`.
pub async fn acked_artifact(api: &edgeloop_tests::Api, d: Digest, lost: &str) -> bytes::Bytes {
    retry(&format!("artifact {d}"), || async {
        let r = api
            .request(Method::GET, &format!("/api/v1/artifacts/{d}"))
            .send()
            .await
            .ok()?;
        assert_ne!(r.status(), 404, "{lost}");
        (r.status() == 200).then_some(())?;
        r.bytes().await.ok()
    })
    .await
}

/// The body of a 201 to POST `path`, or None (refused, or the control
/// plane away) for `retry` to try again.
pub async fn created(cp: &CpProcess, path: &str, body: &Value) -> Option<Value> {
    let r = cp
        .api()
        .request(Method::POST, path)
        .json(body)
        .send()
        .await
        .ok()?;
    if r.status() != 201 {
        // Said, for a retry that never succeeds.
        let status = r.status();
        eprintln!(
            "POST {path}: {status} {}",
            r.text().await.unwrap_or_default()
        );
        return None;
    }
    r.json::<Value>().await.ok()
}

/// The deployment's state, or None while the control plane is away.
pub async fn deployment_state(cp: &CpProcess, id: &str) -> Option<String> {
    let r = cp
        .api()
        .request(Method::GET, &format!("/api/v1/deployments/{id}"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    assert_ne!(r.status(), 404, "deployment {id} lost");
    let body: Value = r.json().await.ok()?;
    body["state"].as_str().map(str::to_string)
}

pub const TERMINAL: [&str; 4] = ["succeeded", "rolled_back", "failed", "cancelled"];

pub async fn ended(cp: &CpProcess, id: &str) -> String {
    eventually(WAIT, &format!("deployment {id} ends"), || async {
        deployment_state(cp, id)
            .await
            .filter(|s| TERMINAL.contains(&s.as_str()))
    })
    .await
}

/// Asks the agent at `url` for `y = x + k` and checks the answer against
/// the version that says it gave it: Some(k), None when it serves nothing
/// (yet), a panic when the answer is not that version's.
pub async fn served(http: &reqwest::Client, url: &str) -> Option<u32> {
    let x = [0.5f32, 1.5, 2.5, 3.5];
    let r = http
        .post(format!("{url}/v2/models/{MODEL}/infer"))
        .json(&json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x}]}))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    let body: Value = r.json().await.ok()?;
    let v = body["model_version"].as_str().unwrap();
    let k: u32 = v
        .strip_suffix(".0.0")
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("served an unknown version {v}: {body}"));
    let y: Vec<f32> = body["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let want: Vec<f32> = x.iter().map(|x| x + k as f32).collect();
    assert_eq!(y, want, "version {v} answered as another version would");
    Some(k)
}

/// Waits until every agent serves version `k`.
pub async fn all_serve(agents: &[AgentProcess], k: u32) {
    let http = reqwest::Client::new();
    for a in agents {
        let url = a.url().unwrap();
        eventually(
            WAIT,
            &format!("{} serves {}", a.name, version(k)),
            || async { (served(&http, &url).await == Some(k)).then_some(()) },
        )
        .await;
    }
}

pub async fn start_agents(
    cp: &CpProcess,
    dir: &std::path::Path,
    key: &ManifestKey,
    n: usize,
) -> Vec<AgentProcess> {
    let mut agents = vec![];
    for i in 0..n {
        let name = format!("edge-{i}");
        let token = labelled_token(cp, "device", &name).await;
        agents.push(AgentProcess::start(cp, &name, &dir.join(&name), &token, &key.public()).await);
    }
    online(cp, n).await;
    agents
}

pub async fn labelled_token(cp: &CpProcess, kind: &str, name: &str) -> String {
    let body = json!({"kind": kind, "name": name, "labels": {"site": "crash"}});
    let created = retry(&format!("token {name}"), || async {
        created(cp, "/api/v1/tokens", &body).await
    })
    .await;
    created["token"].as_str().unwrap().to_string()
}

/// Every stored telemetry report of `device`: (epoch, sequence) -> records.
pub async fn stored_reports(cp: &CpProcess, device: &str) -> BTreeMap<(u64, u64), Vec<Value>> {
    let mut out: BTreeMap<(u64, u64), Vec<Value>> = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => format!("/api/v1/devices/{device}/telemetry?limit=500"),
            Some(a) => format!("/api/v1/devices/{device}/telemetry?limit=500&after={a}"),
        };
        let (page, next) = retry(&format!("telemetry of {device}"), || async {
            let r = cp.api().request(Method::GET, &path).send().await.ok()?;
            if r.status() != 200 {
                return None;
            }
            let next = r
                .headers()
                .get("edgeloop-next-cursor")
                .map(|v| v.to_str().unwrap().to_string());
            Some((r.json::<Vec<Value>>().await.ok()?, next))
        })
        .await;
        for r in page {
            let key = (
                r["epoch"].as_u64().unwrap(),
                r["sequence"].as_u64().unwrap(),
            );
            out.entry(key).or_default().push(r);
        }
        match next {
            Some(n) => after = Some(n),
            None => return out,
        }
    }
}

/// Waits until `n` devices of the crash site are online, as `cp` sees them.
pub async fn online(cp: &CpProcess, n: usize) {
    eventually(WAIT, "agents online", || async {
        let r = cp
            .api()
            .request(Method::GET, "/api/v1/devices?selector=site%3Dcrash")
            .send()
            .await
            .ok()?;
        let body: Value = r.json().await.ok()?;
        let up = body
            .as_array()?
            .iter()
            .filter(|d| d["status"] == "online")
            .count();
        (up == n).then_some(())
    })
    .await;
}
