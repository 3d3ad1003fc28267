//! The `resources` section: what one attempt of the job needs per node
//! (nodes, GPUs and their type, CPUs, memory), and its rules.

use serde::{Deserialize, Serialize};

use super::{JobSpec, SpecError};

/// What one attempt of the job needs, per node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, default)]
pub struct Resources {
    /// 1 to 1024 (default 1).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1024))]
    pub nodes: u32,
    /// The fewest nodes an attempt may run on, when the pool has fewer than
    /// `nodes` free (a node lost, a spot GPU taken back): the job continues
    /// at a smaller world size instead of waiting. 1 to `nodes`; unset, every
    /// attempt runs on `nodes`. The trainer must load its checkpoint at any
    /// world size (see `docs/checkpoint-contract.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1024))]
    pub min_nodes: Option<u32>,
    /// At most 16 (default 0).
    #[cfg_attr(feature = "openapi", schema(maximum = 16))]
    pub gpus_per_node: u32,
    /// CPUs per node (default 1).
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub cpus: u32,
    /// Memory per node, in MiB (default 4096).
    #[cfg_attr(
        feature = "openapi",
        schema(
            minimum = 1,
            format = "uint64",
            maximum = 18_446_744_073_709_551_615_u64
        )
    )]
    pub memory_mb: u64,
    /// e.g. "A100" or "H100-80GB"; matched against the cluster's GPU name.
    /// Only with `gpus_per_node` of at least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::gpu_type))]
    pub gpu_type: Option<String>,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            nodes: 1,
            min_nodes: None,
            gpus_per_node: 0,
            cpus: 1,
            memory_mb: 4096,
            gpu_type: None,
        }
    }
}

pub const MAX_NODES: u32 = 1024;
/// The largest GPU count of a single node on the market (HGX systems have 8,
/// some 16-GPU chassis exist); more is a typo.
pub const MAX_GPUS_PER_NODE: u32 = 16;

impl JobSpec {
    pub(super) fn validate_resources(&self) -> Result<(), SpecError> {
        let r = &self.resources;
        if !(1..=MAX_NODES).contains(&r.nodes) {
            return Err(SpecError::invalid(
                "resources.nodes",
                format!("{} is out of range 1..={MAX_NODES}", r.nodes),
            ));
        }
        if let Some(min) = r.min_nodes {
            if !(1..=r.nodes).contains(&min) {
                return Err(SpecError::invalid(
                    "resources.min_nodes",
                    format!("{min} is out of range 1..={} (resources.nodes)", r.nodes),
                ));
            }
        }
        if r.gpus_per_node > MAX_GPUS_PER_NODE {
            return Err(SpecError::invalid(
                "resources.gpus_per_node",
                format!(
                    "{} is out of range 0..={MAX_GPUS_PER_NODE}",
                    r.gpus_per_node
                ),
            ));
        }
        if r.cpus == 0 {
            return Err(SpecError::invalid("resources.cpus", "must be at least 1"));
        }
        if r.memory_mb == 0 {
            return Err(SpecError::invalid(
                "resources.memory_mb",
                "must be at least 1",
            ));
        }
        if let Some(gpu_type) = &r.gpu_type {
            if gpu_type.trim().is_empty() {
                return Err(SpecError::invalid("resources.gpu_type", "is empty"));
            }
            if r.gpus_per_node == 0 {
                return Err(SpecError::invalid(
                    "resources.gpu_type",
                    "names a GPU type but the job asks for no GPUs (gpus_per_node is 0)",
                ));
            }
        }
        Ok(())
    }
}
