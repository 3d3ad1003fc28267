//! Training jobs: submit, list, show (with progress and checkpoints), cancel.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::json::{ValidJson, ValidPath};
use super::Principal;
use crate::error::{Error, ErrorBody};
use crate::fleet::FleetEvent;
use crate::lifecycle::jobs::{self, CreateJob, JobRecord};
use crate::registry::checkpoints::{self, CheckpointRecord};
use crate::Core;
use axum::Extension;

pub use edgeloop_api::jobs::{CheckpointView, Job, JobView, SubmittedSpec};

impl From<&CheckpointRecord> for CheckpointView {
    fn from(c: &CheckpointRecord) -> Self {
        CheckpointView {
            job_id: c.job_id.clone(),
            attempt: c.attempt,
            step: c.step,
            digest: c.digest,
            size: c.size,
            has_optimizer_state: c.has_optimizer_state,
            metadata: c.metadata.clone(),
            cluster: c.cluster.clone(),
            uploaded_at: c.uploaded_at,
        }
    }
}

/// The job as the API shows it. The spec was validated when the job was
/// created, so it is an object; its name is read once, here.
pub fn job_view(j: JobRecord) -> Result<Job, Error> {
    let spec: SubmittedSpec = serde_json::from_value(j.spec).map_err(|e| {
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
        exit_code: j.exit_code,
        cancel_requested: j.cancel_requested,
        last_message: j.last_message,
        history: j.history,
        created_at: j.created_at,
        updated_at: j.updated_at,
    })
}

fn view(core: &Core, job: JobRecord) -> Result<JobView, Error> {
    let checkpoints = checkpoints::list(&core.store, &job.id)?
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

#[utoipa::path(get, path = "/api/v1/jobs", tag = "loop",
    responses((status = 200, body = Vec<Job>)), security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Vec<Job>>, Error> {
    let mut all = core.store.jobs.values()?;
    all.retain(|j| who.sees(&j.project));
    all.sort_by_key(|j| j.created_at);
    Ok(Json(
        all.into_iter().map(job_view).collect::<Result<_, _>>()?,
    ))
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
