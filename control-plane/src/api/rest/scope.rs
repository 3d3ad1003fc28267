//! Project scoping for tokens limited to projects. A target in a project
//! the token does not see answers exactly what a missing one does (404),
//! so a scoped token learns nothing about other projects' names.

use axum::extract::Request;

use crate::fleet::members::MemberKind;
use crate::Core;
use edgeloop_auth::permissions::Scope;
use edgeloop_auth::Principal;
use edgeloop_errors::{Error, Result};
use edgeloop_registry::models;

/// The path parameter the router matched, by name.
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Checks a path-scoped route's target against `who`'s projects before the
/// handler runs. A target that does not exist is left to the handler (its
/// 404 names it the same way).
pub async fn check_path_scope(
    core: &Core,
    scope: Scope,
    who: &Principal,
    req: Request,
) -> (Request, Result<()>) {
    let (mut parts, body) = req.into_parts();
    let params = match axum::extract::RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(p) => p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>(),
        Err(_) => Vec::new(),
    };
    let req = Request::from_parts(parts, body);
    let result = resolve(core, scope, &params).and_then(|found| match found {
        Some((project, hidden)) if !who.sees(&project) => Err(hidden),
        _ => Ok(()),
    });
    (req, result)
}

use axum::extract::FromRequestParts as _;

/// The target's project, and the 404 to answer when it is out of scope.
fn resolve(
    core: &Core,
    scope: Scope,
    params: &[(String, String)],
) -> Result<Option<(String, Error)>> {
    let store = &core.store;
    let id = || param(params, "id").unwrap_or_default();
    Ok(match scope {
        Scope::Global | Scope::Handler => None,
        Scope::Model => {
            let name = param(params, "name").unwrap_or_default();
            store
                .registry
                .models
                .get(name)?
                .map(|m| (m.project, Error::not_found("model", name)))
        }
        Scope::Device => store
            .fleet
            .members(MemberKind::Device)
            .get(id())?
            .map(|m| (m.project, Error::not_found("device", id()))),
        Scope::Job => store
            .lifecycle
            .jobs
            .get(id())?
            .map(|j| (j.project, Error::not_found("job", id()))),
        Scope::Deployment => match store.fleet.deployments.get(id())? {
            Some(d) => Some((
                model_project(core, &d.deployment.model)?,
                Error::not_found("deployment", id()),
            )),
            None => None,
        },
        Scope::Pipeline => match store.lifecycle.pipelines.get(id())? {
            Some(p) => Some((
                model_project(core, &p.model)?,
                Error::not_found("pipeline", id()),
            )),
            None => None,
        },
        Scope::Benchmark => match store.fleet.benchmarks.get(id())? {
            Some(b) => Some((
                device_project(core, &b.device)?,
                Error::not_found("benchmark", id()),
            )),
            None => None,
        },
    })
}

fn model_project(core: &Core, model: &str) -> Result<String> {
    models::project_or_default(&core.store.registry, model)
}

fn device_project(core: &Core, device: &str) -> Result<String> {
    Ok(core
        .store
        .fleet
        .members(MemberKind::Device)
        .get(device)?
        .map(|m| m.project)
        .unwrap_or_else(edgeloop_api::access::default_project))
}

/// For list handlers: whether `who` sees records of model `name`.
pub fn sees_model(core: &Core, who: &Principal, name: &str) -> Result<bool> {
    Ok(who.projects.is_none() || who.sees(&model_project(core, name)?))
}

/// For list handlers: whether `who` sees device `id`'s records.
pub fn sees_device(core: &Core, who: &Principal, id: &str) -> Result<bool> {
    Ok(who.projects.is_none() || who.sees(&device_project(core, id)?))
}
