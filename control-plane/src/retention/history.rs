//! Ended retraining pipelines, deployments (with their event logs) and
//! device benchmarks: history that would otherwise grow forever, dropped
//! `--retention-history-days` after it ended, except what the control
//! plane still reads:
//! - a model's newest pipeline: the trigger scheduler's cooldown and "new
//!   labels since the last retrain" count from it, and without it a model
//!   would look never retrained;
//! - a model's newest succeeded deployment: its target is the serving
//!   version (`steps::serving_version`), which the comparison step, the
//!   drift analysis and the triggers read; and a model's newest deployment
//!   of any state, so a rollout's outcome stays in sight;
//! - whatever an unfinished pipeline names: the deployment its deploy step
//!   made (by id in its output, or by its `<pipeline>-deploy-<attempt>`
//!   seed) and the benchmarks its quantize step asked for (`origin`).
//!
//! Assignments carry their deployment's `seq`, not the record, so a
//! dropped deployment changes no device. Each decision is a pure function
//! of the records and `now`; the pass around them reads, decides, deletes.

use std::collections::{BTreeMap, BTreeSet};

use edgeloop_api::deployments::RolloutState;
use time::{Duration, OffsetDateTime};

use crate::db::Db;
use crate::fleet::benchmarks::BenchmarkRecord;
use crate::fleet::deployments::DeploymentRecord;
use crate::lifecycle::pipeline::{Output, Pipeline};
use edgeloop_errors::Result;

/// When a pipeline ended: its last step's end (an ended pipeline's last
/// step has one), else that step's start. None while it runs. Pure.
pub fn pipeline_ended_at(p: &Pipeline) -> Option<OffsetDateTime> {
    if !p.state.is_terminal() {
        return None;
    }
    let last = p.history.last()?;
    OffsetDateTime::from_unix_timestamp(last.ended_at.unwrap_or(last.started_at)).ok()
}

/// What unfinished pipelines hold on to. Pure.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Live {
    /// Unfinished pipelines' ids.
    pub pipelines: BTreeSet<String>,
    /// Deployments their outputs name.
    pub deployments: BTreeSet<String>,
}

impl Live {
    pub fn of(pipelines: &[Pipeline]) -> Live {
        let mut live = Live::default();
        for p in pipelines.iter().filter(|p| !p.state.is_terminal()) {
            live.pipelines.insert(p.id.clone());
            for r in &p.history {
                if let Some(Output::Deployment { id }) = &r.output {
                    live.deployments.insert(id.clone());
                }
            }
        }
        live
    }

    /// Whether a deployment's seed is an unfinished pipeline's
    /// (`<pipeline>-deploy-<attempt>`): its deploy step finds it by that.
    fn seeds(&self, seed: &str) -> bool {
        seed.rsplit_once("-deploy-")
            .is_some_and(|(p, _)| self.pipelines.contains(p))
    }
}

/// The pipelines that go: ended more than `max_age` before `now`, and not
/// their model's newest. Pure.
pub fn pipelines_to_drop(all: &[Pipeline], now: OffsetDateTime, max_age: Duration) -> Vec<String> {
    // Ids are `p-<seq>`: the greatest is the newest.
    let mut newest: BTreeMap<&str, &str> = BTreeMap::new();
    for p in all {
        let n = newest.entry(&p.model).or_insert(&p.id);
        if p.id.as_str() > *n {
            *n = &p.id;
        }
    }
    all.iter()
        .filter(|p| newest.get(p.model.as_str()) != Some(&p.id.as_str()))
        .filter(|p| pipeline_ended_at(p).is_some_and(|t| now - t > max_age))
        .map(|p| p.id.clone())
        .collect()
}

/// The deployments that go: ended more than `max_age` before `now` (by
/// their last change), not their model's newest nor its newest succeeded
/// one, and not named by an unfinished pipeline. Pure.
pub fn deployments_to_drop(
    all: &[DeploymentRecord],
    live: &Live,
    now: OffsetDateTime,
    max_age: Duration,
) -> Vec<String> {
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut serving: BTreeMap<&str, u64> = BTreeMap::new();
    for d in all {
        let model = d.deployment.model.as_str();
        let n = newest.entry(model).or_insert(d.seq);
        *n = (*n).max(d.seq);
        if d.deployment.state == RolloutState::Succeeded {
            let s = serving.entry(model).or_insert(d.seq);
            *s = (*s).max(d.seq);
        }
    }
    all.iter()
        .filter(|d| d.is_terminal() && now - d.updated_at > max_age)
        .filter(|d| {
            let model = d.deployment.model.as_str();
            newest.get(model) != Some(&d.seq) && serving.get(model) != Some(&d.seq)
        })
        .filter(|d| !live.deployments.contains(&d.id) && !live.seeds(&d.deployment.seed))
        .map(|d| d.id.clone())
        .collect()
}

/// Whether a benchmark goes: finished more than `max_age` before `now`,
/// and not asked for by an unfinished pipeline. Pure.
pub fn benchmark_expired(
    b: &BenchmarkRecord,
    live: &Live,
    now: OffsetDateTime,
    max_age: Duration,
) -> bool {
    let by_live_pipeline = b
        .origin
        .as_deref()
        .and_then(|o| o.split('/').next())
        .is_some_and(|p| live.pipelines.contains(p));
    b.state.is_finished()
        && now - b.finished_at.unwrap_or(b.created_at) > max_age
        && !by_live_pipeline
}

/// What a pass dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DroppedHistory {
    pub pipelines: u64,
    pub deployments: u64,
    pub benchmarks: u64,
}

/// One pass. Pipelines, deployments and benchmarks are bounded by this
/// very retention, so each is read whole. Blocking; the caller flushes.
pub fn prune(store: &Db, now: OffsetDateTime, max_age: Duration) -> Result<DroppedHistory> {
    let mut d = DroppedHistory::default();
    let pipelines = store.lifecycle.pipelines.values()?;
    let live = Live::of(&pipelines);
    for id in pipelines_to_drop(&pipelines, now, max_age) {
        // Only if it is still the record decided on (a cancel or a restart
        // of its step cannot revive an ended pipeline, but stay exact).
        if let Some(p) = pipelines.iter().find(|p| p.id == id) {
            if store.lifecycle.pipelines.remove_if_eq(&id, p)? {
                d.pipelines += 1;
            }
        }
    }
    let deployments = store.fleet.deployments.values()?;
    for id in deployments_to_drop(&deployments, &live, now, max_age) {
        // The log first: a crash between leaves a record without its
        // events, never events without a record that no pass would find.
        for (key, _) in store
            .fleet
            .deployment_events
            .scan_prefix(&format!("{id}/"))?
        {
            store.fleet.deployment_events.remove(&key)?;
        }
        store.fleet.deployments.remove(&id)?;
        d.deployments += 1;
    }
    for (id, b) in store.fleet.benchmarks.scan_prefix("")? {
        if benchmark_expired(&b, &live, now, max_age) {
            store.fleet.benchmarks.remove(&id)?;
            d.benchmarks += 1;
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests;
