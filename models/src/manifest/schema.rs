//! The manifest schema and its validation. Field order in every struct is
//! part of the signed bytes: reordering fields invalidates every signature
//! ever made.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::canonical::serialize_sorted;
use super::checks::{check_name, check_rfc3339, check_semver, check_text, check_token};
use super::{finite, invalid, ManifestError, SCHEMA_VERSION};
use crate::Digest;

/// The deepest JSON nesting allowed in quantization evidence. `serde_json`
/// refuses documents nested deeper than 128 when parsing, so evidence that
/// could be signed but never parsed back is refused at signing instead.
const MAX_EVIDENCE_DEPTH: usize = 64;

/// How far the prediction shares may sum away from 1: they are rounded
/// fractions, but a distribution that sums to 0.9 is a bug upstream.
const SHARE_SUM_TOLERANCE: f64 = 1e-6;

/// Element type names, as `onnx::inspect` writes them, so a manifest's
/// signature can be filled from an inspection.
const TENSOR_DTYPES: &[&str] = &[
    "float32",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "int32",
    "int64",
    "string",
    "bool",
    "float16",
    "float64",
    "uint32",
    "uint64",
    "complex64",
    "complex128",
    "bfloat16",
    "float8e4m3fn",
    "float8e4m3fnuz",
    "float8e5m2",
    "float8e5m2fnuz",
    "uint4",
    "int4",
    "float4e2m1",
    "float8e8m0",
    "uint2",
    "int2",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// The model's name, a DNS label like the registry's model names.
    pub name: String,
    /// Semantic version: `MAJOR.MINOR.PATCH[-pre][+build]`.
    pub version: String,
    pub artifact: ArtifactRef,
    pub signature: IoSignature,
    pub quantization: Option<QuantizationRecord>,
    /// The training-time distributions that drift detection compares with.
    pub reference_stats: Option<ReferenceStats>,
    pub lineage: Lineage,
    pub health_probe: Option<HealthProbe>,
    /// RFC 3339, supplied by the caller so that signing is a pure function.
    pub created_at: String,
    /// Anti-rollback: once a device has served this version it refuses any
    /// version below this one (a security fix's floor, say), unless the
    /// older version's manifest is a signed [`Manifest::rollback`]. Absent
    /// (the default) sets no floor. Left out of the signed bytes when
    /// absent, so manifests signed before it existed still verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<String>,
    /// A signed rollback: this version may be installed below a device's
    /// floor, and its own `min_version` becomes the floor (none: no floor).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rollback: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactRef {
    pub sha256: Digest,
    pub size: u64,
    /// `onnx` today.
    pub format: String,
}

/// The model's inputs and outputs, so a device can refuse a version whose
/// interface does not fit its pipeline before loading it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoSignature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    /// `float32`, `int64`, ... (ONNX element types, NumPy-style names).
    pub dtype: String,
    pub shape: Vec<DimSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DimSpec {
    Fixed(i64),
    /// A named dimension such as `batch`.
    Symbolic(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizationRecord {
    pub method: String,
    /// The quantizer's numbers for every candidate it tried. Build it with
    /// [`QuantizationRecord::new`]: converting to a `Value` silently turns NaN
    /// into `null`, which `new` refuses instead.
    #[serde(serialize_with = "serialize_sorted")]
    pub evidence: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceStats {
    pub inputs: Vec<InputHistogram>,
    pub prediction_distribution: Vec<ClassShare>,
    pub sample_count: u64,
}

/// `counts[i]` values fell in `[bin_edges[i], bin_edges[i + 1])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputHistogram {
    /// The input's name, or for one feature column, the feature's.
    pub name: String,
    pub bin_edges: Vec<f64>,
    pub counts: Vec<u64>,
    /// For one column of a tabular input (`[rows, features]`): the input
    /// it is a column of, and which. Absent: every element of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

/// The most feature columns of one input with their own histograms.
pub const MAX_FEATURE_COLUMNS: usize = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassShare {
    pub class: i64,
    pub share: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lineage {
    pub job: Option<String>,
    pub checkpoint: Option<Digest>,
    pub dataset: Option<Digest>,
    pub parent_version: Option<String>,
}

/// What a device runs after loading a version, before switching traffic to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthProbe {
    /// The `.npz` artifact with the probe's inputs. Everywhere else this is
    /// `probe_inputs` (`probe_inputs_digest` in JSON and protobuf); the
    /// manifest keeps its first name because the signature covers the
    /// field names, and renaming it would void every signed manifest. It
    /// changes only with a new `SCHEMA_VERSION`.
    pub sample_inputs: Digest,
    pub max_latency_ms: f64,
}

impl Manifest {
    /// The task the gate measured the model as (`quantization.evidence.task.kind`:
    /// `classification`, `detection`, `regression`, `stateful`); `None` for a
    /// manifest without one, which predates task-aware gating and was
    /// measured as a classifier.
    pub fn gate_task(&self) -> Option<&str> {
        self.quantization
            .as_ref()?
            .evidence
            .get("task")?
            .get("kind")?
            .as_str()
    }

    /// Whether devices read class predictions (drift's prediction
    /// distribution, online accuracy) from this model's outputs.
    pub fn is_classifier(&self) -> bool {
        self.gate_task().is_none_or(|t| t == "classification")
    }
}

impl QuantizationRecord {
    /// Converts the quantizer's evidence to JSON, refusing NaN and infinities
    /// with the path of the first one (`quantization.evidence.candidates[2].mse`).
    pub fn new(
        method: impl Into<String>,
        evidence: &impl Serialize,
    ) -> Result<Self, ManifestError> {
        const FIELD: &str = "quantization.evidence";
        match finite::first_non_finite(evidence) {
            Ok(None) => {}
            Ok(Some(path)) => {
                return Err(invalid(
                    format!("{FIELD}{path}"),
                    "must be a finite number, not NaN or infinity",
                ))
            }
            Err(reason) => return Err(invalid(FIELD, reason)),
        }
        let evidence = serde_json::to_value(evidence).map_err(|e| invalid(FIELD, e.to_string()))?;
        Ok(Self {
            method: method.into(),
            evidence,
        })
    }
}

impl Manifest {
    /// Checks every field; the error names the first bad one, e.g.
    /// `reference_stats.inputs[0].bin_edges`.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.schema != SCHEMA_VERSION {
            return Err(invalid(
                "schema",
                format!(
                    "schema {} is not supported; this build reads schema {SCHEMA_VERSION}",
                    self.schema
                ),
            ));
        }
        check_name("name", &self.name)?;
        check_semver("version", &self.version)?;
        self.artifact.validate()?;
        self.signature.validate()?;
        if let Some(q) = &self.quantization {
            q.validate()?;
        }
        if let Some(stats) = &self.reference_stats {
            stats.validate()?;
        }
        self.lineage.validate(&self.version)?;
        if let Some(probe) = &self.health_probe {
            if !(probe.max_latency_ms.is_finite() && probe.max_latency_ms > 0.0) {
                return Err(invalid(
                    "health_probe.max_latency_ms",
                    format!(
                        "must be a finite number above 0, got {}",
                        probe.max_latency_ms
                    ),
                ));
            }
        }
        if let Some(floor) = &self.min_version {
            check_semver("min_version", floor)?;
            if semver_of(floor) > semver_of(&self.version) {
                return Err(invalid(
                    "min_version",
                    format!(
                        "{floor} is above the manifest's own version {}",
                        self.version
                    ),
                ));
            }
        }
        check_rfc3339("created_at", &self.created_at)
    }

    /// Whether a device whose floor is `floor` may install this version:
    /// at or above it, or an explicit signed rollback. Pure.
    pub fn allowed_above(&self, floor: Option<&str>) -> bool {
        match floor {
            None => true,
            Some(_) if self.rollback => true,
            Some(f) => version_at_least(&self.version, f),
        }
    }

    /// The floor after serving this version: a rollback's own
    /// `min_version` (it may lower it); otherwise the higher of the two.
    pub fn next_floor(&self, floor: Option<&str>) -> Option<String> {
        if self.rollback {
            return self.min_version.clone();
        }
        match (floor, &self.min_version) {
            (Some(f), Some(m)) if semver_of(f) >= semver_of(m) => Some(f.to_string()),
            (_, Some(m)) => Some(m.clone()),
            (f, None) => f.map(str::to_string),
        }
    }
}

/// Whether `version` is at or above `floor` by semver precedence. A
/// version that is not semver (an unsigned registry version like `7`)
/// counts as the lowest: below any floor.
pub fn version_at_least(version: &str, floor: &str) -> bool {
    semver_of(version) >= semver_of(floor)
}

/// A version for comparison; an unparseable one (already refused by
/// `validate`) sorts lowest.
fn semver_of(v: &str) -> semver::Version {
    semver::Version::parse(v).unwrap_or(semver::Version::new(0, 0, 0))
}

impl ArtifactRef {
    fn validate(&self) -> Result<(), ManifestError> {
        if self.size == 0 {
            return Err(invalid("artifact.size", "an empty artifact is not a model"));
        }
        check_token("artifact.format", &self.format)
    }
}

impl IoSignature {
    fn validate(&self) -> Result<(), ManifestError> {
        check_tensors("signature.inputs", &self.inputs)?;
        if self.outputs.is_empty() {
            return Err(invalid(
                "signature.outputs",
                "a model has at least one output",
            ));
        }
        check_tensors("signature.outputs", &self.outputs)
    }
}

fn check_tensors(field: &str, tensors: &[TensorSpec]) -> Result<(), ManifestError> {
    for (i, t) in tensors.iter().enumerate() {
        let at = format!("{field}[{i}]");
        check_text(&format!("{at}.name"), &t.name, 1024)?;
        if tensors[..i].iter().any(|earlier| earlier.name == t.name) {
            return Err(invalid(
                format!("{at}.name"),
                format!("{:?} appears twice", t.name),
            ));
        }
        if !TENSOR_DTYPES.contains(&t.dtype.as_str()) {
            return Err(invalid(
                format!("{at}.dtype"),
                format!("{:?} is not an ONNX tensor element type", t.dtype),
            ));
        }
        for (d, dim) in t.shape.iter().enumerate() {
            match dim {
                DimSpec::Fixed(n) if *n < 0 => {
                    return Err(invalid(
                        format!("{at}.shape[{d}]"),
                        format!("a dimension cannot be negative, got {n}"),
                    ))
                }
                DimSpec::Symbolic(s) => check_text(&format!("{at}.shape[{d}]"), s, 256)?,
                DimSpec::Fixed(_) => {}
            }
        }
    }
    Ok(())
}

impl QuantizationRecord {
    fn validate(&self) -> Result<(), ManifestError> {
        check_token("quantization.method", &self.method)?;
        if value_depth_exceeds(&self.evidence, MAX_EVIDENCE_DEPTH) {
            return Err(invalid(
                "quantization.evidence",
                format!("nested deeper than {MAX_EVIDENCE_DEPTH} levels"),
            ));
        }
        Ok(())
    }
}

/// Bounded recursion: it stops descending at `max`, so even a pathologically
/// deep value cannot exhaust the stack here.
fn value_depth_exceeds(value: &Value, max: usize) -> bool {
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(map) => Box::new(map.values()),
        _ => return false,
    };
    if max == 0 {
        return true;
    }
    children
        .into_iter()
        .any(|child| value_depth_exceeds(child, max - 1))
}

impl ReferenceStats {
    fn validate(&self) -> Result<(), ManifestError> {
        if self.sample_count == 0 {
            return Err(invalid(
                "reference_stats.sample_count",
                "reference statistics need at least one sample",
            ));
        }
        for (i, h) in self.inputs.iter().enumerate() {
            let at = format!("reference_stats.inputs[{i}]");
            check_text(&format!("{at}.name"), &h.name, 1024)?;
            if self.inputs[..i]
                .iter()
                .any(|earlier| earlier.name == h.name)
            {
                return Err(invalid(
                    format!("{at}.name"),
                    format!("{:?} appears twice", h.name),
                ));
            }
            match (&h.input, h.column) {
                (None, None) => {}
                (Some(input), Some(column)) => {
                    check_text(&format!("{at}.input"), input, 1024)?;
                    if column as usize >= MAX_FEATURE_COLUMNS {
                        return Err(invalid(
                            format!("{at}.column"),
                            format!("at most {MAX_FEATURE_COLUMNS} columns, got column {column}"),
                        ));
                    }
                }
                (Some(_), None) => {
                    return Err(invalid(
                        format!("{at}.column"),
                        "a feature of an input needs its column",
                    ))
                }
                (None, Some(_)) => {
                    return Err(invalid(
                        format!("{at}.input"),
                        "a column needs the input it is of",
                    ))
                }
            }
            let edges_field = format!("{at}.bin_edges");
            if h.bin_edges.len() < 2 {
                return Err(invalid(edges_field, "a histogram needs at least two edges"));
            }
            if h.counts.len() + 1 != h.bin_edges.len() {
                return Err(invalid(
                    format!("{at}.counts"),
                    format!(
                        "{} counts for {} edges: there must be one count per bin, one fewer than the edges",
                        h.counts.len(),
                        h.bin_edges.len()
                    ),
                ));
            }
            if let Some(bad) = h.bin_edges.iter().position(|e| !e.is_finite()) {
                return Err(invalid(
                    edges_field,
                    format!("edge {bad} is {}, not a finite number", h.bin_edges[bad]),
                ));
            }
            if let Some(bad) = h.bin_edges.windows(2).position(|w| w[0] >= w[1]) {
                return Err(invalid(
                    edges_field,
                    format!("edges must be strictly increasing; edge {} is not", bad + 1),
                ));
            }
        }
        let mut sum = 0.0;
        for (i, c) in self.prediction_distribution.iter().enumerate() {
            let at = format!("reference_stats.prediction_distribution[{i}]");
            if !(c.share.is_finite() && (0.0..=1.0).contains(&c.share)) {
                return Err(invalid(
                    format!("{at}.share"),
                    format!("must be a finite number in [0, 1], got {}", c.share),
                ));
            }
            if self.prediction_distribution[..i]
                .iter()
                .any(|earlier| earlier.class == c.class)
            {
                return Err(invalid(
                    format!("{at}.class"),
                    format!("class {} appears twice", c.class),
                ));
            }
            sum += c.share;
        }
        if !self.prediction_distribution.is_empty() && (sum - 1.0).abs() > SHARE_SUM_TOLERANCE {
            return Err(invalid(
                "reference_stats.prediction_distribution",
                format!("shares must sum to 1, got {sum}"),
            ));
        }
        Ok(())
    }
}

impl Lineage {
    fn validate(&self, version: &str) -> Result<(), ManifestError> {
        if let Some(job) = &self.job {
            check_text("lineage.job", job, 256)?;
        }
        if let Some(parent) = &self.parent_version {
            check_semver("lineage.parent_version", parent)?;
            if parent == version {
                return Err(invalid(
                    "lineage.parent_version",
                    "a version cannot be its own parent",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Candidate {
        name: &'static str,
        mse: f64,
        extra: Option<Vec<f32>>,
    }

    #[test]
    fn quantization_record_refuses_nan_before_it_becomes_null() {
        let err = QuantizationRecord::new(
            "dynamic-int8",
            &vec![Candidate {
                name: "a",
                mse: f64::NAN,
                extra: None,
            }],
        )
        .unwrap_err();
        assert!(
            matches!(&err, ManifestError::Invalid { field, .. } if field == "quantization.evidence[0].mse"),
            "{err}"
        );
    }

    #[test]
    fn evidence_depth_is_bounded() {
        let mut deep = Value::from(1);
        for _ in 0..200 {
            deep = Value::Array(vec![deep]);
        }
        assert!(value_depth_exceeds(&deep, MAX_EVIDENCE_DEPTH));
        let mut shallow = Value::from(1);
        for _ in 0..MAX_EVIDENCE_DEPTH {
            shallow = Value::Array(vec![shallow]);
        }
        assert!(!value_depth_exceeds(&shallow, MAX_EVIDENCE_DEPTH));
    }
}
