//! Training jobs: queued by ML teams through the console API, leased by
//! trainer bridges over gRPC (a pull model, so clusters behind NAT work),
//! reported on while they run, and cancelled on request.
//!
//! The decisions (which job a bridge gets, what a progress report does to a
//! job, when a lease has lapsed) are pure functions of `(job, now)`; the
//! functions that touch the store are thin.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::db::Db;
use edgeloop_errors::{Error, Result};

/// The lease the table tests use. The running value comes from the config
/// (`job_lease_secs`, 5 minutes by default): generous, because a bridge that
/// restarts re-adopts its jobs within this window.
#[cfg(test)]
const LEASE_TTL: Duration = Duration::minutes(5);
/// Progress events kept per job (the newest).
pub const HISTORY_LIMIT: usize = 200;

/// The job's state and progress events are the console API's types.
pub use edgeloop_api::images::PinnedImage;
pub use edgeloop_api::jobs::{CreateJob, JobState, ProgressEvent};
use edgeloop_api::registry::Lineage;
pub use edgeloop_api::spec::JobSpec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    /// The engine-neutral job spec, as submitted (its sections left out
    /// when they are the defaults, as a spec is usually written).
    pub spec: JobSpec,
    #[serde(default = "edgeloop_api::access::default_project")]
    pub project: String,
    /// Only this cluster may lease the job, when set.
    pub cluster: Option<String>,
    pub state: JobState,
    /// The cluster holding the lease, and until when.
    pub leased_by: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub lease_expires_at: Option<OffsetDateTime>,
    pub attempt: u32,
    pub step: u64,
    pub engine_job_id: Option<String>,
    /// The spec's image as the engine pinned it at the first attempt: every
    /// attempt runs it, and the model's lineage names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<PinnedImage>,
    /// Restarts after failures, and after preemptions, so far (left out
    /// while 0, as a record without them was written).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions: u32,
    pub exit_code: Option<i32>,
    pub cancel_requested: bool,
    pub last_message: String,
    pub history: Vec<ProgressEvent>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl JobRecord {
    /// A job as submitted: queued, never leased, no attempt yet.
    pub fn queued(
        id: &str,
        spec: JobSpec,
        project: String,
        cluster: Option<String>,
        now: OffsetDateTime,
    ) -> JobRecord {
        JobRecord {
            id: id.to_string(),
            spec,
            project,
            cluster,
            state: JobState::Queued,
            leased_by: None,
            lease_expires_at: None,
            attempt: 0,
            step: 0,
            engine_job_id: None,
            image: None,
            restarts: 0,
            preemptions: 0,
            exit_code: None,
            cancel_requested: false,
            last_message: String::new(),
            history: vec![],
            created_at: now,
            updated_at: now,
        }
    }
}

/// How many of its newest checkpoints the job's spec keeps (its bridge
/// keeps as many on its disk). `None` for 0, which the spec's validation
/// refuses but a record may hold: then every checkpoint is kept.
pub fn keep_last(job: &JobRecord) -> Option<usize> {
    usize::try_from(job.spec.checkpoint.keep_last)
        .ok()
        .filter(|&n| n > 0)
}

/// Whether the lease on `job` has lapsed at `now` (its bridge went away).
pub fn lease_lapsed(job: &JobRecord, now: OffsetDateTime) -> bool {
    matches!(job.state, JobState::Leased | JobState::Running)
        && job.lease_expires_at.is_some_and(|t| now >= t)
}

/// Whether `cluster`, which is running `running` right now, may take `job`:
/// queued (or its lease lapsed), or leased to this very cluster but not among
/// what it runs (its bridge restarted and lost track); never a cancelled
/// one; and only if untargeted or targeted at this cluster.
pub fn leasable_by(
    job: &JobRecord,
    cluster: &str,
    running: &[String],
    now: OffsetDateTime,
) -> bool {
    let free = job.state == JobState::Queued || lease_lapsed(job, now);
    let orphaned = matches!(job.state, JobState::Leased | JobState::Running)
        && job.leased_by.as_deref() == Some(cluster)
        && !running.contains(&job.id);
    (free || orphaned)
        && !job.cancel_requested
        && job.cluster.as_deref().is_none_or(|c| c == cluster)
}

/// The job a cluster gets: its own lapsed or running jobs first (re-adoption
/// after a bridge restart), then the oldest leasable one.
pub fn pick<'a>(
    jobs: &'a [JobRecord],
    cluster: &str,
    running: &[String],
    now: OffsetDateTime,
) -> Option<&'a JobRecord> {
    jobs.iter()
        .filter(|j| leasable_by(j, cluster, running, now))
        .min_by(|a, b| {
            let mine = |j: &JobRecord| j.leased_by.as_deref() != Some(cluster);
            mine(a)
                .cmp(&mine(b))
                .then(a.created_at.cmp(&b.created_at))
                .then(a.id.cmp(&b.id))
        })
}

/// A progress report from a bridge, already parsed from the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub attempt: u32,
    pub state: JobState,
    pub step: u64,
    pub metrics: BTreeMap<String, f64>,
    pub message: String,
    pub engine_job_id: Option<String>,
    pub exit_code: Option<i32>,
    /// The image the attempt runs, as its engine pinned it.
    pub image: Option<PinnedImage>,
    /// The bridge's counts; they only grow (a report that arrives late
    /// cannot lower them).
    pub restarts: u32,
    pub preemptions: u32,
}

/// Applies a progress report from `cluster`. Refuses reports from a cluster
/// that does not hold the lease, from an older attempt, or for a job that
/// has already ended; extends the lease otherwise.
pub fn apply_report(
    job: &JobRecord,
    cluster: &str,
    report: &Report,
    now: OffsetDateTime,
    lease: Duration,
) -> Result<JobRecord> {
    if job.leased_by.as_deref() != Some(cluster) {
        return Err(Error::PermissionDenied(format!(
            "job {:?} is not leased by cluster/{cluster}",
            job.id
        )));
    }
    if job.state.is_terminal() {
        return Err(Error::Conflict(format!(
            "job {:?} already ended ({:?})",
            job.id, job.state
        )));
    }
    if report.attempt < job.attempt {
        return Err(Error::Conflict(format!(
            "attempt {} is stale; the job is on attempt {}",
            report.attempt, job.attempt
        )));
    }
    if matches!(report.state, JobState::Queued | JobState::Leased) {
        return Err(Error::bad_field(
            "state",
            "a bridge reports running, succeeded, failed or cancelled",
        ));
    }
    if let Some((k, _)) = report.metrics.iter().find(|(_, v)| !v.is_finite()) {
        return Err(Error::bad_field(
            format!("metrics.{k}"),
            "must be a finite number",
        ));
    }
    let mut next = job.clone();
    next.state = report.state;
    next.attempt = report.attempt;
    next.step = report.step.max(if report.attempt == job.attempt {
        job.step
    } else {
        0
    });
    if report.engine_job_id.is_some() {
        next.engine_job_id = report.engine_job_id.clone();
    }
    // The first pin stands: the lease hands it to every later attempt, so
    // a different one is a bridge that did not run it, which the job's
    // history must not hide.
    match (&job.image, &report.image) {
        (None, Some(pin)) => next.image = Some(pin.clone()),
        (Some(first), Some(other)) if first != other => {
            tracing::warn!(job = %job.id, %first, %other, "a bridge reported another image than the job's pin; the pin stands");
        }
        _ => {}
    }
    next.restarts = job.restarts.max(report.restarts);
    next.preemptions = job.preemptions.max(report.preemptions);
    next.exit_code = report.exit_code.or(job.exit_code);
    next.last_message = report.message.chars().take(4096).collect();
    next.lease_expires_at = if report.state.is_terminal() {
        None
    } else {
        Some(now + lease)
    };
    next.updated_at = now;
    next.history.push(ProgressEvent {
        at: now,
        attempt: report.attempt,
        state: report.state,
        step: report.step,
        metrics: report.metrics.clone(),
        message: next.last_message.clone(),
    });
    if next.history.len() > HISTORY_LIMIT {
        let excess = next.history.len() - HISTORY_LIMIT;
        next.history.drain(..excess);
    }
    Ok(next)
}

/// Completes a model version's lineage with the image its job ran: from
/// the job's record when `lineage.job` names a job that pinned one. An
/// image given that differs from the job's pin is refused, naming the
/// field; a job no longer stored (or run elsewhere) leaves the lineage as
/// given.
pub fn lineage_with_image(store: &Db, mut lineage: Lineage) -> Result<Lineage> {
    if let Some(given) = &lineage.image {
        edgeloop_api::images::check_reference(&given.reference)
            .map_err(|e| Error::bad_field("lineage.image.reference", e.to_string()))?;
    }
    let Some(job) = lineage.job.as_deref() else {
        return Ok(lineage);
    };
    let Some(pin) = store.lifecycle.jobs.get(job)?.and_then(|j| j.image) else {
        return Ok(lineage);
    };
    match &lineage.image {
        Some(given) if *given != pin => Err(Error::bad_field(
            "lineage.image",
            format!("job {job:?} ran {pin}, not {given}"),
        )),
        _ => {
            lineage.image = Some(pin);
            Ok(lineage)
        }
    }
}

/// Reads and validates a submitted job spec; the rules live with the spec,
/// in the API crate.
pub fn validate_spec(spec: &serde_json::Value) -> Result<JobSpec> {
    let bytes = serde_json::to_vec(spec).map_err(|e| Error::bad_field("spec", e.to_string()))?;
    JobSpec::from_json(&bytes).map_err(|e| match e.field() {
        Some(f) => Error::bad_field(format!("spec.{f}"), e.to_string()),
        None => Error::bad_field("spec", e.to_string()),
    })
}

pub async fn create(store: &Db, req: CreateJob, now: OffsetDateTime) -> Result<JobRecord> {
    let name = validate_spec(&req.spec)?.name;
    let id = format!("{name}-{:08x}", rand::random::<u32>());
    match create_with_id(store, &id, req, now).await? {
        (job, true) => Ok(job),
        (_, false) => Err(Error::Conflict(format!("job id {id:?} collided; retry"))),
    }
}

/// Creates job `id` unless it exists; returns the job and whether this call
/// created it (an idempotent create, for callers that retry after a crash).
pub async fn create_with_id(
    store: &Db,
    id: &str,
    req: CreateJob,
    now: OffsetDateTime,
) -> Result<(JobRecord, bool)> {
    let spec = validate_spec(&req.spec)?;
    if let Some(c) = &req.cluster {
        edgeloop_errors::validate::name("cluster", c)?;
    }
    let project = edgeloop_errors::validate::project(req.project)?;
    let job = JobRecord::queued(id, spec, project, req.cluster, now);
    if !store.lifecycle.jobs.insert_new(id, &job)? {
        return Ok((get(store, id)?, false));
    }
    store.flush().await?;
    Ok((job, true))
}

pub fn get(store: &Db, id: &str) -> Result<JobRecord> {
    store
        .lifecycle
        .jobs
        .get(id)?
        .ok_or_else(|| Error::not_found("job", id))
}

/// Leases the next job for `cluster`, if any, atomically.
pub async fn lease(
    store: &Db,
    cluster: &str,
    running: &[String],
    now: OffsetDateTime,
    lease: Duration,
) -> Result<Option<JobRecord>> {
    loop {
        let jobs = store.lifecycle.jobs.values()?;
        let Some(candidate) = pick(&jobs, cluster, running, now) else {
            return Ok(None);
        };
        let id = candidate.id.clone();
        let taken = store.lifecycle.jobs.update(&id, |cur| match cur {
            Some(j) if leasable_by(&j, cluster, running, now) => {
                // Re-adoption by the same cluster keeps the attempt (the engine may
                // still be running it); anything else starts a new one.
                let readopt = j.leased_by.as_deref() == Some(cluster)
                    && matches!(j.state, JobState::Running | JobState::Leased)
                    && j.engine_job_id.is_some();
                Ok(JobRecord {
                    state: if readopt {
                        JobState::Running
                    } else {
                        JobState::Leased
                    },
                    leased_by: Some(cluster.to_string()),
                    lease_expires_at: Some(now + lease),
                    attempt: if readopt { j.attempt } else { j.attempt + 1 },
                    updated_at: now,
                    ..j
                })
            }
            _ => Err(()),
        })?;
        // Lost a race to another bridge: look again.
        if let Ok(job) = taken {
            store.flush().await?;
            return Ok(Some(job));
        }
    }
}

pub async fn report(
    store: &Db,
    id: &str,
    cluster: &str,
    report: &Report,
    now: OffsetDateTime,
    lease: Duration,
) -> Result<JobRecord> {
    let job = store.lifecycle.jobs.update(id, |cur| match cur {
        Some(j) => apply_report(&j, cluster, report, now, lease),
        None => Err(Error::not_found("job", id)),
    })??;
    store.flush().await?;
    Ok(job)
}

/// Requests cancellation. A queued job ends at once; a leased or running one
/// is stopped by its bridge, which then reports `cancelled`.
pub async fn cancel(store: &Db, id: &str, now: OffsetDateTime) -> Result<JobRecord> {
    let job = store.lifecycle.jobs.update(id, |cur| match cur {
        Some(j) if j.state.is_terminal() => Ok(j),
        Some(j) if j.state == JobState::Queued => Ok(JobRecord {
            state: JobState::Cancelled,
            cancel_requested: true,
            updated_at: now,
            ..j
        }),
        Some(j) => Ok(JobRecord {
            cancel_requested: true,
            updated_at: now,
            ..j
        }),
        None => Err(Error::not_found("job", id)),
    })??;
    store.flush().await?;
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::seconds(s)
    }

    fn job(id: &str, created: i64) -> JobRecord {
        JobRecord::queued(id, spec("train"), "default".into(), None, at(created))
    }

    /// The smallest spec: a name and a command.
    pub(crate) fn spec(name: &str) -> JobSpec {
        let json = serde_json::json!({"name": name, "command": ["python", "train.py"]});
        JobSpec::from_json(json.to_string().as_bytes()).unwrap()
    }

    /// A job record as stored before its spec was typed: the spec is the
    /// JSON as submitted. It reads back, and writes the same JSON but for
    /// a section given in part, which is written whole.
    #[test]
    fn a_stored_job_record_reads_its_spec() {
        let data = format!("edgeloop-artifact://sha256:{}", "ab".repeat(32));
        let stored = serde_json::json!({
            "id": "mnist-0000abcd",
            "spec": {
                "name": "mnist", "image": "ghcr.io/acme/train:1", "command": ["python", "train.py"],
                "datasets": [data], "hyperparameters": {"lr": 0.01, "layers": [64, 32]},
                "resources": {"nodes": 2}
            },
            "project": "default", "cluster": null, "state": "running",
            "leased_by": "gpu-a", "lease_expires_at": "2026-12-01T00:05:00Z",
            "attempt": 1, "step": 120, "engine_job_id": "slurm-77", "exit_code": null,
            "cancel_requested": false, "last_message": "", "history": [],
            "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:01:00Z"
        });
        let job: JobRecord = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(job.spec.name, "mnist");
        assert_eq!(job.spec.resources.nodes, 2);
        assert_eq!(job.state, JobState::Running);
        let mut written = serde_json::to_value(&job).unwrap();
        assert_eq!(
            serde_json::from_value::<JobRecord>(written.clone()).unwrap(),
            job
        );
        // What a bridge is handed (`spec_json`) passes its validation.
        let spec_json = serde_json::to_vec(&job.spec).unwrap();
        assert_eq!(JobSpec::from_json(&spec_json).unwrap(), job.spec);
        let resources = written["spec"]
            .as_object_mut()
            .unwrap()
            .remove("resources")
            .unwrap();
        assert_eq!(resources["nodes"], 2);
        let mut stored = stored;
        stored["spec"].as_object_mut().unwrap().remove("resources");
        assert_eq!(written, stored);
    }

    #[test]
    fn pick_prefers_own_jobs_then_oldest_and_respects_targets() {
        let now = at(1000);
        let a = job("a", 10);
        let b = JobRecord {
            cluster: Some("other".into()),
            ..job("b", 5)
        };
        let c = JobRecord {
            cancel_requested: true,
            ..job("c", 1)
        };
        let jobs = vec![a.clone(), b.clone(), c];
        assert_eq!(
            pick(&jobs, "gpu", &[], now).map(|j| j.id.as_str()),
            Some("a")
        );
        assert_eq!(
            pick(&jobs, "other", &[], now).map(|j| j.id.as_str()),
            Some("b")
        );
        // A lapsed running job of mine comes first (re-adoption).
        let mine = JobRecord {
            state: JobState::Running,
            leased_by: Some("gpu".into()),
            lease_expires_at: Some(at(999)),
            ..job("m", 50)
        };
        let theirs_live = JobRecord {
            state: JobState::Running,
            leased_by: Some("x".into()),
            lease_expires_at: Some(at(2000)),
            ..job("t", 0)
        };
        let jobs = vec![a.clone(), mine, theirs_live.clone()];
        assert_eq!(
            pick(&jobs, "gpu", &[], now).map(|j| j.id.as_str()),
            Some("m")
        );
        // A live lease of mine that my bridge says it is not running is
        // orphaned (the bridge restarted): handed back.
        let live_mine = JobRecord {
            state: JobState::Running,
            leased_by: Some("gpu".into()),
            lease_expires_at: Some(at(2000)),
            ..job("live", 60)
        };
        let jobs = vec![a, live_mine, theirs_live];
        assert_eq!(
            pick(&jobs, "gpu", &[], now).map(|j| j.id.as_str()),
            Some("live")
        );
        // ...but not while my bridge still runs it.
        assert_eq!(
            pick(&jobs, "gpu", &["live".to_string()], now).map(|j| j.id.as_str()),
            Some("a")
        );
        // Another cluster's live lease is never taken.
        assert_eq!(pick(&jobs[1..], "y", &[], now).map(|j| j.id.as_str()), None);
    }

    #[test]
    fn lease_lapse_table() {
        let leased = |state, exp| JobRecord {
            state,
            lease_expires_at: Some(at(exp)),
            leased_by: Some("c".into()),
            ..job("j", 0)
        };
        assert!(!lease_lapsed(&leased(JobState::Running, 100), at(99)));
        assert!(lease_lapsed(&leased(JobState::Running, 100), at(100)));
        assert!(lease_lapsed(&leased(JobState::Leased, 100), at(200)));
        assert!(!lease_lapsed(&leased(JobState::Succeeded, 100), at(200)));
    }

    #[test]
    fn reports_are_checked_and_extend_the_lease() {
        let held = JobRecord {
            state: JobState::Leased,
            leased_by: Some("c".into()),
            attempt: 2,
            lease_expires_at: Some(at(10)),
            ..job("j", 0)
        };
        let r = |state, attempt, step| Report {
            attempt,
            state,
            step,
            metrics: BTreeMap::from([("loss".to_string(), 0.5)]),
            message: "ok".into(),
            engine_job_id: Some("123".into()),
            exit_code: None,
            image: None,
            restarts: 0,
            preemptions: 0,
        };
        let next =
            apply_report(&held, "c", &r(JobState::Running, 2, 100), at(5), LEASE_TTL).unwrap();
        assert_eq!(
            (next.state, next.step, next.lease_expires_at),
            (JobState::Running, 100, Some(at(5) + LEASE_TTL))
        );
        assert_eq!(next.history.len(), 1);
        assert!(matches!(
            apply_report(&held, "d", &r(JobState::Running, 2, 1), at(5), LEASE_TTL),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            apply_report(&held, "c", &r(JobState::Running, 1, 1), at(5), LEASE_TTL),
            Err(Error::Conflict(_))
        ));
        assert!(matches!(
            apply_report(&held, "c", &r(JobState::Queued, 2, 1), at(5), LEASE_TTL),
            Err(Error::BadRequest { .. })
        ));
        let done = apply_report(
            &next,
            "c",
            &r(JobState::Succeeded, 2, 200),
            at(6),
            LEASE_TTL,
        )
        .unwrap();
        assert_eq!(done.lease_expires_at, None);
        assert!(matches!(
            apply_report(&done, "c", &r(JobState::Running, 2, 300), at(7), LEASE_TTL),
            Err(Error::Conflict(_))
        ));
        // The bridge's restart counts only grow: a late report cannot
        // lower them.
        let counted = apply_report(
            &held,
            "c",
            &Report {
                restarts: 2,
                preemptions: 3,
                ..r(JobState::Running, 2, 100)
            },
            at(5),
            LEASE_TTL,
        )
        .unwrap();
        let late = apply_report(
            &counted,
            "c",
            &Report {
                restarts: 1,
                preemptions: 0,
                ..r(JobState::Running, 2, 101)
            },
            at(6),
            LEASE_TTL,
        )
        .unwrap();
        assert_eq!((late.restarts, late.preemptions), (2, 3));
        let mut nan = r(JobState::Running, 2, 1);
        nan.metrics.insert("loss".into(), f64::NAN);
        assert!(
            matches!(apply_report(&held, "c", &nan, at(5), LEASE_TTL), Err(Error::BadRequest { field: Some(f), .. }) if f == "metrics.loss")
        );
    }

    #[test]
    fn the_first_pinned_image_stands_for_every_attempt() {
        use edgeloop_api::images::PinKind;
        let pin = |n: u8| PinnedImage {
            reference: "localhost/trainer:1".into(),
            digest: edgeloop_models::Digest::of(&[n]),
            kind: PinKind::ImageId,
        };
        let held = JobRecord {
            state: JobState::Leased,
            leased_by: Some("c".into()),
            attempt: 1,
            ..job("j", 0)
        };
        let report = |attempt, image| Report {
            attempt,
            state: JobState::Running,
            step: 1,
            metrics: BTreeMap::new(),
            message: String::new(),
            engine_job_id: None,
            exit_code: None,
            image,
            restarts: 0,
            preemptions: 0,
        };
        // (pin held, pin reported) -> pin kept
        let table = [
            (None, None, None),
            (None, Some(pin(1)), Some(pin(1))),
            (Some(pin(1)), None, Some(pin(1))),
            (Some(pin(1)), Some(pin(1)), Some(pin(1))),
            (Some(pin(1)), Some(pin(2)), Some(pin(1))),
        ];
        for (held_pin, reported, want) in table {
            let j = JobRecord {
                image: held_pin.clone(),
                ..held.clone()
            };
            let next =
                apply_report(&j, "c", &report(2, reported.clone()), at(5), LEASE_TTL).unwrap();
            assert_eq!(next.image, want, "held {held_pin:?}, reported {reported:?}");
        }
    }
}
