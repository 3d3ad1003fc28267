//! Artifact upload, download and head, by sha256 digest.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use edgeloop_models::Digest;
use futures::TryStreamExt;
use serde::Serialize;
use tokio_util::io::ReaderStream;

use super::json::ValidPath;
use crate::Core;
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::artifacts::{ArtifactError, UploadLimits};

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ArtifactInfo {
    pub digest: String,
    pub size: u64,
}

fn parse_digest(raw: &str) -> Result<Digest, Error> {
    raw.parse()
        .map_err(|e| Error::bad_field("digest", format!("{e}")))
}

/// Uploads an artifact. The body is streamed to disk and stored only if its
/// sha256 equals the digest in the path; otherwise nothing is kept.
#[utoipa::path(put, path = "/api/v1/artifacts/{digest}", tag = "registry",
    params(("digest" = String, Path, description = "sha256 of the body, 64 lowercase hex")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = ArtifactInfo, description = "stored"), (status = 200, body = ArtifactInfo, description = "already stored"),
        (status = 400, body = ErrorBody, description = "bad digest or content mismatch"), (status = 413, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn upload(
    State(core): State<Arc<Core>>,
    ValidPath(digest): ValidPath<String>,
    req: Request,
) -> Result<(StatusCode, Json<ArtifactInfo>), Error> {
    let digest = parse_digest(&digest)?;
    let limit = core.config.max_artifact_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|d| d > limit) {
        return Err(Error::PayloadTooLarge { limit });
    }
    let body = req
        .into_body()
        .into_data_stream()
        .map_err(|e| ArtifactError::Body(e.to_string()));
    let outcome = core
        .artifacts
        .put(
            digest,
            Box::pin(body),
            UploadLimits {
                max_bytes: limit,
                declared_size: None,
            },
        )
        .await?;
    let status = if outcome.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(ArtifactInfo {
            digest: outcome.digest.to_string(),
            size: outcome.size,
        }),
    ))
}

/// Parses `Range: bytes=N-`, the one form a resuming client needs.
fn range_start(headers: &HeaderMap) -> Option<u64> {
    let v = headers.get(header::RANGE)?.to_str().ok()?;
    let start = v.strip_prefix("bytes=")?.strip_suffix('-')?;
    start.parse().ok()
}

/// Downloads an artifact. Supports `Range: bytes=N-` for resuming.
#[utoipa::path(get, path = "/api/v1/artifacts/{digest}", tag = "registry",
    params(("digest" = String, Path)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = 206, description = "partial content from the requested offset"),
        (status = 404, body = ErrorBody), (status = 416, description = "range start past the end")),
    security(("bearer" = [])))]
pub async fn download(
    State(core): State<Arc<Core>>,
    ValidPath(digest): ValidPath<String>,
    headers: HeaderMap,
) -> Result<Response, Error> {
    let digest = parse_digest(&digest)?;
    let start = range_start(&headers);
    let (size, reader) = core.artifacts.open_at(digest, start.unwrap_or(0)).await?;
    let etag =
        HeaderValue::from_str(&format!("\"{digest}\"")).map_err(|e| Error::Internal(e.into()))?;
    let mut response = match start {
        Some(s) if s >= size && size > 0 => {
            return Err(Error::RangeNotSatisfiable { offset: s, size });
        }
        Some(s) if s > 0 => {
            let mut r = (
                StatusCode::PARTIAL_CONTENT,
                Body::from_stream(ReaderStream::new(reader)),
            )
                .into_response();
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {s}-{}/{size}", size - 1))
                    .map_err(|e| Error::Internal(e.into()))?,
            );
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(size - s));
            r
        }
        _ => {
            let mut r = Body::from_stream(ReaderStream::new(reader)).into_response();
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            r
        }
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ETAG, etag);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    Ok(response)
}

/// Whether an artifact exists, and its size (`Content-Length`).
#[utoipa::path(head, path = "/api/v1/artifacts/{digest}", tag = "registry",
    params(("digest" = String, Path)),
    responses((status = 200, description = "stored; Content-Length is its size"), (status = 404, description = "not stored")),
    security(("bearer" = [])))]
pub async fn head(
    State(core): State<Arc<Core>>,
    ValidPath(digest): ValidPath<String>,
) -> Result<Response, Error> {
    let digest = parse_digest(&digest)?;
    match core.artifacts.head(digest).await? {
        Some(size) => {
            let mut r = StatusCode::OK.into_response();
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            Ok(r)
        }
        None => Err(Error::from(ArtifactError::NotFound(digest)).for_head()),
    }
}
