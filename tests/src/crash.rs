//! The crash harness: the real binaries (`control-plane`, `edge-agent`) as
//! processes on loopback, SIGKILLed at seeded random points and started
//! again on the same data dir and ports, with the ledgers the invariants
//! are checked against.
//!
//! A run prints its seed; `EDGELOOP_CRASH_SEED=<seed>` replays the same
//! kill points (the timing of what they interrupt still varies).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::process::{Child, Command};

use crate::{free_port, workspace_bin, Api};

/// The run's RNG, from `EDGELOOP_CRASH_SEED` or fresh; the seed is printed
/// so a failure can be replayed.
pub fn seeded(test: &str) -> (u64, StdRng) {
    // Every test starts here, before any client is built.
    edgeloop_client_core::install_crypto_provider();
    let seed = std::env::var("EDGELOOP_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: crash seed {seed} (EDGELOOP_CRASH_SEED={seed} replays its kill points)");
    (seed, StdRng::seed_from_u64(seed))
}

/// One binary run again and again with the same arguments; its output is
/// appended to `log` across restarts. Dropped: killed.
pub struct Proc {
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// SIGKILLs so far.
    pub kills: u32,
}

impl Proc {
    pub fn new(bin: &str, args: Vec<String>, env: Vec<(String, String)>, log: PathBuf) -> Proc {
        Proc {
            bin: workspace_bin(bin),
            args,
            env,
            log,
            child: None,
            kills: 0,
        }
    }

    pub fn spawn(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args)
            .env("NO_COLOR", "1")
            .env_remove("EDGELOOP_CONFIG")
            .env_remove("EDGELOOP_DATA_DIR")
            .env_remove(edgeloop_registry::unreliable::ENV)
            .env_remove(edgeloop_edge_agent::crash_point::ENV)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        self.child = Some(cmd.spawn().unwrap());
    }

    /// SIGKILL, as a power cut or the OOM killer would: no drain, no flush.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.start_kill().unwrap();
            child.wait().await.unwrap();
            self.kills += 1;
        }
    }

    /// Sets (`Some`) or drops (`None`) one variable of the environment of
    /// the next start.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Waits up to `limit` for the process to exit by itself; its status,
    /// or None if it still runs.
    pub async fn exited(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let status = tokio::time::timeout(limit, child.wait()).await.ok()?;
        self.child = None;
        Some(status.unwrap())
    }

    /// Panics (with the log's tail) if the process has exited.
    pub fn assert_running(&mut self, what: &str) {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{what}: {} exited ({status}); log tail:\n{}",
                    self.bin.display(),
                    self.log_tail()
                );
            }
        }
    }

    /// How often `needle` occurs in the log so far.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches(needle)
            .count()
    }

    /// The log's lines that hold `needle`, oldest first.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains(needle))
            .map(String::from)
            .collect()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// The `control-plane` binary on fixed loopback ports (so members reconnect
/// after a restart).
pub struct CpProcess {
    pub proc: Proc,
    pub data_dir: PathBuf,
    pub http_base: String,
    pub grpc_url: String,
    pub admin_token: String,
}

impl CpProcess {
    /// Starts it on `data_dir`; `faults` turns the unreliable artifact
    /// store on (`EDGELOOP_FAULT_ARTIFACT_STORE`).
    pub async fn start(data_dir: &Path, faults: Option<&str>) -> CpProcess {
        Self::start_with_env(data_dir, faults, Vec::new()).await
    }

    /// [`CpProcess::start`] with more environment (a replica's
    /// `EDGELOOP_STORE_URL` and `EDGELOOP_ARTIFACT_URL`, say).
    pub async fn start_with_env(
        data_dir: &Path,
        faults: Option<&str>,
        extra_env: Vec<(String, String)>,
    ) -> CpProcess {
        let (grpc, http) = (free_port(), free_port());
        let args = [
            "serve",
            "--data-dir",
            &data_dir.display().to_string(),
            "--grpc-listen",
            &format!("127.0.0.1:{grpc}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
            "--heartbeat-interval-secs",
            "1",
            "--rollout-tick-ms",
            "200",
            "--drain-timeout-secs",
            "2",
        ]
        .map(String::from)
        .to_vec();
        let mut env: Vec<(String, String)> = faults
            .map(|f| {
                vec![(
                    edgeloop_registry::unreliable::ENV.to_string(),
                    f.to_string(),
                )]
            })
            .unwrap_or_default();
        env.extend(extra_env);
        std::fs::create_dir_all(data_dir).unwrap();
        let log = data_dir.with_extension("log");
        let mut cp = CpProcess {
            proc: Proc::new("control-plane", args, env, log),
            data_dir: data_dir.to_path_buf(),
            http_base: format!("http://127.0.0.1:{http}"),
            grpc_url: format!("https://localhost:{grpc}"),
            admin_token: String::new(),
        };
        cp.spawn().await;
        cp
    }

    async fn spawn(&mut self) {
        self.proc.spawn();
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            self.proc.assert_running("control plane start");
            let up = http
                .get(format!("{}/healthz", self.http_base))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if matches!(up, Ok(r) if r.status().is_success()) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "control plane not serving after 60 s; log tail:\n{}",
                self.proc.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.admin_token = std::fs::read_to_string(self.data_dir.join("admin.token"))
            .unwrap()
            .trim()
            .to_string();
    }

    pub async fn kill(&mut self) {
        self.proc.kill().await;
    }

    /// Starts it again after a kill, on the same data dir and ports.
    pub async fn restart(&mut self) {
        self.spawn().await;
    }

    pub fn api(&self) -> Api {
        Api::new(&self.http_base, Some(&self.admin_token))
    }

    /// Gives the replica about to start on `to` what replicas share
    /// ([`crate::share_secrets`]).
    pub fn share_secrets_with(&self, to: &Path) {
        crate::share_secrets(&self.data_dir, to);
    }

    /// A bootstrap token, retried through faults and restarts.
    pub async fn token(&self, kind: &str, name: &str) -> String {
        let body = serde_json::json!({"kind": kind, "name": name});
        let created = retry(&format!("token {name}"), || async {
            let r = self
                .api()
                .request(reqwest::Method::POST, "/api/v1/tokens")
                .json(&body)
                .send()
                .await
                .ok()?;
            if !r.status().is_success() {
                return None;
            }
            r.json::<serde_json::Value>().await.ok()
        })
        .await;
        created["token"].as_str().unwrap().to_string()
    }

    /// Uploads `data` (retried: the unreliable store may refuse or tear it).
    pub async fn upload(&self, data: &[u8]) -> edgeloop_models::Digest {
        let digest = edgeloop_models::Digest::of(data);
        retry(&format!("upload {digest}"), || async {
            let r = self
                .api()
                .request(reqwest::Method::PUT, &format!("/api/v1/artifacts/{digest}"))
                .body(data.to_vec())
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        digest
    }
}

/// Calls `f` until it gives Some (a minute at most): for setup calls that
/// must get through faults injected on purpose.
pub async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: no success in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `edge-agent` binary, enrolled with `token` against `cp`, trusting
/// `key`; its inference API on a fresh loopback port each start.
pub struct AgentProcess {
    pub proc: Proc,
    pub name: String,
    pub dir: PathBuf,
}

impl AgentProcess {
    pub async fn start(
        cp: &CpProcess,
        name: &str,
        dir: &Path,
        token: &str,
        key: &edgeloop_models::manifest::PublicKey,
    ) -> AgentProcess {
        Self::start_at(&cp.grpc_url, name, dir, token, key).await
    }

    /// [`AgentProcess::start`] against `control_plane`: one gRPC URL, or
    /// several replicas' separated by commas.
    pub async fn start_at(
        control_plane: &str,
        name: &str,
        dir: &Path,
        token: &str,
        key: &edgeloop_models::manifest::PublicKey,
    ) -> AgentProcess {
        std::fs::create_dir_all(dir).unwrap();
        let args = [
            "run",
            "--data-dir",
            &dir.display().to_string(),
            "--control-plane",
            control_plane,
            "--bootstrap-token",
            token,
            "--inference-listen",
            "127.0.0.1:0",
            "--grpc-inference-listen",
            "127.0.0.1:0",
            "--trusted-keys",
            &key.to_hex(),
            "--telemetry-interval-secs",
            "1",
        ]
        .map(String::from)
        .to_vec();
        let mut agent = AgentProcess {
            proc: Proc::new("edge-agent", args, vec![], dir.with_extension("log")),
            name: name.to_string(),
            dir: dir.to_path_buf(),
        };
        agent.spawn().await;
        agent
    }

    async fn spawn(&mut self) {
        // A fresh port each start: the file names the new one once bound.
        let _ = std::fs::remove_file(self.dir.join(edgeloop_edge_agent::INFERENCE_ADDR_FILE));
        self.proc.spawn();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.url().is_none() {
            self.proc
                .assert_running(&format!("agent {} start", self.name));
            assert!(
                tokio::time::Instant::now() < deadline,
                "agent {} has no inference address after 60 s; log tail:\n{}",
                self.name,
                self.proc.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its inference API's base URL, once it has bound it.
    pub fn url(&self) -> Option<String> {
        let addr = std::fs::read_to_string(self.dir.join(edgeloop_edge_agent::INFERENCE_ADDR_FILE))
            .ok()?;
        let addr = addr.trim();
        (!addr.is_empty()).then(|| format!("http://{addr}"))
    }

    pub async fn kill(&mut self) {
        self.proc.kill().await;
    }

    pub async fn restart(&mut self) {
        self.spawn().await;
    }

    /// Whether this agent holds a partial download of `digest` for `model`.
    pub fn partial(&self, model: &str, digest: edgeloop_models::Digest) -> bool {
        self.dir
            .join("models")
            .join(model)
            .join("downloads")
            .join(format!("{digest}.partial"))
            .exists()
    }
}

/// What a run did, printed as one line for `docs/reliability.md`.
#[derive(Debug, Default)]
pub struct Tally {
    pub kills: u32,
    pub acked_writes_checked: u64,
    pub reports_checked: u64,
    pub answers_checked: u64,
    pub deployments_ended: u64,
    pub lost: u64,
    pub notes: Vec<String>,
}

impl Tally {
    pub fn print(&self, test: &str, seed: u64) {
        println!(
            "crash summary: {test} seed={seed} kills_survived={} acked_writes_checked={} \
             reports_checked={} answers_checked={} deployments_ended={} lost={} {}",
            self.kills,
            self.acked_writes_checked,
            self.reports_checked,
            self.answers_checked,
            self.deployments_ended,
            self.lost,
            self.notes.join(" ")
        );
    }
}
