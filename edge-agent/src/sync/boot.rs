//! Boot: serve from disk before the network is up. For every model in the
//! last applied set, the active slot is verified (digest, signature, probe
//! inputs) and activated; if that fails, the other slot, if it served
//! before. A slot that fails is no fallback any more, and `active` follows
//! what actually serves, so the next install never overwrites it.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::blocking;
use super::events::SyncEvent;
use super::generation::AppliedSet;
use super::slots::{ModelDir, SlotId};
use super::verify::{prepare, Trust};
use crate::serving::{ModelServing, Serving};

/// How boot went for one model.
#[derive(Debug, Clone, PartialEq)]
pub struct BootOutcome {
    pub model: String,
    /// What serves, from which slot; `Err` says why nothing does.
    pub result: Result<(SlotId, Serving), String>,
}

pub async fn boot(
    models_dir: &std::path::Path,
    applied: &AppliedSet,
    trust: &Trust,
    serving: &Arc<dyn ModelServing>,
    events: &broadcast::Sender<SyncEvent>,
) -> Vec<BootOutcome> {
    let mut outcomes = vec![];
    for a in &applied.assignments {
        let dir = ModelDir::new(models_dir, &a.model);
        let result = boot_model(&dir, &a.model, trust, serving).await;
        match &result {
            Ok((slot, s)) => {
                tracing::info!(model = %a.model, version = %s.version, ?slot, provider = %s.provider, "serving from disk");
                let _ = events.send(SyncEvent::Booted {
                    model: a.model.clone(),
                    version: s.version.clone(),
                    slot: *slot,
                });
            }
            Err(reason) => {
                tracing::warn!(model = %a.model, %reason, "nothing to serve from disk");
                let _ = events.send(SyncEvent::BootFailed {
                    model: a.model.clone(),
                    reason: reason.clone(),
                });
            }
        }
        outcomes.push(BootOutcome {
            model: a.model.clone(),
            result,
        });
    }
    outcomes
}

async fn boot_model(
    dir: &ModelDir,
    model: &str,
    trust: &Trust,
    serving: &Arc<dyn ModelServing>,
) -> Result<(SlotId, Serving), String> {
    remove_stale_temp_files(dir);
    let mut state = dir.load().map_err(|e| format!("slots.json: {e}"))?;
    let mut problems = vec![];
    for slot in state.boot_order() {
        let Some(record) = state.get(slot).cloned() else {
            continue;
        };
        let (slot_dir, name, t) = (dir.slot_dir(slot), model.to_string(), trust.clone());
        let content = record.content.clone();
        let spec = blocking(move || Ok(prepare(&slot_dir, &name, &content, &t, true)))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|f| f.to_string()));
        let outcome = match spec {
            Ok(spec) => serving.activate(spec).await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(s) => {
                if state.active != Some(slot) {
                    // The active slot failed: the one that serves becomes active.
                    let (failed, generation) = (slot.other(), state.generation);
                    if let Err(e) = dir
                        .mark_broken(&mut state, failed)
                        .and_then(|()| dir.flip(&mut state, slot, generation))
                    {
                        tracing::warn!(error = %e, "recording the fallback slot");
                    }
                }
                return Ok((slot, s));
            }
            Err(e) => {
                tracing::warn!(model, ?slot, version = %record.content.version, error = %e, "slot not bootable");
                problems.push(format!("{slot:?}: {e}"));
            }
        }
    }
    if problems.is_empty() {
        return Err("no installed version".into());
    }
    Err(problems.join("; "))
}

/// `write_atomic` temp files of a process that died mid-write.
fn remove_stale_temp_files(dir: &ModelDir) {
    let Ok(entries) = std::fs::read_dir(dir.root()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') && name.contains(".tmp-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
