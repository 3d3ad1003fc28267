//! The engine-neutral job spec: one JSON/YAML shape for every engine.
//!
//! Parsing refuses unknown fields everywhere, so a typo (`gpu_per_node`) is an
//! error rather than a silently ignored request. Every error names the field
//! at fault as a path (`resources.gpus_per_node`, `datasets[2]`,
//! `env.NCCL_DEBUG`), both for parse errors and for [`JobSpec::validate`].
//!
//! ```yaml
//! name: mnist-cnn
//! command: [python, train.py]
//! resources: {nodes: 2, gpus_per_node: 8, cpus: 32, memory_mb: 256000}
//! launcher: {type: torchrun}
//! nccl: {NCCL_DEBUG: INFO}
//! checkpoint: {every_steps: 500, keep_last: 3}
//! requirements: ["torch>=2.1", "cuda>=12.1"]
//! ```
//!
//! The sections each have a file with their type and rules: `resources`
//! (nodes, GPUs, CPUs, memory), `distributed` (the launcher, NCCL and the
//! variables the launcher owns), `checkpoint` (checkpoints and restarts),
//! `dataset` (dataset URIs), `requirements` (`torch>=2.0`); `validation`
//! holds [`JobSpec::validate`] and the top-level fields' rules, and `parse`
//! reads JSON and YAML naming the field at fault.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod checkpoint;
mod dataset;
mod distributed;
mod parse;
mod requirements;
mod resources;
mod validation;

pub use checkpoint::{
    CheckpointPolicy, RestartPolicy, MAX_BACKOFF_SECONDS, MAX_PREEMPTIONS, MAX_RESTARTS,
};
pub use dataset::DATASET_SCHEMES;
pub use distributed::{
    LauncherSpec, DEFAULT_MASTER_PORT, NCCL_IB_PREFIX, NCCL_KEYS, TORCHRUN_VARS,
};
pub use requirements::{Framework, Requirement, Version, VersionOp};
pub use resources::{Resources, MAX_GPUS_PER_NODE, MAX_NODES};
pub use validation::is_env_name;

/// A training job, as submitted. Construct it with [`JobSpec::from_json`] or
/// [`JobSpec::from_yaml`], which also validate it.
// The OpenAPI document states `JobSpec::validate`'s rules on the fields
// (`crate::schema` for those the derive cannot say, and for the rules
// between fields `crate::schema::spec::JobSpecSchema`): keep the two together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// DNS label: it becomes Slurm job names, Kubernetes object names, paths.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub name: String,
    /// Container image, for engines that run containers: no spaces or
    /// control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::image_reference))]
    pub image: Option<String>,
    /// Program and its first arguments; never run through a shell. The
    /// program is not empty, and no argument holds a NUL.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::command))]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::process_args))]
    pub args: Vec<String>,
    /// Names of letters, digits and `_` (not starting with a digit); not
    /// `EDGELOOP_*` (the bridge sets those) nor `NCCL_*` (under `nccl`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::environment))]
    pub env: BTreeMap<String, String>,
    /// Relative paths are resolved against the job's directory on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::working_dir))]
    pub working_dir: Option<PathBuf>,
    #[serde(
        default,
        deserialize_with = "parse::mapping",
        skip_serializing_if = "parse::is_default"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::spec::ResourcesSchema))]
    pub resources: Resources,
    #[serde(default, skip_serializing_if = "parse::is_default")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::spec::LauncherSpecSchema))]
    pub launcher: LauncherSpec,
    /// Passed through to the training processes' environment. Only the NCCL
    /// variables that describe the network are accepted: the rest (e.g.
    /// NCCL_ALGO) change numerics or hang jobs, and belong in the image.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::nccl))]
    pub nccl: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// Dataset URIs, handed to the job as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::datasets))]
    pub datasets: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::hyperparameters))]
    pub hyperparameters: BTreeMap<String, serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "parse::mapping",
        skip_serializing_if = "parse::is_default"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::spec::CheckpointPolicySchema))]
    pub checkpoint: CheckpointPolicy,
    #[serde(
        default,
        deserialize_with = "parse::mapping",
        skip_serializing_if = "parse::is_default"
    )]
    pub restarts: RestartPolicy,
    /// Framework requirements such as `torch>=2.0` or `cuda>=11.8`; the
    /// pre-flight check holds them against the cluster.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "parse::deserialize_requirements"
    )]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::spec::requirements))]
    pub requirements: Vec<Requirement>,
    /// The engine the job must run on; any engine when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
}

/// A hint to the training code; the bridge does not enforce it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
    Fp8,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Local,
    Slurm,
    Ray,
    Kubernetes,
}

impl EngineKind {
    /// The name engines report (`Engine::name`, `Capabilities::engines`).
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Local => "local",
            EngineKind::Slurm => "slurm",
            EngineKind::Ray => "ray",
            EngineKind::Kubernetes => "kubernetes",
        }
    }
}

/// Why a spec was refused. Every variant but `Malformed` names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not well-formed JSON/YAML, or not an object at the top.
    #[error("malformed {format} job spec: {message}")]
    Malformed {
        format: &'static str,
        message: String,
    },
    /// A field is missing, unknown, of the wrong type, or breaks a rule.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl SpecError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The field at fault, as a path like `resources.nodes` or `datasets[1]`.
    pub fn field(&self) -> Option<&str> {
        match self {
            SpecError::Malformed { .. } => None,
            SpecError::Invalid { field, .. } => Some(field),
        }
    }
}
