//! The Open Inference Protocol v2 REST API (KServe / Triton) and
//! `GET /metrics`, as an axum [`Router`]. Every error is the protocol's
//! `{"error": "..."}` JSON (see [`ServeError::response`]).
//!
//! `/v2/health/ready` answers 200 as soon as the host is up, also while no
//! model is loaded yet: the agent is working (syncing its first assignment),
//! and an orchestrator must not restart it for that. Whether a model can
//! take requests is `/v2/models/{name}/ready`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::binary;
use super::error::ServeError;
use super::host::ModelHost;
use super::infer::{decode_inputs, new_request_id};
use super::protocol::{InferRequest, InferResponse, ResponseOutput, SERVER_NAME, SERVER_VERSION};

type Host = State<Arc<ModelHost>>;

/// The inference API and `/metrics`, ready to serve or to nest.
pub fn router(host: Arc<ModelHost>) -> Router {
    let limit = host.config().max_request_bytes;
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(version_metadata),
        )
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(version_ready),
        )
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(version_infer),
        )
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(host)
}

/// Serves [`router`] on `listener` until `shutdown`, then finishes the
/// requests in flight.
pub async fn serve(
    host: Arc<ModelHost>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_app(router(host), listener, shutdown).await
}

/// [`serve`] for a router that adds routes to [`router`]'s (the agent adds
/// telemetry's feedback API).
pub async fn serve_app(
    app: Router,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt as _;
    // Answers are small and written at once: Nagle's algorithm would only
    // hold them back waiting for an ACK.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn server_metadata() -> Response {
    Json(json!({
        "name": SERVER_NAME,
        "version": SERVER_VERSION,
        "extensions": [],
    }))
    .into_response()
}

async fn live() -> Response {
    Json(json!({ "live": true })).into_response()
}

async fn ready() -> Response {
    Json(json!({ "ready": true })).into_response()
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ServeError> {
    p.map(|Path(v)| v)
        .map_err(|e| ServeError::NoRoute(e.body_text()))
}

async fn model_metadata(State(host): Host, name: Result<Path<String>, PathRejection>) -> Response {
    path(name)
        .and_then(|name| host.metadata(&name, None))
        .map_or_else(|e| e.response(), |m| Json(m).into_response())
}

async fn version_metadata(
    State(host): Host,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    path(p)
        .and_then(|(name, version)| host.metadata(&name, Some(&version)))
        .map_or_else(|e| e.response(), |m| Json(m).into_response())
}

fn readiness(host: &ModelHost, name: &str, version: Option<&str>) -> Response {
    match host.resolve(name, version) {
        Ok(_) => Json(json!({ "name": name, "ready": true })).into_response(),
        Err(e) => e.response(),
    }
}

async fn model_ready(State(host): Host, name: Result<Path<String>, PathRejection>) -> Response {
    match path(name) {
        Ok(name) => readiness(&host, &name, None),
        Err(e) => e.response(),
    }
}

async fn version_ready(
    State(host): Host,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    match path(p) {
        Ok((name, version)) => readiness(&host, &name, Some(&version)),
        Err(e) => e.response(),
    }
}

async fn infer(
    State(host): Host,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match path(name) {
        Ok(name) => run(&host, &name, None, &headers, body).await,
        Err(e) => e.response(),
    }
}

async fn version_infer(
    State(host): Host,
    p: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match path(p) {
        Ok((name, version)) => run(&host, &name, Some(&version), &headers, body).await,
        Err(e) => e.response(),
    }
}

/// The infer endpoint: route (404 before anything else), parse, run,
/// answer. Every request routed to a version is counted and observed,
/// whatever its outcome.
async fn run(
    host: &ModelHost,
    model: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let target = match host.resolve(model, version) {
        Ok(v) => v,
        Err(e) => return e.response(),
    };
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ServeError::TooLarge {
            limit: host.config().max_request_bytes,
        },
        _ => ServeError::BadBody(rejection.body_text()),
    });
    // The binary extension: a JSON header, then the tensors' bytes.
    let header_len = match headers.get(binary::HEADER).map(|v| v.to_str()) {
        None => Ok(None),
        Some(Ok(v)) => Ok(Some(v)),
        Some(Err(_)) => Err(ServeError::BadBody(
            "Inference-Header-Content-Length is not text".into(),
        )),
    };
    let parts = body.as_ref().map_err(Clone::clone).and_then(|bytes| {
        header_len.and_then(|len| binary::split(bytes, len).map_err(ServeError::BadBody))
    });
    // Parsed in place: `data` stays borrowed from the body until decoded.
    let request = parts.and_then(|(json, raw)| {
        serde_json::from_slice::<InferRequest<'_>>(json)
            .map(|r| (r, raw))
            .map_err(|e| ServeError::BadBody(e.to_string()))
    });
    let (id, decoded, binary_out) = match request {
        Ok((request, raw)) => {
            let id = request.id.unwrap_or_else(new_request_id);
            let all_binary = request.parameters.binary_data_output.unwrap_or(false);
            let binary_out = BinaryOutputs {
                all: all_binary,
                named: request
                    .outputs
                    .iter()
                    .flatten()
                    .map(|o| {
                        (
                            o.name.clone(),
                            o.parameters.binary_data.unwrap_or(all_binary),
                        )
                    })
                    .collect(),
            };
            let outputs = request
                .outputs
                .map(|o| o.into_iter().map(|o| o.name).collect());
            (
                id,
                decode_inputs(request.inputs, raw).map(|i| (i, outputs)),
                binary_out,
            )
        }
        Err(e) => (new_request_id(), Err(e), BinaryOutputs::default()),
    };
    drop(body);
    host.run_routed(&target, &id, decoded, started, |result| match result {
        Ok(outputs) => respond(&target.model, &target.version, &id, outputs, &binary_out),
        Err(e) => e.response(),
    })
    .await
}

/// Which outputs go back as binary data: those the request asked for so,
/// and, when `all`, every output it did not name.
#[derive(Debug, Default)]
struct BinaryOutputs {
    all: bool,
    named: std::collections::HashMap<String, bool>,
}

impl BinaryOutputs {
    fn wants(&self, name: &str) -> bool {
        self.named.get(name).copied().unwrap_or(self.all)
    }
}

/// The answer: JSON, or a JSON header followed by the binary outputs' bytes.
fn respond(
    model: &str,
    version: &str,
    id: &str,
    outputs: &[(String, edgeloop_models::Tensor)],
    binary_out: &BinaryOutputs,
) -> Response {
    let mut blob = Vec::new();
    let mut any_binary = false;
    let described = outputs
        .iter()
        .map(|(name, tensor)| {
            if binary_out.wants(name) {
                any_binary = true;
                let bytes = binary::to_bytes(tensor);
                let out = ResponseOutput::binary(name, tensor, bytes.len());
                blob.extend_from_slice(&bytes);
                out
            } else {
                ResponseOutput::new(name, tensor)
            }
        })
        .collect();
    let body = InferResponse {
        model_name: model,
        model_version: version,
        id,
        outputs: described,
    };
    let mut header = match serde_json::to_vec(&body) {
        Ok(bytes) => bytes,
        Err(e) => return ServeError::Inference(format!("writing the response: {e}")).response(),
    };
    if !any_binary {
        return json_bytes(header);
    }
    let header_len = header.len();
    header.extend_from_slice(&blob);
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::HeaderName::from_static(binary::HEADER),
                HeaderValue::from(header_len),
            ),
        ],
        header,
    )
        .into_response()
}

fn json_bytes(bytes: Vec<u8>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        bytes,
    )
        .into_response()
}

async fn metrics(State(host): Host) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        host.metrics_text(),
    )
        .into_response()
}

async fn no_route(uri: Uri) -> Response {
    ServeError::NoRoute(uri.path().to_string()).response()
}

async fn wrong_method(method: Method, uri: Uri) -> Response {
    ServeError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
    .response()
}
