//! The OpenAPI document, generated from the handlers' annotations.

use std::collections::BTreeMap;

use axum::Json;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, ObjectBuilder, Ref, RefOr, ResponseBuilder, Schema, Type};
use utoipa::{Modify, OpenApi};

use super::{
    access, aliases, artifacts, benchmarks, cost, deployments, drift, fleet, jobs, metrics, models,
    pipelines, telemetry, triggers,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Edgeloop console API", description = "Models, artifacts, devices and clusters."),
    paths(
        super::healthz,
        super::readyz,
        metrics::metrics,
        access::create,
        access::list,
        access::revoke,
        access::list_audit,
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
        telemetry::model_sample,
        telemetry::label_sample,
        telemetry::label_samples,
        telemetry::sample_summary,
        drift::model_drift,
        cost::model_cost,
        deployments::create,
        deployments::list,
        deployments::show,
        deployments::cancel,
        benchmarks::create,
        benchmarks::list,
        benchmarks::show,
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
        pipelines::sign,
        triggers::put,
        triggers::get,
    ),
    modifiers(&BearerAuth, &CommonResponses),
    tags((name = "access"), (name = "fleet"), (name = "registry"), (name = "loop"), (name = "health"))
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

/// The rules every route shares, written once here rather than in each
/// handler's annotation, where one would be forgotten:
/// - operation ids are unique (handlers in different modules share names
///   such as `list`; OpenAPI requires unique ids);
/// - path parameters with a validated name get the rule the handler checks
///   (`name` is always a model, `version` a model version, `alias` an
///   alias, `digest` a sha256);
/// - the bearer layer answers 401 and 403 on every secured route; a route
///   with a JSON body answers 400 (malformed or invalid: `ValidJson`) and
///   413 (over `max_json_bytes`); a route with parameters answers 400 (our
///   `ValidPath` and query rejections).
struct CommonResponses;

const NAME_PATTERN: &str = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$";
use edgeloop_api::aliases::ALIAS_PATTERN;
/// `Digest`'s rule: lowercase hex, optionally `sha256:`-prefixed (OCI style).
pub const DIGEST_PATTERN: &str = "^(sha256:)?[0-9a-f]{64}$";

fn path_rule(name: &str) -> Option<Schema> {
    let (pattern, min, max, description) = match name {
        "name" => (NAME_PATTERN, 1, 63, edgeloop_models::names::NAME_RULE),
        "version" => (
            edgeloop_api::registry::VERSION_PATTERN,
            1,
            64,
            edgeloop_api::registry::VERSION_RULE,
        ),
        "alias" => (ALIAS_PATTERN, 1, 63, edgeloop_api::aliases::ALIAS_RULE),
        "digest" => (DIGEST_PATTERN, 64, 71, "sha256, 64 lowercase hex"),
        _ => return None,
    };
    Some(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(pattern))
            .min_length(Some(min))
            .max_length(Some(max))
            .description(Some(description))
            .into(),
    )
}

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .into()
}

fn add_response(op: &mut Operation, status: &str, description: &str) {
    op.responses
        .responses
        .entry(status.to_string())
        .or_insert_with(|| error_response(description));
}

impl Modify for CommonResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for item in openapi.paths.paths.values() {
            for op in item_operations(item) {
                if let Some(id) = &op.operation_id {
                    *seen.entry(id.clone()).or_default() += 1;
                }
            }
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            let slug: String = path
                .trim_start_matches("/api/v1/")
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            for (method, op) in item_operations_mut(item) {
                if op
                    .operation_id
                    .as_ref()
                    .is_some_and(|id| seen.get(id).copied().unwrap_or(0) > 1)
                {
                    op.operation_id = Some(format!("{method}_{}", slug.trim_matches('_')));
                }
                let mut has_params = false;
                for param in op.parameters.iter_mut().flatten() {
                    has_params = true;
                    if matches!(param.parameter_in, ParameterIn::Path) {
                        if let Some(rule) = path_rule(&param.name) {
                            param.schema = Some(rule.into());
                        }
                    }
                }
                let json_body = op
                    .request_body
                    .as_ref()
                    .is_some_and(|b| b.content.contains_key("application/json"));
                if op.security.is_some() {
                    add_response(
                        op,
                        "401",
                        "missing, unknown, expired or revoked bearer token",
                    );
                    add_response(
                        op,
                        "403",
                        "the token's role lacks the route's permission (see docs/security.md)",
                    );
                }
                if json_body || has_params {
                    add_response(
                        op,
                        "400",
                        "a malformed or invalid request; `field` names what is wrong",
                    );
                }
                if json_body {
                    add_response(op, "413", "the body is over the JSON size limit");
                }
            }
        }
    }
}

fn item_operations(item: &utoipa::openapi::PathItem) -> impl Iterator<Item = &Operation> {
    [
        &item.get,
        &item.put,
        &item.post,
        &item.delete,
        &item.head,
        &item.patch,
    ]
    .into_iter()
    .flatten()
}

fn item_operations_mut(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", &mut item.get),
        ("put", &mut item.put),
        ("post", &mut item.post),
        ("delete", &mut item.delete),
        ("head", &mut item.head),
        ("patch", &mut item.patch),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_mut().map(|op| (m, op)))
}

/// `GET /api/v1/openapi.json`
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The table and the OpenAPI document (generated from the handlers)
    /// name the same operations: a handler added to the document without
    /// a rule fails here, and the router refuses it at run time.
    #[test]
    fn every_documented_route_has_a_rule_and_back() {
        use utoipa::OpenApi as _;
        let doc = ApiDoc::openapi();
        let mut documented = BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                ("GET", &item.get),
                ("PUT", &item.put),
                ("POST", &item.post),
                ("DELETE", &item.delete),
                ("HEAD", &item.head),
                ("PATCH", &item.patch),
            ] {
                if op.is_some() {
                    documented.insert((method.to_string(), path.clone()));
                }
            }
        }
        // The document does not list itself.
        let tabled: BTreeSet<_> = edgeloop_auth::permissions::ROUTES
            .iter()
            .filter(|r| r.path != "/api/v1/openapi.json")
            .map(|r| (r.method.as_str().to_string(), r.path.to_string()))
            .collect();
        let missing: Vec<_> = documented.difference(&tabled).collect();
        let extra: Vec<_> = tabled.difference(&documented).collect();
        assert!(missing.is_empty(), "documented without a rule: {missing:?}");
        assert!(extra.is_empty(), "ruled but not documented: {extra:?}");
    }
}
