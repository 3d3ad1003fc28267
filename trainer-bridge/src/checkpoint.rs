//! The checkpoint contract, bridge side. A trainer writes checkpoints into
//! `$EDGELOOP_CHECKPOINT_DIR/step-<N>/`, and writes `manifest.json` last:
//!
//! ```json
//! {"step": 1200, "wall_time": 93.5, "metrics": {"loss": 0.12},
//!  "optimizer_state": true,
//!  "files": [{"path": "weights.safetensors", "sha256": "<64 hex>"}]}
//! ```
//!
//! A directory without a manifest, with a manifest that does not parse, or
//! whose files do not hash to the manifest's digests is torn (the trainer
//! died mid-write) and is never resumed from or uploaded.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use edgeloop_models::{Digest, Sha256Writer};
use serde::Deserialize;

pub const MANIFEST: &str = "manifest.json";

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CheckpointManifest {
    pub step: u64,
    #[serde(default)]
    pub wall_time: f64,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub optimizer_state: bool,
    pub files: Vec<CheckpointFile>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CheckpointFile {
    pub path: String,
    pub sha256: Digest,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    pub step: u64,
    pub dir: PathBuf,
    pub manifest: CheckpointManifest,
}

pub(crate) fn hash_file(path: &Path) -> std::io::Result<Digest> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256Writer::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.update(&buf[..n]);
    }
}

fn plain_relative(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Why a checkpoint directory is not committed, or its manifest.
pub fn verify(dir: &Path) -> Result<CheckpointManifest, String> {
    let step: u64 = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| "not named step-<N>".to_string())?;
    let raw =
        std::fs::read(dir.join(MANIFEST)).map_err(|e| format!("no readable {MANIFEST}: {e}"))?;
    if raw.len() > 4 << 20 {
        return Err(format!("{MANIFEST} is larger than 4 MiB"));
    }
    let m: CheckpointManifest =
        serde_json::from_slice(&raw).map_err(|e| format!("{MANIFEST}: {e}"))?;
    if m.step != step {
        return Err(format!(
            "{MANIFEST} says step {}, the directory says {step}",
            m.step
        ));
    }
    if m.files.is_empty() {
        return Err("lists no files".into());
    }
    for f in &m.files {
        if !plain_relative(&f.path) || f.path == MANIFEST {
            return Err(format!(
                "file path {:?} is not a plain relative path",
                f.path
            ));
        }
        let actual = hash_file(&dir.join(&f.path)).map_err(|e| format!("{}: {e}", f.path))?;
        if actual != f.sha256 {
            return Err(format!(
                "{}: sha256 is {actual}, the manifest says {}",
                f.path, f.sha256
            ));
        }
    }
    Ok(m)
}

/// Every committed checkpoint under `root`, by step. Torn ones are skipped
/// (and logged), never returned.
pub fn scan(root: &Path) -> Vec<Committed> {
    Scanner::default().scan(root)
}

/// [`scan`] for a directory watched while a job runs: a checkpoint is
/// hashed once, when it first shows up committed, not on every poll
/// (checkpoints can be gigabytes). Committed checkpoints are immutable by
/// the contract, so what was verified stays verified while it exists.
#[derive(Debug, Default)]
pub struct Scanner {
    verified: BTreeMap<PathBuf, Committed>,
}

impl Scanner {
    pub fn scan(&mut self, root: &Path) -> Vec<Committed> {
        let Ok(entries) = std::fs::read_dir(root) else {
            self.verified.clear();
            return vec![];
        };
        let dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        // Forget what was pruned or removed.
        self.verified.retain(|dir, _| dirs.contains(dir));
        for dir in dirs {
            if self.verified.contains_key(&dir) {
                continue;
            }
            match verify(&dir) {
                Ok(manifest) => {
                    let c = Committed {
                        step: manifest.step,
                        dir: dir.clone(),
                        manifest,
                    };
                    self.verified.insert(dir, c);
                }
                Err(reason) => {
                    tracing::debug!(dir = %dir.display(), %reason, "not a committed checkpoint")
                }
            }
        }
        let mut out: Vec<Committed> = self.verified.values().cloned().collect();
        out.sort_by_key(|c| c.step);
        out
    }
}

/// Packs a committed checkpoint into one deterministic zip (stored, fixed
/// timestamps, sorted paths), so the same checkpoint always has the same
/// digest and an interrupted upload can simply be sent again.
pub fn pack(c: &Committed) -> std::io::Result<Vec<u8>> {
    let mut paths: Vec<&str> = c.manifest.files.iter().map(|f| f.path.as_str()).collect();
    paths.push(MANIFEST);
    paths.sort_unstable();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default())
        .large_file(true)
        .unix_permissions(0o644);
    for p in paths {
        zip.start_file(p, options).map_err(std::io::Error::other)?;
        let mut f = std::fs::File::open(c.dir.join(p))?;
        std::io::copy(&mut f, &mut zip)?;
    }
    let cursor = zip.finish().map_err(std::io::Error::other)?;
    let mut bytes = cursor.into_inner();
    bytes.flush()?;
    Ok(bytes)
}

/// Unpacks a checkpoint zip made by [`pack`] (downloaded from the control
/// plane) into `root/step-<step>/`, by way of `scratch`, so that a
/// half-written directory never carries the committed name. The zip is
/// untrusted input: entries must be plain relative files, and the result must
/// verify as a committed checkpoint of that step before it is moved in.
pub fn unpack(
    zip_path: &Path,
    root: &Path,
    scratch: &Path,
    step: u64,
) -> Result<Committed, String> {
    let name = format!("step-{step}");
    let staging = scratch.join(&name);
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .map_err(|e| format!("clearing {}: {e}", staging.display()))?;
    }
    std::fs::create_dir_all(&staging)
        .map_err(|e| format!("creating {}: {e}", staging.display()))?;
    let file = std::fs::File::open(zip_path).map_err(|e| format!("{}: {e}", zip_path.display()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("not a checkpoint zip: {e}"))?;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| format!("zip entry {i}: {e}"))?;
        let rel = entry
            .enclosed_name()
            .filter(|p| p.to_str().is_some_and(plain_relative))
            .ok_or_else(|| format!("zip entry {:?} is not a plain relative path", entry.name()))?;
        if entry.is_dir() {
            continue;
        }
        let dest = staging.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let mut out =
            std::fs::File::create(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        std::io::copy(&mut entry, &mut out).map_err(|e| format!("{}: {e}", dest.display()))?;
        out.sync_all()
            .map_err(|e| format!("{}: {e}", dest.display()))?;
    }
    let manifest =
        verify(&staging).map_err(|e| format!("the downloaded checkpoint is torn: {e}"))?;
    let target = root.join(&name);
    if target.exists() {
        std::fs::remove_dir_all(&target)
            .map_err(|e| format!("clearing {}: {e}", target.display()))?;
    }
    std::fs::create_dir_all(root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    std::fs::rename(&staging, &target)
        .map_err(|e| format!("moving into {}: {e}", target.display()))?;
    if let Ok(d) = std::fs::File::open(root) {
        let _ = d.sync_all();
    }
    Ok(Committed {
        step,
        dir: target,
        manifest,
    })
}

/// Deletes committed checkpoints older than the newest `keep`, and torn
/// directories older than the newest committed one.
pub fn prune(root: &Path, keep: usize) -> std::io::Result<()> {
    prune_committed(root, &scan(root), keep)
}

/// The checkpoints of `committed` (in step order, as [`scan`] returns
/// them) at or below `step`: what is safe to prune once `step` is uploaded.
pub fn up_to(committed: &[Committed], step: u64) -> &[Committed] {
    let n = committed.iter().take_while(|c| c.step <= step).count();
    &committed[..n]
}

/// [`prune`], given what a scan of `root` just found.
pub fn prune_committed(root: &Path, committed: &[Committed], keep: usize) -> std::io::Result<()> {
    let newest = committed.last().map(|c| c.step);
    let keep_from = committed.len().saturating_sub(keep.max(1));
    let kept: std::collections::HashSet<PathBuf> = committed[keep_from..]
        .iter()
        .map(|c| c.dir.clone())
        .collect();
    for entry in std::fs::read_dir(root)?.filter_map(|e| e.ok()) {
        let p = entry.path();
        let step = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<u64>().ok());
        let (Some(step), Some(newest)) = (step, newest) else {
            continue;
        };
        if !kept.contains(&p) && step <= newest {
            std::fs::remove_dir_all(&p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_ckpt(root: &Path, step: u64, payload: &[u8], with_manifest: bool, lie: bool) {
        let dir = root.join(format!("step-{step}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("weights.bin"), payload).unwrap();
        if with_manifest {
            let digest = if lie {
                Digest::of(b"something else")
            } else {
                Digest::of(payload)
            };
            let m = serde_json::json!({"step": step, "wall_time": 1.5, "metrics": {"loss": 0.5}, "optimizer_state": true,
                "files": [{"path": "weights.bin", "sha256": digest.to_string()}]});
            std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        }
    }

    #[test]
    fn only_committed_checkpoints_count_and_packing_is_deterministic() {
        let root = tempfile::tempdir().unwrap();
        write_ckpt(root.path(), 100, b"w100", true, false);
        write_ckpt(root.path(), 200, b"w200", true, false);
        write_ckpt(root.path(), 300, b"w300", false, false); // torn: no manifest
        write_ckpt(root.path(), 400, b"w400", true, true); // torn: digest mismatch
        std::fs::create_dir_all(root.path().join("step-x")).unwrap();
        let found = scan(root.path());
        assert_eq!(
            found.iter().map(|c| c.step).collect::<Vec<_>>(),
            vec![100, 200]
        );
        assert!(found[1].manifest.optimizer_state);
        assert_eq!(pack(&found[1]).unwrap(), pack(&found[1]).unwrap());
        assert!(verify(&root.path().join("step-400"))
            .unwrap_err()
            .contains("sha256"));

        prune(root.path(), 1).unwrap();
        let left: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            left.contains(&"step-200".to_string()) && !left.contains(&"step-100".to_string()),
            "{left:?}"
        );
        assert!(
            left.contains(&"step-300".to_string()),
            "newer torn dirs may still be in progress: {left:?}"
        );
    }

    /// Pruning after an upload keeps every checkpoint not yet uploaded
    /// (a failed upload is retried, so it must still be there).
    #[test]
    fn only_uploaded_checkpoints_are_pruned() {
        let root = tempfile::tempdir().unwrap();
        for step in [5, 10, 15, 20] {
            write_ckpt(
                root.path(),
                step,
                format!("w{step}").as_bytes(),
                true,
                false,
            );
        }
        let found = scan(root.path());
        let steps = |cs: &[Committed]| cs.iter().map(|c| c.step).collect::<Vec<_>>();
        assert_eq!(steps(up_to(&found, 0)), Vec::<u64>::new());
        assert_eq!(steps(up_to(&found, 12)), vec![5, 10]);
        assert_eq!(steps(up_to(&found, 25)), vec![5, 10, 15, 20]);
        // 10 uploaded, 15 failed, 20 waits: only 5 may go with keep_last 1.
        prune_committed(root.path(), up_to(&found, 10), 1).unwrap();
        assert_eq!(steps(&scan(root.path())), vec![10, 15, 20]);
    }

    #[test]
    fn a_packed_checkpoint_unpacks_to_the_same_committed_checkpoint() {
        let src = tempfile::tempdir().unwrap();
        write_ckpt(src.path(), 7, b"weights", true, false);
        let committed = scan(src.path()).pop().unwrap();
        let zip_path = src.path().join("c.zip");
        std::fs::write(&zip_path, pack(&committed).unwrap()).unwrap();

        let dst = tempfile::tempdir().unwrap();
        let root = dst.path().join("checkpoints");
        let got = unpack(&zip_path, &root, &dst.path().join("scratch"), 7).unwrap();
        assert_eq!(got.step, 7);
        assert_eq!(got.manifest, committed.manifest);
        assert_eq!(scan(&root).len(), 1);
        // Packing it again gives the same bytes, so the digest matches the upload's.
        assert_eq!(pack(&got).unwrap(), pack(&committed).unwrap());

        // A zip whose step disagrees with the manifest is refused, and nothing lands.
        let other = dst.path().join("other");
        let err = unpack(&zip_path, &other, &dst.path().join("scratch"), 8).unwrap_err();
        assert!(err.contains("torn"), "{err}");
        assert!(scan(&other).is_empty());
        // So is something that is not a zip.
        std::fs::write(&zip_path, b"not a zip").unwrap();
        assert!(unpack(&zip_path, &other, &dst.path().join("scratch"), 7).is_err());
    }

    #[test]
    fn escaping_paths_are_torn() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("step-1");
        std::fs::create_dir_all(&dir).unwrap();
        let m = serde_json::json!({"step": 1, "files": [{"path": "../secret", "sha256": Digest::of(b"").to_string()}]});
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        assert!(verify(&dir).unwrap_err().contains("plain relative"));
    }
}
