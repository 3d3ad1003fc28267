//! Device benchmarks: queue one (`POST`), follow it (`GET .../{id}`), list
//! them. The rules are in `fleet/benchmarks/`; the device side is the
//! agent's `WatchBenchmarks` / `ReportBenchmark`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::json::{ValidJson, ValidPath};
use super::Principal;
use crate::fleet::benchmarks;
use crate::Core;
use axum::Extension;
pub use edgeloop_api::benchmarks::{BenchmarkView, CreateBenchmark};
use edgeloop_errors::{Error, ErrorBody};

/// The newest benchmarks `GET /api/v1/benchmarks` lists.
const LIST_LIMIT: usize = 200;

/// Queues a benchmark of the given models on one device (named, or the
/// representative of a selector's class: online, seen most recently). The
/// device receives it over its agent channel, times each model as it would
/// serve it, and reports; poll `GET /api/v1/benchmarks/{id}`.
#[utoipa::path(post, path = "/api/v1/benchmarks", tag = "fleet", request_body = CreateBenchmark,
    responses((status = 201, body = BenchmarkView, description = "queued"),
        (status = 400, body = ErrorBody, description = "a bad field (named in `field`), a selector that does not parse, or both or neither of device and selector"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such device, or an artifact is not uploaded"),
        (status = 409, body = ErrorBody, description = "the device is revoked, or no online device matches the selector")),
    security(("bearer" = [])))]
pub async fn create(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    ValidJson(req): ValidJson<CreateBenchmark>,
) -> Result<(StatusCode, Json<BenchmarkView>), Error> {
    let record = benchmarks::create(&core, req, None, who.projects.as_ref()).await?;
    Ok((StatusCode::CREATED, Json(record.view())))
}

/// The newest benchmarks first (at most 200).
#[utoipa::path(get, path = "/api/v1/benchmarks", tag = "fleet",
    responses((status = 200, body = Vec<BenchmarkView>), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Vec<BenchmarkView>>, Error> {
    let mut out = Vec::new();
    for b in benchmarks::list(&core.store, core.now(), LIST_LIMIT)? {
        if super::scope::sees_device(&core, &who, &b.device)? {
            out.push(b.view());
        }
    }
    Ok(Json(out))
}

/// One benchmark: its state and, once succeeded, each model's timing.
#[utoipa::path(get, path = "/api/v1/benchmarks/{id}", tag = "fleet", params(("id" = String, Path)),
    responses((status = 200, body = BenchmarkView), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such benchmark")),
    security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<BenchmarkView>, Error> {
    Ok(Json(benchmarks::get(&core.store, &id, core.now())?.view()))
}
