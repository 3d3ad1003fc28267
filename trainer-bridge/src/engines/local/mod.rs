//! The embedded engine: the job's processes run on this machine. A job with
//! `nodes = N` starts N process groups, one per "node", with the launcher's
//! rank environment, so multi-node contracts can be exercised without a
//! cluster.
//!
//! Each submission gets a state directory holding the process group ids and,
//! once a rank exits, its exit code (written by a `sh` wrapper). State is
//! read from those files, so a restarted bridge re-adopts what is running
//! instead of starting it again. A job with an `image` runs each process in
//! a container of the configured runtime under the same wrapper
//! ([`container`]).

pub mod container;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use edgeloop_client_core::gpu::LocalGpus;

use super::{
    Engine, EngineError, EngineJobId, EngineState, Launch, Launcher, NodePool, PinnedImage,
};
use container::{ContainerRun, ContainerRuntime};

/// Reads this machine's GPUs again (`nvidia-smi`, or the injected facts).
pub type GpuSource = Arc<dyn Fn() -> anyhow::Result<LocalGpus> + Send + Sync>;

pub struct LocalEngine {
    state_dir: PathBuf,
    /// The GPUs as last read.
    gpus: RwLock<LocalGpus>,
    /// Where they are read again, at every facts refresh and submission, so
    /// a GPU that fell off the bus is no longer handed out; `None`: fixed.
    gpu_source: Option<GpuSource>,
    /// What runs a job's `image`; `None`: such a job is refused.
    container: Option<ContainerRuntime>,
    /// Serializes submissions, so two jobs never pick the same free GPU.
    allocating: tokio::sync::Mutex<()>,
}

impl LocalEngine {
    /// An engine with this machine's GPUs as `nvidia-smi` reports them.
    pub fn new(state_dir: &Path) -> std::io::Result<Self> {
        Self::with_gpus(state_dir, LocalGpus::detect())
    }

    /// An engine with the given GPUs (injected facts, or none).
    pub fn with_gpus(state_dir: &Path, gpus: LocalGpus) -> std::io::Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        Ok(Self {
            state_dir: state_dir.to_path_buf(),
            gpus: RwLock::new(gpus),
            gpu_source: None,
            container: None,
            allocating: tokio::sync::Mutex::new(()),
        })
    }

    /// The engine running jobs with an image in containers of `runtime`.
    pub fn with_container(self, runtime: Option<ContainerRuntime>) -> Self {
        Self {
            container: runtime,
            ..self
        }
    }

    /// The engine reading its GPUs from `source` each time it needs them.
    pub fn with_gpu_source(self, source: Option<GpuSource>) -> Self {
        Self {
            gpu_source: source,
            ..self
        }
    }

    /// This machine's GPUs now: read again where there is a source (a read
    /// that fails keeps the last answer, and says so).
    async fn current_gpus(&self) -> LocalGpus {
        if let Some(source) = self.gpu_source.clone() {
            match tokio::task::spawn_blocking(move || source()).await {
                Ok(Ok(gpus)) => {
                    *self.gpus.write().unwrap_or_else(PoisonError::into_inner) = gpus;
                }
                Ok(Err(e)) => tracing::warn!("reading this machine's GPUs again: {e:#}"),
                Err(e) => tracing::warn!("reading this machine's GPUs again: {e}"),
            }
        }
        self.gpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn runtime(&self) -> Result<&ContainerRuntime, EngineError> {
        self.container.as_ref().ok_or_else(|| {
            EngineError::Refused(format!(
                "image: the local engine runs an image only with a container runtime \
                 (--container-runtime or {}: podman or docker)",
                container::RUNTIME_ENV
            ))
        })
    }

    /// Removes the containers of `id`'s processes, in the background (a
    /// container gets `grace_seconds` after SIGTERM to end by itself). Once
    /// one is gone its name file goes too, so a later status poll of the
    /// same attempt starts no second removal.
    fn remove_containers(&self, dir: &Path, nodes: i32, grace_seconds: u32) {
        let Some(runtime) = self.container.clone() else {
            return;
        };
        for node in 0..nodes {
            let file = dir.join(format!("container-{node}"));
            if let Ok(name) = std::fs::read_to_string(&file) {
                let runtime = runtime.clone();
                tokio::spawn(async move {
                    if runtime.remove(name.trim(), grace_seconds).await {
                        let _ = std::fs::remove_file(file);
                    }
                });
            }
        }
    }

    /// GPU indexes held by submissions that are still running. A
    /// submission's devices are in its `gpus` file, written before its
    /// processes start, so a restarted bridge still knows them.
    async fn busy_gpus(&self) -> Result<BTreeSet<u32>, EngineError> {
        let mut busy = BTreeSet::new();
        for entry in std::fs::read_dir(&self.state_dir)? {
            let entry = entry?;
            let Some(held) = std::fs::read_to_string(entry.path().join(GPUS_FILE)).ok() else {
                continue;
            };
            let id = EngineJobId(entry.file_name().to_string_lossy().into_owned());
            if matches!(
                self.status(&id).await,
                Ok(EngineState::Running | EngineState::Pending)
            ) {
                busy.extend(held.split(',').filter_map(|i| i.trim().parse::<u32>().ok()));
            }
        }
        Ok(busy)
    }

    /// The free GPUs of the pool's type, and how many GPUs the machine has.
    async fn free_gpus(&self, launch: &Launch) -> Result<(Vec<u32>, usize), EngineError> {
        let wanted_type = launch.pool.as_ref().and_then(|p| p.gpu_type.as_deref());
        let busy = self.busy_gpus().await?;
        let gpus = self.current_gpus().await;
        let free = gpus
            .gpus
            .iter()
            .filter(|g| wanted_type.is_none_or(|t| g.name == t))
            .map(|g| g.index)
            .filter(|i| !busy.contains(i))
            .collect();
        Ok((free, gpus.gpus.len()))
    }

    /// `launch` at the nodes its free GPUs hold, where it is elastic
    /// (`min_nodes`) and fewer than it asks for are free.
    async fn fit_to_free_gpus<'a>(
        &self,
        launch: &'a Launch,
    ) -> Result<Cow<'a, Launch>, EngineError> {
        if launch.gpus_per_node == 0 || launch.min_nodes.is_none() {
            return Ok(Cow::Borrowed(launch));
        }
        let (free, _) = self.free_gpus(launch).await?;
        let fit = u32::try_from(free.len()).unwrap_or(u32::MAX) / launch.gpus_per_node;
        let nodes = crate::launch::nodes_to_run(launch.nodes, launch.min_nodes, Some(fit));
        if nodes == launch.nodes {
            return Ok(Cow::Borrowed(launch));
        }
        tracing::info!(
            job = %launch.job_id,
            attempt = launch.attempt,
            "runs on {nodes} of its {} nodes: {} GPUs are free",
            launch.nodes,
            free.len()
        );
        Ok(Cow::Owned(Launch {
            nodes,
            ..launch.clone()
        }))
    }

    /// Picks `per_node` free GPUs of the pool's type for each of `nodes`
    /// process groups; the groups' `CUDA_VISIBLE_DEVICES`.
    async fn allocate(&self, launch: &Launch) -> Result<Vec<Vec<u32>>, EngineError> {
        let per_node = launch.gpus_per_node as usize;
        let groups = launch.nodes.max(1) as usize;
        let (free, total) = self.free_gpus(launch).await?;
        let need = per_node * groups;
        if free.len() < need {
            return Err(EngineError::Unavailable(format!(
                "needs {need} free GPUs on this machine, {} of {total} are free",
                free.len(),
            )));
        }
        Ok(free[..need].chunks(per_node).map(<[u32]>::to_vec).collect())
    }

    fn dir(&self, id: &EngineJobId) -> Result<PathBuf, EngineError> {
        // Ids are ours (job id + attempt), but never let one walk out of the state dir.
        if id.0.is_empty()
            || !id
                .0
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(EngineError::NotFound(id.0.clone()));
        }
        Ok(self.state_dir.join(&id.0))
    }
}

/// Marks an attempt whose remains the bridge stopped ([`Engine::stop_remains`]).
const STOPPED_FILE: &str = "stopped";

/// 128 + SIGTERM: how a process stopped by SIGTERM exits (a shell's `$?`,
/// a container runtime's exit code).
const EXIT_SIGTERM: i32 = 143;

/// Why process `node` counts as preempted: it ended after a SIGTERM the
/// bridge did not send (a cancel marks the attempt first, and is checked
/// before this), to its group (the wrapper's mark) or to it alone (exit
/// code 143, e.g. `podman stop` of its container). A trainer that
/// checkpoints on SIGTERM loses nothing.
fn stopped_from_outside(dir: &Path, node: i32, exit: Option<i32>) -> Option<String> {
    let exit = exit?;
    if dir.join(STOPPED_FILE).exists() {
        return None;
    }
    let marked = dir.join(format!("exit-{node}.term")).exists();
    (marked || exit == EXIT_SIGTERM).then(|| {
        format!(
            "node {node} was stopped by a SIGTERM the bridge did not send, and exited with {exit}"
        )
    })
}

/// The file in a submission's state dir that lists the GPUs it holds.
const GPUS_FILE: &str = "gpus";

/// How long a cancelled job's container has after SIGTERM before it is
/// killed: time for a trainer to write a checkpoint.
const CONTAINER_GRACE_SECONDS: u32 = 10;

/// This machine as a pool per GPU product (one pool, `local`, for a machine
/// with one kind of GPU or none).
pub fn local_pools(gpus: &LocalGpus) -> Vec<NodePool> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let mut products: Vec<(&str, u32, u64)> = Vec::new();
    for g in &gpus.gpus {
        match products.iter_mut().find(|(name, _, _)| *name == g.name) {
            Some(p) => p.1 += 1,
            None => products.push((&g.name, 1, g.memory_bytes)),
        }
    }
    let pool = |name: String, count: u32, gpu: Option<(&str, u64)>| NodePool {
        engine: "local".into(),
        name,
        nodes: None,
        gpus_per_node: count,
        gpu_type: gpu.map(|(t, _)| t.to_string()),
        gpu_memory_bytes: gpu.map(|(_, m)| m).filter(|&m| m > 0),
        driver_version: gpus.driver_version.clone(),
        cuda_version: gpus.cuda_version.clone(),
        cpus_per_node: cpus,
        memory_mb_per_node: 0,
        source: gpus.source.clone(),
        placement: BTreeMap::new(),
        containers: vec![],
    };
    match products.as_slice() {
        [] => vec![pool("local".into(), 0, None)],
        [(name, count, mem)] => vec![pool("local".into(), *count, Some((name, *mem)))],
        many => many
            .iter()
            .map(|(name, count, mem)| pool(format!("local:{name}"), *count, Some((name, *mem))))
            .collect(),
    }
}

/// The environment of every process the launch starts on this machine, in
/// rank order. `torchrun` starts `nproc_per_node` processes on each node, so
/// the local engine does the same: one process per rank, each with its own
/// `RANK`/`LOCAL_RANK` (a job with fewer processes than `WORLD_SIZE` would
/// hang at rendezvous). `none` and Horovod start one process per node.
pub fn process_envs(launch: &Launch) -> Result<Vec<BTreeMap<String, String>>, EngineError> {
    let nodes = launch.nodes.max(1);
    let mut out = Vec::new();
    match launch.launcher {
        Launcher::None => out.extend((0..nodes).map(|_| launch.env.clone())),
        Launcher::Torchrun { nproc_per_node } => {
            let nproc = nproc_per_node.max(1);
            for node_rank in 0..nodes {
                for local_rank in 0..nproc {
                    let rank = crate::launch::torchrun_env(&crate::launch::RankInfo {
                        master_addr: "127.0.0.1".into(),
                        master_port: master_port(&launch.job_id),
                        nnodes: nodes,
                        nproc_per_node: nproc,
                        node_rank,
                        local_rank,
                    })
                    .map_err(|e| EngineError::Refused(e.to_string()))?;
                    let mut env = launch.env.clone();
                    env.extend(rank);
                    out.push(env);
                }
            }
        }
        Launcher::Horovod { slots_per_node } => {
            let nproc = slots_per_node.max(1);
            for node in 0..nodes {
                let mut env = launch.env.clone();
                env.insert("MASTER_ADDR".into(), "127.0.0.1".into());
                env.insert(
                    "MASTER_PORT".into(),
                    master_port(&launch.job_id).to_string(),
                );
                env.insert("NNODES".into(), nodes.to_string());
                env.insert("NODE_RANK".into(), node.to_string());
                env.insert("NPROC_PER_NODE".into(), nproc.to_string());
                env.insert("WORLD_SIZE".into(), (nodes * nproc).to_string());
                env.insert("RANK".into(), (node * nproc).to_string());
                env.insert("LOCAL_RANK".into(), "0".into());
                out.push(env);
            }
        }
    }
    Ok(out)
}

/// The "node" (process group) of each process [`process_envs`] returns, in
/// the same order: torchrun starts `nproc_per_node` processes per node.
pub fn process_nodes(launch: &Launch) -> Vec<usize> {
    let nodes = launch.nodes.max(1) as usize;
    match launch.launcher {
        Launcher::Torchrun { nproc_per_node } => (0..nodes)
            .flat_map(|n| std::iter::repeat_n(n, nproc_per_node.max(1) as usize))
            .collect(),
        Launcher::None | Launcher::Horovod { .. } => (0..nodes).collect(),
    }
}

/// A port derived from the job id, in the dynamic range, so ranks agree on
/// it without talking.
pub fn master_port(job_id: &str) -> u16 {
    let h = job_id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    29_500 + (h % 20_000) as u16
}

fn read_i32(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn alive(pgid: i32) -> bool {
    // Signal 0 checks for existence without touching the group.
    killpg(Pid::from_raw(pgid), None).is_ok()
}

#[async_trait]
impl Engine for LocalEngine {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn pin_image(
        &self,
        reference: &str,
        earlier: Option<&PinnedImage>,
    ) -> Result<Option<PinnedImage>, EngineError> {
        self.runtime()?.pin(reference, earlier).await.map(Some)
    }

    async fn submit(&self, launch: &Launch) -> Result<EngineJobId, EngineError> {
        if launch.command.is_empty() {
            return Err(EngineError::Refused("empty command".into()));
        }
        let id = EngineJobId(format!("{}-a{}", launch.job_id, launch.attempt));
        let dir = self.dir(&id)?;
        if dir.join("nodes").exists() {
            // Submitted before (e.g. by this bridge before it restarted).
            return Ok(id);
        }
        std::fs::create_dir_all(&dir)?;
        if let Some(parent) = launch.log_path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::create_dir_all(&launch.workdir)?;
        let image = match &launch.image {
            None => None,
            Some(reference) => {
                let runtime = self.runtime()?;
                // A hand-built launch may come unpinned; the job loop pins
                // before the first attempt.
                let pin = match &launch.pinned_image {
                    Some(pin) => pin.clone(),
                    None => runtime.pin(reference, None).await?,
                };
                let runnable = pin.runnable();
                std::fs::write(dir.join("image"), &runnable)?;
                Some((runtime, runnable))
            }
        };
        let _allocating = self.allocating.lock().await;
        let launch = &*self.fit_to_free_gpus(launch).await?;
        let mut envs = process_envs(launch)?;
        let mut held_by: Vec<Vec<u32>> = vec![Vec::new(); envs.len()];
        if launch.gpus_per_node > 0 {
            let groups = self.allocate(launch).await?;
            let held: Vec<String> = groups.iter().flatten().map(u32::to_string).collect();
            std::fs::write(dir.join(GPUS_FILE), held.join(","))?;
            for ((env, node), held) in envs
                .iter_mut()
                .zip(process_nodes(launch))
                .zip(held_by.iter_mut())
            {
                *held = groups[node].clone();
                // In a container the devices it was given are numbered from 0.
                let visible: Vec<String> = if image.is_some() {
                    (0..groups[node].len()).map(|i| i.to_string()).collect()
                } else {
                    groups[node].iter().map(u32::to_string).collect()
                };
                env.insert("CUDA_VISIBLE_DEVICES".into(), visible.join(","));
            }
        } else {
            // A CPU job sees no GPU, rather than every GPU of the machine.
            for env in &mut envs {
                env.entry("CUDA_VISIBLE_DEVICES".into()).or_default();
            }
        }
        // A container sees the job's directories at their host paths.
        let mounts = match &image {
            None => Vec::new(),
            Some(_) => {
                // A bind mount needs its source to exist.
                if let Some(c) = launch
                    .env
                    .get(crate::launch::CHECKPOINT_DIR)
                    .filter(|v| !v.is_empty())
                {
                    std::fs::create_dir_all(c)?;
                }
                container::job_mounts(launch, &[])
            }
        };
        // State files are per process ("node" below is a process index).
        for (node, env) in envs.iter().enumerate() {
            let command: Vec<String> = match &image {
                None => launch.command.clone(),
                Some((runtime, image)) => {
                    let name = format!("edgeloop-{}-{node}", id.0);
                    std::fs::write(dir.join(format!("container-{node}")), &name)?;
                    runtime.run_args(&ContainerRun {
                        name: &name,
                        image,
                        workdir: &launch.workdir,
                        mounts: &mounts,
                        env_keys: env.keys().map(String::as_str).collect(),
                        gpus: &held_by[node],
                        command: &launch.command,
                    })
                }
            };
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&launch.log_path)?;
            let exit_file = dir.join(format!("exit-{node}"));
            // The wrapper records the exit code where a restarted bridge can
            // read it; "$@" keeps the arguments exactly as given. A SIGTERM
            // to the group (a machine shutting down, a spot reclaim) leaves
            // the wrapper alive to record the code once the trainer has
            // checkpointed and exited, and marks that it came: the trap runs
            // after the trainer ends, whose own disposition stays the default.
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg("trap 'echo 15 > \"$EDGELOOP_LOCAL_EXIT_FILE.term\"' TERM; \"$@\"; code=$?; echo $code > \"$EDGELOOP_LOCAL_EXIT_FILE.tmp\" && mv \"$EDGELOOP_LOCAL_EXIT_FILE.tmp\" \"$EDGELOOP_LOCAL_EXIT_FILE\"; exit $code")
                .arg("edgeloop-local")
                .args(&command)
                .current_dir(&launch.workdir)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()))
                .env("HOME", std::env::var("HOME").unwrap_or_default())
                .envs(env)
                .envs(image.iter().flat_map(|(runtime, _)| runtime.settings()))
                .env("EDGELOOP_LOCAL_EXIT_FILE", &exit_file)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(false);
            let child = cmd.spawn()?;
            let pid = child.id().ok_or_else(|| {
                EngineError::Protocol("child exited before reporting its pid".into())
            })?;
            std::fs::write(dir.join(format!("pgid-{node}")), pid.to_string())?;
            // Reap it in the background so it does not linger as a zombie;
            // the exit file is the source of truth.
            tokio::spawn(async move {
                let mut child = child;
                let _ = child.wait().await;
            });
        }
        std::fs::write(
            dir.join("log_path"),
            launch.log_path.as_os_str().as_encoded_bytes(),
        )?;
        std::fs::write(dir.join("nodes"), envs.len().to_string())?;
        Ok(id)
    }

    async fn status(&self, id: &EngineJobId) -> Result<EngineState, EngineError> {
        let dir = self.dir(id)?;
        let nodes =
            read_i32(&dir.join("nodes")).ok_or_else(|| EngineError::NotFound(id.0.clone()))?;
        if dir.join("cancelled").exists() {
            return Ok(EngineState::Cancelled);
        }
        let mut running = false;
        for node in 0..nodes {
            let exit = read_i32(&dir.join(format!("exit-{node}")));
            if let Some(reason) = stopped_from_outside(&dir, node, exit) {
                return Ok(EngineState::Preempted { reason });
            }
            match exit {
                Some(0) => {}
                Some(code) => {
                    return Ok(EngineState::Failed {
                        exit_code: Some(code),
                        reason: format!("node {node} exited with {code}"),
                    })
                }
                None => {
                    let pgid = read_i32(&dir.join(format!("pgid-{node}"))).unwrap_or(0);
                    if pgid > 0 && alive(pgid) {
                        running = true;
                    } else {
                        // Killed without the wrapper noticing (kill -9 of the group, reboot);
                        // a container it started must not outlive it.
                        self.remove_containers(&dir, nodes, 0);
                        return Ok(EngineState::Failed {
                            exit_code: None,
                            reason: format!("node {node} vanished without an exit code (killed)"),
                        });
                    }
                }
            }
        }
        Ok(if running {
            EngineState::Running
        } else {
            EngineState::Succeeded
        })
    }

    async fn cancel(&self, id: &EngineJobId) -> Result<(), EngineError> {
        let dir = self.dir(id)?;
        let nodes =
            read_i32(&dir.join("nodes")).ok_or_else(|| EngineError::NotFound(id.0.clone()))?;
        std::fs::write(dir.join("cancelled"), "1")?;
        for node in 0..nodes {
            if let Some(pgid) = read_i32(&dir.join(format!("pgid-{node}"))).filter(|p| *p > 0) {
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
            }
        }
        self.remove_containers(&dir, nodes, CONTAINER_GRACE_SECONDS);
        Ok(())
    }

    /// Every process group of the attempt that is still alive gets
    /// SIGTERM (as a cancel sends), without marking the attempt cancelled:
    /// it failed.
    async fn stop_remains(&self, id: &EngineJobId) -> Result<(), EngineError> {
        let dir = self.dir(id)?;
        let nodes =
            read_i32(&dir.join("nodes")).ok_or_else(|| EngineError::NotFound(id.0.clone()))?;
        // The SIGTERMs below are the bridge's: what they end stays failed.
        std::fs::write(dir.join(STOPPED_FILE), "1")?;
        for node in 0..nodes {
            let done = read_i32(&dir.join(format!("exit-{node}"))).is_some();
            if let Some(pgid) = read_i32(&dir.join(format!("pgid-{node}"))).filter(|p| *p > 0) {
                if !done && alive(pgid) {
                    let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
                }
            }
        }
        self.remove_containers(&dir, nodes, CONTAINER_GRACE_SECONDS);
        Ok(())
    }

    async fn logs(&self, id: &EngineJobId) -> Result<String, EngineError> {
        let dir = self.dir(id)?;
        let log = std::fs::read_to_string(dir.join("log_path"))
            .map_err(|_| EngineError::NotFound(id.0.clone()))?;
        Ok(std::fs::read_to_string(log).unwrap_or_default())
    }

    async fn pools(&self) -> Result<Vec<NodePool>, EngineError> {
        let mut pools = local_pools(&self.current_gpus().await);
        for p in &mut pools {
            p.containers = self.container.iter().map(|r| r.kind.way()).collect();
        }
        Ok(pools)
    }
}
