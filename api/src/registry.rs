//! The model registry as the console API shows it: models, their versions
//! and where each version came from (`/api/v1/models/...`). The store's
//! records are in `control-plane/src/registry/models.rs`.

use std::collections::BTreeMap;

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// `GET /api/v1/models/{name}` (and each entry of `GET /api/v1/models`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelView {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Where a model version came from. Every field is optional: a hand-uploaded
/// model has none, a retrained one has all of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Lineage {
    /// The version this one was derived from (same model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_version: Option<String>,
    /// What caused it: "manual", "drift", "schedule", ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// Digest of the dataset snapshot it was trained on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub dataset_snapshot: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub checkpoint_digest: Option<Digest>,
    /// The quantization evidence (every candidate's numbers), free-form:
    /// usually `{"method": .., "evidence": ..}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub quantization: Option<serde_json::Value>,
}

impl Lineage {
    /// The quantization method when the evidence names one as a string.
    pub fn quantization_method(&self) -> Option<&str> {
        self.quantization.as_ref()?.get("method")?.as_str()
    }
}

/// `GET /api/v1/models/{name}/versions/{version}` (and each entry of the
/// version list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelVersionView {
    pub model: String,
    pub version: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub artifact_digest: Digest,
    pub artifact_size: u64,
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub manifest_digest: Option<Digest>,
    /// The health probe's sample inputs (`.npz`), named by the manifest;
    /// devices fetch it with the model to probe a version before it serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub probe_digest: Option<Digest>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub lineage: Lineage,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// `POST /api/v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateModel {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}
