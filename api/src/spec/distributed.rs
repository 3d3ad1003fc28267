//! How a job runs across processes and nodes: the `launcher` section
//! (torchrun, Horovod, or none), the NCCL settings passed through under
//! `nccl`, and the variables the launcher sets itself; and their rules.

use serde::{Deserialize, Serialize};

use super::{is_env_name, JobSpec, SpecError};

/// torchrun's own default.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// How processes are started on each node. Internally tagged, e.g.
/// `{type: torchrun, nproc_per_node: 8}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum LauncherSpec {
    /// One process per node, run as given. A struct variant, so that
    /// `deny_unknown_fields` refuses `{type: none, nproc_per_node: 2}` (serde
    /// ignores extra fields of a unit variant).
    None {},
    Torchrun {
        /// Processes per node; defaults to the GPUs per node (1 without GPUs).
        /// At least 1, and no more than `resources.gpus_per_node` when the
        /// job asks for GPUs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
        )]
        nproc_per_node: Option<u32>,
        /// Unprivileged training processes cannot bind below 1024.
        #[serde(default = "default_master_port")]
        #[cfg_attr(feature = "openapi", schema(minimum = 1024, maximum = 65535))]
        master_port: u16,
    },
    Horovod {
        /// Ranks per node; defaults to the GPUs per node (1 without GPUs).
        /// At least 1, and no more than `resources.gpus_per_node` when the
        /// job asks for GPUs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
        )]
        slots_per_node: Option<u32>,
    },
}

impl Default for LauncherSpec {
    fn default() -> Self {
        LauncherSpec::None {}
    }
}

fn default_master_port() -> u16 {
    DEFAULT_MASTER_PORT
}

impl LauncherSpec {
    /// Processes (torchrun) or slots (horovod) per node, with the default
    /// applied: one per GPU, so each rank owns a device.
    pub fn procs_per_node(&self, gpus_per_node: u32) -> u32 {
        let default = gpus_per_node.max(1);
        match self {
            LauncherSpec::None {} => 1,
            LauncherSpec::Torchrun { nproc_per_node, .. } => nproc_per_node.unwrap_or(default),
            LauncherSpec::Horovod { slots_per_node } => slots_per_node.unwrap_or(default),
        }
    }
}

/// NCCL variables accepted under `nccl` (besides the `NCCL_IB_` prefix).
pub const NCCL_KEYS: &[&str] = &["NCCL_DEBUG", "NCCL_SOCKET_IFNAME"];
pub const NCCL_IB_PREFIX: &str = "NCCL_IB_";

/// Variables the launcher sets for each torchrun process; a user value would
/// break the rendezvous.
pub const TORCHRUN_VARS: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NNODES",
    "NPROC_PER_NODE",
    "NODE_RANK",
];

impl JobSpec {
    pub(super) fn validate_launcher(&self) -> Result<(), SpecError> {
        let gpus = self.resources.gpus_per_node;
        let (field, count) = match &self.launcher {
            LauncherSpec::None {} => return Ok(()),
            LauncherSpec::Torchrun {
                nproc_per_node,
                master_port,
            } => {
                // Unprivileged training processes cannot bind below 1024.
                if *master_port < 1024 {
                    return Err(SpecError::invalid(
                        "launcher.master_port",
                        format!("{master_port} is a privileged port; use 1024..=65535"),
                    ));
                }
                ("launcher.nproc_per_node", *nproc_per_node)
            }
            LauncherSpec::Horovod { slots_per_node } => {
                ("launcher.slots_per_node", *slots_per_node)
            }
        };
        match count {
            Some(0) => Err(SpecError::invalid(field, "must be at least 1")),
            // More ranks than GPUs would share devices, which NCCL refuses.
            Some(n) if gpus > 0 && n > gpus => Err(SpecError::invalid(
                field,
                format!("{n} processes per node but only {gpus} GPUs per node"),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn validate_nccl(&self) -> Result<(), SpecError> {
        for (key, value) in &self.nccl {
            let field = format!("nccl.{key}");
            let allowed = NCCL_KEYS.contains(&key.as_str())
                || (key.len() > NCCL_IB_PREFIX.len()
                    && key.starts_with(NCCL_IB_PREFIX)
                    && is_env_name(key));
            if !allowed {
                return Err(SpecError::invalid(
                    field,
                    format!("{key:?} is not passed through: only NCCL_DEBUG, NCCL_SOCKET_IFNAME and NCCL_IB_* are"),
                ));
            }
            if value.contains('\0') {
                return Err(SpecError::invalid(field, "contains a NUL byte"));
            }
        }
        Ok(())
    }
}
