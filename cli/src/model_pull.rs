//! `edgeloop model pull NAME VERSION|ALIAS [-o DIR]`: a version's files back
//! from the registry: the artifact (`model.onnx`), its signed manifest
//! (`model.onnx.manifest.json`, as `model quantize` names it) and the
//! manifest's probe inputs (`probe_inputs.npz`), so that `model push` and
//! `model verify` take them as they are.
//!
//! Each file is streamed into a temp file beside its final name, checked
//! against its digest as it arrives, fsynced, and only then renamed into
//! place: a broken or tampered download leaves no file under the final
//! name. A file already there with the right digest is not fetched again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use edgeloop_api::aliases::{AliasName, AliasView};
use edgeloop_api::registry::ModelVersionView;
use edgeloop_models::Digest;
use serde::Serialize;

use super::api::{block_on, client, segment, CliError, Client, Reply, ServerArgs};
use super::model_api::{short, size};
use super::model_push::get_optional;
use super::table::fields;
use super::transfer::{bar, hash_file, unreadable};

#[derive(Debug, Args)]
pub struct PullArgs {
    /// The registered model.
    pub name: String,
    /// A version, or an alias of the model (`production`); a version of
    /// that name wins, though the registry never lets the two share one.
    pub version: String,
    /// Where to put the files (created if missing; default
    /// `./<name>-<version>`, or `./<name>-<version>-<variant>`).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// One of the version's variants (`fp16-gpu`) instead of its own
    /// artifact: that variant's artifact, signed manifest and probe inputs,
    /// under the same file names.
    #[arg(long)]
    pub variant: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// A file pulled (or found in place).
#[derive(Debug, Clone, Serialize)]
pub struct PulledFile {
    pub role: &'static str,
    pub path: PathBuf,
    pub digest: Digest,
    pub size: u64,
    /// False when the file was there already with this digest.
    pub downloaded: bool,
}

/// `--json`: what was pulled, from which version.
#[derive(Debug, Serialize)]
pub struct PullReport {
    pub model: String,
    pub version: String,
    /// The alias that named the version, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<AliasName>,
    /// The variant pulled instead of the version's own artifact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub dir: PathBuf,
    pub files: Vec<PulledFile>,
}

pub fn pull(args: &PullArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(&args.server)?;
        let (version, alias) = resolve(&client, &args.name, &args.version).await?;
        // Which artifact: the version's own, or a named variant's (found
        // before anything is written).
        let (artifact_digest, manifest_digest, probe_digest) = match &args.variant {
            None => (
                version.artifact_digest,
                version.manifest_digest,
                version.probe_inputs_digest,
            ),
            Some(name) => {
                let v = version
                    .variants
                    .iter()
                    .find(|v| &v.name == name)
                    .ok_or_else(|| {
                        let known: Vec<&str> =
                            version.variants.iter().map(|v| v.name.as_str()).collect();
                        CliError::NotFound(format!(
                            "version {} of {:?} has no variant {name:?} (it has: {})",
                            version.version,
                            version.model,
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ))
                    })?;
                (
                    v.artifact_digest,
                    Some(v.manifest_digest),
                    v.probe_inputs_digest.or(version.probe_inputs_digest),
                )
            }
        };
        let dir = args.out.clone().unwrap_or_else(|| {
            let mut name = format!("{}-{}", version.model, version.version);
            if let Some(v) = &args.variant {
                name.push('-');
                name.push_str(v);
            }
            PathBuf::from(name)
        });
        std::fs::create_dir_all(&dir).map_err(|e| unreadable(&dir, e))?;
        let artifact = format!("model.{}", version.format);
        let mut wanted = vec![("artifact", artifact_digest, artifact.clone())];
        if let Some(m) = manifest_digest {
            wanted.push(("manifest", m, format!("{artifact}.manifest.json")));
        }
        if let Some(p) = probe_digest {
            wanted.push(("probe_inputs", p, "probe_inputs.npz".to_string()));
        }
        let mut files = Vec::new();
        for (role, digest, name) in wanted {
            files.push(fetch(&client, role, digest, &dir.join(name), args.server.json).await?);
        }
        let report = PullReport {
            model: version.model,
            version: version.version,
            alias,
            variant: args.variant.clone(),
            dir,
            files,
        };
        Reply::typed(&report, args.server.json, render)
    })
}

/// The version `reference` names: the version of that name, else the one
/// the alias of that name points at.
async fn resolve(
    client: &Client,
    model: &str,
    reference: &str,
) -> Result<(ModelVersionView, Option<AliasName>), CliError> {
    let model = segment("model name", model)?;
    let reference = segment("version or alias", reference)?;
    let by_version = format!("/api/v1/models/{model}/versions/{reference}");
    if let Some(v) = get_optional::<ModelVersionView>(client, &by_version).await? {
        return Ok((v, None));
    }
    let not_found = || {
        CliError::NotFound(format!(
            "model {model:?} has no version or alias {reference:?}"
        ))
    };
    let Ok(alias) = AliasName::new(reference) else {
        return Err(not_found());
    };
    let Some(a) =
        get_optional::<AliasView>(client, &format!("/api/v1/models/{model}/aliases/{alias}"))
            .await?
    else {
        return Err(not_found());
    };
    let v: ModelVersionView = client
        .get(&format!("/api/v1/models/{model}/versions/{}", a.version))
        .await?;
    Ok((v, Some(alias)))
}

/// `dir/.name.part-<pid>`: beside the final name, so the rename is atomic.
fn temp_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.part-{}", std::process::id()))
}

async fn fetch(
    client: &Client,
    role: &'static str,
    digest: Digest,
    dest: &Path,
    quiet: bool,
) -> Result<PulledFile, CliError> {
    if dest.is_file() {
        let (have, size) = hash_file(dest, "checking", quiet)?;
        if have == digest {
            return Ok(PulledFile {
                role,
                path: dest.to_path_buf(),
                digest,
                size,
                downloaded: false,
            });
        }
    }
    let tmp = temp_path(dest);
    let result = download(client, role, digest, dest, &tmp, quiet).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let size = result?;
    Ok(PulledFile {
        role,
        path: dest.to_path_buf(),
        digest,
        size,
        downloaded: true,
    })
}

/// Into `tmp`, checked, synced, then renamed to `dest`.
async fn download(
    client: &Client,
    role: &str,
    digest: Digest,
    dest: &Path,
    tmp: &Path,
    quiet: bool,
) -> Result<u64, CliError> {
    let io = |p: &Path, e: std::io::Error| CliError::Io(format!("{}: {e}", p.display()));
    let total = client.artifact_size(&digest).await?.ok_or_else(|| {
        CliError::NotFound(format!("the server has no artifact {digest} (the {role})"))
    })?;
    let mut file = tokio::fs::File::create(tmp).await.map_err(|e| io(tmp, e))?;
    let shown = bar(
        &format!("pulling {}", role.replace('_', " ")),
        Some(total),
        quiet,
    );
    let got = client
        .download_to(&digest, &mut file, tmp, |n, _| shown.set_position(n))
        .await;
    let size = match got {
        Ok(size) => {
            shown.finish_and_clear();
            size
        }
        Err(e) => {
            shown.abandon();
            return Err(e.into());
        }
    };
    file.sync_all().await.map_err(|e| io(tmp, e))?;
    drop(file);
    tokio::fs::rename(tmp, dest)
        .await
        .map_err(|e| io(dest, e))?;
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    edgeloop_models::fs::sync_dir(dir).map_err(|e| io(dir, e))?;
    Ok(size)
}

fn render(r: &PullReport) -> String {
    let mut named = match &r.alias {
        Some(a) => format!(" ({a})"),
        None => String::new(),
    };
    if let Some(v) = &r.variant {
        named.push_str(&format!(", variant {v}"));
    }
    let head = format!(
        "pulled {} {}{named} into {}\n",
        r.model,
        r.version,
        r.dir.display()
    );
    let pairs: Vec<(&str, String)> = r
        .files
        .iter()
        .map(|f| {
            let state = if f.downloaded {
                "downloaded"
            } else {
                "already there"
            };
            (
                f.role,
                format!(
                    "{} {} {} {state}",
                    f.path.display(),
                    short(Some(&f.digest)),
                    size(f.size)
                ),
            )
        })
        .collect();
    format!("{head}{}", fields(&pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_files_sit_beside_their_final_name_and_are_hidden() {
        let t = temp_path(Path::new("out/model.onnx"));
        assert_eq!(t.parent(), Some(Path::new("out")));
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".model.onnx.part-"), "{name}");
    }
}
