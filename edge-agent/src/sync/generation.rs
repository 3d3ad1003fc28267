//! Assignment generations: the control plane numbers every set, and an agent
//! never lets an older set override a newer one, not even across restarts
//! (the applied set is persisted before it is acted on).

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::assignment::Assignment;

/// What to do with an incoming set, given the generation already applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Newer than anything applied: persist it, then act on it.
    Apply,
    /// The set already applied (a reconnect, or the first set after a
    /// restart): finish whatever it still needs, nothing new to persist.
    Resume,
    /// Older than what is applied: a stale replay; ignore it.
    Ignore,
}

/// `applied` is `None` before the agent has applied any set.
pub fn decide(applied: Option<u64>, incoming: u64) -> Decision {
    match applied {
        None => Decision::Apply,
        Some(a) if incoming > a => Decision::Apply,
        Some(a) if incoming == a => Decision::Resume,
        Some(_) => Decision::Ignore,
    }
}

/// The last applied set, as persisted: what boots offline, and the
/// generation a reconnect announces.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppliedSet {
    pub generation: u64,
    pub assignments: Vec<Assignment>,
}

/// `<data>/models/assignments.json`.
#[derive(Debug, Clone)]
pub struct AppliedStore {
    path: PathBuf,
}

impl AppliedStore {
    pub fn new(models_dir: &Path) -> AppliedStore {
        AppliedStore {
            path: models_dir.join("assignments.json"),
        }
    }

    /// `None` when nothing was applied yet. A file that does not parse is an
    /// error: guessing a generation could let a stale set win.
    pub fn load(&self) -> io::Result<Option<AppliedSet>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, set: &AppliedSet) -> io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let bytes = serde_json::to_vec_pretty(set).map_err(io::Error::other)?;
        edgeloop_models::fs::write_atomic(&self.path, &bytes, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_table() {
        let table = [
            (None, 0, Decision::Apply),
            (None, 7, Decision::Apply),
            (Some(0), 0, Decision::Resume),
            (Some(3), 4, Decision::Apply),
            (Some(3), 3, Decision::Resume),
            (Some(3), 2, Decision::Ignore),
            (Some(3), 0, Decision::Ignore),
            (Some(u64::MAX), u64::MAX, Decision::Resume),
        ];
        for (applied, incoming, want) in table {
            assert_eq!(decide(applied, incoming), want, "{applied:?} {incoming}");
        }
    }

    #[test]
    fn applied_set_round_trips_and_a_torn_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = AppliedStore::new(&dir.path().join("models"));
        assert_eq!(store.load().unwrap(), None);
        let set = AppliedSet {
            generation: 9,
            assignments: vec![],
        };
        store.save(&set).unwrap();
        assert_eq!(store.load().unwrap(), Some(set));
        std::fs::write(dir.path().join("models/assignments.json"), b"{\"gen").unwrap();
        assert!(store.load().is_err());
    }
}
