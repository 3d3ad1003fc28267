//! What makes files fit to activate: the manifest is signed by a trusted key
//! and describes exactly the assigned artifact; the artifact hashes to its
//! digest; the probe's sample inputs load. Used after a download and again
//! at boot, since a slot on disk is only as good as its last check.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use edgeloop_models::manifest::{Manifest, PublicKey, SignedManifest};
use edgeloop_models::npz::Npz;
use edgeloop_models::{Digest, Sha256Writer};

use super::assignment::Content;
use super::failure::Failure;
use super::slots::{MANIFEST_FILE, MODEL_FILE, PROBE_FILE};
use crate::serving::{PrepareSpec, ProbeSpec};

/// Which signatures this device accepts.
#[derive(Debug, Clone)]
pub struct Trust {
    pub keys: Vec<PublicKey>,
    pub allow_unsigned: bool,
}

impl Trust {
    /// A version without a manifest is refused unless unsigned models are allowed.
    pub fn admit_unsigned(&self, content: &Content) -> Result<(), Failure> {
        if content.manifest.is_none() && !self.allow_unsigned {
            return Err(Failure::Unsigned {
                version: content.version.clone(),
            });
        }
        Ok(())
    }

    /// Parses and verifies a signed manifest, and checks that it describes
    /// `content`: the artifact's digest and size, and the probe inputs.
    pub fn check_manifest(&self, bytes: &[u8], content: &Content) -> Result<Manifest, Failure> {
        let signed = SignedManifest::from_json(bytes)
            .map_err(|e| Failure::BadSignature(format!("unreadable manifest: {e}")))?;
        let manifest = signed
            .verify(&self.keys)
            .map_err(|e| Failure::BadSignature(e.to_string()))?;
        if manifest.artifact.sha256 != content.artifact {
            return Err(Failure::ManifestMismatch(format!(
                "it describes artifact {}, the assignment {}",
                manifest.artifact.sha256, content.artifact
            )));
        }
        if manifest.artifact.size != content.artifact_size {
            return Err(Failure::ManifestMismatch(format!(
                "it gives the artifact size as {}, the assignment as {}",
                manifest.artifact.size, content.artifact_size
            )));
        }
        let probe = manifest.health_probe.as_ref().map(|p| p.sample_inputs);
        if probe != content.probe_inputs {
            return Err(Failure::ManifestMismatch(format!(
                "its health probe inputs are {}, the assignment's {}",
                describe(probe),
                describe(content.probe_inputs)
            )));
        }
        Ok(manifest.clone())
    }
}

/// The manifest is signed for the model and version it is assigned as: a
/// manifest signed for `rainfall 1.0.0` never serves as `digits 7`, even
/// when the control plane (or whoever holds it) says so.
pub fn check_identity(manifest: &Manifest, model: &str, version: &str) -> Result<(), Failure> {
    if manifest.name != model || manifest.version != version {
        return Err(Failure::ManifestMismatch(format!(
            "it is signed for {} {}, the assignment is {model} {version}",
            manifest.name, manifest.version
        )));
    }
    Ok(())
}

/// Anti-rollback: whether `version` (with its verified manifest, when
/// signed) may be installed where the floor is `floor`. Pure.
pub fn check_floor(
    manifest: Option<&Manifest>,
    version: &str,
    floor: Option<&str>,
) -> Result<(), Failure> {
    let Some(f) = floor else {
        return Ok(());
    };
    let allowed = match manifest {
        Some(m) => m.allowed_above(Some(f)),
        None => edgeloop_models::manifest::version_at_least(version, f),
    };
    if allowed {
        Ok(())
    } else {
        Err(Failure::BelowFloor {
            version: version.to_string(),
            floor: f.to_string(),
        })
    }
}

fn describe(d: Option<Digest>) -> String {
    d.map_or_else(|| "none".to_string(), |d| d.to_string())
}

/// The sha256 and length of a file, streamed.
pub fn hash_file(path: &Path) -> std::io::Result<(Digest, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256Writer::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = hasher.len();
    Ok((hasher.finish(), len))
}

/// Checks a file against its expected digest.
pub fn check_file(
    path: &Path,
    what: &'static str,
    expected: Digest,
    size: Option<u64>,
) -> Result<(), Failure> {
    let (actual, len) = hash_file(path).map_err(|e| Failure::storage(what, e))?;
    if let Some(size) = size.filter(|s| *s != len) {
        return Err(Failure::BadSize {
            what,
            digest: expected,
            expected: size,
            actual: len,
        });
    }
    if actual != expected {
        return Err(Failure::BadDigest {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// The probe's sample inputs as one batch of named tensors.
pub fn load_probe(path: &Path, manifest: &Manifest) -> Result<Option<ProbeSpec>, Failure> {
    let Some(probe) = &manifest.health_probe else {
        return Ok(None);
    };
    let npz = Npz::read(path).map_err(|e| Failure::ProbeInputs(e.to_string()))?;
    if npz.is_empty() {
        return Err(Failure::ProbeInputs("the .npz holds no arrays".into()));
    }
    Ok(Some(ProbeSpec {
        inputs: npz
            .iter()
            .map(|(name, t)| (name.to_string(), t.clone()))
            .collect(),
        max_latency: Duration::from_secs_f64(probe.max_latency_ms / 1000.0),
    }))
}

/// Builds the activation request for the files in `dir` (a slot). With
/// `verify_artifact`, the model file is hashed again (at boot); right after
/// a verified download it is not, since renaming did not change it. The
/// manifest and probe inputs are always checked: they are small.
pub fn prepare(
    dir: &Path,
    model: &str,
    content: &Content,
    trust: &Trust,
    verify_artifact: bool,
) -> Result<PrepareSpec, Failure> {
    trust.admit_unsigned(content)?;
    let path = dir.join(MODEL_FILE);
    if verify_artifact {
        check_file(
            &path,
            "artifact",
            content.artifact,
            Some(content.artifact_size),
        )?;
    }
    let (manifest, probe) = match content.manifest {
        None => (None, None),
        Some(digest) => {
            let manifest_path = dir.join(MANIFEST_FILE);
            let bytes =
                std::fs::read(&manifest_path).map_err(|e| Failure::storage("manifest", e))?;
            if Digest::of(&bytes) != digest {
                return Err(Failure::BadDigest {
                    what: "manifest",
                    expected: digest,
                    actual: Digest::of(&bytes),
                });
            }
            let manifest = trust.check_manifest(&bytes, content)?;
            check_identity(&manifest, model, &content.version)?;
            let probe_path = dir.join(PROBE_FILE);
            if let Some(d) = content.probe_inputs {
                check_file(&probe_path, "probe inputs", d, None)?;
            }
            let probe = load_probe(&probe_path, &manifest)?;
            (Some(manifest), probe)
        }
    };
    Ok(PrepareSpec {
        model: model.to_string(),
        version: content.version.clone(),
        path,
        manifest,
        probe,
    })
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn a_manifest_serves_only_as_the_model_and_version_it_is_signed_for() {
        let mut m: Manifest = serde_json::from_value(serde_json::json!({
            "schema": 1, "name": "rainfall", "version": "1.0.0",
            "artifact": {"sha256": "0".repeat(64), "size": 1, "format": "onnx"},
            "signature": {"inputs": [], "outputs": []}, "lineage": {},
            "created_at": "2026-01-01T00:00:00Z"
        }))
        .unwrap_or_else(|e| panic!("a minimal manifest: {e}"));
        let table = [
            ("rainfall", "1.0.0", true),
            ("digits", "1.0.0", false),
            ("rainfall", "7", false),
            ("digits", "7", false),
        ];
        for (model, version, ok) in table {
            assert_eq!(
                check_identity(&m, model, version).is_ok(),
                ok,
                "{model} {version}"
            );
        }
        m.version = "7".into();
        assert!(matches!(
            check_identity(&m, "rainfall", "1.0.0"),
            Err(Failure::ManifestMismatch(msg)) if msg.contains("rainfall 7")
        ));
    }
}
