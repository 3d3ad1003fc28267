//! Offline signing: a policy may keep the signing key off the control
//! plane. Its pipelines stop at `awaiting_signature` with the manifests the
//! quantize step left unsigned; a signer elsewhere (`edgeloop model sign`)
//! fetches them, signs their canonical bytes, and sends the signatures
//! back here. The control plane checks each against the policy's public
//! keys before it moves the pipeline on, so a wrong key is refused at the
//! door instead of by every device later. It never holds the private key.

use std::collections::BTreeMap;

use edgeloop_api::pipelines::{ManifestSignature, QuantizedVariant, SignPipeline, Signing};
use edgeloop_models::manifest::{Manifest, PublicKey, SignedManifest};
use edgeloop_models::Digest;
use time::OffsetDateTime;

use crate::lifecycle::pipeline::{self, Output, Pipeline, PipelineState};
use crate::Core;
use edgeloop_errors::{Error, Result};
use edgeloop_registry::artifacts;
use edgeloop_registry::models;

/// At most this many keys per policy: enough for a rotation or two.
const MAX_KEYS: usize = 8;

/// The policy's signing mode, checked when it is set. Offline signing and a
/// latency gate do not go together: the device benchmark runs candidates
/// the control plane signs, which devices trusting only an offline key
/// refuse.
pub fn validate_policy(signing: &Signing, has_latency: bool) -> Result<()> {
    let Signing::Offline { public_keys } = signing else {
        return Ok(());
    };
    if public_keys.is_empty() || public_keys.len() > MAX_KEYS {
        return Err(Error::bad_field(
            "signing.public_keys",
            format!("name 1 to {MAX_KEYS} ed25519 public keys (64 hex characters each)"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, k) in public_keys.iter().enumerate() {
        let field = format!("signing.public_keys[{i}]");
        let key = PublicKey::from_hex(k)
            .map_err(|e| Error::bad_field(&field, format!("not an ed25519 public key: {e}")))?;
        if !seen.insert(key.key_id()) {
            return Err(Error::bad_field(field, "is named twice"));
        }
    }
    if has_latency {
        return Err(Error::bad_field(
            "signing",
            "offline signing cannot be combined with latency: the device benchmark runs \
             candidates the control plane signs; leave latency out",
        ));
    }
    Ok(())
}

/// A waiting pipeline's models: the quantize step's `unsigned` output.
struct Unsigned<'a> {
    digest: Digest,
    method: &'a str,
    manifest: Digest,
    version: &'a str,
    variants: &'a [QuantizedVariant],
}

impl<'a> Unsigned<'a> {
    fn of(p: &'a Pipeline) -> Result<Unsigned<'a>> {
        match p.output_of(pipeline::Step::Quantize) {
            Some(Output::Unsigned {
                digest,
                method,
                manifest,
                version,
                variants,
            }) => Ok(Unsigned {
                digest: *digest,
                method,
                manifest: *manifest,
                version,
                variants,
            }),
            _ => Err(Error::Internal(anyhow::anyhow!(
                "pipeline {} awaits a signature but its quantize step left no unsigned manifests",
                p.id
            ))),
        }
    }

    /// Each manifest to sign, and the variant it describes (`None`: the
    /// version's own).
    fn needed(&self) -> BTreeMap<Digest, Option<&'a QuantizedVariant>> {
        std::iter::once((self.manifest, None))
            .chain(self.variants.iter().map(|v| (v.manifest, Some(v))))
            .collect()
    }
}

/// Checks one signature over a stored unsigned manifest and returns the
/// signed manifest's JSON.
async fn signed_json(
    core: &Core,
    s: &ManifestSignature,
    trusted: &[PublicKey],
    field: &str,
) -> Result<Vec<u8>> {
    let bytes = models::read_manifest_bytes(core.artifacts.as_ref(), s.manifest, field).await?;
    // Our own quantize step wrote it: failing to read it back is ours.
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Internal(anyhow::anyhow!(
            "unsigned manifest {} does not parse: {e}",
            s.manifest
        ))
    })?;
    let signed = SignedManifest {
        manifest,
        key_id: s.key_id.clone(),
        signature: s.signature.clone(),
    };
    signed.verify(trusted).map_err(|e| {
        Error::bad_field(
            format!("{field}.signature"),
            format!(
                "does not verify with the policy's public keys for manifest {}: {e}",
                s.manifest
            ),
        )
    })?;
    signed
        .to_json_pretty()
        .map(String::into_bytes)
        .map_err(|e| Error::Internal(anyhow::anyhow!("writing a signed manifest: {e}")))
}

/// Takes the signatures of a pipeline awaiting them: one per unsigned
/// manifest, each made by one of the policy's keys (fixed when the pipeline
/// started). Stores the signed manifests and moves the pipeline on to
/// register; nothing changes unless every signature verifies.
pub async fn sign(
    core: &Core,
    id: &str,
    req: SignPipeline,
    now: OffsetDateTime,
) -> Result<Pipeline> {
    let p = super::get(&core.store, id)?;
    if !matches!(p.state, PipelineState::AwaitingSignature { .. }) {
        return Err(Error::Conflict(format!(
            "pipeline {id:?} is {}, not awaiting a signature",
            super::state_name(&p.state)
        )));
    }
    let Signing::Offline { public_keys } = &p.signing else {
        return Err(Error::Internal(anyhow::anyhow!(
            "pipeline {id} awaits a signature but the control plane signs it"
        )));
    };
    let trusted = public_keys
        .iter()
        .map(|k| PublicKey::from_hex(k))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Internal(anyhow::anyhow!("the pipeline's public keys: {e}")))?;
    let unsigned = Unsigned::of(&p)?;
    let needed = unsigned.needed();
    if req.signatures.is_empty() || req.signatures.len() > needed.len() {
        return Err(Error::bad_field(
            "signatures",
            format!(
                "send one signature per unsigned manifest: {} here",
                needed.len()
            ),
        ));
    }
    let mut signed: BTreeMap<Digest, Digest> = BTreeMap::new();
    for (i, s) in req.signatures.iter().enumerate() {
        let field = format!("signatures[{i}]");
        if !needed.contains_key(&s.manifest) {
            return Err(Error::bad_field(
                format!("{field}.manifest"),
                format!(
                    "{} is not an unsigned manifest of pipeline {id}",
                    s.manifest
                ),
            ));
        }
        if signed.contains_key(&s.manifest) {
            return Err(Error::bad_field(
                format!("{field}.manifest"),
                format!("{} is signed twice", s.manifest),
            ));
        }
        let json = signed_json(core, s, &trusted, &field).await?;
        signed.insert(
            s.manifest,
            artifacts::put_bytes(
                core.artifacts.as_ref(),
                json,
                core.config.max_artifact_bytes,
            )
            .await?,
        );
    }
    if let Some((missing, variant)) = needed.iter().find(|(d, _)| !signed.contains_key(d)) {
        let what = match variant {
            Some(v) => format!("variant {:?}'s manifest", v.name),
            None => "the version's own manifest".into(),
        };
        return Err(Error::bad_field(
            "signatures",
            format!("{what} ({missing}) is not signed"),
        ));
    }
    let output = Output::Quantized {
        digest: unsigned.digest,
        method: unsigned.method.to_string(),
        manifest: signed[&unsigned.manifest],
        version: unsigned.version.to_string(),
        variants: unsigned
            .variants
            .iter()
            .map(|v| QuantizedVariant {
                manifest: signed[&v.manifest],
                ..v.clone()
            })
            .collect(),
    };
    // Only from the state the signatures were checked against: a cancel
    // that landed meanwhile wins.
    let next = core
        .store
        .lifecycle
        .pipelines
        .update(id, |cur| match cur {
            Some(cur) if cur == p => Ok(pipeline::advance(
                &cur,
                pipeline::Event::Succeeded(output.clone()),
                now.unix_timestamp(),
            )
            .0),
            _ => Err(Error::Conflict(format!(
                "pipeline {id:?} changed while its signatures were checked; look again"
            ))),
        })??;
    core.store.flush().await?;
    tracing::info!(pipeline = %id, manifests = signed.len(), "offline signatures accepted");
    Ok(next)
}
