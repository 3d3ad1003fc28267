//! Retraining pipelines as the console API shows them.

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};

use crate::aliases::AliasName;
use crate::UnixSeconds;

/// A retraining pipeline's steps, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Original data + edge hard examples + labelled feedback, as a snapshot.
    BuildDataset,
    /// A training job through a trainer bridge, from the model's template.
    Train,
    /// The final checkpoint to ONNX.
    Export,
    /// Quantization behind the accuracy gate, on recent labelled edge data.
    Quantize,
    /// Offline signing only: the manifests wait for a signature made with a
    /// key kept off the control plane (`edgeloop model sign`). With the
    /// control plane's own key the quantize step signs and this step is
    /// skipped.
    Sign,
    /// A new model version with full lineage.
    Register,
    /// Promote only if the new version beats the serving one.
    Compare,
    /// A staged rollout.
    Deploy,
    /// The drift reference becomes the new version's statistics.
    ResetReference,
}

impl Step {
    pub const ALL: [Step; 9] = [
        Step::BuildDataset,
        Step::Train,
        Step::Export,
        Step::Quantize,
        Step::Sign,
        Step::Register,
        Step::Compare,
        Step::Deploy,
        Step::ResetReference,
    ];

    /// The step after this one; `None` after the last.
    pub fn next(self) -> Option<Step> {
        let i = Step::ALL.iter().position(|s| *s == self)?;
        Step::ALL.get(i + 1).copied()
    }
}

/// How a model is retrained (`PUT /api/v1/models/{name}/retraining`, and
/// what is stored); the server checks every field, naming the one at fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrainingConfig {
    /// The training job (trainer-bridge's job spec). The pipeline names the
    /// job and puts its dataset snapshot first in `datasets`.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::spec::JobSpecSchema))]
    pub job: serde_json::Value,
    /// Run the job only on this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub cluster: Option<String>,
    /// The original training set: an uploaded npz with `input` and `label`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub base_dataset: Option<Digest>,
    /// Keep only the last this many rows of the base set (a recent window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            minimum = 1,
            format = "uint64",
            maximum = 18_446_744_073_709_551_615_u64
        )
    )]
    pub base_window_rows: Option<u64>,
    /// Keep only the newest this many labelled edge samples: after a concept
    /// shift, older rows teach the old concept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            minimum = 1,
            format = "uint64",
            maximum = 18_446_744_073_709_551_615_u64
        )
    )]
    pub edge_window_rows: Option<u64>,
    /// The dataset step waits until this many labelled edge samples
    /// observed after the pipeline started exist (at most
    /// `step_timeout_seconds`, then it fails retryably): a drift trigger
    /// that fires early leaves only a handful of rows of the new concept to
    /// learn from. At most `edge_window_rows`. Default: no wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_000_000, format = "uint64")
    )]
    pub min_fresh_edge_rows: Option<u64>,
    /// The newest fraction of labelled edge samples held out to evaluate
    /// (quantization gate and promotion check), default 0.3.
    #[serde(default = "default_eval_fraction")]
    #[cfg_attr(
        feature = "openapi",
        schema(exclusive_minimum = 0.0, exclusive_maximum = 1.0)
    )]
    pub eval_fraction: f64,
    /// Fewer labelled edge samples than this fail the dataset step: the
    /// comparison with the serving version would mean nothing (default 20).
    #[serde(default = "default_min_eval_samples")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            minimum = 1,
            format = "uint64",
            maximum = 18_446_744_073_709_551_615_u64
        )
    )]
    pub min_eval_samples: u64,
    /// Largest accuracy drop the quantization gate accepts, in points.
    #[serde(default = "default_budget")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 100.0))]
    pub quantization_budget_points: f64,
    /// Points the new version must gain over the serving one (default 0:
    /// it must be strictly better).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 100.0))]
    pub min_gain_points: f64,
    /// The alias of the version the new one must beat (e.g. `production`),
    /// resolved when the compare step runs; the comparison records the
    /// version it resolved to. Default: the serving version (the target of
    /// the newest succeeded rollout, else the newest version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare_with: Option<AliasName>,
    /// The staged rollout: a deployment request without `model` and
    /// `version` (selector, strategy, gates, ...), checked when the policy
    /// is set except for what needs the fleet (the selector matching
    /// devices).
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = crate::schema::deployments::RolloutTemplateSchema)
    )]
    pub rollout: serde_json::Value,
    /// How many times each labelled hard example (labelled through the
    /// labelling queue, or by feedback on the device) counts in training,
    /// 1 to 10 (default 1): they are the rows the serving model was least
    /// sure of.
    #[serde(default = "default_hard_example_weight")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10))]
    pub hard_example_weight: u32,
    /// Tries per step before the pipeline fails (default 3; 1 to 20).
    #[serde(default = "default_max_attempts")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 20))]
    pub max_attempts: u32,
    /// A step running longer than this fails, retryably (default 6 h; 60 s
    /// to 7 days).
    #[serde(default = "default_step_timeout")]
    #[cfg_attr(feature = "openapi", schema(minimum = 60, maximum = 604_800))]
    pub step_timeout_seconds: i64,
    /// More artifacts of each new version, one per hardware class, each
    /// through its own gate: e.g. an `fp16` variant for CUDA and TensorRT
    /// beside the int8 artifact the CPUs get. At most 4, names unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 4))]
    pub variants: Vec<VariantPolicy>,
    /// Judge the version's latency on a device of the fleet before it is
    /// registered: float and each candidate within the accuracy budget are
    /// timed on the representative of a hardware class. Without it the
    /// gate never judges latency (the control plane is not the device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyPolicy>,
    /// Who signs the versions it makes: the control plane's own key (the
    /// default), or a key kept elsewhere (`offline`: the pipeline waits in
    /// `awaiting_signature` for `edgeloop model sign`).
    #[serde(default, skip_serializing_if = "Signing::is_control_plane")]
    pub signing: Signing,
}

/// Who signs a pipeline's manifests, tagged by `mode`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(
    tag = "mode",
    rename_all = "snake_case",
    try_from = "SigningRepr",
    into = "SigningRepr"
)]
pub enum Signing {
    /// The control plane's key (`<data-dir>/keys/manifest-signing.key`):
    /// the loop closes on its own, and whoever holds the control-plane host
    /// can sign models.
    #[default]
    ControlPlane,
    /// A key the control plane never holds. The pipeline stops at
    /// `awaiting_signature`; a signature is accepted only if one of
    /// `public_keys` (ed25519, 64 hex characters; 1 to 8) made it. Not with
    /// `latency`: the device benchmark runs models the control plane signs.
    Offline {
        #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 8))]
        public_keys: Vec<String>,
    },
}

impl Signing {
    pub fn is_control_plane(&self) -> bool {
        matches!(self, Signing::ControlPlane)
    }
}

/// [`Signing`] as it is read and written. serde's internally tagged enums
/// take a variant's index for its tag (`"mode": 0`) and let a unit variant
/// ignore fields; the document says neither, so the tag is read as a plain
/// enum (a string only) and the fields are checked against it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SigningRepr {
    mode: SigningMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    public_keys: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SigningMode {
    ControlPlane,
    Offline,
}

impl TryFrom<SigningRepr> for Signing {
    type Error = &'static str;

    fn try_from(r: SigningRepr) -> Result<Self, Self::Error> {
        match (r.mode, r.public_keys) {
            (SigningMode::ControlPlane, None) => Ok(Signing::ControlPlane),
            (SigningMode::ControlPlane, Some(_)) => Err("public_keys is only for mode \"offline\""),
            (SigningMode::Offline, Some(public_keys)) => Ok(Signing::Offline { public_keys }),
            (SigningMode::Offline, None) => {
                Err("mode \"offline\" needs public_keys: the keys whose signatures are accepted")
            }
        }
    }
}

impl From<Signing> for SigningRepr {
    fn from(s: Signing) -> Self {
        match s {
            Signing::ControlPlane => SigningRepr {
                mode: SigningMode::ControlPlane,
                public_keys: None,
            },
            Signing::Offline { public_keys } => SigningRepr {
                mode: SigningMode::Offline,
                public_keys: Some(public_keys),
            },
        }
    }
}

/// `POST /api/v1/pipelines/{id}/signatures`: one signature per manifest the
/// quantize step left unsigned (the version's own and each variant's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignPipeline {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 5))]
    pub signatures: Vec<ManifestSignature>,
}

/// A signature over an unsigned manifest's canonical bytes, as a signed
/// manifest carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ManifestSignature {
    /// The unsigned manifest's digest (the quantize step's `manifest`, or a
    /// variant's).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(sha256:)?[0-9a-f]{64}$"))]
    pub manifest: Digest,
    /// The signing key's id (`PublicKey::key_id`).
    #[cfg_attr(feature = "openapi", schema(max_length = 64))]
    pub key_id: String,
    /// The ed25519 signature, 128 lowercase hex characters.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{128}$"))]
    pub signature: String,
}

/// How the Quantize step judges latency on a device (a benchmark over the
/// device's agent channel, `/api/v1/benchmarks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LatencyPolicy {
    /// The hardware class, as a device selector (usually the rollout's):
    /// its online device seen most recently times every model.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 1024))]
    pub benchmark_selector: String,
    /// Refuse candidates slower than this on the device, in ms per call.
    /// Default: refuse those slower than float there by over 10 %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(exclusive_minimum = 0.0, maximum = 3600000.0)
    )]
    pub max_latency_ms: Option<f64>,
    /// Timed calls per model (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
    pub runs: Option<u32>,
    /// Seconds the device has to report (default 600); a failed benchmark
    /// fails the step's attempt, retryably.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 5, maximum = 86400))]
    pub timeout_seconds: Option<u32>,
}

/// A variant the Quantize step built: its gate's choice and signed manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuantizedVariant {
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub digest: Digest,
    pub method: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub manifest: Digest,
    pub providers: Vec<String>,
}

/// A variant the Quantize step builds for every new version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VariantPolicy {
    /// A DNS label, unique in the policy, e.g. `fp16-gpu`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub name: String,
    /// The quantizations its gate may choose from, in the gate's labels
    /// (`fp16`, `int8-dynamic`, `int8-static-entropy`, ...); float ships if
    /// none is within the budget.
    #[cfg_attr(
        feature = "openapi",
        schema(schema_with = crate::schema::quantization_candidates)
    )]
    pub candidates: Vec<String>,
    /// The execution providers it is for; a device with one of them gets it.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::execution_providers))]
    pub providers: Vec<String>,
}

fn default_eval_fraction() -> f64 {
    0.3
}
fn default_min_eval_samples() -> u64 {
    20
}
fn default_budget() -> f64 {
    1.0
}
fn default_hard_example_weight() -> u32 {
    1
}
fn default_max_attempts() -> u32 {
    3
}
fn default_step_timeout() -> i64 {
    6 * 3600
}

/// `POST /api/v1/models/{name}/retrain` (the body may be absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrainRequest {
    /// Why, for the record (the trigger becomes `manual: <reason>`, at most
    /// 512 bytes: the reason at most 504).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 504))]
    pub reason: Option<String>,
}

/// A pipeline's state, tagged by `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PipelineState {
    Running {
        step: Step,
        attempt: u32,
        started_at: UnixSeconds,
    },
    Succeeded,
    /// Ended on purpose, e.g. the new version did not beat the serving one.
    Stopped {
        step: Step,
        reason: String,
    },
    Failed {
        step: Step,
        reason: String,
    },
    Cancelled {
        step: Step,
    },
    /// Offline signing: nothing runs until the manifests are signed
    /// (`POST /api/v1/pipelines/{id}/signatures`) or the pipeline is
    /// cancelled. No step timeout applies: a person signs.
    AwaitingSignature {
        since: UnixSeconds,
    },
}

/// The name of a pipeline's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PipelineStatus {
    Running,
    Succeeded,
    Stopped,
    Failed,
    Cancelled,
    AwaitingSignature,
}

impl PipelineStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineStatus::Running => "running",
            PipelineStatus::Succeeded => "succeeded",
            PipelineStatus::Stopped => "stopped",
            PipelineStatus::Failed => "failed",
            PipelineStatus::Cancelled => "cancelled",
            PipelineStatus::AwaitingSignature => "awaiting_signature",
        }
    }
}

impl PipelineState {
    pub fn status(&self) -> PipelineStatus {
        match self {
            PipelineState::Running { .. } => PipelineStatus::Running,
            PipelineState::Succeeded => PipelineStatus::Succeeded,
            PipelineState::Stopped { .. } => PipelineStatus::Stopped,
            PipelineState::Failed { .. } => PipelineStatus::Failed,
            PipelineState::Cancelled { .. } => PipelineStatus::Cancelled,
            PipelineState::AwaitingSignature { .. } => PipelineStatus::AwaitingSignature,
        }
    }
}

/// How a step's run ended. Written as one string, as it always was:
/// `succeeded`, `cancelled`, or the reason it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    Succeeded,
    Cancelled,
    /// It failed (or timed out), or the comparison stopped the pipeline:
    /// why, in words.
    Ended(String),
}

impl StepOutcome {
    pub fn as_str(&self) -> &str {
        match self {
            StepOutcome::Succeeded => "succeeded",
            StepOutcome::Cancelled => "cancelled",
            StepOutcome::Ended(reason) => reason,
        }
    }
}

impl From<String> for StepOutcome {
    fn from(s: String) -> Self {
        match s.as_str() {
            "succeeded" => StepOutcome::Succeeded,
            "cancelled" => StepOutcome::Cancelled,
            _ => StepOutcome::Ended(s),
        }
    }
}

impl Serialize for StepOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StepOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(StepOutcome::from)
    }
}

/// What a finished step handed on, tagged by `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum Output {
    /// The snapshot; `rows` train, `eval_rows` (the newest labelled edge
    /// samples) evaluate; `edge_rows` of all came from devices.
    Dataset {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        digest: Digest,
        rows: u64,
        #[serde(default)]
        eval_rows: u64,
        #[serde(default)]
        edge_rows: u64,
        /// Labelled hard examples among the edge rows.
        #[serde(default)]
        hard_examples: u64,
    },
    Job {
        id: String,
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        checkpoint: Digest,
    },
    Onnx {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        digest: Digest,
    },
    /// The gate's choice, its signed manifest, and the version it names.
    Quantized {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        digest: Digest,
        method: String,
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        manifest: Digest,
        version: String,
        /// The policy's variants, each through its own gate.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        variants: Vec<QuantizedVariant>,
    },
    /// Offline signing: the gate's choice and its manifest, not signed yet;
    /// the sign step's output is the `quantized` one with signed manifests.
    Unsigned {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        digest: Digest,
        method: String,
        /// The unsigned manifest (JSON of the manifest itself).
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        manifest: Digest,
        version: String,
        /// The policy's variants; each `manifest` is unsigned too.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        variants: Vec<QuantizedVariant>,
    },
    Version {
        version: String,
    },
    /// Accuracy on the recent labelled eval set, new and serving.
    Comparison {
        new: f64,
        serving: f64,
        /// The version compared against (absent when none served yet).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serving_version: Option<String>,
        /// The alias it was named by (the policy's `compare_with`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serving_alias: Option<AliasName>,
    },
    Deployment {
        id: String,
    },
    Reference,
}

/// One run (attempt) of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRecord {
    pub step: Step,
    pub attempt: u32,
    pub started_at: UnixSeconds,
    pub ended_at: Option<UnixSeconds>,
    /// `succeeded`, or why it did not.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub outcome: Option<StepOutcome>,
    pub output: Option<Output>,
}

/// A trigger that fired while the pipeline ran, folded into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Coalesced {
    pub trigger: String,
    pub at: UnixSeconds,
}

/// A pipeline as the API shows it (`GET /api/v1/pipelines/{id}`, and the
/// answer of a retrain or a cancel): the record, its state's name, and the
/// current step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineView {
    pub id: String,
    pub model: String,
    /// `running`, `awaiting_signature`, `succeeded`, `stopped`, `failed` or
    /// `cancelled`.
    pub status: PipelineStatus,
    /// The step running or the one it ended in.
    pub step: Option<Step>,
    /// Why it stopped or failed.
    pub reason: Option<String>,
    /// Set when this request's trigger was folded into a running pipeline
    /// (listed in its `coalesced`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coalesced_request: bool,
    /// The trigger and reasons that started it.
    pub trigger: String,
    pub state: PipelineState,
    pub history: Vec<StepRecord>,
    pub max_attempts: u32,
    pub step_timeout_seconds: i64,
    /// Accuracy points the new version must gain over the serving one.
    pub min_gain_points: f64,
    /// Triggers that fired while it ran, folded into it.
    #[serde(default)]
    pub coalesced: Vec<Coalesced>,
    /// Who signs its manifests, as its policy said when it started.
    #[serde(default, skip_serializing_if = "Signing::is_control_plane")]
    pub signing: Signing,
}

impl PipelineView {
    /// The steps it runs, in order: the sign step only when it signs
    /// offline (otherwise the quantize step signs).
    pub fn steps(&self) -> Vec<Step> {
        Step::ALL
            .into_iter()
            .filter(|s| *s != Step::Sign || !self.signing.is_control_plane())
            .collect()
    }
}
