//! Test harness: a real control plane on loopback ports, a console API
//! client, and helpers to enroll agents and bridges against it.
#![allow(clippy::unwrap_used)]

pub mod browser;
pub mod crash;
pub mod fake_k8s;
mod isolation;
pub mod manifests;
pub mod mnist;
pub mod retrain;
pub mod rows;
pub mod seed;
pub mod soak;
pub mod test_pki;
mod versions;
pub mod weather;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgeloop_client_core::{enroll, BootstrapToken, Identity, IdentityStore, Role};
use edgeloop_control_plane::{Config, Core, ServeSettings, Server};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use edgeloop_control_plane;
/// What a test does when a service it needs is missing: a skip (a line in
/// `$EDGELOOP_SKIP_LOG` and on stderr), or a failure under
/// `EDGELOOP_REQUIRE_SERVICES=1`, which `scripts/test.sh` sets.
pub use edgeloop_store::skip_or_fail;
pub use isolation::{in_own_process, set_env};

/// A bridge's progress report for `job`, as the local engine sends one.
pub fn progress(
    job: &str,
    attempt: u32,
    state: edgeloop_proto::bridge::v1::JobState,
    step: u64,
) -> edgeloop_proto::bridge::v1::ProgressReport {
    edgeloop_proto::bridge::v1::ProgressReport {
        job_id: job.into(),
        attempt,
        state: state as i32,
        step,
        metrics: [("loss".to_string(), 0.25)].into(),
        message: format!("step {step}"),
        engine_job_id: "local-1".into(),
        exit_code: 0,
        at: None,
        image: None,
        restarts: 0,
        preemptions: 0,
    }
}

/// Which store a test's control plane keeps its records in: sled under
/// the data dir, or a fresh PostgreSQL database of the server named by
/// `EDGELOOP_TEST_POSTGRES_URL` (dropped with this). Tests that should hold
/// on both take one and start with [`TestStore::settings`]; the
/// [`on_each_store!`] macro makes a test per backend from one body.
pub struct TestStore {
    db: Option<edgeloop_store::TestDatabase>,
}

impl TestStore {
    pub fn sled() -> Self {
        Self { db: None }
    }

    /// A fresh database, or `None` ([`skip_or_fail!`]) when
    /// `EDGELOOP_TEST_POSTGRES_URL` is unset.
    pub fn postgres(what: &str) -> Option<Self> {
        edgeloop_store::TestDatabase::from_env(what).map(|db| Self { db: Some(db) })
    }

    /// `settings(data_dir)` on this store.
    pub fn settings(&self, data_dir: &Path) -> ServeSettings {
        ServeSettings {
            store_url: self.url(),
            ..settings(data_dir)
        }
    }

    /// `--store-url`, for a control plane on this store (`None`: sled).
    pub fn url(&self) -> Option<String> {
        self.db.as_ref().map(|db| db.url().expose().to_string())
    }
}

/// A test per store backend from one `async fn NAME(store: TestStore)`:
/// `on_each_store!(#[tokio::test] NAME);` makes `NAME::sled` and
/// `NAME::postgres` (which skips, or fails under
/// `EDGELOOP_REQUIRE_SERVICES=1`, when no server is named).
#[macro_export]
macro_rules! on_each_store {
    ($(#[$attr:meta])* $name:ident) => {
        mod $name {
            $(#[$attr])*
            async fn sled() {
                super::$name($crate::TestStore::sled()).await
            }
            $(#[$attr])*
            async fn postgres() {
                if let Some(store) = $crate::TestStore::postgres(stringify!($name)) {
                    super::$name(store).await
                }
            }
        }
    };
}

/// A running control plane, served by the same `Server::serve` as the binary.
pub struct ControlPlane {
    pub data_dir: PathBuf,
    /// Its `--store-url` (`None`: sled in the data dir), kept by restarts.
    pub store_url: Option<String>,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub grpc_url: String,
    pub http_base: String,
    pub admin_token: String,
    pub core: Arc<Core>,
    pub first_start: bool,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

pub fn settings(data_dir: &Path) -> ServeSettings {
    ServeSettings {
        data_dir: Some(data_dir.to_path_buf()),
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        http_listen: Some("127.0.0.1:0".parse().unwrap()),
        heartbeat_interval_secs: Some(1),
        drain_timeout_secs: Some(10),
        ..Default::default()
    }
}

impl ControlPlane {
    pub async fn start(data_dir: &Path) -> ControlPlane {
        Self::start_with(settings(data_dir)).await
    }

    pub async fn start_with(settings: ServeSettings) -> ControlPlane {
        Self::start_with_clock(settings, edgeloop_control_plane::Clock::system()).await
    }

    /// [`ControlPlane::start_with`] on `clock` (`core.clock.set` moves it).
    pub async fn start_with_clock(
        settings: ServeSettings,
        clock: edgeloop_control_plane::Clock,
    ) -> ControlPlane {
        edgeloop_client_core::install_crypto_provider();
        let config = Config::from_settings(settings).unwrap();
        let tls = config.http_tls != edgeloop_control_plane::config::HttpTls::Off;
        let data_dir = config.data_dir.clone();
        let store_url = config.store_url.as_ref().map(|u| u.expose().to_string());
        let server = Server::start_with_clock(config, clock).await.unwrap();
        let first_start = server.new_admin_token().is_some();
        let admin_token = std::fs::read_to_string(server.admin_token_path())
            .unwrap()
            .trim()
            .to_string();
        if let Some(printed) = server.new_admin_token() {
            assert_eq!(printed, admin_token, "printed token is the one in the file");
        }
        let (grpc_addr, http_addr) = (server.grpc_addr(), server.http_addr());
        let grpc_url = format!("https://localhost:{}", grpc_addr.port());
        // Over TLS, by a name the server certificate holds.
        let http_base = if tls {
            format!("https://localhost:{}", http_addr.port())
        } else {
            format!("http://{http_addr}")
        };
        let core = server.core();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.serve(shutdown.clone()));
        ControlPlane {
            data_dir,
            store_url,
            grpc_addr,
            http_addr,
            grpc_url,
            http_base,
            admin_token,
            core,
            first_start,
            shutdown,
            task,
        }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }

    /// Stops this control plane and starts it again on the same data dir,
    /// store and ports (so agents and bridges reconnect), with `settings`.
    pub async fn restart(self, settings: ServeSettings) -> ControlPlane {
        let (grpc, http) = (self.grpc_addr, self.http_addr);
        let store_url = settings.store_url.clone().or(self.store_url.clone());
        self.stop().await;
        ControlPlane::start_with(ServeSettings {
            grpc_listen: Some(grpc),
            http_listen: Some(http),
            store_url,
            ..settings
        })
        .await
    }

    /// Enrolls a member with `token` (its identity kept in `dir`) and opens
    /// an mTLS channel as it, for tests that speak the gRPC API directly.
    pub async fn connect(&self, role: Role, token: &str, dir: &Path) -> tonic::transport::Channel {
        let identity = self.enroll(role, token, dir).await;
        edgeloop_client_core::tls::mtls_endpoint(&self.grpc_url, &identity)
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// A trainer bridge (cluster `local-gpu`, local engine) in this process,
    /// its data in `dir`; cancel the token to stop it.
    pub async fn start_bridge(
        &self,
        dir: &Path,
    ) -> (CancellationToken, JoinHandle<anyhow::Result<()>>) {
        self.start_bridge_named(dir, "local-gpu").await
    }

    /// A trainer bridge (cluster `name`, with the engines and GPUs the
    /// process's environment gives it) in this process, once the control
    /// plane lists it online; with its cluster record as the API shows it.
    pub async fn start_online_bridge(
        &self,
        dir: &Path,
        name: &str,
    ) -> (CancellationToken, JoinHandle<anyhow::Result<()>>, Value) {
        let (stop, bridge) = self.start_bridge_named(dir, name).await;
        let cluster = eventually(Duration::from_secs(20), "bridge online", || async {
            let (_, c) = self.api().get(&format!("/api/v1/clusters/{name}")).await;
            Some(c).filter(|c| c["status"] == "online")
        })
        .await;
        (stop, bridge, cluster)
    }

    async fn start_bridge_named(
        &self,
        dir: &Path,
        name: &str,
    ) -> (CancellationToken, JoinHandle<anyhow::Result<()>>) {
        let token = self.token("cluster", name).await;
        let config = self.bridge_config(dir, Some(token));
        let stop = CancellationToken::new();
        (
            stop.clone(),
            tokio::spawn(edgeloop_trainer_bridge::run(config, stop)),
        )
    }

    /// Submits a training job; its id.
    pub async fn submit_job(&self, spec: Value) -> String {
        let (status, job) = self.api().post("/api/v1/jobs", json!({"spec": spec})).await;
        assert_eq!(status, 201, "{job}");
        job["id"].as_str().unwrap_or_default().to_string()
    }

    /// Waits up to `timeout` for job `id` to end; its record.
    pub async fn job_ended(&self, id: &str, timeout: Duration) -> Value {
        eventually(timeout, &format!("job {id} ends"), || async {
            let (_, j) = self.api().get(&format!("/api/v1/jobs/{id}")).await;
            Some(j).filter(|j| {
                matches!(
                    j["state"].as_str(),
                    Some("succeeded" | "failed" | "cancelled")
                )
            })
        })
        .await
    }

    pub fn api(&self) -> Api {
        Api::new(&self.http_base, Some(&self.admin_token))
    }

    /// The built `edgeloop` CLI as this control plane's admin
    /// (`EDGELOOP_SERVER`, `EDGELOOP_TOKEN`), with none of the caller's own
    /// CLI settings (a token file, a signing key) let in.
    pub fn edgeloop_command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(edgeloop_bin());
        cmd.env("EDGELOOP_SERVER", &self.http_base)
            .env("EDGELOOP_TOKEN", &self.admin_token)
            .env_remove("EDGELOOP_TOKEN_FILE")
            .env_remove("EDGELOOP_MANIFEST_SIGNING_KEY");
        cmd
    }

    /// `edgeloop <args>` as this control plane's admin
    /// ([`Self::edgeloop_command`]).
    pub async fn edgeloop(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = self.edgeloop_command();
        cmd.args(args);
        output_of(cmd).await
    }

    /// Uploads an artifact through the console API; returns its digest.
    pub async fn upload(&self, data: &[u8]) -> edgeloop_models::Digest {
        let digest = edgeloop_models::Digest::of(data);
        let (status, body) = self
            .api()
            .raw(
                reqwest::Method::PUT,
                &format!("/api/v1/artifacts/{digest}"),
                data.to_vec(),
            )
            .await;
        assert!(status == 201 || status == 200, "{body}");
        digest
    }

    /// Creates a bootstrap token through the console API.
    pub async fn token(&self, kind: &str, name: &str) -> String {
        self.labelled_token(kind, name, json!({})).await
    }

    /// A bootstrap token whose member enrolls with `labels` (a JSON object).
    pub async fn labelled_token(&self, kind: &str, name: &str, labels: Value) -> String {
        let (status, body) = self
            .api()
            .post(
                "/api/v1/tokens",
                json!({"kind": kind, "name": name, "labels": labels}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["token"].as_str().unwrap().to_string()
    }

    /// Settings for an agent or bridge against this control plane, with a
    /// fast reconnect backoff for tests.
    /// A bridge's config for this control plane: [`Self::member_config`],
    /// and the container runtime `EDGELOOP_CONTAINER_RUNTIME` names, as the
    /// binary's `--container-runtime` reads it from the environment.
    pub fn bridge_config(
        &self,
        dir: &Path,
        token: Option<String>,
    ) -> edgeloop_trainer_bridge::BridgeConfig {
        edgeloop_trainer_bridge::BridgeConfig {
            container_runtime: std::env::var("EDGELOOP_CONTAINER_RUNTIME")
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| {
                    edgeloop_trainer_bridge::engines::local::container::RuntimeKind::parse(&v)
                        .unwrap()
                }),
            container_mounts: std::env::var("EDGELOOP_CONTAINER_MOUNTS")
                .ok()
                .map(|v| {
                    v.split(',')
                        .filter(|p| !p.is_empty())
                        .map(PathBuf::from)
                        .collect()
                })
                .unwrap_or_default(),
            ..edgeloop_trainer_bridge::BridgeConfig::new(self.member_config(dir, token))
        }
    }

    pub fn member_config(
        &self,
        dir: &Path,
        token: Option<String>,
    ) -> edgeloop_client_core::MemberConfig {
        edgeloop_client_core::MemberConfig {
            data_dir: dir.to_path_buf(),
            control_plane: self.grpc_url.clone(),
            bootstrap_token: token,
            backoff: edgeloop_client_core::Backoff {
                base: Duration::from_millis(50),
                max: Duration::from_millis(500),
            },
        }
    }

    /// Records that `device` was assigned `model` `version`, as a rollout
    /// does before it writes the assignment: for tests that speak the
    /// agent's gRPC API directly, so their reports are admitted.
    pub fn assigned(&self, device: &str, model: &str, version: &str) {
        edgeloop_control_plane::fleet::admission::remember(
            &self.core.store,
            device,
            model,
            version,
        )
        .unwrap();
    }

    /// Enrolls directly through client-core, as an agent or bridge would.
    pub async fn enroll(&self, role: Role, token: &str, dir: &Path) -> Identity {
        let token: BootstrapToken = token.parse().unwrap();
        enroll(
            role,
            &self.grpc_url,
            &token,
            &IdentityStore::new(dir),
            Default::default(),
        )
        .await
        .unwrap()
    }
}

/// Gives the replica about to start on data dir `to` what replicas share
/// and a data dir holds (copied from `from`): the CA (`pki/`), the
/// pipeline signing key (`keys/`) and the admin token. An operator mounts
/// the same secret in each.
pub fn share_secrets(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["pki", "keys"] {
        let src = from.join(name);
        if src.is_dir() {
            let dest = to.join(name);
            std::fs::create_dir_all(&dest).unwrap();
            for f in std::fs::read_dir(&src).unwrap() {
                let f = f.unwrap();
                if f.file_type().unwrap().is_file() {
                    std::fs::copy(f.path(), dest.join(f.file_name())).unwrap();
                }
            }
        }
    }
    std::fs::copy(from.join("admin.token"), to.join("admin.token")).unwrap();
}

/// A minimal console API client.
#[derive(Clone)]
/// The console API for tests: the shared typed client
/// (`edgeloop_api::Client`, what the CLI and the demo use) for typed
/// calls, and the same requests answered as `(status, JSON)` for the tests
/// that check the protocol itself (4xx bodies, field names).
pub struct Api {
    pub typed: edgeloop_api::Client,
}

/// A port nothing listens on right now (for "unreachable" cases, or a
/// server that must be told its port before it binds).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Api {
    /// One counter or gauge from the control plane's `GET /metrics`.
    pub async fn metric(&self, name: &str) -> Option<u64> {
        let text = self
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))?
            .parse()
            .ok()
    }

    pub fn new(base: &str, token: Option<&str>) -> Api {
        edgeloop_client_core::install_crypto_provider();
        Api {
            typed: edgeloop_api::Client::new(
                base,
                token.map(str::to_string),
                Duration::from_secs(30),
            )
            .unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        self.typed.url(path)
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.typed.request(method, path)
    }

    pub async fn send(&self, r: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let resp = r.send().await.unwrap();
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// One page of a key-range listing: its items (the status must be
    /// 200) and the next page's cursor from `edgeloop-next-cursor`.
    pub async fn get_page(&self, path: &str) -> (Vec<Value>, Option<String>) {
        let resp = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let next = resp
            .headers()
            .get("edgeloop-next-cursor")
            .map(|v| v.to_str().unwrap().to_string());
        (resp.json().await.unwrap(), next)
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.request(reqwest::Method::POST, path).json(&body))
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.request(reqwest::Method::PUT, path).json(&body))
            .await
    }

    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        self.send(
            self.request(method, path)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }
}

/// Polls `check` until it returns Some, or panics after `timeout`: the
/// shared poller (`edgeloop_api::client::poll_until`) every 100 ms.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    edgeloop_api::client::poll_until::<T, edgeloop_api::ApiError, _, _>(
        what,
        Duration::from_millis(100),
        Some(timeout),
        || {
            let check = check();
            async move { Ok(check.await) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Whether the calling test runs here: alone in a process of its own
/// (a bridge's local engine and Podman read their settings from the
/// environment), with `scripts/containers-up.sh`'s settings loaded.
pub fn in_own_process_with_containers() -> bool {
    if !in_own_process() {
        return false;
    }
    load_env_file(
        "EDGELOOP_CONTAINERS_ENV",
        "/tmp/edgeloop-containers/env",
        "scripts/containers-up.sh",
    );
    true
}

/// Loads `KEY=VALUE` lines from an engine's env file (the one
/// `scripts/slurm-up.sh` or `scripts/ray-up.sh` writes) into this process,
/// which must be the test's own ([`in_own_process`], [`set_env`]). Engines
/// read their settings from the environment when a bridge starts.
pub fn load_env_file(var: &str, default: &str, script: &str) {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run {script} (scripts/test.sh does)",
            path.display()
        )
    });
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            set_env(k.trim(), v.trim());
        }
    }
}

/// The Ray and Slurm settings `scripts/ray-up.sh` and `scripts/slurm-up.sh`
/// wrote (`EDGELOOP_RAY_ENV`, `EDGELOOP_SLURM_ENV` override where).
pub fn load_engine_envs() {
    load_env_file(
        "EDGELOOP_RAY_ENV",
        "/tmp/edgeloop-ray/env",
        "scripts/ray-up.sh",
    );
    load_env_file(
        "EDGELOOP_SLURM_ENV",
        "/tmp/edgeloop-slurm/env",
        "scripts/slurm-up.sh",
    );
}

/// Every regular file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Waits until the job's checkpoint directory holds a committed checkpoint
/// at `min_step` or later, and returns its step.
pub async fn checkpoint_at_least(checkpoints: &Path, min_step: u64) -> u64 {
    eventually(
        Duration::from_secs(60),
        "a committed checkpoint",
        || async {
            edgeloop_trainer_bridge::checkpoint::scan(checkpoints)
                .last()
                .filter(|c| c.step >= min_step)
                .map(|c| c.step)
        },
    )
    .await
}

/// SIGKILLs every `sh contract_trainer.sh` process whose environment carries
/// this job's id, the way a node failure would end it. Returns how many.
pub fn kill_trainer_of(job: &str) -> usize {
    let marker = format!("EDGELOOP_JOB_ID={job}");
    kill_processes(|cmdline, environ| {
        cmdline.windows(19).any(|w| w == b"contract_trainer.sh")
            && environ.contains(&marker.as_bytes())
    })
}

/// SIGKILLs every process for which `matches(cmdline, environment
/// variables)` holds (both as `/proc` has them: NUL-separated, the
/// variables as `KEY=value`); returns how many.
pub fn kill_processes(matches: impl Fn(&[u8], &[&[u8]]) -> bool) -> usize {
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        if matches(&cmdline, &vars)
            && nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// The interpreter with PyTorch that `scripts/torch-env.sh` installs
/// (`EDGELOOP_TORCH_PYTHON` overrides; scripts/test.sh sets it).
///
/// # Panics
/// When there is none: the PyTorch tests need it, and skipping them would
/// let the suite pass without the trainer ever running.
pub fn torch_python() -> PathBuf {
    let python = std::env::var_os("EDGELOOP_TORCH_PYTHON")
        .map(PathBuf::from)
        .or_else(|| edgeloop_models::deps::dir().map(|d| d.join("torch-venv/bin/python")))
        .unwrap_or_default();
    assert!(
        python.is_file(),
        "no Python with torch at {:?}: run scripts/torch-env.sh (scripts/test.sh does), or set EDGELOOP_TORCH_PYTHON",
        python
    );
    python
}

/// `cmd` run to its end on the blocking pool (a control plane may be
/// serving on the caller's runtime); what it printed and how it exited.
pub async fn output_of(mut cmd: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// A workspace binary beside the running test (`target/<profile>/`).
///
/// # Panics
/// When it has not been built (`cargo build --workspace --bins`;
/// `scripts/test.sh` does).
fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("the test binary is in target/<profile>/deps")
        .join(name);
    assert!(
        bin.exists(),
        "{}: build the workspace's binaries first (cargo build --workspace --bins; scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// The reference trainer (`edgeloop-train`), for jobs a real trainer runs.
pub fn reference_trainer() -> PathBuf {
    workspace_bin("edgeloop-train")
}

/// `fixtures/contract_trainer.sh`: a shell trainer that keeps the
/// checkpoint contract (a job's command is `["sh", <this>]`; `TOTAL`,
/// `EVERY` and `STEP_SECONDS` in its env shape the run).
pub fn contract_trainer() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/contract_trainer.sh")
        .display()
        .to_string()
}

/// The `edgeloop` CLI, for the tests that run it as a user does.
pub fn edgeloop_bin() -> PathBuf {
    workspace_bin("edgeloop")
}

/// A prefix of this run's own under `$EDGELOOP_TEST_S3_URL` (the S3
/// server `scripts/s3-up.sh` starts), or None ([`skip_or_fail!`]).
pub fn s3_test_url() -> Option<String> {
    let Ok(url) = std::env::var("EDGELOOP_TEST_S3_URL") else {
        skip_or_fail!(
            "S3: EDGELOOP_TEST_S3_URL is unset (run scripts/s3-up.sh and export its env \
             file, as scripts/test.sh does)"
        );
        return None;
    };
    let loc: edgeloop_registry::s3::S3Location = url.parse().unwrap();
    let prefix = [
        loc.prefix.as_str(),
        &format!("i{:08x}", rand::random::<u32>()),
    ]
    .iter()
    .filter(|p| !p.is_empty())
    .copied()
    .collect::<Vec<_>>()
    .join("/");
    Some(format!("s3://{}/{prefix}", loc.bucket))
}
