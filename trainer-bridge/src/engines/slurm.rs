//! The Slurm engine: jobs go to slurmrestd (OpenAPI plugin `v0.0.38`, Slurm
//! 22.05) with JWT auth (`X-SLURM-USER-NAME` / `X-SLURM-USER-TOKEN`).
//!
//! A [`Launch`] becomes one batch job whose script starts the processes with
//! `srun` (one job step, `--kill-on-bad-exit`, so one dead rank ends the
//! whole group and the bridge can restart it from a checkpoint):
//!
//! - [`Launcher::None`]: one task per node, the command run as given.
//! - [`Launcher::Torchrun`]: `nproc_per_node` tasks per node, one per
//!   training process. The batch script computes `MASTER_ADDR` (first host of
//!   `SLURM_JOB_NODELIST`), `MASTER_PORT` (20000 + job id mod 10000, so
//!   every attempt of every job gets a deterministic port), `NNODES`,
//!   `NPROC_PER_NODE`, `WORLD_SIZE`; each task sets `RANK` (`SLURM_PROCID`),
//!   `LOCAL_RANK` (`SLURM_LOCALID`), `NODE_RANK` (`SLURM_NODEID`) and
//!   `LOCAL_WORLD_SIZE`, then execs the command. This is the env torchrun
//!   gives its workers, so a `torch.distributed` script with `env://` init
//!   runs unchanged. We do not wrap the command in `torchrun` itself: Slurm
//!   already is the per-node agent, torchrun need not be installed, and a
//!   command that is itself `torchrun ...` still works with
//!   `nproc_per_node = 1` (it reads `MASTER_ADDR`/`NODE_RANK` etc. from the
//!   env or its own flags).
//! - [`Launcher::Horovod`]: `slots_per_node` tasks per node with the same
//!   rank env; MPI is bootstrapped by srun's PMI, as Horovod-on-Slurm does.
//!
//! Resources: `--nodes=N` (as a string: slurmrestd silently ignores the
//! `[min, max]` array form), `tasks`/`tasks_per_node`, `cpus_per_task` =
//! cpus_per_node / tasks per node, `memory_per_node`, `gres=gpu:N`. The job
//! environment is exactly [`Launch::env`] plus `PATH` (slurmrestd does not
//! pass its own environment on), and Slurm's own `SLURM_*` variables.
//!
//! Logs: the job's output file is [`Launch::log_path`] (stdout and stderr).
//! Slurm writes it on the batch node, so [`SlurmEngine::logs`] assumes a
//! filesystem shared between the bridge and the compute nodes (or that they
//! are the same machine).
//!
//! Quirks of Slurm 22.05 handled here: an unknown job id is HTTP 500 with
//! error 2017 (not 404); `exit_code` is a raw wait status (768 = exit 3); a
//! refused submission is HTTP 500 with a Slurm error code in 2000..3000 (and
//! still uses up a job id); `%` in an output path is a pattern character.

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::local::container::ContainerRuntime;
use super::slurm_containers::{self as containers, SrunContainer, SLURM_WAYS};
use super::slurm_nodes::{self, ConfiguredFacts, NodesResponse};
use super::slurm_script::tasks_per_node;
// The submission's builders (`slurm_script.rs`), where callers found them.
pub use super::slurm_script::{
    batch_script, batch_script_in, escape_output_path, shell_quote, submit_body, submit_body_in,
    unescape_output_path,
};
use super::{
    ContainerWay, Engine, EngineError, EngineJobId, EngineState, Launch, NodePool, PinnedImage,
};

const API: &str = "slurm/v0.0.38";
/// slurmrestd's base URL (`http://127.0.0.1:16820`).
pub const URL_ENV: &str = "EDGELOOP_SLURMRESTD_URL";
/// The user the JWT was issued for.
pub const USER_ENV: &str = "EDGELOOP_SLURM_USER";
/// The JWT (`scontrol token username=USER lifespan=SECONDS`).
pub const JWT_ENV: &str = "EDGELOOP_SLURM_JWT";
/// The partition to submit to (optional; the cluster's default otherwise).
pub const PARTITION_ENV: &str = "EDGELOOP_SLURM_PARTITION";
/// The NVIDIA driver of the cluster's GPU nodes, for nodes whose features
/// do not say (see `slurm_nodes`).
pub const DRIVER_VERSION_ENV: &str = "EDGELOOP_SLURM_DRIVER_VERSION";
/// The newest CUDA that driver supports.
pub const CUDA_VERSION_ENV: &str = "EDGELOOP_SLURM_CUDA_VERSION";
/// How the nodes run images: `pyxis`, `slurm_oci`, `apptainer`
/// (comma-separated; see `slurm_containers`). Unset: images are refused.
pub const CONTAINERS_ENV: &str = "EDGELOOP_SLURM_CONTAINERS";
/// For `slurm_oci`: a directory the nodes share, where the bridge exports
/// each pinned image's root filesystem once.
pub const OCI_BUNDLES_ENV: &str = "EDGELOOP_SLURM_OCI_BUNDLES";
/// Slurm's "Invalid job id specified".
const ESLURM_INVALID_JOB_ID: i64 = 2017;
/// Slurm's "Job/step already completing or completed".
const ESLURM_ALREADY_DONE: i64 = 2021;
/// At most this much of the end of a job's output is returned by `logs`.
pub const MAX_LOG_BYTES: u64 = 1 << 20;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A Slurm cluster reached through slurmrestd.
#[derive(Clone)]
pub struct SlurmEngine {
    base_url: String,
    user: String,
    token: String,
    partition: Option<String>,
    configured: ConfiguredFacts,
    client: reqwest::Client,
    /// The bridge's runtime: exports images for `slurm_oci`.
    runtime: Option<ContainerRuntime>,
    oci_rootfs: Option<PathBuf>,
}

impl std::fmt::Debug for SlurmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmEngine")
            .field("base_url", &self.base_url)
            .field("user", &self.user)
            .field("token", &"<redacted>")
            .field("partition", &self.partition)
            .finish()
    }
}

impl SlurmEngine {
    /// `url` is slurmrestd's base (`http://127.0.0.1:16820`), `user` and
    /// `token` the JWT pair (`scontrol token username=USER`), `partition`
    /// the partition to submit to (the cluster's default when `None`).
    pub fn new(
        url: impl Into<String>,
        user: impl Into<String>,
        token: impl Into<String>,
        partition: Option<String>,
    ) -> Result<Self, EngineError> {
        edgeloop_client_core::install_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| EngineError::Unavailable(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            base_url: url.into().trim_end_matches('/').to_string(),
            user: user.into(),
            token: token.into(),
            partition: partition.filter(|p| !p.is_empty()),
            configured: ConfiguredFacts::default(),
            client,
            runtime: None,
            oci_rootfs: None,
        })
    }

    /// What `slurm_oci` pins and exports images with: the bridge's runtime.
    pub fn with_runtime(mut self, runtime: Option<ContainerRuntime>) -> Self {
        self.runtime = runtime;
        self
    }

    /// Where `slurm_oci` exports images to (shared with the nodes).
    pub fn with_oci_bundles(mut self, rootfs: Option<PathBuf>) -> Self {
        self.oci_rootfs = rootfs;
        self
    }

    /// The way this cluster runs images: pyxis where the cluster has it,
    /// else Slurm's OCI support, else Apptainer.
    pub fn container_way(&self) -> Option<ContainerWay> {
        SLURM_WAYS
            .into_iter()
            .find(|w| self.configured.containers.contains(w))
    }

    /// How the step of `launch` runs its image; `None` for a job without one.
    async fn srun_container(&self, launch: &Launch) -> Result<Option<SrunContainer>, EngineError> {
        let Some(reference) = &launch.image else {
            return Ok(None);
        };
        let image = launch
            .pinned_image
            .as_ref()
            .map_or_else(|| reference.clone(), PinnedImage::runnable);
        let mounts = super::local::container::job_mounts(launch, &[]);
        Ok(Some(match self.container_way() {
            None => return Err(no_way()),
            Some(ContainerWay::Pyxis) => SrunContainer::Pyxis {
                image: containers::enroot_image(&image),
                mounts,
                workdir: launch.workdir.clone(),
            },
            Some(ContainerWay::Apptainer) => SrunContainer::Apptainer {
                image: containers::apptainer_image(&image),
                binds: mounts,
                workdir: launch.workdir.clone(),
                gpus: launch.gpus_per_node > 0,
            },
            Some(_) => {
                let (runtime, root) = self.oci()?;
                if tasks_per_node(&launch.launcher) > 1 {
                    return Err(EngineError::Refused(
                        "image: Slurm's OCI support runs one task per node in a container; \
                         set the launcher's nproc_per_node to 1 (torchrun inside the image \
                         starts the rest), or run the image with pyxis"
                            .into(),
                    ));
                }
                let pin = match &launch.pinned_image {
                    Some(p) => p.clone(),
                    None => runtime.pin(reference, None).await?,
                };
                let bundle = containers::bundle_dir(root, &pin.digest.to_hex());
                runtime
                    .export_rootfs(&pin.runnable(), &bundle.join("rootfs"))
                    .await?;
                // The bridge's jobs directory: every attempt's files, at
                // their paths, whichever job runs the image.
                let jobs_root: Vec<&Path> = launch
                    .log_path
                    .parent()
                    .and_then(Path::parent)
                    .into_iter()
                    .collect();
                let config = containers::oci_config(&super::local::container::job_mounts(
                    launch, &jobs_root,
                ));
                let text = serde_json::to_vec_pretty(&config)
                    .map_err(|e| EngineError::Protocol(format!("writing config.json: {e}")))?;
                let tmp = bundle.join(format!(".config.json.{}", std::process::id()));
                std::fs::write(&tmp, text)?;
                std::fs::rename(&tmp, bundle.join("config.json"))?;
                SrunContainer::Oci {
                    bundle,
                    workdir: launch.workdir.clone(),
                }
            }
        }))
    }

    fn oci(&self) -> Result<(&ContainerRuntime, &Path), EngineError> {
        match (&self.runtime, &self.oci_rootfs) {
            (Some(r), Some(root)) => Ok((r, root.as_path())),
            (None, _) => Err(EngineError::Refused(
                "image: slurm_oci makes the job's bundle from the bridge's own copy of the \
                 image, and this bridge has no --container-runtime"
                    .into(),
            )),
            (_, None) => Err(EngineError::Refused(format!(
                "image: slurm_oci needs {OCI_BUNDLES_ENV}, a directory the nodes share for the \
                 images' root filesystems"
            ))),
        }
    }

    /// Driver facts for nodes whose features do not name them.
    pub fn with_configured_facts(mut self, facts: ConfiguredFacts) -> Self {
        self.configured = facts;
        self
    }

    /// From `EDGELOOP_SLURMRESTD_URL`, `EDGELOOP_SLURM_USER`,
    /// `EDGELOOP_SLURM_JWT` and the optional `EDGELOOP_SLURM_PARTITION`
    /// (the variables `scripts/slurm-up.sh` writes to its env file).
    pub fn from_env() -> Result<Self, EngineError> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| EngineError::Unavailable(format!("{name} is not set")))
        };
        let optional = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Ok(Self::new(
            var(URL_ENV)?,
            var(USER_ENV)?,
            var(JWT_ENV)?,
            optional(PARTITION_ENV),
        )?
        .with_configured_facts(ConfiguredFacts {
            driver_version: optional(DRIVER_VERSION_ENV),
            cuda_version: optional(CUDA_VERSION_ENV),
            containers: containers::parse_ways(
                CONTAINERS_ENV,
                &optional(CONTAINERS_ENV).unwrap_or_default(),
                &SLURM_WAYS,
            )?,
        })
        .with_oci_bundles(optional(OCI_BUNDLES_ENV).map(PathBuf::from)))
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{API}/{path}", self.base_url)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, self.url(path))
            .header("X-SLURM-USER-NAME", &self.user)
            .header("X-SLURM-USER-TOKEN", &self.token)
    }

    /// Sends a request; answers the status and the parsed JSON body.
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, Value), EngineError> {
        let resp = req.send().await.map_err(|e| {
            EngineError::Unavailable(format!("slurmrestd at {}: {e}", self.base_url))
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| EngineError::Unavailable(format!("reading slurmrestd's answer: {e}")))?;
        if status == 401 || status == 403 {
            return Err(EngineError::Unavailable(format!(
                "slurmrestd refused the credentials (HTTP {status}); is EDGELOOP_SLURM_JWT valid and unexpired?"
            )));
        }
        let body = serde_json::from_str(&text).map_err(|e| {
            EngineError::Protocol(format!(
                "HTTP {status} from slurmrestd is not JSON ({e}): {}",
                snippet(&text)
            ))
        })?;
        Ok((status, body))
    }

    /// The job's record (`jobs[0]` of `GET job/{id}`).
    async fn job(&self, id: &EngineJobId) -> Result<JobInfo, EngineError> {
        let path = job_path(id)?;
        let (status, body) = self.send(self.request(reqwest::Method::GET, &path)).await?;
        let errors = slurm_errors(&body);
        if errors.iter().any(|e| e.code == Some(ESLURM_INVALID_JOB_ID)) {
            return Err(EngineError::NotFound(id.0.clone()));
        }
        if status != 200 || !errors.is_empty() {
            return Err(EngineError::Protocol(format!(
                "GET {path}: HTTP {status}: {}",
                describe_errors(&errors)
            )));
        }
        let mut resp: JobsResponse = serde_json::from_value(body).map_err(|e| {
            EngineError::Protocol(format!("GET {path}: unexpected job record: {e}"))
        })?;
        if resp.jobs.is_empty() {
            return Err(EngineError::NotFound(id.0.clone()));
        }
        Ok(resp.jobs.swap_remove(0))
    }
}

#[async_trait]
impl Engine for SlurmEngine {
    fn name(&self) -> &'static str {
        "slurm"
    }

    async fn pin_image(
        &self,
        reference: &str,
        earlier: Option<&PinnedImage>,
    ) -> Result<Option<PinnedImage>, EngineError> {
        match self.container_way() {
            None => Err(no_way()),
            Some(ContainerWay::SlurmOci) => {
                let (runtime, _) = self.oci()?;
                runtime.pin(reference, earlier).await.map(Some)
            }
            // enroot and Apptainer pull from the registry: a digest the
            // reference names is the pin, a tag is pulled as it is.
            Some(_) => super::registry_pin(reference, earlier),
        }
    }

    async fn submit(&self, launch: &Launch) -> Result<EngineJobId, EngineError> {
        let path_env = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
        let cwd = std::env::current_dir()?;
        let container = self.srun_container(launch).await?;
        let body = submit_body_in(
            launch,
            self.partition.as_deref(),
            &path_env,
            &cwd,
            container.as_ref(),
        )?;
        let (status, resp) = self
            .send(
                self.request(reqwest::Method::POST, "job/submit")
                    .json(&body),
            )
            .await?;
        let errors = slurm_errors(&resp);
        if !errors.is_empty() || status != 200 {
            return Err(submit_error(status, &errors));
        }
        match resp.get("job_id").and_then(Value::as_u64) {
            Some(id) => {
                tracing::info!(job = %launch.job_id, attempt = launch.attempt, slurm_job = id, "submitted to Slurm");
                Ok(EngineJobId(id.to_string()))
            }
            None => Err(EngineError::Protocol(format!(
                "job/submit answered no job_id: {}",
                snippet(&resp.to_string())
            ))),
        }
    }

    async fn pools(&self) -> Result<Vec<NodePool>, EngineError> {
        let (status, body) = self
            .send(self.request(reqwest::Method::GET, "nodes"))
            .await?;
        let errors = slurm_errors(&body);
        if status != 200 || !errors.is_empty() {
            return Err(EngineError::Protocol(format!(
                "GET nodes: HTTP {status}: {}",
                describe_errors(&errors)
            )));
        }
        let resp: NodesResponse = serde_json::from_value(body)
            .map_err(|e| EngineError::Protocol(format!("GET nodes: unexpected answer: {e}")))?;
        Ok(slurm_nodes::pools(
            &resp.nodes,
            self.partition.as_deref(),
            &self.configured,
            &format!("/{API}/nodes"),
        ))
    }

    async fn status(&self, id: &EngineJobId) -> Result<EngineState, EngineError> {
        let job = self.job(id).await?;
        let state = job.job_state.as_deref().unwrap_or_default();
        map_state(state, job.exit_code, job.state_reason.as_deref()).ok_or_else(|| {
            EngineError::Protocol(format!("Slurm job {} has an unknown state {state:?}", id.0))
        })
    }

    async fn cancel(&self, id: &EngineJobId) -> Result<(), EngineError> {
        let path = job_path(id)?;
        let (status, body) = self
            .send(self.request(reqwest::Method::DELETE, &path))
            .await?;
        let errors = slurm_errors(&body);
        if errors.iter().any(|e| e.code == Some(ESLURM_INVALID_JOB_ID)) {
            return Err(EngineError::NotFound(id.0.clone()));
        }
        // Cancelling a finished job is not an error: the job is stopped.
        let errors: Vec<_> = errors
            .into_iter()
            .filter(|e| e.code != Some(ESLURM_ALREADY_DONE))
            .collect();
        if !errors.is_empty() || (status != 200 && status != 500) {
            return Err(EngineError::Protocol(format!(
                "DELETE {path}: HTTP {status}: {}",
                describe_errors(&errors)
            )));
        }
        Ok(())
    }

    async fn logs(&self, id: &EngineJobId) -> Result<String, EngineError> {
        let job = self.job(id).await?;
        let Some(out) = job.standard_output.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(String::new());
        };
        let mut path = PathBuf::from(unescape_output_path(out));
        if path.is_relative() {
            if let Some(dir) = job.current_working_directory.as_deref() {
                path = Path::new(dir).join(path);
            }
        }
        tokio::task::spawn_blocking(move || read_tail(&path, MAX_LOG_BYTES))
            .await
            .map_err(|e| EngineError::Io(std::io::Error::other(e)))?
    }
}

/// The fields of a job record this engine reads.
#[derive(Debug, Deserialize)]
struct JobInfo {
    job_state: Option<String>,
    exit_code: Option<i64>,
    state_reason: Option<String>,
    standard_output: Option<String>,
    current_working_directory: Option<String>,
}

#[derive(Debug, Deserialize)]
struct JobsResponse {
    #[serde(default)]
    jobs: Vec<JobInfo>,
}

/// One entry of slurmrestd's `errors` array. Submission errors carry
/// `error_code`, the others `error_number`.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmError {
    pub code: Option<i64>,
    pub message: String,
}

/// The `errors` of a slurmrestd answer.
pub fn slurm_errors(body: &Value) -> Vec<SlurmError> {
    let Some(errors) = body.get("errors").and_then(Value::as_array) else {
        return Vec::new();
    };
    errors
        .iter()
        .map(|e| {
            let code = e
                .get("error_code")
                .or_else(|| e.get("error_number"))
                .and_then(Value::as_i64);
            let text = |k: &str| e.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
            let message = match (text("error"), text("description")) {
                (Some(a), Some(b)) => format!("{a}: {b}"),
                (Some(a), None) | (None, Some(a)) => a.to_string(),
                (None, None) => e.to_string(),
            };
            SlurmError { code, message }
        })
        .collect()
}

fn describe_errors(errors: &[SlurmError]) -> String {
    if errors.is_empty() {
        return "no error given".to_string();
    }
    errors
        .iter()
        .map(|e| match e.code {
            Some(c) => format!("{} (error {c})", e.message),
            None => e.message.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Classifies a failed submission: Slurm's job errors (2000..3000, e.g. 2014
/// "Requested node configuration is not available", 2015 for too many nodes)
/// are refusals of the job as specified; anything else (communication with
/// slurmctld, a parse failure of our request) is not the job's fault.
pub fn submit_error(status: u16, errors: &[SlurmError]) -> EngineError {
    if let Some(e) = errors
        .iter()
        .find(|e| e.code.is_some_and(|c| (2000..3000).contains(&c)))
    {
        return EngineError::Refused(e.message.clone());
    }
    let text = format!("job/submit: HTTP {status}: {}", describe_errors(errors));
    if errors
        .iter()
        .any(|e| e.code.is_some_and(|c| (1000..2000).contains(&c)))
    {
        EngineError::Unavailable(text)
    } else {
        EngineError::Protocol(text)
    }
}

/// `job/{id}`, refusing ids that are not Slurm job ids (they could not name a
/// job, and must not reach the URL path unchecked).
fn job_path(id: &EngineJobId) -> Result<String, EngineError> {
    if id.0.is_empty() || id.0.len() > 20 || !id.0.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EngineError::NotFound(id.0.clone()));
    }
    Ok(format!("job/{}", id.0))
}

fn snippet(s: &str) -> String {
    let mut out: String = s.chars().take(300).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// How a process ended, decoded from a wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    Exited(i32),
    Signaled(i32),
}

/// Decodes a raw wait status as Slurm reports it in `exit_code`
/// (`768` = exited with 3, `9` = killed by SIGKILL, `0x89` = SIGKILL + core).
pub fn decode_wait_status(raw: i64) -> WaitStatus {
    let sig = (raw & 0x7f) as i32;
    if sig == 0 || sig == 0x7f {
        WaitStatus::Exited(((raw >> 8) & 0xff) as i32)
    } else {
        WaitStatus::Signaled(sig)
    }
}

fn no_way() -> EngineError {
    EngineError::Refused(format!(
        "image: this Slurm cluster runs no images ({CONTAINERS_ENV} names none of pyxis, \
         slurm_oci, apptainer); leave `image` out to run the command on the nodes"
    ))
}

/// Maps a Slurm `job_state` (with the raw `exit_code` and `state_reason`)
/// to an [`EngineState`]; `None` for a state this engine does not know.
/// `COMPLETING` (processes still being cleaned up) counts as running, so a
/// terminal state is only reported once the job's processes are gone.
pub fn map_state(
    job_state: &str,
    exit_code: Option<i64>,
    reason: Option<&str>,
) -> Option<EngineState> {
    let reason = reason.filter(|r| !r.is_empty() && *r != "None");
    // The exit code, and what happened in words.
    let ended = |what: &str| {
        let (code, how) = match exit_code.map(decode_wait_status) {
            Some(WaitStatus::Exited(0)) | None => (None, String::new()),
            Some(WaitStatus::Exited(c)) => (Some(c), format!(", exit code {c}")),
            Some(WaitStatus::Signaled(s)) => (None, format!(", killed by signal {s}")),
        };
        let mut text = format!("Slurm job {what}{how}");
        if let Some(r) = reason {
            let _ = write!(text, " ({r})");
        }
        (code, text)
    };
    let failed = |what: &str| {
        let (exit_code, reason) = ended(what);
        EngineState::Failed { exit_code, reason }
    };
    let preempted = |what: &str| EngineState::Preempted {
        reason: ended(what).1,
    };
    Some(match job_state.to_ascii_uppercase().as_str() {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
        | "RESV_DEL_HOLD" | "POWER_UP_NODE" => EngineState::Pending,
        "RUNNING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "STAGE_OUT"
        | "RESIZING" => EngineState::Running,
        "COMPLETED" => match exit_code.map(decode_wait_status) {
            Some(WaitStatus::Exited(0)) | None => EngineState::Succeeded,
            // Not seen in practice; never report success for a bad status.
            Some(_) => failed("completed"),
        },
        "CANCELLED" => EngineState::Cancelled,
        "FAILED" => failed("failed"),
        "TIMEOUT" => failed("hit its time limit"),
        // The cluster took the nodes back: nothing is wrong with the job.
        "NODE_FAIL" => preempted("lost a node"),
        "PREEMPTED" => preempted("was preempted"),
        "OUT_OF_MEMORY" => failed("ran out of memory"),
        "BOOT_FAIL" => failed("could not boot its nodes"),
        "DEADLINE" => failed("missed its deadline"),
        "SPECIAL_EXIT" => failed("ended with a special exit"),
        "REVOKED" => failed("was revoked (federation)"),
        _ => return None,
    })
}

/// The last `max` bytes of a file, as text; empty when it does not exist yet
/// (a pending job has not opened its output file).
fn read_tail(path: &Path, max: u64) -> Result<String, EngineError> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e.into()),
    };
    let len = file.metadata()?.len();
    if len > max {
        file.seek(SeekFrom::Start(len - max))?;
    }
    let mut buf = Vec::new();
    file.take(max).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn wait_status_decoding() {
        assert_eq!(decode_wait_status(0), WaitStatus::Exited(0));
        assert_eq!(decode_wait_status(768), WaitStatus::Exited(3));
        assert_eq!(decode_wait_status(256), WaitStatus::Exited(1));
        assert_eq!(decode_wait_status(255 << 8), WaitStatus::Exited(255));
        assert_eq!(decode_wait_status(137 << 8), WaitStatus::Exited(137));
        assert_eq!(decode_wait_status(9), WaitStatus::Signaled(9));
        assert_eq!(decode_wait_status(15), WaitStatus::Signaled(15));
        assert_eq!(decode_wait_status(0x80 | 11), WaitStatus::Signaled(11));
    }

    #[test]
    fn state_mapping_table() {
        let failed = |code: Option<i32>| move |s: Option<EngineState>| matches!(s, Some(EngineState::Failed { exit_code, .. }) if exit_code == code);
        assert_eq!(
            map_state("PENDING", Some(0), Some("Resources")),
            Some(EngineState::Pending)
        );
        assert_eq!(
            map_state("CONFIGURING", None, None),
            Some(EngineState::Pending)
        );
        assert_eq!(
            map_state("REQUEUED", None, None),
            Some(EngineState::Pending)
        );
        assert_eq!(
            map_state("RUNNING", Some(0), None),
            Some(EngineState::Running)
        );
        assert_eq!(
            map_state("COMPLETING", Some(768), None),
            Some(EngineState::Running)
        );
        assert_eq!(
            map_state("SUSPENDED", None, None),
            Some(EngineState::Running)
        );
        assert_eq!(
            map_state("COMPLETED", Some(0), Some("None")),
            Some(EngineState::Succeeded)
        );
        assert_eq!(
            map_state("completed", None, None),
            Some(EngineState::Succeeded)
        );
        assert!(failed(Some(3))(map_state("COMPLETED", Some(768), None)));
        assert_eq!(
            map_state("CANCELLED", Some(15), None),
            Some(EngineState::Cancelled)
        );
        assert!(failed(Some(3))(map_state(
            "FAILED",
            Some(768),
            Some("NonZeroExitCode")
        )));
        assert!(failed(None)(map_state("FAILED", Some(9), None)));
        assert!(failed(None)(map_state(
            "FAILED",
            Some(0),
            Some("JobLaunchFailure")
        )));
        assert_eq!(
            map_state("PREEMPTED", Some(15), Some("None")),
            Some(EngineState::Preempted {
                reason: "Slurm job was preempted, killed by signal 15".into()
            })
        );
        assert_eq!(
            map_state("node_fail", Some(0), Some("NodeDown")),
            Some(EngineState::Preempted {
                reason: "Slurm job lost a node (NodeDown)".into()
            })
        );
        for s in ["TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"] {
            assert!(failed(None)(map_state(s, Some(0), None)), "{s}");
        }
        assert_eq!(map_state("WHATEVER", None, None), None);
        assert_eq!(map_state("", None, None), None);

        let Some(EngineState::Failed { reason, .. }) =
            map_state("FAILED", Some(768), Some("NonZeroExitCode"))
        else {
            panic!("not failed");
        };
        assert_eq!(reason, "Slurm job failed, exit code 3 (NonZeroExitCode)");
        let Some(EngineState::Failed { reason, .. }) =
            map_state("OUT_OF_MEMORY", Some(9), Some("OutOfMemory"))
        else {
            panic!("not failed");
        };
        assert_eq!(
            reason,
            "Slurm job ran out of memory, killed by signal 9 (OutOfMemory)"
        );
    }

    #[test]
    fn errors_are_parsed_and_classified() {
        let refused = json!({"errors": [{"error_code": 2014, "error": "Requested node configuration is not available"}]});
        let errors = slurm_errors(&refused);
        assert_eq!(
            errors,
            [SlurmError {
                code: Some(2014),
                message: "Requested node configuration is not available".into()
            }]
        );
        match submit_error(500, &errors) {
            EngineError::Refused(m) => {
                assert_eq!(m, "Requested node configuration is not available")
            }
            e => panic!("{e:?}"),
        }
        let parse = json!({"errors": [{"error": "Invalid node count list size", "error_code": -1},
                                      {"error_code": 9001, "error": "Failure during parsing"}]});
        assert!(matches!(
            submit_error(500, &slurm_errors(&parse)),
            EngineError::Protocol(_)
        ));
        let comm =
            json!({"errors": [{"error_code": 1007, "error": "Protocol authentication error"}]});
        assert!(matches!(
            submit_error(500, &slurm_errors(&comm)),
            EngineError::Unavailable(_)
        ));
        let unknown = json!({"errors": [{"description": "Unable to find JobId=9", "error_number": 2017,
                                         "error": "Invalid job id specified", "source": "slurm_load_job"}]});
        assert_eq!(slurm_errors(&unknown)[0].code, Some(ESLURM_INVALID_JOB_ID));
        assert_eq!(
            slurm_errors(&unknown)[0].message,
            "Invalid job id specified: Unable to find JobId=9"
        );
        assert!(slurm_errors(&json!({"errors": []})).is_empty());
        assert!(slurm_errors(&json!({})).is_empty());
    }

    #[test]
    fn job_ids_are_checked_before_they_reach_a_url() {
        assert_eq!(job_path(&EngineJobId("42".into())).unwrap(), "job/42");
        for bad in [
            "",
            "../ping",
            "4 2",
            "42?x=1",
            "abc",
            "123456789012345678901",
        ] {
            assert!(
                matches!(
                    job_path(&EngineJobId(bad.into())),
                    Err(EngineError::NotFound(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn read_tail_returns_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        assert_eq!(read_tail(&p, 10).unwrap(), "");
        std::fs::write(&p, "0123456789abcdef").unwrap();
        assert_eq!(read_tail(&p, 6).unwrap(), "abcdef");
        assert_eq!(read_tail(&p, 100).unwrap(), "0123456789abcdef");
    }
}
