//! `POST /v2/models/{name}/feedback`: ground-truth labels for earlier
//! predictions, next to the Open Inference Protocol routes. Errors use the
//! protocol's shape, `{"error": "..."}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::{FeedbackError, Telemetry};

/// Labels per request; larger batches are split by the client.
pub const MAX_LABELS: usize = 10_000;
/// Longest request id accepted.
pub const MAX_ID_BYTES: usize = 1024;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    pub labels: Vec<FeedbackLabel>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackLabel {
    /// The inference request's id (`<id>/<row>` for a row of a batch).
    pub id: String,
    /// The true class.
    pub label: i64,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct FeedbackReply {
    /// Labels that found their prediction.
    pub matched: usize,
    /// Ids with no remembered prediction (never made, or evicted).
    pub unknown_ids: Vec<String>,
    /// Share of correct predictions among the model's last `window`
    /// labelled ones; null before the first.
    pub rolling_accuracy: Option<f64>,
    pub window: usize,
}

/// The feedback route, with its state; merge it into the inference router.
pub fn feedback_router(telemetry: Arc<Telemetry>) -> Router {
    Router::new()
        .route("/v2/models/{name}/feedback", post(feedback))
        .with_state(telemetry)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

/// Parses and checks the body; the error names the field at fault.
pub fn parse(body: &[u8]) -> Result<FeedbackRequest, String> {
    let req: FeedbackRequest =
        serde_json::from_slice(body).map_err(|e| format!("invalid feedback body: {e}"))?;
    if req.labels.is_empty() {
        return Err("labels: must not be empty".into());
    }
    if req.labels.len() > MAX_LABELS {
        return Err(format!("labels: at most {MAX_LABELS} per request"));
    }
    for (i, l) in req.labels.iter().enumerate() {
        if l.id.is_empty() || l.id.len() > MAX_ID_BYTES {
            return Err(format!("labels[{i}].id: must be 1 to {MAX_ID_BYTES} bytes"));
        }
    }
    Ok(req)
}

async fn feedback(
    State(telemetry): State<Arc<Telemetry>>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let name = match name {
        Ok(Path(name)) => name,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let body = match body {
        Ok(body) => body,
        Err(e) => return error(e.status(), e.body_text()),
    };
    let req = match parse(&body) {
        Ok(req) => req,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    // Queuing labelled samples writes to the on-disk buffer.
    let result = tokio::task::spawn_blocking(move || telemetry.feedback(&name, &req.labels)).await;
    match result {
        Ok(Ok(reply)) => Json(reply).into_response(),
        Ok(Err(e @ FeedbackError::UnknownModel(_))) => error(StatusCode::NOT_FOUND, e.to_string()),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "feedback");
            error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
        Err(e) => {
            tracing::error!(error = %e, "feedback task");
            error(StatusCode::INTERNAL_SERVER_ERROR, "feedback failed")
        }
    }
}
