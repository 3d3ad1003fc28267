//! The console's way to the console API: an in-process request through the
//! same router, with the session's principal attached
//! (`auth::ConsoleCaller`). So a page sees exactly what the API shows that
//! token, a button does exactly what the API call does, and the role table,
//! project scopes, validation, error mapping and audit log are the API's
//! own, not a second copy that could drift.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use serde::de::DeserializeOwned;
use tower::ServiceExt as _;

use edgeloop_api::NEXT_CURSOR;
use edgeloop_auth::{ConsoleCaller, Principal};

/// The most bytes the console reads of one API answer: pages are bounded
/// (`limit`), so this is a guard, not a limit anyone meets.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// An API answer the page shows instead of its content.
#[derive(Debug, Clone)]
pub struct ApiFailure {
    pub status: StatusCode,
    pub message: String,
}

impl ApiFailure {
    fn internal(message: impl Into<String>) -> ApiFailure {
        ApiFailure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
        }
    }
}

/// One answer: the body and the next page's cursor, when there is one.
pub struct Answer<T> {
    pub body: T,
    pub next: Option<String>,
}

#[derive(Clone)]
pub struct Api {
    router: Router,
}

impl Api {
    pub fn new(router: Router) -> Api {
        Api { router }
    }

    pub async fn get<T: DeserializeOwned>(
        &self,
        who: &Principal,
        path: &str,
    ) -> Result<Answer<T>, ApiFailure> {
        self.call(who, Method::GET, path, None).await
    }

    pub async fn post<T: DeserializeOwned>(
        &self,
        who: &Principal,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Answer<T>, ApiFailure> {
        self.call(who, Method::POST, path, body).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        who: &Principal,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Answer<T>, ApiFailure> {
        let mut req = Request::builder().method(method).uri(path);
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let mut req = req
            .body(body)
            .map_err(|e| ApiFailure::internal(format!("building {path}: {e}")))?;
        req.extensions_mut().insert(ConsoleCaller(who.clone()));
        let res = self
            .router
            .clone()
            .oneshot(req)
            .await
            .map_err(|e| ApiFailure::internal(format!("{path}: {e}")))?;
        let status = res.status();
        let next = res
            .headers()
            .get(NEXT_CURSOR)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = axum::body::to_bytes(res.into_body(), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| ApiFailure::internal(format!("reading {path}: {e}")))?;
        if !status.is_success() {
            let message = serde_json::from_slice::<edgeloop_api::error::ErrorBody>(&bytes)
                .map(|b| b.error.to_string())
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ApiFailure { status, message });
        }
        let body = serde_json::from_slice(&bytes)
            .map_err(|e| ApiFailure::internal(format!("reading {path}'s answer: {e}")))?;
        Ok(Answer { body, next })
    }
}
