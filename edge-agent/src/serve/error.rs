//! Why a request failed, and the one place that turns that into an answer:
//! [`ServeError::response`] (an HTTP status and the protocol's
//! `{"error": "..."}` body) and [`ServeError::to_status`] (a gRPC status
//! with the same message).

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

    /// The gRPC code for [`ServeError::status`]'s HTTP status, as KServe
    /// and Triton map them.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            ServeError::BadBody(_) | ServeError::BadInput { .. } | ServeError::BadOutput { .. } => {
                tonic::Code::InvalidArgument
            }
            ServeError::UnknownModel(_)
            | ServeError::UnknownVersion { .. }
            | ServeError::NoRoute(_) => tonic::Code::NotFound,
            ServeError::MethodNotAllowed { .. } => tonic::Code::Unimplemented,
            // What tonic itself answers for a message over
            // `max_decoding_message_size`, before any of our code runs: one
            // code for "too large", whichever layer noticed.
            ServeError::TooLarge { .. } => tonic::Code::OutOfRange,
            ServeError::QueueFull { .. } => tonic::Code::ResourceExhausted,
            ServeError::Inference(_) => tonic::Code::Internal,
        }
    }

    /// The gRPC status: [`ServeError::grpc_code`] and the same message as
    /// the HTTP answer. A full queue also carries `grpc-retry-pushback-ms`,
    /// gRPC's `Retry-After`, which clients with a retry policy honour.
    pub fn to_status(&self) -> tonic::Status {
        let mut status = tonic::Status::new(self.grpc_code(), self.to_string());
        if matches!(self, ServeError::QueueFull { .. }) {
            status.metadata_mut().insert(
                RETRY_PUSHBACK,
                tonic::metadata::MetadataValue::from(RETRY_AFTER_SECS * 1000),
            );
        }
        status
    }
}

/// The gRPC trailer that tells a client how long to wait before retrying.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

impl From<ServeError> for tonic::Status {
    fn from(e: ServeError) -> tonic::Status {
        e.to_status()
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

    /// Every error has a gRPC code in the class of its HTTP status, and
    /// the same message.
    #[test]
    fn grpc_codes_follow_http_statuses() {
        let input = || ServeError::BadInput {
            name: "x".into(),
            reason: "r".into(),
        };
        let cases = [
            (
                ServeError::BadBody("b".into()),
                tonic::Code::InvalidArgument,
            ),
            (input(), tonic::Code::InvalidArgument),
            (
                ServeError::BadOutput {
                    name: "y".into(),
                    reason: "r".into(),
                },
                tonic::Code::InvalidArgument,
            ),
            (ServeError::UnknownModel("m".into()), tonic::Code::NotFound),
            (
                ServeError::UnknownVersion {
                    model: "m".into(),
                    version: "2".into(),
                },
                tonic::Code::NotFound,
            ),
            (ServeError::TooLarge { limit: 9 }, tonic::Code::OutOfRange),
            (
                ServeError::QueueFull {
                    model: "m".into(),
                    capacity: 4,
                },
                tonic::Code::ResourceExhausted,
            ),
            (ServeError::Inference("i".into()), tonic::Code::Internal),
        ];
        for (e, code) in cases {
            let status = e.to_status();
            assert_eq!(status.code(), code, "{e}");
            assert_eq!(status.message(), e.to_string());
            let retry = status.metadata().get(RETRY_PUSHBACK);
            assert_eq!(
                retry.is_some(),
                matches!(e, ServeError::QueueFull { .. }),
                "{e}"
            );
        }
        let full = ServeError::QueueFull {
            model: "m".into(),
            capacity: 4,
        }
        .to_status();
        assert_eq!(full.metadata().get(RETRY_PUSHBACK).unwrap(), "1000");
    }
}
