//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{
    aliases, artifacts, cost, deployments, drift, fleet, jobs, metrics, models, pipelines,
    telemetry, triggers,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Edgeloop console API", description = "Models, artifacts, devices and clusters."),
    paths(
        super::healthz,
        super::readyz,
        metrics::metrics,
        fleet::create_token,
        fleet::list_tokens,
        fleet::list_devices,
        fleet::get_device,
        fleet::revoke_device,
        fleet::set_device_labels,
        telemetry::device_telemetry,
        fleet::list_clusters,
        fleet::get_cluster,
        fleet::revoke_cluster,
        fleet::set_cluster_labels,
        artifacts::upload,
        artifacts::download,
        artifacts::head,
        models::create_model,
        models::list_models,
        models::get_model,
        models::create_version,
        models::list_versions,
        models::get_version,
        models::add_variant,
        aliases::set,
        aliases::list,
        aliases::show,
        aliases::delete,
        aliases::history,
        telemetry::model_sketches,
        telemetry::model_samples,
        drift::model_drift,
        cost::model_cost,
        deployments::create,
        deployments::list,
        deployments::show,
        deployments::cancel,
        jobs::create,
        jobs::list,
        jobs::show,
        jobs::cancel,
        pipelines::put_config,
        pipelines::get_config,
        pipelines::retrain,
        pipelines::list,
        pipelines::show,
        pipelines::cancel,
        triggers::put,
        triggers::get,
    ),
    modifiers(&BearerAuth),
    tags((name = "fleet"), (name = "registry"), (name = "loop"), (name = "health"))
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `GET /api/v1/openapi.json`
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
