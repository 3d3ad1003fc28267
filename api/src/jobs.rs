//! Training jobs as the console API shows them (`/api/v1/jobs/...`). The
//! store's records are in `control-plane/src/lifecycle/jobs.rs` and
//! `registry/src/checkpoints.rs`.

use std::collections::BTreeMap;

use edgeloop_models::Digest;

use crate::images::PinnedImage;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Leased,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// As the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Leased => "leased",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProgressEvent {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub attempt: u32,
    pub state: JobState,
    pub step: u64,
    pub metrics: BTreeMap<String, f64>,
    pub message: String,
}

/// The job spec as submitted (`edgeloop_api::spec::JobSpec`'s JSON): its
/// name, and the rest as it came.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubmittedSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A job without its checkpoints: each entry of `GET /api/v1/jobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    pub id: String,
    /// The engine-neutral job spec (`edgeloop_api::spec::JobSpec`), as submitted.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub spec: SubmittedSpec,
    #[serde(default = "crate::access::default_project")]
    pub project: String,
    /// Only this cluster may lease the job, when set.
    pub cluster: Option<String>,
    pub state: JobState,
    /// The cluster holding the lease, and until when.
    pub leased_by: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub lease_expires_at: Option<OffsetDateTime>,
    pub attempt: u32,
    pub step: u64,
    pub engine_job_id: Option<String>,
    /// The spec's `image` as the engine pinned it at the first attempt;
    /// every attempt runs it. Absent until then, for a job without an
    /// image, and where the engine runs a tag as given (Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<PinnedImage>,
    /// Restarts after failures (at most the spec's
    /// `restarts.max_restarts`), and after preemptions, counted apart (at
    /// most `restarts.max_preemptions`).
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub preemptions: u32,
    pub exit_code: Option<i32>,
    pub cancel_requested: bool,
    pub last_message: String,
    pub history: Vec<ProgressEvent>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// A checkpoint a bridge uploaded for a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckpointView {
    pub job_id: String,
    pub attempt: u32,
    pub step: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub digest: Digest,
    pub size: u64,
    pub has_optimizer_state: bool,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The cluster that uploaded it.
    pub cluster: String,
    #[serde(with = "time::serde::rfc3339")]
    pub uploaded_at: OffsetDateTime,
}

/// `GET /api/v1/jobs/{id}`: the job with its checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    #[serde(flatten)]
    pub job: Job,
    pub checkpoints: Vec<CheckpointView>,
}

/// `POST /api/v1/jobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateJob {
    /// The job spec (see `edgeloop_api::spec::JobSpec`).
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::spec::JobSpecSchema))]
    pub spec: Value,
    /// Run only on this cluster.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub cluster: Option<String>,
    /// The project the job belongs to (`default` when absent).
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
