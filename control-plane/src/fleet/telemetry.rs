//! What devices report: batched telemetry (deduplicated by sequence, since an
//! agent replays its offline buffer) and the state of each assignment.
//!
//! A report's sketches and samples go to their own trees (see
//! [`crate::drift::records`]), keyed by model and version for drift analysis; the
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

use std::collections::BTreeMap;

use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::admission;
use crate::drift::records::{self as drift, record_key};
use crate::error::{Error, Result};
use crate::store::Store;

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

/// The state a device last reported for one assignment, as stored.
///
/// Written in snake case (`"rolled_back"`). Records written before this type
/// hold the protobuf enum names (`"ASSIGNMENT_STATE_ROLLED_BACK"`); the
/// aliases read them, so no rewrite of the tree is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssignmentState {
    #[serde(alias = "ASSIGNMENT_STATE_DOWNLOADING")]
    Downloading,
    #[serde(alias = "ASSIGNMENT_STATE_ACTIVATING")]
    Activating,
    #[serde(alias = "ASSIGNMENT_STATE_ACTIVE")]
    Active,
    #[serde(alias = "ASSIGNMENT_STATE_FAILED")]
    Failed,
    #[serde(alias = "ASSIGNMENT_STATE_ROLLED_BACK")]
    RolledBack,
}

impl AssignmentState {
    /// The reported state; `None` for `UNSPECIFIED`, which is not a state.
    pub fn from_proto(state: pb::AssignmentState) -> Option<Self> {
        Some(match state {
            pb::AssignmentState::Unspecified => return None,
            pb::AssignmentState::Downloading => Self::Downloading,
            pb::AssignmentState::Activating => Self::Activating,
            pb::AssignmentState::Active => Self::Active,
            pb::AssignmentState::Failed => Self::Failed,
            pb::AssignmentState::RolledBack => Self::RolledBack,
        })
    }
}

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

pub fn to_time(ts: Option<edgeloop_proto::Timestamp>) -> Option<OffsetDateTime> {
    let ts = ts?;
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

fn telemetry_key(device: &str, sequence: u64) -> String {
    format!("{device}/{sequence:020}")
}

/// Sequences an epoch may use (4 billion 30-second windows); each epoch's
/// span starts at a multiple of it.
pub const EPOCH_SPAN: u64 = 1 << 32;

/// Where `epoch`'s sequences start for `device`: found, or given the span
/// above everything the device stored and every span already given.
fn epoch_base(store: &Store, device: &str, epoch: u64) -> Result<u64> {
    if epoch == 0 {
        return Ok(0);
    }
    let key = format!("{device}/{epoch:016x}");
    loop {
        if let Some(base) = store.telemetry_epochs.get(&key)? {
            return Ok(base);
        }
        let stored = store
            .telemetry
            .last_with_prefix(&format!("{device}/"))?
            .map_or(0, |(k, _)| key_sequence(&k));
        let given = store
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
        if store.telemetry_epochs.insert_new(&key, &base)? {
            return Ok(base);
        }
    }
}

/// The highest sequence stored in the span at `base` (0 if none), as the
/// epoch counts it.
fn acked_in_span(store: &Store, device: &str, base: u64) -> Result<u64> {
    let end = base.saturating_add(EPOCH_SPAN);
    Ok(store
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
    store: &Store,
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
    let (mut recorded, models) = if store.telemetry.contains(&key)? {
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
    store: &Store,
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
        store.sketches.insert(&k, s)?;
    }
    let mut sample_models: Vec<String> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let k = record_key(&s.model_name, &s.model_version, device, seq, i);
        crate::drift::retention::store_sample(store, &k, s)?;
        if !sample_models.contains(&s.model_name) {
            sample_models.push(s.model_name.clone());
        }
    }
    // Last: this record is what marks the sequence as stored.
    store.telemetry.insert_new(key, &record)?;
    Ok((recorded, sample_models))
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
    let Some(state) = AssignmentState::from_proto(state) else {
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
    store.assignment_status.update(&key, |current| {
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
mod tests {
    use super::*;

    fn report(sequence: u64) -> pb::TelemetryReport {
        pb::TelemetryReport {
            sequence,
            sketches: vec![pb::ModelSketch {
                model_name: "m".into(),
                model_version: "1".into(),
                requests: 2,
                features: vec![pb::FeatureHistogram {
                    name: "x".into(),
                    bin_edges: vec![0.0, 1.0],
                    counts: vec![2],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            samples: vec![pb::Sample {
                kind: pb::SampleKind::Feedback as i32,
                model_name: "m".into(),
                model_version: "1".into(),
                request_id: "r".into(),
                label: Some(1),
                ..Default::default()
            }],
            dropped_batches: 2,
            ..Default::default()
        }
    }

    /// Records a report as the gRPC handler does, for a device assigned
    /// `m` versions 0 to 9, with the default quota; the ack.
    fn ingest(
        store: &Store,
        device: &str,
        report: pb::TelemetryReport,
        now: OffsetDateTime,
    ) -> Result<u64> {
        assign_m(store, device);
        let quotas = admission::Quotas::default();
        let admit = Admission {
            quota: admission::Quota::default(),
            quotas: &quotas,
        };
        Ok(record_telemetry(store, &admit, device, report, now)?
            .0
            .acked)
    }

    fn assign_m(store: &Store, device: &str) {
        for v in 0..10 {
            admission::remember(store, device, "m", &v.to_string()).unwrap();
        }
    }

    fn status(
        generation: u64,
        version: &str,
        state: pb::AssignmentState,
        serving: &str,
    ) -> pb::AssignmentStatusReport {
        pb::AssignmentStatusReport {
            generation,
            model_name: "m".into(),
            model_version: version.into(),
            state: state as i32,
            serving_version: serving.into(),
            ..Default::default()
        }
    }

    /// A buffer lost on the device starts a new epoch at sequence 1. Its
    /// reports are stored (not taken for the old epoch's), its ack counts
    /// only its own, a replay within an epoch is still a duplicate, and an
    /// agent from before epochs keeps its numbering.
    #[test]
    fn a_new_epoch_starts_its_own_span_and_acks_only_its_own_reports() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let now = OffsetDateTime::now_utc();
        let at = |epoch: u64, seq: u64| pb::TelemetryReport {
            epoch,
            ..report(seq)
        };
        let stored = || store.telemetry.scan_prefix("d/").unwrap().len();
        // The old buffer sent five.
        for seq in 1..=5 {
            assert_eq!(ingest(&store, "d", at(0xa, seq), now).unwrap(), seq);
        }
        // It is wiped: the new epoch's 1 and 2 are new reports, acked as 1, 2.
        assert_eq!(ingest(&store, "d", at(0xb, 1), now).unwrap(), 1);
        assert_eq!(ingest(&store, "d", at(0xb, 2), now).unwrap(), 2);
        assert_eq!(stored(), 7);
        // A replay of either epoch's report is a duplicate.
        assert_eq!(ingest(&store, "d", at(0xb, 1), now).unwrap(), 2);
        assert_eq!(ingest(&store, "d", at(0xa, 3), now).unwrap(), 5);
        assert_eq!(stored(), 7);
        // Each epoch has its own span, above the ones before.
        let stored_at: Vec<(u64, u64, u64)> = store
            .telemetry
            .scan_prefix("d/")
            .unwrap()
            .into_iter()
            .map(|(k, r)| (key_sequence(&k), r.epoch, r.sequence))
            .collect();
        let (a, b) = (EPOCH_SPAN, 2 * EPOCH_SPAN);
        assert_eq!(
            stored_at,
            vec![
                (a + 1, 0xa, 1),
                (a + 2, 0xa, 2),
                (a + 3, 0xa, 3),
                (a + 4, 0xa, 4),
                (a + 5, 0xa, 5),
                (b + 1, 0xb, 1),
                (b + 2, 0xb, 2)
            ]
        );
        // Samples and sketches of both epochs are all kept.
        assert_eq!(store.samples.scan_prefix("m/").unwrap().len(), 7);
        // Before epochs: the span at 0, as such reports were always stored.
        assert_eq!(ingest(&store, "old", report(1), now).unwrap(), 1);
        assert_eq!(
            store.telemetry.scan_prefix("old/").unwrap()[0].1.sequence,
            1
        );
        // Another device's epoch is its own.
        assert_eq!(ingest(&store, "e", at(0xb, 9), now).unwrap(), 9);
        // A sequence past the span is refused, naming the field.
        match ingest(&store, "d", at(0xb, EPOCH_SPAN), now) {
            Err(Error::BadRequest { field, .. }) => assert_eq!(field.as_deref(), Some("sequence")),
            other => panic!("{other:?}"),
        }
    }

    /// The compactor (`crate::retention`) drops reports and sketches by the
    /// age they were received at, keeps each device's newest report (its
    /// ack's anchor), and leaves what is young.
    #[test]
    fn retention_drops_old_reports_and_sketches_but_keeps_each_devices_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let t0 = OffsetDateTime::now_utc() - time::Duration::days(45);
        let day = |n: i64| t0 + time::Duration::days(n);
        for (seq, at) in [(1, day(0)), (2, day(20)), (3, day(35))] {
            ingest(&store, "d", report(seq), at).unwrap();
        }
        ingest(&store, "lone", report(1), day(0)).unwrap();
        let now = day(45);
        let r = crate::retention::Retention {
            telemetry: time::Duration::days(30),
            sketches: time::Duration::days(20),
            ..Default::default()
        };
        let artifacts =
            crate::registry::artifacts::LocalArtifactStore::open(&dir.path().join("a")).unwrap();
        let dropped = crate::retention::prune(&store, &artifacts, r, now).unwrap();
        assert_eq!((dropped.telemetry, dropped.sketches), (1, 3));
        let seqs = |device: &str| -> Vec<u64> {
            store
                .telemetry
                .scan_prefix(&format!("{device}/"))
                .unwrap()
                .into_iter()
                .map(|(_, r)| r.sequence)
                .collect()
        };
        assert_eq!(seqs("d"), vec![2, 3], "the 45-day-old report went");
        assert_eq!(seqs("lone"), vec![1], "a device's newest report stays");
        // Sketches older than 20 days went (d's first two, lone's one).
        assert_eq!(store.sketches.scan_prefix("m/").unwrap().len(), 1);
        // The ack still counts from what is kept.
        assert_eq!(ingest(&store, "d", report(4), now).unwrap(), 4);
        // A second pass finds nothing more.
        let again = crate::retention::prune(&store, &artifacts, r, now).unwrap();
        assert_eq!(again, crate::retention::Dropped::default());
    }

    #[test]
    fn status_keeps_what_serves_and_ignores_older_generations() {
        use pb::AssignmentState as S;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let now = OffsetDateTime::now_utc();
        let get = || store.assignment_status.get("d/m").unwrap().unwrap();
        assign_m(&store, "d");
        record_status(&store, "d", status(1, "1", S::Active, "1"), now).unwrap();
        assert_eq!(get().running_version.as_deref(), Some("1"));
        // Version 2 fails its activation; 1 still serves.
        record_status(&store, "d", status(2, "2", S::RolledBack, "1"), now).unwrap();
        assert_eq!(
            (get().state, get().running_version.as_deref()),
            (AssignmentState::RolledBack, Some("1"))
        );
        // A retried report of generation 1 arrives late: generation 2 stands.
        record_status(&store, "d", status(1, "1", S::Active, "1"), now).unwrap();
        assert_eq!(get().generation, 2);
        // A reverted assignment: the old version serves again.
        record_status(&store, "d", status(3, "0", S::RolledBack, "0"), now).unwrap();
        assert_eq!(get().running_version.as_deref(), Some("0"));
        // Without the field (an older agent): active is what serves, a
        // download leaves what served before.
        record_status(&store, "d", status(4, "5", S::Downloading, ""), now).unwrap();
        assert_eq!(get().running_version.as_deref(), Some("0"));
        record_status(&store, "d", status(4, "5", S::Active, ""), now).unwrap();
        assert_eq!(get().running_version.as_deref(), Some("5"));
    }

    /// A device with a valid certificate writes only into what it was
    /// assigned: another model, or another version of its own, is refused
    /// and counted; and each model's samples stop at the quota.
    #[test]
    fn a_device_reports_only_on_what_it_was_assigned_within_its_quota() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let now = OffsetDateTime::now_utc();
        admission::remember(&store, "d", "m", "1").unwrap();
        let quotas = admission::Quotas::default();
        let admit = Admission {
            quota: admission::Quota {
                sketches_per_hour: 100,
                samples_per_hour: 3,
                ..admission::Quota::default()
            },
            quotas: &quotas,
        };
        let mut r = report(1);
        let honest = (r.sketches[0].clone(), r.samples[0].clone());
        for (model, version) in [("victim", "1"), ("m", "2")] {
            let mut sketch = honest.0.clone();
            (sketch.model_name, sketch.model_version) = (model.into(), version.into());
            r.sketches.push(sketch);
            let mut sample = honest.1.clone();
            (sample.model_name, sample.model_version) = (model.into(), version.into());
            r.samples.push(sample);
            r.models.push(pb::ModelMetrics {
                model_name: model.into(),
                model_version: version.into(),
                requests: 1,
                ..Default::default()
            });
        }
        for i in 0..4 {
            let mut sample = honest.1.clone();
            sample.request_id = format!("more-{i}");
            r.samples.push(sample);
        }
        let (rec, models) = record_telemetry(&store, &admit, "d", r, now).unwrap();
        assert_eq!(
            rec,
            Recorded {
                acked: 1,
                refused_foreign: 6,
                refused_over_quota: 2,
            }
        );
        assert_eq!(models, ["m"]);
        assert_eq!(store.sketches.scan_prefix("").unwrap().len(), 1);
        assert!(store.samples.scan_prefix("victim/").unwrap().is_empty());
        assert!(store.samples.scan_prefix("m/2/").unwrap().is_empty());
        assert_eq!(store.samples.scan_prefix("m/1/d/").unwrap().len(), 3);
        let stored = store
            .telemetry
            .get("d/00000000000000000001")
            .unwrap()
            .unwrap();
        assert!(stored.models.is_empty(), "{:?}", stored.models);
        assert_eq!((stored.refused_foreign, stored.refused_over_quota), (6, 2));

        let mut foreign = status(1, "1", pb::AssignmentState::Active, "1");
        foreign.model_name = "victim".into();
        assert!(matches!(
            record_status(&store, "d", foreign, now),
            Err(Error::PermissionDenied(_))
        ));
        assert!(store.assignment_status.get("d/victim").unwrap().is_none());
    }

    #[test]
    fn a_replayed_report_is_stored_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let now = OffsetDateTime::now_utc();
        assert_eq!(ingest(&store, "d", report(1), now).unwrap(), 1);
        // The replay differs (a bug on the device): the first copy stays.
        let mut replay = report(1);
        replay.sketches[0].requests = 99;
        assert_eq!(ingest(&store, "d", replay, now).unwrap(), 1);
        assert_eq!(ingest(&store, "d", report(2), now).unwrap(), 2);
        assert_eq!(ingest(&store, "other", report(1), now).unwrap(), 1);

        let sketches = store.sketches.scan_prefix("m/1/d/").unwrap();
        assert_eq!(sketches.len(), 2);
        assert_eq!(sketches[0].1.requests, 2);
        assert_eq!(store.samples.scan_prefix("m/").unwrap().len(), 3);
        let rec = store
            .telemetry
            .get("d/00000000000000000001")
            .unwrap()
            .unwrap();
        assert_eq!(
            (rec.sketch_count, rec.sample_count, rec.dropped_batches),
            (1, 1, 2)
        );
    }

    #[test]
    fn an_invalid_report_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let mut bad = report(1);
        bad.samples[0].kind = 0;
        let err = ingest(&store, "d", bad, OffsetDateTime::now_utc()).unwrap_err();
        assert!(
            matches!(&err, Error::BadRequest { field: Some(f), .. } if f == "samples[0].kind"),
            "{err}"
        );
        assert!(store.sketches.scan_prefix("").unwrap().is_empty());
        assert!(store.telemetry.scan_prefix("").unwrap().is_empty());
        let err = ingest(&store, "d", report(0), OffsetDateTime::now_utc()).unwrap_err();
        assert!(err.to_string().contains("start at 1"));
        let mut bad = report(1);
        bad.models.push(pb::ModelMetrics {
            latency_p99_ms: f64::INFINITY,
            ..Default::default()
        });
        let err = ingest(&store, "d", bad, OffsetDateTime::now_utc()).unwrap_err();
        assert!(
            matches!(&err, Error::BadRequest { field: Some(f), .. } if f == "models[0].latency_p99_ms"),
            "{err}"
        );
    }

    #[test]
    fn status_records_written_with_proto_names_still_decode() {
        let old = serde_json::json!({
            "device": "d",
            "generation": 3,
            "model_name": "m",
            "model_version": "2",
            "state": "ASSIGNMENT_STATE_ROLLED_BACK",
            "reason": "probe failed",
            "execution_provider": "CPUExecutionProvider",
            "at": "2024-05-01T12:00:00Z",
        });
        let record: AssignmentStatusRecord = serde_json::from_value(old).unwrap();
        assert_eq!(record.state, AssignmentState::RolledBack);
        assert_eq!(record.running_version, None);
        for (name, state) in [
            ("ASSIGNMENT_STATE_DOWNLOADING", AssignmentState::Downloading),
            ("ASSIGNMENT_STATE_ACTIVATING", AssignmentState::Activating),
            ("ASSIGNMENT_STATE_ACTIVE", AssignmentState::Active),
            ("ASSIGNMENT_STATE_FAILED", AssignmentState::Failed),
            ("ASSIGNMENT_STATE_ROLLED_BACK", AssignmentState::RolledBack),
        ] {
            let old: AssignmentState = serde_json::from_value(name.into()).unwrap();
            assert_eq!(old, state);
            // New writes use the short form, which reads back the same.
            let new = serde_json::to_value(state).unwrap();
            assert_eq!(
                new,
                name.trim_start_matches("ASSIGNMENT_STATE_").to_lowercase()
            );
            assert_eq!(
                serde_json::from_value::<AssignmentState>(new).unwrap(),
                state
            );
        }
        assert!(
            serde_json::from_value::<AssignmentState>("ASSIGNMENT_STATE_UNSPECIFIED".into())
                .is_err()
        );
    }

    #[test]
    fn the_store_reads_an_old_status_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        // Written as the previous release wrote it.
        let old = br#"{"device":"d","generation":1,"model_name":"m","model_version":"1","state":"ASSIGNMENT_STATE_ACTIVE","reason":"","execution_provider":"","at":"2024-05-01T12:00:00Z","running_version":"1"}"#;
        {
            let db = sled::Config::new().path(&path).open().unwrap();
            db.open_tree("assignment_status")
                .unwrap()
                .insert("d/m", &old[..])
                .unwrap();
            db.flush().unwrap();
        }
        let store = Store::open(&path).unwrap();
        let got = store.assignment_status.get("d/m").unwrap().unwrap();
        assert_eq!(got.state, AssignmentState::Active);
    }
}
