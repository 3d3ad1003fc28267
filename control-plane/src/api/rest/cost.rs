//! `GET /api/v1/models/{name}/cost`: what serving the model's measured
//! traffic costs a month at the edge versus in the cloud
//! (`fleet::cost`, `docs/cost.md`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;

use super::json::ValidPath;
use crate::fleet::cost::{self, Observation};
use crate::Core;
pub use edgeloop_api::cost::CostView;
use edgeloop_errors::validate;
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::models;

pub const DEFAULT_DAYS: i64 = 30;
/// Agents keep telemetry for about this long anyway, and a longer look
/// back would scan more of the store for one answer.
pub const MAX_DAYS: i64 = 90;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CostQuery {
    /// Only this version's traffic (default: every version's).
    #[param(
        pattern = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
        min_length = 1,
        max_length = 64
    )]
    pub version: Option<String>,
    /// Days of telemetry to measure, back from now (default 30, 1 to 90).
    #[param(minimum = 1, maximum = 90)]
    pub days: Option<i64>,
}

/// The monthly cost of the model's measured traffic: edge (power and
/// amortized hardware of the devices serving it) against cloud instances
/// and serverless.
#[utoipa::path(get, path = "/api/v1/models/{name}/cost", tag = "registry",
    params(("name" = String, Path), CostQuery),
    responses((status = 200, body = CostView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn model_cost(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    q: Result<Query<CostQuery>, QueryRejection>,
) -> Result<Json<CostView>, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    let days = q.days.unwrap_or(DEFAULT_DAYS);
    if !(1..=MAX_DAYS).contains(&days) {
        return Err(Error::bad_field("days", format!("must be 1 to {MAX_DAYS}")));
    }
    if let Some(v) = &q.version {
        validate::version("version", v)?;
    }
    models::get_model(&core.store.registry, &name)?;
    if let Some(v) = &q.version {
        models::get_version(&core.store.registry, &name, v)?;
    }
    // Whole seconds: the period's start is shown to people.
    let now = core.now();
    let since = now - time::Duration::days(days);
    let since = since.replace_nanosecond(0).unwrap_or(since);
    // Telemetry is keyed by device and sequence, not by model: every
    // report is read once and its models filtered here.
    let mut observations = vec![];
    for (_, r) in core.store.fleet.telemetry.scan_prefix("")? {
        // A report cannot end after it arrived: a device clock running
        // ahead must not stretch the measured period.
        let end = r
            .window_end
            .or(r.recorded_at)
            .unwrap_or(r.received_at)
            .min(r.received_at);
        if end < since {
            continue;
        }
        let start = r.window_start.unwrap_or(end).min(end);
        for m in &r.models {
            if m.model_name != name || q.version.as_ref().is_some_and(|v| *v != m.model_version) {
                continue;
            }
            observations.push(Observation {
                device: r.device.clone(),
                start,
                end,
                requests: m.requests,
                errors: m.errors,
                latency_p50_ms: m.latency_p50_ms,
                latency_p99_ms: m.latency_p99_ms,
            });
        }
    }
    let traffic = cost::traffic(&observations);
    let prices = core.config.cost;
    let estimate = cost::estimate(&traffic, &prices);
    Ok(Json(CostView {
        model: name,
        version: q.version,
        days,
        since,
        prices,
        traffic,
        estimate,
    }))
}
