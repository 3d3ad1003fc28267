//! The checkpoint contract, trainer side (docs/checkpoint-contract.md):
//! `step-<N>/` holds the files, and `manifest.json`, listing each file with
//! its sha256, is written last, so a checkpoint is committed exactly when
//! its manifest exists. Reading checks everything the bridge checks, and
//! hands back the very bytes it hashed, so what is loaded is what was
//! verified.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use edgeloop_models::fs::{sync_dir, write_atomic};
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};

pub const MANIFEST: &str = "manifest.json";
const FILE_MODE: u32 = 0o644;
/// The bridge refuses larger manifests; so does this reader.
const MAX_MANIFEST_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub step: u64,
    /// Seconds of training behind this checkpoint, over all attempts.
    pub wall_time: f64,
    pub metrics: BTreeMap<String, f64>,
    pub optimizer_state: bool,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub sha256: Digest,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {} is torn ({reason}); refusing to resume from it: resume from an earlier committed checkpoint, or start afresh with EDGELOOP_RESUME_FROM empty", dir.display())]
    Torn { dir: PathBuf, reason: String },
    #[error("writing checkpoint {}: {source}", dir.display())]
    Write {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint file name {0:?} is not a plain relative path")]
    BadName(String),
}

/// A verified checkpoint: its manifest and the bytes of every listed file.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Checkpoint {
    /// A listed file's bytes, or a torn-checkpoint error naming it.
    pub fn file(&self, name: &str) -> Result<&[u8], CheckpointError> {
        self.files
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| CheckpointError::Torn {
                dir: self.dir.clone(),
                reason: format!("the manifest does not list {name}"),
            })
    }
}

pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step}"))
}

fn plain_relative(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Commits `step-<step>/` under `root`: each file (temp + fsync + rename),
/// then the manifest the same way, then `root` is fsynced so the new
/// directory entry is durable. Nothing else under `root` is touched.
///
/// A `step-<step>/` left by an earlier attempt (one that died before its
/// manifest, or was resumed from an older checkpoint) is replaced whole:
/// its manifest goes first, so it never vouches for files while they are
/// removed, then the rest (stray temp files of a killed writer included).
pub fn write(
    root: &Path,
    step: u64,
    files: &[(&str, &[u8])],
    metrics: BTreeMap<String, f64>,
    wall_time: f64,
) -> Result<PathBuf, CheckpointError> {
    let dir = step_dir(root, step);
    let io = |source| CheckpointError::Write {
        dir: dir.clone(),
        source,
    };
    for (name, _) in files {
        if !plain_relative(name) || *name == MANIFEST {
            return Err(CheckpointError::BadName(name.to_string()));
        }
    }
    std::fs::create_dir_all(root).map_err(io)?;
    match std::fs::remove_file(dir.join(MANIFEST)) {
        Ok(()) => sync_dir(&dir).map_err(io)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    std::fs::create_dir_all(&dir).map_err(io)?;
    let mut entries = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        write_atomic(&dir.join(name), bytes, FILE_MODE).map_err(io)?;
        entries.push(FileEntry {
            path: name.to_string(),
            sha256: Digest::of(bytes),
        });
    }
    let manifest = Manifest {
        step,
        wall_time,
        metrics,
        optimizer_state: true,
        files: entries,
    };
    let mut json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    json.push(b'\n');
    write_atomic(&dir.join(MANIFEST), &json, FILE_MODE).map_err(io)?;
    sync_dir(root).map_err(io)?;
    Ok(dir)
}

/// Reads and verifies a committed checkpoint: named `step-<N>`, a manifest
/// that parses and says step N, plain relative file paths, and every file
/// hashing to its digest. Anything else is [`CheckpointError::Torn`].
pub fn read(dir: &Path) -> Result<Checkpoint, CheckpointError> {
    let torn = |reason: String| CheckpointError::Torn {
        dir: dir.to_path_buf(),
        reason,
    };
    let step: u64 = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| torn("the directory is not named step-<N>".into()))?;
    let path = dir.join(MANIFEST);
    let len = std::fs::metadata(&path)
        .map_err(|e| torn(format!("no readable {MANIFEST}: {e}")))?
        .len();
    if len > MAX_MANIFEST_BYTES {
        return Err(torn(format!("{MANIFEST} is larger than 4 MiB")));
    }
    let raw = std::fs::read(&path).map_err(|e| torn(format!("no readable {MANIFEST}: {e}")))?;
    let manifest: Manifest =
        serde_json::from_slice(&raw).map_err(|e| torn(format!("{MANIFEST}: {e}")))?;
    if manifest.step != step {
        return Err(torn(format!(
            "{MANIFEST} says step {}, the directory says {step}",
            manifest.step
        )));
    }
    if manifest.files.is_empty() {
        return Err(torn(format!("{MANIFEST} lists no files")));
    }
    let mut files = BTreeMap::new();
    for f in &manifest.files {
        if !plain_relative(&f.path) || f.path == MANIFEST {
            return Err(torn(format!(
                "file path {:?} is not a plain relative path",
                f.path
            )));
        }
        let bytes =
            std::fs::read(dir.join(&f.path)).map_err(|e| torn(format!("{}: {e}", f.path)))?;
        let actual = Digest::of(&bytes);
        if actual != f.sha256 {
            return Err(torn(format!(
                "{}: sha256 is {actual}, the manifest says {}",
                f.path, f.sha256
            )));
        }
        files.insert(f.path.clone(), bytes);
    }
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        manifest,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> BTreeMap<String, f64> {
        BTreeMap::from([("loss".to_string(), 0.25)])
    }

    #[test]
    fn write_then_read_round_trips() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("other.txt"), b"mine").unwrap();
        let dir = write(
            root.path(),
            7,
            &[("weights.safetensors", b"w"), ("state.json", b"{}")],
            metrics(),
            1.5,
        )
        .unwrap();
        assert_eq!(dir, root.path().join("step-7"));
        let c = read(&dir).unwrap();
        assert_eq!(c.manifest.step, 7);
        assert_eq!(c.manifest.wall_time, 1.5);
        assert_eq!(c.manifest.metrics, metrics());
        assert!(c.manifest.optimizer_state);
        assert_eq!(c.file("weights.safetensors").unwrap(), b"w");
        assert_eq!(c.file("state.json").unwrap(), b"{}");
        assert!(c.file("nope").is_err());
        // The manifest is the contract's JSON, digests in lowercase hex.
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(
            raw["files"][0]["sha256"].as_str().unwrap(),
            Digest::of(b"w").to_hex()
        );
        // Nothing else in the job's directory changed, and no temp files remain.
        assert_eq!(
            std::fs::read(root.path().join("other.txt")).unwrap(),
            b"mine"
        );
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["manifest.json", "state.json", "weights.safetensors"]
        );

        // Rewriting a step (a resumed attempt redoing it) replaces it whole,
        // a killed writer's temp file included.
        std::fs::write(dir.join(".weights.safetensors.tmp-1"), b"stray").unwrap();
        write(
            root.path(),
            7,
            &[("weights.safetensors", b"w2")],
            metrics(),
            2.0,
        )
        .unwrap();
        assert_eq!(
            read(&dir).unwrap().file("weights.safetensors").unwrap(),
            b"w2"
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    }

    #[test]
    fn torn_checkpoints_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = write(root.path(), 3, &[("a.bin", b"abc")], metrics(), 0.0).unwrap();

        // A file changed after the commit.
        std::fs::write(dir.join("a.bin"), b"abd").unwrap();
        let e = read(&dir).unwrap_err().to_string();
        assert!(e.contains("torn") && e.contains("a.bin: sha256"), "{e}");

        // A listed file missing.
        std::fs::remove_file(dir.join("a.bin")).unwrap();
        assert!(read(&dir).unwrap_err().to_string().contains("a.bin"));

        // No manifest: the writer died before the commit.
        std::fs::write(dir.join("a.bin"), b"abc").unwrap();
        read(&dir).unwrap();
        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        let e = read(&dir).unwrap_err().to_string();
        assert!(e.contains("no readable manifest.json"), "{e}");

        // A half-written manifest.
        std::fs::write(dir.join(MANIFEST), b"{\"step\": 3, \"fil").unwrap();
        assert!(read(&dir).unwrap_err().to_string().contains("torn"));

        // A manifest for another step, or escaping the directory.
        let other = write(root.path(), 4, &[("a.bin", b"abc")], metrics(), 0.0).unwrap();
        std::fs::copy(other.join(MANIFEST), dir.join(MANIFEST)).unwrap();
        assert!(read(&dir).unwrap_err().to_string().contains("says step 4"));
        let text = std::fs::read_to_string(other.join(MANIFEST))
            .unwrap()
            .replace("\"a.bin\"", "\"../step-3/a.bin\"");
        std::fs::write(other.join(MANIFEST), text).unwrap();
        assert!(read(&other)
            .unwrap_err()
            .to_string()
            .contains("not a plain relative path"));
        assert!(read(root.path())
            .unwrap_err()
            .to_string()
            .contains("step-<N>"));
    }

    #[test]
    fn file_names_must_be_plain() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["../x", "/abs", "", MANIFEST] {
            assert!(matches!(
                write(root.path(), 1, &[(bad, b"")], metrics(), 0.0),
                Err(CheckpointError::BadName(_))
            ));
        }
    }
}
