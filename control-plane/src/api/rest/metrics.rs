//! `GET /metrics`: Prometheus text. Counters, gauges and one latency
//! histogram; no identities, so it is
//! served without a token, like `/healthz`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::Core;

/// The control plane's own counters.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(core): State<Arc<Core>>) -> impl IntoResponse {
    let c = &core.artifact_cache.counters;
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, value: u64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name} {value}");
    };
    counter(
        "edgeloop_artifact_store_read_bytes_total",
        "Bytes read from the artifact store to serve device and bridge downloads.",
        c.store_read_bytes.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_artifact_cache_hits_total",
        "Device downloads served from the in-memory artifact cache.",
        c.hits.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_artifact_cache_misses_total",
        "Artifacts loaded into the cache from the store.",
        c.misses.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_artifact_cache_evictions_total",
        "Artifacts dropped from the cache to stay within its budget.",
        c.evictions.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_artifacts_collected_total",
        "Artifacts no record referenced that garbage collection deleted past their grace period.",
        c.collected.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_artifacts_collected_bytes_total",
        "Bytes of the artifacts garbage collection deleted.",
        c.collected_bytes.load(Ordering::Relaxed),
    );
    let sec = &core.security;
    counter(
        "edgeloop_console_unauthenticated_total",
        "Console calls refused for a missing, unknown, expired or revoked token.",
        sec.unauthenticated.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_console_forbidden_total",
        "Console calls refused because the token's role lacks the permission.",
        sec.forbidden.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_device_foreign_data_refused_total",
        "Telemetry items and status reports refused for a model version the device was never assigned.",
        sec.foreign_device_data.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_device_over_quota_refused_total",
        "Sketches and samples refused over a device's per-model hourly quota.",
        sec.device_over_quota.load(Ordering::Relaxed),
    );
    counter(
        "edgeloop_device_telemetry_throttled_total",
        "Telemetry reports refused (RESOURCE_EXHAUSTED, retried by the agent) over a device's hourly byte rate.",
        sec.device_telemetry_throttled.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP edgeloop_ca_expiry_timestamp_seconds When the CA certificate ends (Unix time).\n\
         # TYPE edgeloop_ca_expiry_timestamp_seconds gauge\n\
         edgeloop_ca_expiry_timestamp_seconds {}\n\
         # HELP edgeloop_server_certificate_expiry_timestamp_seconds When the gRPC server certificate ends (Unix time).\n\
         # TYPE edgeloop_server_certificate_expiry_timestamp_seconds gauge\n\
         edgeloop_server_certificate_expiry_timestamp_seconds {}",
        core.pki.ca_not_after().unix_timestamp(),
        core.pki.server_not_after().unix_timestamp(),
    );
    let _ = writeln!(
        out,
        "# HELP edgeloop_artifact_cache_bytes Bytes held by the artifact cache.\n\
         # TYPE edgeloop_artifact_cache_bytes gauge\n\
         edgeloop_artifact_cache_bytes {}",
        core.artifact_cache.held_bytes()
    );
    let _ = writeln!(
        out,
        "# HELP edgeloop_downloads_waiting Artifact streams open that wait for a download permit.\n\
         # TYPE edgeloop_downloads_waiting gauge\n\
         edgeloop_downloads_waiting {}\n\
         # HELP edgeloop_rollout_wakeups_queued Devices a rollout has assigned and not yet woken (paced by the waiting downloads).\n\
         # TYPE edgeloop_rollout_wakeups_queued gauge\n\
         edgeloop_rollout_wakeups_queued {}",
        core.downloads.waiting(),
        core.wakeups.queued()
    );
    core.heartbeat_latency.write(
        &mut out,
        "edgeloop_heartbeat_handling_seconds",
        "How long the control plane took to answer a device or bridge heartbeat, from the handler's start to its reply.",
    );
    edgeloop_errors::device_counts::write_metrics(&mut out);
    core.task_restarts.write_metrics(&mut out);
    core.store.write_metrics(&mut out);
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
