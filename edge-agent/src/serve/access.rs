//! Who may call the device's APIs. With `--api-token-file` or
//! `--api-client-ca` (mTLS), every REST route but the two health probes,
//! and every gRPC call, needs a credential: `Authorization: Bearer <token>`
//! (gRPC: the `authorization` metadata), or a client certificate that
//! chains to the client CAs, checked in the TLS handshake. Either one
//! admits a caller. The token is compared by sha256, so the comparison's
//! timing says nothing about it.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header::AUTHORIZATION;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::{Json, Router};
use edgeloop_client_core::https::ClientCertificate;
use edgeloop_models::Digest;

use crate::config::ApiAccess;

/// Open to anyone who reaches the port: load balancers and orchestrators
/// probe these without credentials.
const OPEN_PATHS: [&str; 2] = ["/v2/health/live", "/v2/health/ready"];

/// Whether a presented `Authorization` value carries the token.
pub fn admits(token_hash: &Digest, authorization: Option<&str>) -> bool {
    authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| Digest::of(t.trim().as_bytes()) == *token_hash)
}

/// Whether a caller with `authorization` and (over TLS) a verified client
/// certificate or not may call a protected route. Pure; the table test is
/// the specification.
pub fn admitted(
    token_hash: Option<&Digest>,
    mtls: bool,
    authorization: Option<&str>,
    client_certificate: bool,
) -> bool {
    let open = token_hash.is_none() && !mtls;
    open || token_hash.is_some_and(|h| admits(h, authorization)) || (mtls && client_certificate)
}

/// `app` behind the token and the client certificates, when either is set.
pub fn http(app: Router, access: &ApiAccess) -> Router {
    if access.is_open() {
        return app;
    }
    let hash = Arc::new(access.token_hash);
    let mtls = access.mtls();
    app.layer(middleware::from_fn(move |req: Request, next: Next| {
        let hash = hash.clone();
        async move {
            let presented = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            // Set by the TLS listener; absent on plain TCP.
            let certified = req
                .extensions()
                .get::<ClientCertificate>()
                .is_some_and(|c| c.0.is_some());
            if OPEN_PATHS.contains(&req.uri().path())
                || admitted(hash.as_ref().as_ref(), mtls, presented, certified)
            {
                next.run(req).await
            } else {
                let wanted = match (hash.is_some(), mtls) {
                    (true, true) => "a bearer token or a client certificate",
                    (true, false) => "the bearer token",
                    _ => "a client certificate",
                };
                (
                    StatusCode::UNAUTHORIZED,
                    [("www-authenticate", "Bearer")],
                    Json(serde_json::json!({
                        "error": format!("missing or wrong credentials: this API needs {wanted}")
                    })),
                )
                    .into_response()
            }
        }
    }))
}

/// The gRPC check: the same token in the `authorization` metadata, or the
/// connection's verified client certificate.
#[derive(Clone)]
pub struct GrpcAccess {
    pub token_hash: Option<Digest>,
    pub mtls: bool,
}

impl GrpcAccess {
    pub fn new(access: &ApiAccess) -> GrpcAccess {
        GrpcAccess {
            token_hash: access.token_hash,
            mtls: access.mtls(),
        }
    }
}

impl tonic::service::Interceptor for GrpcAccess {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let certified = req.peer_certs().is_some_and(|c| !c.is_empty());
        if admitted(self.token_hash.as_ref(), self.mtls, presented, certified) {
            Ok(req)
        } else {
            Err(tonic::Status::unauthenticated(
                "missing or wrong credentials (a bearer token in the authorization metadata, \
                 or a client certificate when the agent has client CAs)",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let hash = Digest::of(b"s3cret-token-0123");
        let table = [
            (Some("Bearer s3cret-token-0123"), true),
            (Some("Bearer  s3cret-token-0123 "), true),
            (Some("Bearer s3cret-token-012"), false),
            (Some("bearer s3cret-token-0123"), false),
            (Some("s3cret-token-0123"), false),
            (Some(""), false),
            (None, false),
        ];
        for (presented, ok) in table {
            assert_eq!(admits(&hash, presented), ok, "{presented:?}");
        }
    }

    #[test]
    fn a_token_or_a_client_certificate_admits_as_configured() {
        let hash = Digest::of(b"s3cret-token-0123");
        let good = Some("Bearer s3cret-token-0123");
        let bad = Some("Bearer nope");
        // (token set, mtls, presented, certificate) -> admitted
        let table = [
            // Open: anyone.
            (false, false, None, false, true),
            // Token only: the token, and a certificate is no substitute.
            (true, false, good, false, true),
            (true, false, bad, false, false),
            (true, false, None, true, false),
            // mTLS only: a certificate; a token means nothing.
            (false, true, None, true, true),
            (false, true, None, false, false),
            (false, true, good, false, false),
            // Both: either admits.
            (true, true, good, false, true),
            (true, true, None, true, true),
            (true, true, bad, true, true),
            (true, true, bad, false, false),
            (true, true, None, false, false),
        ];
        for (token, mtls, presented, cert, want) in table {
            let h = token.then_some(&hash);
            assert_eq!(
                admitted(h, mtls, presented, cert),
                want,
                "token {token} mtls {mtls} {presented:?} cert {cert}"
            );
        }
    }
}
