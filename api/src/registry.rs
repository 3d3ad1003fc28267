//! The model registry as the console API shows it: models, their versions
//! and where each version came from (`/api/v1/models/...`). The store's
//! records are in `registry/src/models.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use edgeloop_models::manifest::Lineage as ManifestLineage;

use crate::images::PinnedImage;
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// `GET /api/v1/models/{name}` (and each entry of `GET /api/v1/models`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelView {
    pub name: String,
    /// The project the model, its versions, deployments and pipelines belong to.
    #[serde(default = "crate::access::default_project")]
    pub project: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// The artifact formats the registry knows.
// Written in lowercase (`onnx`, ...); a name not among them is refused
// with the list (the doc comment above is the OpenAPI description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ArtifactFormat {
    #[default]
    Onnx,
    Torchscript,
    Safetensors,
    Checkpoint,
}

impl ArtifactFormat {
    pub const ALL: [ArtifactFormat; 4] = [
        ArtifactFormat::Onnx,
        ArtifactFormat::Torchscript,
        ArtifactFormat::Safetensors,
        ArtifactFormat::Checkpoint,
    ];

    /// As the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactFormat::Onnx => "onnx",
            ArtifactFormat::Torchscript => "torchscript",
            ArtifactFormat::Safetensors => "safetensors",
            ArtifactFormat::Checkpoint => "checkpoint",
        }
    }
}

impl fmt::Display for ArtifactFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ArtifactFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ArtifactFormat::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                let names = ArtifactFormat::ALL.map(ArtifactFormat::as_str);
                format!("unknown format {s:?}; expected one of {names:?}")
            })
    }
}

/// By name, with [`FromStr`]'s message for a name not among them (serde's
/// would not say it is a format).
impl<'de> Deserialize<'de> for ArtifactFormat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a model version came from. Every field is optional: a hand-uploaded
/// model has none, a retrained one has all of them.
///
/// `job`, `checkpoint`, `dataset` and `parent_version` are the signed
/// manifest's lineage ([`ManifestLineage`]) under the same names; the
/// registry adds what caused the version and the quantization evidence. The
/// names the registry used before (`training_job`, `checkpoint_digest`,
/// `dataset_snapshot`) are still read, from old clients and old records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Lineage {
    /// The version this one was derived from (same model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
            min_length = 1,
            max_length = 64
        )
    )]
    pub parent_version: Option<String>,
    /// What caused it: "manual", "drift", "schedule", ...
    /// At most 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 128))]
    pub trigger: Option<String>,
    /// Digest of the dataset (snapshot) it was trained on.
    #[serde(
        default,
        alias = "dataset_snapshot",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub dataset: Option<Digest>,
    /// The training job that produced it.
    #[serde(
        default,
        alias = "training_job",
        skip_serializing_if = "Option::is_none"
    )]
    pub job: Option<String>,
    /// Digest of the checkpoint its model was exported from.
    #[serde(
        default,
        alias = "checkpoint_digest",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub checkpoint: Option<Digest>,
    /// The container image the job ran, as its engine pinned it: the
    /// software that trained the model. Filled from the job's record when
    /// `job` names a job that pinned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<PinnedImage>,
    /// The quantization evidence (every candidate's numbers), free-form:
    /// usually `{"method": .., "evidence": ..}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub quantization: Option<serde_json::Value>,
    /// Labelled hard examples (through the labelling queue, or by feedback
    /// on the device) in the snapshot
    /// it was trained on; set by the retraining pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub hard_examples: Option<u64>,
}

impl CreateModelVersion {
    /// A request for `artifact_digest` with nothing else given.
    pub fn new(artifact_digest: Digest) -> CreateModelVersion {
        CreateModelVersion {
            version: None,
            artifact_digest,
            format: None,
            manifest_digest: None,
            metrics: None,
            lineage: None,
        }
    }
}

impl Lineage {
    /// The quantization method when the evidence names one as a string.
    pub fn quantization_method(&self) -> Option<&str> {
        self.quantization.as_ref()?.get("method")?.as_str()
    }

    /// The registry's lineage for a version whose signed manifest says
    /// where it came from.
    pub fn from_manifest(m: &ManifestLineage) -> Lineage {
        Lineage {
            parent_version: m.parent_version.clone(),
            dataset: m.dataset,
            job: m.job.clone(),
            checkpoint: m.checkpoint,
            ..Lineage::default()
        }
    }

    /// The part a signed manifest records.
    pub fn manifest(&self) -> ManifestLineage {
        ManifestLineage {
            job: self.job.clone(),
            checkpoint: self.checkpoint,
            dataset: self.dataset,
            parent_version: self.parent_version.clone(),
        }
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
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub format: ArtifactFormat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub manifest_digest: Option<Digest>,
    /// The health probe's inputs (`.npz`), named by the manifest's
    /// `health_probe.sample_inputs`; devices fetch it with the model to
    /// probe a version before it serves. Read as `probe_inputs_digest` too, its
    /// name before.
    #[serde(
        default,
        alias = "probe_digest",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub probe_inputs_digest: Option<Digest>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub lineage: Lineage,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// More artifacts of this version, each for a class of hardware (e.g.
    /// `fp16` for CUDA/TensorRT beside this int8 artifact for CPUs). A
    /// device gets the first variant whose providers it has, else the
    /// version's own artifact.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantView>,
}

/// One more artifact of a version, for the devices that have one of its
/// execution providers. Signed like the version's own, with the same
/// interface, and with its own gate evidence (from its manifest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VariantView {
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub artifact_digest: Digest,
    pub artifact_size: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub manifest_digest: Digest,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub probe_inputs_digest: Option<Digest>,
    /// Execution providers this variant is for, e.g.
    /// `["TensorrtExecutionProvider", "CUDAExecutionProvider"]`.
    pub providers: Vec<String>,
    /// The gate's evidence for this variant, from its signed manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub quantization: Option<serde_json::Value>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl VariantView {
    /// The method its gate chose, when the evidence names one.
    pub fn quantization_method(&self) -> Option<&str> {
        self.quantization.as_ref()?.get("method")?.as_str()
    }
}

/// `POST /api/v1/models/{name}/versions/{version}/variants`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateVariant {
    /// A DNS label, unique within the version, e.g. `fp16-cuda`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub artifact_digest: Digest,
    /// A signed manifest describing the artifact, for the same model and
    /// version and with the same inputs and outputs as the version's own.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub manifest_digest: Digest,
    /// Execution providers it is for, in the device's terms
    /// (`CUDAExecutionProvider`, `TensorrtExecutionProvider`, ...).
    #[cfg_attr(
        feature = "openapi",
        schema(schema_with = crate::schema::execution_providers)
    )]
    pub providers: Vec<String>,
}

/// The variant a device with these execution providers gets: the first
/// one naming any of them, in the version's order; `None` means the
/// version's own artifact.
pub fn variant_for<'a>(
    variants: &'a [VariantView],
    providers: &[String],
) -> Option<&'a VariantView> {
    variants
        .iter()
        .find(|v| v.providers.iter().any(|p| providers.contains(p)))
}

/// The registry's version rule, for every caller that names a version
/// (the server on every request, the CLI before it sends one).
pub const VERSION_RULE: &str = "use 1-64 of A-Z a-z 0-9 . _ + -, starting with a letter or digit";

/// The version rule as a pattern, for the OpenAPI document.
pub const VERSION_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$";

/// Model versions: 1..=64 of `[A-Za-z0-9._+-]`, starting with an
/// alphanumeric: they appear in URLs and file names.
pub fn is_valid_version(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'))
        && value.as_bytes()[0].is_ascii_alphanumeric()
}

/// `POST /api/v1/models/{name}/versions`: registers a version whose
/// artifact (and manifest, and the manifest's probe inputs) is uploaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateModelVersion {
    /// Defaults to the next integer ("1", "2", ...). May not be the name of
    /// one of the model's aliases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
            min_length = 1,
            max_length = 64
        )
    )]
    pub version: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub artifact_digest: Digest,
    /// Defaults to "onnx".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ArtifactFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub manifest_digest: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<BTreeMap<String, f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
}

/// `POST /api/v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateModel {
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 128))]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::optional_labels))]
    pub labels: Option<BTreeMap<String, String>>,
    /// The project it belongs to (`default` when absent); fixed once created.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for good in ["1", "1.2.3", "v2-rc.1+build5", "A_b", &"1".repeat(64)] {
            assert!(is_valid_version(good), "{good}");
        }
        for bad in ["", ".1", "-1", "1/2", "a b", "ü", &"1".repeat(65)] {
            assert!(!is_valid_version(bad), "{bad}");
        }
    }

    #[test]
    fn formats_read_and_write_their_names() {
        for f in ArtifactFormat::ALL {
            let json = serde_json::to_value(f).unwrap();
            assert_eq!(json, f.as_str());
            assert_eq!(serde_json::from_value::<ArtifactFormat>(json).unwrap(), f);
        }
        let e = serde_json::from_value::<ArtifactFormat>(serde_json::json!("pt")).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"unknown format "pt"; expected one of ["onnx", "torchscript", "safetensors", "checkpoint"]"#
        );
    }

    #[test]
    fn lineage_reads_the_old_names_and_writes_the_manifest_names() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let old: Lineage = serde_json::from_value(serde_json::json!({
            "training_job": "j-1", "checkpoint_digest": digest, "dataset_snapshot": digest,
        }))
        .unwrap();
        let written = serde_json::to_value(&old).unwrap();
        let hex = "ab".repeat(32);
        assert_eq!(
            written,
            serde_json::json!({"job": "j-1", "checkpoint": hex, "dataset": hex})
        );
        assert_eq!(Lineage::from_manifest(&old.manifest()), old);
        let typo = serde_json::from_value::<Lineage>(serde_json::json!({"jobs": "j"}));
        assert!(typo.unwrap_err().to_string().contains("jobs"));
    }
}
