//! The control plane's one [`Error`] and the one place where it becomes
//! HTTP statuses and gRPC codes, with the validators ([`validate`]) that
//! turn bad input into errors naming the field.
//!
//! A crate of its own so that every control-plane crate (the registry, the
//! server) returns the same [`Error`] and none of them picks a status code:
//! library code returns [`Error`] (or a typed error that converts into it,
//! like the store's and the registry's artifact errors); handlers never pick
//! status codes themselves.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use edgeloop_store::StoreError;

pub mod device_counts;
pub mod validate;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{message}")]
    BadRequest {
        field: Option<String>,
        message: String,
    },
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{kind} {id:?} not found")]
    NotFound { kind: &'static str, id: String },
    /// Not found, where `{kind} {id:?} not found` does not say what is
    /// missing (a job's checkpoint or dataset, say).
    #[error("{0}")]
    Absent(String),
    #[error("{0}")]
    Conflict(String),
    /// A method the route does not have. Over HTTP a 405 with `Allow`.
    #[error("method not allowed (allowed: {})", allowed.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", "))]
    MethodNotAllowed { allowed: Vec<axum::http::Method> },
    #[error("body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("{0}")]
    Unavailable(String),
    /// A limit on what one caller may hold or send is reached (open
    /// downloads, telemetry per hour); the caller retries later.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The caller did not keep up within a deadline the server sets (a
    /// download whose reader took no chunk for too long).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// A read offset past the end of an artifact. Over HTTP a bodyless 416
    /// with `Content-Range: bytes */{size}`, as RFC 9110 asks.
    #[error("offset {offset} is past the end ({size} bytes)")]
    RangeNotSatisfiable { offset: u64, size: u64 },
    /// Reading an artifact failed after its download had started. Unlike
    /// [`Error::Internal`], the reason is shown to the caller.
    #[error("reading artifact: {0}")]
    ArtifactRead(String),
    #[error("internal error: {0:#}")]
    Internal(anyhow::Error),
    /// The answer to a HEAD request: the inner error's status and headers,
    /// with no body.
    #[error("{0}")]
    Head(Box<Error>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn bad_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadRequest {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        Self::NotFound {
            kind,
            id: id.into(),
        }
    }

    /// This error as the answer to a HEAD request (no body).
    pub fn for_head(self) -> Self {
        match self {
            head @ Error::Head(_) => head,
            other => Self::Head(Box::new(other)),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Error::BadRequest { .. } => "bad_request",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission_denied",
            Error::NotFound { .. } | Error::Absent(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::PayloadTooLarge { .. } => "payload_too_large",
            Error::Unavailable(_) => "unavailable",
            Error::ResourceExhausted(_) => "resource_exhausted",
            Error::DeadlineExceeded(_) => "deadline_exceeded",
            Error::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            Error::ArtifactRead(_) | Error::Internal(_) => "internal",
            Error::Head(inner) => inner.code(),
        }
    }

    fn http_status(&self) -> StatusCode {
        match self {
            Error::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Error::PermissionDenied(_) => StatusCode::FORBIDDEN,
            Error::NotFound { .. } | Error::Absent(_) => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Error::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            Error::ArtifactRead(_) | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Head(inner) => inner.http_status(),
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Internal(e.into())
    }
}

/// The JSON body of every error response is part of the console API.
pub use edgeloop_api::error::{ErrorBody, ErrorDetail};

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.http_status();
        match &self {
            Error::Internal(e) => tracing::error!(error = ?e, "request failed"),
            Error::Head(inner) => {
                if let Error::Internal(e) = inner.as_ref() {
                    tracing::error!(error = ?e, "request failed");
                }
                return status.into_response();
            }
            Error::MethodNotAllowed { allowed } => {
                let list = allowed
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut r = status.into_response();
                if let Ok(v) = HeaderValue::from_str(&list) {
                    r.headers_mut().insert(header::ALLOW, v);
                }
                return r;
            }
            Error::RangeNotSatisfiable { size, .. } => {
                let mut r = status.into_response();
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    r.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return r;
            }
            _ => {}
        }
        let field = match &self {
            Error::BadRequest { field, .. } => field.clone(),
            _ => None,
        };
        let message = match &self {
            // Internal details go to the log, not to the client.
            Error::Internal(_) => "internal error".to_string(),
            other => other.to_string(),
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code().to_string(),
                message,
                field,
            },
        };
        (status, axum::Json(body)).into_response()
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        use tonic::Status;
        match e {
            Error::BadRequest {
                field: Some(f),
                message,
            } => Status::invalid_argument(format!("{f}: {message}")),
            Error::BadRequest {
                field: None,
                message,
            } => Status::invalid_argument(message),
            Error::Unauthenticated(m) => Status::unauthenticated(m),
            Error::PermissionDenied(m) => Status::permission_denied(m),
            e @ Error::NotFound { .. } => Status::not_found(e.to_string()),
            Error::Absent(m) => Status::not_found(m),
            Error::Conflict(m) => Status::already_exists(m),
            e @ Error::MethodNotAllowed { .. } => Status::unimplemented(e.to_string()),
            e @ Error::PayloadTooLarge { .. } => Status::resource_exhausted(e.to_string()),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::ResourceExhausted(m) => Status::resource_exhausted(m),
            Error::DeadlineExceeded(m) => Status::deadline_exceeded(m),
            e @ Error::RangeNotSatisfiable { .. } => Status::out_of_range(e.to_string()),
            e @ Error::ArtifactRead(_) => Status::internal(e.to_string()),
            Error::Internal(e) => {
                tracing::error!(error = ?e, "rpc failed");
                Status::internal("internal error")
            }
            Error::Head(inner) => (*inner).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_grpc_mapping_table() {
        let cases: Vec<(Error, StatusCode, tonic::Code)> = vec![
            (
                Error::bad_field("x", "y"),
                StatusCode::BAD_REQUEST,
                tonic::Code::InvalidArgument,
            ),
            (
                Error::Unauthenticated("t".into()),
                StatusCode::UNAUTHORIZED,
                tonic::Code::Unauthenticated,
            ),
            (
                Error::PermissionDenied("r".into()),
                StatusCode::FORBIDDEN,
                tonic::Code::PermissionDenied,
            ),
            (
                Error::not_found("device", "d"),
                StatusCode::NOT_FOUND,
                tonic::Code::NotFound,
            ),
            (
                Error::Conflict("c".into()),
                StatusCode::CONFLICT,
                tonic::Code::AlreadyExists,
            ),
            (
                Error::PayloadTooLarge { limit: 1 },
                StatusCode::PAYLOAD_TOO_LARGE,
                tonic::Code::ResourceExhausted,
            ),
            (
                Error::Unavailable("u".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                tonic::Code::Unavailable,
            ),
            (
                Error::Absent("a".into()),
                StatusCode::NOT_FOUND,
                tonic::Code::NotFound,
            ),
            (
                Error::ResourceExhausted("r".into()),
                StatusCode::TOO_MANY_REQUESTS,
                tonic::Code::ResourceExhausted,
            ),
            (
                Error::DeadlineExceeded("d".into()),
                StatusCode::GATEWAY_TIMEOUT,
                tonic::Code::DeadlineExceeded,
            ),
            (
                Error::RangeNotSatisfiable { offset: 2, size: 1 },
                StatusCode::RANGE_NOT_SATISFIABLE,
                tonic::Code::OutOfRange,
            ),
            (
                Error::ArtifactRead("r".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                tonic::Code::Internal,
            ),
            (
                Error::not_found("artifact", "a").for_head(),
                StatusCode::NOT_FOUND,
                tonic::Code::NotFound,
            ),
            (
                Error::Internal(anyhow::anyhow!("secret detail")),
                StatusCode::INTERNAL_SERVER_ERROR,
                tonic::Code::Internal,
            ),
        ];
        for (err, http, grpc) in cases {
            assert_eq!(err.http_status(), http, "{err:?}");
            let status: tonic::Status = err.into();
            assert_eq!(status.code(), grpc);
            assert!(!status.message().contains("secret detail"));
        }
    }

    #[tokio::test]
    async fn bodyless_responses() {
        let r = Error::RangeNotSatisfiable { offset: 9, size: 5 }.into_response();
        assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(r.headers()[header::CONTENT_RANGE], "bytes */5");
        let body = axum::body::to_bytes(r.into_body(), 1024).await.unwrap();
        assert!(body.is_empty());

        let r = Error::not_found("artifact", "a").for_head().into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let body = axum::body::to_bytes(r.into_body(), 1024).await.unwrap();
        assert!(body.is_empty());
    }

    #[test]
    fn grpc_messages() {
        let cases: Vec<(Error, &str)> = vec![
            (
                Error::bad_field("header", "the first message must be the checkpoint header"),
                "header: the first message must be the checkpoint header",
            ),
            (
                Error::RangeNotSatisfiable { offset: 9, size: 5 },
                "offset 9 is past the end (5 bytes)",
            ),
            (Error::ArtifactRead("eof".into()), "reading artifact: eof"),
            (Error::Absent("gone".into()), "gone"),
            (Error::ResourceExhausted("slow down".into()), "slow down"),
            (Error::DeadlineExceeded("too slow".into()), "too slow"),
        ];
        for (err, message) in cases {
            let status: tonic::Status = err.into();
            assert_eq!(status.message(), message);
        }
    }
}
