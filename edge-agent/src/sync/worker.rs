//! Runs one assignment of one model to a definite state: drives the pure
//! [`Machine`] by performing its actions (download, install into the
//! inactive slot, activate, flip, report) and feeding back what happened.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use edgeloop_models::manifest::MAX_SIGNED_MANIFEST_BYTES;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;

use super::assignment::{Assignment, Content};
use super::blocking;
use super::download::{Downloader, Want};
use super::events::SyncEvent;
use super::failure::Failure;
use super::machine::{Action, Event, Installed, Machine, Phase, ReportState};
use super::report::{Report, Reporter};
use super::slots::{ModelDir, SlotId, SlotsState, Staged};
use super::verify::{prepare, Trust};
use crate::serving::{ModelServing, Serving};

/// The longest one activation (load, warm-up, probe) may take.
const ACTIVATION_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Probe inputs are a batch of samples, not a data set.
const MAX_PROBE_BYTES: u64 = 256 << 20;

/// What every worker shares.
pub struct Ctx {
    pub models_dir: PathBuf,
    pub trust: Trust,
    pub serving: Arc<dyn ModelServing>,
    pub downloader: Downloader,
    /// Bounds concurrent downloads (`download_concurrency`).
    pub downloads: Semaphore,
    pub reporter: Arc<Reporter>,
    pub events: broadcast::Sender<SyncEvent>,
    pub default_timeout: Duration,
    /// The generation of the set being applied, for reports.
    pub generation: AtomicU64,
}

/// `models/<name>/status.json`: how the last assignment of a model ended,
/// so that a restart re-reports a permanent failure instead of retrying it
/// on every start. Only endings a retry would repeat are kept (`Failed` for
/// a permanent reason, `RolledBack`); any other ending removes the file. A
/// file from an older agent that says `"retry"` does not decode, which reads
/// as no ending, as it did then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Outcome {
    content: Content,
    deployment_id: String,
    state: ReportState,
    reason: String,
}

const OUTCOME_FILE: &str = "status.json";

/// Where `content` already is, given the slots and what serves.
pub fn classify(state: &SlotsState, content: &Content, serving: Option<&Serving>) -> Installed {
    match state.find(content) {
        None => Installed::Nowhere,
        Some(slot) if state.active == Some(slot) => match serving {
            Some(s) if s.version == content.version => Installed::Serving(s.clone()),
            _ => Installed::ActiveSlot,
        },
        Some(slot) => {
            let served_before = state.get(slot).is_some_and(|r| r.served);
            if served_before && serving.is_some() {
                Installed::PreviousSlot
            } else {
                Installed::StagedSlot
            }
        }
    }
}

pub struct Worker {
    ctx: Arc<Ctx>,
    assignment: Assignment,
    dir: ModelDir,
}

impl Worker {
    pub fn new(ctx: Arc<Ctx>, assignment: Assignment) -> Worker {
        let dir = ModelDir::new(&ctx.models_dir, &assignment.model);
        Worker {
            ctx,
            assignment,
            dir,
        }
    }

    /// Runs to a terminal state, or until `cancel` (the assignment was
    /// replaced; whatever was downloaded stays for a resume).
    pub async fn run(self, cancel: CancellationToken) {
        let content = self.assignment.content();
        if let Some(previous) = self.finished_before(&content) {
            tracing::info!(model = %self.assignment.model, reason = %previous.reason, "assignment already ended; reporting it again");
            self.report(previous.state, previous.reason, String::new());
            return;
        }
        let mut slots = match self.load_slots() {
            Ok(s) => s,
            Err(f) => {
                self.report(ReportState::Failed, f.to_string(), String::new());
                return;
            }
        };
        self.clean_downloads().await;
        let serving = self.ctx.serving.serving(&self.assignment.model);
        let installed = classify(&slots, &content, serving.as_ref());
        let timeout = match self.assignment.timeout_seconds {
            0 => self.ctx.default_timeout,
            s => Duration::from_secs(s.into()),
        };
        let (mut machine, mut actions) = Machine::start(installed, timeout, Instant::now());
        let mut staged: Option<Staged> = None;
        loop {
            let mut event = None;
            for action in actions {
                match action {
                    Action::Report {
                        state,
                        reason,
                        provider,
                    } => self.report(state, reason, provider),
                    Action::Download => {
                        let deadline = tokio::time::Instant::from_std(machine.deadline());
                        tokio::select! {
                            r = self.download() => event = Some(match r {
                                Ok(s) => {
                                    staged = Some(s);
                                    Event::Downloaded
                                }
                                Err(f) => Event::Refused(f),
                            }),
                            _ = tokio::time::sleep_until(deadline) => event = Some(Event::Tick),
                            _ = cancel.cancelled() => return,
                        }
                    }
                    // The download future was dropped with the select above.
                    Action::StopDownload => {}
                    Action::Activate => {
                        event = Some(self.activate(&mut slots, staged.take()).await);
                    }
                }
            }
            if machine.phase.is_terminal() {
                self.record_outcome(&content, &machine.phase);
                return;
            }
            let Some(e) = event else {
                // Unreachable by the machine's table; never hang if it were.
                self.report(
                    ReportState::Failed,
                    "internal: no next step".into(),
                    String::new(),
                );
                return;
            };
            (machine, actions) = machine.step(e, Instant::now());
        }
    }

    fn load_slots(&self) -> Result<SlotsState, Failure> {
        match self.dir.load() {
            Ok(s) => Ok(s),
            // Unreadable state: start over rather than trust either slot.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                tracing::warn!(model = %self.assignment.model, error = %e, "slots.json unreadable; starting from empty slots");
                Ok(SlotsState::default())
            }
            Err(e) => Err(Failure::storage("reading slots.json", e)),
        }
    }

    fn report(&self, state: ReportState, reason: String, provider: String) {
        let a = &self.assignment;
        match state {
            ReportState::Failed | ReportState::RolledBack => {
                tracing::warn!(model = %a.model, version = %a.version, ?state, %reason, "assignment ended")
            }
            _ => {
                tracing::info!(model = %a.model, version = %a.version, ?state, %provider, "assignment status")
            }
        }
        let _ = self.ctx.events.send(SyncEvent::Status {
            model: a.model.clone(),
            version: a.version.clone(),
            state,
            reason: reason.clone(),
            provider: provider.clone(),
        });
        self.ctx.reporter.submit(Report {
            generation: self.ctx.generation.load(Ordering::SeqCst),
            model: a.model.clone(),
            version: a.version.clone(),
            state,
            reason,
            provider,
            serving_version: self
                .ctx
                .serving
                .serving(&a.model)
                .map(|s| s.version)
                .unwrap_or_default(),
            at: SystemTime::now(),
        });
    }

    fn finished_before(&self, content: &Content) -> Option<Outcome> {
        let bytes = std::fs::read(self.dir.root().join(OUTCOME_FILE)).ok()?;
        let o: Outcome = serde_json::from_slice(&bytes).ok()?;
        let ended = matches!(o.state, ReportState::Failed | ReportState::RolledBack);
        (ended && o.content == *content && o.deployment_id == self.assignment.deployment_id)
            .then_some(o)
    }

    /// Remembers an ending that a retry would only repeat.
    fn record_outcome(&self, content: &Content, phase: &Phase) {
        let path = self.dir.root().join(OUTCOME_FILE);
        let (state, reason) = match phase {
            Phase::Failed { reason } if reason.is_permanent() => {
                (ReportState::Failed, reason.to_string())
            }
            Phase::RolledBack { reason } => (ReportState::RolledBack, reason.clone()),
            _ => {
                // A retry may succeed: nothing to remember, and an older
                // ending must not stand in for this one.
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(error = %e, "clearing the assignment outcome"),
                }
                return;
            }
        };
        let outcome = Outcome {
            content: content.clone(),
            deployment_id: self.assignment.deployment_id.clone(),
            state,
            reason,
        };
        let written = serde_json::to_vec_pretty(&outcome)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                std::fs::create_dir_all(self.dir.root())?;
                edgeloop_models::fs::write_atomic(&path, &b, 0o600)
            });
        if let Err(e) = written {
            tracing::warn!(error = %e, "recording the assignment outcome");
        }
    }

    /// Drops downloads this assignment does not need (left by replaced ones).
    async fn clean_downloads(&self) {
        let a = &self.assignment;
        let keep: Vec<String> = [Some(a.artifact), a.manifest, a.probe_inputs]
            .into_iter()
            .flatten()
            .map(|d| d.to_hex())
            .collect();
        let Ok(mut entries) = tokio::fs::read_dir(self.dir.downloads_dir()).await else {
            return;
        };
        while let Ok(Some(e)) = entries.next_entry().await {
            let name = e.file_name().to_string_lossy().to_string();
            if !keep.iter().any(|k| name.starts_with(k.as_str())) {
                let _ = tokio::fs::remove_file(e.path()).await;
            }
        }
    }

    /// The manifest first (verified before the large download starts), then
    /// the artifact, then the probe inputs.
    async fn download(&self) -> Result<Staged, Failure> {
        let a = &self.assignment;
        self.ctx.trust.admit_unsigned(&a.content())?;
        let _permit = self
            .ctx
            .downloads
            .acquire()
            .await
            .map_err(|_| Failure::Storage("sync is shutting down".into()))?;
        let dir = self.dir.downloads_dir();
        let manifest = match a.manifest {
            None => None,
            Some(digest) => {
                let path = self
                    .ctx
                    .downloader
                    .fetch(
                        &dir,
                        Want {
                            what: "manifest",
                            digest,
                            size: None,
                            max_size: MAX_SIGNED_MANIFEST_BYTES as u64,
                        },
                    )
                    .await?;
                let bytes = tokio::fs::read(&path)
                    .await
                    .map_err(|e| Failure::storage("manifest", e))?;
                let manifest = self.ctx.trust.check_manifest(&bytes, &a.content())?;
                super::verify::check_identity(&manifest, &a.model, &a.version)?;
                // Refused before the large download, not after.
                let floor = self.load_slots()?.floor;
                super::verify::check_floor(Some(&manifest), &a.version, floor.as_deref())?;
                Some(path)
            }
        };
        let model = self
            .ctx
            .downloader
            .fetch(
                &dir,
                Want {
                    what: "artifact",
                    digest: a.artifact,
                    size: Some(a.artifact_size),
                    max_size: a.artifact_size,
                },
            )
            .await?;
        let probe = match a.probe_inputs {
            None => None,
            Some(digest) => Some(
                self.ctx
                    .downloader
                    .fetch(
                        &dir,
                        Want {
                            what: "probe inputs",
                            digest,
                            size: None,
                            max_size: MAX_PROBE_BYTES,
                        },
                    )
                    .await?,
            ),
        };
        Ok(Staged {
            model,
            manifest,
            probe,
        })
    }

    /// Installs freshly downloaded files into the inactive slot (or uses
    /// the slot that already holds the content), activates, and flips.
    async fn activate(&self, slots: &mut SlotsState, staged: Option<Staged>) -> Event {
        let content = self.assignment.content();
        let (slot, fresh) = match (staged, slots.find(&content)) {
            (Some(staged), _) => match self.install(slots, staged).await {
                Ok(slot) => (slot, true),
                Err(f) => return Event::Refused(f),
            },
            (None, Some(slot)) => (slot, false),
            (None, None) => {
                return Event::Refused(Failure::Storage(
                    "the version to activate is in no slot".into(),
                ))
            }
        };
        let (dir, model, trust) = (
            self.dir.slot_dir(slot),
            self.assignment.model.clone(),
            self.ctx.trust.clone(),
        );
        let c = content.clone();
        // Files from a download were verified as they arrived; files that
        // sat on disk are hashed again.
        let spec = blocking(move || Ok(prepare(&dir, &model, &c, &trust, !fresh))).await;
        let spec = match spec {
            // A version already in a slot skipped the download's check.
            Ok(Ok(spec)) => match super::verify::check_floor(
                spec.manifest.as_ref(),
                &spec.version,
                slots.floor.as_deref(),
            ) {
                Ok(()) => spec,
                Err(f) => return Event::Refused(f),
            },
            Ok(Err(f)) => {
                self.forget_broken(slots, slot);
                // Files that sat on disk may have been damaged since they
                // were verified; what the content itself gets wrong (its
                // signature, say) a new download would only repeat.
                if !fresh && !f.is_permanent() {
                    tracing::warn!(model = %self.assignment.model, ?slot, error = %f, "slot damaged; downloading again");
                    self.forget_slot(slots, slot);
                    return Event::SlotDamaged(f);
                }
                return Event::Refused(f);
            }
            Err(e) => return Event::Refused(Failure::storage("preparing activation", e)),
        };
        let next_floor = spec.manifest.as_ref().map_or(slots.floor.clone(), |m| {
            m.next_floor(slots.floor.as_deref())
        });
        // A load or probe that never returns must still end the assignment
        // (in a definite state, with the old version serving). Generous:
        // TensorRT builds its engine on the first load, which takes minutes.
        let activated =
            match tokio::time::timeout(ACTIVATION_LIMIT, self.ctx.serving.activate(spec)).await {
                Ok(r) => r,
                Err(_) => Err(crate::serving::ActivationError::Load(format!(
                    "did not finish within {ACTIVATION_LIMIT:?}"
                ))),
            };
        match activated {
            Ok(serving) => {
                let generation = self.ctx.generation.load(Ordering::SeqCst);
                // Recorded with the flip: once a version serves, its floor holds.
                slots.floor = next_floor;
                crate::crash_point::reached("slot_serving");
                if let Err(e) = self.dir.flip(slots, slot, generation) {
                    // It serves, but a reboot would boot the old slot.
                    tracing::error!(error = %e, "activated, but recording the active slot failed");
                }
                crate::crash_point::reached("slot_flipped");
                Event::Activated {
                    provider: serving.provider,
                }
            }
            Err(e) => {
                self.forget_broken(slots, slot);
                Event::ActivationFailed {
                    error: e.to_string(),
                    still_serving: self.ctx.serving.serving(&self.assignment.model),
                }
            }
        }
    }

    /// Drops a damaged slot's record, unless it is the active one (the
    /// next install goes to the other slot, and a flip replaces it).
    fn forget_slot(&self, slots: &mut SlotsState, slot: SlotId) {
        if slots.active != Some(slot) {
            slots.set(slot, None);
            if let Err(e) = self.dir.save(slots) {
                tracing::warn!(error = %e, "recording a damaged slot");
            }
        }
    }

    fn forget_broken(&self, slots: &mut SlotsState, slot: SlotId) {
        if let Err(e) = self.dir.mark_broken(slots, slot) {
            tracing::warn!(error = %e, "recording a broken slot");
        }
    }

    /// The install steps before activation: clear the inactive slot, move
    /// the files in, record them. Each is durable before the next starts.
    async fn install(&self, slots: &mut SlotsState, staged: Staged) -> Result<SlotId, Failure> {
        let target = slots.inactive();
        let (dir, mut state, content) =
            (self.dir.clone(), slots.clone(), self.assignment.content());
        let state = blocking(move || {
            dir.clear(&mut state, target)?;
            crate::crash_point::reached("slot_cleared");
            dir.place(target, &staged)?;
            crate::crash_point::reached("slot_placed");
            dir.record(&mut state, target, content)?;
            crate::crash_point::reached("slot_recorded");
            Ok(state)
        })
        .await
        .map_err(|e| Failure::storage("installing into a slot", e))?;
        *slots = state;
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::slots::SlotRecord;
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

    #[test]
    fn classify_table() {
        let serving = |v: &str| Serving {
            version: v.into(),
            provider: "CPUExecutionProvider".into(),
        };
        let state = SlotsState {
            active: Some(SlotId::B),
            a: Some(SlotRecord {
                content: content("1"),
                served: true,
            }),
            b: Some(SlotRecord {
                content: content("2"),
                served: true,
            }),
            generation: 3,
            floor: None,
        };
        let mut staged = state.clone();
        staged.a.as_mut().unwrap().served = false;
        let table = vec![
            (&state, "3", Some(serving("2")), Installed::Nowhere),
            (
                &state,
                "2",
                Some(serving("2")),
                Installed::Serving(serving("2")),
            ),
            (&state, "2", None, Installed::ActiveSlot),
            (&state, "2", Some(serving("1")), Installed::ActiveSlot),
            (&state, "1", Some(serving("2")), Installed::PreviousSlot),
            // Nothing serves (unassigned before): a plain activation.
            (&state, "1", None, Installed::StagedSlot),
            (&staged, "1", Some(serving("2")), Installed::StagedSlot),
        ];
        for (s, v, serving, want) in table {
            assert_eq!(
                classify(s, &content(v), serving.as_ref()),
                want,
                "{v} {serving:?}"
            );
        }
    }

    #[test]
    fn outcome_files_from_older_agents_decode() {
        let outcome = Outcome {
            content: content("1"),
            deployment_id: "dep".into(),
            state: ReportState::RolledBack,
            reason: "probe failed".into(),
        };
        let mut json = serde_json::to_value(&outcome).unwrap();
        // The older agent wrote these strings; the enum's form is the same.
        assert_eq!(json["state"], "rolled_back");
        for (old, state) in [
            ("failed", ReportState::Failed),
            ("rolled_back", ReportState::RolledBack),
        ] {
            json["state"] = old.into();
            let got: Outcome = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(got.state, state);
        }
        // "retry" was never an ending: it does not decode, which reads as
        // no recorded ending.
        json["state"] = "retry".into();
        assert!(serde_json::from_value::<Outcome>(json).is_err());
    }
}
