//! A model's retraining triggers, and what the trigger task last saw and
//! decided for it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use super::json::ValidJson;
use crate::error::{Error, ErrorBody};
use crate::lifecycle::triggers::config::TriggersConfig;
use crate::lifecycle::triggers::runner::TriggerStateRecord;
use crate::registry::models;
use crate::Core;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TriggersView {
    pub model: String,
    pub config: TriggersConfig,
    /// The last evaluation: the state the scheduler saw (drift, online and
    /// evaluated accuracy, labels since the last retrain, the running
    /// pipeline) and its decision.
    pub state: TriggerStateRecord,
}

/// Sets a model's triggers (replacing the old ones); a 400 names the field.
#[utoipa::path(put, path = "/api/v1/models/{name}/triggers", tag = "loop",
    params(("name" = String, Path)), request_body = TriggersConfig,
    responses((status = 200, body = TriggersView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
    ValidJson(config): ValidJson<TriggersConfig>,
) -> Result<Json<TriggersView>, Error> {
    models::get_model(&core.store, &name)?;
    config.triggers_for(&name)?;
    core.store.triggers.insert(&name, &config)?;
    core.store.flush().await?;
    let state = core.store.trigger_state.get(&name)?.unwrap_or_default();
    Ok(Json(TriggersView {
        model: name,
        config,
        state,
    }))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/triggers", tag = "loop",
    params(("name" = String, Path)),
    responses((status = 200, body = TriggersView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
) -> Result<Json<TriggersView>, Error> {
    models::get_model(&core.store, &name)?;
    let config = core
        .store
        .triggers
        .get(&name)?
        .ok_or_else(|| Error::not_found("triggers of model", &name))?;
    let state = core.store.trigger_state.get(&name)?.unwrap_or_default();
    Ok(Json(TriggersView {
        model: name,
        config,
        state,
    }))
}
