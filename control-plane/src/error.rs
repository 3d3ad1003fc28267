//! The one place where errors become HTTP statuses and gRPC codes.
//!
//! Library code returns [`Error`] (or a typed error that converts into it);
//! handlers never pick status codes themselves.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::registry::artifacts::ArtifactError;
use crate::store::StoreError;

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
    #[error("{0}")]
    Conflict(String),
    #[error("body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0:#}")]
    Internal(anyhow::Error),
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

    fn code(&self) -> &'static str {
        match self {
            Error::BadRequest { .. } => "bad_request",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission_denied",
            Error::NotFound { .. } => "not_found",
            Error::Conflict(_) => "conflict",
            Error::PayloadTooLarge { .. } => "payload_too_large",
            Error::Unavailable(_) => "unavailable",
            Error::Internal(_) => "internal",
        }
    }

    fn http_status(&self) -> StatusCode {
        match self {
            Error::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Error::PermissionDenied(_) => StatusCode::FORBIDDEN,
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Internal(e.into())
    }
}

impl From<ArtifactError> for Error {
    fn from(e: ArtifactError) -> Self {
        match e {
            ArtifactError::DigestMismatch { .. } | ArtifactError::SizeMismatch { .. } => {
                Error::bad_field("digest", e.to_string())
            }
            ArtifactError::TooLarge { limit } => Error::PayloadTooLarge { limit },
            ArtifactError::NotFound(d) => Error::not_found("artifact", d.to_string()),
            ArtifactError::Body(m) => Error::BadRequest {
                field: None,
                message: format!("reading the upload failed: {m}"),
            },
            ArtifactError::Incomplete { .. } => Error::Unavailable(e.to_string()),
            ArtifactError::Offset { .. } => Error::bad_field("offset", e.to_string()),
            ArtifactError::Io(_) => Error::Internal(e.into()),
        }
    }
}

/// The JSON body of every error response is part of the console API.
pub use edgeloop_api::error::{ErrorBody, ErrorDetail};

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.http_status();
        if let Error::Internal(e) = &self {
            tracing::error!(error = ?e, "request failed");
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
            Error::Conflict(m) => Status::already_exists(m),
            e @ Error::PayloadTooLarge { .. } => Status::resource_exhausted(e.to_string()),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::Internal(e) => {
                tracing::error!(error = ?e, "rpc failed");
                Status::internal("internal error")
            }
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
}
