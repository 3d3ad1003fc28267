//! Container images: the reference a job spec names, and the digest an
//! engine pins it to at the job's first attempt. Every later attempt runs
//! the pinned digest, and a model's lineage names it, so the software that
//! trained a model is known even after its tag moves.

use std::fmt;

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};

/// What an engine runs for a job's `image`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PinnedImage {
    /// The reference the job spec named, as written.
    pub reference: String,
    /// The sha256 of what runs (64 lowercase hex); see `kind`.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9a-f]{64}$"))]
    pub digest: Digest,
    pub kind: PinKind,
}

/// What a [`PinnedImage`]'s digest is the digest of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PinKind {
    /// The image's ID on the node (the digest of its configuration): what a
    /// local runtime (Podman, Docker) runs, with or without a registry.
    ImageId,
    /// The manifest digest a registry serves (`name@sha256:...`).
    Manifest,
}

impl PinKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PinKind::ImageId => "image_id",
            PinKind::Manifest => "manifest",
        }
    }
}

impl PinnedImage {
    /// How an engine names the pinned image to run it: the ID itself
    /// (`sha256:<hex>`), or `name@sha256:<hex>` for a manifest digest.
    pub fn runnable(&self) -> String {
        match self.kind {
            PinKind::ImageId => format!("sha256:{}", self.digest),
            PinKind::Manifest => {
                format!("{}@sha256:{}", without_digest(&self.reference), self.digest)
            }
        }
    }
}

impl fmt::Display for PinnedImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            PinKind::ImageId => "image ID",
            PinKind::Manifest => "manifest",
        };
        write!(f, "{} ({what} sha256:{})", self.reference, self.digest)
    }
}

/// A way a cluster runs a job's image: a fact each node pool reports, so
/// the pre-flight check refuses an image where none is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ContainerWay {
    /// Podman on the bridge's machine (the local engine).
    Podman,
    /// Docker on the bridge's machine (the local engine).
    Docker,
    /// Slurm with NVIDIA's pyxis plugin and enroot: `srun --container-image`.
    Pyxis,
    /// Slurm's own OCI support: `srun --container=<bundle>`, with `oci.conf`
    /// running runc (or crun) on the nodes.
    SlurmOci,
    /// Apptainer (or Singularity) on the nodes: `apptainer exec --nv`.
    Apptainer,
    /// Kubernetes pods.
    Kubernetes,
}

impl ContainerWay {
    pub const ALL: [ContainerWay; 6] = [
        ContainerWay::Podman,
        ContainerWay::Docker,
        ContainerWay::Pyxis,
        ContainerWay::SlurmOci,
        ContainerWay::Apptainer,
        ContainerWay::Kubernetes,
    ];

    /// As the JSON and the bridge's settings write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerWay::Podman => "podman",
            ContainerWay::Docker => "docker",
            ContainerWay::Pyxis => "pyxis",
            ContainerWay::SlurmOci => "slurm_oci",
            ContainerWay::Apptainer => "apptainer",
            ContainerWay::Kubernetes => "kubernetes",
        }
    }

    pub fn parse(s: &str) -> Option<ContainerWay> {
        ContainerWay::ALL
            .into_iter()
            .find(|w| w.as_str() == s.trim())
    }
}

/// Why a reference is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("{0:?} is not an image reference (empty, or has spaces or control characters)")]
    Malformed(String),
    #[error("{reference:?} names a digest that is not sha256:<64 lowercase hex> ({why})")]
    BadDigest { reference: String, why: String },
}

/// Checks a reference: not empty, no spaces or control characters, and a
/// digest part (`@...`), when it has one, is `sha256:` and 64 lowercase hex.
/// Returns the digest it names.
pub fn check_reference(reference: &str) -> Result<Option<Digest>, ImageRefError> {
    if reference.is_empty()
        || reference
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ImageRefError::Malformed(reference.to_string()));
    }
    let Some((_, digest)) = reference.split_once('@') else {
        return Ok(None);
    };
    let bad = |why: String| ImageRefError::BadDigest {
        reference: reference.to_string(),
        why,
    };
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| bad("only sha256 digests are pinned".into()))?;
    hex.parse::<Digest>()
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// The reference without its digest part (`name:tag@sha256:..` → `name:tag`).
pub fn without_digest(reference: &str) -> &str {
    reference
        .split_once('@')
        .map_or(reference, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_and_the_digests_they_name() {
        assert_eq!(check_reference("localhost/trainer:1"), Ok(None));
        let pinned = format!("ghcr.io/acme/train:1@sha256:{HEX}");
        assert_eq!(check_reference(&pinned), Ok(Some(HEX.parse().unwrap())));
        assert_eq!(without_digest(&pinned), "ghcr.io/acme/train:1");
        for bad in ["", "a b", "a\tb", "x\u{7}"] {
            assert!(
                matches!(check_reference(bad), Err(ImageRefError::Malformed(_))),
                "{bad:?}"
            );
        }
        for bad in [
            format!("x@md5:{HEX}"),
            "x@sha256:abc".to_string(),
            format!("x@sha256:{}", HEX.to_uppercase()),
            "x@".to_string(),
        ] {
            let e = check_reference(&bad).unwrap_err();
            assert!(matches!(e, ImageRefError::BadDigest { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn container_ways_read_back_as_written() {
        for way in ContainerWay::ALL {
            assert_eq!(ContainerWay::parse(way.as_str()), Some(way));
            assert_eq!(
                serde_json::to_value(way).unwrap(),
                serde_json::json!(way.as_str())
            );
        }
        assert_eq!(ContainerWay::parse(" pyxis "), Some(ContainerWay::Pyxis));
        assert_eq!(ContainerWay::parse("enroot"), None);
    }

    #[test]
    fn a_pinned_image_runs_by_id_or_by_manifest_digest() {
        let id = PinnedImage {
            reference: "localhost/trainer:1".into(),
            digest: HEX.parse().unwrap(),
            kind: PinKind::ImageId,
        };
        assert_eq!(id.runnable(), format!("sha256:{HEX}"));
        assert_eq!(
            id.to_string(),
            format!("localhost/trainer:1 (image ID sha256:{HEX})")
        );
        let manifest = PinnedImage {
            reference: format!("ghcr.io/acme/train:1@sha256:{HEX}"),
            kind: PinKind::Manifest,
            ..id
        };
        assert_eq!(
            manifest.runnable(),
            format!("ghcr.io/acme/train:1@sha256:{HEX}")
        );
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(json["kind"], "manifest");
        assert_eq!(
            serde_json::from_value::<PinnedImage>(json).unwrap(),
            manifest
        );
    }
}
