//! The Kubernetes engine: one job attempt is one Indexed `batch/v1` Job plus a
//! headless Service, created through the API server with `kube`.
//!
//! What is created (all by the pure builders [`build`], [`build_job`],
//! [`build_service`], so the tests pin the objects):
//!
//! - A Job named by [`object_name`] (`<job id>-<attempt>`, shortened with a
//!   hash to stay a DNS label), `completionMode: Indexed`, `completions =
//!   parallelism = nodes`: one pod per node, each knowing its index.
//!   `restartPolicy: Never`, `backoffLimit: 0` and a `podFailurePolicy` whose
//!   every rule is `FailJob`: Kubernetes never restarts or replaces a pod of
//!   ours. A pod that Kubernetes started again would run with the attempt's
//!   `EDGELOOP_RESUME_FROM` and `EDGELOOP_ATTEMPT`, resuming from a stale
//!   checkpoint under a reused attempt number; the bridge instead restarts
//!   the whole attempt, with backoff, from the newest committed checkpoint.
//!   `ttlSecondsAfterFinished` lets Kubernetes remove finished Jobs (and, by
//!   owner reference, their Service).
//! - A headless Service (`clusterIP: None`, `publishNotReadyAddresses`) of
//!   the same name selecting the Job's pods; the pod template's `subdomain`
//!   names it, so pod `i` resolves as `<name>-<i>.<name>` in the namespace.
//!
//! Launchers:
//! - [`Launcher::None`]: the command runs as given in every pod.
//! - [`Launcher::Torchrun`]: the environment of [`crate::launch::torchrun_env`]
//!   with `MASTER_ADDR=<name>-0.<name>`, the spec's `MASTER_PORT`, and
//!   `NODE_RANK` taken from the pod's completion index through the downward
//!   API (the `batch.kubernetes.io/job-completion-index` annotation, the same
//!   value Kubernetes puts in `JOB_COMPLETION_INDEX`). With one process per
//!   node the command is run directly with `RANK = NODE_RANK` and
//!   `LOCAL_RANK = 0`, so no torchrun is needed in the image. With more, one
//!   container cannot host several ranks without an agent, so the command is
//!   run under `torchrun --nnodes --nproc-per-node --node-rank --master-addr
//!   --master-port --no-python` (torchrun must be in the image), which sets
//!   `RANK`/`LOCAL_RANK` per worker.
//! - [`Launcher::Horovod`]: on one node, `horovodrun -np N -H localhost:N`
//!   (horovodrun in the image). Across nodes Horovod needs MPI or SSH between
//!   the pods (what the MPI Operator's MPIJob sets up); this engine does not,
//!   so multi-node Horovod is refused.
//!
//! Pools ([`Engine::pools`], [`nodes::pools`]): the nodes of
//! `GET /api/v1/nodes` (paged), grouped by GPU product, GPU count, driver
//! and CUDA version; GPUs are the allocatable `nvidia.com/gpu`, the rest
//! comes from NVIDIA GPU Feature Discovery's labels (`nvidia.com/gpu.product`,
//! `nvidia.com/gpu.memory`, `nvidia.com/cuda.*`). Nodes without GPUs form
//! the `cpu` pool; cordoned nodes, and nodes tainted against every pod of
//! ours, are left out. A pool's `placement` is the node labels that select
//! it: `nvidia.com/gpu.product`, plus the driver labels where several pools
//! share a product. Nodes are cluster-scoped: the bridge's credentials need
//! `list` on `nodes` (a ClusterRole), or the bridge reports no pools.
//!
//! GPU jobs (`gpus_per_node > 0`):
//! - `nvidia.com/gpu` limits of `gpus_per_node` (an extended resource is
//!   requested at its limit);
//! - a `nodeSelector` of the placement of `Launch::pool`, the pool the
//!   pre-flight check held the job against ([`node_selector`]); a job
//!   without GPUs is not pinned to the pool it was placed in;
//! - a toleration of the usual GPU taint (`nvidia.com/gpu`, `Exists`,
//!   `NoSchedule`);
//! - a memory-backed `emptyDir` at `/dev/shm` for NCCL, also for any job
//!   with several processes per pod ([`needs_shm`]).
//!
//! NCCL settings arrive in `Launch::env` like every other variable; they are
//! in the one container of the pod template, so every pod (rank) of the Job,
//! and every torchrun worker in it, has them.
//!
//! Kubernetes expands `$(VAR)` in `command`, `args` and `env` values; every
//! `$` of the launch is written as `$$` ([`escape_expansion`]) so the words
//! reach the process exactly as given.
//!
//! Files: the bridge reads checkpoints from `EDGELOOP_CHECKPOINT_DIR` on its
//! own filesystem, so the pods must see that directory at the same path. The
//! engine mounts the checkpoint directory and the working directory (one
//! mount when one holds the other) at their own paths:
//! - with `EDGELOOP_K8S_CHECKPOINT_PVC` set, from that PersistentVolumeClaim
//!   (ReadWriteMany, e.g. NFS), which must hold the bridge's `<data
//!   dir>/jobs` directory: the bridge mounts the same volume there, and each
//!   pod mounts the claim's `<job id>/...` sub path at the same path;
//! - otherwise as `hostPath` volumes (`DirectoryOrCreate`): right for a
//!   single-node cluster on the bridge's machine, or kind with the bridge's
//!   data dir in the node's `extraMounts` at the same path.
//!
//! Status, from the Job: condition `Complete` is success; `Failed` is a
//! failure whose reason is the condition's, with the exit code of the pod
//! that failed first. Otherwise the attempt is running once a pod is ready
//! (or has ended), and pending before (the Job's `active` count also holds
//! unscheduled pods, so it is not used). A pod that can never start (a bad
//! image) keeps the attempt pending; cancelling it ends it.
//!
//! Cancel deletes the Job with `propagationPolicy: Background` (the API's
//! default for Jobs orphans their pods) and the Service. The engine then
//! reports the missing Job as cancelled; a Job deleted by someone else is
//! [`EngineError::NotFound`], a failure the bridge restarts from.
//!
//! Settings ([`KubernetesEngine::from_env`]): `EDGELOOP_K8S_API_URL` (a plain
//! URL, with an optional bearer token in `EDGELOOP_K8S_TOKEN`; used against
//! the tests' fake API server) or else `KUBECONFIG` (kube's own loading:
//! contexts, client certificates, exec plugins); `EDGELOOP_K8S_NAMESPACE`
//! (default `default`); `EDGELOOP_K8S_CHECKPOINT_PVC` (see above).
//! `Launch::log_path` is not written: [`Engine::logs`] reads the logs of
//! the index-0 pod from the API.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::{
    Job, JobCondition, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, Node,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec,
    ResourceRequirements, Service, ServiceSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};

use super::{Engine, EngineError, EngineJobId, EngineState, Launch, Launcher, NodePool};
use crate::launch::{self, RankInfo, CHECKPOINT_DIR, RESUME_FROM};

pub mod nodes;
pub use nodes::{GPU_RESOURCE, GPU_TAINT, PRODUCT_LABEL};

/// A plain API server URL (`http://127.0.0.1:8001`, `https://...`); takes
/// precedence over `KUBECONFIG`.
pub const API_URL_ENV: &str = "EDGELOOP_K8S_API_URL";
/// Bearer token sent with [`API_URL_ENV`] (optional).
pub const TOKEN_ENV: &str = "EDGELOOP_K8S_TOKEN";
/// kube's usual kubeconfig variable.
pub const KUBECONFIG_ENV: &str = "KUBECONFIG";
pub const NAMESPACE_ENV: &str = "EDGELOOP_K8S_NAMESPACE";
/// A PersistentVolumeClaim holding the bridge's `<data dir>/jobs`.
pub const CHECKPOINT_PVC_ENV: &str = "EDGELOOP_K8S_CHECKPOINT_PVC";

/// The job id, as a label value ([`label_value`]).
pub const LABEL_JOB_ID: &str = "edgeloop.io/job-id";
pub const LABEL_ATTEMPT: &str = "edgeloop.io/attempt";
/// Carried by the pods of one Job: what the Service and `logs` select on.
pub const LABEL_OBJECT: &str = "edgeloop.io/k8s-job";
/// The job id exactly (labels cannot hold every id).
pub const ANNOTATION_JOB_ID: &str = "edgeloop.io/job-id";
/// Set by the Job controller on each pod of an Indexed Job.
pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
pub const CONTAINER_NAME: &str = "trainer";
/// Long enough to read a finished Job's status and logs after a bridge
/// restart; Kubernetes then removes the Job, its pods and its Service.
pub const TTL_SECONDS_AFTER_FINISHED: i32 = 24 * 3600;
/// Pods of an Indexed Job get the hostname `<job name>-<index>`, which must
/// be a DNS label (≤ 63): 52 leaves room for any index.
pub const MAX_NAME_LEN: usize = 52;
/// At most this much of a pod's log is returned by `logs`.
pub const MAX_LOG_BYTES: i64 = 1 << 20;
const LOG_TAIL_LINES: i64 = 20_000;
/// Nodes per `GET /api/v1/nodes` page, and at most this many pages (a
/// server that keeps answering with a continue token is not trusted).
const NODE_PAGE: u32 = 500;
const MAX_NODE_PAGES: usize = 200;
/// The memory-backed volume at `/dev/shm` (see [`needs_shm`]).
pub const SHM_VOLUME: &str = "dshm";
pub const SHM_PATH: &str = "/dev/shm";

/// Where the pods get the shared directories from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedVolume {
    /// `hostPath` volumes at the same paths (single-node clusters, kind).
    HostPath,
    /// A PersistentVolumeClaim whose root is `root` on the bridge.
    Claim { name: String, root: PathBuf },
}

/// What the builders need besides the launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub namespace: String,
    pub volume: SharedVolume,
}

/// The objects of one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Objects {
    pub job: Job,
    pub service: Service,
}

/// Is `s` a DNS-1123 label (what namespaces and our object names must be)?
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn short_hash(s: &str) -> String {
    hex::encode(&Sha256::digest(s.as_bytes())[..4])
}

/// Lowercase alphanumerics and `-`, no runs of `-`, none at the ends.
fn dns_chars(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The name of an attempt's Job and Service: `<job id>-<attempt>` (job ids
/// are the spec's name plus a random suffix, so they are unique and
/// readable). An id that is not usable as is (characters, length, a leading
/// digit: Service names must start with a letter) is cleaned up, cut, and
/// given a hash of the original, so distinct ids keep distinct names.
pub fn object_name(job_id: &str, attempt: u32) -> String {
    let suffix = format!("-{attempt}");
    let clean = dns_chars(job_id);
    let usable = clean == job_id
        && clean.starts_with(|c: char| c.is_ascii_lowercase())
        && clean.len() + suffix.len() <= MAX_NAME_LEN;
    if usable {
        return format!("{clean}{suffix}");
    }
    let hash = short_hash(job_id);
    let mut base = clean;
    if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
        base.insert_str(0, "j-");
    }
    let room = MAX_NAME_LEN - suffix.len() - hash.len() - 1;
    base.truncate(room);
    let base = base.trim_end_matches('-');
    format!("{base}-{hash}{suffix}")
}

/// `s` as a label value (≤ 63 of `[A-Za-z0-9._-]`, alphanumeric at both
/// ends), with a hash of `s` when it had to change.
pub fn label_value(s: &str) -> String {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let valid = s.len() <= 63
        && s.bytes().all(ok)
        && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric());
    if valid {
        return s.to_string();
    }
    let mut clean: String = s
        .bytes()
        .map(|b| if ok(b) { char::from(b) } else { '-' })
        .collect();
    clean.truncate(63 - 9);
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if clean.is_empty() {
        short_hash(s)
    } else {
        format!("{clean}-{}", short_hash(s))
    }
}

/// Writes every `$` as `$$`, which Kubernetes' `$(VAR)` expansion turns back
/// into one `$`: the text comes out unchanged whatever it holds.
pub fn escape_expansion(s: &str) -> String {
    s.replace('$', "$$")
}

/// Kubernetes' `$(VAR)` expansion (k8s.io/kubernetes
/// third_party/forked/golang/expansion): `$$` is `$`, `$(NAME)` a
/// defined variable's value, anything else stays. The inverse of
/// [`escape_expansion`]; the engine's tests and the fake API server of the
/// integration tests use it to run a pod's words as Kubernetes would.
pub fn expand_like_kubernetes(input: &str, env: &BTreeMap<String, String>) -> String {
    let b = input.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'(' {
                if let Some(end) = input[i + 2..].find(')') {
                    let name = &input[i + 2..i + 2 + end];
                    match env.get(name) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    i += 2 + end + 1;
                    continue;
                }
            }
            out.push('$');
            i += 1;
            continue;
        }
        let Some(c) = input[i..].chars().next() else {
            break;
        };
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn utf8(what: &str, path: &Path) -> Result<String, EngineError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| EngineError::Refused(format!("the {what} {path:?} is not UTF-8")))
}

/// Makes the launch's paths absolute against `cwd`: the pods mount them at
/// the same paths, and a relative path would be read against the
/// container's working directory instead of the bridge's.
pub fn absolutize(launch: &Launch, cwd: &Path) -> Launch {
    let mut l = launch.clone();
    l.workdir = cwd.join(&launch.workdir);
    for key in [CHECKPOINT_DIR, RESUME_FROM] {
        if let Some(v) = l.env.get_mut(key) {
            if !v.is_empty() && Path::new(v.as_str()).is_relative() {
                *v = cwd.join(v.as_str()).to_string_lossy().into_owned();
            }
        }
    }
    l
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's completion index, through the downward API.
fn index_field_path() -> String {
    format!("metadata.annotations['{INDEX_ANNOTATION}']")
}

/// The program words and the environment of the trainer container.
fn process(launch: &Launch, name: &str) -> Result<(Vec<String>, Vec<EnvVar>), EngineError> {
    if launch.command.is_empty() {
        return Err(EngineError::Refused("the job has no command".to_string()));
    }
    if launch.command.iter().any(|w| w.contains('\0')) {
        return Err(EngineError::Refused(
            "the command contains a NUL byte".to_string(),
        ));
    }
    let nodes = launch.nodes.max(1);
    let mut plain = launch.env.clone();
    let mut from_index: Vec<&str> = Vec::new();
    // Escaped once here; the words added below are ours and hold no `$`
    // except where Kubernetes is meant to expand.
    let mut words: Vec<String> = launch.command.iter().map(|w| escape_expansion(w)).collect();
    match launch.launcher {
        Launcher::None => {}
        Launcher::Torchrun { nproc_per_node } => {
            if nproc_per_node == 0 {
                return Err(EngineError::Refused(
                    "torchrun with nproc_per_node = 0".to_string(),
                ));
            }
            let master_addr = format!("{name}-0.{name}");
            let master_port = launch::master_port(launch);
            // Node 0's values; NODE_RANK (and RANK) are per pod, below.
            let env = launch::torchrun_env(&RankInfo {
                master_addr: master_addr.clone(),
                master_port,
                nnodes: nodes,
                nproc_per_node,
                node_rank: 0,
                local_rank: 0,
            })
            .map_err(|e| EngineError::Refused(e.to_string()))?;
            plain.extend(env);
            plain.remove("NODE_RANK");
            plain.remove("RANK");
            from_index.push("NODE_RANK");
            if nproc_per_node == 1 {
                from_index.push("RANK");
            } else {
                // torchrun gives each worker its RANK and LOCAL_RANK.
                plain.remove("LOCAL_RANK");
                let mut run = vec![
                    "torchrun".to_string(),
                    format!("--nnodes={nodes}"),
                    format!("--nproc-per-node={nproc_per_node}"),
                    // Kubernetes fills in the pod's own rank.
                    "--node-rank=$(NODE_RANK)".to_string(),
                    format!("--master-addr={master_addr}"),
                    format!("--master-port={master_port}"),
                    "--no-python".to_string(),
                ];
                run.append(&mut words);
                words = run;
            }
        }
        Launcher::Horovod { slots_per_node } => {
            if nodes > 1 {
                return Err(EngineError::Refused(format!(
                    "Horovod across {nodes} nodes needs MPI or SSH between the pods (the MPI \
                     Operator's MPIJob sets that up); the kubernetes engine runs Indexed Jobs \
                     and only starts Horovod on one node"
                )));
            }
            words = launch::horovod_command(&["localhost".to_string()], slots_per_node, &words)
                .map_err(|e| EngineError::Refused(e.to_string()))?;
        }
    }
    let mut env = Vec::with_capacity(plain.len() + from_index.len());
    for (k, v) in &plain {
        if !is_env_name(k) {
            return Err(EngineError::Refused(format!(
                "{k:?} is not a valid environment variable name"
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::Refused(format!(
                "the value of {k} contains a NUL byte"
            )));
        }
        env.push(EnvVar {
            name: k.clone(),
            value: Some(escape_expansion(v)),
            ..Default::default()
        });
    }
    for k in from_index {
        env.push(field_env(k, &index_field_path()));
    }
    Ok((words, env))
}

/// The directories the pods must share with the bridge, each once (a
/// directory inside another one comes with it).
fn shared_dirs(launch: &Launch) -> Result<Vec<PathBuf>, EngineError> {
    let mut dirs = Vec::new();
    if let Some(ckpt) = launch.env.get(CHECKPOINT_DIR).filter(|v| !v.is_empty()) {
        dirs.push(PathBuf::from(ckpt));
    }
    dirs.push(launch.workdir.clone());
    for d in &dirs {
        if !d.is_absolute() {
            return Err(EngineError::Refused(format!(
                "{} is mounted into the pods at the same path and must be absolute",
                d.display()
            )));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in &dirs {
        if dirs.iter().any(|o| o != d && d.starts_with(o)) || out.contains(d) {
            continue;
        }
        out.push(d.clone());
    }
    Ok(out)
}

fn volumes(
    launch: &Launch,
    settings: &Settings,
) -> Result<(Vec<Volume>, Vec<VolumeMount>), EngineError> {
    let dirs = shared_dirs(launch)?;
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    match &settings.volume {
        SharedVolume::HostPath => {
            for (i, dir) in dirs.iter().enumerate() {
                let path = utf8("shared directory", dir)?;
                let name = format!("edgeloop-{i}");
                volumes.push(Volume {
                    name: name.clone(),
                    host_path: Some(HostPathVolumeSource {
                        path: path.clone(),
                        type_: Some("DirectoryOrCreate".to_string()),
                    }),
                    ..Default::default()
                });
                mounts.push(VolumeMount {
                    name,
                    mount_path: path,
                    ..Default::default()
                });
            }
        }
        SharedVolume::Claim { name: claim, root } => {
            volumes.push(Volume {
                name: "edgeloop".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: None,
                }),
                ..Default::default()
            });
            for dir in &dirs {
                let sub = dir.strip_prefix(root).map_err(|_| {
                    EngineError::Refused(format!(
                        "{} is not under {}, the directory the claim {claim} holds",
                        dir.display(),
                        root.display()
                    ))
                })?;
                let sub = utf8("shared directory", sub)?;
                mounts.push(VolumeMount {
                    name: "edgeloop".to_string(),
                    mount_path: utf8("shared directory", dir)?,
                    sub_path: Some(sub).filter(|s| !s.is_empty()),
                    ..Default::default()
                });
            }
        }
    }
    Ok((volumes, mounts))
}

fn resources(launch: &Launch) -> ResourceRequirements {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if launch.cpus_per_node > 0 {
        let q = Quantity(launch.cpus_per_node.to_string());
        requests.insert("cpu".to_string(), q.clone());
        limits.insert("cpu".to_string(), q);
    }
    if launch.memory_mb > 0 {
        let q = Quantity(format!("{}Mi", launch.memory_mb));
        requests.insert("memory".to_string(), q.clone());
        limits.insert("memory".to_string(), q);
    }
    if launch.gpus_per_node > 0 {
        // Extended resources are limits only; the request defaults to it.
        limits.insert(
            GPU_RESOURCE.to_string(),
            Quantity(launch.gpus_per_node.to_string()),
        );
    }
    ResourceRequirements {
        requests: Some(requests).filter(|m| !m.is_empty()),
        limits: Some(limits).filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// The node labels a GPU job's pods must match: the placement this engine
/// wrote into the pool the pre-flight check chose (the GPU product, and the
/// driver labels where pools share a product). A job without GPUs is not
/// pinned even when it was placed in a GPU pool (the first pool it fits):
/// it would take GPU nodes' CPUs and memory, and need their taint.
pub fn node_selector(launch: &Launch) -> Option<BTreeMap<String, String>> {
    let pool = launch.pool.as_ref().filter(|p| p.engine == "kubernetes")?;
    Some(pool.placement.clone()).filter(|p| launch.gpus_per_node > 0 && !p.is_empty())
}

/// GPU nodes are commonly tainted `nvidia.com/gpu:NoSchedule` (GPU
/// Operator, cloud GPU node pools) so that only pods that need GPUs land
/// there: GPU jobs tolerate that taint, whatever its value.
fn tolerations(launch: &Launch) -> Option<Vec<Toleration>> {
    (launch.gpus_per_node > 0).then(|| {
        vec![Toleration {
            key: Some(GPU_TAINT.to_string()),
            operator: Some("Exists".to_string()),
            effect: Some("NoSchedule".to_string()),
            ..Default::default()
        }]
    })
}

/// Training processes per pod: torchrun's workers, Horovod's slots.
fn procs_per_pod(launch: &Launch) -> u32 {
    match launch.launcher {
        Launcher::None => 1,
        Launcher::Torchrun { nproc_per_node } => nproc_per_node,
        Launcher::Horovod { slots_per_node } => slots_per_node,
    }
}

/// A container's `/dev/shm` is 64 MiB, too little for NCCL's shared-memory
/// transport between GPUs of one pod and for PyTorch's DataLoader workers:
/// GPU jobs, and jobs with several processes in a pod (they talk through
/// shared memory), get a memory-backed `emptyDir` there. Its pages count
/// against the pod's memory limit, which also bounds its size; one process
/// per pod without GPUs keeps the default.
pub fn needs_shm(launch: &Launch) -> bool {
    launch.gpus_per_node > 0 || procs_per_pod(launch) > 1
}

fn shm() -> (Volume, VolumeMount) {
    (
        Volume {
            name: SHM_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_string()),
                size_limit: None,
            }),
            ..Default::default()
        },
        VolumeMount {
            name: SHM_VOLUME.to_string(),
            mount_path: SHM_PATH.to_string(),
            ..Default::default()
        },
    )
}

fn labels(launch: &Launch) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JOB_ID.to_string(), label_value(&launch.job_id)),
        (LABEL_ATTEMPT.to_string(), launch.attempt.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "edgeloop-trainer-bridge".to_string(),
        ),
    ])
}

fn metadata(launch: &Launch, name: &str, settings: &Settings) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(settings.namespace.clone()),
        labels: Some(labels(launch)),
        annotations: Some(BTreeMap::from([(
            ANNOTATION_JOB_ID.to_string(),
            launch.job_id.clone(),
        )])),
        ..Default::default()
    }
}

/// The failure policy. `backoffLimit: 0` alone already ends the Job at the
/// first failed pod; these rules make that explicit for the two causes, and
/// give the `Failed` condition a message that names them (a preemption, or
/// the container and its exit code) instead of "BackoffLimitExceeded".
/// Disruptions are *not* `Ignore`d: an ignored disruption makes Kubernetes
/// start the pod again by itself, with the attempt's stale resume point (see
/// the module docs). A preemption therefore costs one of the job's restarts.
fn pod_failure_policy() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "FailJob".to_string(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".to_string(),
                    status: "True".to_string(),
                }]),
                on_exit_codes: None,
            },
            PodFailurePolicyRule {
                action: "FailJob".to_string(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(CONTAINER_NAME.to_string()),
                    operator: "NotIn".to_string(),
                    values: vec![0],
                }),
                on_pod_conditions: None,
            },
        ],
    }
}

/// The Job of one attempt (see the module docs).
pub fn build_job(launch: &Launch, settings: &Settings) -> Result<Job, EngineError> {
    let image = launch
        .image
        .as_deref()
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| {
            EngineError::Refused(
                "kubernetes needs an image: set `image` in the job spec (the container the \
                 command runs in)"
                    .to_string(),
            )
        })?;
    let name = object_name(&launch.job_id, launch.attempt);
    let nodes = i32::try_from(launch.nodes.max(1))
        .map_err(|_| EngineError::Refused(format!("{} nodes", launch.nodes)))?;
    let (words, env) = process(launch, &name)?;
    let (mut volumes, mut mounts) = volumes(launch, settings)?;
    if needs_shm(launch) {
        let (volume, mount) = shm();
        volumes.push(volume);
        mounts.push(mount);
    }
    let mut pod_labels = labels(launch);
    pod_labels.insert(LABEL_OBJECT.to_string(), name.clone());
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(image.to_string()),
        command: Some(words[..1].to_vec()),
        args: Some(words[1..].to_vec()).filter(|a| !a.is_empty()),
        env: Some(env).filter(|e| !e.is_empty()),
        working_dir: Some(utf8("working directory", &launch.workdir)?),
        resources: Some(resources(launch)),
        volume_mounts: Some(mounts).filter(|m| !m.is_empty()),
        ..Default::default()
    };
    Ok(Job {
        metadata: metadata(launch, &name, settings),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".to_string()),
            completions: Some(nodes),
            parallelism: Some(nodes),
            backoff_limit: Some(0),
            pod_failure_policy: Some(pod_failure_policy()),
            ttl_seconds_after_finished: Some(TTL_SECONDS_AFTER_FINISHED),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        ANNOTATION_JOB_ID.to_string(),
                        launch.job_id.clone(),
                    )])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_string()),
                    subdomain: Some(name.clone()),
                    // Service links would add variables for every Service in
                    // the namespace to the trainer's environment.
                    enable_service_links: Some(false),
                    containers: vec![container],
                    volumes: Some(volumes).filter(|v| !v.is_empty()),
                    node_selector: node_selector(launch),
                    tolerations: tolerations(launch),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// The headless Service that gives the Job's pods their DNS names.
pub fn build_service(launch: &Launch, settings: &Settings) -> Service {
    let name = object_name(&launch.job_id, launch.attempt);
    Service {
        metadata: metadata(launch, &name, settings),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(BTreeMap::from([(LABEL_OBJECT.to_string(), name.clone())])),
            // Rank 0 must resolve while the other pods are still starting.
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    }
}

/// Both objects of an attempt.
pub fn build(launch: &Launch, settings: &Settings) -> Result<Objects, EngineError> {
    Ok(Objects {
        job: build_job(launch, settings)?,
        service: build_service(launch, settings),
    })
}

fn condition<'a>(job: &'a Job, kind: &str) -> Option<&'a JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
}

/// The trainer container's exit code in a pod, when it ended with one.
fn exit_code_of(pod: &Pod) -> Option<(i32, Option<Time>)> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let st = statuses.iter().find(|s| s.name == CONTAINER_NAME)?;
    let term = st.state.as_ref()?.terminated.as_ref()?;
    Some((term.exit_code, term.finished_at.clone()))
}

/// The exit code behind a failed Job: the pod the condition's message
/// names, else the code the message gives, else the pod that failed first
/// (the others are often killed because of it).
pub fn failure_exit_code(message: &str, pods: &[Pod]) -> Option<i32> {
    let failed: Vec<(&Pod, i32, Option<_>)> = pods
        .iter()
        .filter_map(|p| exit_code_of(p).map(|(c, t)| (p, c, t)))
        .filter(|(_, c, _)| *c != 0)
        .collect();
    for (pod, code, _) in &failed {
        if let Some(name) = pod.metadata.name.as_deref() {
            if message.contains(&format!("/{name} ")) {
                return Some(*code);
            }
        }
    }
    if let Some(rest) = message.split("exit code ").nth(1) {
        let digits: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-')
            .collect();
        if let Ok(code) = digits.parse() {
            return Some(code);
        }
    }
    failed
        .iter()
        .min_by_key(|(_, _, finished)| (finished.is_none(), finished.clone()))
        .map(|(_, code, _)| *code)
}

/// The Job's state; `pods` are its pods (only read for a failed Job).
pub fn map_status(job: &Job, pods: &[Pod]) -> EngineState {
    if condition(job, "Complete").is_some() {
        return EngineState::Succeeded;
    }
    if let Some(c) = condition(job, "Failed") {
        let message = c.message.clone().unwrap_or_default();
        let reason = match (c.reason.as_deref(), message.is_empty()) {
            (Some(r), false) => format!("Kubernetes Job failed ({r}): {message}"),
            (Some(r), true) => format!("Kubernetes Job failed ({r})"),
            (None, false) => format!("Kubernetes Job failed: {message}"),
            (None, true) => "Kubernetes Job failed".to_string(),
        };
        return EngineState::Failed {
            exit_code: failure_exit_code(&message, pods),
            reason,
        };
    }
    let status = job.status.clone().unwrap_or_default();
    let started = status.ready.unwrap_or(0) > 0
        || status.succeeded.unwrap_or(0) > 0
        || status.failed.unwrap_or(0) > 0
        || condition(job, "FailureTarget").is_some();
    if started {
        EngineState::Running
    } else {
        EngineState::Pending
    }
}

/// Is this object one of `launch`'s (same job id and attempt)?
fn is_from(meta: &ObjectMeta, launch: &Launch) -> bool {
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_JOB_ID));
    let attempt = meta.labels.as_ref().and_then(|l| l.get(LABEL_ATTEMPT));
    annotation == Some(&launch.job_id) && attempt == Some(&launch.attempt.to_string())
}

/// How the engine reaches the API server.
#[derive(Clone)]
enum Source {
    Config(Box<kube::Config>),
    Kubeconfig(Box<kube::config::Kubeconfig>),
}

/// A Kubernetes cluster reached through its API server.
pub struct KubernetesEngine {
    source: Source,
    settings: Settings,
    /// Built on first use: kube's client needs a Tokio runtime, and loading a
    /// kubeconfig may run an exec plugin.
    client: tokio::sync::OnceCell<kube::Client>,
    /// Jobs this engine deleted: their absence means cancelled, not lost.
    cancelled: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for KubernetesEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Config(c) => format!("url {}", c.cluster_url),
            Source::Kubeconfig(_) => "kubeconfig".to_string(),
        };
        f.debug_struct("KubernetesEngine")
            .field("source", &source)
            .field("settings", &self.settings)
            .finish()
    }
}

const READ_TIMEOUT: Duration = Duration::from_secs(60);

fn unavailable(e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(e.to_string())
}

/// A kube error as an engine error.
fn api_error(what: &str, e: kube::Error) -> EngineError {
    match e {
        kube::Error::Api(s) => {
            let text = format!("{what}: HTTP {} {}: {}", s.code, s.reason, s.message);
            match s.code {
                404 => EngineError::NotFound(text),
                // The API server refused the object (invalid, forbidden,
                // over quota): submitting it again would not help.
                400 | 403 | 422 => EngineError::Refused(text),
                401 => EngineError::Unavailable(format!(
                    "{text} (are the credentials in {TOKEN_ENV} or the kubeconfig valid?)"
                )),
                429 | 500..=599 => EngineError::Unavailable(text),
                _ => EngineError::Protocol(text),
            }
        }
        kube::Error::SerdeError(e) => EngineError::Protocol(format!("{what}: {e}")),
        other => EngineError::Unavailable(format!("{what}: {other}")),
    }
}

fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl KubernetesEngine {
    /// An engine for the API server at `url` (`http://` or `https://`, with
    /// the system's roots), sending `token` as a bearer token.
    pub fn with_url(
        url: &str,
        token: Option<String>,
        settings: Settings,
    ) -> Result<Self, EngineError> {
        let url = url.trim().trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(EngineError::Unavailable(format!(
                "{API_URL_ENV} must start with http:// or https://, got {url:?}"
            )));
        }
        let uri = url
            .parse()
            .map_err(|e| EngineError::Unavailable(format!("{API_URL_ENV} {url:?}: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = settings.namespace.clone();
        config.read_timeout = Some(READ_TIMEOUT);
        if let Some(token) = token.filter(|t| !t.is_empty()) {
            config.auth_info.token = Some(token.into());
        }
        Self::new(Source::Config(Box::new(config)), settings)
    }

    /// An engine for the cluster of a kubeconfig (its current context).
    pub fn with_kubeconfig(
        kubeconfig: kube::config::Kubeconfig,
        settings: Settings,
    ) -> Result<Self, EngineError> {
        Self::new(Source::Kubeconfig(Box::new(kubeconfig)), settings)
    }

    fn new(source: Source, settings: Settings) -> Result<Self, EngineError> {
        if !is_dns_label(&settings.namespace) {
            return Err(EngineError::Unavailable(format!(
                "{NAMESPACE_ENV}: {:?} is not a namespace name",
                settings.namespace
            )));
        }
        Ok(Self {
            source,
            settings,
            client: tokio::sync::OnceCell::new(),
            cancelled: Mutex::new(HashSet::new()),
        })
    }

    /// From the environment (see the module docs). `jobs_root` is the
    /// bridge's `<data dir>/jobs`, what a checkpoint claim holds.
    pub fn from_env(jobs_root: &Path) -> Result<Self, EngineError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let settings = Settings {
            namespace: var(NAMESPACE_ENV).unwrap_or_else(|| "default".to_string()),
            volume: match var(CHECKPOINT_PVC_ENV) {
                Some(name) if is_dns_label(name.trim()) => SharedVolume::Claim {
                    name: name.trim().to_string(),
                    root: jobs_root.to_path_buf(),
                },
                Some(name) => {
                    return Err(EngineError::Unavailable(format!(
                        "{CHECKPOINT_PVC_ENV}: {name:?} is not a claim name"
                    )))
                }
                None => SharedVolume::HostPath,
            },
        };
        if let Some(url) = var(API_URL_ENV) {
            return Self::with_url(&url, var(TOKEN_ENV), settings);
        }
        if var(KUBECONFIG_ENV).is_some() {
            // Read now so a broken file is reported at start, not at the
            // first job.
            let kubeconfig = kube::config::Kubeconfig::read()
                .map_err(|e| EngineError::Unavailable(format!("{KUBECONFIG_ENV}: {e}")))?;
            return Self::with_kubeconfig(kubeconfig, settings);
        }
        Err(EngineError::Unavailable(format!(
            "neither {API_URL_ENV} nor {KUBECONFIG_ENV} is set"
        )))
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    async fn client(&self) -> Result<kube::Client, EngineError> {
        self.client
            .get_or_try_init(|| async {
                edgeloop_client_core::install_crypto_provider();
                let config = match &self.source {
                    Source::Config(c) => (**c).clone(),
                    Source::Kubeconfig(k) => {
                        let mut c = kube::Config::from_custom_kubeconfig(
                            (**k).clone(),
                            &kube::config::KubeConfigOptions::default(),
                        )
                        .await
                        .map_err(|e| unavailable(format!("loading the kubeconfig: {e}")))?;
                        c.read_timeout = Some(READ_TIMEOUT);
                        c
                    }
                };
                kube::Client::try_from(config)
                    .map_err(|e| unavailable(format!("building the Kubernetes client: {e}")))
            })
            .await
            .cloned()
    }

    async fn jobs(&self) -> Result<Api<Job>, EngineError> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.settings.namespace,
        ))
    }

    async fn services(&self) -> Result<Api<Service>, EngineError> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.settings.namespace,
        ))
    }

    async fn pods(&self) -> Result<Api<Pod>, EngineError> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.settings.namespace,
        ))
    }

    /// Every node, a page at a time.
    async fn nodes(&self) -> Result<Vec<Node>, EngineError> {
        let api: Api<Node> = Api::all(self.client().await?);
        let mut lp = ListParams::default().limit(NODE_PAGE);
        let mut items = Vec::new();
        for _ in 0..MAX_NODE_PAGES {
            let page = api.list(&lp).await.map_err(|e| match e {
                // Nodes are cluster-scoped: a namespace's Role cannot grant them.
                kube::Error::Api(s) if s.code == 403 => EngineError::Unavailable(format!(
                    "listing nodes: HTTP 403 {}: {} (the bridge's credentials need `list` on \
                     `nodes`, granted by a ClusterRole)",
                    s.reason, s.message
                )),
                e => api_error("listing nodes", e),
            })?;
            items.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => return Ok(items),
            }
        }
        Err(EngineError::Protocol(format!(
            "listing nodes: still more after {MAX_NODE_PAGES} pages of {NODE_PAGE}"
        )))
    }

    async fn pods_of(&self, name: &str) -> Result<Vec<Pod>, EngineError> {
        let list = self
            .pods()
            .await?
            .list(&ListParams::default().labels(&format!("{LABEL_OBJECT}={name}")))
            .await
            .map_err(|e| api_error("listing pods", e))?;
        Ok(list.items)
    }

    fn was_cancelled(&self, name: &str) -> bool {
        self.cancelled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(name)
    }

    /// Ties the Service's lifetime to the Job, so the Job's TTL removes both.
    async fn adopt_service(&self, name: &str, job: &Job) {
        let Some(uid) = job.metadata.uid.clone() else {
            return;
        };
        let owner = OwnerReference {
            api_version: "batch/v1".to_string(),
            kind: "Job".to_string(),
            name: name.to_string(),
            uid,
            ..Default::default()
        };
        let patch = serde_json::json!({"metadata": {"ownerReferences": [owner]}});
        let result = match self.services().await {
            Ok(api) => api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| api_error("patching the Service", e)),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            // Not fatal: cancel deletes the Service; only the TTL misses it.
            tracing::warn!(service = name, error = %e, "could not make the Job own its Service");
        }
    }
}

/// A name that can be one of ours; anything else never reaches a URL.
fn checked_name(id: &EngineJobId) -> Result<&str, EngineError> {
    if is_dns_label(&id.0) {
        Ok(&id.0)
    } else {
        Err(EngineError::NotFound(id.0.clone()))
    }
}

#[async_trait]
impl Engine for KubernetesEngine {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn submit(&self, launch: &Launch) -> Result<EngineJobId, EngineError> {
        let launch = absolutize(launch, &std::env::current_dir()?);
        let Objects { job, service } = build(&launch, &self.settings)?;
        let name = object_name(&launch.job_id, launch.attempt);
        let pp = PostParams::default();
        // The Service first, so `<name>-0.<name>` resolves when pods start.
        let services = self.services().await?;
        match services.create(&pp, &service).await {
            Ok(_) => {}
            Err(e) if is_already_exists(&e) => {
                let existing = services
                    .get(&name)
                    .await
                    .map_err(|e| api_error("reading the Service", e))?;
                if !is_from(&existing.metadata, &launch) {
                    return Err(EngineError::Refused(format!(
                        "a Service named {name} exists and is not job {}'s attempt {}",
                        launch.job_id, launch.attempt
                    )));
                }
            }
            Err(e) => return Err(api_error("creating the Service", e)),
        }
        let jobs = self.jobs().await?;
        let created = match jobs.create(&pp, &job).await {
            Ok(j) => j,
            Err(e) if is_already_exists(&e) => {
                // A retried submit of this attempt: the first one went through.
                let existing = jobs
                    .get(&name)
                    .await
                    .map_err(|e| api_error("reading the Job", e))?;
                if !is_from(&existing.metadata, &launch) {
                    return Err(EngineError::Refused(format!(
                        "a Job named {name} exists and is not job {}'s attempt {}",
                        launch.job_id, launch.attempt
                    )));
                }
                tracing::info!(job = %launch.job_id, attempt = launch.attempt, k8s_job = %name, "kubernetes: job already submitted");
                existing
            }
            Err(e) => return Err(api_error("creating the Job", e)),
        };
        self.adopt_service(&name, &created).await;
        tracing::info!(job = %launch.job_id, attempt = launch.attempt, k8s_job = %name, namespace = %self.settings.namespace, "submitted to Kubernetes");
        Ok(EngineJobId(name))
    }

    async fn status(&self, id: &EngineJobId) -> Result<EngineState, EngineError> {
        let name = checked_name(id)?;
        let job = match self.jobs().await?.get_opt(name).await {
            Ok(Some(job)) => job,
            Ok(None) if self.was_cancelled(name) => return Ok(EngineState::Cancelled),
            Ok(None) => return Err(EngineError::NotFound(id.0.clone())),
            Err(e) => return Err(api_error("reading the Job", e)),
        };
        if job.metadata.deletion_timestamp.is_some() {
            if self.was_cancelled(name) {
                return Ok(EngineState::Cancelled);
            }
            return Ok(EngineState::Failed {
                exit_code: None,
                reason: format!("the Kubernetes Job {name} was deleted (not by this bridge)"),
            });
        }
        let pods = if condition(&job, "Failed").is_some() {
            // Without the pods the failure is still reported, without a code.
            self.pods_of(name).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(map_status(&job, &pods))
    }

    async fn cancel(&self, id: &EngineJobId) -> Result<(), EngineError> {
        let name = checked_name(id)?;
        self.cancelled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_string());
        // Background: the Job goes now and its pods right after; the API's
        // default for Jobs would leave the pods running.
        let dp = DeleteParams::background();
        match self.jobs().await?.delete(name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error("deleting the Job", e)),
        }
        match self.services().await?.delete(name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error("deleting the Service", e)),
        }
        tracing::info!(k8s_job = name, "kubernetes: job deleted");
        Ok(())
    }

    async fn pools(&self) -> Result<Vec<NodePool>, EngineError> {
        Ok(nodes::pools(&self.nodes().await?))
    }

    async fn logs(&self, id: &EngineJobId) -> Result<String, EngineError> {
        let name = checked_name(id)?;
        let pods = self.pods_of(name).await?;
        let index = |p: &Pod| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INDEX_ANNOTATION))
                .cloned()
        };
        let first = pods
            .iter()
            .filter(|p| index(p).as_deref() == Some("0"))
            .max_by(|a, b| {
                a.metadata
                    .creation_timestamp
                    .cmp(&b.metadata.creation_timestamp)
            });
        let Some(pod) = first.and_then(|p| p.metadata.name.clone()) else {
            // No pod yet, or no more: an unknown Job is an error.
            return match self.jobs().await?.get_opt(name).await {
                Ok(Some(_)) => Ok(String::new()),
                Ok(None) if self.was_cancelled(name) => Ok(String::new()),
                Ok(None) => Err(EngineError::NotFound(id.0.clone())),
                Err(e) => Err(api_error("reading the Job", e)),
            };
        };
        let lp = LogParams {
            container: Some(CONTAINER_NAME.to_string()),
            tail_lines: Some(LOG_TAIL_LINES),
            limit_bytes: Some(MAX_LOG_BYTES),
            ..Default::default()
        };
        match self.pods().await?.logs(&pod, &lp).await {
            Ok(text) => Ok(text),
            // The container has not started yet (or the pod just went).
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 404 => Ok(String::new()),
            Err(e) => Err(api_error("reading the pod's log", e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const JOB_ID: &str = "train-1a2b3c4d";
    const CKPT: &str = "/data/jobs/train-1a2b3c4d/checkpoints";

    fn launch() -> Launch {
        Launch {
            job_id: JOB_ID.into(),
            attempt: 2,
            name: "train".into(),
            image: Some("pytorch/pytorch:2.3.0-cuda12.1".into()),
            command: vec![
                "python".into(),
                "train.py".into(),
                "--lr".into(),
                "$(HOME) $$ $".into(),
            ],
            env: BTreeMap::from([
                ("EDGELOOP_JOB_ID".to_string(), JOB_ID.to_string()),
                (CHECKPOINT_DIR.to_string(), CKPT.to_string()),
                ("MASTER_PORT".to_string(), "29511".to_string()),
                ("PRICE".to_string(), "$(NODE_RANK)$5".to_string()),
            ]),
            workdir: PathBuf::from("/data/jobs/train-1a2b3c4d"),
            nodes: 2,
            gpus_per_node: 4,
            cpus_per_node: 16,
            memory_mb: 64000,
            launcher: Launcher::Torchrun { nproc_per_node: 1 },
            log_path: PathBuf::from("/data/jobs/train-1a2b3c4d/attempt-2.log"),
            pool: None,
        }
    }

    /// One process per pod, no GPUs: no `/dev/shm` volume.
    fn cpu_launch() -> Launch {
        let mut l = launch();
        l.gpus_per_node = 0;
        l
    }

    fn a100_pool() -> NodePool {
        NodePool {
            engine: "kubernetes".into(),
            name: "NVIDIA-A100-SXM4-80GB".into(),
            nodes: Some(4),
            gpus_per_node: 8,
            gpu_type: Some("NVIDIA-A100-SXM4-80GB".into()),
            source: "kubernetes GET /api/v1/nodes (GPU Feature Discovery labels)".into(),
            placement: BTreeMap::from([(
                PRODUCT_LABEL.to_string(),
                "NVIDIA-A100-SXM4-80GB".to_string(),
            )]),
            ..NodePool::default()
        }
    }

    fn pod_spec(job: &Job) -> &PodSpec {
        job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn settings() -> Settings {
        Settings {
            namespace: "ml".into(),
            volume: SharedVolume::HostPath,
        }
    }

    /// The object as the API server receives it, and read back typed.
    fn wire<T: serde::Serialize + serde::de::DeserializeOwned>(obj: &T) -> (Value, T) {
        let v = serde_json::to_value(obj).unwrap();
        let back = serde_json::from_value(v.clone()).unwrap();
        (v, back)
    }

    fn job_of(l: &Launch) -> (Value, Job) {
        wire(&build_job(l, &settings()).unwrap())
    }

    fn container(job: &Job) -> &Container {
        &job.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
    }

    /// Plain values and downward-API paths of the container's env.
    fn env_of(job: &Job) -> BTreeMap<String, String> {
        container(job)
            .env
            .iter()
            .flatten()
            .map(|e| {
                let v = match (&e.value, &e.value_from) {
                    (Some(v), None) => v.clone(),
                    (None, Some(src)) => {
                        format!("field:{}", src.field_ref.as_ref().unwrap().field_path)
                    }
                    other => panic!("{}: {other:?}", e.name),
                };
                (e.name.clone(), v)
            })
            .collect()
    }

    #[test]
    fn the_job_is_indexed_one_pod_per_node_and_kubernetes_never_restarts_a_pod() {
        let (v, job) = job_of(&launch());
        let name = "train-1a2b3c4d-2";
        assert_eq!(job.metadata.name.as_deref(), Some(name));
        assert_eq!(job.metadata.namespace.as_deref(), Some("ml"));
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((spec.completions, spec.parallelism), (Some(2), Some(2)));
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(
            spec.ttl_seconds_after_finished,
            Some(TTL_SECONDS_AFTER_FINISHED)
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.subdomain.as_deref(), Some(name));
        assert_eq!(pod.enable_service_links, Some(false));
        // The wire names the API server reads.
        assert_eq!(v["spec"]["completionMode"], "Indexed");
        assert_eq!(v["spec"]["template"]["spec"]["restartPolicy"], "Never");
        assert_eq!(v["apiVersion"], "batch/v1");
        assert_eq!(v["kind"], "Job");

        let rules = &spec.pod_failure_policy.as_ref().unwrap().rules;
        assert_eq!(rules.len(), 2);
        assert!(rules.iter().all(|r| r.action == "FailJob"), "{rules:?}");
        let cond = &rules[0].on_pod_conditions.as_ref().unwrap()[0];
        assert_eq!(
            (cond.type_.as_str(), cond.status.as_str()),
            ("DisruptionTarget", "True")
        );
        let codes = rules[1].on_exit_codes.as_ref().unwrap();
        assert_eq!(codes.container_name.as_deref(), Some(CONTAINER_NAME));
        assert_eq!(
            (codes.operator.as_str(), codes.values.as_slice()),
            ("NotIn", &[0][..])
        );

        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_JOB_ID], JOB_ID);
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(
            job.metadata.annotations.as_ref().unwrap()[ANNOTATION_JOB_ID],
            JOB_ID
        );
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(pod_labels[LABEL_OBJECT], name);
        assert_eq!(pod_labels[LABEL_JOB_ID], JOB_ID);
        assert_eq!(pod_labels[LABEL_ATTEMPT], "2");

        let c = container(&job);
        assert_eq!(c.name, CONTAINER_NAME);
        assert_eq!(c.image.as_deref(), Some("pytorch/pytorch:2.3.0-cuda12.1"));
        assert_eq!(c.working_dir.as_deref(), Some("/data/jobs/train-1a2b3c4d"));
    }

    #[test]
    fn resources_table() {
        let q = |s: &str| Quantity(s.to_string());
        // (gpus, cpus, memory_mb) -> (requests, limits)
        type Map = Option<BTreeMap<String, Quantity>>;
        let cases: Vec<((u32, u32, u64), Map, Map)> = vec![
            (
                (4, 16, 64000),
                Some(BTreeMap::from([
                    ("cpu".into(), q("16")),
                    ("memory".into(), q("64000Mi")),
                ])),
                Some(BTreeMap::from([
                    ("cpu".into(), q("16")),
                    ("memory".into(), q("64000Mi")),
                    ("nvidia.com/gpu".into(), q("4")),
                ])),
            ),
            (
                (1, 0, 0),
                None,
                Some(BTreeMap::from([("nvidia.com/gpu".into(), q("1"))])),
            ),
            (
                (0, 2, 0),
                Some(BTreeMap::from([("cpu".into(), q("2"))])),
                Some(BTreeMap::from([("cpu".into(), q("2"))])),
            ),
            ((0, 0, 0), None, None),
        ];
        for ((gpus, cpus, mem), requests, limits) in cases {
            let mut l = launch();
            (l.gpus_per_node, l.cpus_per_node, l.memory_mb) = (gpus, cpus, mem);
            let (_, job) = job_of(&l);
            let r = container(&job).resources.clone().unwrap();
            assert_eq!(r.requests, requests, "{gpus} {cpus} {mem}");
            assert_eq!(r.limits, limits, "{gpus} {cpus} {mem}");
        }
    }

    #[test]
    fn torchrun_one_process_per_node_gets_the_rank_env_from_the_completion_index() {
        let (_, job) = job_of(&launch());
        let env = env_of(&job);
        let index = format!("field:metadata.annotations['{INDEX_ANNOTATION}']");
        let expect = [
            ("MASTER_ADDR", "train-1a2b3c4d-2-0.train-1a2b3c4d-2"),
            ("MASTER_PORT", "29511"),
            ("WORLD_SIZE", "2"),
            ("NNODES", "2"),
            ("NPROC_PER_NODE", "1"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("NODE_RANK", index.as_str()),
            ("RANK", index.as_str()),
            ("EDGELOOP_JOB_ID", JOB_ID),
            (CHECKPOINT_DIR, CKPT),
        ];
        for (k, v) in expect {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}: {env:?}");
        }
        let names: Vec<&str> = container(&job)
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "no variable twice: {names:?}");
        let c = container(&job);
        assert_eq!(c.command.as_deref(), Some(&["python".to_string()][..]));
    }

    #[test]
    fn torchrun_several_processes_per_node_runs_under_torchrun() {
        let mut l = launch();
        l.launcher = Launcher::Torchrun { nproc_per_node: 4 };
        let (_, job) = job_of(&l);
        let env = env_of(&job);
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env["NPROC_PER_NODE"], "4");
        assert!(env["NODE_RANK"].starts_with("field:"));
        assert!(
            !env.contains_key("RANK") && !env.contains_key("LOCAL_RANK"),
            "{env:?}"
        );
        let c = container(&job);
        let mut words = c.command.clone().unwrap();
        words.extend(c.args.clone().unwrap());
        assert_eq!(
            words[..8],
            [
                "torchrun",
                "--nnodes=2",
                "--nproc-per-node=4",
                "--node-rank=$(NODE_RANK)",
                "--master-addr=train-1a2b3c4d-2-0.train-1a2b3c4d-2",
                "--master-port=29511",
                "--no-python",
                "python",
            ]
        );
        // What the kubelet makes of it in pod 1.
        let mut pod_env: BTreeMap<String, String> = env.clone();
        pod_env.insert("NODE_RANK".into(), "1".into());
        let run: Vec<String> = words
            .iter()
            .map(|w| expand_like_kubernetes(w, &pod_env))
            .collect();
        assert_eq!(run[3], "--node-rank=1");
        assert_eq!(run[8..], ["train.py", "--lr", "$(HOME) $$ $"]);
    }

    #[test]
    fn launcher_none_and_horovod() {
        let mut l = launch();
        l.launcher = Launcher::None;
        let (_, job) = job_of(&l);
        let env = env_of(&job);
        assert!(!env.contains_key("MASTER_ADDR") && !env.contains_key("NODE_RANK"));
        assert_eq!(env["MASTER_PORT"], "29511", "the launch's own env stays");

        l.launcher = Launcher::Horovod { slots_per_node: 2 };
        l.nodes = 1;
        let (_, job) = job_of(&l);
        let c = container(&job);
        let mut words = c.command.clone().unwrap();
        words.extend(c.args.clone().unwrap());
        assert_eq!(words[..5], ["horovodrun", "-np", "2", "-H", "localhost:2"]);
        assert_eq!(words[5], "python");

        l.nodes = 3;
        match build_job(&l, &settings()) {
            Err(EngineError::Refused(m)) => assert!(m.contains("MPI"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_word_and_value_survives_kubernetes_expansion() {
        let words = [
            "$(HOME)",
            "$$",
            "$",
            "a$",
            "$$(X)",
            "$(",
            "$(NODE_RANK)",
            "${PATH}",
            "`x` 'y' \"z\"",
            "ünï $(WORLD_SIZE)",
        ];
        let mut l = launch();
        l.command = words.iter().map(|w| w.to_string()).collect();
        for w in words {
            l.env.insert(format!("V{}", l.env.len()), w.to_string());
        }
        let (_, job) = job_of(&l);
        let c = container(&job);
        // What the kubelet has when it expands: every variable defined.
        let mut defined = BTreeMap::new();
        for e in c.env.iter().flatten() {
            defined.insert(e.name.clone(), "EXPANDED".to_string());
        }
        defined.insert("HOME".into(), "EXPANDED".into());
        let mut run = c.command.clone().unwrap();
        run.extend(c.args.clone().unwrap_or_default());
        let run: Vec<String> = run
            .iter()
            .map(|w| expand_like_kubernetes(w, &defined))
            .collect();
        assert_eq!(run, words);
        for e in c.env.iter().flatten() {
            if let (Some(v), Some(given)) = (&e.value, l.env.get(&e.name)) {
                assert_eq!(&expand_like_kubernetes(v, &defined), given, "{}", e.name);
            }
        }
    }

    #[test]
    fn the_service_is_headless_and_names_the_pods_subdomain() {
        let (v, svc) = wire(&build_service(&launch(), &settings()));
        let (_, job) = job_of(&launch());
        let spec = svc.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(v["spec"]["clusterIP"], "None");
        assert_eq!(v["kind"], "Service");
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(svc.metadata.name, job.metadata.name);
        let template = &job.spec.as_ref().unwrap().template;
        assert_eq!(
            template.spec.as_ref().unwrap().subdomain,
            svc.metadata.name,
            "pods resolve as <job>-<i>.<service>"
        );
        let pod_labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (k, val) in spec.selector.as_ref().unwrap() {
            assert_eq!(pod_labels.get(k), Some(val), "the selector picks the pods");
        }
        assert!(is_from(&svc.metadata, &launch()));
        let mut other = launch();
        other.attempt = 3;
        assert!(!is_from(&svc.metadata, &other));
    }

    #[test]
    fn object_names_are_dns_labels_short_enough_for_pod_hostnames() {
        let long = "x".repeat(63) + "-0123abcd";
        let cases: Vec<(&str, u32, Option<&str>)> = vec![
            ("train-1a2b3c4d", 1, Some("train-1a2b3c4d-1")),
            ("train-1a2b3c4d", 12, Some("train-1a2b3c4d-12")),
            ("Train_Run.7", 1, None),
            ("7-runs-0000aaaa", 1, None),
            ("", 1, None),
            ("---", 4294967295, None),
            (&long, 4294967295, None),
            ("ü-only-ünicode", 1, None),
        ];
        let mut seen = HashSet::new();
        for (id, attempt, want) in cases {
            let name = object_name(id, attempt);
            assert!(is_dns_label(&name), "{id:?} -> {name:?}");
            assert!(name.len() <= MAX_NAME_LEN, "{name}");
            assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
            assert!(name.ends_with(&format!("-{attempt}")), "{name}");
            assert!(
                is_dns_label(&format!("{name}-{}", u32::MAX)),
                "the hostname of any pod index fits"
            );
            if let Some(w) = want {
                assert_eq!(name, w);
            }
            assert!(
                seen.insert(name.clone()),
                "distinct ids, distinct names: {name}"
            );
            assert_eq!(name, object_name(id, attempt), "deterministic");
        }
        // Ids that clean up to the same text still differ.
        assert_ne!(object_name("a_b-1", 1), object_name("a.b-1", 1));
        assert_ne!(object_name(&long, 1), object_name(&(long.clone() + "x"), 1));
    }

    #[test]
    fn label_values_table() {
        for (raw, want) in [
            ("train-1a2b3c4d", Some("train-1a2b3c4d")),
            ("A.b_c-9", Some("A.b_c-9")),
            ("", Some("")),
            ("-x", None),
            ("a b", None),
            (&*"y".repeat(70), None),
        ] {
            let v = label_value(raw);
            let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
            assert!(v.len() <= 63 && v.bytes().all(ok), "{raw:?} -> {v:?}");
            assert!(
                v.is_empty()
                    || (v.starts_with(|c: char| c.is_ascii_alphanumeric())
                        && v.ends_with(|c: char| c.is_ascii_alphanumeric())),
                "{v}"
            );
            if let Some(w) = want {
                assert_eq!(v, w);
            } else {
                assert!(v.ends_with(&short_hash(raw)), "{v}");
            }
        }
    }

    #[test]
    fn refusals() {
        let refused = |l: &Launch, needle: &str| match build(l, &settings()) {
            Err(EngineError::Refused(m)) => assert!(m.contains(needle), "{needle}: {m}"),
            other => panic!("{needle}: {other:?}"),
        };
        let mut l = launch();
        l.image = None;
        refused(&l, "kubernetes needs an image");
        l.image = Some("  ".into());
        refused(&l, "kubernetes needs an image");
        let mut l = launch();
        l.command.clear();
        refused(&l, "no command");
        let mut l = launch();
        l.command.push("a\0b".into());
        refused(&l, "NUL");
        let mut l = launch();
        l.env.insert("A=B".into(), "x".into());
        refused(&l, "not a valid environment variable name");
        let mut l = launch();
        l.env.insert("X".into(), "a\0".into());
        refused(&l, "NUL");
        let mut l = launch();
        l.launcher = Launcher::Torchrun { nproc_per_node: 0 };
        refused(&l, "nproc_per_node = 0");
        let mut l = launch();
        l.workdir = PathBuf::from("rel/dir");
        refused(&l, "must be absolute");
        let mut l = launch();
        l.launcher = Launcher::Horovod { slots_per_node: 0 };
        l.nodes = 1;
        refused(&l, "slots_per_node");
    }

    #[test]
    fn gpu_jobs_land_in_their_pool_tolerate_the_gpu_taint_and_get_shared_memory() {
        let nccl = [
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_IB_DISABLE", "1"),
        ];
        for launcher in [
            Launcher::None,
            Launcher::Torchrun { nproc_per_node: 1 },
            Launcher::Torchrun { nproc_per_node: 2 },
        ] {
            let mut l = launch();
            l.gpus_per_node = 2;
            l.launcher = launcher.clone();
            l.pool = Some(a100_pool());
            l.env
                .extend(nccl.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            let (v, job) = job_of(&l);
            let pod = pod_spec(&job);
            let limits = container(&job).resources.clone().unwrap().limits.unwrap();
            assert_eq!(limits[GPU_RESOURCE], Quantity("2".into()), "{launcher:?}");
            let wire_pod = &v["spec"]["template"]["spec"];
            assert_eq!(
                wire_pod["nodeSelector"],
                json!({PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}),
                "{launcher:?}"
            );
            assert_eq!(
                wire_pod["tolerations"],
                json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
                "{launcher:?}"
            );
            let shm = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == SHM_VOLUME)
                .unwrap();
            assert_eq!(
                shm.empty_dir.as_ref().unwrap().medium.as_deref(),
                Some("Memory")
            );
            assert_eq!(
                wire_pod["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == SHM_VOLUME)
                    .unwrap()["emptyDir"],
                json!({"medium": "Memory"})
            );
            // Every container of the template, so every pod of the Job, and
            // the torchrun workers that inherit its environment.
            assert!(!pod.containers.is_empty());
            for c in &pod.containers {
                let mounts = c.volume_mounts.as_ref().unwrap();
                assert!(
                    mounts
                        .iter()
                        .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm"),
                    "{mounts:?}"
                );
                let env: BTreeMap<&str, Option<&str>> = c
                    .env
                    .iter()
                    .flatten()
                    .map(|e| (e.name.as_str(), e.value.as_deref()))
                    .collect();
                for (k, want) in nccl {
                    assert_eq!(env.get(k), Some(&Some(want)), "{k} with {launcher:?}");
                }
            }
        }
    }

    #[test]
    fn jobs_without_gpus_are_not_pinned_and_get_no_gpu_extras() {
        // Placed in a GPU pool, the first one it fits: not pinned there.
        let mut l = cpu_launch();
        l.pool = Some(a100_pool());
        let (v, job) = job_of(&l);
        let pod = pod_spec(&job);
        assert_eq!(pod.node_selector, None);
        assert_eq!(pod.tolerations, None);
        assert!(v["spec"]["template"]["spec"]["nodeSelector"].is_null());
        assert!(!pod.volumes.iter().flatten().any(|v| v.name == SHM_VOLUME));
        let limits = container(&job).resources.clone().unwrap().limits.unwrap();
        assert!(!limits.contains_key(GPU_RESOURCE));

        // Several processes in one pod share memory: /dev/shm, no GPU taint.
        l.launcher = Launcher::Torchrun { nproc_per_node: 4 };
        let (_, job) = job_of(&l);
        let pod = pod_spec(&job);
        assert!(pod.volumes.iter().flatten().any(|v| v.name == SHM_VOLUME));
        assert_eq!(pod.tolerations, None);

        // A GPU job with no pool, or another engine's pool: no selector.
        let mut l = launch();
        assert_eq!(node_selector(&l), None);
        l.pool = Some(NodePool {
            engine: "slurm".into(),
            ..a100_pool()
        });
        assert_eq!(node_selector(&l), None);
        l.pool = Some(NodePool {
            placement: BTreeMap::new(),
            ..a100_pool()
        });
        assert_eq!(node_selector(&l), None, "a pool without a product label");
        let (_, job) = job_of(&l);
        assert_eq!(pod_spec(&job).tolerations.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn shared_directories_are_mounted_at_their_own_paths() {
        // The checkpoint dir inside the working dir: one hostPath mount.
        let (_, job) = job_of(&cpu_launch());
        let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let vols = pod.volumes.unwrap();
        assert_eq!(vols.len(), 1);
        let hp = vols[0].host_path.clone().unwrap();
        assert_eq!(hp.path, "/data/jobs/train-1a2b3c4d");
        assert_eq!(hp.type_.as_deref(), Some("DirectoryOrCreate"));
        let mounts = container(&job).volume_mounts.clone().unwrap();
        assert_eq!(mounts[0].mount_path, hp.path);
        assert_eq!(mounts[0].name, vols[0].name);

        // A working dir elsewhere: both.
        let mut l = cpu_launch();
        l.workdir = PathBuf::from("/src/project");
        let (_, job) = job_of(&l);
        let mounts: Vec<String> = container(&job)
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.clone())
            .collect();
        assert_eq!(mounts, [CKPT, "/src/project"]);

        // A claim that holds /data/jobs.
        let claim = Settings {
            namespace: "ml".into(),
            volume: SharedVolume::Claim {
                name: "edgeloop-jobs".into(),
                root: PathBuf::from("/data/jobs"),
            },
        };
        let job = build_job(&launch(), &claim).unwrap();
        let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let vols = pod.volumes.unwrap();
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "edgeloop-jobs"
        );
        let m = &container(&job).volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (m.mount_path.as_str(), m.sub_path.as_deref()),
            ("/data/jobs/train-1a2b3c4d", Some("train-1a2b3c4d"))
        );
        let mut l = launch();
        l.workdir = PathBuf::from("/elsewhere");
        match build_job(&l, &claim) {
            Err(EngineError::Refused(m)) => assert!(m.contains("not under /data/jobs"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn relative_paths_are_made_absolute_against_the_bridge_cwd() {
        let mut l = launch();
        l.workdir = PathBuf::from("data/jobs/x");
        l.env
            .insert(CHECKPOINT_DIR.into(), "data/jobs/x/checkpoints".into());
        l.env.insert(RESUME_FROM.into(), String::new());
        let a = absolutize(&l, Path::new("/srv/bridge"));
        assert_eq!(a.workdir, PathBuf::from("/srv/bridge/data/jobs/x"));
        assert_eq!(a.env[CHECKPOINT_DIR], "/srv/bridge/data/jobs/x/checkpoints");
        assert_eq!(a.env[RESUME_FROM], "", "empty stays empty: a first run");
        assert_eq!(absolutize(&launch(), Path::new("/srv")), launch());
    }

    fn job_with_status(status: Value) -> Job {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j-1"},
            "status": status,
        }))
        .unwrap()
    }

    fn failed_pod(name: &str, code: i32, finished: &str) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": CONTAINER_NAME, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "finishedAt": finished}}
            }]}
        }))
        .unwrap()
    }

    #[test]
    fn status_mapping_table() {
        let pods = vec![
            failed_pod("j-1-1-bbbbb", 143, "2026-01-01T00:00:09Z"),
            failed_pod("j-1-0-aaaaa", 3, "2026-01-01T00:00:05Z"),
        ];
        let cond = |t: &str, reason: &str, message: &str| json!({"conditions": [{"type": t, "status": "True", "reason": reason, "message": message}]});
        let cases: Vec<(Value, &[Pod], EngineState)> = vec![
            (json!({}), &[], EngineState::Pending),
            (json!({"active": 2, "ready": 0}), &[], EngineState::Pending),
            (json!({"active": 2, "ready": 1}), &[], EngineState::Running),
            (json!({"active": 1, "succeeded": 1}), &[], EngineState::Running),
            (
                json!({"active": 1, "conditions": [{"type": "FailureTarget", "status": "True"}]}),
                &[],
                EngineState::Running,
            ),
            (
                json!({"conditions": [{"type": "Suspended", "status": "True"}]}),
                &[],
                EngineState::Pending,
            ),
            (
                json!({"succeeded": 2, "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True"}]}),
                &[],
                EngineState::Succeeded,
            ),
            (
                json!({"conditions": [{"type": "Complete", "status": "False"}], "ready": 1}),
                &[],
                EngineState::Running,
            ),
            (
                cond(
                    "Failed",
                    "PodFailurePolicy",
                    "Container trainer for pod ml/j-1-0-aaaaa failed with exit code 3 matching FailJob rule at index 1",
                ),
                &pods,
                EngineState::Failed {
                    exit_code: Some(3),
                    reason: "Kubernetes Job failed (PodFailurePolicy): Container trainer for pod ml/j-1-0-aaaaa failed with exit code 3 matching FailJob rule at index 1".into(),
                },
            ),
            (
                cond("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                &pods,
                EngineState::Failed {
                    exit_code: Some(3),
                    reason: "Kubernetes Job failed (BackoffLimitExceeded): Job has reached the specified backoff limit".into(),
                },
            ),
            (
                cond(
                    "Failed",
                    "PodFailurePolicy",
                    "Pod ml/j-1-0-aaaaa has condition DisruptionTarget matching FailJob rule at index 0",
                ),
                &[],
                EngineState::Failed {
                    exit_code: None,
                    reason: "Kubernetes Job failed (PodFailurePolicy): Pod ml/j-1-0-aaaaa has condition DisruptionTarget matching FailJob rule at index 0".into(),
                },
            ),
            (
                cond(
                    "Failed",
                    "PodFailurePolicy",
                    "Container trainer for pod ml/gone failed with exit code 42 matching FailJob rule at index 1",
                ),
                &[],
                EngineState::Failed {
                    exit_code: Some(42),
                    reason: "Kubernetes Job failed (PodFailurePolicy): Container trainer for pod ml/gone failed with exit code 42 matching FailJob rule at index 1".into(),
                },
            ),
        ];
        for (status, pods, want) in cases {
            let job = job_with_status(status.clone());
            assert_eq!(map_status(&job, pods), want, "{status}");
        }
    }

    #[test]
    fn the_pod_named_in_the_message_wins_over_the_first_to_fail() {
        let pods = vec![
            failed_pod("j-1-0-aaaaa", 137, "2026-01-01T00:00:01Z"),
            failed_pod("j-1-1-bbbbb", 5, "2026-01-01T00:00:09Z"),
        ];
        assert_eq!(
            failure_exit_code(
                "Container trainer for pod ml/j-1-1-bbbbb failed with exit code 5 matching",
                &pods
            ),
            Some(5)
        );
        assert_eq!(failure_exit_code("", &pods), Some(137));
        assert_eq!(failure_exit_code("", &[]), None);
    }

    #[test]
    fn settings_are_checked() {
        let bad_ns = Settings {
            namespace: "Not_A_Namespace".into(),
            volume: SharedVolume::HostPath,
        };
        assert!(matches!(
            KubernetesEngine::with_url("http://127.0.0.1:1", None, bad_ns),
            Err(EngineError::Unavailable(_))
        ));
        assert!(matches!(
            KubernetesEngine::with_url("127.0.0.1:6443", None, settings()),
            Err(EngineError::Unavailable(_))
        ));
        let e = KubernetesEngine::with_url(
            "https://k8s.example:6443/",
            Some("secret-token".into()),
            settings(),
        )
        .unwrap();
        assert_eq!(e.name(), "kubernetes");
        let debug = format!("{e:?}");
        assert!(!debug.contains("secret-token"), "{debug}");
        assert!(debug.contains("k8s.example"), "{debug}");
        for bad in ["", "UPPER", "a/b", "../x", &"a".repeat(64)] {
            assert!(
                matches!(
                    checked_name(&EngineJobId(bad.into())),
                    Err(EngineError::NotFound(_))
                ),
                "{bad}"
            );
        }
    }
}
