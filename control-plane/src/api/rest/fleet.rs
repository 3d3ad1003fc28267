//! Tokens, devices and clusters.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::json::{OptionalJson, ValidJson, ValidPath};
use super::paging::{limit_of, page_of};
use super::Principal;
use crate::fleet::members::{self, CreateToken, CreatedToken, MemberKind, MemberView, TokenView};
use crate::fleet::selector::{self, Selector};
use crate::Core;
use axum::Extension;
use edgeloop_errors::{Error, ErrorBody};

/// Creates a one-time bootstrap token for a device or a cluster bridge.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "fleet", request_body = CreateToken,
    responses((status = 201, body = CreatedToken), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_token(
    State(core): State<Arc<Core>>,
    ValidJson(req): ValidJson<CreateToken>,
) -> Result<(StatusCode, Json<CreatedToken>), Error> {
    let created = members::create_token(&core.store, &core.pki, req, core.now()).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Lists bootstrap tokens (never their secrets).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "fleet",
    responses((status = 200, body = Vec<TokenView>), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_tokens(State(core): State<Arc<Core>>) -> Result<Json<Vec<TokenView>>, Error> {
    let now = core.now();
    let tokens = core
        .store
        .fleet
        .tokens
        .values()?
        .into_iter()
        .map(|t| members::token_view(t, now))
        .collect();
    Ok(Json(tokens))
}

fn list(core: &Core, kind: MemberKind) -> Result<Json<Vec<MemberView>>, Error> {
    let now = core.now();
    let window = core.offline_after();
    let views = core
        .store
        .fleet
        .members(kind)
        .values()?
        .into_iter()
        .map(|m| members::member_view(m, now, window))
        .collect();
    Ok(Json(views))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeviceQuery {
    /// A label selector, e.g. `site=berlin,edgeloop.io/provider=CUDAExecutionProvider`
    /// (`=`, `!=`, `in (..)`, `notin (..)`, `key`, `!key`; reported capabilities
    /// under `edgeloop.io/arch|os|agent-version|provider|gpu`).
    pub selector: Option<String>,
    /// Devices after this id: the previous page's `edgeloop-next-cursor`.
    pub after: Option<String>,
    /// At most this many devices (1 to 1000); without it, every device.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// `serving`: each device with what it serves per model and its last
    /// telemetry report (reads per device: use it with a `limit`).
    #[param(inline)]
    pub include: Option<Include>,
}

/// What a device listing adds to each device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Include {
    Serving,
}

fn show(core: &Core, kind: MemberKind, id: &str) -> Result<Json<MemberView>, Error> {
    let member = members::get(&core.store, kind, id)?;
    let mut view = members::member_view(member, core.now(), core.offline_after());
    if kind == MemberKind::Device {
        with_serving(core, std::slice::from_mut(&mut view))?;
    }
    Ok(Json(view))
}

/// Fills in what each device serves and its last telemetry report.
fn with_serving(core: &Core, views: &mut [MemberView]) -> Result<(), Error> {
    let ids: Vec<&str> = views.iter().map(|v| v.id.as_str()).collect();
    let found = crate::fleet::serving::serving_of(&core.store, &ids)?;
    for (v, (serving, seen)) in views.iter_mut().zip(found) {
        v.serving = Some(serving);
        v.telemetry = seen;
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// Why, for the audit trail.
    /// At most 1024 bytes.
    #[serde(default)]
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
}

pub use edgeloop_api::fleet::LabelsRequest;

async fn revoke(
    core: &Core,
    kind: MemberKind,
    id: &str,
    req: RevokeRequest,
) -> Result<Json<MemberView>, Error> {
    let member =
        members::revoke(&core.store, &core.events, kind, id, req.reason, core.now()).await?;
    Ok(Json(members::member_view(
        member,
        core.now(),
        core.offline_after(),
    )))
}

async fn set_labels(
    core: &Core,
    kind: MemberKind,
    id: &str,
    req: LabelsRequest,
) -> Result<Json<MemberView>, Error> {
    let member = members::set_labels(&core.store, kind, id, req.labels).await?;
    Ok(Json(members::member_view(
        member,
        core.now(),
        core.offline_after(),
    )))
}

/// Lists devices with their online/offline status, last-seen time and
/// reported capabilities; `selector` picks a group. With `limit`, one page
/// in id order, read by key range from `after` (filters applied on the
/// way), and the next page's cursor in `edgeloop-next-cursor` when full.
#[utoipa::path(get, path = "/api/v1/devices", tag = "fleet", params(DeviceQuery),
    responses((status = 200, body = Vec<MemberView>,
        headers(("edgeloop-next-cursor" = String, description = "the next page's `after`, when this page is full"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_devices(
    State(core): State<Arc<Core>>,
    Extension(who): Extension<Principal>,
    q: Result<Query<DeviceQuery>, QueryRejection>,
) -> Result<axum::response::Response, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    let selector: Selector = q.selector.as_deref().unwrap_or("").parse()?;
    let limit = limit_of(q.limit, q.after.as_deref())?;
    let page = core
        .store
        .fleet
        .devices
        .page_after("", q.after.as_deref(), limit, |_, m| {
            who.sees(&m.project) && selector.matches(&selector::facts(&m.labels, &m.capabilities))
        })?;
    let (now, window) = (core.now(), core.offline_after());
    if q.include == Some(Include::Serving) {
        let (keys, mut views): (Vec<String>, Vec<MemberView>) = page
            .into_iter()
            .map(|(k, m)| (k, members::member_view(m, now, window)))
            .unzip();
        with_serving(&core, &mut views)?;
        return Ok(page_of(
            keys.into_iter().zip(views).collect(),
            limit,
            |(_, v)| v,
        ));
    }
    Ok(page_of(page, limit, |(_, m)| {
        members::member_view(m, now, window)
    }))
}

#[utoipa::path(get, path = "/api/v1/devices/{id}", tag = "fleet", params(("id" = String, Path)),
    responses((status = 200, body = MemberView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_device(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<MemberView>, Error> {
    show(&core, MemberKind::Device, &id)
}

/// Revokes a device: its certificate is refused from its next call on.
#[utoipa::path(post, path = "/api/v1/devices/{id}/revoke", tag = "fleet", params(("id" = String, Path)),
    request_body(content = Option<RevokeRequest>, description = "optional; an empty body is allowed"),
    responses((status = 200, body = MemberView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn revoke_device(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
    OptionalJson(req): OptionalJson<RevokeRequest>,
) -> Result<Json<MemberView>, Error> {
    revoke(&core, MemberKind::Device, &id, req).await
}

#[utoipa::path(put, path = "/api/v1/devices/{id}/labels", tag = "fleet", params(("id" = String, Path)),
    request_body = LabelsRequest,
    responses((status = 200, body = MemberView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn set_device_labels(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
    ValidJson(req): ValidJson<LabelsRequest>,
) -> Result<Json<MemberView>, Error> {
    set_labels(&core, MemberKind::Device, &id, req).await
}

/// Lists cluster bridges with their online/offline status and last-seen time.
#[utoipa::path(get, path = "/api/v1/clusters", tag = "fleet",
    responses((status = 200, body = Vec<MemberView>), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_clusters(State(core): State<Arc<Core>>) -> Result<Json<Vec<MemberView>>, Error> {
    list(&core, MemberKind::Cluster)
}

#[utoipa::path(get, path = "/api/v1/clusters/{id}", tag = "fleet", params(("id" = String, Path)),
    responses((status = 200, body = MemberView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_cluster(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
) -> Result<Json<MemberView>, Error> {
    show(&core, MemberKind::Cluster, &id)
}

#[utoipa::path(post, path = "/api/v1/clusters/{id}/revoke", tag = "fleet", params(("id" = String, Path)),
    request_body(content = Option<RevokeRequest>, description = "optional; an empty body is allowed"),
    responses((status = 200, body = MemberView), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn revoke_cluster(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
    OptionalJson(req): OptionalJson<RevokeRequest>,
) -> Result<Json<MemberView>, Error> {
    revoke(&core, MemberKind::Cluster, &id, req).await
}

#[utoipa::path(put, path = "/api/v1/clusters/{id}/labels", tag = "fleet", params(("id" = String, Path)),
    request_body = LabelsRequest,
    responses((status = 200, body = MemberView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn set_cluster_labels(
    State(core): State<Arc<Core>>,
    ValidPath(id): ValidPath<String>,
    ValidJson(req): ValidJson<LabelsRequest>,
) -> Result<Json<MemberView>, Error> {
    set_labels(&core, MemberKind::Cluster, &id, req).await
}
