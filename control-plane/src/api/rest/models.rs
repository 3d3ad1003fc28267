//! Models and model versions.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::json::{ValidJson, ValidPath};
use super::Principal;
use crate::Core;
use axum::Extension;
pub use edgeloop_api::registry::{ModelVersionView, ModelView};
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::models::{self, CreateModel, CreateModelVersion, CreateVariant};

#[utoipa::path(post, path = "/api/v1/models", tag = "registry", request_body = CreateModel,
    responses((status = 201, body = ModelView), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_model(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    ValidJson(req): ValidJson<CreateModel>,
) -> Result<(StatusCode, Json<ModelView>), Error> {
    who.may_create_in(
        req.project
            .as_deref()
            .unwrap_or(edgeloop_api::access::DEFAULT_PROJECT),
    )?;
    let model = models::create_model(&core.store.registry, req, core.now()).await?;
    Ok((StatusCode::CREATED, Json(model.into())))
}

#[utoipa::path(get, path = "/api/v1/models", tag = "registry",
    responses((status = 200, body = Vec<ModelView>)), security(("bearer" = [])))]
pub async fn list_models(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Vec<ModelView>>, Error> {
    Ok(Json(
        core.store
            .registry
            .models
            .values()?
            .into_iter()
            .filter(|m| who.sees(&m.project))
            .map(ModelView::from)
            .collect(),
    ))
}

#[utoipa::path(get, path = "/api/v1/models/{name}", tag = "registry", params(("name" = String, Path)),
    responses((status = 200, body = ModelView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_model(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
) -> Result<Json<ModelView>, Error> {
    Ok(Json(models::get_model(&core.store.registry, &name)?.into()))
}

/// Registers a version of a model. Its artifact must already be uploaded.
#[utoipa::path(post, path = "/api/v1/models/{name}/versions", tag = "registry", params(("name" = String, Path)),
    request_body = CreateModelVersion,
    responses((status = 201, body = ModelVersionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_version(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    ValidJson(mut req): ValidJson<CreateModelVersion>,
) -> Result<(StatusCode, Json<ModelVersionView>), Error> {
    if let Some(lineage) = req.lineage.take() {
        req.lineage = Some(crate::lifecycle::jobs::lineage_with_image(
            &core.store,
            lineage,
        )?);
    }
    let version = models::create_version(
        &core.store.registry,
        core.artifacts.as_ref(),
        &name,
        req,
        core.now(),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(version.into())))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/versions", tag = "registry", params(("name" = String, Path)),
    responses((status = 200, body = Vec<ModelVersionView>), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_versions(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
) -> Result<Json<Vec<ModelVersionView>>, Error> {
    Ok(Json(
        models::list_versions(&core.store.registry, &name)?
            .into_iter()
            .map(ModelVersionView::from)
            .collect(),
    ))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/versions/{version}", tag = "registry",
    params(("name" = String, Path), ("version" = String, Path)),
    responses((status = 200, body = ModelVersionView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_version(
    State(core): State<Arc<Core>>,
    ValidPath((name, version)): ValidPath<(String, String)>,
) -> Result<Json<ModelVersionView>, Error> {
    Ok(Json(
        models::get_version(&core.store.registry, &name, &version)?.into(),
    ))
}

/// Adds a variant of a version for a class of hardware: a signed artifact
/// with the same interface, for devices that have one of its providers.
#[utoipa::path(post, path = "/api/v1/models/{name}/versions/{version}/variants", tag = "registry",
    params(("name" = String, Path), ("version" = String, Path)),
    request_body = CreateVariant,
    responses((status = 201, body = ModelVersionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn add_variant(
    State(core): State<Arc<Core>>,
    ValidPath((name, version)): ValidPath<(String, String)>,
    ValidJson(req): ValidJson<CreateVariant>,
) -> Result<(StatusCode, Json<ModelVersionView>), Error> {
    let v = models::add_variant(
        &core.store.registry,
        core.artifacts.as_ref(),
        &name,
        &version,
        req,
        core.now(),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(v.into())))
}
