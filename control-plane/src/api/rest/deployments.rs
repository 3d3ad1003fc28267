//! Deployments: create (a staged rollout of one model version to a device
//! group), list, show with its event log, cancel.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;

use super::json::{ValidJson, ValidPath};
use super::paging::{limit_of, newest_first, try_page_of};
use super::Principal;
use crate::fleet::deployments::{self, CreateDeployment, DeploymentRecord, DeploymentView};
use crate::Core;
use axum::Extension;
use edgeloop_errors::{Error, ErrorBody};
use serde::Deserialize;

fn view(core: &Core, record: DeploymentRecord, with_events: bool) -> Result<DeploymentView, Error> {
    let events = if with_events {
        deployments::events(&core.store, &record.id)?
    } else {
        Vec::new()
    };
    Ok(record.view(events))
}

/// Starts a staged rollout. An unfinished deployment of the same model to
/// the same selector is superseded by it.
#[utoipa::path(post, path = "/api/v1/deployments", tag = "fleet", request_body = CreateDeployment,
    responses((status = 201, body = DeploymentView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    ValidJson(req): ValidJson<CreateDeployment>,
) -> Result<(StatusCode, Json<DeploymentView>), Error> {
    if !super::scope::sees_model(&core, &who, &req.model)? {
        // What a missing model answers (`deployments::create`).
        return Err(Error::bad_field(
            "model",
            format!("model {:?} does not exist", req.model),
        ));
    }
    let record = deployments::create(&core.store, core.artifacts.as_ref(), req, core.now()).await?;
    Ok((StatusCode::CREATED, Json(view(&core, record, false)?)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeploymentQuery {
    /// Deployments older than this id: the previous page's
    /// `edgeloop-next-cursor`.
    #[param(max_length = 1024)]
    pub after: Option<String>,
    /// At most this many deployments (1 to 1000); without it, every one.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Every deployment, newest first (without event logs); with `limit` or
/// `after`, one page read by key range from `after` down, and the next
/// page's cursor in `edgeloop-next-cursor` when full.
#[utoipa::path(get, path = "/api/v1/deployments", tag = "fleet", params(DeploymentQuery),
    responses((status = 200, body = Vec<DeploymentView>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    q: Result<Query<DeploymentQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    let limit = limit_of(q.limit, q.after.as_deref())?;
    // Ids are `d-<seq>`, so key order is creation order: newest first is
    // the keys read downwards.
    let page = newest_first(
        &core.store.fleet.deployments,
        q.after.as_deref(),
        limit,
        |r| super::scope::sees_model(&core, &who, &r.deployment.model),
    )?;
    try_page_of(page, limit, |(_, r)| view(&core, r, false))
}

/// One deployment with its event log (waves, gate evidence, rollback).
#[utoipa::path(get, path = "/api/v1/deployments/{id}", tag = "fleet", params(("id" = String, Path)),
    responses((status = 200, body = DeploymentView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<DeploymentView>, Error> {
    Ok(Json(view(
        &core,
        deployments::get(&core.store, &id)?,
        true,
    )?))
}

/// Stops a rollout: the devices it moved go back to their previous
/// version, and it ends `cancelled`. 409 once it has ended.
#[utoipa::path(post, path = "/api/v1/deployments/{id}/cancel", tag = "fleet", params(("id" = String, Path)),
    responses((status = 200, body = DeploymentView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<DeploymentView>, Error> {
    let record = deployments::cancel(&core.store, &id, core.now()).await?;
    Ok(Json(view(&core, record, true)?))
}
