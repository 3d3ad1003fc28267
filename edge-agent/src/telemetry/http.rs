//! `POST /v2/models/{name}/feedback`: ground-truth labels for earlier
//! predictions, next to the Open Inference Protocol routes. Errors use the
//! protocol's shape, `{"error": "..."}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// Labels a model may take: a token bucket per model holding a minute's
/// worth, so a caller flooding labels (which reach retraining) is slowed
/// to the rate, not the disk's speed.
pub struct FeedbackLimit {
    per_minute: u32,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

/// The bucket after `elapsed` seconds at `per_minute`, full at a minute's
/// worth. Pure.
pub fn refill(tokens: f64, elapsed_secs: f64, per_minute: u32) -> f64 {
    let cap = f64::from(per_minute);
    (tokens + elapsed_secs.max(0.0) * cap / 60.0).min(cap)
}

impl FeedbackLimit {
    pub fn new(per_minute: u32) -> Self {
        FeedbackLimit {
            per_minute,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `n` labels for `model` if the bucket holds them; else takes
    /// nothing and says when to retry, in whole seconds.
    pub fn take(&self, model: &str, n: usize) -> Result<(), u64> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let cap = f64::from(self.per_minute);
        let (tokens, at) = buckets.get(model).copied().unwrap_or((cap, now));
        let tokens = refill(tokens, (now - at).as_secs_f64(), self.per_minute);
        let want = n as f64;
        if want <= tokens {
            buckets.insert(model.to_string(), (tokens - want, now));
            return Ok(());
        }
        buckets.insert(model.to_string(), (tokens, now));
        let short = want.min(cap) - tokens;
        Err((short * 60.0 / cap).ceil().max(1.0) as u64)
    }
}

/// The feedback route, with its state; merge it into the inference router.
pub fn feedback_router(telemetry: Arc<Telemetry>, labels_per_minute: u32) -> Router {
    Router::new()
        .route("/v2/models/{name}/feedback", post(feedback))
        .with_state((telemetry, Arc::new(FeedbackLimit::new(labels_per_minute))))
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
    State((telemetry, limit)): State<(Arc<Telemetry>, Arc<FeedbackLimit>)>,
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
    // Before the rate limit: its buckets are only for models that exist.
    if !telemetry.knows_model(&name) {
        return error(
            StatusCode::NOT_FOUND,
            FeedbackError::UnknownModel(name).to_string(),
        );
    }
    if req.labels.len() > limit.per_minute as usize {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "labels: at most {} per minute for a model; split the request",
                limit.per_minute
            ),
        );
    }
    if let Err(retry) = limit.take(&name, req.labels.len()) {
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "feedback for {name:?} is over {} labels a minute; retry in {retry} s",
                limit.per_minute
            ),
        );
        if let Ok(v) = retry.to_string().parse() {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
        }
        return r;
    }
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

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn the_bucket_refills_a_minutes_worth() {
        let table = [
            (0.0, 0.0, 60, 0.0),
            (0.0, 1.0, 60, 1.0),
            (0.0, 30.0, 60, 30.0),
            (10.0, 600.0, 60, 60.0),
            (5.0, -3.0, 60, 5.0),
        ];
        for (tokens, elapsed, per_minute, want) in table {
            assert_eq!(
                refill(tokens, elapsed, per_minute),
                want,
                "{tokens} {elapsed}"
            );
        }
    }

    #[test]
    fn labels_past_the_rate_are_refused_with_a_retry_time_per_model() {
        let limit = FeedbackLimit::new(60);
        assert_eq!(limit.take("m", 50), Ok(()));
        assert_eq!(limit.take("m", 20), Err(10));
        assert_eq!(limit.take("m", 10), Ok(()));
        assert_eq!(limit.take("other", 60), Ok(()));
    }
}
