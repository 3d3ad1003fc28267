//! Training jobs: submit, list, show (with progress and checkpoints), cancel.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::json::ValidJson;
use crate::error::{Error, ErrorBody};
use crate::fleet::FleetEvent;
use crate::lifecycle::jobs::{self, CreateJob, JobRecord};
use crate::registry::checkpoints::{self, CheckpointRecord};
use crate::Core;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobView {
    #[serde(flatten)]
    pub job: JobRecord,
    pub checkpoints: Vec<CheckpointRecord>,
}

fn view(core: &Core, job: JobRecord) -> Result<JobView, Error> {
    let checkpoints = checkpoints::list(&core.store, &job.id)?;
    Ok(JobView { job, checkpoints })
}

/// Queues a training job; a trainer bridge leases it.
#[utoipa::path(post, path = "/api/v1/jobs", tag = "loop", request_body = CreateJob,
    responses((status = 201, body = JobView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(core): State<Arc<Core>>,
    ValidJson(req): ValidJson<CreateJob>,
) -> Result<(StatusCode, Json<JobView>), Error> {
    let job = jobs::create(&core.store, req, core.now()).await?;
    core.events.publish(FleetEvent::JobChanged {
        job: job.id.clone(),
    });
    Ok((StatusCode::CREATED, Json(view(&core, job)?)))
}

#[utoipa::path(get, path = "/api/v1/jobs", tag = "loop",
    responses((status = 200, body = Vec<JobRecord>)), security(("bearer" = [])))]
pub async fn list(State(core): State<Arc<Core>>) -> Result<Json<Vec<JobRecord>>, Error> {
    let mut all = core.store.jobs.values()?;
    all.sort_by_key(|j| j.created_at);
    Ok(Json(all))
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, Error> {
    Ok(Json(view(&core, jobs::get(&core.store, &id)?)?))
}

/// Cancels a job: at once if queued, through its bridge if running.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn cancel(
    State(core): State<Arc<Core>>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, Error> {
    let job = jobs::cancel(&core.store, &id, core.now()).await?;
    core.events.publish(FleetEvent::JobChanged {
        job: job.id.clone(),
    });
    Ok(Json(view(&core, job)?))
}
