//! `edgeloop model push MODEL.onnx --name N --version V [--manifest M]
//! [--probe-inputs P] [lineage]`: registers a model version in one command
//! (what took an upload per file and a registration by digest before).
//!
//! Everything that can be checked locally is checked before anything is
//! sent: the file is a valid single-file ONNX model, the manifest parses,
//! is valid and describes exactly this file (sha256 and size) for this
//! model, the probe inputs are the ones the manifest names, and the name,
//! version and lineage follow the registry's rules. Then the files the
//! server does not hold yet are streamed up (content-addressed, so a file
//! it holds is never sent again) and the version is registered.
//!
//! A push is idempotent by digest: the same files under the same version
//! again answer "already registered" (exit 0); different files under an
//! existing version are a conflict naming it (exit 75), before any upload.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use edgeloop_api::registry::{
    is_valid_version, ArtifactFormat, CreateModel, CreateModelVersion, Lineage, ModelVersionView,
    VERSION_RULE,
};
use edgeloop_api::ErrorKind;
use edgeloop_models::manifest::{SignedManifest, MAX_SIGNED_MANIFEST_BYTES};
use edgeloop_models::names::{is_valid_name, NAME_RULE};
use edgeloop_models::npz::Npz;
use edgeloop_models::{onnx, Digest};
use serde::Serialize;

use super::api::{block_on, client, CliError, Client, Reply, ServerArgs};
use super::model_api::{short, size};
use super::table::fields;
use super::transfer::{bar, hash_file, unreadable};

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The ONNX model (one file: tensors stored outside it are refused).
    pub model: PathBuf,
    /// The signed manifest describing the model (default: MODEL.manifest.json
    /// when it exists, as `edgeloop model quantize` writes it).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// The health probe's inputs (`.npz`) that the manifest names (default:
    /// MODEL.probe.npz when it exists and the manifest names a probe).
    #[arg(long)]
    pub probe_inputs: Option<PathBuf>,
    /// The registered model (created if it does not exist yet).
    #[arg(long)]
    pub name: String,
    /// The project a model created by this push belongs to (default
    /// `default`); an existing model keeps its own.
    #[arg(long)]
    pub project: Option<String>,
    /// The version to register, e.g. `1.2.0`.
    #[arg(long)]
    pub version: String,
    /// Lineage: the version this one was derived from (must be registered).
    #[arg(long)]
    pub parent_version: Option<String>,
    /// Lineage: what caused it (`manual`, `drift`, ...).
    #[arg(long)]
    pub trigger: Option<String>,
    /// Lineage: the training job that produced it.
    #[arg(long)]
    pub job: Option<String>,
    /// Lineage: sha256 of the dataset snapshot it was trained on.
    #[arg(long)]
    pub dataset: Option<Digest>,
    /// Lineage: sha256 of the checkpoint it was exported from.
    #[arg(long)]
    pub checkpoint: Option<Digest>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// A local file to send: what it is to the version, and its digest.
#[derive(Debug, Clone, Serialize)]
pub struct PushFile {
    pub role: &'static str,
    #[serde(skip)]
    pub path: PathBuf,
    pub digest: Digest,
    pub size: u64,
    /// Sent by this push (false: the server had it).
    pub uploaded: bool,
}

/// What was checked locally, ready to send.
#[derive(Debug)]
struct Checked {
    files: Vec<PushFile>,
    request: CreateModelVersion,
    /// Probe inputs the manifest names that the push does not carry: the
    /// server must hold them already.
    probe_on_server: Option<Digest>,
}

/// `--json`: what the push did.
#[derive(Debug, Serialize)]
pub struct PushReport {
    /// `registered`, or `already_registered` (the same files were there).
    pub outcome: &'static str,
    pub files: Vec<PushFile>,
    pub version: ModelVersionView,
}

pub fn push(args: &PushArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let checked = check(args)?;
        let client = client(&args.server)?;
        let report = send(&client, args, checked).await?;
        Reply::typed(&report, args.server.json, render)
    })
}

fn invalid(path: &Path, message: impl std::fmt::Display) -> CliError {
    CliError::Invalid(format!("{}: {message}", path.display()))
}

/// The local checks, in the order a person would fix them.
fn check(args: &PushArgs) -> Result<Checked, CliError> {
    if !is_valid_name(&args.name) {
        return Err(CliError::Usage(format!(
            "--name {:?} is not a valid model name: {NAME_RULE}",
            args.name
        )));
    }
    if !is_valid_version(&args.version) {
        return Err(CliError::Usage(format!(
            "--version {:?} is not a valid version: {VERSION_RULE}",
            args.version
        )));
    }
    if let Some(p) = &args.parent_version {
        if !is_valid_version(p) {
            return Err(CliError::Usage(format!(
                "--parent-version {p:?} is not a valid version: {VERSION_RULE}"
            )));
        }
    }
    let quiet = args.server.json;
    check_onnx(&args.model)?;
    let (digest, model_size) = hash_file(&args.model, "hashing model", quiet)?;
    let mut files = vec![PushFile {
        role: "artifact",
        path: args.model.clone(),
        digest,
        size: model_size,
        uploaded: false,
    }];
    let mut manifest_lineage = Lineage::default();
    let mut manifest_digest = None;
    let mut probe_on_server = None;
    // What `edgeloop model quantize --out MODEL` writes beside MODEL.
    let beside = |suffix: &str| {
        let mut name = args.model.as_os_str().to_owned();
        name.push(suffix);
        Some(PathBuf::from(name)).filter(|p| p.is_file())
    };
    let manifest = args.manifest.clone().or_else(|| beside(".manifest.json"));
    if manifest.is_none() {
        if let Some(p) = &args.probe_inputs {
            return Err(invalid(
                p,
                "probe inputs need a manifest that names them (--manifest)",
            ));
        }
    }
    if let Some(path) = &manifest {
        let (signed, m_digest, m_size) = read_manifest(path)?;
        let m = &signed.manifest;
        m.validate().map_err(|e| invalid(path, e))?;
        if m.artifact.sha256 != digest || m.artifact.size != model_size {
            return Err(invalid(
                path,
                format!(
                    "the manifest describes artifact {} ({} bytes), not {} ({digest}, {model_size} bytes)",
                    m.artifact.sha256,
                    m.artifact.size,
                    args.model.display()
                ),
            ));
        }
        if m.artifact.format != "onnx" {
            return Err(invalid(
                path,
                format!("the manifest's artifact is {}, not onnx", m.artifact.format),
            ));
        }
        if m.name != args.name {
            return Err(invalid(
                path,
                format!(
                    "the manifest is for model {:?}, not {:?}",
                    m.name, args.name
                ),
            ));
        }
        let named = m.health_probe.as_ref().map(|p| p.sample_inputs);
        let probe = args
            .probe_inputs
            .clone()
            .or_else(|| named.and_then(|_| beside(".probe.npz")));
        match (&probe, named) {
            (Some(p), None) => {
                return Err(invalid(
                    p,
                    "the manifest names no probe inputs (health_probe.sample_inputs)",
                ))
            }
            (Some(p), Some(want)) => {
                let (got, p_size) = hash_file(p, "hashing probe", quiet)?;
                if got != want {
                    return Err(invalid(
                        p,
                        format!("the manifest names probe inputs {want}; this file is {got}"),
                    ));
                }
                check_npz(p, p_size)?;
                files.push(PushFile {
                    role: "probe_inputs",
                    path: p.clone(),
                    digest: got,
                    size: p_size,
                    uploaded: false,
                });
            }
            (None, named) => probe_on_server = named,
        }
        manifest_lineage = Lineage::from_manifest(&m.lineage);
        manifest_digest = Some(m_digest);
        files.push(PushFile {
            role: "manifest",
            path: path.clone(),
            digest: m_digest,
            size: m_size,
            uploaded: false,
        });
    }
    // The flags win; the manifest's lineage fills in what they leave out.
    let lineage = Lineage {
        parent_version: args
            .parent_version
            .clone()
            .or(manifest_lineage.parent_version),
        trigger: args.trigger.clone(),
        dataset: args.dataset.or(manifest_lineage.dataset),
        job: args.job.clone().or(manifest_lineage.job),
        checkpoint: args.checkpoint.or(manifest_lineage.checkpoint),
        // The control plane fills it in from the job's pin.
        image: None,
        quantization: None,
        hard_examples: None,
    };
    let request = CreateModelVersion {
        version: Some(args.version.clone()),
        format: Some(ArtifactFormat::Onnx),
        manifest_digest,
        lineage: (lineage != Lineage::default()).then_some(lineage),
        ..CreateModelVersion::new(digest)
    };
    Ok(Checked {
        files,
        request,
        probe_on_server,
    })
}

/// A valid ONNX model in one file. The model is decoded whole (the ONNX
/// format has no streaming reader); it is dropped before anything is sent.
fn check_onnx(path: &Path) -> Result<(), CliError> {
    let meta = std::fs::metadata(path).map_err(|e| unreadable(path, e))?;
    if !meta.is_file() {
        return Err(CliError::Usage(format!("{} is not a file", path.display())));
    }
    let model = onnx::read(path).map_err(|e| invalid(path, format!("not an ONNX model: {e}")))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    onnx::validate(&model, Some(dir))
        .map_err(|e| invalid(path, format!("not a valid ONNX model: {e}")))?;
    let external = onnx::inspect(&model).external_data;
    if let Some(e) = external.first() {
        return Err(invalid(
            path,
            format!(
                "tensor {} is stored outside the model (in {}); the registry keeps one file \
                 per version: save the model with its tensors inside",
                e.tensor, e.location
            ),
        ));
    }
    Ok(())
}

/// Probe inputs small enough to read are checked to be an `.npz`; the
/// device checks them against the model's inputs.
fn check_npz(path: &Path, size: u64) -> Result<(), CliError> {
    const READ_AT_MOST: u64 = 64 << 20;
    if size <= READ_AT_MOST {
        Npz::read(path).map_err(|e| invalid(path, format!("not an .npz file: {e}")))?;
    }
    Ok(())
}

fn read_manifest(path: &Path) -> Result<(SignedManifest, Digest, u64), CliError> {
    let size = std::fs::metadata(path)
        .map_err(|e| unreadable(path, e))?
        .len();
    if size > MAX_SIGNED_MANIFEST_BYTES as u64 {
        return Err(invalid(
            path,
            format!("{size} bytes is too large for a signed manifest (at most {MAX_SIGNED_MANIFEST_BYTES})"),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(path, e))?;
    let signed = SignedManifest::from_json(&bytes)
        .map_err(|e| invalid(path, format!("not a signed manifest: {e}")))?;
    Ok((signed, Digest::of(&bytes), bytes.len() as u64))
}

/// The server side: the model, the version's state, the uploads, the
/// registration.
async fn send(
    client: &Client,
    args: &PushArgs,
    mut checked: Checked,
) -> Result<PushReport, CliError> {
    let (name, version) = (&args.name, &args.version);
    ensure_model(client, name, args.project.as_deref()).await?;
    let version_path = format!("/api/v1/models/{name}/versions/{version}");
    if let Some(existing) = get_optional::<ModelVersionView>(client, &version_path).await? {
        same_content(&existing, &checked.request)?;
        return Ok(PushReport {
            outcome: "already_registered",
            files: checked.files,
            version: existing,
        });
    }
    if let Some(probe) = checked.probe_on_server {
        if client.artifact_size(&probe).await?.is_none() {
            return Err(CliError::Invalid(format!(
                "the manifest names probe inputs {probe}, which the server does not have: \
                 pass them with --probe-inputs FILE"
            )));
        }
    }
    for f in &mut checked.files {
        f.uploaded = upload(client, f, args.server.json).await?;
    }
    let created: Result<ModelVersionView, _> = client
        .post(&format!("/api/v1/models/{name}/versions"), &checked.request)
        .await;
    match created {
        Ok(v) => Ok(PushReport {
            outcome: "registered",
            files: checked.files,
            version: v,
        }),
        // Someone registered it meanwhile: the same files are fine.
        Err(e) if e.kind() == ErrorKind::Conflict => {
            match get_optional::<ModelVersionView>(client, &version_path).await? {
                Some(existing) => {
                    same_content(&existing, &checked.request)?;
                    Ok(PushReport {
                        outcome: "already_registered",
                        files: checked.files,
                        version: existing,
                    })
                }
                None => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates the model unless it exists.
async fn ensure_model(client: &Client, name: &str, project: Option<&str>) -> Result<(), CliError> {
    let path = format!("/api/v1/models/{name}");
    if get_optional::<serde_json::Value>(client, &path)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let create = CreateModel {
        name: name.to_string(),
        project: project.map(str::to_string),
        ..CreateModel::default()
    };
    match client
        .post::<_, serde_json::Value>("/api/v1/models", &create)
        .await
    {
        Ok(_) => Ok(()),
        // Created meanwhile by someone else.
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `GET path`, with a 404 as `None`.
pub async fn get_optional<T: serde::de::DeserializeOwned>(
    client: &Client,
    path: &str,
) -> Result<Option<T>, CliError> {
    match client.get(path).await {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The registered version has exactly these files, or it is a conflict.
fn same_content(existing: &ModelVersionView, req: &CreateModelVersion) -> Result<(), CliError> {
    let describe = |artifact: &Digest, manifest: Option<&Digest>| match manifest {
        Some(m) => format!("artifact {artifact} with manifest {m}"),
        None => format!("artifact {artifact} without a manifest"),
    };
    if existing.artifact_digest == req.artifact_digest
        && existing.manifest_digest == req.manifest_digest
    {
        return Ok(());
    }
    Err(CliError::Conflict(format!(
        "conflict (409): model {:?} already has version {:?}, registered with {}; this push has {}. \
         A version never changes: push under a new --version",
        existing.model,
        existing.version,
        describe(&existing.artifact_digest, existing.manifest_digest.as_ref()),
        describe(&req.artifact_digest, req.manifest_digest.as_ref()),
    )))
}

/// Sends one file unless the server holds it; true if it was sent.
async fn upload(client: &Client, f: &PushFile, quiet: bool) -> Result<bool, CliError> {
    if client.artifact_size(&f.digest).await? == Some(f.size) {
        return Ok(false);
    }
    let label = format!("uploading {}", f.role.replace('_', " "));
    let shown = bar(&label, Some(f.size), quiet);
    let progress = shown.clone();
    let sent = client
        .upload_file(&f.path, &f.digest, f.size, move |n| {
            progress.set_position(n)
        })
        .await;
    match sent {
        Ok(_) => {
            shown.finish_and_clear();
            Ok(true)
        }
        Err(e) => {
            shown.abandon();
            Err(e.into())
        }
    }
}

fn render(r: &PushReport) -> String {
    let v = &r.version;
    let head = match r.outcome {
        "already_registered" => format!(
            "{} {} is already registered with these files; nothing changed\n",
            v.model, v.version
        ),
        _ => format!("registered {} {}\n", v.model, v.version),
    };
    let pairs: Vec<(&str, String)> = r
        .files
        .iter()
        .map(|f| {
            let state = if f.uploaded {
                "uploaded"
            } else {
                "on the server"
            };
            (
                f.role,
                format!("{} {} {state}", short(Some(&f.digest)), size(f.size)),
            )
        })
        .collect();
    format!("{head}{}", fields(&pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(artifact: Digest, manifest: Option<Digest>) -> ModelVersionView {
        serde_json::from_value(serde_json::json!({
            "model": "digits", "version": "1.0.0", "artifact_digest": artifact,
            "artifact_size": 3, "format": "onnx", "manifest_digest": manifest,
            "created_at": "2026-01-02T03:04:05Z"
        }))
        .unwrap()
    }

    #[test]
    fn the_same_files_are_the_same_version_and_others_a_conflict_naming_it() {
        let (a, b, m) = (Digest::of(b"a"), Digest::of(b"b"), Digest::of(b"m"));
        let req = |artifact, manifest| CreateModelVersion {
            version: Some("1.0.0".into()),
            manifest_digest: manifest,
            ..CreateModelVersion::new(artifact)
        };
        assert!(same_content(&view(a, Some(m)), &req(a, Some(m))).is_ok());
        assert!(same_content(&view(a, None), &req(a, None)).is_ok());
        for (existing, pushed) in [
            (view(a, None), req(b, None)),
            (view(a, Some(m)), req(a, None)),
            (view(a, None), req(a, Some(m))),
        ] {
            let e = same_content(&existing, &pushed).unwrap_err();
            assert_eq!(e.exit_code(), ExitCode::from(75), "{e}");
            let text = e.to_string();
            assert!(text.contains("409") && text.contains("\"1.0.0\""), "{text}");
        }
    }
}
