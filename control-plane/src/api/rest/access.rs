//! API tokens (`/api/v1/api-tokens`) and the audit log (`/api/v1/audit`).
//! Both are admin-only (see `auth::permissions::ROUTES`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;

use super::json::{ValidJson, ValidPath};
use crate::Core;
use edgeloop_api::access::{ApiTokenView, AuditEntry, CreateApiToken, CreatedApiToken};
use edgeloop_auth::{audit, tokens, Principal};
use edgeloop_errors::{Error, ErrorBody};

/// Creates an API token; the answer holds its secret, shown only this once.
#[utoipa::path(post, path = "/api/v1/api-tokens", tag = "access", request_body = CreateApiToken,
    responses((status = 201, body = CreatedApiToken), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(core): State<Arc<Core>>,
    Extension(by): Extension<Principal>,
    ValidJson(req): ValidJson<CreateApiToken>,
) -> Result<(StatusCode, Json<CreatedApiToken>), Error> {
    let created = tokens::create(
        &core.store.auth,
        &by,
        req,
        core.pki.ca_fingerprint(),
        core.now(),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Lists API tokens, oldest first, never their secrets.
#[utoipa::path(get, path = "/api/v1/api-tokens", tag = "access",
    responses((status = 200, body = Vec<ApiTokenView>), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(core): State<Arc<Core>>) -> Result<Json<Vec<ApiTokenView>>, Error> {
    Ok(Json(tokens::list(&core.store.auth, core.now())?))
}

/// Revokes an API token; its next request is refused.
#[utoipa::path(delete, path = "/api/v1/api-tokens/{id}", tag = "access",
    params(("id" = String, Path, description = "the token's id, `k-<n>`")),
    responses((status = 200, body = ApiTokenView), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn revoke(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<ApiTokenView>, Error> {
    Ok(Json(
        tokens::revoke(&core.store.auth, &id, core.now()).await?,
    ))
}

pub const DEFAULT_AUDIT_LIMIT: usize = 100;
pub const MAX_AUDIT_LIMIT: usize = 1000;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only entries older than this sequence: the next page starts at the
    /// last entry's `seq`.
    #[param(minimum = 0)]
    pub before: Option<i64>,
    /// Only this token's calls.
    pub token_id: Option<String>,
    /// At most this many (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "access", params(AuditQuery),
    responses((status = 200, body = Vec<AuditEntry>), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_audit(
    State(core): State<Arc<Core>>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<Vec<AuditEntry>>, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    let before = match q.before {
        Some(b) if b < 0 => return Err(Error::bad_field("before", "must be at least 0")),
        b => b.map(|b| b as u64),
    };
    let limit = q.limit.unwrap_or(DEFAULT_AUDIT_LIMIT);
    if !(1..=MAX_AUDIT_LIMIT).contains(&limit) {
        return Err(Error::bad_field(
            "limit",
            format!("must be 1 to {MAX_AUDIT_LIMIT}"),
        ));
    }
    let store = core.store.clone();
    let token = q.token_id;
    // The scan may read many pages when a filter matches rarely.
    let entries = tokio::task::spawn_blocking(move || {
        audit::list(&store.auth, before, token.as_deref(), limit)
    })
    .await
    .map_err(|e| Error::Internal(e.into()))??;
    Ok(Json(entries))
}
