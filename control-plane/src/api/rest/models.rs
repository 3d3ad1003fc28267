//! Models and model versions.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::json::ValidJson;
use crate::error::{Error, ErrorBody};
use crate::registry::models::{
    self, CreateModel, CreateModelVersion, ModelRecord, ModelVersionRecord,
};
use crate::Core;

#[utoipa::path(post, path = "/api/v1/models", tag = "registry", request_body = CreateModel,
    responses((status = 201, body = ModelRecord), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_model(
    State(core): State<Arc<Core>>,
    ValidJson(req): ValidJson<CreateModel>,
) -> Result<(StatusCode, Json<ModelRecord>), Error> {
    let model = models::create_model(&core.store, req, core.now()).await?;
    Ok((StatusCode::CREATED, Json(model)))
}

#[utoipa::path(get, path = "/api/v1/models", tag = "registry",
    responses((status = 200, body = Vec<ModelRecord>)), security(("bearer" = [])))]
pub async fn list_models(State(core): State<Arc<Core>>) -> Result<Json<Vec<ModelRecord>>, Error> {
    Ok(Json(core.store.models.values()?))
}

#[utoipa::path(get, path = "/api/v1/models/{name}", tag = "registry", params(("name" = String, Path)),
    responses((status = 200, body = ModelRecord), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_model(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
) -> Result<Json<ModelRecord>, Error> {
    Ok(Json(models::get_model(&core.store, &name)?))
}

/// Registers a version of a model. Its artifact must already be uploaded.
#[utoipa::path(post, path = "/api/v1/models/{name}/versions", tag = "registry", params(("name" = String, Path)),
    request_body = CreateModelVersion,
    responses((status = 201, body = ModelVersionRecord), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_version(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
    ValidJson(req): ValidJson<CreateModelVersion>,
) -> Result<(StatusCode, Json<ModelVersionRecord>), Error> {
    let version =
        models::create_version(&core.store, core.artifacts.as_ref(), &name, req, core.now())
            .await?;
    Ok((StatusCode::CREATED, Json(version)))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/versions", tag = "registry", params(("name" = String, Path)),
    responses((status = 200, body = Vec<ModelVersionRecord>), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_versions(
    State(core): State<Arc<Core>>,
    Path(name): Path<String>,
) -> Result<Json<Vec<ModelVersionRecord>>, Error> {
    Ok(Json(models::list_versions(&core.store, &name)?))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/versions/{version}", tag = "registry",
    params(("name" = String, Path), ("version" = String, Path)),
    responses((status = 200, body = ModelVersionRecord), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_version(
    State(core): State<Arc<Core>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<ModelVersionRecord>, Error> {
    Ok(Json(models::get_version(&core.store, &name, &version)?))
}
