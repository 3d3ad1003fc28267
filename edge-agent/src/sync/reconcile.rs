//! Applying assignment sets: the generation check, then one worker per
//! assigned model (a replaced assignment's worker is stopped first, so two
//! never touch one model's slots), and unassigned models are unloaded
//! (their files stay for a later rollback).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use edgeloop_proto::agent::v1 as pb;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::assignment::Assignment;
use super::events::SyncEvent;
use super::generation::{decide, AppliedSet, AppliedStore, Decision};
use super::machine::ReportState;
use super::report::Report;
use super::worker::{Ctx, Worker};

struct Running {
    assignment: Assignment,
    cancel: CancellationToken,
    handle: JoinHandle<()>,
}

pub struct Reconciler {
    ctx: Arc<Ctx>,
    store: AppliedStore,
    applied: Option<AppliedSet>,
    running: BTreeMap<String, Running>,
}

impl Reconciler {
    pub fn new(ctx: Arc<Ctx>, store: AppliedStore, applied: Option<AppliedSet>) -> Reconciler {
        if let Some(a) = &applied {
            ctx.generation.store(a.generation, Ordering::SeqCst);
        }
        Reconciler {
            ctx,
            store,
            applied,
            running: BTreeMap::new(),
        }
    }

    /// The generation to announce when (re)connecting; 0 before any.
    pub fn known_generation(&self) -> u64 {
        self.applied.as_ref().map_or(0, |a| a.generation)
    }

    /// Offers a set from the control plane; returns what was decided.
    pub async fn offer(&mut self, set: pb::AssignmentSet) -> std::io::Result<Decision> {
        let decision = decide(self.applied.as_ref().map(|a| a.generation), set.generation);
        let _ = self.ctx.events.send(SyncEvent::SetOffered {
            generation: set.generation,
            decision,
        });
        match decision {
            Decision::Ignore => {
                tracing::warn!(
                    incoming = set.generation,
                    applied = self.known_generation(),
                    "ignoring a stale assignment set"
                );
                return Ok(decision);
            }
            Decision::Resume => {
                tracing::debug!(generation = set.generation, "resuming assignment set")
            }
            Decision::Apply => {
                tracing::info!(generation = set.generation, "applying assignment set")
            }
        }
        let mut assignments: Vec<Assignment> = vec![];
        for wire in &set.assignments {
            match Assignment::from_proto(wire) {
                Ok(a) if assignments.iter().any(|b| b.model == a.model) => {
                    tracing::warn!(model = %a.model, "model assigned twice in one set; keeping the first");
                }
                Ok(a) => assignments.push(a),
                Err((Some(model), failure)) => self.ctx.reporter.submit(Report {
                    generation: set.generation,
                    model,
                    version: wire.model_version.clone(),
                    state: ReportState::Failed,
                    reason: failure.to_string(),
                    provider: String::new(),
                    serving_version: self
                        .ctx
                        .serving
                        .serving(&wire.model_name)
                        .map(|s| s.version)
                        .unwrap_or_default(),
                    at: SystemTime::now(),
                }),
                Err((None, failure)) => tracing::warn!(%failure, "skipping an assignment"),
            }
        }
        let next = AppliedSet {
            generation: set.generation,
            assignments,
        };
        // Persisted before acting, so a restart can never go back to an older set.
        if decision == Decision::Apply {
            self.store.save(&next)?;
        }
        let previous = self.applied.replace(next.clone());
        self.ctx.generation.store(next.generation, Ordering::SeqCst);
        self.apply(previous, &next).await;
        Ok(decision)
    }

    async fn apply(&mut self, previous: Option<AppliedSet>, next: &AppliedSet) {
        let assigned = |model: &str| next.assignments.iter().any(|a| a.model == model);
        let mut gone: Vec<String> = previous
            .iter()
            .flat_map(|p| p.assignments.iter().map(|a| a.model.clone()))
            .chain(self.running.keys().cloned())
            .filter(|m| !assigned(m))
            .collect();
        gone.sort();
        gone.dedup();
        for model in gone {
            self.stop(&model).await;
            tracing::info!(%model, "unassigned; unloading");
            self.ctx.serving.unload(&model);
        }
        for a in &next.assignments {
            // The same assignment is not run again, even when its worker has
            // ended (a download that timed out, say): a reconnecting watch
            // re-offers the same set, and running it again would replace the
            // definite state it ended in before that state was reported. A
            // new assignment (content or deployment id) or a restart retries.
            let unchanged = self
                .running
                .get(&a.model)
                .is_some_and(|r| r.assignment == *a);
            if unchanged {
                continue;
            }
            self.stop(&a.model).await;
            let cancel = CancellationToken::new();
            let worker = Worker::new(self.ctx.clone(), a.clone());
            let handle = tokio::spawn(worker.run(cancel.clone()));
            self.running.insert(
                a.model.clone(),
                Running {
                    assignment: a.clone(),
                    cancel,
                    handle,
                },
            );
        }
    }

    /// Stops a model's worker and waits for it, so the next one starts on
    /// settled files.
    async fn stop(&mut self, model: &str) {
        if let Some(r) = self.running.remove(model) {
            r.cancel.cancel();
            if let Err(e) = r.handle.await {
                tracing::warn!(%model, error = %e, "sync worker ended abnormally");
            }
        }
    }

    /// Stops every worker (shutdown).
    pub async fn stop_all(&mut self) {
        let models: Vec<String> = self.running.keys().cloned().collect();
        for m in models {
            self.stop(&m).await;
        }
    }
}
