//! What devices report: batched telemetry (deduplicated by sequence, since an
//! agent replays its offline buffer) and the state of each assignment.
//!
//! A report's sketches and samples go to their own trees (see
//! [`edgeloop_drift::records`]), keyed by model and version for drift analysis; the
//! report's own record is written last, with a compare-and-swap, and is
//! what marks the sequence as stored. A crash before it leaves keys that the
//! agent's retry rewrites with the same content, so every report is stored
//! exactly once.
//!
//! An agent numbers its reports from 1 within an epoch, which it picks
//! when its telemetry buffer is created; a lost or reset buffer starts a
//! new one. Each epoch gets its own span of the device's one sequence space
//! ([`EPOCH_SPAN`] above everything stored before it), so a fresh buffer's
//! reports are never taken for duplicates of an old one's, and the ack
//! counts only the epoch's own reports. Epoch 0 (agents from before
//! epochs) is the span at 0, as those reports were always stored.

use edgeloop_proto::to_time;
use std::collections::BTreeMap;

use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::admission;
use crate::db::Db;
use edgeloop_drift::records::{self as drift, record_key};
use edgeloop_errors::{Error, Result};

pub const MAX_MODELS_PER_REPORT: usize = 256;
pub const MAX_EVENTS_PER_REPORT: usize = 1024;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TelemetryRecord {
    pub device: String,
    /// The agent's own, within its epoch (the key holds it plus the
    /// epoch's base, [`EPOCH_SPAN`]).
    pub sequence: u64,
    /// The agent buffer's epoch (0 before epochs).
    #[serde(default)]
    pub epoch: u64,
    #[serde(with = "time::serde::rfc3339::option")]
    pub recorded_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    pub models: Vec<ModelMetricsRecord>,
    pub events: Vec<EventRecord>,
    /// The window the report's sketches cover.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub window_start: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub window_end: Option<OffsetDateTime>,
    /// Sketches, samples and model metrics refused because they name a
    /// model version never assigned to this device.
    #[serde(default)]
    pub refused_foreign: u64,
    /// Sketches and samples refused over the device's per-model quota.
    #[serde(default)]
    pub refused_over_quota: u64,
    /// Sketches and samples stored with this report (in their own trees).
    #[serde(default)]
    pub sketch_count: u64,
    #[serde(default)]
    pub sample_count: u64,
    /// Reports and samples the device dropped unsent (buffer full) since
    /// its previous report.
    #[serde(default)]
    pub dropped_batches: u64,
    #[serde(default)]
    pub dropped_samples: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelMetricsRecord {
    pub model_name: String,
    pub model_version: String,
    pub requests: u64,
    pub errors: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub execution_provider: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventRecord {
    #[serde(with = "time::serde::rfc3339::option")]
    pub at: Option<OffsetDateTime>,
    pub kind: String,
    pub message: String,
    pub attributes: BTreeMap<String, String>,
}

pub use edgeloop_api::fleet::AssignmentState;

/// The reported state; `None` for `UNSPECIFIED`, which is not a state.
fn state_from_proto(state: pb::AssignmentState) -> Option<AssignmentState> {
    use AssignmentState as S;
    Some(match state {
        pb::AssignmentState::Unspecified => return None,
        pb::AssignmentState::Downloading => S::Downloading,
        pb::AssignmentState::Activating => S::Activating,
        pb::AssignmentState::Active => S::Active,
        pb::AssignmentState::Failed => S::Failed,
        pb::AssignmentState::RolledBack => S::RolledBack,
    })
}

/// The state a device last reported for one assignment, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignmentStatusRecord {
    pub device: String,
    pub generation: u64,
    pub model_name: String,
    pub model_version: String,
    pub state: AssignmentState,
    pub reason: String,
    pub execution_provider: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The version the device last reported `ACTIVE` for this model: what it
    /// serves while a newer assignment downloads, fails or is rolled back by
    /// the agent (which keeps the old session serving in all three cases).
    #[serde(default)]
    pub running_version: Option<String>,
}

fn telemetry_key(device: &str, sequence: u64) -> String {
    format!("{device}/{sequence:020}")
}

/// Sequences an epoch may use (4 billion 30-second windows); each epoch's
/// span starts at a multiple of it.
pub const EPOCH_SPAN: u64 = 1 << 32;

/// Where `epoch`'s sequences start for `device`: found, or given the span
/// above everything the device stored and every span already given.
fn epoch_base(store: &Db, device: &str, epoch: u64) -> Result<u64> {
    if epoch == 0 {
        return Ok(0);
    }
    let key = format!("{device}/{epoch:016x}");
    loop {
        if let Some(base) = store.fleet.telemetry_epochs.get(&key)? {
            return Ok(base);
        }
        let stored = store
            .fleet
            .telemetry
            .last_with_prefix(&format!("{device}/"))?
            .map_or(0, |(k, _)| key_sequence(&k));
        let given = store
            .fleet
            .telemetry_epochs
            .scan_prefix(&format!("{device}/"))?
            .into_iter()
            .map(|(_, b)| b)
            .max()
            .unwrap_or(0);
        let base = (stored.max(given) / EPOCH_SPAN)
            .checked_add(1)
            .and_then(|n| n.checked_mul(EPOCH_SPAN))
            .ok_or_else(|| Error::Conflict(format!("device {device} has no epoch span left")))?;
        // Lost a race with the device's other connection: read theirs.
        if store.fleet.telemetry_epochs.insert_new(&key, &base)? {
            return Ok(base);
        }
    }
}

/// The highest sequence stored in the span at `base` (0 if none), as the
/// epoch counts it.
fn acked_in_span(store: &Db, device: &str, base: u64) -> Result<u64> {
    let end = base.saturating_add(EPOCH_SPAN);
    Ok(store
        .fleet
        .telemetry
        .last_in_range(&telemetry_key(device, base), &telemetry_key(device, end))?
        .map_or(0, |(k, _)| key_sequence(&k).saturating_sub(base)))
}

/// The sequence a telemetry key ends in (the device's one space).
fn key_sequence(key: &str) -> u64 {
    key.rsplit('/')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What a report's admission needs: the quota and the buckets it draws on.
pub struct Admission<'a> {
    pub quota: admission::Quota,
    pub quotas: &'a admission::Quotas,
}

/// What [`record_telemetry`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The highest stored sequence for the device (the ack).
    pub acked: u64,
    /// Items refused for naming a version never assigned to the device.
    pub refused_foreign: u64,
    /// Items refused over the device's per-model quota.
    pub refused_over_quota: u64,
}

/// Stores a report unless this sequence was stored before, keeping only
/// what the device may report about ([`admission`]). Also returns the
/// models whose samples were stored (for sample retention).
pub fn record_telemetry(
    store: &Db,
    admit: &Admission<'_>,
    device: &str,
    report: pb::TelemetryReport,
    now: OffsetDateTime,
) -> Result<(Recorded, Vec<String>)> {
    if report.sequence == 0 {
        return Err(Error::bad_field("sequence", "must start at 1"));
    }
    if report.sequence >= EPOCH_SPAN {
        return Err(Error::bad_field(
            "sequence",
            format!("must be below {EPOCH_SPAN} within an epoch"),
        ));
    }
    let base = epoch_base(store, device, report.epoch)?;
    let key = telemetry_key(device, base + report.sequence);
    // A replayed sequence is a duplicate: keep the first copy.
    let (mut recorded, models) = if store.fleet.telemetry.contains(&key)? {
        (Recorded::default(), Vec::new())
    } else {
        store_new(store, admit, device, &key, base, report, now)?
    };
    // Only this epoch's: a fresh buffer's ack never covers what it has
    // not sent.
    recorded.acked = acked_in_span(store, device, base)?;
    Ok((recorded, models))
}

/// One report's admission: the assignment history it reads, the quota it
/// draws on, and what it refused.
struct Admitter<'a> {
    assigned: admission::Assigned<'a>,
    admit: &'a Admission<'a>,
    device: &'a str,
    now: OffsetDateTime,
    recorded: Recorded,
}

impl Admitter<'_> {
    /// Keeps the items whose (model, version) the device was assigned,
    /// then up to its quota per model; counts the rest.
    fn items<T>(
        &mut self,
        items: Vec<T>,
        pair: impl Fn(&T) -> (&str, &str),
        kind: admission::Kind,
    ) -> Result<Vec<T>> {
        let mut by_model: BTreeMap<String, Vec<T>> = BTreeMap::new();
        for item in items {
            let (model, version) = pair(&item);
            if self.assigned.check(model, version)? {
                by_model.entry(model.to_string()).or_default().push(item);
            } else {
                self.recorded.refused_foreign += 1;
            }
        }
        let mut kept = Vec::new();
        for (model, mut items) in by_model {
            let n = self.admit.quotas.take(
                self.admit.quota,
                self.device,
                &model,
                kind,
                items.len() as u64,
                self.now,
            );
            self.recorded.refused_over_quota += items.len() as u64 - n;
            items.truncate(n as usize);
            kept.extend(items);
        }
        Ok(kept)
    }
}

fn check_count(field: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::bad_field(field, format!("at most {max} per report")));
    }
    Ok(())
}

const MAX_TEXT_BYTES: usize = 256;
const MAX_MESSAGE_BYTES: usize = 4096;
const MAX_ATTRIBUTES: usize = 64;

fn check_text(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::bad_field(field, format!("at most {max} bytes")));
    }
    Ok(())
}

fn check_models(at: &str, m: &pb::ModelMetrics) -> Result<()> {
    check_text(&format!("{at}.model_name"), &m.model_name, MAX_TEXT_BYTES)?;
    check_text(
        &format!("{at}.model_version"),
        &m.model_version,
        MAX_TEXT_BYTES,
    )?;
    check_text(
        &format!("{at}.execution_provider"),
        &m.execution_provider,
        MAX_TEXT_BYTES,
    )?;
    for (field, v) in [
        ("latency_p50_ms", m.latency_p50_ms),
        ("latency_p99_ms", m.latency_p99_ms),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::bad_field(
                format!("{at}.{field}"),
                format!("must be a finite number >= 0, got {v}"),
            ));
        }
    }
    Ok(())
}

fn check_event(at: &str, e: &pb::Event) -> Result<()> {
    check_text(&format!("{at}.kind"), &e.kind, MAX_TEXT_BYTES)?;
    check_text(&format!("{at}.message"), &e.message, MAX_MESSAGE_BYTES)?;
    if e.attributes.len() > MAX_ATTRIBUTES {
        return Err(Error::bad_field(
            format!("{at}.attributes"),
            format!("at most {MAX_ATTRIBUTES}"),
        ));
    }
    for (k, v) in &e.attributes {
        check_text(&format!("{at}.attributes"), k, MAX_TEXT_BYTES)?;
        check_text(&format!("{at}.attributes.{k}"), v, MAX_MESSAGE_BYTES)?;
    }
    Ok(())
}

fn store_new(
    store: &Db,
    admit: &Admission<'_>,
    device: &str,
    key: &str,
    base: u64,
    report: pb::TelemetryReport,
    now: OffsetDateTime,
) -> Result<(Recorded, Vec<String>)> {
    // Sketches and samples are keyed in the device's one sequence space,
    // so two epochs' reports never share a key.
    let seq = base + report.sequence;
    check_count("models", report.models.len(), MAX_MODELS_PER_REPORT)?;
    check_count("events", report.events.len(), MAX_EVENTS_PER_REPORT)?;
    check_count(
        "sketches",
        report.sketches.len(),
        drift::MAX_SKETCHES_PER_REPORT,
    )?;
    check_count(
        "samples",
        report.samples.len(),
        drift::MAX_SAMPLES_PER_REPORT,
    )?;
    // Everything is checked before anything is written.
    for (i, m) in report.models.iter().enumerate() {
        check_models(&format!("models[{i}]"), m)?;
    }
    for (i, e) in report.events.iter().enumerate() {
        check_event(&format!("events[{i}]"), e)?;
    }
    let sketches = report
        .sketches
        .into_iter()
        .enumerate()
        .map(|(i, s)| drift::sketch(&format!("sketches[{i}]"), device, seq, s))
        .collect::<Result<Vec<_>>>()?;
    let samples = report
        .samples
        .into_iter()
        .enumerate()
        .map(|(i, s)| drift::sample(&format!("samples[{i}]"), device, seq, s))
        .collect::<Result<Vec<_>>>()?;
    // Checked, now admitted: only what the device was assigned, within quota.
    let mut admitter = Admitter {
        assigned: admission::Assigned::new(store, device),
        admit,
        device,
        now,
        recorded: Recorded::default(),
    };
    let sketches = admitter.items(
        sketches,
        |s| (s.model_name.as_str(), s.model_version.as_str()),
        admission::Kind::Sketch,
    )?;
    let samples = admitter.items(
        samples,
        |s| (s.model_name.as_str(), s.model_version.as_str()),
        admission::Kind::Sample,
    )?;
    let mut models = Vec::with_capacity(report.models.len());
    for m in report.models {
        if admitter.assigned.check(&m.model_name, &m.model_version)? {
            models.push(m);
        } else {
            admitter.recorded.refused_foreign += 1;
        }
    }
    let recorded = admitter.recorded;
    // Windows count what arrived when, by this clock, not the device's.
    let mut sketches = sketches;
    let mut samples = samples;
    for s in &mut sketches {
        s.received_at = Some(now);
    }
    for s in &mut samples {
        s.received_at = Some(now);
    }
    let record = TelemetryRecord {
        device: device.to_string(),
        sequence: report.sequence,
        epoch: report.epoch,
        recorded_at: to_time(report.recorded_at),
        received_at: now,
        models: models
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
        window_start: to_time(report.window_start),
        window_end: to_time(report.window_end),
        sketch_count: sketches.len() as u64,
        sample_count: samples.len() as u64,
        dropped_batches: report.dropped_batches,
        dropped_samples: report.dropped_samples,
        refused_foreign: recorded.refused_foreign,
        refused_over_quota: recorded.refused_over_quota,
    };
    if recorded.refused_foreign > 0 {
        tracing::warn!(
            device,
            refused = recorded.refused_foreign,
            "device reported on model versions it was never assigned; refused"
        );
    }
    if record.dropped_batches > 0 || record.dropped_samples > 0 {
        tracing::warn!(
            device,
            dropped_batches = record.dropped_batches,
            dropped_samples = record.dropped_samples,
            "device dropped telemetry while offline"
        );
    }
    for (i, s) in sketches.iter().enumerate() {
        let k = record_key(&s.model_name, &s.model_version, device, seq, i);
        // Stored with its window sums (drift::aggregates).
        edgeloop_drift::aggregates::windows::store_sketch(&store.drift, &k, s)?;
    }
    let mut sample_models: Vec<String> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let k = record_key(&s.model_name, &s.model_version, device, seq, i);
        edgeloop_drift::retention::store_sample(&store.drift, &k, s)?;
        if !sample_models.contains(&s.model_name) {
            sample_models.push(s.model_name.clone());
        }
    }
    // Last: this record is what marks the sequence as stored.
    store.fleet.telemetry.insert_new(key, &record)?;
    Ok((recorded, sample_models))
}

pub fn record_status(
    store: &Db,
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
    let Some(state) = state_from_proto(state) else {
        return Err(Error::bad_field("state", "must be set"));
    };
    if report.model_name.is_empty() {
        return Err(Error::bad_field("model_name", "must be set"));
    }
    if !admission::Assigned::new(store, device).any_version(&report.model_name)? {
        return Err(Error::PermissionDenied(format!(
            "model {:?} was never assigned to this device",
            report.model_name
        )));
    }
    let mut record = AssignmentStatusRecord {
        device: device.to_string(),
        generation: report.generation,
        model_name: report.model_name.chars().take(256).collect(),
        model_version: report.model_version.chars().take(256).collect(),
        state,
        reason: report.reason.chars().take(4096).collect(),
        execution_provider: report.execution_provider.chars().take(256).collect(),
        at: to_time(report.at).unwrap_or(now),
        running_version: None,
    };
    let key = status_key(device, &record.model_name);
    store.fleet.assignment_status.update(&key, |current| {
        Ok::<_, Error>(match current {
            // A retried report of an older set arrives after a newer one's:
            // the newer state stands.
            Some(cur) if cur.generation > record.generation => cur,
            cur => {
                record.running_version = running_version(cur.as_ref(), &report, state);
                record.clone()
            }
        })
    })??;
    Ok(())
}

pub fn status_key(device: &str, model: &str) -> String {
    format!("{device}/{model}")
}

/// What the device serves after this report: what the agent says serves;
/// for a report without that field, the reported version once active and
/// the version before otherwise.
fn running_version(
    previous: Option<&AssignmentStatusRecord>,
    report: &pb::AssignmentStatusReport,
    state: AssignmentState,
) -> Option<String> {
    if !report.serving_version.is_empty() {
        return Some(report.serving_version.chars().take(256).collect());
    }
    match state {
        AssignmentState::Active => Some(report.model_version.chars().take(256).collect()),
        AssignmentState::Failed => None,
        _ => previous.and_then(|p| p.running_version.clone()),
    }
}

#[cfg(test)]
mod tests;
