//! Device benchmarks: candidate models timed on one enrolled device, over
//! the agent's own gRPC channel (`WatchBenchmarks` / `ReportBenchmark`), so
//! a quantization gate can judge latency where the model will run.
//!
//! The decisions are pure and take `now`: which device represents a
//! hardware class ([`representative`]), when an unfinished benchmark has
//! run out of time ([`expire`]), and whether a device's report is
//! acceptable ([`accept_report`]). The rest reads and writes the store.

use std::collections::BTreeSet;

use edgeloop_api::benchmarks::{
    BenchmarkModel, BenchmarkState, BenchmarkView, CreateBenchmark, ModelTiming, DEFAULT_RUNS,
    DEFAULT_TIMEOUT_SECONDS, MAX_MODELS, MAX_RUNS, MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS,
};
use edgeloop_models::manifest::MAX_SIGNED_MANIFEST_BYTES;
use edgeloop_models::names::{is_valid_name, NAME_RULE};
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::members::{member_status, Member, MemberKind, MemberStatus};
use super::{deployments, Events, FleetEvent};
use crate::db::Db;
use crate::Core;
use edgeloop_errors::{Error, Result};

/// Largest inputs file a benchmark sends (one call's tensors).
pub const MAX_INPUTS_BYTES: u64 = 64 << 20;
/// Longest text a device may report per field; longer is cut, not refused,
/// so an error message never loses the report.
const MAX_REPORTED_TEXT: usize = 2048;

/// A model to time, with its size (the device checks its space first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub name: String,
    pub artifact_digest: Digest,
    pub artifact_size: u64,
    #[serde(default)]
    pub manifest_digest: Option<Digest>,
}

impl BenchmarkRecord {
    /// Whether the device may fetch `digest` for this benchmark: its inputs,
    /// a model or a model's manifest.
    pub fn references(&self, digest: Digest) -> bool {
        self.inputs_digest == digest
            || self
                .models
                .iter()
                .any(|m| m.artifact_digest == digest || m.manifest_digest == Some(digest))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchmarkRecord {
    pub id: String,
    pub device: String,
    #[serde(default)]
    pub selector: Option<String>,
    /// What asked for it, when not the console API: a pipeline's step
    /// (`p-7/quantize/1`), so the step finds its benchmark again.
    #[serde(default)]
    pub origin: Option<String>,
    pub state: BenchmarkState,
    pub models: Vec<ModelEntry>,
    pub inputs_digest: Digest,
    pub inputs_size: u64,
    pub runs: u32,
    pub timeout_seconds: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub started_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub timed_on: Option<String>,
    #[serde(default)]
    pub results: Vec<ModelTiming>,
}

impl BenchmarkRecord {
    pub fn deadline(&self) -> OffsetDateTime {
        self.created_at + Duration::seconds(i64::from(self.timeout_seconds))
    }

    pub fn view(self) -> BenchmarkView {
        BenchmarkView {
            id: self.id,
            device: self.device,
            selector: self.selector,
            origin: self.origin,
            state: self.state,
            models: self
                .models
                .into_iter()
                .map(|m| BenchmarkModel {
                    name: m.name,
                    artifact_digest: m.artifact_digest,
                    manifest_digest: m.manifest_digest,
                })
                .collect(),
            inputs_digest: self.inputs_digest,
            runs: self.runs,
            timeout_seconds: self.timeout_seconds,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            reason: self.reason,
            timed_on: self.timed_on,
            results: self.results,
        }
    }

    pub fn to_task(&self) -> pb::BenchmarkTask {
        pb::BenchmarkTask {
            id: self.id.clone(),
            models: self
                .models
                .iter()
                .map(|m| pb::BenchmarkModel {
                    name: m.name.clone(),
                    artifact_digest: m.artifact_digest.to_hex(),
                    artifact_size: m.artifact_size,
                    manifest_digest: m.manifest_digest.map(|d| d.to_hex()).unwrap_or_default(),
                })
                .collect(),
            inputs_digest: self.inputs_digest.to_hex(),
            inputs_size: self.inputs_size,
            runs: self.runs,
            timeout_seconds: self.timeout_seconds,
        }
    }
}

/// The unfinished benchmark past its deadline, failed; `None` when nothing
/// changes. Pure.
pub fn expire(record: &BenchmarkRecord, now: OffsetDateTime) -> Option<BenchmarkRecord> {
    if record.state.is_finished() || now < record.deadline() {
        return None;
    }
    let mut failed = record.clone();
    failed.state = BenchmarkState::Failed;
    failed.finished_at = Some(now);
    failed.reason = Some(match record.state {
        BenchmarkState::Pending => format!(
            "device {} did not take the benchmark within {} s (offline?)",
            record.device, record.timeout_seconds
        ),
        _ => format!(
            "device {} did not report within {} s",
            record.device, record.timeout_seconds
        ),
    });
    Some(failed)
}

/// The device that stands for a hardware class: among the `candidates`
/// (already matching its selector, not revoked) the online ones, the most
/// recently seen first, ties to the lower id. Pure.
pub fn representative(
    candidates: &[Member],
    now: OffsetDateTime,
    offline_after: Duration,
) -> Option<&Member> {
    candidates
        .iter()
        .filter(|m| member_status(m, now, offline_after) == MemberStatus::Online)
        .max_by(|a, b| a.last_seen.cmp(&b.last_seen).then(b.id.cmp(&a.id)))
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_REPORTED_TEXT {
        return text.to_string();
    }
    let mut end = MAX_REPORTED_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The record after `device`'s report, or why the report is refused. Pure:
/// a report for another device's benchmark is "not found" (it says nothing
/// about which exist); one for a finished benchmark, or after the deadline,
/// is refused; a report must give one timing per model, no more, each with
/// finite, non-negative latencies or an error.
pub fn accept_report(
    record: &BenchmarkRecord,
    device: &str,
    report: &pb::BenchmarkReport,
    now: OffsetDateTime,
) -> Result<BenchmarkRecord> {
    if record.device != device {
        return Err(Error::not_found("benchmark", &report.id));
    }
    if record.state.is_finished() {
        return Err(Error::Conflict(format!(
            "benchmark {} is already {:?}",
            record.id, record.state
        )));
    }
    if now >= record.deadline() {
        return Err(Error::Conflict(format!(
            "benchmark {} ran past its {} s deadline",
            record.id, record.timeout_seconds
        )));
    }
    let mut done = record.clone();
    done.finished_at = Some(now);
    done.started_at = done.started_at.or(Some(now));
    done.timed_on = Some(cut(&report.timed_on)).filter(|t| !t.is_empty());
    if !report.error.is_empty() {
        done.state = BenchmarkState::Failed;
        done.reason = Some(cut(&report.error));
        return Ok(done);
    }
    let mut results = Vec::with_capacity(record.models.len());
    let mut seen = BTreeSet::new();
    for (i, t) in report.timings.iter().enumerate() {
        let field = |f: &str| format!("timings[{i}].{f}");
        let Some(model) = record.models.iter().find(|m| m.name == t.name) else {
            return Err(Error::bad_field(
                field("name"),
                format!("{:?} is not a model of benchmark {}", t.name, record.id),
            ));
        };
        if !seen.insert(t.name.as_str()) {
            return Err(Error::bad_field(
                field("name"),
                format!("{:?} is reported twice", t.name),
            ));
        }
        let timing = if t.error.is_empty() {
            for (name, v) in [
                ("latency_p50_ms", t.latency_p50_ms),
                ("latency_p90_ms", t.latency_p90_ms),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(Error::bad_field(
                        field(name),
                        format!("must be a finite number >= 0, got {v}"),
                    ));
                }
            }
            if t.runs == 0 {
                return Err(Error::bad_field(
                    field("runs"),
                    "a timing needs at least one run",
                ));
            }
            ModelTiming {
                name: model.name.clone(),
                artifact_digest: model.artifact_digest,
                latency_p50_ms: Some(t.latency_p50_ms),
                latency_p90_ms: Some(t.latency_p90_ms),
                runs: t.runs,
                execution_provider: Some(cut(&t.execution_provider)).filter(|p| !p.is_empty()),
                error: None,
            }
        } else {
            ModelTiming {
                name: model.name.clone(),
                artifact_digest: model.artifact_digest,
                latency_p50_ms: None,
                latency_p90_ms: None,
                runs: 0,
                execution_provider: None,
                error: Some(cut(&t.error)),
            }
        };
        results.push(timing);
    }
    if let Some(missing) = record
        .models
        .iter()
        .find(|m| !seen.contains(m.name.as_str()))
    {
        return Err(Error::bad_field(
            "timings",
            format!("no timing for model {:?}", missing.name),
        ));
    }
    // The request's order, whatever order the device reported in.
    results.sort_by_key(|t| record.models.iter().position(|m| m.name == t.name));
    done.results = results;
    done.state = BenchmarkState::Succeeded;
    done.reason = None;
    Ok(done)
}

/// Checks a request's shape, naming the field. Pure.
pub fn check_request(req: &CreateBenchmark) -> Result<()> {
    match (&req.device, &req.selector) {
        (Some(_), Some(_)) => {
            return Err(Error::bad_field(
                "selector",
                "give a device or a selector, not both",
            ))
        }
        (None, None) => {
            return Err(Error::bad_field(
                "device",
                "name a device, or a selector to choose one",
            ))
        }
        (Some(d), None) if !is_valid_name(d) => {
            return Err(Error::bad_field("device", format!("{d:?}: {NAME_RULE}")))
        }
        _ => {}
    }
    if req.models.is_empty() || req.models.len() > MAX_MODELS {
        return Err(Error::bad_field(
            "models",
            format!("give 1 to {MAX_MODELS} models, got {}", req.models.len()),
        ));
    }
    let mut names = BTreeSet::new();
    for (i, m) in req.models.iter().enumerate() {
        if !is_valid_name(&m.name) {
            return Err(Error::bad_field(
                format!("models[{i}].name"),
                format!("{:?}: {NAME_RULE}", m.name),
            ));
        }
        if !names.insert(m.name.as_str()) {
            return Err(Error::bad_field(
                format!("models[{i}].name"),
                format!("{:?} is given twice", m.name),
            ));
        }
    }
    check_runs("runs", req.runs)?;
    check_timeout("timeout_seconds", req.timeout_seconds)?;
    Ok(())
}

/// Timed calls per model, when given: 1 to [`MAX_RUNS`].
pub fn check_runs(field: &str, runs: Option<u32>) -> Result<()> {
    match runs {
        Some(r) if !(1..=MAX_RUNS).contains(&r) => Err(Error::bad_field(
            field,
            format!("must be 1 to {MAX_RUNS}, got {r}"),
        )),
        _ => Ok(()),
    }
}

/// The device's deadline, when given, in bounds.
pub fn check_timeout(field: &str, seconds: Option<u32>) -> Result<()> {
    match seconds {
        Some(t) if !(MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(&t) => {
            Err(Error::bad_field(
                field,
                format!("must be {MIN_TIMEOUT_SECONDS} to {MAX_TIMEOUT_SECONDS}, got {t}"),
            ))
        }
        _ => Ok(()),
    }
}

/// Queues a benchmark: checks the request, that every artifact is
/// uploaded, and finds the device; then stores it, flushes and wakes the
/// device's stream.
pub async fn create(
    core: &Core,
    req: CreateBenchmark,
    origin: Option<String>,
    projects: Option<&BTreeSet<String>>,
) -> Result<BenchmarkRecord> {
    check_request(&req)?;
    let now = core.now();
    let in_projects = |p: &str| projects.is_none_or(|s| s.contains(p));
    let device = match (&req.device, &req.selector) {
        (Some(id), _) => {
            let m = super::members::get(&core.store, MemberKind::Device, id)?;
            if !in_projects(&m.project) {
                return Err(Error::not_found("device", id));
            }
            if m.revoked_at.is_some() {
                return Err(Error::Conflict(format!("device {id} is revoked")));
            }
            m.id
        }
        (None, Some(raw)) => {
            let selector = deployments::parse_selector("selector", raw)?;
            let group = deployments::group(&core.store, in_projects, &selector)?;
            let window = Duration::try_from(core.config.offline_after()).unwrap_or(Duration::MAX);
            representative(&group, now, window)
                .ok_or_else(|| {
                    Error::Conflict(format!(
                        "no online device matches {raw:?} ({} enrolled match)",
                        group.len()
                    ))
                })?
                .id
                .clone()
        }
        (None, None) => unreachable!("check_request refuses a request naming neither"),
    };
    let size_of = |field: String, digest: Digest| async move {
        core.artifacts
            .head(digest)
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?
            .ok_or_else(|| Error::Absent(format!("{field}: artifact {digest} is not uploaded")))
    };
    let mut models = Vec::with_capacity(req.models.len());
    for (i, m) in req.models.into_iter().enumerate() {
        let size = size_of(format!("models[{i}].artifact_digest"), m.artifact_digest).await?;
        if let Some(manifest) = m.manifest_digest {
            let manifest_size = size_of(format!("models[{i}].manifest_digest"), manifest).await?;
            if manifest_size > MAX_SIGNED_MANIFEST_BYTES as u64 {
                return Err(Error::bad_field(
                    format!("models[{i}].manifest_digest"),
                    format!("{manifest_size} bytes is too large for a signed manifest"),
                ));
            }
        }
        models.push(ModelEntry {
            name: m.name,
            artifact_digest: m.artifact_digest,
            artifact_size: size,
            manifest_digest: m.manifest_digest,
        });
    }
    let inputs_size = size_of("inputs_digest".into(), req.inputs_digest).await?;
    if inputs_size > MAX_INPUTS_BYTES {
        return Err(Error::bad_field(
            "inputs_digest",
            format!("the inputs are {inputs_size} bytes, over the {MAX_INPUTS_BYTES} byte limit"),
        ));
    }
    let record = BenchmarkRecord {
        id: format!("b-{:012}", core.store.next_id()?),
        device,
        selector: req.selector.map(|s| s.trim().to_string()),
        origin,
        state: BenchmarkState::Pending,
        models,
        inputs_digest: req.inputs_digest,
        inputs_size,
        runs: req.runs.unwrap_or(DEFAULT_RUNS),
        timeout_seconds: req.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        created_at: now,
        started_at: None,
        finished_at: None,
        reason: None,
        timed_on: None,
        results: vec![],
    };
    core.store.fleet.benchmarks.insert(&record.id, &record)?;
    core.store.flush().await?;
    core.events.publish(FleetEvent::BenchmarkQueued {
        device: record.device.clone(),
    });
    tracing::info!(benchmark = %record.id, device = %record.device, models = record.models.len(), "benchmark queued");
    Ok(record)
}

/// The benchmark as it stands at `now` (an expired one is failed, and
/// stored so).
pub fn get(store: &Db, id: &str, now: OffsetDateTime) -> Result<BenchmarkRecord> {
    let record = store
        .fleet
        .benchmarks
        .get(id)?
        .ok_or_else(|| Error::not_found("benchmark", id))?;
    settle(store, record, now)
}

fn settle(store: &Db, record: BenchmarkRecord, now: OffsetDateTime) -> Result<BenchmarkRecord> {
    if expire(&record, now).is_none() {
        return Ok(record);
    }
    let settled = store.fleet.benchmarks.update(&record.id, |old| {
        let old = old.ok_or(())?;
        Ok::<_, ()>(expire(&old, now).unwrap_or(old))
    })?;
    Ok(settled.unwrap_or(record))
}

/// Every benchmark, newest first, at most `limit`.
pub fn list(store: &Db, now: OffsetDateTime, limit: usize) -> Result<Vec<BenchmarkRecord>> {
    let mut all = store.fleet.benchmarks.values()?;
    all.reverse();
    all.truncate(limit);
    all.into_iter().map(|r| settle(store, r, now)).collect()
}

/// The benchmark `origin` asked for, as it stands at `now`.
pub fn find_by_origin(
    store: &Db,
    origin: &str,
    now: OffsetDateTime,
) -> Result<Option<BenchmarkRecord>> {
    match store
        .fleet
        .benchmarks
        .values()?
        .into_iter()
        .rev()
        .find(|r| r.origin.as_deref() == Some(origin))
    {
        Some(r) => settle(store, r, now).map(Some),
        None => Ok(None),
    }
}

/// The device's unfinished, unexpired benchmarks, oldest first.
pub fn unfinished_for(
    store: &Db,
    device: &str,
    now: OffsetDateTime,
) -> Result<Vec<BenchmarkRecord>> {
    let mut out = vec![];
    for r in store.fleet.benchmarks.values()? {
        if r.device != device || r.state.is_finished() {
            continue;
        }
        let r = settle(store, r, now)?;
        if !r.state.is_finished() {
            out.push(r);
        }
    }
    Ok(out)
}

/// Marks a benchmark as received by its device (pending → running).
pub fn delivered(store: &Db, id: &str, now: OffsetDateTime) -> Result<()> {
    store
        .fleet
        .benchmarks
        .update(id, |old| {
            let mut r = old.ok_or(())?;
            if r.state == BenchmarkState::Pending {
                r.state = BenchmarkState::Running;
                r.started_at = Some(now);
            }
            Ok::<_, ()>(r)
        })?
        .ok();
    Ok(())
}

/// Stores `device`'s report (see [`accept_report`]) and flushes.
pub async fn report(
    store: &Db,
    device: &str,
    report: &pb::BenchmarkReport,
    now: OffsetDateTime,
) -> Result<BenchmarkRecord> {
    let stored = store.fleet.benchmarks.update(&report.id, |old| {
        let old = old.ok_or_else(|| Error::not_found("benchmark", &report.id))?;
        accept_report(&old, device, report, now)
    })??;
    store.flush().await?;
    tracing::info!(benchmark = %stored.id, device, state = ?stored.state, "benchmark reported");
    Ok(stored)
}

/// For the wake-up signal of a device's benchmark stream.
pub fn subscribe(
    events: &Events,
    device: &str,
) -> tokio::sync::watch::Receiver<super::MemberSignal> {
    events.member(MemberKind::Device, device)
}

#[cfg(test)]
mod tests;
