//! The one place the console API authenticates and authorises: the route
//! is looked up in `auth::permissions::ROUTES` (a route missing there is
//! refused for everyone), the bearer token becomes a [`Principal`], the
//! role is checked against the route's permission (403), a path-scoped
//! target is checked against the token's projects (404, so a scoped token
//! cannot learn what other projects hold), and a state-changing call is
//! written to the audit log before it is answered.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Core;
use edgeloop_auth::permissions::{self, Permission, Rule};
use edgeloop_auth::{audit, tokens, Principal};
use edgeloop_errors::Error;

pub async fn authorize(State(core): State<Arc<Core>>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let Some(route) = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
    else {
        return Error::Internal(anyhow::anyhow!("authorize runs on matched routes only"))
            .into_response();
    };
    // HEAD is GET without the body (axum answers it from the GET handler).
    let rule = permissions::rule_for(&method, &route).or_else(|| {
        (method == Method::HEAD)
            .then(|| permissions::rule_for(&Method::GET, &route))
            .flatten()
    });
    let Some(rule) = rule else {
        let allowed = permissions::methods_for(&route);
        if allowed.is_empty() {
            // Fail closed: a route without a rule is a bug, not an open door.
            tracing::error!(%method, %route, "route has no permission rule; refused");
            return Error::PermissionDenied(format!("{method} {route} has no permission rule"))
                .into_response();
        }
        // A method the table does not list for a listed path: 405, as the
        // router would say, without running whatever the router has.
        return Error::MethodNotAllowed { allowed }.into_response();
    };
    if rule.permission == Permission::Public {
        return next.run(req).await;
    }
    let principal = match authenticate(&core, &req) {
        Ok(p) => p,
        Err(e) => {
            core.security
                .unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            return e.into_response();
        }
    };
    let target = req.uri().path().to_owned();
    let (mut req, verdict) = check(&core, rule, &principal, req).await;
    let response = match verdict {
        Err(e) => {
            if matches!(e, Error::PermissionDenied(_)) {
                core.security.forbidden.fetch_add(1, Ordering::Relaxed);
            }
            e.into_response()
        }
        Ok(()) => {
            req.extensions_mut().insert(principal.clone());
            next.run(req).await
        }
    };
    if changes_state(&method) {
        let call = audit::Call {
            token_id: &principal.token_id,
            token_name: &principal.token_name,
            method: method.as_str(),
            route: &route,
            target: &target,
            status: response.status().as_u16(),
        };
        if let Err(e) = audit::record(&core.store.auth, call, core.now()).await {
            // The change itself may already be durable; the caller must
            // not take silence for success, and the operator must see it.
            tracing::error!(error = %e, %method, %target, "audit log write failed");
            return Error::Unavailable(format!("audit log: {e}")).into_response();
        }
    }
    response
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn authenticate(core: &Core, req: &Request) -> Result<Principal, Error> {
    // The web console calls this API in-process for a logged-in session
    // (`console/api.rs`). Extensions are set only inside this process, so
    // no request from the network can carry one.
    if let Some(edgeloop_auth::ConsoleCaller(who)) = req.extensions().get() {
        return Ok(who.clone());
    }
    let presented = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            Error::Unauthenticated("missing bearer token (Authorization: Bearer <token>)".into())
        })?;
    if core.is_admin_token(presented) {
        return Ok(Principal::bootstrap_admin());
    }
    tokens::authenticate(&core.store.auth, presented, core.now())?
        .ok_or_else(|| Error::Unauthenticated("invalid, expired or revoked bearer token".into()))
}

async fn check(
    core: &Core,
    rule: &Rule,
    who: &Principal,
    req: Request,
) -> (Request, Result<(), Error>) {
    if !permissions::allows(who.role, rule.permission) {
        let refusal = Error::PermissionDenied(format!(
            "role {} may not {} {} (needs {})",
            who.role,
            rule.method,
            rule.path,
            rule.permission.as_str()
        ));
        return (req, Err(refusal));
    }
    if who.projects.is_none() {
        return (req, Ok(()));
    }
    super::scope::check_path_scope(core, rule.scope, who, req).await
}
