//! Crash tests of the real binaries: the control plane, the edge agent and
//! the trainer bridge run as processes and are SIGKILLed at seeded random
//! points, then started again on the same data; after each kill the
//! invariants hold:
//! - no acknowledged write is lost (a client-side ledger of every console
//!   write that got a 2xx, each read back);
//! - telemetry is stored exactly once (a device's acknowledged sequences,
//!   each stored once, and nothing else);
//! - no deployment is stuck: each one ends, and the fleet converges to the
//!   last one;
//! - every device serves a valid, signed version, old or new, never a
//!   broken one (each answer is checked against the version that gave it);
//! - a checkpoint upload cut by a kill at either end resumes, and the job
//!   completes with every checkpoint.
//!
//! The control plane's and the upload's tests run on the unreliable
//! artifact store (`EDGELOOP_FAULT_ARTIFACT_STORE`): delays, errors and
//! torn writes.
//! Each test prints its seed and a `crash summary:` line with its counts.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeloop_client_core::{enroll, BootstrapToken, IdentityStore, Role};
use edgeloop_models::manifest::ManifestKey;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::{Digest, Tensor};
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::agent::v1::{Event, TelemetryReport};
use edgeloop_tests::crash::{retry, seeded, AgentProcess, CpProcess, Tally};
use edgeloop_tests::eventually;
use futures::StreamExt;
use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const MODEL: &str = "crashy";
const WAIT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// Versions whose answers say which version computed them
// ---------------------------------------------------------------------------

fn value_info(name: &str) -> ir::ValueInfoProto {
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

fn f32s(shape: &[usize], values: Vec<f32>) -> Tensor {
    Tensor::F32(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values).unwrap())
}

/// `y = x + k` for version `k.0.0`, with `pad` unused floats, so that a
/// download takes long enough to be killed in.
fn version_model(k: u32, pad: usize) -> Vec<u8> {
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

fn version(k: u32) -> String {
    format!("{k}.0.0")
}

/// Uploads version `k` and its signed manifest and registers it.
async fn register(cp: &CpProcess, key: &ManifestKey, k: u32, pad: usize) {
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

async fn create_model(cp: &CpProcess, name: &str) {
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
async fn deploy(cp: &CpProcess, k: u32, waves: &[u32]) -> String {
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

/// The body of a 201 to POST `path`, or None (refused, or the control
/// plane away) for `retry` to try again.
async fn created(cp: &CpProcess, path: &str, body: &Value) -> Option<Value> {
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
async fn deployment_state(cp: &CpProcess, id: &str) -> Option<String> {
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

const TERMINAL: [&str; 4] = ["succeeded", "rolled_back", "failed", "cancelled"];

async fn ended(cp: &CpProcess, id: &str) -> String {
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
async fn served(http: &reqwest::Client, url: &str) -> Option<u32> {
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
async fn all_serve(agents: &[AgentProcess], k: u32) {
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

async fn start_agents(
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

async fn labelled_token(cp: &CpProcess, kind: &str, name: &str) -> String {
    let body = json!({"kind": kind, "name": name, "labels": {"site": "crash"}});
    let created = retry(&format!("token {name}"), || async {
        created(cp, "/api/v1/tokens", &body).await
    })
    .await;
    created["token"].as_str().unwrap().to_string()
}

/// Every stored telemetry report of `device`: (epoch, sequence) -> records.
async fn stored_reports(cp: &CpProcess, device: &str) -> BTreeMap<(u64, u64), Vec<Value>> {
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

// ---------------------------------------------------------------------------
// The control plane killed mid-flight
// ---------------------------------------------------------------------------

/// A console write that was answered 2xx.
#[derive(Debug, Clone)]
enum Acked {
    Model(String),
    Artifact(Digest, usize),
    Token(String),
}

/// Writes models, artifacts and tokens until stopped; records each that
/// was acknowledged. Failures (the control plane is down, a fault) are
/// not acknowledged and not recorded.
fn console_writer(
    cp_http: String,
    admin: String,
    ledger: Arc<Mutex<Vec<Acked>>>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let api = edgeloop_tests::Api::new(&cp_http, Some(&admin));
        let mut attempts = 0u64;
        let mut n = 0u32;
        while !stop.is_cancelled() {
            if paused.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            n += 1;
            attempts += 1;
            let (req, acked) = match n % 3 {
                0 => {
                    let data = format!("ledger artifact {n} ").repeat(200).into_bytes();
                    let d = Digest::of(&data);
                    let len = data.len();
                    (
                        api.request(Method::PUT, &format!("/api/v1/artifacts/{d}"))
                            .body(data),
                        Acked::Artifact(d, len),
                    )
                }
                1 => {
                    let name = format!("ledger-{n}");
                    (
                        api.request(Method::POST, "/api/v1/models")
                            .json(&json!({"name": name})),
                        Acked::Model(name),
                    )
                }
                _ => {
                    let name = format!("ledger-dev-{n}");
                    (
                        api.request(Method::POST, "/api/v1/tokens")
                            .json(&json!({"kind": "device", "name": name})),
                        Acked::Token(name),
                    )
                }
            };
            match req.timeout(Duration::from_secs(5)).send().await {
                Ok(r) if r.status().is_success() => ledger.lock().unwrap().push(acked),
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            // A console's pace, not a flood: the checks read every write back.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        attempts
    })
}

/// A listing the console answers with a JSON array, retried through faults.
async fn list(cp: &CpProcess, path: &str) -> Vec<Value> {
    retry(path, || async {
        let r = cp.api().request(Method::GET, path).send().await.ok()?;
        (r.status() == 200).then_some(())?;
        r.json::<Vec<Value>>().await.ok()
    })
    .await
}

/// Reads every acknowledged write back (artifacts byte for byte); panics
/// naming the first lost one.
async fn check_ledger(cp: &CpProcess, ledger: &[Acked]) {
    let names = |items: Vec<Value>, field: &str| -> BTreeSet<String> {
        items
            .iter()
            .filter_map(|t| t[field].as_str().map(str::to_string))
            .collect()
    };
    let tokens = names(list(cp, "/api/v1/tokens").await, "member_id");
    let models = names(list(cp, "/api/v1/models").await, "name");
    let mut artifacts = vec![];
    for w in ledger {
        match w {
            Acked::Token(name) => assert!(tokens.contains(name), "acked token {name} lost"),
            Acked::Model(name) => assert!(models.contains(name), "acked model {name} lost"),
            Acked::Artifact(d, len) => artifacts.push((*d, *len)),
        }
    }
    let api = &cp.api();
    futures::stream::iter(artifacts)
        .for_each_concurrent(8, |(d, len)| async move {
            // Read errors are the unreliable store's; a 404 is a loss.
            let bytes = retry(&format!("read artifact {d}"), || async {
                let r = api
                    .request(Method::GET, &format!("/api/v1/artifacts/{d}"))
                    .send()
                    .await
                    .ok()?;
                assert_ne!(r.status(), 404, "acked artifact {d} lost");
                (r.status() == 200).then_some(())?;
                r.bytes().await.ok()
            })
            .await;
            assert_eq!((bytes.len(), Digest::of(&bytes)), (len, d));
        })
        .await;
}

/// A device that sends telemetry as an agent does: one report at a time,
/// each resent until acknowledged. `acked` is the highest acknowledged
/// sequence.
fn telemetry_sender(
    grpc_url: String,
    identity: edgeloop_client_core::Identity,
    epoch: u64,
    acked: Arc<AtomicU64>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let channel = edgeloop_client_core::tls::mtls_endpoint(&grpc_url, &identity)
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect_lazy();
        let mut client = AgentServiceClient::new(channel);
        let mut sequence = 1;
        loop {
            let report = TelemetryReport {
                sequence,
                epoch,
                events: vec![Event {
                    kind: "crash-test".into(),
                    message: format!("report {sequence}"),
                    ..Default::default()
                }],
                ..Default::default()
            };
            match client.report_telemetry(report).await {
                Ok(ack) if ack.get_ref().acked_sequence >= sequence => {
                    acked.store(sequence, Ordering::SeqCst);
                    sequence += 1;
                    if stop.is_cancelled() {
                        return;
                    }
                    // A busy device's pace (an agent flushes every few seconds).
                    tokio::time::sleep(Duration::from_millis(25)).await;
                    while paused.load(Ordering::SeqCst) && !stop.is_cancelled() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                Ok(ack) => panic!("sequence {sequence} answered with ack {ack:?}"),
                // Down or restarting: the report stays pending, as in the
                // agent's buffer, and goes again.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

/// Each acknowledged sequence stored exactly once, with its own content,
/// and (once the sender has stopped) nothing more. Returns how many.
async fn check_telemetry(cp: &CpProcess, device: &str, epoch: u64, acked: u64, exact: bool) -> u64 {
    let stored = stored_reports(cp, device).await;
    for seq in 1..=acked {
        let copies = stored.get(&(epoch, seq)).map_or(0, Vec::len);
        assert_eq!(
            copies, 1,
            "report {seq} (acked up to {acked}) stored {copies} times"
        );
        let r = &stored[&(epoch, seq)][0];
        assert_eq!(r["events"][0]["message"], format!("report {seq}"), "{r}");
    }
    if exact {
        let extra: Vec<_> = stored.keys().filter(|(_, s)| *s > acked).collect();
        assert!(extra.is_empty(), "stored beyond the last ack: {extra:?}");
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_killed_mid_writes_telemetry_and_rollouts_loses_nothing() {
    const ROUNDS: u32 = 8;
    let (seed, mut rng) = seeded("control plane");
    let dir = tempfile::tempdir().unwrap();
    let faults = format!("seed={seed},error=0.05,delay_ms=20,torn=0.05");
    let mut cp = CpProcess::start(&dir.path().join("cp"), Some(&faults)).await;
    let mut tally = Tally::default();

    create_model(&cp, MODEL).await;
    let key = ManifestKey::generate();
    for k in 1..=ROUNDS + 2 {
        register(&cp, &key, k, 1_000).await;
    }
    let agents = start_agents(&cp, dir.path(), &key, 2).await;
    let first = deploy(&cp, 1, &[2]).await;
    assert_eq!(ended(&cp, &first).await, "succeeded");
    all_serve(&agents, 1).await;

    // The telemetry device, enrolled as an agent would be.
    let token: BootstrapToken = cp.token("device", "sim-1").await.parse().unwrap();
    let identity = enroll(
        Role::Device,
        &cp.grpc_url,
        &token,
        &IdentityStore::new(&dir.path().join("sim-1")),
        Default::default(),
    )
    .await
    .unwrap();
    let epoch = rng.random_range(1..u64::MAX);
    let acked = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    // The load pauses while a round reads everything back, so the checks
    // run on a quiet control plane and each round adds a similar amount.
    let paused = Arc::new(AtomicBool::new(false));
    let sender = telemetry_sender(
        cp.grpc_url.clone(),
        identity,
        epoch,
        acked.clone(),
        paused.clone(),
        stop.clone(),
    );
    let ledger = Arc::new(Mutex::new(Vec::new()));
    let writer = console_writer(
        cp.http_base.clone(),
        cp.admin_token.clone(),
        ledger.clone(),
        paused.clone(),
        stop.clone(),
    );

    // Each round starts a rollout (two waves) and kills the control plane
    // at a random point of it, amid the writes and the telemetry.
    let mut deployments = vec![first];
    let mut interrupted = vec![];
    for round in 0..ROUNDS {
        deployments.push(deploy(&cp, round + 2, &[1, 2]).await);
        let after = Duration::from_millis(rng.random_range(200..1_500));
        tokio::time::sleep(after).await;
        let state = deployment_state(&cp, deployments.last().unwrap()).await;
        interrupted.push(state.unwrap_or_else(|| "?".into()));
        cp.kill().await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
        cp.restart().await;

        // The writes the load had in flight when the control plane came
        // back go through, then the load pauses.
        tokio::time::sleep(Duration::from_millis(300)).await;
        paused.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let checking = std::time::Instant::now();
        let snapshot = ledger.lock().unwrap().clone();
        check_ledger(&cp, &snapshot).await;
        check_telemetry(&cp, "sim-1", epoch, acked.load(Ordering::SeqCst), false).await;
        paused.store(false, Ordering::SeqCst);
        eprintln!(
            "round {round}: killed {after:?} into the rollout ({}); {} acked writes and {} reports intact (checked in {:?})",
            interrupted.last().unwrap(),
            snapshot.len(),
            acked.load(Ordering::SeqCst),
            checking.elapsed()
        );
    }
    stop.cancel();
    let attempts = writer.await.unwrap();
    tokio::time::timeout(WAIT, sender).await.unwrap().unwrap();

    // Nothing acknowledged was lost, and telemetry is exactly once.
    let ledger = ledger.lock().unwrap().clone();
    check_ledger(&cp, &ledger).await;
    let reports = check_telemetry(&cp, "sim-1", epoch, acked.load(Ordering::SeqCst), true).await;
    // Every deployment ended, and a last one after the kills converges the fleet.
    for id in &deployments {
        ended(&cp, id).await;
    }
    let last = deploy(&cp, ROUNDS + 2, &[1, 2]).await;
    assert_eq!(ended(&cp, &last).await, "succeeded");
    all_serve(&agents, ROUNDS + 2).await;

    tally.kills = cp.proc.kills;
    tally.acked_writes_checked = ledger.len() as u64;
    tally.reports_checked = reports;
    tally.answers_checked = agents.len() as u64;
    tally.deployments_ended = deployments.len() as u64 + 1;
    tally.notes.push(format!(
        "write_attempts={attempts} injected_faults_logged={} interrupted={interrupted:?}",
        cp.proc.log_count("injected fault")
    ));
    assert!(
        ledger.len() >= 20,
        "too few writes to mean anything: {}",
        ledger.len()
    );
    assert!(reports >= 20, "too few reports to mean anything: {reports}");
    tally.print("control_plane", seed);
}

// ---------------------------------------------------------------------------
// The agent killed mid-flight
// ---------------------------------------------------------------------------

/// Sends inference to every agent until stopped, checking each answer
/// against its version; counts requests sent per agent.
fn traffic(
    urls: Arc<Mutex<Vec<Option<String>>>>,
    answers: Arc<Vec<AtomicU64>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        while !stop.is_cancelled() {
            let now: Vec<Option<String>> = urls.lock().unwrap().clone();
            for (i, url) in now.iter().enumerate() {
                if let Some(url) = url {
                    answers[i].fetch_add(1, Ordering::Relaxed);
                    served(&http, url).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Floats of padding in the agent test's versions (4 MiB).
const PAD: usize = 1 << 20;

/// Polls `cond` every 5 ms for up to 10 s (a kill point not reached in
/// time is taken where the run is).
async fn wait_until(cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_killed_mid_download_flip_and_flush_serve_a_signed_version_and_converge() {
    const ROUNDS: u32 = 9;
    let (seed, mut rng) = seeded("agent");
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp"), None).await;
    let mut tally = Tally::default();
    create_model(&cp, MODEL).await;
    let key = ManifestKey::generate();
    // ~4 MB each: the downloads take long enough to be cut.
    for k in 1..=ROUNDS + 2 {
        register(&cp, &key, k, PAD).await;
    }
    let mut agents = start_agents(&cp, dir.path(), &key, 2).await;
    let first = deploy(&cp, 1, &[2]).await;
    assert_eq!(ended(&cp, &first).await, "succeeded");
    all_serve(&agents, 1).await;

    let urls = Arc::new(Mutex::new(
        agents.iter().map(|a| a.url()).collect::<Vec<_>>(),
    ));
    let answers = Arc::new(
        (0..agents.len())
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let stop = CancellationToken::new();
    let load = traffic(urls.clone(), answers.clone(), stop.clone());
    let http = reqwest::Client::new();
    let mut phases: BTreeMap<&str, u32> = BTreeMap::new();
    let mut deployments = vec![first];
    for round in 0..ROUNDS {
        let k = round + 2;
        deployments.push(deploy(&cp, k, &[2]).await);
        let i = rng.random_range(0..agents.len());
        let started = tokio::time::Instant::now();
        // Aimed in turn at the download, at the moment it completes (the
        // checks, the slot write and the flip follow), and anywhere (the
        // traffic's telemetry flushes every second).
        let digest = Digest::of(&version_model(k, PAD));
        match round % 3 {
            0 => {
                wait_until(|| agents[i].partial(MODEL, digest)).await;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
            }
            1 => {
                wait_until(|| agents[i].partial(MODEL, digest)).await;
                wait_until(|| !agents[i].partial(MODEL, digest)).await;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1_500))).await;
            }
        }
        let after = started.elapsed();
        // Where the kill lands, as far as the outside can tell.
        let phase = if agents[i].partial(MODEL, digest) {
            "download"
        } else {
            match served(&http, &agents[i].url().unwrap()).await {
                Some(v) if v == k => "serving_new",
                _ => "after_download",
            }
        };
        *phases.entry(phase).or_default() += 1;
        urls.lock().unwrap()[i] = None;
        agents[i].kill().await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        agents[i].restart().await;
        let url = agents[i].url().unwrap();
        urls.lock().unwrap()[i] = Some(url.clone());
        // Back from disk with a whole version, old or new, before it
        // reaches the network; `served` checks the answer.
        let back = eventually(
            WAIT,
            &format!("{} serves again", agents[i].name),
            || async { served(&http, &url).await },
        )
        .await;
        assert!(back <= k, "served {back} before it was deployed");
        eprintln!(
            "round {round}: {} killed {after:?} into the rollout of {} ({phase}); back serving {}",
            agents[i].name,
            version(k),
            version(back)
        );
        let state = ended(&cp, deployments.last().unwrap()).await;
        tally.notes.push(format!("{}={state}", version(k)));
    }
    // The fleet converges once the kills stop.
    let last = deploy(&cp, ROUNDS + 2, &[2]).await;
    assert_eq!(ended(&cp, &last).await, "succeeded");
    all_serve(&agents, ROUNDS + 2).await;
    // One telemetry interval and a bit, so the last windows are flushed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    load.await.unwrap();

    // Telemetry: every epoch's sequences from 1 without a gap (nothing an
    // agent persisted was lost or stored twice), nothing dropped, and no
    // request counted more often than it was answered.
    let mut reports = 0;
    for (i, a) in agents.iter().enumerate() {
        let stored = stored_reports(&cp, &a.name).await;
        let mut epochs: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut requests = 0;
        for ((epoch, seq), copies) in &stored {
            assert_eq!(copies.len(), 1);
            epochs.entry(*epoch).or_default().push(*seq);
            let r = &copies[0];
            assert_eq!(r["dropped_batches"], 0, "{r}");
            requests += r["models"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["requests"].as_u64().unwrap())
                .sum::<u64>();
        }
        for (epoch, seqs) in &epochs {
            let want: Vec<u64> = (1..=seqs.len() as u64).collect();
            assert_eq!(seqs, &want, "{} epoch {epoch}: a gap", a.name);
        }
        let answered = answers[i].load(Ordering::Relaxed);
        assert!(
            requests <= answered,
            "{}: {requests} counted, {answered} sent",
            a.name
        );
        reports += stored.len() as u64;
        tally.notes.push(format!(
            "{}:sent={answered},counted={requests},epochs={}",
            a.name,
            epochs.len()
        ));
    }
    tally.kills = agents.iter().map(|a| a.proc.kills).sum();
    tally.reports_checked = reports;
    tally.answers_checked = answers.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    tally.deployments_ended = deployments.len() as u64 + 1;
    tally.notes.push(format!("phases={phases:?}"));
    tally.print("agent", seed);
    for a in &mut agents {
        a.kill().await;
    }
}

/// An agent crashed exactly at each step of an install into its inactive
/// slot and of the flip (`edgeloop_edge_agent::crash_point`): started
/// again, it serves from disk the version its recorded active slot holds,
/// whole and signed (the old one until the flip is recorded, the new one
/// after), then installs what is assigned, and the rollout succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_crashed_at_each_install_and_flip_step_boots_a_signed_version_and_converges() {
    use edgeloop_edge_agent::crash_point::{ENV, POINTS};
    edgeloop_client_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp"), None).await;
    create_model(&cp, MODEL).await;
    let key = ManifestKey::generate();
    for k in 1..=POINTS.len() as u32 + 1 {
        register(&cp, &key, k, 1024).await;
    }
    let mut agents = start_agents(&cp, dir.path(), &key, 1).await;
    let agent = &mut agents[0];
    let first = deploy(&cp, 1, &[1]).await;
    assert_eq!(ended(&cp, &first).await, "succeeded");
    all_serve(std::slice::from_ref(agent), 1).await;
    let http = reqwest::Client::new();
    let mut tally = Tally::default();
    for (i, point) in POINTS.iter().enumerate() {
        let k = i as u32 + 2;
        agent.kill().await;
        agent.proc.set_env(ENV, Some(point));
        agent.restart().await;
        all_serve(std::slice::from_ref(agent), k - 1).await;
        let id = deploy(&cp, k, &[1]).await;
        let status = agent
            .proc
            .exited(WAIT)
            .await
            .unwrap_or_else(|| panic!("{point}: the agent never reached it"));
        assert!(!status.success(), "{point}: {status}");
        assert_eq!(
            agent
                .proc
                .log_count(&format!("crash point {point} reached")),
            1,
            "{point}"
        );
        agent.proc.set_env(ENV, None);
        let boots_before = agent.proc.log_count("serving from disk");
        agent.restart().await;
        // What the recorded active slot holds serves first, from disk.
        let want = if *point == "slot_flipped" { k } else { k - 1 };
        let url = agent.url().unwrap();
        let back = eventually(WAIT, &format!("{point}: serves again"), || async {
            served(&http, &url).await
        })
        .await;
        assert!(back == want || back == k, "{point}: served {back}");
        assert_eq!(
            agent.proc.log_count("serving from disk"),
            boots_before + 1,
            "{point}: booted from a slot"
        );
        let boot = agent
            .proc
            .log_lines("serving from disk")
            .pop()
            .unwrap_or_default();
        assert!(
            boot.contains(&version(want)),
            "{point}: booted {boot}, want {}",
            version(want)
        );
        assert_eq!(ended(&cp, &id).await, "succeeded", "{point}");
        all_serve(std::slice::from_ref(agent), k).await;
        tally
            .notes
            .push(format!("{point}:booted={}", version(want)));
    }
    tally.kills = POINTS.len() as u32;
    tally.deployments_ended = POINTS.len() as u64 + 1;
    tally.print("agent_crash_points", 0);
    agent.kill().await;
}

// ---------------------------------------------------------------------------
// Two replicas on PostgreSQL and S3, one killed mid-rollout
// ---------------------------------------------------------------------------

/// Waits until `n` devices of the crash site are online, as `cp` sees them.
async fn online(cp: &CpProcess, n: usize) {
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

/// Each device's assignment generation in deployment `id`.
async fn generations(cp: &CpProcess, id: &str) -> BTreeMap<String, u64> {
    let (status, body) = cp.api().get(&format!("/api/v1/deployments/{id}")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body["assigned_generation"].clone()).unwrap()
}

/// Two control-plane replicas share one PostgreSQL database and one S3
/// prefix (and the CA, signing key and admin token: `share_secrets_with`);
/// the agents take both endpoints. Replica A, up first, leads the
/// background work; it is SIGKILLed while a two-wave rollout that replica
/// B accepted is under way. B takes the leases once A's lapse, finishes
/// the rollout, and the agents, whose streams were on A, fail over to B.
/// Nothing is done twice: each device's assignment generation in the
/// rollout is its previous one plus one (a stale leader's second write
/// would add another). Everything acknowledged reads back on B, and a
/// rollout started after the kill reaches every device through B alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_rollout_hands_its_work_to_the_other() {
    edgeloop_client_core::install_crypto_provider();
    let Some(db) = edgeloop_control_plane::store::TestDatabase::from_env("two replicas") else {
        return;
    };
    let Some(s3) = edgeloop_tests::s3_test_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        (
            "EDGELOOP_STORE_URL".to_string(),
            db.url().expose().to_string(),
        ),
        ("EDGELOOP_ARTIFACT_URL".to_string(), s3),
    ];
    let mut a = CpProcess::start_with_env(&dir.path().join("a"), None, env.clone()).await;
    a.share_secrets_with(&dir.path().join("b"));
    let b = CpProcess::start_with_env(&dir.path().join("b"), None, env.clone()).await;
    // A replica that made a CA of its own is refused at start: members
    // that fail over to it could not connect.
    let stray_dir = dir.path().join("stray");
    let mut stray = edgeloop_tests::crash::Proc::new(
        "control-plane",
        ["serve", "--data-dir", &stray_dir.display().to_string()]
            .into_iter()
            .chain([
                "--grpc-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .map(String::from)
            .collect(),
        env,
        dir.path().join("stray.log"),
    );
    stray.spawn();
    let status = stray.exited(WAIT).await.expect("the stray replica stops");
    assert!(!status.success(), "{status}");
    assert_eq!(
        stray.log_count("replicas share one CA"),
        1,
        "{}",
        stray.log_tail()
    );
    // Each says what it leads once it has tried (after it answers HTTP).
    let leads = |cp: &CpProcess| cp.proc.log_lines("background leases").pop();
    let (la, lb) = (
        eventually(WAIT, "A's leases", || async { leads(&a) }).await,
        eventually(WAIT, "B's leases", || async { leads(&b) }).await,
    );
    assert!(la.contains("Rollouts"), "A leads: {la}");
    assert!(lb.contains("leads=[]"), "B waits: {lb}");

    create_model(&a, MODEL).await;
    let key = ManifestKey::generate();
    for k in 1..=3 {
        register(&a, &key, k, 1024).await;
    }
    let endpoints = format!("{},{}", a.grpc_url, b.grpc_url);
    let mut agents = vec![];
    for i in 0..4 {
        let name = format!("edge-{i}");
        let token = labelled_token(&b, "device", &name).await;
        let at = dir.path().join(&name);
        agents.push(AgentProcess::start_at(&endpoints, &name, &at, &token, &key.public()).await);
    }
    online(&b, 4).await;
    let first = deploy(&a, 1, &[4]).await;
    assert_eq!(ended(&b, &first).await, "succeeded");
    all_serve(&agents, 1).await;

    // A rollout accepted by B, run by A, until its first wave has moved.
    let second = deploy(&b, 2, &[2, 4]).await;
    let http = reqwest::Client::new();
    let urls: Vec<String> = agents.iter().map(|g| g.url().unwrap()).collect();
    eventually(WAIT, "the first wave moves", || async {
        for u in &urls {
            if served(&http, u).await == Some(2) {
                return Some(());
            }
        }
        None
    })
    .await;
    let at_kill = deployment_state(&b, &second).await;
    a.kill().await;
    let killed = tokio::time::Instant::now();
    assert!(
        at_kill.as_deref().is_some_and(|s| !TERMINAL.contains(&s)),
        "killed mid-rollout: {at_kill:?}"
    );
    assert_eq!(ended(&b, &second).await, "succeeded");
    let took = killed.elapsed();
    all_serve(&agents, 2).await;
    let changed = b.proc.log_lines("leadership changed");
    assert!(
        changed
            .iter()
            .any(|l| l.contains("task=\"rollouts\"") || l.contains("task=rollouts")),
        "B took the rollouts: {changed:?}"
    );
    let (g1, g2) = (
        generations(&b, &first).await,
        generations(&b, &second).await,
    );
    assert_eq!(g2.len(), 4, "{g2:?}");
    for (device, g) in &g2 {
        assert_eq!(*g, g1[device] + 1, "{device}: one write per deployment");
    }
    // Acknowledged writes read back on B.
    let (status, versions) = b
        .api()
        .get(&format!("/api/v1/models/{MODEL}/versions"))
        .await;
    assert_eq!(status, 200, "{versions}");
    assert_eq!(versions.as_array().unwrap().len(), 3, "{versions}");
    // And B alone rolls out what comes next.
    let third = deploy(&b, 3, &[4]).await;
    assert_eq!(ended(&b, &third).await, "succeeded");
    all_serve(&agents, 3).await;
    let tally = Tally {
        kills: 1,
        deployments_ended: 3,
        notes: vec![format!(
            "state_at_kill={} rollout_finished_after_kill={took:?}",
            at_kill.unwrap_or_default()
        )],
        ..Tally::default()
    };
    tally.print("replicas", 0);
    for g in &mut agents {
        g.kill().await;
    }
}

// ---------------------------------------------------------------------------
// The bridge killed mid-upload
// ---------------------------------------------------------------------------

/// A trainer that follows the checkpoint contract (as
/// `fixtures/contract_trainer.sh`) with `CKPT_BYTES` of incompressible
/// weights in each checkpoint, so each upload takes a while.
const BIG_CHECKPOINT_TRAINER: &str = r#"#!/bin/sh
set -eu
total=${TOTAL:-30}
every=${EVERY:-5}
step=0
if [ -n "${EDGELOOP_RESUME_FROM:-}" ]; then
  step=$(cat "$EDGELOOP_RESUME_FROM/state.txt")
  echo "attempt ${EDGELOOP_ATTEMPT:-?} resumed from $step" >> "$EDGELOOP_CHECKPOINT_DIR/../trainer.log"
fi
while [ "$step" -lt "$total" ]; do
  step=$((step + 1))
  sleep "${STEP_SECONDS:-0.1}"
  if [ $((step % every)) -eq 0 ]; then
    d="$EDGELOOP_CHECKPOINT_DIR/step-$step"
    mkdir -p "$d"
    echo "$step" > "$d/state.txt"
    head -c "${CKPT_BYTES:-4000000}" /dev/urandom > "$d/weights.bin"
    h=$(sha256sum "$d/state.txt" | cut -d' ' -f1)
    w=$(sha256sum "$d/weights.bin" | cut -d' ' -f1)
    printf '{"step": %d, "wall_time": 0.1, "metrics": {"loss": 0.%d}, "optimizer_state": true, "files": [{"path": "state.txt", "sha256": "%s"}, {"path": "weights.bin", "sha256": "%s"}]}\n' \
      "$step" "$step" "$h" "$w" > "$d/manifest.json.tmp"
    mv "$d/manifest.json.tmp" "$d/manifest.json"
  fi
done
echo "finished at $step" >> "$EDGELOOP_CHECKPOINT_DIR/../trainer.log"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_or_control_plane_killed_mid_upload_resumes_and_the_job_completes() {
    const KILLS: u32 = 6;
    const TOTAL: u64 = 60;
    let (seed, mut rng) = seeded("bridge");
    let dir = tempfile::tempdir().unwrap();
    // Torn and failed checkpoint writes on top of the kills.
    let faults = format!("seed={seed},error=0.03,torn=0.3,delay_ms=10");
    let mut cp = CpProcess::start(&dir.path().join("cp"), Some(&faults)).await;
    let trainer = dir.path().join("trainer.sh");
    std::fs::write(&trainer, BIG_CHECKPOINT_TRAINER).unwrap();
    let token = cp.token("cluster", "crash-cluster").await;
    let bridge_dir = dir.path().join("bridge");
    std::fs::create_dir_all(&bridge_dir).unwrap();
    let mut bridge = edgeloop_tests::crash::Proc::new(
        "trainer-bridge",
        vec![
            "run".into(),
            "--data-dir".into(),
            bridge_dir.display().to_string(),
            "--control-plane".into(),
            cp.grpc_url.clone(),
            "--bootstrap-token".into(),
            token,
        ],
        vec![],
        dir.path().join("bridge.log"),
    );
    bridge.spawn();
    let spec = json!({
        "name": "crashy-job",
        "command": ["sh", trainer.display().to_string()],
        "env": {"TOTAL": TOTAL.to_string(), "EVERY": "5", "STEP_SECONDS": "0.15",
                "CKPT_BYTES": "4000000"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        // Above the 12 checkpoints the job makes: the control plane's
        // compactor, which runs at each start, trims a job's checkpoints to
        // its newest `keep_last`, and trimmed ones would read as uploads
        // that never arrived (a flake seen once with 2). That the bridge
        // prunes only what it has uploaded is
        // `only_uploaded_checkpoints_are_pruned`'s.
        "checkpoint": {"every_steps": 5, "keep_last": 20},
        "restarts": {"max_restarts": 3, "backoff_seconds": 1, "backoff_max_seconds": 2}
    });
    let job = retry("submit", || async {
        let r = cp
            .api()
            .request(Method::POST, "/api/v1/jobs")
            .json(&json!({"spec": spec}))
            .send()
            .await
            .ok()?;
        (r.status() == 201).then_some(())?;
        r.json::<Value>().await.ok()
    })
    .await;
    let id = job["id"].as_str().unwrap().to_string();
    let job_view = |cp: &CpProcess| {
        let (api, id) = (cp.api(), id.clone());
        async move {
            let r = api
                .request(Method::GET, &format!("/api/v1/jobs/{id}"))
                .send()
                .await
                .ok()?;
            r.json::<Value>().await.ok()
        }
    };
    // Each kill lands while a checkpoint upload is under way: the control
    // plane holds part of it (`artifacts/partial/`). After the restart that
    // upload resumes: its partial grows past where it was, or completes.
    let partials = cp.data_dir.join("artifacts").join("partial");
    let mut at_kill = vec![];
    for round in 0..KILLS {
        let (path, _) = eventually(WAIT, "a checkpoint upload under way", || async {
            edgeloop_tests::files_under(&partials)
                .into_iter()
                .filter_map(|p| Some((p.clone(), std::fs::metadata(&p).ok()?.len())))
                .find(|(_, len)| *len > 0)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..30))).await;
        bridge.assert_running("bridge");
        // The bridge, then the control plane, in turn: either end of the
        // upload may die.
        let pause = Duration::from_millis(rng.random_range(0..500));
        let held = if round % 2 == 0 {
            bridge.kill().await;
            let held = std::fs::metadata(&path).map_or(0, |m| m.len());
            tokio::time::sleep(pause).await;
            bridge.spawn();
            held
        } else {
            cp.kill().await;
            let held = std::fs::metadata(&path).map_or(0, |m| m.len());
            tokio::time::sleep(pause).await;
            cp.restart().await;
            held
        };
        at_kill.push(held);
        eventually(WAIT, "the cut upload resumes", || async {
            let now = std::fs::metadata(&path).map_or(u64::MAX, |m| m.len());
            (now > held).then_some(())
        })
        .await;
    }
    let done = eventually(Duration::from_secs(120), "the job ends", || async {
        job_view(&cp).await.filter(|j| {
            matches!(
                j["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
        })
    })
    .await;
    assert_eq!(
        done["state"],
        "succeeded",
        "{done}\nbridge log:\n{}",
        bridge.log_tail()
    );
    assert_eq!(done["step"], TOTAL, "{done}");
    // Every checkpoint the control plane lists is whole; the last is there.
    let checkpoints = done["checkpoints"].as_array().unwrap();
    let steps: Vec<u64> = checkpoints
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps.last(), Some(&TOTAL), "{steps:?}");
    let expected: Vec<u64> = (1..=TOTAL / 5).map(|i| i * 5).collect();
    assert_eq!(
        steps, expected,
        "every committed checkpoint reached the control plane"
    );
    for c in checkpoints {
        let d: Digest = c["digest"].as_str().unwrap().parse().unwrap();
        let bytes = retry(&format!("checkpoint {d}"), || async {
            let r = cp
                .api()
                .request(Method::GET, &format!("/api/v1/artifacts/{d}"))
                .send()
                .await
                .ok()?;
            assert_ne!(r.status(), 404, "checkpoint {d} listed but not stored");
            (r.status() == 200).then_some(())?;
            r.bytes().await.ok()
        })
        .await;
        assert_eq!(
            (Digest::of(&bytes), bytes.len() as u64),
            (d, c["size"].as_u64().unwrap())
        );
    }
    let mut tally = Tally {
        kills: bridge.kills + cp.proc.kills,
        ..Tally::default()
    };
    tally.notes.push(format!(
        "checkpoints={} bytes_held_at_each_kill={at_kill:?} attempt={} injected_faults_logged={}",
        steps.len(),
        done["attempt"],
        cp.proc.log_count("injected fault")
    ));
    tally.print("bridge", seed);
    bridge.kill().await;
    edgeloop_tests::kill_processes(|_, env| {
        env.contains(&format!("EDGELOOP_JOB_ID={id}").as_bytes())
    });
}
