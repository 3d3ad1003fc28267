//! Model sync against a real control plane on loopback: registration checks
//! for manifests and probes, downloads (resumed after a break and a kill),
//! verification, A/B slots, definite states, and boot after a crash at every
//! step of a slot flip. Serving is a recording test double: the real
//! `ModelHost` is tested elsewhere, and the lead's end-to-end tests join them.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use edgeloop_client_core::{Identity, Role};
use edgeloop_control_plane::fleet::assignments::{self, AssignmentRecord};
use edgeloop_control_plane::fleet::telemetry::{AssignmentState, AssignmentStatusRecord};
use edgeloop_edge_agent::config::SyncConfig;
use edgeloop_edge_agent::serving::{ActivationError, ModelServing, PrepareSpec, Serving};
use edgeloop_edge_agent::sync::assignment::Assignment;
use edgeloop_edge_agent::sync::generation::Decision;
use edgeloop_edge_agent::sync::slots::{Staged, MANIFEST_FILE, MODEL_FILE};
use edgeloop_edge_agent::sync::{
    AppliedSet, AppliedStore, ModelDir, ReportState, SlotId, SyncEvent, SyncOptions, Syncer,
};
use edgeloop_models::manifest::{
    ArtifactRef, DimSpec, HealthProbe, IoSignature, Lineage, Manifest, ManifestKey, TensorSpec,
    SCHEMA_VERSION,
};
use edgeloop_models::npz::Npz;
use edgeloop_models::{Digest, Tensor};
use edgeloop_registry::models::ModelVersionRecord;
use edgeloop_tests::{eventually, ControlPlane};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const CPU: &str = "CPUExecutionProvider";

// ---------------------------------------------------------------------------
// The serving test double
// ---------------------------------------------------------------------------

/// One `activate` call, with the sha256 of the file it was given.
#[derive(Debug, Clone)]
struct Activation {
    spec: PrepareSpec,
    file_digest: Digest,
    ok: bool,
}

/// Records every call and serves nothing; activation of the versions in
/// `fail` fails (as a failed health probe would).
#[derive(Default)]
struct RecordingServing {
    serving: Mutex<HashMap<String, Serving>>,
    activations: Mutex<Vec<Activation>>,
    unloads: Mutex<Vec<String>>,
    fail: Mutex<HashSet<String>>,
}

impl RecordingServing {
    fn fail_version(&self, version: &str) {
        self.fail.lock().unwrap().insert(version.to_string());
    }

    fn activations(&self) -> Vec<Activation> {
        self.activations.lock().unwrap().clone()
    }

    fn version(&self, model: &str) -> Option<String> {
        self.serving(model).map(|s| s.version)
    }
}

#[async_trait]
impl ModelServing for RecordingServing {
    async fn activate(&self, spec: PrepareSpec) -> Result<Serving, ActivationError> {
        let file_digest = Digest::of(&std::fs::read(&spec.path).unwrap_or_default());
        let ok = !self.fail.lock().unwrap().contains(&spec.version);
        self.activations.lock().unwrap().push(Activation {
            spec: spec.clone(),
            file_digest,
            ok,
        });
        if !ok {
            return Err(ActivationError::Probe("told to fail".into()));
        }
        let serving = Serving {
            version: spec.version.clone(),
            provider: CPU.into(),
        };
        self.serving
            .lock()
            .unwrap()
            .insert(spec.model.clone(), serving.clone());
        Ok(serving)
    }

    fn serving(&self, model: &str) -> Option<Serving> {
        self.serving.lock().unwrap().get(model).cloned()
    }

    fn unload(&self, model: &str) {
        self.serving.lock().unwrap().remove(model);
        self.unloads.lock().unwrap().push(model.to_string());
    }
}

// ---------------------------------------------------------------------------
// A TCP proxy that counts bytes and can break connections
// ---------------------------------------------------------------------------

/// Forwards to the control plane, counting bytes sent to the agent. Once
/// `budget` is spent it cuts every connection and refuses new ones (the
/// network is gone) until `heal`.
struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    task: JoinHandle<()>,
}

struct ProxyState {
    up: AtomicBool,
    tripped: AtomicBool,
    downstream: AtomicU64,
    budget: AtomicU64,
    conns: Mutex<Vec<JoinHandle<()>>>,
}

impl ProxyState {
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.tripped.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Proxy {
    async fn start(upstream: SocketAddr, budget: u64) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState {
            up: AtomicBool::new(true),
            tripped: AtomicBool::new(false),
            downstream: AtomicU64::new(0),
            budget: AtomicU64::new(budget),
            conns: Mutex::new(vec![]),
        });
        let s = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if !s.up.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let st = s.clone();
                let conn = tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                        let _ = sw.shutdown().await;
                    });
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let total = st.downstream.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
                        if total > st.budget.load(Ordering::SeqCst) {
                            up.abort();
                            st.cut();
                            return;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    up.abort();
                });
                s.conns.lock().unwrap().push(conn);
            }
        });
        Proxy { addr, state, task }
    }

    fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    fn tripped(&self) -> bool {
        self.state.tripped.load(Ordering::SeqCst)
    }

    fn downstream(&self) -> u64 {
        self.state.downstream.load(Ordering::SeqCst)
    }

    /// The network is back, without a budget, and the count restarts.
    fn heal(&self) {
        self.state.budget.store(u64::MAX, Ordering::SeqCst);
        self.state.downstream.store(0, Ordering::SeqCst);
        self.state.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.state.cut();
    }
}

// ---------------------------------------------------------------------------
// An agent in its own runtime, so that killing it kills all of its tasks
// ---------------------------------------------------------------------------

struct Agent {
    runtime: Option<tokio::runtime::Runtime>,
    events: broadcast::Receiver<SyncEvent>,
    serving: Arc<RecordingServing>,
}

impl Agent {
    /// Starts sync as the agent would: boot from disk, then watch.
    fn start(
        dir: &Path,
        control_plane: &str,
        member: edgeloop_client_core::MemberConfig,
        sync: SyncConfig,
        tune: impl FnOnce(&mut SyncOptions),
    ) -> Agent {
        let serving = Arc::new(RecordingServing::default());
        let mut options = SyncOptions::for_member(&member);
        options.download.chunk_bytes = 64 * 1024;
        options.download.persist_every = 256 * 1024;
        tune(&mut options);
        let syncer = Syncer::new(dir, sync, serving.clone(), options);
        let events = syncer.subscribe();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let member = edgeloop_client_core::MemberConfig {
            control_plane: control_plane.to_string(),
            ..member
        };
        runtime.spawn(async move {
            syncer.boot().await.unwrap();
            // The identity the test's enrollment stored.
            let store = edgeloop_client_core::IdentityStore::new(&member.data_dir);
            let identity = loop {
                match store.load().unwrap() {
                    Some(identity) => break identity,
                    None => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            let membership = edgeloop_client_core::Membership::with_identity(
                &member.control_plane,
                &member.data_dir,
                identity,
            )
            .unwrap();
            syncer
                .run_enrolled(&membership, CancellationToken::new())
                .await
                .unwrap();
        });
        Agent {
            runtime: Some(runtime),
            events,
            serving,
        }
    }

    /// Like SIGKILL: every task stops where it is.
    fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    /// Every event so far.
    fn drain(&mut self) -> Vec<SyncEvent> {
        let mut out = vec![];
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }

    async fn wait_event(
        &mut self,
        what: &str,
        mut pred: impl FnMut(&SyncEvent) -> bool,
    ) -> Vec<SyncEvent> {
        let mut seen = vec![];
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Ok(e)) => {
                    let hit = pred(&e);
                    seen.push(e);
                    if hit {
                        return seen;
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(e)) => panic!("events closed waiting for {what}: {e}"),
                Err(_) => panic!("timed out waiting for {what}; saw {seen:#?}"),
            }
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn fetched(events: &[SyncEvent], digest: Digest) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            SyncEvent::FetchStarted { digest: d, offset } if *d == digest => Some(*offset),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Control plane, device and content
// ---------------------------------------------------------------------------

struct Env {
    _dir: tempfile::TempDir,
    cp: ControlPlane,
    device_dir: PathBuf,
    _identity: Identity,
    key: ManifestKey,
}

fn blob(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u32::from(seed).wrapping_mul(0x9E37_79B9) | 1;
    (0..len)
        .map(|_| {
            // xorshift: incompressible enough, reproducible.
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn manifest(version: &str, artifact: &[u8], probe: Option<Digest>) -> Manifest {
    manifest_for("digits", version, artifact, probe)
}

fn manifest_for(name: &str, version: &str, artifact: &[u8], probe: Option<Digest>) -> Manifest {
    let spec = |name: &str, n: i64| TensorSpec {
        name: name.into(),
        dtype: "float32".into(),
        shape: vec![DimSpec::Symbolic("batch".into()), DimSpec::Fixed(n)],
    };
    Manifest {
        schema: SCHEMA_VERSION,
        name: name.into(),
        version: version.into(),
        artifact: ArtifactRef {
            sha256: Digest::of(artifact),
            size: artifact.len() as u64,
            format: "onnx".into(),
        },
        signature: IoSignature {
            inputs: vec![spec("x", 4)],
            outputs: vec![spec("y", 2)],
        },
        quantization: None,
        reference_stats: None,
        lineage: Lineage::default(),
        health_probe: probe.map(|sample_inputs| HealthProbe {
            sample_inputs,
            max_latency_ms: 50.0,
        }),
        created_at: "2024-05-01T00:00:00Z".into(),
        min_version: None,
        rollback: false,
    }
}

fn sign(key: &ManifestKey, m: Manifest) -> Vec<u8> {
    key.sign(m).unwrap().to_json_pretty().unwrap().into_bytes()
}

fn probe_inputs() -> Vec<u8> {
    let mut npz = Npz::new();
    let x = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[1, 4]), vec![0.1f32, 0.2, 0.3, 0.4])
        .unwrap();
    npz.insert("x", Tensor::F32(x));
    npz.to_bytes().unwrap()
}

impl Env {
    async fn start() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::start(&dir.path().join("cp")).await;
        let device_dir = dir.path().join("device");
        let identity = cp
            .enroll(
                Role::Device,
                &cp.token("device", "edge-1").await,
                &device_dir,
            )
            .await;
        let (status, body) = cp
            .api()
            .post("/api/v1/models", json!({"name": "digits"}))
            .await;
        assert_eq!(status, 201, "{body}");
        Env {
            _dir: dir,
            cp,
            device_dir,
            _identity: identity,
            key: ManifestKey::generate(),
        }
    }

    async fn upload(&self, data: &[u8]) -> Digest {
        let digest = Digest::of(data);
        let (status, body) = self
            .cp
            .api()
            .raw(
                Method::PUT,
                &format!("/api/v1/artifacts/{digest}"),
                data.to_vec(),
            )
            .await;
        assert!(status == 201 || status == 200, "{body}");
        digest
    }

    /// Registers a version through the console API.
    async fn register(
        &self,
        version: &str,
        artifact: &[u8],
        manifest: Option<&[u8]>,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let artifact_digest = self.upload(artifact).await;
        let mut body = json!({"version": version, "artifact_digest": artifact_digest.to_string()});
        if let Some(m) = manifest {
            body["manifest_digest"] = json!(self.upload(m).await.to_string());
        }
        self.cp
            .api()
            .post("/api/v1/models/digits/versions", body)
            .await
    }

    async fn version(
        &self,
        version: &str,
        artifact: &[u8],
        manifest: Option<&[u8]>,
    ) -> ModelVersionRecord {
        let (status, body) = self.register(version, artifact, manifest).await;
        assert_eq!(status, 201, "{body}");
        serde_json::from_value(body).unwrap()
    }

    async fn assign(&self, records: Vec<AssignmentRecord>) -> u64 {
        assignments::replace(&self.cp.core.store, &self.cp.core.events, "edge-1", records)
            .await
            .unwrap()
            .generation
    }

    fn sync_config(&self, allow_unsigned: bool) -> SyncConfig {
        SyncConfig {
            download_concurrency: 2,
            trusted_keys: vec![self.key.public()],
            allow_unsigned,
        }
    }

    fn agent(&self, url: &str, allow_unsigned: bool, tune: impl FnOnce(&mut SyncOptions)) -> Agent {
        Agent::start(
            &self.device_dir,
            url,
            self.cp.member_config(&self.device_dir, None),
            self.sync_config(allow_unsigned),
            tune,
        )
    }

    fn status(&self, model: &str) -> Option<AssignmentStatusRecord> {
        self.cp
            .core
            .store
            .fleet
            .assignment_status
            .get(&format!("edge-1/{model}"))
            .unwrap()
    }

    async fn wait_status(
        &self,
        model: &str,
        version: &str,
        state: AssignmentState,
    ) -> AssignmentStatusRecord {
        eventually(WAIT, &format!("{model} {version} {state:?}"), || async {
            self.status(model)
                .filter(|s| s.model_version == version && s.state == state)
        })
        .await
    }

    fn model_dir(&self, model: &str) -> ModelDir {
        ModelDir::new(&self.device_dir.join("models"), model)
    }
}

fn record(name: &str, version: &str, artifact: &[u8], manifest: Option<&[u8]>) -> AssignmentRecord {
    AssignmentRecord {
        model_name: name.into(),
        model_version: version.into(),
        artifact_digest: Digest::of(artifact),
        artifact_size: artifact.len() as u64,
        manifest_digest: manifest.map(Digest::of),
        deployment_id: format!("dep-{name}-{version}"),
        activation_timeout_seconds: 60,
        probe_inputs_digest: None,
        deployment_seq: 0,
        variant: None,
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn registering_a_version_checks_its_manifest_and_probe_inputs() {
    let env = Env::start().await;
    let model = blob(10_000, 1);
    let other = blob(10_000, 2);
    let probe = probe_inputs();
    let probe_inputs_digest = Digest::of(&probe);

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "not-json",
            b"not a manifest".to_vec(),
            "not a signed manifest",
        ),
        (
            "other-artifact",
            sign(&env.key, manifest("1.0.0", &other, None)),
            "describes artifact",
        ),
        (
            "other-size",
            sign(&env.key, {
                let mut m = manifest("1.0.0", &model, None);
                m.artifact.size += 1;
                m
            }),
            "size",
        ),
        (
            "probe-missing",
            sign(
                &env.key,
                manifest("1.0.0", &model, Some(probe_inputs_digest)),
            ),
            "health_probe.sample_inputs",
        ),
        (
            "7.0.0",
            sign(&env.key, manifest("1.0.0", &model, None)),
            "signed for version \"1.0.0\" of \"digits\", not \"7.0.0\"",
        ),
        (
            "8.0.0",
            sign(&env.key, manifest_for("rainfall", "8.0.0", &model, None)),
            "signed for model \"rainfall\", not \"digits\"",
        ),
    ];
    for (version, m, message) in cases {
        let (status, body) = env.register(version, &model, Some(&m)).await;
        assert_eq!(status, 400, "{version}: {body}");
        assert_eq!(
            body["error"]["field"], "manifest_digest",
            "{version}: {body}"
        );
        let text = body["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{version}: {text}");
    }

    // With the sample inputs uploaded, the version records them and an
    // assignment of it carries them, so a device may fetch them.
    env.upload(&probe).await;
    let signed = sign(
        &env.key,
        manifest("1.0.0", &model, Some(probe_inputs_digest)),
    );
    let v = env.version("1.0.0", &model, Some(&signed)).await;
    assert_eq!(v.probe_inputs_digest, Some(probe_inputs_digest));
    let a = AssignmentRecord::for_version(&v, "dep-1", 30);
    assert_eq!(a.probe_inputs_digest, Some(probe_inputs_digest));
    let generation = env.assign(vec![a]).await;
    let set = assignments::current(&env.cp.core.store, "edge-1").unwrap();
    assert_eq!(set.generation, generation);
    assert!(set.references(probe_inputs_digest));
    assert_eq!(
        set.to_proto().assignments[0].probe_inputs_digest,
        probe_inputs_digest.to_string()
    );
    // Without a manifest, nothing to check.
    let unsigned = env.version("2.0.0", &model, None).await;
    assert_eq!(
        (unsigned.manifest_digest, unsigned.probe_inputs_digest),
        (None, None)
    );
    env.cp.stop().await;
}

#[tokio::test]
async fn assign_download_activate_upgrade_roll_back_fail_and_unassign() {
    let env = Env::start().await;
    let (m1, m2, m3) = (blob(300_000, 1), blob(200_000, 2), blob(100_000, 3));
    let probe = probe_inputs();
    let probe_inputs_digest = env.upload(&probe).await;
    let s1 = sign(&env.key, manifest("1.0.0", &m1, Some(probe_inputs_digest)));
    let v1 = env.version("1.0.0", &m1, Some(&s1)).await;
    let v2 = env
        .version(
            "2.0.0",
            &m2,
            Some(&sign(&env.key, manifest("2.0.0", &m2, None))),
        )
        .await;
    let v3 = env
        .version(
            "3.0.0",
            &m3,
            Some(&sign(&env.key, manifest("3.0.0", &m3, None))),
        )
        .await;
    let mut agent = env.agent(&env.cp.grpc_url, false, |_| {});
    let slot = |id: SlotId| env.model_dir("digits").slot_dir(id).join(MODEL_FILE);

    // Assign: downloaded, verified, activated with the verified file.
    let g1 = env
        .assign(vec![AssignmentRecord::for_version(&v1, "d1", 60)])
        .await;
    let st = env
        .wait_status("digits", "1.0.0", AssignmentState::Active)
        .await;
    assert_eq!((st.generation, st.execution_provider.as_str()), (g1, CPU));
    let acts = agent.serving.activations();
    assert_eq!(acts.len(), 1);
    let a = &acts[0];
    assert_eq!(a.spec.path, slot(SlotId::A));
    assert_eq!(a.file_digest, Digest::of(&m1));
    assert_eq!(a.spec.manifest.as_ref().unwrap().version, "1.0.0");
    let probe_spec = a.spec.probe.as_ref().unwrap();
    assert_eq!(probe_spec.inputs[0].0, "x");
    assert_eq!(probe_spec.inputs[0].1.shape(), &[1, 4]);
    assert_eq!(probe_spec.max_latency, Duration::from_millis(50));
    let state = env.model_dir("digits").load().unwrap();
    assert_eq!(state.active, Some(SlotId::A));
    assert_eq!(state.generation, g1);

    // Upgrade: into the other slot; the old version stays on disk.
    env.assign(vec![AssignmentRecord::for_version(&v2, "d2", 60)])
        .await;
    env.wait_status("digits", "2.0.0", AssignmentState::Active)
        .await;
    assert_eq!(agent.serving.activations()[1].spec.path, slot(SlotId::B));
    assert_eq!(std::fs::read(slot(SlotId::A)).unwrap(), m1);
    assert_eq!(
        env.model_dir("digits").load().unwrap().active,
        Some(SlotId::B)
    );
    agent.drain();

    // The previous version assigned back: restored from disk, no download.
    env.assign(vec![AssignmentRecord::for_version(&v1, "d1-again", 60)])
        .await;
    let st = env
        .wait_status("digits", "1.0.0", AssignmentState::RolledBack)
        .await;
    assert_eq!(st.execution_provider, CPU);
    assert_eq!(agent.serving.version("digits").as_deref(), Some("1.0.0"));
    assert_eq!(agent.serving.activations()[2].spec.path, slot(SlotId::A));
    assert_eq!(fetched(&agent.drain(), Digest::of(&m1)), Vec::<u64>::new());

    // An activation that fails: rolled back, the serving version untouched.
    agent.serving.fail_version("3.0.0");
    env.assign(vec![AssignmentRecord::for_version(&v3, "d3", 60)])
        .await;
    let st = env
        .wait_status("digits", "3.0.0", AssignmentState::RolledBack)
        .await;
    assert!(
        st.reason.contains("version 1.0.0 still serves"),
        "{}",
        st.reason
    );
    assert!(st.reason.contains("told to fail"), "{}", st.reason);
    assert_eq!(agent.serving.version("digits").as_deref(), Some("1.0.0"));
    let state = env.model_dir("digits").load().unwrap();
    assert_eq!(state.active, Some(SlotId::A));
    assert_eq!(std::fs::read(slot(SlotId::A)).unwrap(), m1);

    // Unassigned: unloaded; the files stay.
    env.assign(vec![]).await;
    eventually(WAIT, "unload", || async {
        agent
            .serving
            .unloads
            .lock()
            .unwrap()
            .contains(&"digits".to_string())
            .then_some(())
    })
    .await;
    assert!(slot(SlotId::A).exists());
    drop(agent);
    env.cp.stop().await;
}

#[tokio::test]
async fn a_copy_damaged_on_disk_is_downloaded_again_instead_of_activated() {
    let env = Env::start().await;
    let (m1, m2) = (blob(100_000, 1), blob(100_000, 2));
    let v1 = env
        .version(
            "1.0.0",
            &m1,
            Some(&sign(&env.key, manifest("1.0.0", &m1, None))),
        )
        .await;
    let v2 = env
        .version(
            "2.0.0",
            &m2,
            Some(&sign(&env.key, manifest("2.0.0", &m2, None))),
        )
        .await;
    let mut agent = env.agent(&env.cp.grpc_url, false, |_| {});
    env.assign(vec![AssignmentRecord::for_version(&v1, "d1", 60)])
        .await;
    env.wait_status("digits", "1.0.0", AssignmentState::Active)
        .await;
    env.assign(vec![AssignmentRecord::for_version(&v2, "d2", 60)])
        .await;
    env.wait_status("digits", "2.0.0", AssignmentState::Active)
        .await;
    agent.drain();
    // The previous version's file rots in its slot.
    let slot_a = env.model_dir("digits").slot_dir(SlotId::A).join(MODEL_FILE);
    let mut rotten = m1.clone();
    rotten[500] ^= 1;
    std::fs::write(&slot_a, &rotten).unwrap();

    env.assign(vec![AssignmentRecord::for_version(&v1, "d1-again", 60)])
        .await;
    env.wait_status("digits", "1.0.0", AssignmentState::Active)
        .await;
    assert_eq!(fetched(&agent.drain(), Digest::of(&m1)), vec![0]);
    let acts = agent.serving.activations();
    assert_eq!(acts.len(), 3, "the damaged file was never activated");
    assert_eq!(acts[2].file_digest, Digest::of(&m1));
    assert_eq!(std::fs::read(&slot_a).unwrap(), m1);
    drop(agent);
    env.cp.stop().await;
}

#[tokio::test]
async fn an_interrupted_download_resumes_from_its_offset_after_the_agent_is_killed() {
    let env = Env::start().await;
    let size = 4 << 20;
    let model = blob(size, 7);
    let signed = sign(&env.key, manifest("1.0.0", &model, None));
    let v1 = env.version("1.0.0", &model, Some(&signed)).await;
    let digest = v1.artifact_digest;
    // The network breaks after about half of the model has gone through.
    let proxy = Proxy::start(env.cp.grpc_addr, (size / 2) as u64).await;
    let agent = env.agent(&proxy.url(), false, |_| {});
    env.assign(vec![AssignmentRecord::for_version(&v1, "d1", 120)])
        .await;
    let downloads = env.model_dir("digits").downloads_dir();
    let progress = downloads.join(format!("{digest}.progress"));
    let offset_on_disk = || -> Option<u64> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&progress).ok()?).ok()?;
        v["offset"].as_u64()
    };
    // The agent saves its progress at the break, then retries from there.
    let mut agent = agent;
    agent
        .wait_event("a retry after the break", |e| {
            matches!(e, SyncEvent::FetchStarted { digest: d, offset } if *d == digest && *offset > 0)
        })
        .await;
    assert!(proxy.tripped());
    // The agent is killed while it waits for the network.
    agent.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let offset = offset_on_disk().unwrap();
    let partial_len = std::fs::metadata(downloads.join(format!("{digest}.partial")))
        .unwrap()
        .len();
    assert!(
        offset >= size as u64 / 5 && offset <= size as u64 * 4 / 5,
        "broke at {offset} of {size}"
    );
    assert!(partial_len >= offset);
    assert!(env
        .status("digits")
        .is_none_or(|s| s.state != AssignmentState::Active));

    // A new agent process on the same data dir, the network back.
    proxy.heal();
    let mut agent = env.agent(&proxy.url(), false, |_| {});
    let mut events = agent
        .wait_event(
            "active after the restart",
            |e| matches!(e, SyncEvent::Status { state, .. } if *state == ReportState::Active),
        )
        .await;
    env.wait_status("digits", "1.0.0", AssignmentState::Active)
        .await;
    events.extend(agent.drain());
    assert_eq!(fetched(&events, digest), vec![offset], "{events:#?}");
    // What crossed the network after the restart: the rest, not the whole.
    let rest = size as u64 - offset;
    assert!(
        proxy.downstream() < rest + (256 << 10),
        "{} bytes sent after the restart; {rest} were missing",
        proxy.downstream()
    );
    let acts = agent.serving.activations();
    assert_eq!(acts.len(), 1);
    assert_eq!(acts[0].file_digest, digest);
    assert!(!progress.exists());
    drop(agent);
    env.cp.stop().await;
}

#[tokio::test]
async fn a_download_that_cannot_finish_fails_at_its_deadline_and_the_report_waits_for_the_network()
{
    let env = Env::start().await;
    let size = 2 << 20;
    let model = blob(size, 9);
    let v1 = env.version("1.0.0", &model, None).await;
    let proxy = Proxy::start(env.cp.grpc_addr, (size / 4) as u64).await;
    let mut agent = env.agent(&proxy.url(), true, |_| {});
    env.assign(vec![AssignmentRecord::for_version(&v1, "d1", 2)])
        .await;
    agent
        .wait_event("the timeout", |e| {
            matches!(e, SyncEvent::Status { state, reason, .. }
                if *state == ReportState::Failed
                    && reason == "download timed out after 2s")
        })
        .await;
    assert!(proxy.tripped());
    assert!(agent.serving.activations().is_empty());
    // Reported once the control plane is reachable again.
    proxy.heal();
    // A report already in flight on a connection the cut left dead fails
    // only at its own timeout; the retry then goes through.
    let st = eventually(
        Duration::from_secs(60),
        "digits 1 failed reported",
        || async {
            env.status("digits")
                .filter(|s| s.model_version == "1.0.0" && s.state == AssignmentState::Failed)
        },
    )
    .await;
    assert_eq!(st.reason, "download timed out after 2s");
    drop(agent);
    env.cp.stop().await;
}

#[tokio::test]
async fn bad_signatures_digests_unsigned_and_too_large_versions_are_never_activated() {
    let env = Env::start().await;
    let stranger = ManifestKey::generate();
    let mut set = vec![];

    // Signed by a key this device does not trust.
    let a = blob(50_000, 1);
    let untrusted = sign(&stranger, manifest_for("untrusted", "1.0.0", &a, None));
    env.upload(&a).await;
    env.upload(&untrusted).await;
    set.push(record("untrusted", "1.0.0", &a, Some(&untrusted)));

    // A trusted manifest that describes another artifact.
    let (b, b_described) = (blob(50_000, 2), blob(50_000, 3));
    let m = sign(
        &env.key,
        manifest_for("mismatch", "1.0.0", &b_described, None),
    );
    env.upload(&b).await;
    env.upload(&m).await;
    set.push(record("mismatch", "1.0.0", &b, Some(&m)));

    // The partial download on disk was tampered with.
    let c = blob(400_000, 4);
    let m = sign(&env.key, manifest_for("tampered", "1.0.0", &c, None));
    env.upload(&c).await;
    env.upload(&m).await;
    set.push(record("tampered", "1.0.0", &c, Some(&m)));
    let downloads = env.model_dir("tampered").downloads_dir();
    std::fs::create_dir_all(&downloads).unwrap();
    let mut half = c[..200_000].to_vec();
    half[1000] ^= 0x55;
    std::fs::write(downloads.join(format!("{}.partial", Digest::of(&c))), &half).unwrap();
    std::fs::write(
        downloads.join(format!("{}.progress", Digest::of(&c))),
        br#"{"offset":200000}"#,
    )
    .unwrap();

    // No manifest, and this device requires one.
    let d = blob(10_000, 5);
    env.upload(&d).await;
    set.push(record("unsigned", "1.0.0", &d, None));

    // Signed, but larger than the disk (the size is the assignment's).
    let e = blob(10_000, 6);
    let mut huge = manifest_for("huge", "1.0.0", &e, None);
    huge.artifact.size = 1 << 60;
    let m = sign(&env.key, huge);
    env.upload(&e).await;
    env.upload(&m).await;
    let mut r = record("huge", "1.0.0", &e, Some(&m));
    r.artifact_size = 1 << 60;
    set.push(r);

    // Trusted, describing this very artifact, but signed for another model
    // (or version): a control plane cannot serve it under this name.
    let f = blob(20_000, 7);
    let m = sign(&env.key, manifest_for("digits", "1.0.0", &f, None));
    env.upload(&f).await;
    env.upload(&m).await;
    set.push(record("renamed", "1.0.0", &f, Some(&m)));
    let g = blob(20_000, 8);
    let m = sign(&env.key, manifest_for("reversioned", "7.0.0", &g, None));
    env.upload(&g).await;
    env.upload(&m).await;
    set.push(record("reversioned", "1.0.0", &g, Some(&m)));

    let mut agent = env.agent(&env.cp.grpc_url, false, |_| {});
    env.assign(set).await;
    let expect = [
        ("untrusted", "bad signature: manifest is signed by key"),
        (
            "mismatch",
            "the manifest does not match the assignment: it describes artifact",
        ),
        ("tampered", "bad digest: artifact"),
        ("unsigned", "unsigned: version 1.0.0 has no signed manifest"),
        ("huge", "no space: 1152921504606846976 bytes needed"),
        (
            "renamed",
            "the manifest does not match the assignment: it is signed for digits 1.0.0, the assignment is renamed 1.0.0",
        ),
        (
            "reversioned",
            "the manifest does not match the assignment: it is signed for reversioned 7.0.0",
        ),
    ];
    for (model, reason) in expect {
        let st = env
            .wait_status(model, "1.0.0", AssignmentState::Failed)
            .await;
        assert!(st.reason.starts_with(reason), "{model}: {}", st.reason);
    }
    assert!(agent.serving.activations().is_empty());
    let events = agent.drain();
    // Refused on the manifest, before the large download.
    assert!(fetched(&events, Digest::of(&a)).is_empty());
    assert!(fetched(&events, Digest::of(&b)).is_empty());
    assert!(fetched(&events, Digest::of(&e)).is_empty());
    assert!(fetched(&events, Digest::of(&f)).is_empty());
    assert!(fetched(&events, Digest::of(&g)).is_empty());
    // The tampered one resumed where the partial file said.
    assert_eq!(fetched(&events, Digest::of(&c)), vec![200_000]);
    drop(agent);

    // After a restart, a failure that depended on the moment (the tampered
    // partial file is gone) is retried from zero; a permanent one (the
    // signature) is reported again without fetching anything.
    let mut agent = env.agent(&env.cp.grpc_url, false, |_| {});
    let mut events = agent
        .wait_event("the tampered model retried", |e| {
            matches!(e, SyncEvent::Status { model, state, .. }
                if model == "tampered" && *state == ReportState::Active)
        })
        .await;
    env.wait_status("untrusted", "1.0.0", AssignmentState::Failed)
        .await;
    events.extend(agent.drain());
    assert_eq!(fetched(&events, Digest::of(&c)), vec![0]);
    assert!(fetched(&events, Digest::of(&untrusted)).is_empty());
    assert!(events
        .iter()
        .any(|e| matches!(e, SyncEvent::Status { model, state, .. }
        if model == "untrusted" && *state == ReportState::Failed)));
    let acts = agent.serving.activations();
    assert_eq!(acts.len(), 1);
    assert_eq!(acts[0].file_digest, Digest::of(&c));
    drop(agent);
    env.cp.stop().await;
}

#[tokio::test]
async fn a_stale_generation_never_overrides_a_newer_one() {
    let env = Env::start().await;
    let (m1, m2) = (blob(20_000, 1), blob(20_000, 2));
    let v1 = env.version("1.0.0", &m1, None).await;
    let v2 = env.version("2.0.0", &m2, None).await;
    // This device already applied generation 2 (say, from a control plane
    // replica ahead of this one).
    AppliedStore::new(&env.device_dir.join("models"))
        .save(&AppliedSet {
            generation: 2,
            assignments: vec![],
        })
        .unwrap();
    let g = env
        .assign(vec![AssignmentRecord::for_version(&v1, "d1", 60)])
        .await;
    assert_eq!(g, 1);
    let mut agent = env.agent(&env.cp.grpc_url, true, |_| {});
    let mut events = agent
        .wait_event("generation 1 offered", |e| {
            matches!(e, SyncEvent::SetOffered { generation: 1, .. })
        })
        .await;
    assert_eq!(
        events.last(),
        Some(&SyncEvent::SetOffered {
            generation: 1,
            decision: Decision::Ignore
        })
    );
    env.assign(vec![]).await;
    events.extend(
        agent
            .wait_event("generation 2 resumed", |e| {
                *e == SyncEvent::SetOffered {
                    generation: 2,
                    decision: Decision::Resume,
                }
            })
            .await,
    );
    env.assign(vec![AssignmentRecord::for_version(&v2, "d2", 60)])
        .await;
    env.wait_status("digits", "2.0.0", AssignmentState::Active)
        .await;
    events.extend(agent.drain());
    assert!(events.contains(&SyncEvent::SetOffered {
        generation: 3,
        decision: Decision::Apply
    }));
    assert!(fetched(&events, v1.artifact_digest).is_empty());
    let versions: Vec<String> = agent
        .serving
        .activations()
        .iter()
        .map(|a| a.spec.version.clone())
        .collect();
    assert_eq!(versions, vec!["2.0.0"]);
    assert_eq!(
        AppliedStore::new(&env.device_dir.join("models"))
            .load()
            .unwrap()
            .unwrap()
            .generation,
        3
    );
    drop(agent);
    env.cp.stop().await;
}

// ---------------------------------------------------------------------------
// Crash safety of the slot flip (no network: boot only)
// ---------------------------------------------------------------------------

struct Disk {
    _dir: tempfile::TempDir,
    data: PathBuf,
    key: ManifestKey,
    dir: ModelDir,
    v1: (Vec<u8>, Assignment),
    v2: (Vec<u8>, Assignment),
    staged: Staged,
}

fn assignment(model: &[u8], manifest: &[u8], version: &str) -> Assignment {
    Assignment {
        model: "digits".into(),
        version: version.into(),
        artifact: Digest::of(model),
        artifact_size: model.len() as u64,
        manifest: Some(Digest::of(manifest)),
        probe_inputs: None,
        deployment_id: format!("d{version}"),
        timeout_seconds: 60,
    }
}

/// v1 installed, served and active in slot A; v2 downloaded and verified,
/// about to be installed into slot B; the applied set assigns v2.
fn disk() -> Disk {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("device");
    let key = ManifestKey::from_bytes(&[9u8; 32]);
    let models = data.join("models");
    let dir = ModelDir::new(&models, "digits");
    let (m1, m2) = (blob(30_000, 1), blob(30_000, 2));
    let (s1, s2) = (
        sign(&key, manifest("1.0.0", &m1, None)),
        sign(&key, manifest("2.0.0", &m2, None)),
    );
    let (a1, a2) = (assignment(&m1, &s1, "1.0.0"), assignment(&m2, &s2, "2.0.0"));
    let mut state = Default::default();
    dir.clear(&mut state, SlotId::A).unwrap();
    std::fs::write(dir.slot_dir(SlotId::A).join(MODEL_FILE), &m1).unwrap();
    std::fs::write(dir.slot_dir(SlotId::A).join(MANIFEST_FILE), &s1).unwrap();
    dir.record(&mut state, SlotId::A, a1.content()).unwrap();
    dir.flip(&mut state, SlotId::A, 1).unwrap();
    let downloads = dir.downloads_dir();
    std::fs::create_dir_all(&downloads).unwrap();
    let staged = Staged {
        model: downloads.join(Digest::of(&m2).to_hex()),
        manifest: Some(downloads.join(Digest::of(&s2).to_hex())),
        probe: None,
    };
    std::fs::write(&staged.model, &m2).unwrap();
    std::fs::write(staged.manifest.as_ref().unwrap(), &s2).unwrap();
    AppliedStore::new(&models)
        .save(&AppliedSet {
            generation: 2,
            assignments: vec![a2.clone()],
        })
        .unwrap();
    Disk {
        _dir: tmp,
        data,
        key,
        dir,
        v1: (m1, a1),
        v2: (m2, a2),
        staged,
    }
}

impl Disk {
    /// Runs the first `steps` steps of installing v2 and flipping to it.
    fn install(&self, steps: usize) {
        let mut state = self.dir.load().unwrap();
        let c = self.v2.1.content();
        let all: [&dyn Fn(&mut edgeloop_edge_agent::sync::SlotsState); 4] = [
            &|s| self.dir.clear(s, SlotId::B).unwrap(),
            &|_| self.dir.place(SlotId::B, &self.staged).unwrap(),
            &|s| self.dir.record(s, SlotId::B, c.clone()).unwrap(),
            &|s| self.dir.flip(s, SlotId::B, 2).unwrap(),
        ];
        for step in all.iter().take(steps) {
            step(&mut state);
        }
    }

    /// Leaves what a process killed inside `write_atomic` leaves.
    fn torn_temp_file(&self) {
        std::fs::write(
            self.dir.root().join(".slots.json.tmp-424242"),
            b"{\"active\":\"b\",\"a\":nu",
        )
        .unwrap();
    }

    /// A fresh agent boots; returns what serves and the activations tried.
    async fn boot(&self, serving: RecordingServing) -> (Option<String>, Vec<Activation>) {
        let serving = Arc::new(serving);
        let syncer = Syncer::new(
            &self.data,
            SyncConfig {
                download_concurrency: 1,
                trusted_keys: vec![self.key.public()],
                allow_unsigned: false,
            },
            serving.clone(),
            SyncOptions::for_member(&edgeloop_client_core::MemberConfig {
                data_dir: self.data.clone(),
                control_plane: "https://localhost:1".into(),
                bootstrap_token: None,
                backoff: Default::default(),
            }),
        );
        syncer.boot().await.unwrap();
        (serving.version("digits"), serving.activations())
    }

    fn digest_of(&self, version: &str) -> Digest {
        if version == "1.0.0" {
            self.v1.1.artifact
        } else {
            self.v2.1.artifact
        }
    }
}

#[tokio::test]
async fn a_crash_at_any_step_of_the_slot_flip_boots_a_valid_model() {
    // Steps: clear B, place files, record B, flip to B.
    for steps in 0..=4 {
        for torn in [false, true] {
            let d = disk();
            d.install(steps);
            if torn {
                d.torn_temp_file();
            }
            let (serving, acts) = d.boot(RecordingServing::default()).await;
            let want = if steps == 4 { "2.0.0" } else { "1.0.0" };
            assert_eq!(
                serving.as_deref(),
                Some(want),
                "after {steps} steps, torn {torn}"
            );
            let last = acts.last().unwrap();
            assert_eq!(last.file_digest, d.digest_of(want), "after {steps} steps");
            assert!(last.spec.manifest.is_some());
            assert!(!d.dir.root().join(".slots.json.tmp-424242").exists());
        }
    }
    assert_eq!(disk().v1.0.len(), 30_000);
}

#[tokio::test]
async fn boot_falls_back_to_the_other_slot_when_the_active_one_is_broken() {
    // After the flip, the new model file is damaged (a power cut before the
    // data reached the disk): the previous version serves, and slot B is no
    // fallback any more.
    let d = disk();
    d.install(4);
    std::fs::write(d.dir.slot_dir(SlotId::B).join(MODEL_FILE), &d.v2.0[..1000]).unwrap();
    let (serving, acts) = d.boot(RecordingServing::default()).await;
    assert_eq!(serving.as_deref(), Some("1.0.0"));
    assert_eq!(acts.len(), 1, "the damaged file is never activated");
    assert_eq!(acts[0].file_digest, d.digest_of("1.0.0"));
    let state = d.dir.load().unwrap();
    assert_eq!(state.active, Some(SlotId::A));
    assert!(!state.b.unwrap().served);

    // Half-placed files in B before it was recorded: A serves.
    let d = disk();
    d.install(2);
    std::fs::write(d.dir.slot_dir(SlotId::B).join(MODEL_FILE), &d.v2.0[..10]).unwrap();
    assert_eq!(
        d.boot(RecordingServing::default()).await.0.as_deref(),
        Some("1.0.0")
    );

    // The new version's activation fails at boot: the old one serves.
    let d = disk();
    d.install(4);
    let failing = RecordingServing::default();
    failing.fail_version("2.0.0");
    let (serving, acts) = d.boot(failing).await;
    assert_eq!(serving.as_deref(), Some("1.0.0"));
    assert_eq!(
        acts.iter()
            .map(|a| (a.spec.version.as_str(), a.ok))
            .collect::<Vec<_>>(),
        vec![("2.0.0", false), ("1.0.0", true)]
    );

    // The active slot's directory vanished entirely.
    let d = disk();
    d.install(4);
    std::fs::remove_dir_all(d.dir.slot_dir(SlotId::B)).unwrap();
    assert_eq!(
        d.boot(RecordingServing::default()).await.0.as_deref(),
        Some("1.0.0")
    );

    // The signing key is no longer trusted: nothing boots.
    let d = disk();
    let serving = Arc::new(RecordingServing::default());
    let syncer = Syncer::new(
        &d.data,
        SyncConfig {
            download_concurrency: 1,
            trusted_keys: vec![ManifestKey::generate().public()],
            allow_unsigned: false,
        },
        serving.clone(),
        SyncOptions::for_member(&edgeloop_client_core::MemberConfig {
            data_dir: d.data.clone(),
            control_plane: "https://localhost:1".into(),
            bootstrap_token: None,
            backoff: Default::default(),
        }),
    );
    let outcomes = syncer.boot().await.unwrap();
    assert!(outcomes[0]
        .result
        .as_ref()
        .unwrap_err()
        .contains("bad signature"));
    assert!(serving.activations().is_empty());
}

/// Anti-rollback: once a version whose signed manifest sets a floor has
/// served, an older version is refused, also when it is still on disk in
/// the other slot, and the newer one keeps serving; a manifest signed as a
/// rollback goes below the floor and sets its own. The floor survives a
/// restart.
#[tokio::test]
async fn a_signed_floor_refuses_older_versions_until_a_signed_rollback() {
    let env = Env::start().await;
    let (m1, m2, m3) = (blob(60_000, 1), blob(60_000, 2), blob(60_000, 3));
    let v1 = env
        .version(
            "1.0.0",
            &m1,
            Some(&sign(&env.key, manifest("1.0.0", &m1, None))),
        )
        .await;
    let floored = Manifest {
        min_version: Some("2.0.0".into()),
        ..manifest("2.0.0", &m2, None)
    };
    let v2 = env
        .version("2.0.0", &m2, Some(&sign(&env.key, floored)))
        .await;
    let rollback = Manifest {
        rollback: true,
        ..manifest("1.0.1", &m3, None)
    };
    let v101 = env
        .version("1.0.1", &m3, Some(&sign(&env.key, rollback)))
        .await;
    let agent = env.agent(&env.cp.grpc_url, false, |_| {});
    let assign =
        |v: &ModelVersionRecord, d: &str| env.assign(vec![AssignmentRecord::for_version(v, d, 60)]);
    assign(&v1, "d1").await;
    env.wait_status("digits", "1.0.0", AssignmentState::Active)
        .await;
    assert_eq!(env.model_dir("digits").load().unwrap().floor, None);
    assign(&v2, "d2").await;
    env.wait_status("digits", "2.0.0", AssignmentState::Active)
        .await;
    assert_eq!(
        env.model_dir("digits").load().unwrap().floor.as_deref(),
        Some("2.0.0")
    );
    // 1.0.0 is still in slot A: refused all the same; 2.0.0 serves on.
    assign(&v1, "d1-again").await;
    let st = env
        .wait_status("digits", "1.0.0", AssignmentState::Failed)
        .await;
    assert!(
        st.reason
            .starts_with("below the floor: version 1.0.0 is older than 2.0.0"),
        "{}",
        st.reason
    );
    assert_eq!(agent.serving.version("digits").as_deref(), Some("2.0.0"));
    drop(agent);

    // After a restart the floor still holds, and the signed rollback lowers it.
    let _agent = env.agent(&env.cp.grpc_url, false, |_| {});
    assign(&v101, "d101").await;
    env.wait_status("digits", "1.0.1", AssignmentState::Active)
        .await;
    assert_eq!(env.model_dir("digits").load().unwrap().floor, None);
    assign(&v1, "d1-third").await;
    env.wait_status("digits", "1.0.0", AssignmentState::Active)
        .await;
    env.cp.stop().await;
}
