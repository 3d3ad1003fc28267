//! Signed manifests: signing a [`Manifest`] with a [`ManifestKey`], and
//! verifying a [`SignedManifest`] (and the artifact it describes) against
//! trusted [`PublicKey`]s.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use ed25519_dalek::Signature;
use serde::{Deserialize, Serialize};

use super::canonical::signed_message;
use super::{
    invalid, io_error, ArtifactRef, Manifest, ManifestError, ManifestKey, PublicKey,
    MAX_SIGNED_MANIFEST_BYTES,
};
use crate::Sha256Writer;

impl ManifestKey {
    /// Validates `manifest`, then signs its canonical bytes.
    pub fn sign(&self, manifest: Manifest) -> Result<SignedManifest, ManifestError> {
        manifest.validate()?;
        let message = signed_message(&manifest)?;
        let signature = self.sign_message(&message);
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
}

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
        key.verify_message(&message, &signature)
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
