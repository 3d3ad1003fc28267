//! Packaging a trained float model for the fleet: the accuracy gate picks
//! the smallest candidate within budget, and a signed manifest describes it
//! (signature, reference statistics for drift, lineage). One code path for
//! `edgeloop model quantize` and the retraining pipeline's Quantize step.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use edgeloop_models::dataset::{reference_stats, Dataset};
use edgeloop_models::manifest::{
    ArtifactRef, DimSpec, IoSignature, Lineage, Manifest, ManifestKey, QuantizationRecord,
    SignedManifest, TensorSpec, SCHEMA_VERSION,
};
use edgeloop_models::onnx::{self, ir, Dim, ValueSummary};
use edgeloop_models::quantize::gate::{predictions, run_gate, GateOptions, GateOutcome};
use edgeloop_models::runtime::OrtRuntime;
use edgeloop_models::Digest;

/// Bins of the manifest's per-input reference histograms.
pub const REFERENCE_BINS: usize = 32;

pub struct Packaged {
    /// The chosen model's ONNX bytes.
    pub artifact: Vec<u8>,
    pub manifest: SignedManifest,
    pub outcome: GateOutcome,
}

/// What the manifest says about where the model came from.
pub struct Identity {
    pub name: String,
    pub version: String,
    pub lineage: Lineage,
}

/// Runs the gate on `model` and signs the chosen candidate's manifest.
pub fn package(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    calibration: &Dataset,
    eval: &Dataset,
    opts: &GateOptions,
    identity: Identity,
    key: &ManifestKey,
) -> anyhow::Result<Packaged> {
    let outcome = run_gate(runtime, model, calibration, eval, opts)?;
    let artifact = onnx::encode(&outcome.chosen_model);
    let chosen_predictions = predictions(runtime, &outcome.chosen_model, eval)?;
    let summary = onnx::inspect(&outcome.chosen_model);
    let manifest = Manifest {
        schema: SCHEMA_VERSION,
        name: identity.name,
        version: identity.version,
        artifact: ArtifactRef {
            sha256: Digest::of(&artifact),
            size: artifact.len() as u64,
            format: "onnx".into(),
        },
        signature: IoSignature {
            inputs: summary.inputs.iter().map(spec).collect(),
            outputs: summary.outputs.iter().map(spec).collect(),
        },
        quantization: Some(QuantizationRecord::new(outcome.chosen.clone(), &outcome)?),
        reference_stats: Some(reference_stats(eval, &chosen_predictions, REFERENCE_BINS)),
        lineage: identity.lineage,
        health_probe: None,
        created_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)?,
    };
    let manifest = key.sign(manifest)?;
    Ok(Packaged {
        artifact,
        manifest,
        outcome,
    })
}

fn spec(v: &ValueSummary) -> TensorSpec {
    TensorSpec {
        name: v.name.clone(),
        dtype: v.dtype.clone(),
        shape: v
            .shape
            .iter()
            .flatten()
            .map(|d| match d {
                Dim::Fixed(n) => DimSpec::Fixed(*n),
                Dim::Symbolic(s) => DimSpec::Symbolic(s.clone()),
                Dim::Unknown => DimSpec::Symbolic("?".into()),
            })
            .collect(),
    }
}

/// The public half of a signing key lives beside it, as `.pub`.
pub fn public_key_path(signing_key: &Path) -> PathBuf {
    signing_key.with_extension("pub")
}

/// Reads the ed25519 signing key at `path`, creating it (mode 0600, with
/// its public key beside it) when missing.
pub fn load_or_create_key(path: &Path) -> anyhow::Result<ManifestKey> {
    if path.exists() {
        return ManifestKey::read_from(path)
            .with_context(|| format!("reading signing key {}", path.display()));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let key = ManifestKey::generate();
    // The public key first: a crash between the two leaves a key pair whose
    // signing half is missing, which the next call regenerates, rather than
    // a signing key whose public half nobody can read.
    key.public()
        .write_to(&public_key_path(path))
        .with_context(|| format!("writing public key {}", public_key_path(path).display()))?;
    key.write_to(path)
        .with_context(|| format!("writing signing key {}", path.display()))?;
    tracing::info!(path = %path.display(), "created a manifest signing key (public key beside it, .pub)");
    Ok(key)
}
