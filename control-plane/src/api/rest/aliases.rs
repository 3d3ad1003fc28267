//! A model's aliases: set (create or move), list, show, delete, and the
//! history of every move. The rules are in `registry/aliases.rs`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};

use super::json::{ValidJson, ValidPath};
use super::Principal;
use crate::Core;
pub use edgeloop_api::aliases::{AliasHistoryView, AliasView};
use edgeloop_errors::validate;
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::aliases::{self, AliasRecord, SetAlias, SetOutcome};

/// The alias as it points now; an alias pointing nowhere (deleted) has no
/// such view, so it is a 404 where one is asked for.
fn view(r: AliasRecord) -> Result<AliasView, Error> {
    let version = r
        .version
        .ok_or_else(|| Error::not_found("alias", format!("{}@{}", r.model, r.alias)))?;
    Ok(AliasView {
        model: r.model,
        alias: r.alias,
        version,
        updated_at: r.updated_at,
        updated_by: r.updated_by,
    })
}

fn history_view(r: AliasRecord) -> AliasHistoryView {
    AliasHistoryView {
        model: r.model,
        alias: r.alias,
        version: r.version,
        history: r.history,
    }
}

/// Points an alias at a version of the model: creates it (201) or moves it
/// (200; also when it already pointed there, which records nothing). Every
/// move is kept in its history.
#[utoipa::path(put, operation_id = "set_alias", path = "/api/v1/models/{name}/aliases/{alias}", tag = "registry",
    params(("name" = String, Path, description = "the model"),
        ("alias" = String, Path, description = "lowercase letters, digits and '-', starting with a letter; not 'v' and a digit; never a version's name",
            pattern = "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")),
    request_body = SetAlias,
    responses((status = 201, body = AliasView, description = "created"),
        (status = 200, body = AliasView, description = "moved, or already pointing there"),
        (status = 400, body = ErrorBody, description = "bad alias name (field `alias`), version or reason"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model or version"),
        (status = 409, body = ErrorBody, description = "the model has a version of the alias's name")),
    security(("bearer" = [])))]
pub async fn set(
    State(core): State<Arc<Core>>,
    Extension(by): Extension<Principal>,
    ValidPath((name, alias)): ValidPath<(String, String)>,
    ValidJson(req): ValidJson<SetAlias>,
) -> Result<(StatusCode, Json<AliasView>), Error> {
    let alias = validate::alias("alias", &alias)?;
    let (record, outcome) = aliases::set(
        &core.store.registry,
        &name,
        &alias,
        req,
        by.name(),
        core.now(),
    )
    .await?;
    let status = match outcome {
        SetOutcome::Created => StatusCode::CREATED,
        SetOutcome::Moved | SetOutcome::Unchanged => StatusCode::OK,
    };
    Ok((status, Json(view(record)?)))
}

/// The model's aliases that point at a version, by name.
#[utoipa::path(get, path = "/api/v1/models/{name}/aliases", operation_id = "list_aliases", tag = "registry",
    params(("name" = String, Path, description = "the model")),
    responses((status = 200, body = Vec<AliasView>), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model")),
    security(("bearer" = [])))]
pub async fn list(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
) -> Result<Json<Vec<AliasView>>, Error> {
    let all = aliases::list(&core.store.registry, &name)?
        .into_iter()
        .map(view)
        .collect::<Result<_, _>>()?;
    Ok(Json(all))
}

/// The version an alias points at.
#[utoipa::path(get, path = "/api/v1/models/{name}/aliases/{alias}", operation_id = "show_alias", tag = "registry",
    params(("name" = String, Path, description = "the model"),
        ("alias" = String, Path, pattern = "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")),
    responses((status = 200, body = AliasView), (status = 400, body = ErrorBody, description = "bad alias name"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model, or the alias does not exist (or was deleted)")),
    security(("bearer" = [])))]
pub async fn show(
    State(core): State<Arc<Core>>,
    ValidPath((name, alias)): ValidPath<(String, String)>,
) -> Result<Json<AliasView>, Error> {
    let alias = validate::alias("alias", &alias)?;
    Ok(Json(view(aliases::get_current(
        &core.store.registry,
        &name,
        &alias,
    )?)?))
}

/// Deletes an alias. Its history is kept (`.../history`), ending with the
/// deletion.
#[utoipa::path(delete, operation_id = "delete_alias", path = "/api/v1/models/{name}/aliases/{alias}", tag = "registry",
    params(("name" = String, Path, description = "the model"),
        ("alias" = String, Path, pattern = "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")),
    responses((status = 204, description = "deleted"), (status = 400, body = ErrorBody, description = "bad alias name"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model, or the alias does not exist (or was deleted)")),
    security(("bearer" = [])))]
pub async fn delete(
    State(core): State<Arc<Core>>,
    Extension(by): Extension<Principal>,
    ValidPath((name, alias)): ValidPath<(String, String)>,
) -> Result<StatusCode, Error> {
    let alias = validate::alias("alias", &alias)?;
    aliases::delete(&core.store.registry, &name, &alias, by.name(), core.now()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every move of an alias, oldest first (who, when, from, to, why), and
/// where it points now; a deleted alias still has its history.
#[utoipa::path(get, path = "/api/v1/models/{name}/aliases/{alias}/history", operation_id = "alias_history", tag = "registry",
    params(("name" = String, Path, description = "the model"),
        ("alias" = String, Path, pattern = "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")),
    responses((status = 200, body = AliasHistoryView), (status = 400, body = ErrorBody, description = "bad alias name"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such model, or the alias never existed")),
    security(("bearer" = [])))]
pub async fn history(
    State(core): State<Arc<Core>>,
    ValidPath((name, alias)): ValidPath<(String, String)>,
) -> Result<Json<AliasHistoryView>, Error> {
    let alias = validate::alias("alias", &alias)?;
    Ok(Json(history_view(aliases::get(
        &core.store.registry,
        &name,
        &alias,
    )?)))
}
