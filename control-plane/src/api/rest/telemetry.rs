//! What devices reported: their telemetry reports, and per model the drift
//! sketches and samples (hard examples, labelled feedback) drift analysis
//! and retraining read.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;

use super::json::ValidJson;
use super::json::ValidPath;
use super::paging::{limit_of, page_of};
use super::Principal;
use crate::fleet::members::{self, MemberKind};
use crate::fleet::telemetry::TelemetryRecord;
use crate::Core;
use axum::Extension;
use edgeloop_api::samples::{
    LabelState, LabelsSet, SampleSummary, SampleView, SetLabel, SetLabels,
};
use edgeloop_drift::labels;
use edgeloop_drift::records::{SampleKind, SketchRecord};
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::models;

pub const DEFAULT_LIMIT: usize = 100;

/// Filters; results come in key order (version, device, sequence) and
/// `after_sequence` pages through one device's reports.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReportQuery {
    /// Only this model version.
    pub version: Option<String>,
    /// Only this device.
    pub device: Option<String>,
    /// Only reports with a higher sequence.
    // int64 with minimum 0, not u64: OpenAPI has no unsigned 64-bit
    // format, and tools bound a u64's `maximum` (2^64 - 1) through a float.
    // A device's sequence never reaches 2^63.
    #[param(minimum = 0)]
    pub after_sequence: Option<i64>,
    /// Only this kind of sample (`hard_example`, `feedback`); samples only.
    pub kind: Option<SampleKind>,
    /// Only labelled or only unlabelled samples (the labelling queue:
    /// `kind=hard_example&state=unlabelled`); samples only.
    #[param(inline)]
    pub state: Option<LabelState>,
    /// At most this many records (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// Only records after this cursor: the `edgeloop-next-cursor` header
    /// of the previous page (absent when that page was the last).
    #[param(max_length = 1024)]
    pub after: Option<String>,
}

fn query(q: Result<Query<ReportQuery>, QueryRejection>) -> Result<ReportQuery, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    if q.after_sequence.is_some_and(|a| a < 0) {
        return Err(Error::bad_field("after_sequence", "must be at least 0"));
    }
    limit_of(q.limit, q.after.as_deref())?;
    Ok(q)
}

fn prefix(model: &str, q: &ReportQuery) -> String {
    match &q.version {
        Some(v) => format!("{model}/{v}/"),
        None => format!("{model}/"),
    }
}

fn keep(q: &ReportQuery, device: &str, sequence: u64) -> bool {
    q.device.as_deref().is_none_or(|d| d == device)
        && q.after_sequence
            .is_none_or(|after| u64::try_from(after).is_ok_and(|after| sequence > after))
}

/// A device's telemetry reports (summaries; sketches and samples are read
/// per model).
#[utoipa::path(get, path = "/api/v1/devices/{id}/telemetry", tag = "fleet",
    params(("id" = String, Path), ReportQuery),
    responses((status = 200, body = Vec<TelemetryRecord>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn device_telemetry(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
    q: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let q = query(q)?;
    members::get(&core.store, MemberKind::Device, &id)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let page = core.store.fleet.telemetry.page_after(
        &format!("{id}/"),
        q.after.as_deref(),
        limit,
        |_, r| keep(&q, &r.device, r.sequence),
    )?;
    Ok(page_of(page, limit, |(_, r)| r))
}

/// Drift sketches of a model (one per device, version and window).
#[utoipa::path(get, path = "/api/v1/models/{name}/sketches", tag = "registry",
    params(("name" = String, Path), ReportQuery),
    responses((status = 200, body = Vec<SketchRecord>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn model_sketches(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    q: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let q = query(q)?;
    models::get_model(&core.store.registry, &name)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let page = core.store.drift.sketches.page_after(
        &prefix(&name, &q),
        q.after.as_deref(),
        limit,
        |_, r| keep(&q, &r.device, r.sequence),
    )?;
    Ok(page_of(page, limit, |(_, r)| r))
}

/// Hard examples and labelled feedback of a model, with their inputs and
/// provenance (device, version, confidence, time), in key order.
#[utoipa::path(get, path = "/api/v1/models/{name}/samples", tag = "registry",
    params(("name" = String, Path), ReportQuery),
    responses((status = 200, body = Vec<SampleView>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn model_samples(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    q: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let q = query(q)?;
    models::get_model(&core.store.registry, &name)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let page = core.store.drift.samples.page_after(
        &prefix(&name, &q),
        q.after.as_deref(),
        limit,
        |_, r| keep(&q, &r.device, r.sequence) && labels::wanted(r, q.kind, q.state),
    )?;
    Ok(page_of(page, limit, |(k, r)| labels::view(&k, r)))
}

/// One sample, by the id a listing gave.
#[utoipa::path(get, path = "/api/v1/models/{name}/samples/{id}", tag = "registry",
    params(("name" = String, Path), ("id" = String, Path, description = "`<version>:<device>:<sequence>:<index>`")),
    responses((status = 200, body = SampleView), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model or sample")),
    security(("bearer" = [])))]
pub async fn model_sample(
    State(core): State<Arc<Core>>,
    ValidPath((name, id)): ValidPath<(String, String)>,
) -> Result<Json<SampleView>, Error> {
    models::get_model(&core.store.registry, &name)?;
    Ok(Json(labels::get(&core.store.drift, &name, &id)?))
}

/// Labels one sample (a relabel replaces the label); it goes into the next
/// retraining snapshot.
#[utoipa::path(post, path = "/api/v1/models/{name}/samples/{id}/label", tag = "registry",
    params(("name" = String, Path), ("id" = String, Path, description = "`<version>:<device>:<sequence>:<index>`")),
    request_body = SetLabel,
    responses((status = 200, body = SampleView), (status = 400, body = ErrorBody, description = "the label is not a class index"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model or sample")),
    security(("bearer" = [])))]
pub async fn label_sample(
    State(core): State<Arc<Core>>,
    Extension(by): Extension<Principal>,
    ValidPath((name, id)): ValidPath<(String, String)>,
    ValidJson(req): ValidJson<SetLabel>,
) -> Result<Json<SampleView>, Error> {
    models::get_model(&core.store.registry, &name)?;
    let labelled = labels::label(
        &core.store.drift,
        &name,
        &id,
        req.label,
        by.name(),
        core.now(),
    )?;
    core.store.flush().await?;
    Ok(Json(labelled))
}

/// Labels many samples at once, all or none (every id must name a sample
/// of the model, every label be a class index).
#[utoipa::path(post, path = "/api/v1/models/{name}/samples/labels", tag = "registry",
    params(("name" = String, Path)),
    request_body = SetLabels,
    responses((status = 200, body = LabelsSet), (status = 400, body = ErrorBody, description = "a bad id or label, named in `field`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model")),
    security(("bearer" = [])))]
pub async fn label_samples(
    State(core): State<Arc<Core>>,
    Extension(by): Extension<Principal>,
    ValidPath(name): ValidPath<String>,
    ValidJson(req): ValidJson<SetLabels>,
) -> Result<Json<LabelsSet>, Error> {
    models::get_model(&core.store.registry, &name)?;
    let labelled = labels::label_all(&core.store.drift, &name, &req.labels, by.name(), core.now())?;
    core.store.flush().await?;
    Ok(Json(LabelsSet { labelled }))
}

/// How many samples the model keeps and how many were dropped, oldest
/// first, for the per-model cap (`max_samples_per_model`).
#[utoipa::path(get, path = "/api/v1/models/{name}/samples/summary", tag = "registry",
    params(("name" = String, Path)),
    responses((status = 200, body = SampleSummary), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model")),
    security(("bearer" = [])))]
pub async fn sample_summary(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
) -> Result<Json<SampleSummary>, Error> {
    models::get_model(&core.store.registry, &name)?;
    let c = edgeloop_drift::retention::counts(&core.store.drift, &name)?;
    Ok(Json(SampleSummary {
        stored: c.stored,
        dropped: c.dropped,
        max_per_model: core.config.max_samples_per_model,
    }))
}
