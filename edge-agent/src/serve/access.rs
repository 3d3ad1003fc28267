//! Who may call the device's APIs: with `--api-token-file`, every REST
//! route but the two health probes needs `Authorization: Bearer <token>`,
//! and every gRPC call the same in its `authorization` metadata. Compared
//! by sha256, so the comparison's timing says nothing about the token.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header::AUTHORIZATION;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::{Json, Router};
use edgeloop_models::Digest;

/// Open to anyone who reaches the port: load balancers and orchestrators
/// probe these without credentials.
const OPEN_PATHS: [&str; 2] = ["/v2/health/live", "/v2/health/ready"];

/// Whether a presented `Authorization` value carries the token.
pub fn admits(token_hash: &Digest, authorization: Option<&str>) -> bool {
    authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| Digest::of(t.trim().as_bytes()) == *token_hash)
}

/// `app` behind the token, when there is one.
pub fn http(app: Router, token_hash: Option<Digest>) -> Router {
    let Some(hash) = token_hash else {
        return app;
    };
    let hash = Arc::new(hash);
    app.layer(middleware::from_fn(move |req: Request, next: Next| {
        let hash = hash.clone();
        async move {
            let presented = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if OPEN_PATHS.contains(&req.uri().path()) || admits(&hash, presented) {
                next.run(req).await
            } else {
                (
                    StatusCode::UNAUTHORIZED,
                    [("www-authenticate", "Bearer")],
                    Json(serde_json::json!({"error": "missing or wrong bearer token"})),
                )
                    .into_response()
            }
        }
    }))
}

/// The gRPC check: the same token in the `authorization` metadata.
#[derive(Clone)]
pub struct GrpcToken(pub Option<Digest>);

impl tonic::service::Interceptor for GrpcToken {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(hash) = &self.0 else {
            return Ok(req);
        };
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if admits(hash, presented) {
            Ok(req)
        } else {
            Err(tonic::Status::unauthenticated(
                "missing or wrong bearer token (authorization metadata)",
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
}
