//! The console REST API under `/api/v1`, with bearer-token auth, plus
//! `/healthz`, `/readyz` and the generated OpenAPI document. Every route
//! goes through [`authorize`] (the route → permission table).

mod access;
mod aliases;
mod artifacts;
mod authorize;
mod benchmarks;
mod cost;
mod deployments;
mod drift;
mod fleet;
mod jobs;
pub mod json;
mod metrics;
mod models;
pub mod openapi;
pub(crate) mod paging;
mod pipelines;
pub mod scope;
mod telemetry;
mod triggers;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Core;
use edgeloop_errors::Error;

/// The console API and the web console (`/ui/`, which calls the API
/// in-process and is not behind `authorize`: it has its own sessions).
pub fn router(core: Arc<Core>) -> Router {
    api_router(core.clone()).merge(edgeloop_console::router(core.clone(), api_router(core)))
}

fn api_router(core: Arc<Core>) -> Router {
    Router::new()
        .route("/api/v1/api-tokens", post(access::create).get(access::list))
        .route("/api/v1/api-tokens/{id}", delete(access::revoke))
        .route("/api/v1/audit", get(access::list_audit))
        .route(
            "/api/v1/tokens",
            post(fleet::create_token).get(fleet::list_tokens),
        )
        .route("/api/v1/devices", get(fleet::list_devices))
        .route("/api/v1/devices/{id}", get(fleet::get_device))
        .route("/api/v1/devices/{id}/revoke", post(fleet::revoke_device))
        .route("/api/v1/devices/{id}/labels", put(fleet::set_device_labels))
        .route(
            "/api/v1/devices/{id}/telemetry",
            get(telemetry::device_telemetry),
        )
        .route("/api/v1/clusters", get(fleet::list_clusters))
        .route("/api/v1/clusters/{id}", get(fleet::get_cluster))
        .route("/api/v1/clusters/{id}/revoke", post(fleet::revoke_cluster))
        .route(
            "/api/v1/clusters/{id}/labels",
            put(fleet::set_cluster_labels),
        )
        .route(
            "/api/v1/artifacts/{digest}",
            put(artifacts::upload)
                .get(artifacts::download)
                .head(artifacts::head),
        )
        .route(
            "/api/v1/models",
            post(models::create_model).get(models::list_models),
        )
        .route("/api/v1/models/{name}", get(models::get_model))
        .route(
            "/api/v1/models/{name}/versions",
            post(models::create_version).get(models::list_versions),
        )
        .route(
            "/api/v1/models/{name}/versions/{version}",
            get(models::get_version),
        )
        .route(
            "/api/v1/models/{name}/versions/{version}/variants",
            post(models::add_variant),
        )
        .route("/api/v1/models/{name}/aliases", get(aliases::list))
        .route(
            "/api/v1/models/{name}/aliases/{alias}",
            put(aliases::set).get(aliases::show).delete(aliases::delete),
        )
        .route(
            "/api/v1/models/{name}/aliases/{alias}/history",
            get(aliases::history),
        )
        .route(
            "/api/v1/models/{name}/sketches",
            get(telemetry::model_sketches),
        )
        .route("/api/v1/models/{name}/drift", get(drift::model_drift))
        .route("/api/v1/models/{name}/cost", get(cost::model_cost))
        .route(
            "/api/v1/models/{name}/samples",
            get(telemetry::model_samples),
        )
        .route(
            "/api/v1/models/{name}/samples/labels",
            post(telemetry::label_samples),
        )
        .route(
            "/api/v1/models/{name}/samples/summary",
            get(telemetry::sample_summary),
        )
        .route(
            "/api/v1/models/{name}/samples/{id}",
            get(telemetry::model_sample),
        )
        .route(
            "/api/v1/models/{name}/samples/{id}/label",
            post(telemetry::label_sample),
        )
        .route(
            "/api/v1/deployments",
            post(deployments::create).get(deployments::list),
        )
        .route("/api/v1/deployments/{id}", get(deployments::show))
        .route("/api/v1/deployments/{id}/cancel", post(deployments::cancel))
        .route(
            "/api/v1/benchmarks",
            post(benchmarks::create).get(benchmarks::list),
        )
        .route("/api/v1/benchmarks/{id}", get(benchmarks::show))
        .route("/api/v1/jobs", post(jobs::create).get(jobs::list))
        .route("/api/v1/jobs/{id}", get(jobs::show))
        .route("/api/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route(
            "/api/v1/models/{name}/retraining",
            put(pipelines::put_config).get(pipelines::get_config),
        )
        .route("/api/v1/models/{name}/retrain", post(pipelines::retrain))
        .route(
            "/api/v1/models/{name}/triggers",
            put(triggers::put).get(triggers::get),
        )
        .route("/api/v1/pipelines", get(pipelines::list))
        .route("/api/v1/pipelines/{id}", get(pipelines::show))
        .route("/api/v1/pipelines/{id}/cancel", post(pipelines::cancel))
        .route("/api/v1/pipelines/{id}/signatures", post(pipelines::sign))
        .route("/api/v1/openapi.json", get(openapi::document))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::metrics))
        .route("/readyz", get(readyz))
        // A route layer: it runs only on matched routes, where the matched
        // path is known; the fallback's 404 needs no token.
        .route_layer(middleware::from_fn_with_state(
            core.clone(),
            authorize::authorize,
        ))
        .fallback(not_found)
        .with_state(core)
}

/// Serves the REST API until `shutdown`, then finishes in-flight requests.
pub async fn serve(
    core: Arc<Core>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(core))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

pub use edgeloop_auth::Principal;

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    pub status: &'static str,
    /// Readiness only: when the CA and the server certificate end (RFC
    /// 3339), and what needs doing about it within 30 days of either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificates: Option<CertificatesHealth>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct CertificatesHealth {
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub ca_expires_at: time::OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub server_certificate_expires_at: time::OffsetDateTime,
    pub warnings: Vec<String>,
}

/// What readiness says of the certificates at `now`.
fn certificates_health(core: &Core, now: time::OffsetDateTime) -> CertificatesHealth {
    use crate::fleet::pki::{validity, Validity};
    let (ca, server) = (core.pki.ca_not_after(), core.pki.server_not_after());
    let mut warnings = Vec::new();
    match validity(ca, now) {
        Validity::Valid => {}
        Validity::ExpiresSoon { days } => warnings.push(format!(
            "the CA expires in {days} days: after that no member certificate verifies and \
             nothing enrolls; plan a new PKI and re-enrollment"
        )),
        Validity::Expired => warnings.push(
            "the CA has expired: no member certificate verifies; a new PKI and re-enrollment \
             are needed"
                .into(),
        ),
    }
    match validity(server, now) {
        Validity::Valid => {}
        Validity::ExpiresSoon { days } => warnings.push(format!(
            "the server certificate expires in {days} days; a restart reissues it"
        )),
        Validity::Expired => {
            warnings.push("the server certificate has expired; a restart reissues it".into())
        }
    }
    CertificatesHealth {
        ca_expires_at: ca,
        server_certificate_expires_at: server,
        warnings,
    }
}

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok",
        certificates: None,
    })
}

/// Readiness: the store answers and the server is not shutting down.
#[utoipa::path(get, path = "/readyz", tag = "health", responses((status = 200, body = Health), (status = 503, body = edgeloop_errors::ErrorBody)))]
pub async fn readyz(State(core): State<Arc<Core>>) -> Result<Json<Health>, Error> {
    if core.shutdown.is_cancelled() {
        return Err(Error::Unavailable("shutting down".into()));
    }
    core.store
        .check()
        .map_err(|e| Error::Unavailable(format!("store: {e}")))?;
    // Certificates near their end are said, not refused: a restart of
    // this replica would not make it readier.
    Ok(Json(Health {
        status: "ready",
        certificates: Some(certificates_health(&core, core.now())),
    }))
}

async fn not_found(req: Request) -> Error {
    Error::not_found("route", req.uri().path().to_string())
}
