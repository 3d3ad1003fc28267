//! Packaging a trained float model for the fleet: the accuracy gate picks
//! the smallest candidate within budget, and a signed manifest describes it
//! (signature, reference statistics for drift, lineage). One code path for
//! `edgeloop model quantize` and the retraining pipeline's Quantize step.

use std::path::{Path, PathBuf};

use crate::dataset::{reference_stats_with, Dataset, FeatureNames};
use crate::manifest::{
    ArtifactRef, DimSpec, HealthProbe, IoSignature, Lineage, Manifest, ManifestError, ManifestKey,
    QuantizationRecord, SignedManifest, TensorSpec, SCHEMA_VERSION,
};
use crate::onnx::{self, ir, Dim, ValueSummary};
use crate::quantize::gate::{predictions, run_gate, GateOptions, GateOutcome};
use crate::quantize::QuantizeError;
use crate::runtime::OrtRuntime;
use crate::Digest;

/// Why packaging failed: the gate could not run, or the manifest could not
/// be made or signed, or the signing key could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(transparent)]
    Gate(#[from] QuantizeError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The chosen model (float, when nothing qualified) does not fit in one
    /// ONNX file: the registry and the devices take one file per version.
    #[error("the chosen model ({chosen}) cannot be shipped as one ONNX file: {source}")]
    TooLarge {
        chosen: String,
        source: onnx::EncodeError,
    },
    #[error("health probe inputs: {0}")]
    Probe(String),
    #[error("formatting the manifest's creation time: {0}")]
    Time(#[from] time::error::Format),
    #[error("{what} {}: {source}", path.display())]
    Key {
        what: &'static str,
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn key_error<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(E) -> PackageError {
    let path = path.to_path_buf();
    move |e| PackageError::Key {
        what,
        path,
        source: Box::new(e),
    }
}

/// Bins of the manifest's per-input reference histograms.
pub const REFERENCE_BINS: usize = 32;

/// The health probe a device runs before it takes traffic: real inputs
/// (`.npz`, one array per model input, the tensor of one call) and the
/// slowest answer it accepts. A model with dynamic sizes needs one: without
/// it the device can only warm up on zeros with every symbolic dim at 1,
/// which a detector with dynamic H×W or a VAD with a padded window cannot run.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeInputs {
    pub npz: Vec<u8>,
    pub max_latency_ms: f64,
}

impl ProbeInputs {
    /// The first call of `data` (its first sample, batch 1), allowing the
    /// device `max_latency_ms`.
    pub fn first_call(data: &Dataset, max_latency_ms: f64) -> Result<ProbeInputs, PackageError> {
        let sample = data
            .timing_sample()
            .ok_or_else(|| PackageError::Probe("the evaluation set has no samples".into()))?;
        let mut npz = crate::npz::Npz::new();
        for (name, t) in sample {
            npz.insert(name, t);
        }
        Ok(ProbeInputs {
            npz: npz
                .to_bytes()
                .map_err(|e| PackageError::Probe(e.to_string()))?,
            max_latency_ms,
        })
    }
}

pub struct Packaged {
    /// The chosen model's ONNX bytes.
    pub artifact: Vec<u8>,
    pub manifest: SignedManifest,
    pub outcome: GateOutcome,
}

/// What the manifest says about where the model came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub name: String,
    pub version: String,
    pub lineage: Lineage,
    /// What to call a tabular input's feature columns in the drift
    /// reference (by input; unnamed columns are `<input>[<j>]`).
    pub feature_names: FeatureNames,
    /// The manifest's anti-rollback floor (`Manifest::min_version`).
    pub min_version: Option<String>,
    /// A signed rollback below devices' floors (`Manifest::rollback`).
    pub rollback: bool,
}

/// Runs the gate on `model` and signs the chosen candidate's manifest (with
/// `probe` as its health probe, when given; the caller stores its bytes).
#[allow(clippy::too_many_arguments)]
pub fn package(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    calibration: &Dataset,
    eval: &Dataset,
    opts: &GateOptions,
    identity: Identity,
    probe: Option<&ProbeInputs>,
    key: &ManifestKey,
) -> Result<Packaged, PackageError> {
    let outcome = run_gate(runtime, model, calibration, eval, opts)?;
    sign_outcome(runtime, outcome, eval, identity, probe, key)
}

/// Signs the manifest of a gate's outcome (its chosen model): what
/// [`package`] does after the gate, for a caller that judged the outcome
/// further first (latency timed on a device: `judge_latency_on`).
pub fn sign_outcome(
    runtime: &OrtRuntime,
    outcome: GateOutcome,
    eval: &Dataset,
    identity: Identity,
    probe: Option<&ProbeInputs>,
    key: &ManifestKey,
) -> Result<Packaged, PackageError> {
    describe_outcome(runtime, outcome, eval, identity, probe)?.sign(key)
}

/// A gate's chosen model and its manifest, not signed yet: for signing
/// with a key the caller does not hold (offline signing), or now.
pub struct Unsigned {
    pub artifact: Vec<u8>,
    /// Valid (checked here), so a signer is never handed one its own
    /// signing would refuse.
    pub manifest: Manifest,
    pub outcome: GateOutcome,
}

impl Unsigned {
    pub fn sign(self, key: &ManifestKey) -> Result<Packaged, PackageError> {
        Ok(Packaged {
            manifest: key.sign(self.manifest)?,
            artifact: self.artifact,
            outcome: self.outcome,
        })
    }
}

/// The manifest of a gate's outcome (its chosen model), with its evidence,
/// reference statistics and probe: everything [`sign_outcome`] signs.
pub fn describe_outcome(
    runtime: &OrtRuntime,
    outcome: GateOutcome,
    eval: &Dataset,
    identity: Identity,
    probe: Option<&ProbeInputs>,
) -> Result<Unsigned, PackageError> {
    let artifact =
        onnx::encode(&outcome.chosen_model).map_err(|source| PackageError::TooLarge {
            chosen: outcome.chosen.clone(),
            source,
        })?;
    // The prediction histogram drift compares against is a class
    // distribution: only a classifier has one.
    let chosen_predictions = match outcome.task {
        crate::quantize::task::Task::Classification => {
            predictions(runtime, &outcome.chosen_model, eval)?
        }
        _ => vec![],
    };
    let names = identity.feature_names.clone();
    let mut manifest = describe(&artifact, &outcome.chosen_model, identity)?;
    manifest.quantization = Some(QuantizationRecord::new(outcome.chosen.clone(), &outcome)?);
    manifest.reference_stats = Some(reference_stats_with(
        eval,
        &chosen_predictions,
        REFERENCE_BINS,
        &names,
    ));
    manifest.health_probe = probe.map(|p| HealthProbe {
        sample_inputs: Digest::of(&p.npz),
        max_latency_ms: p.max_latency_ms,
    });
    manifest.validate()?;
    Ok(Unsigned {
        artifact,
        manifest,
        outcome,
    })
}

/// A manifest describing `artifact` (the bytes of `model`): its digest and
/// size, its inputs and outputs, `identity`; no evidence, statistics or
/// probe yet.
fn describe(
    artifact: &[u8],
    model: &ir::ModelProto,
    identity: Identity,
) -> Result<Manifest, PackageError> {
    let summary = onnx::inspect(model);
    Ok(Manifest {
        schema: SCHEMA_VERSION,
        name: identity.name,
        version: identity.version,
        artifact: ArtifactRef {
            sha256: Digest::of(artifact),
            size: artifact.len() as u64,
            format: "onnx".into(),
        },
        signature: IoSignature {
            inputs: summary.inputs.iter().map(spec).collect(),
            outputs: summary.outputs.iter().map(spec).collect(),
        },
        quantization: None,
        reference_stats: None,
        lineage: identity.lineage,
        health_probe: None,
        created_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)?,
        min_version: identity.min_version,
        rollback: identity.rollback,
    })
}

/// A signed manifest for a model a device is only to time (a gate's
/// candidate in a device benchmark), so that a device that runs only
/// signed models can time it: it names the candidate (`method`) and says
/// nothing of accuracy, which the gate records in the chosen model's
/// manifest alone.
pub fn sign_for_benchmark(
    artifact: &[u8],
    model: &ir::ModelProto,
    identity: Identity,
    method: &str,
    key: &ManifestKey,
) -> Result<SignedManifest, PackageError> {
    let mut manifest = describe(artifact, model, identity)?;
    manifest.quantization = Some(QuantizationRecord::new(
        method,
        &serde_json::json!({"purpose": "device benchmark"}),
    )?);
    Ok(key.sign(manifest)?)
}

/// Longest dim name the manifest keeps (its schema allows 256 bytes).
const MAX_DIM_NAME: usize = 64;

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
                // PyTorch's exporter names a derived dim by its formula
                // (`(floor(floor(height/2 - 1/2)/2) + 1)*...`, 400 bytes on
                // NudeNet): a name, not a size anyone checks, so a long one
                // is signed as unknown rather than refused.
                Dim::Symbolic(s) if s.len() > MAX_DIM_NAME => DimSpec::Symbolic("?".into()),
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
pub fn load_or_create_key(path: &Path) -> Result<ManifestKey, PackageError> {
    if path.exists() {
        return ManifestKey::read_from(path).map_err(key_error("reading signing key", path));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(key_error("creating", dir))?;
    }
    let key = ManifestKey::generate();
    // The public key first: a crash between the two leaves a key pair whose
    // signing half is missing, which the next call regenerates, rather than
    // a signing key whose public half nobody can read.
    let public = public_key_path(path);
    key.public()
        .write_to(&public)
        .map_err(key_error("writing public key", &public))?;
    key.write_to(path)
        .map_err(key_error("writing signing key", path))?;
    tracing::info!(path = %path.display(), "created a manifest signing key (public key beside it, .pub)");
    Ok(key)
}
