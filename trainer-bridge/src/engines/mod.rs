//! Engines run a launched job on a cluster: the embedded `local` one
//! (subprocesses on this machine), Slurm (slurmrestd), Ray (Jobs API), and
//! Kubernetes. They all take the same [`Launch`] and report the same
//! [`EngineState`], so the bridge's job loop never branches on the engine.

pub mod kubernetes;
pub mod local;
pub mod ray;
pub mod slurm;
pub mod slurm_containers;
pub mod slurm_nodes;
pub mod slurm_script;

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
pub use edgeloop_api::fleet::NodePool;
pub use edgeloop_api::images::{ContainerWay, PinnedImage};

/// How a multi-process job is started on each node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// One process per node, run as given.
    None,
    /// `torchrun`-style: the engine sets MASTER_ADDR, MASTER_PORT,
    /// WORLD_SIZE, RANK, LOCAL_RANK, NNODES, NPROC_PER_NODE for each process.
    Torchrun { nproc_per_node: u32 },
    /// `horovodrun`/`mpirun`-style: one rank per GPU slot across the nodes.
    Horovod { slots_per_node: u32 },
}

/// Everything an engine needs to start one attempt of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub job_id: String,
    pub attempt: u32,
    /// Engine-visible name (e.g. the Slurm job name).
    pub name: String,
    /// Container image as the spec names it, for engines that run
    /// containers.
    pub image: Option<String>,
    /// What [`Engine::pin_image`] pinned `image` to: the engine runs this,
    /// not the reference, so every attempt runs the same image.
    pub pinned_image: Option<PinnedImage>,
    /// Program and arguments.
    pub command: Vec<String>,
    /// Environment for the training processes (the checkpoint contract's
    /// EDGELOOP_* variables, NCCL settings, user env).
    pub env: BTreeMap<String, String>,
    pub workdir: PathBuf,
    /// The nodes this attempt asks for.
    pub nodes: u32,
    /// The fewest nodes it may run on (`resources.min_nodes`), where the
    /// engine sees fewer free: the local engine counts its free GPUs, Slurm
    /// allocates a node range. `None`: exactly `nodes`.
    pub min_nodes: Option<u32>,
    pub gpus_per_node: u32,
    pub cpus_per_node: u32,
    pub memory_mb: u64,
    pub launcher: Launcher,
    /// Where the engine should write the job's combined output, when it can.
    pub log_path: PathBuf,
    /// The pool the pre-flight check placed the job in (its partition, GPU
    /// type); `None` for a job that needs no GPUs and found no pool.
    pub pool: Option<NodePool>,
}

/// The pin for engines whose nodes pull from a registry (Kubernetes,
/// pyxis, Apptainer): the earlier pin kept; else the manifest digest the
/// reference names; else `None`, the tag pulled as it is. An image ID is
/// no name a registry serves, so such a pin is refused.
pub fn registry_pin(
    reference: &str,
    earlier: Option<&PinnedImage>,
) -> Result<Option<PinnedImage>, EngineError> {
    use edgeloop_api::images::{check_reference, PinKind};
    if let Some(pin) = earlier {
        return match pin.kind {
            PinKind::Manifest => Ok(Some(pin.clone())),
            PinKind::ImageId => Err(EngineError::Refused(format!(
                "image: the job is pinned to {pin}, an image ID, which no registry serves; \
                 submit the job again"
            ))),
        };
    }
    let named =
        check_reference(reference).map_err(|e| EngineError::Refused(format!("image: {e}")))?;
    Ok(named.map(|digest| PinnedImage {
        reference: reference.to_string(),
        digest,
        kind: PinKind::Manifest,
    }))
}

/// Driver facts from the bridge's config, for engines that cannot read them
/// off their nodes (Slurm nodes without driver features, Ray).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfiguredFacts {
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    /// How the cluster's nodes run images (Slurm: `pyxis`, `slurm_oci`,
    /// `apptainer`): nothing an engine's API says.
    pub containers: Vec<ContainerWay>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineState {
    Pending,
    Running,
    Succeeded,
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
    /// Stopped from outside, with nothing wrong with the job: a preempted
    /// or lost node, a SIGTERM the bridge did not send. Restarted from the
    /// last checkpoint under `restarts.max_preemptions`, not `max_restarts`.
    Preempted {
        reason: String,
    },
    Cancelled,
}

impl EngineState {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            EngineState::Succeeded
                | EngineState::Failed { .. }
                | EngineState::Preempted { .. }
                | EngineState::Cancelled
        )
    }
}

/// The engine's own id for a submitted job (Slurm job id, Ray submission id,
/// Kubernetes Job name, local process group).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EngineJobId(pub String);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine refused the job as specified (e.g. more GPUs than a node has).
    #[error("the engine refused the job: {0}")]
    Refused(String),
    #[error("engine unavailable: {0}")]
    Unavailable(String),
    #[error("no such job on the engine: {0}")]
    NotFound(String),
    #[error("unexpected answer from the engine: {0}")]
    Protocol(String),
    #[error("engine I/O: {0}")]
    Io(#[from] std::io::Error),
}

#[async_trait]
pub trait Engine: Send + Sync {
    fn name(&self) -> &'static str;
    /// Pins a job's `image` before an attempt runs: to `earlier` (the pin
    /// of the job's first attempt) after checking this engine can run it,
    /// else to the digest the reference resolves to here. `Ok(None)`: the
    /// engine runs the reference as given and cannot pin it beforehand
    /// (Kubernetes with a tag, which the node resolves). The default
    /// refuses: an engine that runs no images must not ignore one.
    async fn pin_image(
        &self,
        reference: &str,
        earlier: Option<&PinnedImage>,
    ) -> Result<Option<PinnedImage>, EngineError> {
        let _ = (reference, earlier);
        Err(EngineError::Refused(format!(
            "image: the {} engine on this bridge runs no container images; leave `image` out \
             to run the command on its nodes, or run the job on an engine that runs images",
            self.name()
        )))
    }
    /// What a running attempt's image `reference` resolved to, where the
    /// engine learns it only as the attempt starts (Kubernetes pulls a tag
    /// on the node): the runner pins the job to it, so no later attempt
    /// runs a moved tag. The default knows nothing beyond
    /// [`Engine::pin_image`].
    async fn resolved_image(
        &self,
        _id: &EngineJobId,
        _reference: &str,
    ) -> Result<Option<PinnedImage>, EngineError> {
        Ok(None)
    }
    async fn submit(&self, launch: &Launch) -> Result<EngineJobId, EngineError>;
    async fn status(&self, id: &EngineJobId) -> Result<EngineState, EngineError>;
    async fn cancel(&self, id: &EngineJobId) -> Result<(), EngineError>;
    /// Stops what is left of an attempt that [`Engine::status`] reported
    /// failed: one rank's death fails the attempt, but the other ranks may
    /// still wait in a collective (gloo's timeout is 30 minutes) holding
    /// the rendezvous port. The default does nothing, for engines that end
    /// the whole group themselves: Slurm (`srun --kill-on-bad-exit`), Ray
    /// (the job's driver is gone) and Kubernetes (a failed Job's pods are
    /// terminated, and the Job stays for inspection).
    async fn stop_remains(&self, _id: &EngineJobId) -> Result<(), EngineError> {
        Ok(())
    }
    /// The job's output so far (may be truncated by the engine).
    async fn logs(&self, id: &EngineJobId) -> Result<String, EngineError>;
    /// The node pools this engine can place jobs on, with their GPU facts,
    /// read from the engine itself (refreshed by the bridge periodically).
    async fn pools(&self) -> Result<Vec<NodePool>, EngineError>;
}
