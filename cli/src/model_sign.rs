//! `edgeloop model sign PIPELINE --signing-key KEY`: offline signing. A
//! pipeline whose policy signs offline stops at `awaiting_signature` with
//! its manifests unsigned. This fetches each, checks it describes what the
//! pipeline says (its model, version and artifact, whose bytes are fetched
//! and hashed), signs its canonical bytes with a key that never leaves this
//! machine, and sends back only the signatures. The control plane checks
//! them against the policy's public keys and moves the pipeline on.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use edgeloop_api::pipelines::{
    ManifestSignature, Output, PipelineStatus, PipelineView, SignPipeline, Step,
};
use edgeloop_models::manifest::{Manifest, ManifestKey};
use edgeloop_models::Digest;
use serde::Serialize;

use super::api::{block_on, client, segment, CliError, Client, Reply, ServerArgs};
use super::model_api::short;
use super::table::fields;

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The pipeline awaiting a signature (`edgeloop pipeline list`).
    pub pipeline: String,
    /// The ed25519 signing key (hex), kept off the control plane. Read
    /// only: never created here, since a fresh key is one no device trusts.
    #[arg(long, env = "EDGELOOP_MANIFEST_SIGNING_KEY")]
    pub signing_key: PathBuf,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// One manifest signed.
#[derive(Debug, Serialize)]
pub struct SignedItem {
    /// `version` for the version's own artifact, else the variant's name.
    pub what: String,
    /// The unsigned manifest's digest.
    pub manifest: Digest,
    pub artifact: Digest,
    pub size: u64,
    pub method: String,
}

/// `--json`: what was signed, with which key, and where the pipeline is now.
#[derive(Debug, Serialize)]
pub struct SignReport {
    pub pipeline: String,
    pub model: String,
    pub version: String,
    pub key_id: String,
    pub signed: Vec<SignedItem>,
    pub status: PipelineStatus,
}

pub fn sign(args: &SignArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let key = ManifestKey::read_from(&args.signing_key).map_err(|e| {
            CliError::Io(format!(
                "reading the signing key {}: {e}",
                args.signing_key.display()
            ))
        })?;
        let client = client(&args.server)?;
        let id = segment("pipeline id", &args.pipeline)?;
        let path = format!("/api/v1/pipelines/{id}");
        let p: PipelineView = client.get(&path).await?;
        if p.status != PipelineStatus::AwaitingSignature {
            return Err(CliError::Conflict(format!(
                "pipeline {id} is {}, not awaiting a signature",
                p.status.as_str()
            )));
        }
        let (version, to_sign) = unsigned(&p)?;
        let mut signatures = Vec::new();
        let mut signed = Vec::new();
        for mut item in to_sign {
            let manifest = fetch_manifest(&client, &p.model, &version, &item).await?;
            item.size = manifest.artifact.size;
            let s = key
                .sign(manifest)
                .map_err(|e| CliError::Invalid(format!("signing {}: {e}", item.what)))?;
            signatures.push(ManifestSignature {
                manifest: item.manifest,
                key_id: s.key_id,
                signature: s.signature,
            });
            signed.push(item);
        }
        let after: PipelineView = client
            .post(&format!("{path}/signatures"), &SignPipeline { signatures })
            .await?;
        let report = SignReport {
            pipeline: p.id,
            model: p.model,
            version,
            key_id: key.public().key_id(),
            signed,
            status: after.status,
        };
        Reply::typed(&report, args.server.json, render)
    })
}

/// The manifests the quantize step left unsigned, and the version.
fn unsigned(p: &PipelineView) -> Result<(String, Vec<SignedItem>), CliError> {
    let out = p
        .history
        .iter()
        .rev()
        .filter(|r| r.step == Step::Quantize)
        .find_map(|r| r.output.as_ref());
    let Some(Output::Unsigned {
        digest,
        method,
        manifest,
        version,
        variants,
    }) = out
    else {
        return Err(CliError::Server(format!(
            "pipeline {} awaits a signature but shows no unsigned manifests",
            p.id
        )));
    };
    let mut items = vec![SignedItem {
        what: "version".into(),
        manifest: *manifest,
        artifact: *digest,
        size: 0,
        method: method.clone(),
    }];
    for v in variants {
        items.push(SignedItem {
            what: format!("variant {}", v.name),
            manifest: v.manifest,
            artifact: v.digest,
            size: 0,
            method: v.method.clone(),
        });
    }
    Ok((version.clone(), items))
}

/// The unsigned manifest, held to what the pipeline says it is: the model,
/// the version, and the artifact, whose bytes are fetched and hashed here
/// (what a device will check the signed manifest against).
async fn fetch_manifest(
    client: &Client,
    model: &str,
    version: &str,
    item: &SignedItem,
) -> Result<Manifest, CliError> {
    let bytes = client.download(&item.manifest).await?;
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        CliError::Server(format!(
            "{} ({}) is not an unsigned manifest: {e}",
            item.what, item.manifest
        ))
    })?;
    let mismatch = |what: &str, got: &str, want: &str| {
        CliError::Server(format!(
            "refusing to sign {}: its manifest names {what} {got:?}, the pipeline {want:?}",
            item.what
        ))
    };
    if m.name != model {
        return Err(mismatch("model", &m.name, model));
    }
    if m.version != version {
        return Err(mismatch("version", &m.version, version));
    }
    if m.artifact.sha256 != item.artifact {
        return Err(mismatch(
            "artifact",
            &m.artifact.sha256.to_string(),
            &item.artifact.to_string(),
        ));
    }
    let mut sink = tokio::io::sink();
    let size = client
        .download_to(
            &item.artifact,
            &mut sink,
            std::path::Path::new("(hashed only)"),
            |_, _| {},
        )
        .await?;
    if size != m.artifact.size {
        return Err(CliError::Server(format!(
            "refusing to sign {}: its artifact is {size} bytes, its manifest says {}",
            item.what, m.artifact.size
        )));
    }
    Ok(m)
}

fn render(r: &SignReport) -> String {
    let mut s = fields(&[
        ("pipeline", r.pipeline.clone()),
        ("model", r.model.clone()),
        ("version", r.version.clone()),
        ("key", r.key_id.clone()),
        ("status", r.status.as_str().to_string()),
    ]);
    for item in &r.signed {
        s.push_str(&format!(
            "signed {}: {} artifact {}, {} bytes (manifest {})\n",
            item.what,
            item.method,
            short(Some(&item.artifact)),
            item.size,
            short(Some(&item.manifest))
        ));
    }
    s
}
