//! Retraining: each model's policy, manual retrains, and the pipelines with
//! every step's status, timing and failure reason.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use edgeloop_api::pipelines::{self as api, PipelineView, RetrainRequest, SignPipeline};
use serde::Deserialize;

use super::json::{OptionalJson, ValidJson, ValidPath};
use super::paging::{limit_of, newest_first, page_of};
use super::Principal;
use crate::lifecycle::pipeline::{Output, Pipeline, PipelineState, StepRecord};
use crate::lifecycle::retrain::{self, RetrainingConfig, Started};
use crate::Core;
use axum::Extension;
use edgeloop_errors::{Error, ErrorBody};

fn state_view(s: PipelineState) -> api::PipelineState {
    match s {
        PipelineState::Running {
            step,
            attempt,
            started_at,
        } => api::PipelineState::Running {
            step,
            attempt,
            started_at,
        },
        PipelineState::Succeeded => api::PipelineState::Succeeded,
        PipelineState::Stopped { step, reason } => api::PipelineState::Stopped { step, reason },
        PipelineState::Failed { step, reason } => api::PipelineState::Failed { step, reason },
        PipelineState::Cancelled { step } => api::PipelineState::Cancelled { step },
        PipelineState::AwaitingSignature { since } => {
            api::PipelineState::AwaitingSignature { since }
        }
    }
}

fn output_view(o: Output) -> api::Output {
    match o {
        Output::Dataset {
            digest,
            rows,
            eval_rows,
            edge_rows,
            hard_examples,
        } => api::Output::Dataset {
            digest,
            rows,
            eval_rows,
            edge_rows,
            hard_examples,
        },
        Output::Job { id, checkpoint } => api::Output::Job { id, checkpoint },
        Output::Onnx { digest } => api::Output::Onnx { digest },
        Output::Quantized {
            digest,
            method,
            manifest,
            version,
            variants,
        } => api::Output::Quantized {
            digest,
            method,
            manifest,
            version,
            variants,
        },
        Output::Unsigned {
            digest,
            method,
            manifest,
            version,
            variants,
        } => api::Output::Unsigned {
            digest,
            method,
            manifest,
            version,
            variants,
        },
        Output::Version { version } => api::Output::Version { version },
        Output::Comparison {
            new,
            serving,
            serving_version,
            serving_alias,
        } => api::Output::Comparison {
            new,
            serving,
            serving_version,
            serving_alias,
        },
        Output::Deployment { id } => api::Output::Deployment { id },
        Output::Reference => api::Output::Reference,
    }
}

fn step_view(r: StepRecord) -> api::StepRecord {
    api::StepRecord {
        step: r.step,
        attempt: r.attempt,
        started_at: r.started_at,
        ended_at: r.ended_at,
        outcome: r.outcome,
        output: r.output.map(output_view),
    }
}

/// A pipeline as the API shows it: the record, its state's name, and the
/// current step.
pub fn view(pipeline: Pipeline, coalesced: bool) -> PipelineView {
    let (step, reason) = match &pipeline.state {
        PipelineState::Running { step, .. } | PipelineState::Cancelled { step } => {
            (Some(*step), None)
        }
        PipelineState::Stopped { step, reason } | PipelineState::Failed { step, reason } => {
            (Some(*step), Some(reason.clone()))
        }
        PipelineState::AwaitingSignature { .. } => {
            (Some(crate::lifecycle::pipeline::Step::Sign), None)
        }
        PipelineState::Succeeded => (None, None),
    };
    let state = state_view(pipeline.state);
    PipelineView {
        id: pipeline.id,
        model: pipeline.model,
        status: state.status(),
        step,
        reason,
        coalesced_request: coalesced,
        trigger: pipeline.trigger,
        state,
        history: pipeline.history.into_iter().map(step_view).collect(),
        max_attempts: pipeline.max_attempts,
        step_timeout_seconds: pipeline.step_timeout_seconds,
        min_gain_points: pipeline.min_gain_points,
        coalesced: pipeline
            .coalesced
            .into_iter()
            .map(|c| api::Coalesced {
                trigger: c.trigger,
                at: c.at,
            })
            .collect(),
        signing: pipeline.signing,
    }
}

/// Sets how a model is retrained.
#[utoipa::path(put, path = "/api/v1/models/{name}/retraining", tag = "loop",
    params(("name" = String, Path)), request_body = RetrainingConfig,
    responses((status = 200, body = RetrainingConfig), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_config(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
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
    ValidPath(name): ValidPath<String>,
) -> Result<Json<RetrainingConfig>, Error> {
    Ok(Json(retrain::get_config(&core.store, &name)?))
}

/// A manual retrain. 201 with the new pipeline, or 200 with the running one
/// (`coalesced: true`) that the request was folded into.
#[utoipa::path(post, path = "/api/v1/models/{name}/retrain", tag = "loop",
    params(("name" = String, Path)),
    request_body(content = Option<RetrainRequest>, description = "optional; an empty body is allowed"),
    responses((status = 201, body = PipelineView), (status = 200, body = PipelineView),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn retrain(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    OptionalJson(req): OptionalJson<RetrainRequest>,
) -> Result<(StatusCode, Json<PipelineView>), Error> {
    edgeloop_registry::models::get_model(&core.store.registry, &name)?;
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
#[into_params(parameter_in = Query)]
pub struct PipelineQuery {
    /// Only this model's pipelines.
    pub model: Option<String>,
    /// Pipelines older than this id: the previous page's
    /// `edgeloop-next-cursor`.
    #[param(max_length = 1024)]
    pub after: Option<String>,
    /// At most this many pipelines (1 to 1000); without it, every one.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Every pipeline, newest first; with `limit` or `after`, one page read by
/// key range from `after` down (the filters applied on the way), and the
/// next page's cursor in `edgeloop-next-cursor` when full.
#[utoipa::path(get, path = "/api/v1/pipelines", tag = "loop", params(PipelineQuery),
    responses((status = 200, body = Vec<PipelineView>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    q: Result<Query<PipelineQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    let limit = limit_of(q.limit, q.after.as_deref())?;
    // Ids are `p-<seq>`: newest first is the keys read downwards.
    let page = newest_first(
        &core.store.lifecycle.pipelines,
        q.after.as_deref(),
        limit,
        |p| {
            if q.model.as_deref().is_some_and(|m| p.model != m) {
                return Ok(false);
            }
            super::scope::sees_model(&core, &who, &p.model)
        },
    )?;
    Ok(page_of(page, limit, |(_, p)| view(p, false)))
}

#[utoipa::path(get, path = "/api/v1/pipelines/{id}", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = PipelineView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
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
    ValidPath(id): ValidPath<String>,
) -> Result<Json<PipelineView>, Error> {
    Ok(Json(view(
        retrain::cancel(&core.store, &id, core.now()).await?,
        false,
    )))
}

/// Offline signing: the signatures of a pipeline in `awaiting_signature`,
/// one per unsigned manifest (the version's own and each variant's), each
/// made by one of its policy's public keys. 400 names the signature that
/// does not verify; 409 when the pipeline is not awaiting one.
#[utoipa::path(post, path = "/api/v1/pipelines/{id}/signatures", tag = "loop", params(("id" = String, Path)),
    request_body = SignPipeline,
    responses((status = 200, body = PipelineView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn sign(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
    ValidJson(req): ValidJson<SignPipeline>,
) -> Result<Json<PipelineView>, Error> {
    Ok(Json(view(
        retrain::signing::sign(&core, &id, req, core.now()).await?,
        false,
    )))
}
