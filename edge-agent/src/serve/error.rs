//! Why a request failed, and [`ServeError::response`]: the one place that
//! turns that into an HTTP status and the protocol's `{"error": "..."}` body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Seconds a client is told to wait after a full queue. The queue drains in
/// milliseconds, so the smallest value the header can carry.
pub const RETRY_AFTER_SECS: u32 = 1;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServeError {
    /// Not JSON, or JSON that is not an infer request.
    #[error("invalid request body: {0}")]
    BadBody(String),
    #[error("input `{name}`: {reason}")]
    BadInput { name: String, reason: String },
    #[error("output `{name}`: {reason}")]
    BadOutput { name: String, reason: String },
    #[error("model `{0}` is not serving")]
    UnknownModel(String),
    #[error("model `{model}` version `{version}` is not serving")]
    UnknownVersion { model: String, version: String },
    #[error("no such endpoint: {0}")]
    NoRoute(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("request body is over the {limit}-byte limit")]
    TooLarge { limit: usize },
    #[error("model `{model}` has {capacity} requests queued; retry later")]
    QueueFull { model: String, capacity: usize },
    /// ONNX Runtime failed on input that passed validation.
    #[error("inference failed: {0}")]
    Inference(String),
}

impl ServeError {
    pub fn status(&self) -> StatusCode {
        match self {
            ServeError::BadBody(_) | ServeError::BadInput { .. } | ServeError::BadOutput { .. } => {
                StatusCode::BAD_REQUEST
            }
            ServeError::UnknownModel(_)
            | ServeError::UnknownVersion { .. }
            | ServeError::NoRoute(_) => StatusCode::NOT_FOUND,
            ServeError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ServeError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ServeError::QueueFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ServeError::Inference(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The status, `{"error": "<message>"}`, and `Retry-After` when the
    /// client should simply try again.
    pub fn response(&self) -> Response {
        let body = serde_json::json!({ "error": self.to_string() });
        let mut response = (self.status(), axum::Json(body)).into_response();
        if matches!(self, ServeError::QueueFull { .. }) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        self.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_full_says_when_to_retry() {
        let full = ServeError::QueueFull {
            model: "m".into(),
            capacity: 4,
        }
        .response();
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            full.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from_static("1"))
        );
        let bad = ServeError::BadBody("x".into()).response();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert!(bad.headers().get(header::RETRY_AFTER).is_none());
    }
}
