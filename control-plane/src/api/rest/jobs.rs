//! Training jobs: submit, list, show (with progress and checkpoints), cancel.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;

use super::json::{ValidJson, ValidPath};
use super::paging::{limit_of, paged, try_page_of};
use super::Principal;
use crate::fleet::FleetEvent;
use crate::lifecycle::jobs::{self, CreateJob, JobRecord};
use crate::Core;
use axum::Extension;
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::checkpoints;
use serde::Deserialize;

pub use edgeloop_api::jobs::{CheckpointView, Job, JobView, SubmittedSpec};

/// The job as the API shows it, its spec as the record writes it.
pub fn job_view(j: JobRecord) -> Result<Job, Error> {
    let spec: SubmittedSpec = serde_json::to_value(&j.spec)
        .and_then(serde_json::from_value)
        .map_err(|e| {
            Error::Internal(anyhow::Error::new(e).context(format!("job {:?}: stored spec", j.id)))
        })?;
    Ok(Job {
        id: j.id,
        spec,
        project: j.project,
        cluster: j.cluster,
        state: j.state,
        leased_by: j.leased_by,
        lease_expires_at: j.lease_expires_at,
        attempt: j.attempt,
        step: j.step,
        engine_job_id: j.engine_job_id,
        image: j.image,
        restarts: j.restarts,
        preemptions: j.preemptions,
        exit_code: j.exit_code,
        cancel_requested: j.cancel_requested,
        last_message: j.last_message,
        history: j.history,
        created_at: j.created_at,
        updated_at: j.updated_at,
    })
}

fn view(core: &Core, job: JobRecord) -> Result<JobView, Error> {
    let checkpoints = checkpoints::list(&core.store.registry, &job.id)?
        .iter()
        .map(CheckpointView::from)
        .collect();
    Ok(JobView {
        job: job_view(job)?,
        checkpoints,
    })
}

/// Queues a training job; a trainer bridge leases it.
#[utoipa::path(post, path = "/api/v1/jobs", tag = "loop", request_body = CreateJob,
    responses((status = 201, body = JobView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    ValidJson(req): ValidJson<CreateJob>,
) -> Result<(StatusCode, Json<JobView>), Error> {
    who.may_create_in(
        req.project
            .as_deref()
            .unwrap_or(edgeloop_api::access::DEFAULT_PROJECT),
    )?;
    let job = jobs::create(&core.store, req, core.now()).await?;
    core.events.publish(FleetEvent::JobChanged {
        job: job.id.clone(),
    });
    Ok((StatusCode::CREATED, Json(view(&core, job)?)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct JobQuery {
    /// Jobs after this id: the previous page's `edgeloop-next-cursor`.
    #[param(max_length = 1024)]
    pub after: Option<String>,
    /// At most this many jobs (1 to 1000), in id order; without it or
    /// `after`, every job, oldest first.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Every job the caller sees, oldest first; with `limit`, one page in id
/// order read by key range from `after`, and the next page's cursor in
/// `edgeloop-next-cursor` when full.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "loop", params(JobQuery),
    responses((status = 200, body = Vec<Job>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    q: Result<Query<JobQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    let limit = limit_of(q.limit, q.after.as_deref())?;
    if q.limit.is_some() || q.after.is_some() {
        let page =
            core.store
                .lifecycle
                .jobs
                .page_after("", q.after.as_deref(), limit, |_, j| who.sees(&j.project))?;
        return try_page_of(page, limit, |(_, j)| job_view(j));
    }
    let mut all = core.store.lifecycle.jobs.values()?;
    all.retain(|j| who.sees(&j.project));
    all.sort_by_key(|j| j.created_at);
    let all: Vec<Job> = all.into_iter().map(job_view).collect::<Result<_, _>>()?;
    Ok(paged(all, None))
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<JobView>, Error> {
    Ok(Json(view(&core, jobs::get(&core.store, &id)?)?))
}

/// Cancels a job: at once if queued, through its bridge if running.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "loop", params(("id" = String, Path)),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn cancel(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<JobView>, Error> {
    let job = jobs::cancel(&core.store, &id, core.now()).await?;
    core.events.publish(FleetEvent::JobChanged {
        job: job.id.clone(),
    });
    Ok(Json(view(&core, job)?))
}
