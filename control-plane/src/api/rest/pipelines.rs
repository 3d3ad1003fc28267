//! Retraining: each model's policy, manual retrains, and the pipelines with
//! every step's status, timing and failure reason.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::json::{OptionalJson, ValidJson};
use crate::error::{Error, ErrorBody};
use crate::lifecycle::pipeline::{Pipeline, PipelineState};
use crate::lifecycle::retrain::{self, RetrainingConfig, Started};
use crate::Core;

/// A pipeline as the API shows it: the record, its state's name, and the
/// current step.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PipelineView {
    pub id: String,
    pub model: String,
    /// `running`, `succeeded`, `stopped`, `failed` or `cancelled`.
    pub status: &'static str,
    /// The step running or the one it ended in.
    pub step: Option<String>,
    /// Why it stopped or failed.
    pub reason: Option<String>,
    /// Set when this request's trigger was folded into a running pipeline
    /// (listed in its `coalesced`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub coalesced_request: bool,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub pipeline: Pipeline,
}

fn step_name(step: crate::lifecycle::pipeline::Step) -> String {
    serde_json::to_value(step)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

pub fn view(pipeline: Pipeline, coalesced: bool) -> PipelineView {
    let (step, reason) = match &pipeline.state {
        PipelineState::Running { step, .. } | PipelineState::Cancelled { step } => {
            (Some(step_name(*step)), None)
        }
        PipelineState::Stopped { step, reason } | PipelineState::Failed { step, reason } => {
            (Some(step_name(*step)), Some(reason.clone()))
        }
        PipelineState::Succeeded => (None, None),
    };
    PipelineView {
        id: pipeline.id.clone(),
        model: pipeline.model.clone(),
        status: retrain::state_name(&pipeline.state),
        step,
        reason,
        coalesced_request: coalesced,
        pipeline,
    }
}

/// Sets how a model is retrained.
#[utoipa::path(put, path = "/api/v1/models/{name}/retraining", tag = "loop",
    params(("name" = String, Path)), request_body = RetrainingConfig,
    responses((status = 200, body = RetrainingConfig), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_config(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
    ValidJson(config): ValidJson<RetrainingConfig>,
) -> Result<Json<RetrainingConfig>, Error> {
    retrain::put_config(&core.store, &name, config.clone()).await?;
    Ok(Json(config))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/retraining", tag = "loop",
    params(("name" = String, Path)),
    responses((status = 200, body = RetrainingConfig), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_config(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
) -> Result<Json<RetrainingConfig>, Error> {
    Ok(Json(retrain::get_config(&core.store, &name)?))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrainRequest {
    /// Why, for the record (the trigger becomes `manual: <reason>`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// A manual retrain. 201 with the new pipeline, or 200 with the running one
/// (`coalesced: true`) that the request was folded into.
#[utoipa::path(post, path = "/api/v1/models/{name}/retrain", tag = "loop",
    params(("name" = String, Path)), request_body = RetrainRequest,
    responses((status = 201, body = PipelineView), (status = 200, body = PipelineView),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn retrain(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
    OptionalJson(req): OptionalJson<RetrainRequest>,
) -> Result<(StatusCode, Json<PipelineView>), Error> {
    crate::registry::models::get_model(&core.store, &name)?;
    let trigger = match req.reason {
        Some(r) => format!("manual: {r}"),
        None => "manual".to_string(),
    };
    Ok(
        match retrain::start(&core.store, &name, &trigger, core.now()).await? {
            Started::Started(p) => (StatusCode::CREATED, Json(view(p, false))),
            Started::Coalesced(p) => (StatusCode::OK, Json(view(p, true))),
        },
    )
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PipelineQuery {
    /// Only this model's pipelines.
    pub model: Option<String>,
}

/// Every pipeline, newest first.
#[utoipa::path(get, path = "/api/v1/pipelines", tag = "loop", params(PipelineQuery),
    responses((status = 200, body = Vec<PipelineView>), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    q: Result<Query<PipelineQuery>, QueryRejection>,
) -> Result<Json<Vec<PipelineView>>, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    Ok(Json(
        retrain::list(&core.store, q.model.as_deref())?
            .into_iter()
            .map(|p| view(p, false))
            .collect(),
    ))
}

#[utoipa::path(get, path = "/api/v1/pipelines/{id}", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = PipelineView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    Path(id): Path<String>,
) -> Result<Json<PipelineView>, Error> {
    Ok(Json(view(retrain::get(&core.store, &id)?, false)))
}

/// Cancels a running pipeline and whatever its step started (409 once it
/// has ended).
#[utoipa::path(post, path = "/api/v1/pipelines/{id}/cancel", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = PipelineView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(core): State<Arc<Core>>,
    Path(id): Path<String>,
) -> Result<Json<PipelineView>, Error> {
    Ok(Json(view(
        retrain::cancel(&core.store, &id, core.now()).await?,
        false,
    )))
}
