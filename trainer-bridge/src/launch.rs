//! From a validated [`JobSpec`] to what an engine starts: the [`Launch`] of
//! one attempt, the checkpoint contract's environment, the per-process
//! torchrun environment and the horovodrun command line. All pure, so every
//! engine builds the same processes and the tables in the tests pin them.
//!
//! Environment precedence, lowest first: the user's `env`, the `nccl`
//! pass-through, the spec-derived `EDGELOOP_*` hints, the launcher's
//! `MASTER_PORT`, then the contract. Validation already refuses user keys in
//! the later groups, so the order only matters for hand-built specs; the
//! contract wins because the bridge's checkpoint handling depends on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::engines::{Launch, Launcher, NodePool, PinnedImage};
use crate::spec::{JobSpec, LauncherSpec, DEFAULT_MASTER_PORT};

pub const CHECKPOINT_DIR: &str = "EDGELOOP_CHECKPOINT_DIR";
pub const RESUME_FROM: &str = "EDGELOOP_RESUME_FROM";
pub const JOB_ID: &str = "EDGELOOP_JOB_ID";
pub const REPORT_URL: &str = "EDGELOOP_REPORT_URL";
pub const ATTEMPT: &str = "EDGELOOP_ATTEMPT";
/// Spec-derived hints: the checkpoint cadence the trainer must follow, and
/// the parts of the spec that only the training code can act on.
pub const CHECKPOINT_EVERY_STEPS: &str = "EDGELOOP_CHECKPOINT_EVERY_STEPS";
pub const CHECKPOINT_EVERY_MINUTES: &str = "EDGELOOP_CHECKPOINT_EVERY_MINUTES";
pub const PRECISION: &str = "EDGELOOP_PRECISION";
/// JSON array of strings (URIs may hold commas).
pub const DATASETS: &str = "EDGELOOP_DATASETS";
/// JSON object, as given in the spec.
pub const HYPERPARAMETERS: &str = "EDGELOOP_HYPERPARAMETERS";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// The environment is UTF-8 text; a lossy conversion would point the
    /// trainer at another directory.
    #[error("{what} path is not UTF-8: {path:?}")]
    NotUtf8 { what: &'static str, path: PathBuf },
    #[error("rank: {0}")]
    Rank(String),
    #[error("horovod hosts: {0}")]
    Hosts(String),
}

/// The checkpoint contract's variables for one attempt. `resume_from` is
/// `None` on a first run, which the contract spells as an empty string so a
/// trainer can test `if os.environ["EDGELOOP_RESUME_FROM"]`.
pub fn contract_env(
    job_id: &str,
    attempt: u32,
    checkpoint_dir: &Path,
    resume_from: Option<&Path>,
    report_url: &str,
) -> Result<BTreeMap<String, String>, LaunchError> {
    let utf8 = |what: &'static str, path: &Path| {
        path.to_str()
            .map(str::to_string)
            .ok_or_else(|| LaunchError::NotUtf8 {
                what,
                path: path.to_path_buf(),
            })
    };
    let resume = match resume_from {
        Some(p) => utf8("resume", p)?,
        None => String::new(),
    };
    Ok(BTreeMap::from([
        (
            CHECKPOINT_DIR.to_string(),
            utf8("checkpoint", checkpoint_dir)?,
        ),
        (RESUME_FROM.to_string(), resume),
        (JOB_ID.to_string(), job_id.to_string()),
        (REPORT_URL.to_string(), report_url.to_string()),
        (ATTEMPT.to_string(), attempt.to_string()),
    ]))
}

/// Where an attempt runs, besides the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptPlan<'a> {
    pub job_id: &'a str,
    pub attempt: u32,
    /// The job's directory on the nodes; a relative `working_dir` is resolved
    /// against it.
    pub job_dir: &'a Path,
    pub log_path: &'a Path,
    /// From [`contract_env`].
    pub contract: &'a BTreeMap<String, String>,
    /// The pool the pre-flight check placed the job in.
    pub pool: Option<&'a NodePool>,
    /// The job's image as the engine pinned it.
    pub pinned_image: Option<&'a PinnedImage>,
}

/// The [`Launch`] of one attempt of `spec`.
pub fn build_launch(spec: &JobSpec, plan: &AttemptPlan<'_>) -> Launch {
    let gpus = spec.resources.gpus_per_node;
    let launcher = match &spec.launcher {
        LauncherSpec::None {} => Launcher::None,
        LauncherSpec::Torchrun { .. } => Launcher::Torchrun {
            nproc_per_node: spec.launcher.procs_per_node(gpus),
        },
        LauncherSpec::Horovod { .. } => Launcher::Horovod {
            slots_per_node: spec.launcher.procs_per_node(gpus),
        },
    };
    let workdir = match &spec.working_dir {
        Some(dir) => plan.job_dir.join(dir),
        None => plan.job_dir.to_path_buf(),
    };
    Launch {
        job_id: plan.job_id.to_string(),
        attempt: plan.attempt,
        name: spec.name.clone(),
        image: spec.image.clone(),
        pinned_image: plan.pinned_image.cloned(),
        command: spec.command.iter().chain(&spec.args).cloned().collect(),
        env: job_env(spec, plan.contract),
        workdir,
        // A pool with fewer nodes than asked (its facts) runs an elastic
        // job at its size; the pre-flight check refused one too small.
        nodes: nodes_to_run(
            spec.resources.nodes,
            spec.resources.min_nodes,
            plan.pool.and_then(|p| p.nodes),
        ),
        min_nodes: spec.resources.min_nodes,
        gpus_per_node: gpus,
        cpus_per_node: spec.resources.cpus,
        memory_mb: spec.resources.memory_mb,
        launcher,
        log_path: plan.log_path.to_path_buf(),
        pool: plan.pool.cloned(),
    }
}

/// How many nodes an attempt runs on: `nodes`, or as many as are
/// `available` when that is fewer but at least `min_nodes` (an elastic job
/// continues at a smaller world size). `None` available: not bounded. Fewer
/// than `min_nodes` available: `nodes`, and the engine waits or refuses as
/// for any job that does not fit.
pub fn nodes_to_run(nodes: u32, min_nodes: Option<u32>, available: Option<u32>) -> u32 {
    match (min_nodes, available) {
        (Some(min), Some(free)) if (min..nodes).contains(&free) => free,
        _ => nodes,
    }
}

/// The environment shared by every process of the job (see the module docs
/// for the precedence).
pub fn job_env(spec: &JobSpec, contract: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = spec.env.clone();
    env.extend(spec.nccl.clone());
    if let Some(steps) = spec.checkpoint.every_steps {
        env.insert(CHECKPOINT_EVERY_STEPS.into(), steps.to_string());
    }
    if let Some(minutes) = spec.checkpoint.every_minutes {
        env.insert(CHECKPOINT_EVERY_MINUTES.into(), minutes.to_string());
    }
    if let Some(precision) = spec.precision {
        env.insert(PRECISION.into(), precision.as_str().into());
    }
    if !spec.datasets.is_empty() {
        env.insert(DATASETS.into(), json_text(&spec.datasets));
    }
    if !spec.hyperparameters.is_empty() {
        env.insert(HYPERPARAMETERS.into(), json_text(&spec.hyperparameters));
    }
    // The port is the same for every rank, and `Launch` has no field for it:
    // engines read it back with `master_port`.
    if let LauncherSpec::Torchrun { master_port, .. } = spec.launcher {
        env.insert("MASTER_PORT".into(), master_port.to_string());
    }
    env.extend(contract.clone());
    env
}

fn json_text<T: serde::Serialize>(value: &T) -> String {
    // Strings and serde_json values always serialize.
    serde_json::to_string(value).unwrap_or_default()
}

/// The rendezvous port of a torchrun launch.
pub fn master_port(launch: &Launch) -> u16 {
    launch
        .env
        .get("MASTER_PORT")
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_MASTER_PORT)
}

/// Where one torchrun process sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Node 0's address, reachable from every node.
    pub master_addr: String,
    pub master_port: u16,
    pub nnodes: u32,
    pub nproc_per_node: u32,
    pub node_rank: u32,
    pub local_rank: u32,
}

/// The variables `torchrun` would set for this process (plus NODE_RANK, which
/// torchrun takes as a flag and scripts commonly read).
pub fn torchrun_env(rank: &RankInfo) -> Result<BTreeMap<String, String>, LaunchError> {
    if rank.nnodes == 0 || rank.nproc_per_node == 0 {
        return Err(LaunchError::Rank(
            "nnodes and nproc_per_node must be at least 1".into(),
        ));
    }
    if rank.node_rank >= rank.nnodes {
        return Err(LaunchError::Rank(format!(
            "node_rank {} is not below nnodes {}",
            rank.node_rank, rank.nnodes
        )));
    }
    if rank.local_rank >= rank.nproc_per_node {
        return Err(LaunchError::Rank(format!(
            "local_rank {} is not below nproc_per_node {}",
            rank.local_rank, rank.nproc_per_node
        )));
    }
    if rank.master_addr.is_empty() {
        return Err(LaunchError::Rank("master_addr is empty".into()));
    }
    // u32 * u32 fits in u64; ranks of that size are refused by the spec's
    // limits long before, but the arithmetic stays exact.
    let world = u64::from(rank.nnodes) * u64::from(rank.nproc_per_node);
    let global =
        u64::from(rank.node_rank) * u64::from(rank.nproc_per_node) + u64::from(rank.local_rank);
    Ok(BTreeMap::from([
        ("MASTER_ADDR".to_string(), rank.master_addr.clone()),
        ("MASTER_PORT".to_string(), rank.master_port.to_string()),
        ("WORLD_SIZE".to_string(), world.to_string()),
        ("RANK".to_string(), global.to_string()),
        ("LOCAL_RANK".to_string(), rank.local_rank.to_string()),
        (
            "LOCAL_WORLD_SIZE".to_string(),
            rank.nproc_per_node.to_string(),
        ),
        ("NNODES".to_string(), rank.nnodes.to_string()),
        (
            "NPROC_PER_NODE".to_string(),
            rank.nproc_per_node.to_string(),
        ),
        ("NODE_RANK".to_string(), rank.node_rank.to_string()),
    ]))
}

/// `horovodrun -np N -H host1:slots,host2:slots CMD...`, run once on the
/// first host; horovodrun starts the other ranks over SSH/MPI.
pub fn horovod_command(
    hosts: &[String],
    slots_per_node: u32,
    command: &[String],
) -> Result<Vec<String>, LaunchError> {
    if hosts.is_empty() {
        return Err(LaunchError::Hosts("no hosts".into()));
    }
    if slots_per_node == 0 {
        return Err(LaunchError::Hosts(
            "slots_per_node must be at least 1".into(),
        ));
    }
    if command.is_empty() {
        return Err(LaunchError::Hosts("no command to run".into()));
    }
    for host in hosts {
        // `,` and `:` are -H's separators; whitespace would split the argument
        // if anything ever passes it through a shell.
        if host.is_empty()
            || host
                .chars()
                .any(|c| c == ',' || c == ':' || c.is_whitespace() || c.is_control())
        {
            return Err(LaunchError::Hosts(format!(
                "{host:?} is not a host name usable in -H"
            )));
        }
    }
    let np = hosts.len() as u64 * u64::from(slots_per_node);
    let host_list = hosts
        .iter()
        .map(|h| format!("{h}:{slots_per_node}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut argv = vec![
        "horovodrun".to_string(),
        "-np".to_string(),
        np.to_string(),
        "-H".to_string(),
        host_list,
    ];
    argv.extend(command.iter().cloned());
    Ok(argv)
}
