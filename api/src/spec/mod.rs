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

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A training job, as submitted. Construct it with [`JobSpec::from_json`] or
/// [`JobSpec::from_yaml`], which also validate it.
// The OpenAPI document states `JobSpec::validate`'s rules on the fields
// (`crate::schema` for those the derive cannot say, and for the rules
// between fields `crate::schema::JobSpecSchema`): keep the two together.
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
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::image_reference))]
    pub image: Option<String>,
    /// Program and its first arguments; never run through a shell. The
    /// program is not empty, and no argument holds a NUL.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::command))]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::process_args))]
    pub args: Vec<String>,
    /// Names of letters, digits and `_` (not starting with a digit); not
    /// `EDGELOOP_*` (the bridge sets those) nor `NCCL_*` (under `nccl`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::environment))]
    pub env: BTreeMap<String, String>,
    /// Relative paths are resolved against the job's directory on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::working_dir))]
    pub working_dir: Option<PathBuf>,
    #[serde(
        default,
        deserialize_with = "mapping",
        skip_serializing_if = "is_default"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::ResourcesSchema))]
    pub resources: Resources,
    #[serde(default, skip_serializing_if = "is_default")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::LauncherSpecSchema))]
    pub launcher: LauncherSpec,
    /// Passed through to the training processes' environment. Only the NCCL
    /// variables that describe the network are accepted: the rest (e.g.
    /// NCCL_ALGO) change numerics or hang jobs, and belong in the image.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::nccl))]
    pub nccl: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// Dataset URIs, handed to the job as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::datasets))]
    pub datasets: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::hyperparameters))]
    pub hyperparameters: BTreeMap<String, serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "mapping",
        skip_serializing_if = "is_default"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::CheckpointPolicySchema))]
    pub checkpoint: CheckpointPolicy,
    #[serde(
        default,
        deserialize_with = "mapping",
        skip_serializing_if = "is_default"
    )]
    pub restarts: RestartPolicy,
    /// Framework requirements such as `torch>=2.0` or `cuda>=11.8`; the
    /// pre-flight check holds them against the cluster.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "deserialize_requirements"
    )]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::requirements))]
    pub requirements: Vec<Requirement>,
    /// The engine the job must run on; any engine when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
}

/// What one attempt of the job needs, per node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, default)]
pub struct Resources {
    /// 1 to 1024 (default 1).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1024))]
    pub nodes: u32,
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
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::gpu_type))]
    pub gpu_type: Option<String>,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            nodes: 1,
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

/// When the job writes checkpoints, and how many the bridge keeps.
///
/// An absent `checkpoint` section means every 30 minutes; a present one must
/// say when (steps, minutes or both), since `{}` is more likely an unfinished
/// edit than a wish for the default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            minimum = 1,
            format = "uint64",
            maximum = 18_446_744_073_709_551_615_u64
        )
    )]
    pub every_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub every_minutes: Option<u32>,
    /// Keeping none would leave nothing to resume from (default 3).
    #[serde(default = "default_keep_last")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub keep_last: u32,
}

fn default_keep_last() -> u32 {
    3
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_steps: None,
            every_minutes: Some(30),
            keep_last: default_keep_last(),
        }
    }
}

/// Restarts after a failure, with exponential backoff from `backoff_seconds`
/// capped at `backoff_max_seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, default)]
pub struct RestartPolicy {
    /// At most 100 (default 3).
    #[cfg_attr(feature = "openapi", schema(maximum = 100))]
    pub max_restarts: u32,
    /// At most `backoff_max_seconds` (default 10).
    #[cfg_attr(feature = "openapi", schema(maximum = 86400))]
    pub backoff_seconds: u32,
    /// At most a day, 86400 (default 600).
    #[cfg_attr(feature = "openapi", schema(maximum = 86400))]
    pub backoff_max_seconds: u32,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 3,
            backoff_seconds: 10,
            backoff_max_seconds: 600,
        }
    }
}

pub const MAX_RESTARTS: u32 = 100;
/// A day: a longer pause is a stuck job, not a backoff.
pub const MAX_BACKOFF_SECONDS: u32 = 86_400;

/// Dataset URI schemes the bridge knows how to hand to a job.
pub const DATASET_SCHEMES: &[&str] = &[
    "file",
    "s3",
    "gs",
    "http",
    "https",
    "hf",
    "edgeloop-artifact",
];

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

impl JobSpec {
    /// Parses and validates a JSON spec.
    pub fn from_json(bytes: &[u8]) -> Result<JobSpec, SpecError> {
        let spec = parse_json(bytes, "JSON")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates a YAML spec.
    ///
    /// The YAML is first read as a plain JSON value, then typed from its JSON
    /// form, so both formats go through one deserializer and one
    /// field-naming path (see [`parse_json`]).
    pub fn from_yaml(text: &str) -> Result<JobSpec, SpecError> {
        let value: serde_json::Value =
            serde_yaml::from_str(text).map_err(|e| SpecError::Malformed {
                format: "YAML",
                message: e.to_string(),
            })?;
        let json = serde_json::to_vec_pretty(&value).map_err(|e| SpecError::Malformed {
            format: "YAML",
            message: e.to_string(),
        })?;
        let spec = parse_json(&json, "YAML")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every rule that types alone do not express. Returns the first
    /// broken rule, naming its field.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !edgeloop_models::names::is_valid_name(&self.name) {
            return Err(SpecError::invalid(
                "name",
                format!(
                    "{:?} is not a valid name: {}",
                    self.name,
                    edgeloop_models::names::NAME_RULE
                ),
            ));
        }
        if let Some(image) = &self.image {
            if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(SpecError::invalid(
                    "image",
                    format!("{image:?} is not an image reference (empty, or has spaces or control characters)"),
                ));
            }
        }
        if self.command.is_empty() {
            return Err(SpecError::invalid(
                "command",
                "must name the program to run",
            ));
        }
        if self.command[0].is_empty() {
            return Err(SpecError::invalid("command[0]", "the program is empty"));
        }
        for (field, list) in [("command", &self.command), ("args", &self.args)] {
            for (i, arg) in list.iter().enumerate() {
                if arg.contains('\0') {
                    return Err(SpecError::invalid(
                        format!("{field}[{i}]"),
                        "contains a NUL byte, which no process argument can hold",
                    ));
                }
            }
        }
        self.validate_env()?;
        if let Some(dir) = &self.working_dir {
            let text = dir.to_string_lossy();
            if text.is_empty() || text.contains('\0') {
                return Err(SpecError::invalid(
                    "working_dir",
                    "must be a non-empty path without NUL bytes",
                ));
            }
        }
        self.validate_resources()?;
        self.validate_launcher()?;
        self.validate_nccl()?;
        for (i, uri) in self.datasets.iter().enumerate() {
            validate_dataset_uri(uri)
                .map_err(|m| SpecError::invalid(format!("datasets[{i}]"), m))?;
        }
        for key in self.hyperparameters.keys() {
            if key.is_empty() {
                return Err(SpecError::invalid(
                    "hyperparameters",
                    "a hyperparameter has an empty name",
                ));
            }
        }
        self.validate_checkpoint()?;
        self.validate_restarts()?;
        Ok(())
    }

    fn validate_env(&self) -> Result<(), SpecError> {
        for (key, value) in &self.env {
            let field = format!("env.{key}");
            if !is_env_name(key) {
                return Err(SpecError::invalid(
                    field,
                    format!("{key:?} is not an environment variable name: use letters, digits and '_', not starting with a digit"),
                ));
            }
            if key.starts_with("EDGELOOP_") {
                return Err(SpecError::invalid(
                    field,
                    "EDGELOOP_* variables are set by the bridge (the checkpoint contract)",
                ));
            }
            if key.starts_with("NCCL_") {
                return Err(SpecError::invalid(
                    field,
                    "NCCL settings go under `nccl`, where they are checked",
                ));
            }
            if !matches!(self.launcher, LauncherSpec::None {})
                && TORCHRUN_VARS.contains(&key.as_str())
            {
                return Err(SpecError::invalid(
                    field,
                    "the launcher sets this variable for each process",
                ));
            }
            if value.contains('\0') {
                return Err(SpecError::invalid(
                    field,
                    "contains a NUL byte, which no environment value can hold",
                ));
            }
        }
        Ok(())
    }

    fn validate_resources(&self) -> Result<(), SpecError> {
        let r = &self.resources;
        if !(1..=MAX_NODES).contains(&r.nodes) {
            return Err(SpecError::invalid(
                "resources.nodes",
                format!("{} is out of range 1..={MAX_NODES}", r.nodes),
            ));
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

    fn validate_launcher(&self) -> Result<(), SpecError> {
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

    fn validate_nccl(&self) -> Result<(), SpecError> {
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

    fn validate_checkpoint(&self) -> Result<(), SpecError> {
        let c = &self.checkpoint;
        if c.every_steps.is_none() && c.every_minutes.is_none() {
            return Err(SpecError::invalid(
                "checkpoint.every_steps",
                "set every_steps, every_minutes or both",
            ));
        }
        if c.every_steps == Some(0) {
            return Err(SpecError::invalid(
                "checkpoint.every_steps",
                "must be at least 1",
            ));
        }
        if c.every_minutes == Some(0) {
            return Err(SpecError::invalid(
                "checkpoint.every_minutes",
                "must be at least 1",
            ));
        }
        if c.keep_last == 0 {
            // Keeping none would leave nothing to resume from.
            return Err(SpecError::invalid(
                "checkpoint.keep_last",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    fn validate_restarts(&self) -> Result<(), SpecError> {
        let r = &self.restarts;
        if r.max_restarts > MAX_RESTARTS {
            return Err(SpecError::invalid(
                "restarts.max_restarts",
                format!("{} is more than {MAX_RESTARTS}", r.max_restarts),
            ));
        }
        if r.backoff_max_seconds > MAX_BACKOFF_SECONDS {
            return Err(SpecError::invalid(
                "restarts.backoff_max_seconds",
                format!(
                    "{} is more than a day ({MAX_BACKOFF_SECONDS})",
                    r.backoff_max_seconds
                ),
            ));
        }
        if r.backoff_seconds > r.backoff_max_seconds {
            return Err(SpecError::invalid(
                "restarts.backoff_seconds",
                format!(
                    "{} is more than backoff_max_seconds ({})",
                    r.backoff_seconds, r.backoff_max_seconds
                ),
            ));
        }
        Ok(())
    }
}

/// POSIX portable environment names: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_env_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn validate_dataset_uri(uri: &str) -> Result<(), String> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!(
            "{uri:?} is not a URI: expected scheme://..., with scheme one of {}",
            DATASET_SCHEMES.join(", ")
        ));
    };
    if !DATASET_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "scheme {scheme:?} is not supported: use one of {}",
            DATASET_SCHEMES.join(", ")
        ));
    }
    if rest.is_empty() {
        return Err(format!("{uri:?} names no location after the scheme"));
    }
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{uri:?} contains whitespace or control characters"));
    }
    if scheme.eq_ignore_ascii_case("edgeloop-artifact") {
        rest.parse::<edgeloop_models::Digest>().map_err(|e| {
            format!("{uri:?}: an edgeloop-artifact URI names a digest (sha256:<64 hex>): {e}")
        })?;
    }
    Ok(())
}

/// Deserializes from JSON text; on error, names the field by finding where in
/// the text serde stopped (see [`path_at`]). The crate has no
/// serde_path_to_error, and serde_json's line/column is exact enough: it is
/// just past the offending key or value, or just past the object missing a
/// field.
fn parse_json(bytes: &[u8], format: &'static str) -> Result<JobSpec, SpecError> {
    // serde's derived structs also accept a sequence of field values in
    // order; a spec is always a map.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(SpecError::Malformed {
            format,
            message: "the job spec must be a mapping of fields".into(),
        });
    }
    let err = match serde_json::from_slice::<JobSpec>(bytes) {
        Ok(spec) => return Ok(spec),
        Err(e) => e,
    };
    let full = err.to_string();
    // For YAML the position is in our generated JSON, meaningless to the
    // author; the path replaces it.
    let message = full
        .strip_suffix(&format!(" at line {} column {}", err.line(), err.column()))
        .unwrap_or(&full)
        .to_string();
    if err.is_syntax() || err.is_eof() || err.is_io() {
        let message = if format == "JSON" { full } else { message };
        return Err(SpecError::Malformed { format, message });
    }
    let offset = offset_of(bytes, err.line(), err.column());
    let mut path = path_at(bytes, offset);
    if let Some((index, rest)) = split_index_prefix(&message) {
        // The position may be past the element (or the next comma): the
        // marker, not the position, says which element.
        if path.ends_with(']') {
            if let Some(open) = path.rfind('[') {
                path.truncate(open);
            }
        }
        return Err(SpecError::Invalid {
            field: format!("{path}{index}"),
            message: rest.to_string(),
        });
    }
    // serde names a missing or unknown field in backticks; make it part of
    // the path unless the position already ends on it.
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|p| message.strip_prefix(p))
        .and_then(|rest| rest.split('`').next());
    if let Some(name) = named {
        let ends_on_it = path.rsplit('.').next() == Some(name);
        if !ends_on_it {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
        }
    }
    if path.is_empty() {
        Err(SpecError::Malformed { format, message })
    } else {
        Err(SpecError::Invalid {
            field: path,
            message,
        })
    }
}

/// Byte offset of serde_json's (1-based line, column = bytes consumed on that
/// line) position.
fn offset_of(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    let mut current = 1;
    while current < line {
        match bytes[start..].iter().position(|&b| b == b'\n') {
            Some(i) => start += i + 1,
            None => break,
        }
        current += 1;
    }
    (start + column).min(bytes.len())
}

enum Frame {
    Object {
        key: Option<String>,
        expect_key: bool,
    },
    Array {
        index: usize,
    },
}

/// The path (`a.b[2].c`) of the innermost key or element open at `offset` in
/// well-formed JSON text. A closed object leaves its parent's key in place, so
/// an error raised just after `}` names the object that closed.
fn path_at(bytes: &[u8], offset: usize) -> String {
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    let end = offset.min(bytes.len());
    while i < end {
        match bytes[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < end && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let stop = (i + 1).min(bytes.len());
                if let Some(Frame::Object { key, expect_key }) = stack.last_mut() {
                    if *expect_key {
                        *key = serde_json::from_slice::<String>(&bytes[start..stop]).ok();
                        *expect_key = false;
                    }
                }
            }
            b'{' => stack.push(Frame::Object {
                key: None,
                expect_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Object { key: Some(key), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

/// Parses each entry inside the list's visitor so that an error carries the
/// entry's index: serde_json positions a custom error at the end of the
/// enclosing list (or just past the next comma), which names the list but not
/// reliably the element. The `[i]: ` prefix is moved into the path by
/// [`parse_json`].
fn deserialize_requirements<'de, D>(deserializer: D) -> Result<Vec<Requirement>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Entries;
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = Vec<Requirement>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of requirements such as \"torch>=2.0\"")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut entries = Vec::new();
            while let Some(text) = seq.next_element::<String>()? {
                let requirement = Requirement::parse(&text).map_err(|m| {
                    <A::Error as serde::de::Error>::custom(format!("[{}]: {m}", entries.len()))
                })?;
                entries.push(requirement);
            }
            Ok(entries)
        }
    }
    deserializer.deserialize_seq(Entries)
}

/// A section left out when written: what reading leaves out gets the
/// default, so a spec is written as it is usually submitted (the job
/// records store it so, and the API shows it so).
fn is_default<T: Default + PartialEq>(section: &T) -> bool {
    *section == T::default()
}

/// Reads a struct from a mapping only: serde's derived structs also take a
/// sequence of their fields' values (`resources: [2, 8]`), which no author
/// means and the OpenAPI document does not allow.
fn mapping<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Mapping<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Mapping<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping of fields")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(Mapping(std::marker::PhantomData))
}

/// Splits a leading `[i]: ` element marker off a message.
fn split_index_prefix(message: &str) -> Option<(&str, &str)> {
    let rest = message.strip_prefix('[')?;
    let close = rest.find("]: ")?;
    let index = &rest[..close];
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((&message[..close + 2], &rest[close + 3..]))
}

/// A software the job needs, as `torch>=2.0`, `cuda>=11.8`,
/// `tensorflow~=2.15`. Serialized as that string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Requirement {
    pub framework: Framework,
    pub op: VersionOp,
    pub version: Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framework {
    Torch,
    TensorFlow,
    Cuda,
}

impl Framework {
    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Torch => "torch",
            Framework::TensorFlow => "tensorflow",
            Framework::Cuda => "cuda",
        }
    }

    fn parse(name: &str) -> Option<Framework> {
        match name.to_ascii_lowercase().as_str() {
            "torch" | "pytorch" => Some(Framework::Torch),
            "tensorflow" | "tensorflow-gpu" => Some(Framework::TensorFlow),
            "cuda" => Some(Framework::Cuda),
            _ => None,
        }
    }
}

/// PEP 440's comparison operators, minus `!=` and `===` (an exclusion never
/// makes a job impossible, so the pre-flight check has no use for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionOp {
    Ge,
    Eq,
    Le,
    Gt,
    Lt,
    /// Compatible release: `~=2.1` is `>=2.1, ==2.*`; `~=2.1.3` is
    /// `>=2.1.3, ==2.1.*`.
    Compatible,
}

impl VersionOp {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionOp::Ge => ">=",
            VersionOp::Eq => "==",
            VersionOp::Le => "<=",
            VersionOp::Gt => ">",
            VersionOp::Lt => "<",
            VersionOp::Compatible => "~=",
        }
    }
}

/// A numeric dotted version (`12.2`, `535.104.05`). Missing components
/// compare as zero, so `2.0 == 2.0.0`.
#[derive(Debug, Clone, Eq)]
pub struct Version(pub Vec<u32>);

impl Version {
    /// Up to 4 dot-separated decimal components; leading zeros are allowed
    /// because driver versions have them (`535.104.05`).
    pub fn parse(text: &str) -> Option<Version> {
        let parts = text
            .split('.')
            .map(|p| {
                if p.is_empty() || p.len() > 9 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    None
                } else {
                    p.parse::<u32>().ok()
                }
            })
            .collect::<Option<Vec<u32>>>()?;
        if parts.is_empty() || parts.len() > 4 {
            return None;
        }
        Some(Version(parts))
    }

    pub fn major(&self) -> u32 {
        self.0.first().copied().unwrap_or(0)
    }

    pub fn minor(&self) -> u32 {
        self.0.get(1).copied().unwrap_or(0)
    }

    /// The first `n` components (padded with zeros).
    pub fn truncate(&self, n: usize) -> Version {
        Version(
            (0..n)
                .map(|i| self.0.get(i).copied().unwrap_or(0))
                .collect(),
        )
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.0.len().max(other.0.len());
        for i in 0..len {
            let a = self.0.get(i).copied().unwrap_or(0);
            let b = other.0.get(i).copied().unwrap_or(0);
            match a.cmp(&b) {
                Ordering::Equal => {}
                unequal => return unequal,
            }
        }
        Ordering::Equal
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

impl Requirement {
    /// Whether `candidate` satisfies this requirement.
    pub fn matches(&self, candidate: &Version) -> bool {
        let v = &self.version;
        match self.op {
            VersionOp::Ge => candidate >= v,
            VersionOp::Eq => candidate == v,
            VersionOp::Le => candidate <= v,
            VersionOp::Gt => candidate > v,
            VersionOp::Lt => candidate < v,
            VersionOp::Compatible => {
                // Parsing guarantees at least two components.
                let prefix = v.0.len().saturating_sub(1);
                candidate >= v && candidate.truncate(prefix) == v.truncate(prefix)
            }
        }
    }

    pub fn parse(text: &str) -> Result<Requirement, String> {
        let trimmed = text.trim();
        let name_end = trimmed
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(trimmed.len());
        let (name, rest) = trimmed.split_at(name_end);
        if name.is_empty() {
            return Err(format!(
                "{text:?} names no framework: write e.g. torch>=2.0, cuda>=11.8, tensorflow>=2.13"
            ));
        }
        let framework = Framework::parse(name).ok_or_else(|| {
            format!("{text:?}: unknown framework {name:?} (known: torch, tensorflow, cuda)")
        })?;
        let rest = rest.trim_start();
        let ops = [
            (">=", VersionOp::Ge),
            ("==", VersionOp::Eq),
            ("<=", VersionOp::Le),
            ("~=", VersionOp::Compatible),
            (">", VersionOp::Gt),
            ("<", VersionOp::Lt),
        ];
        let (op, version_text) = ops
            .iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|r| (*op, r.trim())))
            .ok_or_else(|| {
                format!("{text:?}: expected one of >=, ==, <=, >, <, ~= after {name:?}")
            })?;
        let version = Version::parse(version_text).ok_or_else(|| {
            format!("{text:?}: {version_text:?} is not a version (numbers separated by dots)")
        })?;
        if op == VersionOp::Compatible && version.0.len() < 2 {
            return Err(format!(
                "{text:?}: ~= needs at least two version components, e.g. ~=2.1"
            ));
        }
        Ok(Requirement {
            framework,
            op,
            version,
        })
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}{}",
            self.framework.as_str(),
            self.op.as_str(),
            self.version
        )
    }
}

impl TryFrom<String> for Requirement {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Requirement::parse(&text)
    }
}

impl From<Requirement> for String {
    fn from(r: Requirement) -> String {
        r.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_at_names_keys_and_indices() {
        let text = br#"{"a": {"b": [1, {"c": 2}]}, "d": 3}"#;
        let at = |needle: &str| {
            let pos = std::str::from_utf8(text).unwrap().find(needle).unwrap() + needle.len();
            path_at(text, pos)
        };
        assert_eq!(at(r#""b""#), "a.b");
        assert_eq!(at("[1"), "a.b[0]");
        assert_eq!(at(r#""c": 2"#), "a.b[1].c");
        assert_eq!(at(r#"2}"#), "a.b[1]");
        assert_eq!(at(r#""d": 3"#), "d");
    }

    #[test]
    fn a_section_is_a_mapping_never_a_sequence() {
        for (section, value) in [
            ("resources", "[]"),
            ("resources", "[2, 8]"),
            ("checkpoint", "[5]"),
            ("restarts", "[]"),
        ] {
            let text = format!(r#"{{"name": "j", "command": ["x"], "{section}": {value}}}"#);
            let err = JobSpec::from_json(text.as_bytes()).unwrap_err();
            assert_eq!(err.field(), Some(section), "{text}: {err}");
            assert!(err.to_string().contains("expected a mapping"), "{err}");
        }
        let text = r#"{"name": "j", "command": ["x"], "resources": {"nodes": 2}}"#;
        assert_eq!(
            JobSpec::from_json(text.as_bytes()).unwrap().resources.nodes,
            2
        );
    }

    #[test]
    fn versions_compare_with_missing_components_as_zero() {
        let v = |s: &str| Version::parse(s).unwrap();
        assert_eq!(v("2.0"), v("2.0.0"));
        assert!(v("535.104.05") > v("535.54.03"));
        assert!(v("11.10") > v("11.8"));
        assert_eq!(v("535.104.05").to_string(), "535.104.5");
        assert!(Version::parse("1.x").is_none());
        assert!(Version::parse("").is_none());
        assert!(Version::parse("1..2").is_none());
        assert!(Version::parse("1.2.3.4.5").is_none());
    }
}
