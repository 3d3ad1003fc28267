//! Models and their versions. A version points at a content-addressed
//! artifact and records where it came from ([`Lineage`]); later stages
//! (training, quantization, retraining) fill the lineage in.

use std::collections::BTreeMap;

use edgeloop_models::manifest::{SignedManifest, MAX_SIGNED_MANIFEST_BYTES};
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::io::AsyncReadExt;

use super::Trees;
use crate::aliases;
use crate::artifacts::ArtifactStore;
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRecord {
    pub name: String,
    #[serde(default = "edgeloop_api::access::default_project")]
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

/// The version's lineage is the console API's type (the records store it
/// as the API shows it).
pub use edgeloop_api::registry::{
    ArtifactFormat, CreateModel, CreateModelVersion, CreateVariant, Lineage, VariantView,
};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelVersionRecord {
    pub model: String,
    pub version: String,
    pub artifact_digest: Digest,
    pub artifact_size: u64,
    pub format: ArtifactFormat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    pub probe_inputs_digest: Option<Digest>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub lineage: Lineage,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Stored as the API shows them, like the lineage.
    #[serde(default)]
    pub variants: Vec<VariantView>,
}

pub fn version_key(model: &str, version: &str) -> String {
    // '/' cannot occur in a model name, so prefixes never collide.
    format!("{model}/{version}")
}

pub async fn create_model(
    store: &Trees,
    req: CreateModel,
    now: OffsetDateTime,
) -> Result<ModelRecord> {
    validate::name("name", &req.name)?;
    let description = req.description.unwrap_or_default();
    validate::text("description", &description, 4096)?;
    if let Some(task) = &req.task {
        validate::text("task", task, 128)?;
    }
    let labels = req.labels.unwrap_or_default();
    validate::labels("labels", &labels)?;
    let project = validate::project(req.project)?;
    let record = ModelRecord {
        name: req.name,
        project,
        description,
        task: req.task,
        labels,
        created_at: now,
    };
    if !store.models.insert_new(&record.name, &record)? {
        return Err(Error::Conflict(format!(
            "model {:?} already exists",
            record.name
        )));
    }
    store.flush().await?;
    Ok(record)
}

pub fn get_model(store: &Trees, name: &str) -> Result<ModelRecord> {
    store
        .models
        .get(name)?
        .ok_or_else(|| Error::not_found("model", name))
}

/// The project of model `name`, or the default one when it is gone: a
/// record naming a deleted model (a deployment, a pipeline) still belongs
/// somewhere, where only unscoped and `default` tokens see it.
pub fn project_or_default(store: &Trees, name: &str) -> Result<String> {
    Ok(store
        .models
        .get(name)?
        .map(|m| m.project)
        .unwrap_or_else(edgeloop_api::access::default_project))
}

/// The project model `name` belongs to (404 when there is no such model).
pub fn project_of(store: &Trees, name: &str) -> Result<String> {
    Ok(get_model(store, name)?.project)
}

pub fn list_versions(store: &Trees, model: &str) -> Result<Vec<ModelVersionRecord>> {
    get_model(store, model)?;
    let mut versions: Vec<_> = store
        .model_versions
        .scan_prefix(&format!("{model}/"))?
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    versions.sort_by(|a, b| {
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.version.cmp(&b.version))
    });
    Ok(versions)
}

pub fn get_version(store: &Trees, model: &str, version: &str) -> Result<ModelVersionRecord> {
    get_model(store, model)?;
    store
        .model_versions
        .get(&version_key(model, version))?
        .ok_or_else(|| Error::not_found("model version", format!("{model}:{version}")))
}

pub async fn create_version(
    store: &Trees,
    artifacts: &dyn ArtifactStore,
    model: &str,
    req: CreateModelVersion,
    now: OffsetDateTime,
) -> Result<ModelVersionRecord> {
    get_model(store, model)?;
    if let Some(v) = &req.version {
        validate::version("version", v)?;
        if aliases::points_somewhere(store, model, v)? {
            return Err(Error::Conflict(format!(
                "model {model:?} has an alias {v:?}; a version may not have an alias's name"
            )));
        }
    }
    let format = req.format.unwrap_or_default();
    let artifact_size = uploaded_size(artifacts, req.artifact_digest).await?;
    let (probe_inputs_digest, manifest_version) = match req.manifest_digest {
        Some(m) => {
            let (probe, signed) =
                check_manifest(artifacts, m, req.artifact_digest, artifact_size).await?;
            let version = check_identity(&signed.manifest, model, req.version.as_deref())?;
            (probe, Some(version))
        }
        None => (None, None),
    };
    // A signed manifest names its version: that is the version registered.
    let version_asked = req.version.or(manifest_version);
    let metrics = req.metrics.unwrap_or_default();
    if let Some((k, _)) = metrics.iter().find(|(_, v)| !v.is_finite()) {
        return Err(Error::bad_field(
            format!("metrics.{k}"),
            "must be a finite number",
        ));
    }
    let lineage = req.lineage.unwrap_or_default();
    if let Some(parent) = &lineage.parent_version {
        if !store.model_versions.contains(&version_key(model, parent))? {
            return Err(Error::bad_field(
                "lineage.parent_version",
                format!("version {parent:?} of model {model:?} does not exist"),
            ));
        }
    }
    if let Some(t) = &lineage.trigger {
        validate::text("lineage.trigger", t, 128)?;
    }
    let explicit = version_asked.is_some();
    let mut next = store
        .model_versions
        .scan_prefix(&format!("{model}/"))?
        .len()
        + 1;
    loop {
        let version = version_asked.clone().unwrap_or_else(|| next.to_string());
        let record = ModelVersionRecord {
            model: model.to_string(),
            version: version.clone(),
            artifact_digest: req.artifact_digest,
            artifact_size,
            format,
            manifest_digest: req.manifest_digest,
            probe_inputs_digest,
            metrics: metrics.clone(),
            lineage: lineage.clone(),
            created_at: now,
            variants: Vec::new(),
        };
        if store
            .model_versions
            .insert_new(&version_key(model, &version), &record)?
        {
            store.flush().await?;
            return Ok(record);
        }
        if explicit {
            return Err(Error::Conflict(format!(
                "model {model:?} already has version {version:?}"
            )));
        }
        next += 1;
    }
}

/// Variants a version may carry: more is a typo or abuse.
const MAX_VARIANTS: usize = 8;

/// Adds a variant to a version. The variant is immutable once added, like
/// the version: a second variant of the same name is a conflict.
pub async fn add_variant(
    store: &Trees,
    artifacts: &dyn ArtifactStore,
    model: &str,
    version: &str,
    req: CreateVariant,
    now: OffsetDateTime,
) -> Result<ModelVersionRecord> {
    let current = get_version(store, model, version)?;
    validate::name("name", &req.name)?;
    validate::execution_providers("providers", &req.providers)?;
    if current.format != ArtifactFormat::Onnx {
        return Err(Error::bad_field(
            "artifact_digest",
            format!(
                "only onnx versions take variants; this one is {}",
                current.format
            ),
        ));
    }
    let artifact_size = uploaded_size(artifacts, req.artifact_digest).await?;
    let (probe_inputs_digest, signed) = check_manifest(
        artifacts,
        req.manifest_digest,
        req.artifact_digest,
        artifact_size,
    )
    .await?;
    let variant_manifest = &signed.manifest;
    // Same identity and interface as the version's own: a client must not
    // be able to tell which variant answered, except by speed.
    match current.manifest_digest {
        Some(own) => {
            let own = read_manifest(artifacts, own, "manifest_digest")
                .await?
                .manifest;
            if (&variant_manifest.name, &variant_manifest.version) != (&own.name, &own.version) {
                return Err(Error::bad_field(
                    "manifest_digest",
                    format!(
                        "the manifest is for {} {}, the version's own for {} {}",
                        variant_manifest.name, variant_manifest.version, own.name, own.version
                    ),
                ));
            }
            if variant_manifest.signature != own.signature {
                return Err(Error::bad_field(
                    "manifest_digest",
                    "the variant's inputs and outputs differ from the version's own; a variant must be a drop-in",
                ));
            }
        }
        None if variant_manifest.name != model => {
            return Err(Error::bad_field(
                "manifest_digest",
                format!(
                    "the manifest is for model {:?}, not {model:?}",
                    variant_manifest.name
                ),
            ));
        }
        None => {}
    }
    let quantization = variant_manifest
        .quantization
        .as_ref()
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| Error::Internal(anyhow::Error::new(e).context("the variant's evidence")))?;
    let variant = VariantView {
        name: req.name.clone(),
        artifact_digest: req.artifact_digest,
        artifact_size,
        manifest_digest: req.manifest_digest,
        probe_inputs_digest,
        providers: req.providers,
        quantization,
        created_at: now,
    };
    let record = store
        .model_versions
        .update(&version_key(model, version), |cur| {
            let mut cur =
                cur.ok_or_else(|| Error::not_found("model version", format!("{model}:{version}")))?;
            if cur.variants.iter().any(|v| v.name == variant.name) {
                return Err(Error::Conflict(format!(
                    "version {version:?} of model {model:?} already has a variant {:?}",
                    variant.name
                )));
            }
            if cur.variants.len() >= MAX_VARIANTS {
                return Err(Error::bad_field(
                    "name",
                    format!("a version carries at most {MAX_VARIANTS} variants"),
                ));
            }
            cur.variants.push(variant.clone());
            Ok(cur)
        })??;
    store.flush().await?;
    Ok(record)
}

/// A manifest signed for one model and version is registered only as
/// that model and version: otherwise a manifest signed for `rainfall
/// 1.0.0` could be served as `digits 7`. Returns the manifest's version.
fn check_identity(
    m: &edgeloop_models::manifest::Manifest,
    model: &str,
    version: Option<&str>,
) -> Result<String> {
    if m.name != model {
        return Err(Error::bad_field(
            "manifest_digest",
            format!(
                "the manifest is signed for model {:?}, not {model:?}",
                m.name
            ),
        ));
    }
    if let Some(v) = version {
        if m.version != v {
            return Err(Error::bad_field(
                "manifest_digest",
                format!(
                    "the manifest is signed for version {:?} of {model:?}, not {v:?}",
                    m.version
                ),
            ));
        }
    }
    validate::version("manifest_digest", &m.version)?;
    Ok(m.version.clone())
}

/// Checks that `manifest` is an uploaded signed manifest describing this
/// version's artifact, so that a device is never sent a version whose
/// manifest disagrees with it (the device refuses those, but only after a
/// download). Returns the health probe's sample inputs, if the manifest names
/// any, and the manifest itself. The signature is not checked here: which
/// keys a device trusts is the device's configuration.
async fn check_manifest(
    artifacts: &dyn ArtifactStore,
    manifest: Digest,
    artifact_digest: Digest,
    artifact_size: u64,
) -> Result<(Option<Digest>, SignedManifest)> {
    let bad = |message: String| Error::bad_field("manifest_digest", message);
    let signed = read_manifest(artifacts, manifest, "manifest_digest").await?;
    let described = &signed.manifest.artifact;
    if described.sha256 != artifact_digest {
        return Err(bad(format!(
            "the manifest describes artifact {}, not {artifact_digest}",
            described.sha256
        )));
    }
    if described.size != artifact_size {
        return Err(bad(format!(
            "the manifest gives the artifact size as {}, but artifact {artifact_digest} is {artifact_size} bytes",
            described.size
        )));
    }
    let Some(probe) = signed
        .manifest
        .health_probe
        .as_ref()
        .map(|p| p.sample_inputs)
    else {
        return Ok((None, signed));
    };
    if artifacts.head(probe).await?.is_none() {
        return Err(bad(format!(
            "the manifest's health_probe.sample_inputs artifact {probe} has not been uploaded"
        )));
    }
    Ok((Some(probe), signed))
}

/// The size of an uploaded artifact; a 400 naming `artifact_digest` if it
/// was never uploaded.
async fn uploaded_size(artifacts: &dyn ArtifactStore, digest: Digest) -> Result<u64> {
    artifacts.head(digest).await?.ok_or_else(|| {
        Error::bad_field(
            "artifact_digest",
            format!("artifact {digest} has not been uploaded"),
        )
    })
}

/// Reads a signed manifest from the artifact store; errors name `field`.
/// The signature is not checked here (devices check it against their own
/// trusted keys); the structure is.
pub async fn read_manifest(
    artifacts: &dyn ArtifactStore,
    manifest: Digest,
    field: &str,
) -> Result<SignedManifest> {
    let bytes = read_manifest_bytes(artifacts, manifest, field).await?;
    SignedManifest::from_json(&bytes).map_err(|e| {
        Error::bad_field(
            field,
            format!("artifact {manifest} is not a signed manifest: {e}"),
        )
    })
}

/// A stored manifest's bytes, signed or not, bounded by the size a signed
/// one may have.
pub async fn read_manifest_bytes(
    artifacts: &dyn ArtifactStore,
    manifest: Digest,
    field: &str,
) -> Result<Vec<u8>> {
    let bad = |message: String| Error::bad_field(field, message);
    let size = artifacts
        .head(manifest)
        .await?
        .ok_or_else(|| bad(format!("artifact {manifest} has not been uploaded")))?;
    if size > MAX_SIGNED_MANIFEST_BYTES as u64 {
        return Err(bad(format!(
            "artifact {manifest} is {size} bytes, too large for a signed manifest \
             (at most {MAX_SIGNED_MANIFEST_BYTES})"
        )));
    }
    let (_, mut reader) = artifacts.open_at(manifest, 0).await?;
    let mut bytes = Vec::with_capacity(size as usize);
    reader
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| Error::Internal(anyhow::Error::new(e).context("reading the manifest")))?;
    Ok(bytes)
}

// What the console API shows of a record (`edgeloop_api::registry`).

impl From<ModelRecord> for edgeloop_api::registry::ModelView {
    fn from(m: ModelRecord) -> Self {
        edgeloop_api::registry::ModelView {
            name: m.name,
            project: m.project,
            description: m.description,
            task: m.task,
            labels: m.labels,
            created_at: m.created_at,
        }
    }
}

impl From<ModelVersionRecord> for edgeloop_api::registry::ModelVersionView {
    fn from(v: ModelVersionRecord) -> Self {
        edgeloop_api::registry::ModelVersionView {
            model: v.model,
            version: v.version,
            artifact_digest: v.artifact_digest,
            artifact_size: v.artifact_size,
            format: v.format,
            manifest_digest: v.manifest_digest,
            probe_inputs_digest: v.probe_inputs_digest,
            metrics: v.metrics,
            lineage: v.lineage,
            created_at: v.created_at,
            variants: v.variants,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version record as stored before formats were typed: the format
    /// is the same string, and the record writes back the same JSON.
    #[test]
    fn a_stored_version_record_reads_its_format() {
        let digest = "ab".repeat(32);
        let stored = serde_json::json!({
            "model": "digits", "version": "3", "artifact_digest": digest,
            "artifact_size": 2048, "format": "checkpoint",
            "metrics": {"eval_accuracy": 0.97}, "lineage": {"trigger": "manual"},
            "created_at": "2026-12-01T00:00:00Z", "variants": []
        });
        let record: ModelVersionRecord = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(record.format, ArtifactFormat::Checkpoint);
        assert_eq!(serde_json::to_value(&record).unwrap(), stored);
        let mut unknown = stored;
        unknown["format"] = serde_json::json!("pickle");
        let e = serde_json::from_value::<ModelVersionRecord>(unknown).unwrap_err();
        assert!(
            e.to_string().starts_with("unknown format \"pickle\""),
            "{e}"
        );
    }
}
