//! A model's retraining triggers, and what the trigger task last saw and
//! decided for it.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use edgeloop_api::triggers::{Evaluation, ModelState, TriggerState, TriggersView};

use super::json::{ValidJson, ValidPath};
use crate::lifecycle::triggers::config::{TriggerPolicy, TriggersConfig};
use crate::lifecycle::triggers::runner::{self, TriggerStateRecord};
use crate::lifecycle::triggers::ModelState as SchedulerState;
use crate::Core;
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::models;

fn model_state(s: SchedulerState) -> ModelState {
    ModelState {
        running: s.running,
        last_started: s.last_started,
        cooldown_seconds: s.cooldown_seconds,
        drifting_since: s.drifting_since,
        drift_severity: s.drift_severity,
        drift_features: s
            .drift_features
            .into_iter()
            .map(|(name, psi)| edgeloop_api::triggers::FeatureMove { name, psi })
            .collect(),
        evaluated_accuracy: s.evaluated_accuracy,
        online_accuracy: s.online_accuracy,
        labels_since_last: s.labels_since_last,
        manual_requested: s.manual_requested,
        schedule_fired_minute: s.schedule_fired_minute,
    }
}

fn evaluation(e: runner::Evaluation) -> Evaluation {
    Evaluation {
        at: e.at,
        version: e.version,
        state: model_state(e.state),
        decision: e.decision,
        reasons: e.reasons,
        pipeline: e.pipeline,
    }
}

/// The stored record as the API shows it.
pub fn state_view(r: TriggerStateRecord) -> TriggerState {
    TriggerState {
        schedule_fired_minute: r.schedule_fired_minute,
        last: r.last.map(evaluation),
    }
}

fn view(core: &Core, name: String, config: TriggersConfig) -> Result<TriggersView, Error> {
    let state = core
        .store
        .lifecycle
        .trigger_state
        .get(&name)?
        .unwrap_or_default();
    Ok(TriggersView {
        model: name,
        config,
        state: state_view(state),
    })
}

/// Sets a model's triggers (replacing the old ones); a 400 names the field.
#[utoipa::path(put, path = "/api/v1/models/{name}/triggers", tag = "loop",
    params(("name" = String, Path)), request_body = TriggersConfig,
    responses((status = 200, body = TriggersView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    ValidJson(config): ValidJson<TriggersConfig>,
) -> Result<Json<TriggersView>, Error> {
    models::get_model(&core.store.registry, &name)?;
    config.triggers_for(&name)?;
    core.store.lifecycle.triggers.insert(&name, &config)?;
    core.store.flush().await?;
    Ok(Json(view(&core, name, config)?))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/triggers", tag = "loop",
    params(("name" = String, Path)),
    responses((status = 200, body = TriggersView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
) -> Result<Json<TriggersView>, Error> {
    models::get_model(&core.store.registry, &name)?;
    let config = core
        .store
        .lifecycle
        .triggers
        .get(&name)?
        .ok_or_else(|| Error::not_found("triggers of model", &name))?;
    Ok(Json(view(&core, name, config)?))
}
