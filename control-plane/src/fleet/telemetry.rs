//! What devices report: batched telemetry (deduplicated by sequence, since an
//! agent replays its offline buffer) and the state of each assignment.

use std::collections::BTreeMap;

use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::{Error, Result};
use crate::store::Store;

pub const MAX_MODELS_PER_REPORT: usize = 256;
pub const MAX_EVENTS_PER_REPORT: usize = 1024;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TelemetryRecord {
    pub device: String,
    pub sequence: u64,
    #[serde(with = "time::serde::rfc3339::option")]
    pub recorded_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    pub models: Vec<ModelMetricsRecord>,
    pub events: Vec<EventRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelMetricsRecord {
    pub model_name: String,
    pub model_version: String,
    pub requests: u64,
    pub errors: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub execution_provider: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventRecord {
    #[serde(with = "time::serde::rfc3339::option")]
    pub at: Option<OffsetDateTime>,
    pub kind: String,
    pub message: String,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignmentStatusRecord {
    pub device: String,
    pub generation: u64,
    pub model_name: String,
    pub model_version: String,
    pub state: String,
    pub reason: String,
    pub execution_provider: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

pub fn to_time(ts: Option<edgeloop_proto::Timestamp>) -> Option<OffsetDateTime> {
    let ts = ts?;
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

fn telemetry_key(device: &str, sequence: u64) -> String {
    format!("{device}/{sequence:020}")
}

/// Stores a report unless this sequence was stored before. Returns the
/// highest stored sequence for the device (the ack).
pub fn record_telemetry(
    store: &Store,
    device: &str,
    report: pb::TelemetryReport,
    now: OffsetDateTime,
) -> Result<u64> {
    if report.sequence == 0 {
        return Err(Error::bad_field("sequence", "must start at 1"));
    }
    if report.models.len() > MAX_MODELS_PER_REPORT {
        return Err(Error::bad_field(
            "models",
            format!("at most {MAX_MODELS_PER_REPORT} per report"),
        ));
    }
    if report.events.len() > MAX_EVENTS_PER_REPORT {
        return Err(Error::bad_field(
            "events",
            format!("at most {MAX_EVENTS_PER_REPORT} per report"),
        ));
    }
    let record = TelemetryRecord {
        device: device.to_string(),
        sequence: report.sequence,
        recorded_at: to_time(report.recorded_at),
        received_at: now,
        models: report
            .models
            .into_iter()
            .map(|m| ModelMetricsRecord {
                model_name: m.model_name,
                model_version: m.model_version,
                requests: m.requests,
                errors: m.errors,
                latency_p50_ms: m.latency_p50_ms,
                latency_p99_ms: m.latency_p99_ms,
                execution_provider: m.execution_provider,
            })
            .collect(),
        events: report
            .events
            .into_iter()
            .map(|e| EventRecord {
                at: to_time(e.at),
                kind: e.kind,
                message: e.message,
                attributes: e.attributes.into_iter().collect(),
            })
            .collect(),
    };
    // A replayed sequence is a duplicate: keep the first copy.
    store
        .telemetry
        .insert_new(&telemetry_key(device, record.sequence), &record)?;
    Ok(store
        .telemetry
        .last_with_prefix(&format!("{device}/"))?
        .map_or(0, |(_, r)| r.sequence))
}

pub fn record_status(
    store: &Store,
    device: &str,
    report: pb::AssignmentStatusReport,
    now: OffsetDateTime,
) -> Result<()> {
    let state = pb::AssignmentState::try_from(report.state).map_err(|_| {
        Error::bad_field(
            "state",
            format!("unknown assignment state {}", report.state),
        )
    })?;
    if state == pb::AssignmentState::Unspecified {
        return Err(Error::bad_field("state", "must be set"));
    }
    if report.model_name.is_empty() {
        return Err(Error::bad_field("model_name", "must be set"));
    }
    let record = AssignmentStatusRecord {
        device: device.to_string(),
        generation: report.generation,
        model_name: report.model_name.chars().take(256).collect(),
        model_version: report.model_version.chars().take(256).collect(),
        state: state.as_str_name().to_string(),
        reason: report.reason.chars().take(4096).collect(),
        execution_provider: report.execution_provider.chars().take(256).collect(),
        at: to_time(report.at).unwrap_or(now),
    };
    store
        .assignment_status
        .insert(&format!("{device}/{}", record.model_name), &record)?;
    Ok(())
}
