//! Devices, cluster bridges and their bootstrap tokens as the console API
//! shows them (`/api/v1/devices`, `/api/v1/clusters`, `/api/v1/tokens`).
//! The store's records are in `control-plane/src/fleet/members.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::images::ContainerWay;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MemberKind {
    Device,
    Cluster,
}

impl MemberKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberKind::Device => "device",
            MemberKind::Cluster => "cluster",
        }
    }

    /// The name in the member's certificate.
    pub fn identity(self, id: &str) -> String {
        format!("{}/{id}", self.as_str())
    }

    /// Splits `device/<id>` back into kind and id.
    pub fn parse_identity(identity: &str) -> Option<(MemberKind, &str)> {
        let (kind, id) = identity.split_once('/')?;
        let kind = match kind {
            "device" => MemberKind::Device,
            "cluster" => MemberKind::Cluster,
            _ => return None,
        };
        Some((kind, id))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MemberStatus {
    Online,
    Offline,
    Revoked,
}

impl MemberStatus {
    /// As the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberStatus::Online => "online",
            MemberStatus::Offline => "offline",
            MemberStatus::Revoked => "revoked",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TokenState {
    Unused,
    Used,
    Expired,
}

/// What a member reported about itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Capabilities {
    #[serde(default)]
    pub agent_version: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub arch: String,
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub execution_providers: Vec<String>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub free_disk_bytes: u64,
    #[serde(default)]
    pub engines: Vec<String>,
    #[serde(default)]
    pub driver_version: String,
    #[serde(default)]
    pub cuda_version: String,
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
    /// Cluster bridges: the node pools of each engine, with their GPU facts.
    #[serde(default)]
    pub pools: Vec<NodePool>,
}

/// A group of alike nodes that one of a bridge's engines can place a job
/// on: a Slurm partition's nodes with the same GRES, a Ray node type, the
/// Kubernetes nodes of one GPU product, or this machine (`local`). The
/// pre-flight check holds a job against the pool it would land on, not
/// against a sum over the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodePool {
    /// `local`, `slurm`, `ray` or `kubernetes`.
    pub engine: String,
    /// The pool within the engine: the Slurm partition (and GRES type), the
    /// Ray accelerator type, the Kubernetes GPU product; `local` for this
    /// machine.
    pub name: String,
    /// Nodes in the pool; `None` where the engine is not bounded by nodes
    /// (the local engine runs any number of "nodes" as process groups).
    #[serde(default)]
    pub nodes: Option<u32>,
    /// The most GPUs any one job may get per node in this pool.
    #[serde(default)]
    pub gpus_per_node: u32,
    /// The GPU as the engine names it: Slurm's GRES type (`a100`), Ray's
    /// `accelerator_type:*`, the `nvidia.com/gpu.product` label, NVML's name.
    #[serde(default)]
    pub gpu_type: Option<String>,
    #[serde(default)]
    pub gpu_memory_bytes: Option<u64>,
    /// NVIDIA driver, e.g. `535.104.05`.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The newest CUDA the driver supports, e.g. `12.2`.
    #[serde(default)]
    pub cuda_version: Option<String>,
    #[serde(default)]
    pub cpus_per_node: u32,
    #[serde(default)]
    pub memory_mb_per_node: u64,
    /// Where the facts came from, e.g. `slurmrestd GET /slurm/v0.0.38/nodes`
    /// or `nvidia-smi`; `config` for facts set in the bridge's config.
    pub source: String,
    /// How the engine lands a job in this pool, in the engine's own terms
    /// (Slurm: `partition`, `gres_type`; Kubernetes: the node labels to
    /// select). Written and read by the engine that reported the pool.
    #[serde(default)]
    pub placement: BTreeMap<String, String>,
    /// How the pool runs a job's `image`; empty: it runs none, and a job
    /// naming one is refused before it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerWay>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Gpu {
    pub model: String,
    pub memory_bytes: u64,
    pub count: u32,
}

/// A device or cluster bridge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberView {
    pub id: String,
    pub kind: MemberKind,
    /// The project a device serves (its models' deployments reach it);
    /// clusters are shared and say `default`.
    #[serde(default = "crate::access::default_project")]
    pub project: String,
    pub status: MemberStatus,
    pub labels: BTreeMap<String, String>,
    pub capabilities: Capabilities,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_seen: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub enrolled_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
    pub revoked_reason: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub cert_not_after: OffsetDateTime,
    /// A device's models as it reported them, one per assigned model:
    /// `GET /api/v1/devices/{id}` always, a listing with
    /// `include=serving`; absent otherwise and for clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<Vec<ServingView>>,
    /// When the device's last telemetry report arrived, with it `serving`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetrySeen>,
}

/// A model assigned to a device and what the device says of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServingView {
    pub model: String,
    /// The version its assignment names.
    pub assigned_version: String,
    /// The version's variant it was given (e.g. `fp16-gpu`); absent: the
    /// version's own artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// What the device last said serves; absent before its first `active`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_version: Option<String>,
    /// Its last status report on the assignment; absent before any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<AssignmentState>,
    /// The execution provider the session runs on, as reported.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub execution_provider: String,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub reported_at: Option<OffsetDateTime>,
}

/// A device's last telemetry report: when it arrived, and how long after
/// the device recorded it (store-and-forward holds reports while offline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TelemetrySeen {
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// `received_at` less the device's own recording time; absent when
    /// the report did not say when it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
}

/// A device's state of one assignment, as it reported it. Written in
/// snake case (`"rolled_back"`). Records written before this type hold the
/// protobuf enum names (`"ASSIGNMENT_STATE_ROLLED_BACK"`); the aliases read
/// them, so no rewrite of the tree is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AssignmentState {
    #[serde(alias = "ASSIGNMENT_STATE_DOWNLOADING")]
    Downloading,
    #[serde(alias = "ASSIGNMENT_STATE_ACTIVATING")]
    Activating,
    #[serde(alias = "ASSIGNMENT_STATE_ACTIVE")]
    Active,
    #[serde(alias = "ASSIGNMENT_STATE_FAILED")]
    Failed,
    #[serde(alias = "ASSIGNMENT_STATE_ROLLED_BACK")]
    RolledBack,
}

impl AssignmentState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Downloading => "downloading",
            Self::Activating => "activating",
            Self::Active => "active",
            Self::Failed => "failed",
            Self::RolledBack => "rolled_back",
        }
    }
}

/// A bootstrap token, never its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    pub id: String,
    pub kind: MemberKind,
    pub member_id: String,
    pub labels: BTreeMap<String, String>,
    pub state: TokenState,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// `POST /api/v1/tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token enrolls: a device (edge agent) or a cluster (trainer bridge).
    pub kind: MemberKind,
    /// The id the member will get; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub name: Option<String>,
    /// Labels the member starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::optional_labels))]
    pub labels: Option<BTreeMap<String, String>>,
    /// Lifetime in seconds (60 to 2 592 000); defaults to 24 hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 60, maximum = 2592000))]
    pub ttl_seconds: Option<u64>,
    /// The project the enrolled device belongs to (`default` when absent).
    /// Only deployments of that project's models reach it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub project: Option<String>,
}

/// The answer to `POST /api/v1/tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedToken {
    /// The bootstrap token. Shown once: only its hash is stored.
    pub token: String,
    pub id: String,
    pub kind: MemberKind,
    pub member_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// sha256 of the CA certificate, also embedded in the token.
    pub ca_fingerprint: String,
}

/// `PUT /api/v1/{devices,clusters}/{id}/labels`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LabelsRequest {
    /// The complete new label set (replaces the old one).
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::labels))]
    pub labels: BTreeMap<String, String>,
}
