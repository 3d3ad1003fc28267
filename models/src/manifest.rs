//! Signed model version manifests: what a model version is (artifact digest,
//! tensor signature, quantization evidence, reference statistics, lineage),
//! signed with ed25519 so that an edge device can check a version before it
//! runs it.
//!
//! # Canonical bytes
//!
//! The signature covers [`SIGNING_CONTEXT`] followed by
//! [`Manifest::canonical_bytes`]: `serde_json::to_vec(&manifest)`. That is
//! deterministic because every struct serialises its fields in declaration
//! order, there are no hash maps, `None` is written as `null` (never skipped),
//! and the free-form quantization evidence is written with object keys sorted
//! whatever map type `serde_json` was built with. A verifier re-serialises the
//! manifest it parsed instead of checking the bytes it received, so whitespace
//! and key order in the file do not matter, and what was verified is exactly
//! the value the caller goes on to use.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::{Digest, Sha256Writer};

/// The manifest schema this build writes and reads; any other is refused.
pub const SCHEMA_VERSION: u32 = 1;

/// The most bytes [`SignedManifest::from_json`] reads. Reference statistics
/// make manifests larger than a few KiB, but nothing legitimate comes near this.
pub const MAX_SIGNED_MANIFEST_BYTES: usize = 16 << 20;

/// Prefixed to the canonical bytes before signing, so that a manifest key's
/// signature can never be replayed as a signature over some other kind of
/// message, and a future schema cannot be confused with this one.
pub const SIGNING_CONTEXT: &[u8] = b"edgeloop.manifest.v1\n";

/// Key files hold 64 hex characters and a newline; anything much larger is
/// not a key file.
const MAX_KEY_FILE_BYTES: u64 = 1024;

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

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is signed by key {key_id:?}, which is not trusted")]
    UnknownKey { key_id: String },
    #[error("bad manifest signature: {0}")]
    BadSignature(&'static str),
    #[error("artifact does not match {field} in the manifest: expected {expected}, got {actual}")]
    ArtifactMismatch {
        field: &'static str,
        expected: String,
        actual: String,
    },
    #[error("invalid manifest field {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("signed manifest is {len} bytes, over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("malformed signed manifest: {0}")]
    Parse(String),
    #[error("bad manifest key: {0}")]
    Key(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ManifestError {
    ManifestError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> ManifestError {
    let what = what.into();
    move |source| ManifestError::Io { what, source }
}

// ---------------------------------------------------------------------------
// The manifest. Field order in every struct is part of the signed bytes:
// reordering fields invalidates every signature ever made.
// ---------------------------------------------------------------------------

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
    pub name: String,
    pub bin_edges: Vec<f64>,
    pub counts: Vec<u64>,
}

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
    /// The `.npz` artifact with the sample inputs.
    pub sample_inputs: Digest,
    pub max_latency_ms: f64,
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

/// Writes `Value` objects with their keys sorted, so the signed bytes do not
/// depend on whether `serde_json`'s `preserve_order` feature is on somewhere
/// in the build.
fn serialize_sorted<S: Serializer>(value: &Value, s: S) -> Result<S::Ok, S::Error> {
    Sorted(value).serialize(s)
}

struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut out = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    out.serialize_entry(k, &Sorted(v))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    out.serialize_element(&Sorted(v))?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

impl Manifest {
    /// The JSON the signature covers (after [`SIGNING_CONTEXT`]).
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, ManifestError> {
        serde_json::to_vec(self).map_err(|e| invalid("manifest", e.to_string()))
    }

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
        if let Some(reason) = rfc3339_problem(&self.created_at) {
            return Err(invalid(
                "created_at",
                format!(
                    "{:?} is not an RFC 3339 timestamp: {reason}",
                    self.created_at
                ),
            ));
        }
        Ok(())
    }
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

/// The registry's model-name rule (a DNS label), so every signed manifest
/// names a model the control plane can hold.
fn check_name(field: &str, value: &str) -> Result<(), ManifestError> {
    if crate::names::is_valid_name(value) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{value:?} is not a valid name: {}", crate::names::NAME_RULE),
        ))
    }
}

/// Short identifiers (formats, quantization methods): `[a-z0-9][a-z0-9._-]*`,
/// at most 64 bytes.
fn check_token(field: &str, value: &str) -> Result<(), ManifestError> {
    let ok = (1..=64).contains(&value.len())
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{value:?} is not a valid identifier: use 1-64 of a-z 0-9 . _ -, starting with a letter or digit"),
        ))
    }
}

/// Non-empty, bounded, and free of control characters, because these strings
/// end up in logs and terminals.
fn check_text(field: &str, value: &str, max: usize) -> Result<(), ManifestError> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(invalid(field, format!("at most {max} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

fn check_semver(field: &str, value: &str) -> Result<(), ManifestError> {
    match semver_problem(value) {
        None => Ok(()),
        Some(reason) => Err(invalid(
            field,
            format!(
                "{value:?} is not a semantic version (MAJOR.MINOR.PATCH[-pre][+build]): {reason}"
            ),
        )),
    }
}

/// Semantic Versioning 2.0.0, strictly: numeric parts without leading zeros,
/// identifiers from `[0-9A-Za-z-]`, none empty.
fn semver_problem(s: &str) -> Option<&'static str> {
    if s.len() > 128 {
        return Some("longer than 128 bytes");
    }
    // The core has no '-' or '+', so the first of each starts its part; a
    // later '+' inside the build part fails the identifier check.
    let (rest, build) = match s.split_once('+') {
        Some((rest, build)) => (rest, Some(build)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 {
        return Some("the core must be three numbers separated by '.'");
    }
    for part in parts {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Some("MAJOR, MINOR and PATCH must be numbers");
        }
        if part.len() > 1 && part.starts_with('0') {
            return Some("numbers must not have leading zeros");
        }
        if part.parse::<u64>().is_err() {
            return Some("number too large");
        }
    }
    let identifier_ok =
        |id: &str| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if let Some(pre) = pre {
        for id in pre.split('.') {
            if !identifier_ok(id) {
                return Some("pre-release identifiers must be non-empty [0-9A-Za-z-]");
            }
            if id.len() > 1 && id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit()) {
                return Some("numeric pre-release identifiers must not have leading zeros");
            }
        }
    }
    if let Some(build) = build {
        if !build.split('.').all(identifier_ok) {
            return Some("build identifiers must be non-empty [0-9A-Za-z-]");
        }
    }
    None
}

/// RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, with the
/// calendar checked (no February 30th).
fn rfc3339_problem(s: &str) -> Option<&'static str> {
    let b = s.as_bytes();
    if b.len() > 64 {
        return Some("too long");
    }
    if b.len() < 20 {
        return Some("too short");
    }
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let digits = b.get(range)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            digits
                .iter()
                .fold(0, |acc, d| acc * 10 + u32::from(d - b'0')),
        )
    };
    let separators_ok = b[4] == b'-'
        && b[7] == b'-'
        && matches!(b[10], b'T' | b't')
        && b[13] == b':'
        && b[16] == b':';
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) = (
        num(0..4),
        num(5..7),
        num(8..10),
        num(11..13),
        num(14..16),
        num(17..19),
    ) else {
        return Some("expected YYYY-MM-DDTHH:MM:SS");
    };
    if !separators_ok {
        return Some("expected YYYY-MM-DDTHH:MM:SS");
    }
    if !(1..=12).contains(&month) {
        return Some("month out of range");
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=days_in_month).contains(&day) {
        return Some("day out of range");
    }
    // 60 is a leap second, which RFC 3339 allows.
    if hour > 23 || minute > 59 || second > 60 {
        return Some("time out of range");
    }
    let mut rest = &b[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Some("a '.' must be followed by fractional seconds");
        }
        rest = &frac[digits..];
    }
    match rest {
        [b'Z' | b'z'] => None,
        [b'+' | b'-', h1, h2, b':', m1, m2]
            if [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()) =>
        {
            let offset_hour = u32::from(h1 - b'0') * 10 + u32::from(h2 - b'0');
            let offset_minute = u32::from(m1 - b'0') * 10 + u32::from(m2 - b'0');
            if offset_hour > 23 || offset_minute > 59 {
                Some("offset out of range")
            } else {
                None
            }
        }
        _ => Some("expected a 'Z' or ±HH:MM offset"),
    }
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

/// A manifest signing key. Its bytes are wiped when it is dropped.
pub struct ManifestKey {
    signing: SigningKey,
}

impl ManifestKey {
    pub fn generate() -> Self {
        // 32 random bytes rather than `SigningKey::generate`, whose rand_core
        // 0.6 traits the workspace's rand 0.9 does not implement.
        let mut seed: [u8; 32] = rand::random();
        let key = Self::from_bytes(&seed);
        wipe(&mut seed);
        key
    }

    /// The 32-byte ed25519 secret (seed).
    pub fn from_bytes(secret: &[u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(secret),
        }
    }

    pub fn public(&self) -> PublicKey {
        PublicKey {
            key: self.signing.verifying_key(),
        }
    }

    /// Validates `manifest`, then signs its canonical bytes.
    pub fn sign(&self, manifest: Manifest) -> Result<SignedManifest, ManifestError> {
        manifest.validate()?;
        let message = signed_message(&manifest)?;
        let signature = self.signing.sign(&message);
        let signed = SignedManifest {
            manifest,
            key_id: self.public().key_id(),
            signature: hex::encode(signature.to_bytes()),
        };
        // A manifest that its own readers would refuse as too large must not
        // be signed; pretty JSON is the largest form it is written in.
        let len = signed.to_json_pretty()?.len();
        if len > MAX_SIGNED_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                len,
                max: MAX_SIGNED_MANIFEST_BYTES,
            });
        }
        Ok(signed)
    }

    /// Writes the secret as hex, readable by the owner only, atomically so a
    /// crash never leaves a torn key.
    pub fn write_to(&self, path: &Path) -> Result<(), ManifestError> {
        let mut secret = self.signing.to_bytes();
        let mut text = hex::encode(secret).into_bytes();
        text.push(b'\n');
        let written = crate::fs::write_atomic(path, &text, 0o600);
        wipe(&mut secret);
        wipe(&mut text);
        written.map_err(io_error(format!("writing manifest key {}", path.display())))
    }

    pub fn read_from(path: &Path) -> Result<Self, ManifestError> {
        let mut text = read_key_file(path)?;
        let mut secret = [0u8; 32];
        let decoded = decode_key_hex(&text, &mut secret);
        wipe(&mut text);
        let key = decoded.map(|()| Self::from_bytes(&secret));
        wipe(&mut secret);
        key.map_err(|reason| ManifestError::Key(format!("{}: {reason}", path.display())))
    }
}

impl fmt::Debug for ManifestKey {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManifestKey(key_id {})", self.public().key_id())
    }
}

/// A public key that manifests are verified against.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
}

impl PublicKey {
    /// Refuses bytes that are not a curve point, and weak (small-order) keys,
    /// for which a signature can verify against many messages.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, ManifestError> {
        let key = VerifyingKey::from_bytes(bytes)
            .map_err(|_| ManifestError::Key("not an ed25519 public key".into()))?;
        if key.is_weak() {
            return Err(ManifestError::Key(
                "weak (small-order) ed25519 public key".into(),
            ));
        }
        Ok(Self { key })
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        self.key.as_bytes()
    }

    /// The hex sha256 of the 32 key bytes: how a signed manifest names its key.
    pub fn key_id(&self) -> String {
        Digest::of(self.key.as_bytes()).to_hex()
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.key.as_bytes())
    }

    pub fn from_hex(s: &str) -> Result<Self, ManifestError> {
        let mut bytes = [0u8; 32];
        decode_key_hex(s.as_bytes(), &mut bytes).map_err(|r| ManifestError::Key(r.into()))?;
        Self::from_bytes(&bytes)
    }

    pub fn write_to(&self, path: &Path) -> Result<(), ManifestError> {
        let text = format!("{}\n", self.to_hex());
        crate::fs::write_atomic(path, text.as_bytes(), 0o644)
            .map_err(io_error(format!("writing public key {}", path.display())))
    }

    pub fn read_from(path: &Path) -> Result<Self, ManifestError> {
        let text = read_key_file(path)?;
        let mut bytes = [0u8; 32];
        decode_key_hex(&text, &mut bytes)
            .map_err(|reason| ManifestError::Key(format!("{}: {reason}", path.display())))?;
        Self::from_bytes(&bytes).map_err(|e| ManifestError::Key(format!("{}: {e}", path.display())))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

fn read_key_file(path: &Path) -> Result<Vec<u8>, ManifestError> {
    let what = || format!("reading key {}", path.display());
    let file = File::open(path).map_err(io_error(what()))?;
    let mut text = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(io_error(what()))?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        wipe(&mut text);
        return Err(ManifestError::Key(format!(
            "{}: over {MAX_KEY_FILE_BYTES} bytes, not a key file",
            path.display()
        )));
    }
    Ok(text)
}

/// 64 hex characters, surrounding whitespace allowed (a trailing newline).
fn decode_key_hex(text: &[u8], out: &mut [u8; 32]) -> Result<(), &'static str> {
    let hex_part = text.trim_ascii();
    if hex_part.len() != 64 {
        return Err("expected 64 hex characters");
    }
    hex::decode_to_slice(hex_part, out).map_err(|_| "expected 64 hex characters")
}

/// Best-effort wipe of secret bytes (no zeroize crate here): `black_box`
/// keeps the compiler from dropping the stores as dead.
fn wipe(bytes: &mut [u8]) {
    bytes.fill(0);
    std::hint::black_box(bytes);
}

fn signed_message(manifest: &Manifest) -> Result<Vec<u8>, ManifestError> {
    let mut message = SIGNING_CONTEXT.to_vec();
    message.extend_from_slice(&manifest.canonical_bytes()?);
    Ok(message)
}

// ---------------------------------------------------------------------------
// Signed manifests
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedManifest {
    pub manifest: Manifest,
    /// [`PublicKey::key_id`] of the signing key. Not itself signed: it only
    /// picks which trusted key to try.
    pub key_id: String,
    /// The 64-byte ed25519 signature, as 128 lowercase hex characters.
    pub signature: String,
}

/// An artifact to check against a manifest.
#[derive(Debug, Clone, Copy)]
pub enum ArtifactSource<'a> {
    Bytes(&'a [u8]),
    /// Streamed, never read into memory whole.
    File(&'a Path),
}

impl<'a> From<&'a [u8]> for ArtifactSource<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        Self::Bytes(bytes)
    }
}

impl<'a> From<&'a Path> for ArtifactSource<'a> {
    fn from(path: &'a Path) -> Self {
        Self::File(path)
    }
}

impl SignedManifest {
    /// Checks that the manifest is signed by one of `trusted` and is valid,
    /// and only then hands it out. Every failure is an error: there is no
    /// "unsigned but allowed" outcome.
    pub fn verify(&self, trusted: &[PublicKey]) -> Result<&Manifest, ManifestError> {
        let key = trusted
            .iter()
            .find(|k| k.key_id() == self.key_id)
            .ok_or_else(|| ManifestError::UnknownKey {
                // Untrusted input: keep the error small whatever was sent.
                key_id: self.key_id.chars().take(64).collect(),
            })?;
        let signature = decode_signature(&self.signature)?;
        let message = signed_message(&self.manifest)?;
        key.key
            .verify_strict(&message, &signature)
            .map_err(|_| ManifestError::BadSignature("does not match the manifest and key"))?;
        self.manifest.validate()?;
        Ok(&self.manifest)
    }

    /// [`verify`](Self::verify), then checks the artifact's size and sha256
    /// against the manifest.
    pub fn verify_artifact<'a>(
        &self,
        trusted: &[PublicKey],
        artifact: impl Into<ArtifactSource<'a>>,
    ) -> Result<&Manifest, ManifestError> {
        let manifest = self.verify(trusted)?;
        match artifact.into() {
            ArtifactSource::Bytes(bytes) => check_artifact(&manifest.artifact, bytes, "artifact")?,
            ArtifactSource::File(path) => {
                let what = || format!("reading artifact {}", path.display());
                let file = File::open(path).map_err(io_error(what()))?;
                // The size is cheap to check before hashing a whole file.
                let size = file.metadata().map_err(io_error(what()))?.len();
                if size != manifest.artifact.size {
                    return Err(size_mismatch(manifest.artifact.size, size.to_string()));
                }
                check_artifact(&manifest.artifact, file, &what())?;
            }
        }
        Ok(manifest)
    }

    /// [`verify`](Self::verify), then checks an artifact streamed from
    /// `reader` (a download, say) against the manifest.
    pub fn verify_artifact_reader(
        &self,
        trusted: &[PublicKey],
        reader: impl Read,
    ) -> Result<&Manifest, ManifestError> {
        let manifest = self.verify(trusted)?;
        check_artifact(&manifest.artifact, reader, "reading artifact")?;
        Ok(manifest)
    }

    pub fn to_json_pretty(&self) -> Result<String, ManifestError> {
        serde_json::to_string_pretty(self).map_err(|e| invalid("manifest", e.to_string()))
    }

    /// Parses untrusted bytes; nothing is verified until [`verify`](Self::verify).
    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() > MAX_SIGNED_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                len: bytes.len(),
                max: MAX_SIGNED_MANIFEST_BYTES,
            });
        }
        serde_json::from_slice(bytes).map_err(|e| ManifestError::Parse(e.to_string()))
    }
}

fn decode_signature(hex_text: &str) -> Result<Signature, ManifestError> {
    // One spelling per signature, like digests: lowercase only.
    if hex_text.len() != 128
        || !hex_text
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(ManifestError::BadSignature(
            "signature must be 128 lowercase hex characters",
        ));
    }
    let mut bytes = [0u8; 64];
    hex::decode_to_slice(hex_text, &mut bytes).map_err(|_| {
        ManifestError::BadSignature("signature must be 128 lowercase hex characters")
    })?;
    Ok(Signature::from_bytes(&bytes))
}

fn size_mismatch(expected: u64, actual: String) -> ManifestError {
    ManifestError::ArtifactMismatch {
        field: "artifact.size",
        expected: expected.to_string(),
        actual,
    }
}

/// Hashes at most `size + 1` bytes, so an artifact far larger than declared
/// (or an endless stream) is not read to its end.
fn check_artifact(
    expected: &ArtifactRef,
    reader: impl Read,
    what: &str,
) -> Result<(), ManifestError> {
    let mut limited = reader.take(expected.size.saturating_add(1));
    let mut hasher = Sha256Writer::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match limited.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(ManifestError::Io {
                    what: what.to_string(),
                    source,
                })
            }
        }
    }
    let size = hasher.len();
    if size > expected.size {
        return Err(size_mismatch(
            expected.size,
            format!("more than {}", expected.size),
        ));
    }
    if size < expected.size {
        return Err(size_mismatch(expected.size, size.to_string()));
    }
    let actual = hasher.finish();
    if actual != expected.sha256 {
        return Err(ManifestError::ArtifactMismatch {
            field: "artifact.sha256",
            expected: expected.sha256.to_hex(),
            actual: actual.to_hex(),
        });
    }
    Ok(())
}

/// Finds non-finite floats in any `Serialize` value before it becomes a
/// `serde_json::Value`, where NaN and infinities silently become `null`.
mod finite {
    use std::fmt::{self, Write as _};

    use serde::ser::{self, Serialize};

    /// `Ok(Some(path))` names the first non-finite float (`.candidates[2].mse`);
    /// `Err` is an error raised by the value's own `Serialize`.
    pub(super) fn first_non_finite<T: Serialize + ?Sized>(
        value: &T,
    ) -> Result<Option<String>, String> {
        let mut walker = Walker {
            path: String::new(),
        };
        match value.serialize(&mut walker) {
            Ok(()) => Ok(None),
            Err(WalkError::NonFinite(path)) => Ok(Some(path)),
            Err(WalkError::Custom(reason)) => Err(reason),
        }
    }

    struct Walker {
        path: String,
    }

    impl Walker {
        fn float(&mut self, v: f64) -> Result<(), WalkError> {
            if v.is_finite() {
                Ok(())
            } else {
                Err(WalkError::NonFinite(self.path.clone()))
            }
        }

        fn nested<T: Serialize + ?Sized>(
            &mut self,
            segment: fmt::Arguments<'_>,
            value: &T,
        ) -> Result<(), WalkError> {
            let len = self.path.len();
            let _ = self.path.write_fmt(segment);
            let result = value.serialize(&mut *self);
            self.path.truncate(len);
            result
        }
    }

    #[derive(Debug)]
    enum WalkError {
        NonFinite(String),
        Custom(String),
    }

    impl fmt::Display for WalkError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                WalkError::NonFinite(path) => write!(f, "non-finite number at {path}"),
                WalkError::Custom(reason) => f.write_str(reason),
            }
        }
    }

    impl std::error::Error for WalkError {}

    impl ser::Error for WalkError {
        fn custom<T: fmt::Display>(msg: T) -> Self {
            WalkError::Custom(msg.to_string())
        }
    }

    /// Walks one sequence, map or struct. `restore` undoes the variant name
    /// pushed onto the path for tuple and struct variants.
    struct Compound<'a> {
        walker: &'a mut Walker,
        index: usize,
        key: String,
        restore: Option<usize>,
    }

    impl<'a> Compound<'a> {
        fn new(walker: &'a mut Walker, restore: Option<usize>) -> Self {
            Self {
                walker,
                index: 0,
                key: String::new(),
                restore,
            }
        }

        fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
            let i = self.index;
            self.index += 1;
            self.walker.nested(format_args!("[{i}]"), value)
        }

        fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), WalkError> {
            self.walker.nested(format_args!(".{key}"), value)
        }

        fn finish(self) -> Result<(), WalkError> {
            if let Some(len) = self.restore {
                self.walker.path.truncate(len);
            }
            Ok(())
        }
    }

    type Done = Result<(), WalkError>;

    impl<'a> ser::Serializer for &'a mut Walker {
        type Ok = ();
        type Error = WalkError;
        type SerializeSeq = Compound<'a>;
        type SerializeTuple = Compound<'a>;
        type SerializeTupleStruct = Compound<'a>;
        type SerializeTupleVariant = Compound<'a>;
        type SerializeMap = Compound<'a>;
        type SerializeStruct = Compound<'a>;
        type SerializeStructVariant = Compound<'a>;

        fn serialize_bool(self, _: bool) -> Done {
            Ok(())
        }
        fn serialize_i8(self, _: i8) -> Done {
            Ok(())
        }
        fn serialize_i16(self, _: i16) -> Done {
            Ok(())
        }
        fn serialize_i32(self, _: i32) -> Done {
            Ok(())
        }
        fn serialize_i64(self, _: i64) -> Done {
            Ok(())
        }
        fn serialize_i128(self, _: i128) -> Done {
            Ok(())
        }
        fn serialize_u8(self, _: u8) -> Done {
            Ok(())
        }
        fn serialize_u16(self, _: u16) -> Done {
            Ok(())
        }
        fn serialize_u32(self, _: u32) -> Done {
            Ok(())
        }
        fn serialize_u64(self, _: u64) -> Done {
            Ok(())
        }
        fn serialize_u128(self, _: u128) -> Done {
            Ok(())
        }
        fn serialize_f32(self, v: f32) -> Done {
            self.float(f64::from(v))
        }
        fn serialize_f64(self, v: f64) -> Done {
            self.float(v)
        }
        fn serialize_char(self, _: char) -> Done {
            Ok(())
        }
        fn serialize_str(self, _: &str) -> Done {
            Ok(())
        }
        fn serialize_bytes(self, _: &[u8]) -> Done {
            Ok(())
        }
        fn serialize_none(self) -> Done {
            Ok(())
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
            value.serialize(self)
        }
        fn serialize_unit(self) -> Done {
            Ok(())
        }
        fn serialize_unit_struct(self, _: &'static str) -> Done {
            Ok(())
        }
        fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Done {
            Ok(())
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            value: &T,
        ) -> Done {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            variant: &'static str,
            value: &T,
        ) -> Done {
            self.nested(format_args!(".{variant}"), value)
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'a>, WalkError> {
            Ok(Compound::new(self, None))
        }
        fn serialize_tuple(self, _: usize) -> Result<Compound<'a>, WalkError> {
            Ok(Compound::new(self, None))
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Compound<'a>, WalkError> {
            Ok(Compound::new(self, None))
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            variant: &'static str,
            _: usize,
        ) -> Result<Compound<'a>, WalkError> {
            let len = self.path.len();
            let _ = write!(self.path, ".{variant}");
            Ok(Compound::new(self, Some(len)))
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Compound<'a>, WalkError> {
            Ok(Compound::new(self, None))
        }
        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, WalkError> {
            Ok(Compound::new(self, None))
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            variant: &'static str,
            _: usize,
        ) -> Result<Compound<'a>, WalkError> {
            let len = self.path.len();
            let _ = write!(self.path, ".{variant}");
            Ok(Compound::new(self, Some(len)))
        }
    }

    impl ser::SerializeSeq for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
            self.element(value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }

    impl ser::SerializeTuple for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
            self.element(value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }

    impl ser::SerializeTupleStruct for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
            self.element(value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }

    impl ser::SerializeTupleVariant for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
            self.element(value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }

    impl ser::SerializeMap for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
            // Keys only name the path; a key JSON cannot hold is refused
            // later, when the evidence is converted.
            self.key = match serde_json::to_value(key) {
                Ok(serde_json::Value::String(s)) => s,
                Ok(other) => other.to_string(),
                Err(_) => "?".to_string(),
            };
            Ok(())
        }
        fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
            let key = std::mem::take(&mut self.key);
            self.field(&key, value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }

    impl ser::SerializeStruct for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Done {
            self.field(key, value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }

    impl ser::SerializeStructVariant for Compound<'_> {
        type Ok = ();
        type Error = WalkError;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Done {
            self.field(key, value)
        }
        fn end(self) -> Done {
            self.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semver_table() {
        for good in [
            "0.0.0",
            "1.2.3",
            "10.20.30",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-0.3.7",
            "1.0.0-x.7.z.92",
            "1.0.0-alpha-1",
            "1.0.0+20130313144700",
            "1.0.0-beta+exp.sha.5114f85",
            "1.0.0+21AF26D3----117B344092BD",
            "1.0.0+001",
        ] {
            assert_eq!(semver_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.02.3",
            "1.2.03",
            "v1.2.3",
            "1.2.3-",
            "1.2.3+",
            "1.2.3-alpha..1",
            "1.2.3-01",
            "1.2.3-a_b",
            "1.2.3+a+b",
            "1.2.3 ",
            "-1.2.3",
            "1.2.-3",
            "99999999999999999999.0.0",
            "1.2.3-ü",
        ] {
            assert!(semver_problem(bad).is_some(), "{bad}");
        }
        assert!(semver_problem(&format!("1.2.3-{}", "a".repeat(130))).is_some());
    }

    #[test]
    fn rfc3339_table() {
        for good in [
            "2024-01-31T12:00:00Z",
            "2024-02-29T23:59:60Z",
            "2024-06-01T08:30:00.123456789+02:00",
            "2024-06-01t08:30:00-05:30",
            "2000-02-29T00:00:00z",
        ] {
            assert_eq!(rfc3339_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "2024-01-31",
            "2024-01-31 12:00:00Z",
            "2024-01-31T12:00:00",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2024-04-31T00:00:00Z",
            "2024-01-00T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:61Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+24:00",
            "2024-01-01T00:00:00+0100",
            "2024-01-01T00:00:00Zjunk",
            "２０２４-01-01T00:00:00Z",
        ] {
            assert!(rfc3339_problem(bad).is_some(), "{bad}");
        }
    }

    #[derive(Serialize)]
    struct Candidate {
        name: &'static str,
        mse: f64,
        extra: Option<Vec<f32>>,
    }

    #[derive(Serialize)]
    enum Tagged {
        Struct { x: f64 },
        Tuple(f64, f64),
    }

    #[test]
    fn finite_walker_names_the_path() {
        let ok = vec![Candidate {
            name: "int8",
            mse: 0.5,
            extra: Some(vec![1.0]),
        }];
        assert_eq!(finite::first_non_finite(&ok), Ok(None));

        let nan_in_struct = serde_json::json!(null);
        assert_eq!(finite::first_non_finite(&nan_in_struct), Ok(None));

        let bad = std::collections::BTreeMap::from([(
            "candidates",
            vec![
                Candidate {
                    name: "a",
                    mse: 1.0,
                    extra: None,
                },
                Candidate {
                    name: "b",
                    mse: 2.0,
                    extra: Some(vec![0.0, f32::INFINITY]),
                },
            ],
        )]);
        assert_eq!(
            finite::first_non_finite(&bad),
            Ok(Some(".candidates[1].extra[1]".to_string()))
        );
        assert_eq!(
            finite::first_non_finite(&vec![Tagged::Struct { x: f64::NAN }]),
            Ok(Some("[0].Struct.x".to_string()))
        );
        assert_eq!(
            finite::first_non_finite(&(1.0, Tagged::Tuple(0.0, f64::NEG_INFINITY))),
            Ok(Some("[1].Tuple[1]".to_string()))
        );
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
    fn evidence_keys_are_written_sorted() {
        let mut inner = serde_json::Map::new();
        inner.insert("zeta".into(), Value::from(1));
        inner.insert("alpha".into(), Value::from(2));
        let mut outer = serde_json::Map::new();
        outer.insert("b".into(), Value::Array(vec![Value::Object(inner)]));
        outer.insert("a".into(), Value::from(0.25));
        let record = QuantizationRecord {
            method: "m".into(),
            evidence: Value::Object(outer),
        };
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            r#"{"method":"m","evidence":{"a":0.25,"b":[{"alpha":2,"zeta":1}]}}"#
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

    #[test]
    fn weak_and_invalid_public_keys_are_refused() {
        // The identity point: small order, so it "verifies" too much.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(matches!(
            PublicKey::from_bytes(&identity),
            Err(ManifestError::Key(_))
        ));
        assert!(PublicKey::from_hex("zz").is_err());
        assert!(PublicKey::from_hex(&"0".repeat(63)).is_err());
    }

    #[test]
    fn debug_never_prints_the_secret() {
        let key = ManifestKey::from_bytes(&[7u8; 32]);
        let printed = format!("{key:?}");
        assert!(!printed.contains(&hex::encode([7u8; 32])), "{printed}");
        assert!(printed.contains(&key.public().key_id()));
    }
}
