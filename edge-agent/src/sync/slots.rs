//! A/B slots on disk, per model:
//!
//! ```text
//! models/<name>/slots.json     which slot is active, what each holds
//! models/<name>/slot-a/        model.onnx, manifest.json, probe.npz
//! models/<name>/slot-b/
//! models/<name>/downloads/     partial downloads (see `download`)
//! ```
//!
//! A new version goes into the inactive slot in durable steps (each
//! `slots.json` write is atomic): forget the slot, move the verified files
//! in, record it, and only after the version serves, flip `active`. A crash
//! between any two steps leaves the active slot untouched, so boot always
//! finds a version that served before; boot verifies the files anyway.

use std::io;
use std::path::{Path, PathBuf};

use edgeloop_models::fs::{sync_dir, write_atomic};
use serde::{Deserialize, Serialize};

use super::assignment::Content;

pub const MODEL_FILE: &str = "model.onnx";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const PROBE_FILE: &str = "probe.npz";
const STATE_FILE: &str = "slots.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotId {
    A,
    B,
}

impl SlotId {
    pub fn other(self) -> SlotId {
        match self {
            SlotId::A => SlotId::B,
            SlotId::B => SlotId::A,
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            SlotId::A => "slot-a",
            SlotId::B => "slot-b",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    pub content: Content,
    /// The version served from this slot and was not found broken since:
    /// a slot worth rolling back to.
    pub served: bool,
}

/// `slots.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotsState {
    pub active: Option<SlotId>,
    pub a: Option<SlotRecord>,
    pub b: Option<SlotRecord>,
    /// The assignment generation that made `active` active.
    pub generation: u64,
    /// Anti-rollback: the lowest version this model may run here, from the
    /// signed manifests of versions that served (`Manifest::next_floor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<String>,
}

impl SlotsState {
    pub fn get(&self, id: SlotId) -> Option<&SlotRecord> {
        match id {
            SlotId::A => self.a.as_ref(),
            SlotId::B => self.b.as_ref(),
        }
    }

    pub fn set(&mut self, id: SlotId, record: Option<SlotRecord>) {
        match id {
            SlotId::A => self.a = record,
            SlotId::B => self.b = record,
        }
    }

    /// Where the next version goes: never the active slot.
    pub fn inactive(&self) -> SlotId {
        self.active.map_or(SlotId::A, SlotId::other)
    }

    /// The slot holding `content`, the active one first.
    pub fn find(&self, content: &Content) -> Option<SlotId> {
        let active = self.active.unwrap_or(SlotId::A);
        [active, active.other()]
            .into_iter()
            .find(|id| self.get(*id).is_some_and(|r| r.content == *content))
    }

    /// The slots to try at boot, in order: the active one, then the other
    /// if it ever served (a slot that never served is no fallback).
    pub fn boot_order(&self) -> Vec<SlotId> {
        let Some(active) = self.active else {
            return vec![];
        };
        let mut order = vec![];
        if self.get(active).is_some() {
            order.push(active);
        }
        if self.get(active.other()).is_some_and(|r| r.served) {
            order.push(active.other());
        }
        order
    }
}

/// The files of a verified download, ready to move into a slot.
#[derive(Debug, Clone)]
pub struct Staged {
    pub model: PathBuf,
    pub manifest: Option<PathBuf>,
    pub probe: Option<PathBuf>,
}

/// One model's directory.
#[derive(Debug, Clone)]
pub struct ModelDir {
    root: PathBuf,
}

impl ModelDir {
    pub fn new(models_dir: &Path, model: &str) -> ModelDir {
        ModelDir {
            root: models_dir.join(model),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn slot_dir(&self, id: SlotId) -> PathBuf {
        self.root.join(id.dir_name())
    }

    pub fn downloads_dir(&self) -> PathBuf {
        self.root.join("downloads")
    }

    pub fn state_path(&self) -> PathBuf {
        self.root.join(STATE_FILE)
    }

    /// The saved state; none yet is the empty state. A file that does not
    /// parse is an error (the caller decides how to recover).
    pub fn load(&self) -> io::Result<SlotsState> {
        match std::fs::read(self.state_path()) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(SlotsState::default()),
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, state: &SlotsState) -> io::Result<()> {
        std::fs::create_dir_all(&self.root)?;
        let bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
        write_atomic(&self.state_path(), &bytes, 0o600)
    }

    /// Install step 1: forget what `id` holds (durably, before its files
    /// go), then empty it.
    pub fn clear(&self, state: &mut SlotsState, id: SlotId) -> io::Result<()> {
        debug_assert_ne!(state.active, Some(id), "never clear the active slot");
        if state.get(id).is_some() {
            state.set(id, None);
            self.save(state)?;
        }
        let dir = self.slot_dir(id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&dir)?;
        sync_dir(&self.root)
    }

    /// Install step 2: move the verified files into `id` (renames within
    /// the model directory: no copy, no second hash needed).
    pub fn place(&self, id: SlotId, staged: &Staged) -> io::Result<()> {
        let dir = self.slot_dir(id);
        std::fs::rename(&staged.model, dir.join(MODEL_FILE))?;
        if let Some(m) = &staged.manifest {
            std::fs::rename(m, dir.join(MANIFEST_FILE))?;
        }
        if let Some(p) = &staged.probe {
            std::fs::rename(p, dir.join(PROBE_FILE))?;
        }
        sync_dir(&dir)?;
        sync_dir(&self.downloads_dir())
    }

    /// Install step 3: record what `id` now holds.
    pub fn record(&self, state: &mut SlotsState, id: SlotId, content: Content) -> io::Result<()> {
        state.set(
            id,
            Some(SlotRecord {
                content,
                served: false,
            }),
        );
        self.save(state)
    }

    /// Step 4, after the version in `id` serves: make it the active slot.
    pub fn flip(&self, state: &mut SlotsState, id: SlotId, generation: u64) -> io::Result<()> {
        state.active = Some(id);
        state.generation = generation;
        if let Some(SlotRecord { content, .. }) = state.get(id).cloned() {
            state.set(
                id,
                Some(SlotRecord {
                    content,
                    served: true,
                }),
            );
        }
        self.save(state)
    }

    /// After a slot failed to verify or activate: it is no fallback any more.
    pub fn mark_broken(&self, state: &mut SlotsState, id: SlotId) -> io::Result<()> {
        match state.get(id).cloned() {
            Some(r) if r.served => {
                state.set(id, Some(SlotRecord { served: false, ..r }));
                self.save(state)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeloop_models::Digest;

    fn content(v: &str) -> Content {
        Content {
            version: v.into(),
            artifact: Digest::of(v.as_bytes()),
            artifact_size: 1,
            manifest: None,
            probe_inputs: None,
        }
    }

    fn rec(v: &str, served: bool) -> Option<SlotRecord> {
        Some(SlotRecord {
            content: content(v),
            served,
        })
    }

    #[test]
    fn boot_order_table() {
        let s = |active, a, b| SlotsState {
            active,
            a,
            b,
            generation: 1,
            floor: None,
        };
        use SlotId::*;
        let table = vec![
            (s(None, rec("1", true), None), vec![]),
            (s(Some(A), rec("1", true), None), vec![A]),
            (s(Some(A), rec("1", true), rec("2", true)), vec![A, B]),
            // A staged version that never served is not a fallback.
            (s(Some(A), rec("1", true), rec("2", false)), vec![A]),
            (s(Some(B), rec("1", true), rec("2", true)), vec![B, A]),
            // The active record was lost: only the served other one.
            (s(Some(B), rec("1", true), None), vec![A]),
            (s(Some(B), rec("1", false), None), vec![]),
        ];
        for (state, want) in table {
            assert_eq!(state.boot_order(), want, "{state:?}");
        }
    }

    #[test]
    fn inactive_and_find() {
        let mut s = SlotsState::default();
        assert_eq!(s.inactive(), SlotId::A);
        s.active = Some(SlotId::A);
        s.a = rec("1", true);
        s.b = rec("2", false);
        assert_eq!(s.inactive(), SlotId::B);
        assert_eq!(s.find(&content("1")), Some(SlotId::A));
        assert_eq!(s.find(&content("2")), Some(SlotId::B));
        assert_eq!(s.find(&content("3")), None);
    }
}
