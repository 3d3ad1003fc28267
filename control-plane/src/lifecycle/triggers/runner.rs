//! The thin task around [`super::decide`]: every tick, for each model with
//! triggers, it reads what the scheduler needs from the store (the serving
//! version's drift with hysteresis, online accuracy from labelled
//! feedback, labels since the last retrain, the running pipeline), asks the
//! pure scheduler, and acts: starts a retrain, or records the triggers on
//! the running one. What it saw and decided is kept per model for
//! `GET /api/v1/models/{name}/triggers`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::config::{TriggerPolicy, TriggersConfig};
use super::{decide, Decision, ModelState, TriggerKind};
use crate::lifecycle::retrain::{self, steps, Started};
use crate::Core;
pub use edgeloop_api::triggers::DecisionKind;
use edgeloop_drift::aggregates::{labelled, run};
use edgeloop_errors::{Error, Result};
use edgeloop_registry::models::{self, ModelVersionRecord};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TriggerStateRecord {
    /// The minute a schedule last fired, so it fires once per minute.
    pub schedule_fired_minute: Option<i64>,
    pub last: Option<Evaluation>,
}

/// One evaluation of a model's triggers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Unix seconds.
    pub at: i64,
    /// The serving version the drift and accuracy are about.
    pub version: Option<String>,
    pub state: ModelState,
    /// None when nothing fired.
    pub decision: Option<DecisionKind>,
    pub reasons: Vec<String>,
    pub pipeline: Option<String>,
}

pub async fn run(core: Arc<Core>, interval: Duration, shutdown: CancellationToken) {
    loop {
        // Another replica runs it while it holds the lease.
        if core.leader.leads(crate::leader::Task::Triggers) {
            if let Err(e) = tick(&core, core.now()).await {
                tracing::error!(error = %e, "trigger tick failed; retrying next tick");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Runs `f` (store reads) on the blocking pool, never on the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(anyhow::Error::new(e).context("a trigger store read")))?
}

pub async fn tick(core: &Arc<Core>, now: OffsetDateTime) -> Result<()> {
    let store = core.store.clone();
    let models = blocking(move || Ok(store.lifecycle.triggers.scan_prefix("")?)).await?;
    for (model, config) in models {
        if let Err(e) = evaluate(core, &model, &config, now).await {
            tracing::error!(%model, error = %e, "evaluating triggers");
        }
    }
    Ok(())
}

/// The features of a window at or over the watch level, largest PSI
/// first, at most three. A tabular input's pooled histogram is left out
/// when its columns have their own: the column says which feature moved.
pub fn moved_features(
    reference: &edgeloop_models::manifest::ReferenceStats,
    features: &[edgeloop_api::drift::FeatureDrift],
) -> Vec<(String, f64)> {
    let pooled: BTreeSet<&str> = reference
        .inputs
        .iter()
        .filter_map(|h| h.input.as_deref())
        .collect();
    let mut moved: Vec<(String, f64)> = features
        .iter()
        .filter(|f| !pooled.contains(f.name.as_str()))
        .filter(|f| {
            matches!(
                f.level,
                edgeloop_api::drift::DriftLevel::Watch | edgeloop_api::drift::DriftLevel::Act
            )
        })
        .filter_map(|f| Some((f.name.clone(), f.psi?)))
        .collect();
    moved.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    moved.truncate(3);
    moved
}

/// What the store says about `model` (on the blocking pool): everything
/// the scheduler needs but drift, and the serving version.
fn observe_store(
    core: &Core,
    model: &str,
    config: &TriggersConfig,
) -> Result<(TriggerStateRecord, ModelState, Option<ModelVersionRecord>)> {
    let store = &core.store;
    let saved = store
        .lifecycle
        .trigger_state
        .get(model)?
        .unwrap_or_default();
    let running = match store.lifecycle.pipeline_active.get(model)? {
        Some(id) => store
            .lifecycle
            .pipelines
            .get(&id)?
            .filter(|p| !p.state.is_terminal())
            .map(|p| p.id),
        None => None,
    };
    let last_started = retrain::list(store, Some(model))?
        .first()
        .and_then(|p| p.history.first())
        .map(|r| r.started_at);
    let serving = steps::serving_version(core, model)?;
    let mut state = ModelState {
        running,
        last_started,
        cooldown_seconds: config.cooldown_seconds,
        schedule_fired_minute: saved.schedule_fired_minute,
        ..Default::default()
    };
    // The label indexes: O(hours since the last retrain), not a scan of
    // the samples (and their inputs).
    state.labels_since_last = labelled::labels_since(&store.drift, model, last_started)?;
    let Some(version) = serving else {
        return Ok((saved, state, None));
    };
    state.online_accuracy = labelled::online_accuracy(
        &store.drift,
        model,
        &version.version,
        config.accuracy_window as usize,
        config.accuracy_min_samples as usize,
    )?;
    let reference = retrain::reference(store, model)?.filter(|r| r.version == version.version);
    state.evaluated_accuracy = reference
        .and_then(|r| r.evaluated_accuracy)
        .or_else(|| version.metrics.get("eval_accuracy").copied());
    Ok((saved, state, Some(version)))
}

async fn observe(
    core: &Arc<Core>,
    model: &str,
    config: &TriggersConfig,
) -> Result<(TriggerStateRecord, ModelState, Option<String>)> {
    let (c, m, cfg) = (core.clone(), model.to_string(), config.clone());
    let (saved, mut state, version) = blocking(move || observe_store(&c, &m, &cfg)).await?;
    let Some(version) = version else {
        return Ok((saved, state, None));
    };
    if let Some(m) = version.manifest_digest {
        let signed = models::read_manifest(core.artifacts.as_ref(), m, "manifest").await?;
        if let Some(reference) = signed.manifest.reference_stats {
            let drift = config.drift.unwrap_or_default();
            let (store, m, v, id) = (
                core.store.clone(),
                model.to_string(),
                version.version.clone(),
                m.to_string(),
            );
            // The windows closed since the last tick and the newest, over
            // the fold kept of the rest (drift::aggregates::run).
            let (seen, reference) = blocking(move || {
                let seen = run::observe(&store.drift, &reference, &id, &m, &v, &drift)?;
                Ok((seen, reference))
            })
            .await?;
            if let Some((since, severity)) = seen.run {
                state.drifting_since = Some(since);
                state.drift_severity = severity;
                state.drift_features = seen
                    .newest
                    .map(|w| moved_features(&reference, &w.features))
                    .unwrap_or_default();
            }
        }
    }
    Ok((saved, state, Some(version.version)))
}

async fn evaluate(
    core: &Arc<Core>,
    model: &str,
    config: &TriggersConfig,
    now: OffsetDateTime,
) -> Result<()> {
    let triggers = config.triggers_for(model)?;
    if triggers.is_empty() {
        return Ok(());
    }
    let (saved, state, version) = observe(core, model, config).await?;
    let now_s = now.unix_timestamp();
    let decisions = decide(
        &triggers,
        &BTreeMap::from([(model.to_string(), state.clone())]),
        now_s,
    );
    let mut next = TriggerStateRecord {
        schedule_fired_minute: saved.schedule_fired_minute,
        last: Some(Evaluation {
            at: now_s,
            version,
            state,
            decision: None,
            reasons: vec![],
            pipeline: None,
        }),
    };
    if let Some(d) = decisions.into_iter().next() {
        let (name, reasons) = match &d {
            Decision::Start { reasons, .. } => (DecisionKind::Start, reasons.clone()),
            Decision::Coalesce { reasons, .. } => (DecisionKind::Coalesce, reasons.clone()),
            Decision::Cooldown { reasons, .. } => (DecisionKind::Cooldown, reasons.clone()),
        };
        let fired_schedule = triggers.iter().any(|t| {
            matches!(t.kind, TriggerKind::Schedule { .. })
                && reasons
                    .iter()
                    .any(|r| r.starts_with(&format!("{}: ", t.id)))
        });
        if fired_schedule {
            next.schedule_fired_minute = Some(now_s - now_s.rem_euclid(60));
        }
        let pipeline = act(core, model, &d, &reasons, now).await?;
        if let Some(last) = next.last.as_mut() {
            last.decision = Some(name);
            last.reasons = reasons;
            last.pipeline = pipeline;
        }
    }
    let fence = core.leader.fence(crate::leader::Task::Triggers);
    core.store
        .update_fenced(&core.store.lifecycle.trigger_state, fence, model, |_| {
            Ok::<_, Error>(next.clone())
        })?
        .map_err(crate::leader::not_written)?;
    Ok(())
}

async fn act(
    core: &Core,
    model: &str,
    d: &Decision,
    reasons: &[String],
    now: OffsetDateTime,
) -> Result<Option<String>> {
    match d {
        Decision::Cooldown { .. } => Ok(None),
        Decision::Start { .. } => {
            let trigger: String = reasons.join("; ").chars().take(500).collect();
            let p = match retrain::start(&core.store, model, &trigger, now).await {
                Ok(Started::Started(p)) => {
                    tracing::info!(%model, pipeline = %p.id, %trigger, "trigger started a retrain");
                    p
                }
                Ok(Started::Coalesced(p)) => p,
                // No retraining policy yet: the decision is kept (and
                // shown) without a pipeline, rather than failing each tick.
                Err(Error::Conflict(why)) => {
                    tracing::debug!(%model, %why, "a trigger fired but no retrain could start");
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            Ok(Some(p.id))
        }
        Decision::Coalesce { running, .. } => {
            // Once per trigger per pipeline: a condition that holds for an
            // hour is one reason, not 3600 entries.
            let p = retrain::get(&core.store, running)?;
            for reason in reasons {
                let id = reason.split(": ").next().unwrap_or_default();
                let known = p
                    .coalesced
                    .iter()
                    .any(|c| c.trigger.split(": ").next() == Some(id));
                if !known {
                    retrain::start(&core.store, model, reason, now).await?;
                }
            }
            Ok(Some(running.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_features_named_are_the_columns_that_moved_most() {
        use edgeloop_api::drift::{DriftLevel, FeatureDrift};
        use edgeloop_models::manifest::{InputHistogram, ReferenceStats};
        let h = |name: &str, input: Option<&str>, column: Option<u32>| InputHistogram {
            name: name.into(),
            bin_edges: vec![0.0, 1.0],
            counts: vec![1],
            input: input.map(str::to_string),
            column,
        };
        let reference = ReferenceStats {
            inputs: vec![
                h("input", None, None),
                h("dew_point", Some("input"), Some(0)),
                h("visibility", Some("input"), Some(1)),
                h("wind", Some("input"), Some(2)),
                h("other", None, None),
            ],
            prediction_distribution: vec![],
            sample_count: 1,
        };
        let f = |name: &str, psi: Option<f64>, level: DriftLevel| FeatureDrift {
            name: name.into(),
            psi,
            ks_statistic: None,
            ks_p_value: None,
            js_distance: None,
            level,
        };
        let features = [
            f("input", Some(9.0), DriftLevel::Act),
            f("dew_point", Some(8.3), DriftLevel::Act),
            f("visibility", Some(0.15), DriftLevel::Watch),
            f("wind", Some(0.01), DriftLevel::Stable),
            f("other", None, DriftLevel::Unknown),
        ];
        assert_eq!(
            moved_features(&reference, &features),
            [
                ("dew_point".to_string(), 8.3),
                ("visibility".to_string(), 0.15)
            ],
            "the pooled input and the stable ones are not named"
        );
    }
}
