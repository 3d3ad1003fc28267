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
//!
//! # Layout
//!
//! - `schema`: the manifest structs and their validation,
//! - `checks`: the checks on single values (names, versions, timestamps),
//! - `canonical`: the signed bytes, with free-form JSON written sorted,
//! - `finite`: finds NaN and infinities before they silently become `null`,
//! - `keys`: [`ManifestKey`], [`PublicKey`] and their key files,
//! - `signing`: [`SignedManifest`], signing, and verifying manifests and artifacts.

use std::io;

mod canonical;
mod checks;
mod finite;
mod keys;
mod schema;
mod signing;

pub use keys::{ManifestKey, PublicKey};
pub use schema::{
    version_at_least, ArtifactRef, ClassShare, DimSpec, HealthProbe, InputHistogram, IoSignature,
    Lineage, Manifest, QuantizationRecord, ReferenceStats, TensorSpec, MAX_FEATURE_COLUMNS,
};
pub use signing::{ArtifactSource, SignedManifest};

/// The manifest schema this build writes and reads; any other is refused.
pub const SCHEMA_VERSION: u32 = 1;

/// The most bytes [`SignedManifest::from_json`] reads. Reference statistics
/// make manifests larger than a few KiB, but nothing legitimate comes near this.
pub const MAX_SIGNED_MANIFEST_BYTES: usize = 16 << 20;

/// Prefixed to the canonical bytes before signing, so that a manifest key's
/// signature can never be replayed as a signature over some other kind of
/// message, and a future schema cannot be confused with this one.
pub const SIGNING_CONTEXT: &[u8] = b"edgeloop.manifest.v1\n";

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
