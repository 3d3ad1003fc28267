//! The Ray engine: one job attempt is one Ray job, submitted through the Jobs
//! REST API of a Ray head's dashboard (`POST /api/jobs/`, `GET
//! /api/jobs/{id}`, `GET /api/jobs/{id}/logs`, `POST /api/jobs/{id}/stop`).
//!
//! What is sent:
//! - `entrypoint`: `cd <workdir> && exec <command>` with every word quoted
//!   for `/bin/sh` (Ray runs the entrypoint with `shell=True`). Ray 2.x's REST
//!   API accepts only remote URIs as `runtime_env.working_dir` (a local path
//!   is rejected when the job starts: "not a valid URI"), and uploading would
//!   copy the directory anyway, so the working directory is entered with
//!   `cd`: the Ray node must see the same filesystem as the bridge.
//! - `submission_id`: derived from the job id and the attempt
//!   ([`submission_id`]), so a retried submit finds the job already there
//!   instead of starting it twice. Ray answers a duplicate id with a 500, so
//!   submit asks `GET` first and treats an existing job with the same
//!   metadata as already submitted.
//! - `entrypoint_num_gpus` / `entrypoint_num_cpus` / `entrypoint_memory`
//!   from the launch. Ray sets `CUDA_VISIBLE_DEVICES` for the GPUs it grants.
//! - `runtime_env.env_vars`: the launch's environment (all strings).
//! - `metadata`: `job_id`, `attempt`, `job_name`.
//!
//! Scope: single node only. The entrypoint is one driver process on one Ray
//! node; a multi-node job on Ray would be written against Ray Train (its
//! `TorchTrainer` places one worker per GPU across nodes and sets up the
//! process group), which is a different programming model from "run this
//! command on N nodes", so `nodes > 1` is refused. `Launcher::Torchrun` on
//! one node runs the command under `torchrun --standalone --no-python`
//! (torchrun must be on the Ray node's PATH; this path is covered by unit
//! tests only, there is no torch on the test machine); `Launcher::Horovod` is
//! refused. `Launch::log_path` is not written: Ray keeps the driver's output,
//! and [`Engine::logs`] returns it.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{
    ConfiguredFacts, Engine, EngineError, EngineJobId, EngineState, Launch, Launcher, NodePool,
};

/// The environment variable holding the dashboard URL (what
/// `scripts/ray-up.sh` writes into its env file).
pub const DASHBOARD_URL_ENV: &str = "EDGELOOP_RAY_DASHBOARD_URL";

/// A Ray cluster reached through its dashboard's Jobs REST API.
#[derive(Debug, Clone)]
pub struct RayEngine {
    base_url: String,
    client: reqwest::Client,
    configured: ConfiguredFacts,
}

/// The NVIDIA driver of the Ray nodes, and the newest CUDA it supports:
/// Ray does not report them.
pub const DRIVER_VERSION_ENV: &str = "EDGELOOP_RAY_DRIVER_VERSION";
pub const CUDA_VERSION_ENV: &str = "EDGELOOP_RAY_CUDA_VERSION";
/// Ray's state API: every node with its total resources.
const NODES_PATH: &str = "/api/v0/nodes?limit=10000&detail=true";

impl RayEngine {
    /// An engine for the dashboard at `url` (e.g. `http://127.0.0.1:8265`).
    pub fn new(url: impl Into<String>) -> Result<Self, EngineError> {
        let base_url = url.into().trim_end_matches('/').to_string();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(EngineError::Unavailable(format!(
                "the Ray dashboard URL must start with http:// or https://, got {base_url:?}"
            )));
        }
        edgeloop_client_core::install_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| EngineError::Unavailable(format!("HTTP client: {e}")))?;
        Ok(Self {
            base_url,
            client,
            configured: ConfiguredFacts::default(),
        })
    }

    /// An engine for the URL in `EDGELOOP_RAY_DASHBOARD_URL`.
    pub fn from_env() -> Result<Self, EngineError> {
        let optional = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let configured = ConfiguredFacts {
            driver_version: optional(DRIVER_VERSION_ENV),
            cuda_version: optional(CUDA_VERSION_ENV),
            // Images are not run on Ray yet (see the engine's docs).
            containers: vec![],
        };
        match std::env::var(DASHBOARD_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Ok(Self {
                configured,
                ..Self::new(url.trim())?
            }),
            _ => Err(EngineError::Unavailable(format!(
                "{DASHBOARD_URL_ENV} is not set (scripts/ray-up.sh writes it into its env file)"
            ))),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn job_url(&self, id: &str, suffix: &str) -> String {
        format!(
            "{}/api/jobs/{}{suffix}",
            self.base_url,
            encode_path_segment(id)
        )
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<(StatusCode, String), EngineError> {
        let resp = req
            .send()
            .await
            .map_err(|e| transport(&self.base_url, what, &e))?;
        let status = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| transport(&self.base_url, what, &e))?;
        Ok((status, body))
    }

    /// The job's record, or `None` when Ray does not know the id.
    async fn job_info(&self, id: &str) -> Result<Option<JobInfo>, EngineError> {
        let (status, body) = self
            .send(self.client.get(self.job_url(id, "")), "GET job")
            .await?;
        match status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => serde_json::from_str(&body).map(Some).map_err(|e| {
                EngineError::Protocol(format!(
                    "job {id}: undecodable answer ({e}): {}",
                    clip(&body)
                ))
            }),
            s => Err(unexpected("GET job", s, &body)),
        }
    }

    /// `Some(id)` when the job of this launch is already on Ray.
    async fn already_submitted(
        &self,
        launch: &Launch,
        sid: &str,
    ) -> Result<Option<EngineJobId>, EngineError> {
        match self.job_info(sid).await? {
            None => Ok(None),
            Some(info) if info.is_from(launch) => {
                tracing::info!(submission_id = sid, status = %info.status, "ray: job already submitted");
                Ok(Some(EngineJobId(sid.to_string())))
            }
            Some(_) => Err(EngineError::Refused(format!(
                "ray submission id {sid} is taken by a job with other metadata than job {} attempt {}",
                launch.job_id, launch.attempt
            ))),
        }
    }
}

#[async_trait]
impl Engine for RayEngine {
    fn name(&self) -> &'static str {
        "ray"
    }

    async fn submit(&self, launch: &Launch) -> Result<EngineJobId, EngineError> {
        let body = submit_body(launch)?;
        let sid = submission_id(&launch.job_id, launch.attempt);
        if let Some(id) = self.already_submitted(launch, &sid).await? {
            return Ok(id);
        }
        let url = format!("{}/api/jobs/", self.base_url);
        let (status, text) = self
            .send(self.client.post(url).json(&body), "submit")
            .await?;
        if status.is_success() {
            let answer: SubmitAnswer = serde_json::from_str(&text).map_err(|e| {
                EngineError::Protocol(format!("submit: undecodable answer ({e}): {}", clip(&text)))
            })?;
            if answer.submission_id != sid {
                return Err(EngineError::Protocol(format!(
                    "submit: asked for submission id {sid}, Ray answered {}",
                    answer.submission_id
                )));
            }
            tracing::info!(submission_id = %sid, job_id = %launch.job_id, attempt = launch.attempt, "ray: job submitted");
            return Ok(EngineJobId(sid));
        }
        // Ray answers a duplicate submission id with a 500 (another submit of
        // the same attempt won the race): look again before calling it an error.
        if status == StatusCode::INTERNAL_SERVER_ERROR && text.contains("already exists") {
            if let Some(id) = self.already_submitted(launch, &sid).await? {
                return Ok(id);
            }
        }
        if status == StatusCode::BAD_REQUEST {
            return Err(EngineError::Refused(format!(
                "Ray refused the job: {}",
                summarize_error(&text)
            )));
        }
        Err(unexpected("submit", status, &text))
    }

    async fn pools(&self) -> Result<Vec<NodePool>, EngineError> {
        let url = format!("{}{NODES_PATH}", self.base_url);
        let (status, body) = self.send(self.client.get(url), "GET nodes").await?;
        if !status.is_success() {
            return Err(unexpected("GET nodes", status, &body));
        }
        let resp: NodesAnswer = serde_json::from_str(&body).map_err(|e| {
            EngineError::Protocol(format!(
                "GET nodes: undecodable answer ({e}): {}",
                clip(&body)
            ))
        })?;
        Ok(ray_pools(&resp.data.result.result, &self.configured))
    }

    async fn status(&self, id: &EngineJobId) -> Result<EngineState, EngineError> {
        match self.job_info(&id.0).await? {
            None => Err(EngineError::NotFound(id.0.clone())),
            Some(info) => map_status(&info),
        }
    }

    async fn cancel(&self, id: &EngineJobId) -> Result<(), EngineError> {
        let (status, body) = self
            .send(self.client.post(self.job_url(&id.0, "/stop")), "stop")
            .await?;
        match status {
            // `{"stopped": false}` means the job had already ended: nothing to do.
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(EngineError::NotFound(id.0.clone())),
            s => Err(unexpected("stop", s, &body)),
        }
    }

    async fn logs(&self, id: &EngineJobId) -> Result<String, EngineError> {
        let (status, body) = self
            .send(self.client.get(self.job_url(&id.0, "/logs")), "logs")
            .await?;
        match status {
            s if s.is_success() => serde_json::from_str::<LogsAnswer>(&body)
                .map(|l| l.logs)
                .map_err(|e| {
                    EngineError::Protocol(format!(
                        "logs: undecodable answer ({e}): {}",
                        clip(&body)
                    ))
                }),
            StatusCode::NOT_FOUND => Err(EngineError::NotFound(id.0.clone())),
            s => Err(unexpected("logs", s, &body)),
        }
    }
}

/// The part of Ray's `JobDetails` the engine reads.
#[derive(Debug, Clone, Deserialize)]
pub struct JobInfo {
    pub status: String,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub driver_exit_code: Option<i32>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl JobInfo {
    fn is_from(&self, launch: &Launch) -> bool {
        let Some(meta) = &self.metadata else {
            return false;
        };
        meta.get("job_id") == Some(&launch.job_id)
            && meta.get("attempt") == Some(&launch.attempt.to_string())
    }
}

#[derive(Deserialize)]
struct SubmitAnswer {
    submission_id: String,
}

#[derive(Deserialize)]
struct LogsAnswer {
    logs: String,
}

/// Ray's job status, as the engine-neutral state.
pub fn map_status(info: &JobInfo) -> Result<EngineState, EngineError> {
    Ok(match info.status.as_str() {
        "PENDING" => EngineState::Pending,
        "RUNNING" => EngineState::Running,
        "SUCCEEDED" => EngineState::Succeeded,
        "STOPPED" => EngineState::Cancelled,
        "FAILED" => EngineState::Failed {
            exit_code: info.driver_exit_code,
            reason: match (&info.message, info.driver_exit_code) {
                (Some(m), _) if !m.trim().is_empty() => failure_reason(m),
                (_, Some(code)) => format!("the job exited with code {code}"),
                _ => "the job failed".to_string(),
            },
        },
        other => {
            return Err(EngineError::Protocol(format!(
                "unknown Ray job status {other:?}"
            )))
        }
    })
}

/// The Ray submission id of one attempt of a job: deterministic, so that a
/// retried submit of the same attempt finds the first one. Characters other
/// than `[A-Za-z0-9_-]` become `_`, and then (or when the id is long or
/// empty) a digest of the original id is added, so distinct job ids keep
/// distinct submission ids.
pub fn submission_id(job_id: &str, attempt: u32) -> String {
    const MAX: usize = 64;
    let safe: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX)
        .collect();
    if safe == job_id && !safe.is_empty() {
        format!("edgeloop-{safe}-a{attempt}")
    } else {
        let digest = hex::encode(Sha256::digest(job_id.as_bytes()));
        format!("edgeloop-{safe}-{}-a{attempt}", &digest[..12])
    }
}

/// Quotes one word for a POSIX shell: words made only of characters the
/// shell never interprets stay as they are, everything else is put in single
/// quotes (inside which nothing is special), with each `'` written as `'\''`.
/// A NUL byte cannot be part of a process argument and is refused.
pub fn shell_quote(word: &str) -> Result<String, EngineError> {
    if word.contains('\0') {
        return Err(EngineError::Refused(format!(
            "a command word contains a NUL byte: {word:?}"
        )));
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return Ok(word.to_string());
    }
    Ok(format!("'{}'", word.replace('\'', r"'\''")))
}

/// Quotes every word and joins them with spaces.
pub fn shell_join<S: AsRef<str>>(words: &[S]) -> Result<String, EngineError> {
    let quoted = words
        .iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(quoted.join(" "))
}

/// Refuses what a single Ray entrypoint cannot run.
pub fn check_supported(launch: &Launch) -> Result<(), EngineError> {
    if launch.nodes > 1 {
        return Err(EngineError::Refused(format!(
            "the Ray engine runs a job as one entrypoint on one node; {} nodes were asked for \
             (multi-node training on Ray goes through Ray Train, which this engine does not do)",
            launch.nodes
        )));
    }
    if launch.command.is_empty() {
        return Err(EngineError::Refused("the job has no command".to_string()));
    }
    if let Launcher::Horovod { .. } = launch.launcher {
        return Err(EngineError::Refused(
            "the Ray engine does not start Horovod jobs (on Ray that is Ray Train's HorovodTrainer)".to_string(),
        ));
    }
    if let Launcher::Torchrun { nproc_per_node: 0 } = launch.launcher {
        return Err(EngineError::Refused(
            "torchrun with nproc_per_node = 0".to_string(),
        ));
    }
    for (k, v) in &launch.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(EngineError::Refused(format!(
                "invalid environment variable {k:?}"
            )));
        }
    }
    Ok(())
}

/// The shell command line Ray runs: enter the working directory, then `exec`
/// the command (so its exit code is the job's and Ray's stop signal reaches it).
pub fn entrypoint(launch: &Launch) -> Result<String, EngineError> {
    check_supported(launch)?;
    let mut words: Vec<String> = Vec::new();
    if let Launcher::Torchrun { nproc_per_node } = launch.launcher {
        words.extend(
            [
                "torchrun",
                "--standalone",
                "--nnodes=1",
                &format!("--nproc-per-node={nproc_per_node}"),
                "--no-python",
            ]
            .map(String::from),
        );
    }
    words.extend(launch.command.iter().cloned());
    let command = format!("exec {}", shell_join(&words)?);
    if launch.workdir.as_os_str().is_empty() {
        return Ok(command);
    }
    let dir = launch.workdir.to_str().ok_or_else(|| {
        EngineError::Refused(format!(
            "the working directory {:?} is not UTF-8",
            launch.workdir
        ))
    })?;
    Ok(format!("cd {} && {command}", shell_quote(dir)?))
}

#[derive(Debug, Deserialize)]
struct NodesAnswer {
    data: NodesData,
}

#[derive(Debug, Deserialize)]
struct NodesData {
    result: NodesPage,
}

#[derive(Debug, Deserialize)]
struct NodesPage {
    #[serde(default)]
    result: Vec<RayNode>,
}

/// One node of Ray's state API (`GET /api/v0/nodes`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RayNode {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub resources_total: BTreeMap<String, f64>,
}

/// The nodes Ray calls ALIVE, one pool per (accelerator type, GPU count).
/// `--num-gpus` on `ray start` declares GPUs Ray then hands out with
/// `CUDA_VISIBLE_DEVICES`; `accelerator_type:<T>` is Ray's GPU type.
pub fn ray_pools(nodes: &[RayNode], configured: &ConfiguredFacts) -> Vec<NodePool> {
    let mut groups: BTreeMap<(Option<String>, u32), (u32, u32, u64)> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.state == "ALIVE") {
        let count = |key: &str| n.resources_total.get(key).copied().unwrap_or(0.0);
        // Fractional GPUs are for sharing one device; a job takes whole ones.
        let gpus = count("GPU").max(0.0).min(f64::from(u32::MAX)).floor() as u32;
        let ty = n
            .resources_total
            .keys()
            .find_map(|k| k.strip_prefix("accelerator_type:"))
            .filter(|t| !t.is_empty() && t.len() <= 64)
            .map(str::to_string);
        let cpus = count("CPU").max(0.0).min(f64::from(u32::MAX)) as u32;
        let memory_mb = (count("memory").max(0.0) / (1024.0 * 1024.0)) as u64;
        let g = groups.entry((ty, gpus)).or_insert((0, u32::MAX, u64::MAX));
        g.0 += 1;
        g.1 = g.1.min(cpus);
        g.2 = g.2.min(memory_mb);
    }
    groups
        .into_iter()
        .map(|((ty, gpus), (nodes, cpus, memory_mb))| {
            let name = match (&ty, gpus) {
                (Some(t), _) => t.clone(),
                (None, 0) => "cpu".to_string(),
                (None, n) => format!("gpu:{n}"),
            };
            let placement = ty
                .iter()
                .map(|t| ("accelerator_type".to_string(), t.clone()))
                .collect();
            let config = configured.driver_version.is_some() || configured.cuda_version.is_some();
            NodePool {
                engine: "ray".into(),
                name,
                nodes: Some(nodes),
                gpus_per_node: gpus,
                gpu_type: ty,
                gpu_memory_bytes: None,
                driver_version: configured.driver_version.clone(),
                cuda_version: configured.cuda_version.clone(),
                cpus_per_node: cpus,
                memory_mb_per_node: memory_mb,
                source: format!(
                    "ray GET {}{}",
                    NODES_PATH.split('?').next().unwrap_or(NODES_PATH),
                    if config {
                        "; driver from the bridge's config"
                    } else {
                        ""
                    }
                ),
                placement,
                containers: configured.containers.clone(),
            }
        })
        .collect()
}

/// The JSON body of `POST /api/jobs/` for one attempt.
pub fn submit_body(launch: &Launch) -> Result<Value, EngineError> {
    let entrypoint = entrypoint(launch)?;
    let mut env = launch.env.clone();
    if let Launcher::Torchrun { nproc_per_node } = launch.launcher {
        // torchrun sets the rest (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK).
        env.insert("NNODES".to_string(), "1".to_string());
        env.insert("NPROC_PER_NODE".to_string(), nproc_per_node.to_string());
    }
    let mut body = json!({
        "entrypoint": entrypoint,
        "submission_id": submission_id(&launch.job_id, launch.attempt),
        "entrypoint_num_gpus": launch.gpus_per_node,
        "entrypoint_num_cpus": launch.cpus_per_node,
        "runtime_env": { "env_vars": env },
        "metadata": {
            "job_id": launch.job_id,
            "attempt": launch.attempt.to_string(),
            "job_name": launch.name,
        },
    });
    // The pool's GPU type: a sliver of Ray's accelerator resource pins the
    // entrypoint to a node of that type without using it up.
    if let Some(ty) = launch
        .pool
        .as_ref()
        .and_then(|p| p.placement.get("accelerator_type"))
        .filter(|_| launch.gpus_per_node > 0)
    {
        body["entrypoint_resources"] = json!({ format!("accelerator_type:{ty}"): 0.001 });
    }
    if launch.memory_mb > 0 {
        let bytes = launch.memory_mb.checked_mul(1024 * 1024).ok_or_else(|| {
            EngineError::Refused(format!("memory_mb {} is too large", launch.memory_mb))
        })?;
        body["entrypoint_memory"] = json!(bytes);
    }
    Ok(body)
}

/// The first line of a failed job's message, without what Ray appends to it
/// (the tail of the job's log, or a Python traceback).
fn failure_reason(message: &str) -> String {
    let first = message.trim().lines().next().unwrap_or("");
    let first = [", last available logs", ". Full traceback:"]
        .iter()
        .fold(first, |line, cut| line.split(cut).next().unwrap_or(line));
    clip(first.trim())
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn transport(base: &str, what: &str, e: &reqwest::Error) -> EngineError {
    EngineError::Unavailable(format!("Ray dashboard {base} ({what}): {e}"))
}

fn unexpected(what: &str, status: StatusCode, body: &str) -> EngineError {
    if matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    ) {
        return EngineError::Unavailable(format!(
            "{what}: HTTP {status}: {}",
            summarize_error(body)
        ));
    }
    EngineError::Protocol(format!("{what}: HTTP {status}: {}", summarize_error(body)))
}

/// Ray's error answers are Python tracebacks: keep the line that names the
/// error (the last `...Error: ...` line), else the last line.
fn summarize_error(body: &str) -> String {
    let lines: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != ".")
        .collect();
    let line = lines
        .iter()
        .rev()
        .find(|l| l.contains("Error: ") || l.contains("Exception: "))
        .or(lines.last())
        .copied()
        .unwrap_or("");
    clip(line)
}

fn clip(s: &str) -> String {
    const MAX: usize = 400;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;
    use std::path::PathBuf;
    use std::process::Command;

    fn launch() -> Launch {
        Launch {
            job_id: "job-1".to_string(),
            attempt: 2,
            name: "mnist".to_string(),
            image: None,
            pinned_image: None,
            command: vec![
                "python3".to_string(),
                "train.py".to_string(),
                "--lr=0.1".to_string(),
            ],
            env: BTreeMap::from([("EDGELOOP_JOB_ID".to_string(), "job-1".to_string())]),
            workdir: PathBuf::from("/work/run 1"),
            nodes: 1,
            min_nodes: None,
            gpus_per_node: 1,
            cpus_per_node: 2,
            memory_mb: 512,
            launcher: Launcher::None,
            log_path: PathBuf::from("/tmp/log"),
            pool: None,
        }
    }

    /// What `/bin/sh` makes of a command line: its argv, NUL-separated.
    fn sh_words(line: &str) -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {line}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sh failed on {line:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut words: Vec<String> = text.split('\0').map(String::from).collect();
        assert_eq!(words.pop().as_deref(), Some(""));
        words
    }

    #[test]
    fn quoting_leaves_plain_words_and_quotes_the_rest() {
        assert_eq!(shell_quote("train.py").unwrap(), "train.py");
        assert_eq!(shell_quote("--lr=0.1").unwrap(), "--lr=0.1");
        assert_eq!(shell_quote("").unwrap(), "''");
        assert_eq!(shell_quote("a b").unwrap(), "'a b'");
        assert_eq!(shell_quote("it's").unwrap(), r"'it'\''s'");
        assert!(matches!(shell_quote("a\0b"), Err(EngineError::Refused(_))));
    }

    #[test]
    fn adversarial_words_survive_the_shell() {
        let words = [
            "",
            " ",
            "'",
            "''",
            "\"",
            "\\",
            "\\'",
            "$HOME",
            "${PATH}",
            "$(id)",
            "`id`",
            "a;b",
            "a&&b",
            "a|b",
            "a>b",
            "<x",
            "*",
            "?",
            "[a]",
            "~",
            "~root",
            "#comment",
            "!x",
            "a\nb",
            "\t",
            "-n",
            "-e",
            "--",
            "x=1",
            "é ü 日本",
            "'; rm -rf / #",
            "\"$(touch /tmp/pwned)\"",
            "%s%n",
        ];
        assert_eq!(sh_words(&shell_join(&words).unwrap()), words);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_words_survive_the_shell(words in prop::collection::vec("[^\u{0}]{0,12}", 1..5)) {
            prop_assert_eq!(sh_words(&shell_join(&words).unwrap()), words);
        }
    }

    #[test]
    fn entrypoint_enters_the_workdir_and_execs() {
        assert_eq!(
            entrypoint(&launch()).unwrap(),
            "cd '/work/run 1' && exec python3 train.py --lr=0.1"
        );
        let no_dir = Launch {
            workdir: PathBuf::new(),
            ..launch()
        };
        assert_eq!(
            entrypoint(&no_dir).unwrap(),
            "exec python3 train.py --lr=0.1"
        );
    }

    #[test]
    fn torchrun_wraps_the_command_and_sets_the_node_env() {
        let l = Launch {
            launcher: Launcher::Torchrun { nproc_per_node: 2 },
            ..launch()
        };
        let body = submit_body(&l).unwrap();
        assert_eq!(
            body["entrypoint"],
            "cd '/work/run 1' && exec torchrun --standalone --nnodes=1 --nproc-per-node=2 --no-python \
             python3 train.py --lr=0.1"
        );
        assert_eq!(body["runtime_env"]["env_vars"]["NNODES"], "1");
        assert_eq!(body["runtime_env"]["env_vars"]["NPROC_PER_NODE"], "2");
    }

    #[test]
    fn body_carries_resources_env_and_metadata() {
        let body = submit_body(&launch()).unwrap();
        assert_eq!(
            body,
            json!({
                "entrypoint": "cd '/work/run 1' && exec python3 train.py --lr=0.1",
                "submission_id": "edgeloop-job-1-a2",
                "entrypoint_num_gpus": 1,
                "entrypoint_num_cpus": 2,
                "entrypoint_memory": 512u64 * 1024 * 1024,
                "runtime_env": { "env_vars": { "EDGELOOP_JOB_ID": "job-1" } },
                "metadata": { "job_id": "job-1", "attempt": "2", "job_name": "mnist" },
            })
        );
        let no_mem = submit_body(&Launch {
            memory_mb: 0,
            ..launch()
        })
        .unwrap();
        assert!(no_mem.get("entrypoint_memory").is_none());
    }

    #[test]
    fn unsupported_launches_are_refused_with_the_reason() {
        let refused = |l: Launch| match submit_body(&l) {
            Err(EngineError::Refused(why)) => why,
            other => panic!("expected Refused, got {other:?}"),
        };
        assert!(refused(Launch {
            nodes: 2,
            ..launch()
        })
        .contains("Ray Train"));
        assert!(refused(Launch {
            command: vec![],
            ..launch()
        })
        .contains("no command"));
        assert!(refused(Launch {
            launcher: Launcher::Horovod { slots_per_node: 1 },
            ..launch()
        })
        .contains("Horovod"));
        let bad_env = Launch {
            env: BTreeMap::from([("A=B".to_string(), "x".to_string())]),
            ..launch()
        };
        assert!(refused(bad_env).contains("environment"));
        assert!(refused(Launch {
            command: vec!["a\0".to_string()],
            ..launch()
        })
        .contains("NUL"));
    }

    #[test]
    fn submission_ids_are_deterministic_and_distinct() {
        assert_eq!(submission_id("job-1", 0), "edgeloop-job-1-a0");
        assert_eq!(submission_id("job-1", 0), submission_id("job-1", 0));
        assert_ne!(submission_id("job-1", 0), submission_id("job-1", 1));
        let (a, b) = (submission_id("a/b", 0), submission_id("a b", 0));
        assert_ne!(a, b);
        assert!(a.starts_with("edgeloop-a_b-") && a.ends_with("-a0"), "{a}");
        assert!(submission_id("", 0).len() > "edgeloop--a0".len());
        let long = "x".repeat(500);
        assert!(submission_id(&long, 0).len() < 100);
        assert_ne!(submission_id(&long, 0), submission_id(&"x".repeat(501), 0));
        for id in [a, b, submission_id("ü/../x?#", 3)] {
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
                "{id}"
            );
        }
    }

    fn info(status: &str, message: Option<&str>, code: Option<i32>) -> JobInfo {
        JobInfo {
            status: status.to_string(),
            message: message.map(String::from),
            driver_exit_code: code,
            metadata: None,
        }
    }

    #[test]
    fn ray_states_map_to_engine_states() {
        let table = [
            ("PENDING", EngineState::Pending),
            ("RUNNING", EngineState::Running),
            ("SUCCEEDED", EngineState::Succeeded),
            ("STOPPED", EngineState::Cancelled),
        ];
        for (ray, ours) in table {
            assert_eq!(map_status(&info(ray, None, None)).unwrap(), ours, "{ray}");
        }
        assert_eq!(
            map_status(&info(
                "FAILED",
                Some(
                    "Job entrypoint command failed with exit code 3, last available logs (truncated to 20,000 \
                     chars):\nRunning entrypoint for job x: exit 3\n"
                ),
                Some(3)
            ))
            .unwrap(),
            EngineState::Failed {
                exit_code: Some(3),
                reason: "Job entrypoint command failed with exit code 3".to_string()
            }
        );
        assert_eq!(
            map_status(&info(
                "FAILED",
                Some("Failed to start supervisor actor s: 'bad env'. Full traceback:\nTraceback (most recent...\n"),
                None
            ))
            .unwrap(),
            EngineState::Failed { exit_code: None, reason: "Failed to start supervisor actor s: 'bad env'".to_string() }
        );
        assert_eq!(
            map_status(&info("FAILED", None, Some(1))).unwrap(),
            EngineState::Failed {
                exit_code: Some(1),
                reason: "the job exited with code 1".to_string()
            }
        );
        assert!(matches!(
            map_status(&info("FAILED", Some(""), None)).unwrap(),
            EngineState::Failed {
                exit_code: None,
                ..
            }
        ));
        assert!(matches!(
            map_status(&info("WEIRD", None, None)),
            Err(EngineError::Protocol(_))
        ));
    }

    #[test]
    fn job_details_decode_from_ray_json() {
        let text = r#"{"type": "SUBMISSION", "job_id": null, "submission_id": "s", "status": "FAILED",
            "entrypoint": "x", "message": "boom", "metadata": {"job_id": "job-1", "attempt": "2"},
            "runtime_env": {}, "driver_exit_code": 3}"#;
        let i: JobInfo = serde_json::from_str(text).unwrap();
        assert_eq!(i.driver_exit_code, Some(3));
        assert!(i.is_from(&launch()));
        assert!(!i.is_from(&Launch {
            attempt: 3,
            ..launch()
        }));
        let pending: JobInfo =
            serde_json::from_str(r#"{"status": "PENDING", "driver_exit_code": null}"#).unwrap();
        assert!(!pending.is_from(&launch()));
    }

    #[test]
    fn error_bodies_are_summarized() {
        let tb = "Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: Request failed: \n  \
                  File \"y\"\nValueError: Job with submission_id s already exists.\n.\n";
        assert_eq!(
            summarize_error(tb),
            "ValueError: Job with submission_id s already exists."
        );
        assert_eq!(
            summarize_error("Job nope does not exist"),
            "Job nope does not exist"
        );
        assert_eq!(clip(&"é".repeat(300)).chars().count(), 201);
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(encode_path_segment("edgeloop-a_b-a0"), "edgeloop-a_b-a0");
        assert_eq!(encode_path_segment("a/b?c d"), "a%2Fb%3Fc%20d");
    }

    #[test]
    fn urls_must_be_http() {
        assert!(RayEngine::new("127.0.0.1:8265").is_err());
        assert_eq!(
            RayEngine::new("http://127.0.0.1:8265/").unwrap().base_url(),
            "http://127.0.0.1:8265"
        );
    }
}
