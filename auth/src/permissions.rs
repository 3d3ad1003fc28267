//! The one table from console route to permission, and which roles hold
//! each permission. The REST layer looks every request up here; a route
//! missing from the table is refused for everyone (fail closed), and a test
//! checks that the table and the OpenAPI document name the same routes.

use edgeloop_api::access::Role;
use http::Method;

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// No token: health, readiness, metrics, the OpenAPI document.
    Public,
    /// Any valid token.
    Read,
    /// Models, versions, variants, aliases, deployments, benchmarks,
    /// devices' labels.
    Deploy,
    /// Jobs, retraining policies and triggers, pipelines, sample labels.
    Train,
    /// Storing artifact bytes: both deployers (a pushed model) and
    /// trainers (datasets) need it.
    UploadArtifact,
    /// API and bootstrap tokens, revocation, clusters' labels, the audit log.
    Admin,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Public => "public",
            Permission::Read => "read",
            Permission::Deploy => "deploy",
            Permission::Train => "train",
            Permission::UploadArtifact => "upload-artifact",
            Permission::Admin => "admin",
        }
    }
}

/// Whether `role` holds `permission`. Pure; the table test below is the
/// specification.
pub fn allows(role: Role, permission: Permission) -> bool {
    use Permission as P;
    match role {
        Role::Admin => true,
        Role::Deployer => matches!(
            permission,
            P::Public | P::Read | P::Deploy | P::UploadArtifact
        ),
        Role::Trainer => matches!(
            permission,
            P::Public | P::Read | P::Train | P::UploadArtifact
        ),
        Role::Viewer => matches!(permission, P::Public | P::Read),
    }
}

/// Which project a route's target belongs to, for tokens scoped to
/// projects: resolved before the handler runs from the path parameter
/// named here, or left to the handler (lists filter, creations check the
/// body), or not project-bound at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Not bound to a project (artifacts by digest, clusters, tokens, health).
    Global,
    /// `{name}` is a model.
    Model,
    /// `{id}` is a device.
    Device,
    /// `{id}` is a deployment.
    Deployment,
    /// `{id}` is a job.
    Job,
    /// `{id}` is a pipeline.
    Pipeline,
    /// `{id}` is a benchmark.
    Benchmark,
    /// A list or a creation: the handler filters by, or checks against, the
    /// caller's projects.
    Handler,
}

pub struct Rule {
    pub method: Method,
    /// The route as the router declares it.
    pub path: &'static str,
    pub permission: Permission,
    pub scope: Scope,
}

macro_rules! rules {
    ($( $method:ident $path:literal => $perm:ident, $scope:ident; )*) => {
        &[ $( Rule { method: Method::$method, path: $path, permission: Permission::$perm, scope: Scope::$scope }, )* ]
    };
}

/// Every console route. Keep it in the router's order.
pub static ROUTES: &[Rule] = rules! {
    GET "/healthz" => Public, Global;
    GET "/readyz" => Public, Global;
    GET "/metrics" => Public, Global;
    GET "/api/v1/openapi.json" => Public, Global;

    POST "/api/v1/api-tokens" => Admin, Global;
    GET "/api/v1/api-tokens" => Admin, Global;
    DELETE "/api/v1/api-tokens/{id}" => Admin, Global;
    GET "/api/v1/audit" => Admin, Global;

    POST "/api/v1/tokens" => Admin, Global;
    GET "/api/v1/tokens" => Admin, Global;
    GET "/api/v1/devices" => Read, Handler;
    GET "/api/v1/devices/{id}" => Read, Device;
    POST "/api/v1/devices/{id}/revoke" => Admin, Device;
    PUT "/api/v1/devices/{id}/labels" => Deploy, Device;
    GET "/api/v1/devices/{id}/telemetry" => Read, Device;
    GET "/api/v1/clusters" => Read, Global;
    GET "/api/v1/clusters/{id}" => Read, Global;
    POST "/api/v1/clusters/{id}/revoke" => Admin, Global;
    PUT "/api/v1/clusters/{id}/labels" => Admin, Global;

    PUT "/api/v1/artifacts/{digest}" => UploadArtifact, Global;
    GET "/api/v1/artifacts/{digest}" => Read, Global;
    HEAD "/api/v1/artifacts/{digest}" => Read, Global;

    POST "/api/v1/models" => Deploy, Handler;
    GET "/api/v1/models" => Read, Handler;
    GET "/api/v1/models/{name}" => Read, Model;
    POST "/api/v1/models/{name}/versions" => Deploy, Model;
    GET "/api/v1/models/{name}/versions" => Read, Model;
    GET "/api/v1/models/{name}/versions/{version}" => Read, Model;
    POST "/api/v1/models/{name}/versions/{version}/variants" => Deploy, Model;
    GET "/api/v1/models/{name}/aliases" => Read, Model;
    PUT "/api/v1/models/{name}/aliases/{alias}" => Deploy, Model;
    GET "/api/v1/models/{name}/aliases/{alias}" => Read, Model;
    DELETE "/api/v1/models/{name}/aliases/{alias}" => Deploy, Model;
    GET "/api/v1/models/{name}/aliases/{alias}/history" => Read, Model;
    GET "/api/v1/models/{name}/sketches" => Read, Model;
    GET "/api/v1/models/{name}/drift" => Read, Model;
    GET "/api/v1/models/{name}/cost" => Read, Model;
    GET "/api/v1/models/{name}/samples" => Read, Model;
    POST "/api/v1/models/{name}/samples/labels" => Train, Model;
    GET "/api/v1/models/{name}/samples/summary" => Read, Model;
    GET "/api/v1/models/{name}/samples/{id}" => Read, Model;
    POST "/api/v1/models/{name}/samples/{id}/label" => Train, Model;

    POST "/api/v1/deployments" => Deploy, Handler;
    GET "/api/v1/deployments" => Read, Handler;
    GET "/api/v1/deployments/{id}" => Read, Deployment;
    POST "/api/v1/deployments/{id}/cancel" => Deploy, Deployment;
    POST "/api/v1/benchmarks" => Deploy, Handler;
    GET "/api/v1/benchmarks" => Read, Handler;
    GET "/api/v1/benchmarks/{id}" => Read, Benchmark;

    POST "/api/v1/jobs" => Train, Handler;
    GET "/api/v1/jobs" => Read, Handler;
    GET "/api/v1/jobs/{id}" => Read, Job;
    POST "/api/v1/jobs/{id}/cancel" => Train, Job;
    PUT "/api/v1/models/{name}/retraining" => Train, Model;
    GET "/api/v1/models/{name}/retraining" => Read, Model;
    POST "/api/v1/models/{name}/retrain" => Train, Model;
    PUT "/api/v1/models/{name}/triggers" => Train, Model;
    GET "/api/v1/models/{name}/triggers" => Read, Model;
    GET "/api/v1/pipelines" => Read, Handler;
    GET "/api/v1/pipelines/{id}" => Read, Pipeline;
    POST "/api/v1/pipelines/{id}/cancel" => Train, Pipeline;
    // Signing approves a model for devices: a deployer's call, so that a
    // trainer who started the retrain cannot also sign it.
    POST "/api/v1/pipelines/{id}/signatures" => Deploy, Pipeline;
};

/// The rule for a matched route, if the table has one.
pub fn rule_for(method: &Method, path: &str) -> Option<&'static Rule> {
    ROUTES
        .iter()
        .find(|r| r.method == *method && r.path == path)
}

/// The methods the table lists for `path`, for a 405's `Allow`.
pub fn methods_for(path: &str) -> Vec<Method> {
    ROUTES
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.method.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn roles_hold_exactly_their_permissions() {
        use Permission as P;
        let all = [
            P::Public,
            P::Read,
            P::Deploy,
            P::Train,
            P::UploadArtifact,
            P::Admin,
        ];
        let table: [(Role, &[Permission]); 4] = [
            (Role::Admin, &all),
            (
                Role::Deployer,
                &[P::Public, P::Read, P::Deploy, P::UploadArtifact],
            ),
            (
                Role::Trainer,
                &[P::Public, P::Read, P::Train, P::UploadArtifact],
            ),
            (Role::Viewer, &[P::Public, P::Read]),
        ];
        for (role, held) in table {
            for p in all {
                assert_eq!(
                    allows(role, p),
                    held.contains(&p),
                    "{role} and {}",
                    p.as_str()
                );
            }
        }
    }

    #[test]
    fn no_route_is_listed_twice() {
        let mut seen = BTreeSet::new();
        for r in ROUTES {
            assert!(
                seen.insert((r.method.as_str(), r.path)),
                "{} {} twice",
                r.method,
                r.path
            );
        }
    }

    /// Public routes carry no secrets; only reads and the four documented
    /// health routes are public.
    #[test]
    fn public_routes_are_the_health_and_document_routes() {
        let public: Vec<_> = ROUTES
            .iter()
            .filter(|r| r.permission == Permission::Public)
            .map(|r| r.path)
            .collect();
        assert_eq!(
            public,
            ["/healthz", "/readyz", "/metrics", "/api/v1/openapi.json"]
        );
    }

    /// Path-resolved scopes need the parameter they resolve from.
    #[test]
    fn scoped_routes_name_their_parameter() {
        for r in ROUTES {
            let needs = match r.scope {
                Scope::Model => Some("{name}"),
                Scope::Device
                | Scope::Deployment
                | Scope::Job
                | Scope::Pipeline
                | Scope::Benchmark => Some("{id}"),
                Scope::Global | Scope::Handler => None,
            };
            if let Some(p) = needs {
                assert!(r.path.contains(p), "{} {} has no {p}", r.method, r.path);
            }
        }
    }
}
