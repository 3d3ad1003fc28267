//! The thin task around [`super::step`]: every tick it reads each unfinished
//! deployment's group, statuses and telemetry from the store, runs the pure
//! controller, applies the actions (assignment writes, one flush, then the
//! devices queued to be woken, `wakeups`) and only then persists the deployment.
//! A crash between the two repeats idempotent writes on the next tick.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{
    step, Action, AssignmentStatus, DeviceState, Event, FleetState, Telemetry, WindowStats,
};
use crate::db::Db;
use crate::fleet::assignments::{self, AssignmentRecord, SetOutcome};
use crate::fleet::deployments::{self, DeploymentRecord};
use crate::fleet::members::{member_status, MemberStatus};
use crate::fleet::telemetry::{
    status_key, AssignmentState, AssignmentStatusRecord, TelemetryRecord,
};
use crate::Core;
use edgeloop_drift::records::{SampleKind, SampleRecord};
use edgeloop_errors::{Error, Result};
use edgeloop_registry::models::{self, ModelVersionRecord};
use edgeloop_store::Fence;

/// How far before a deployment's start the previous version's latency is
/// read, as the baseline for the p99 gate.
const BASELINE_LOOKBACK: time::Duration = time::Duration::minutes(15);
/// Labelled samples read per device for the online-accuracy gate.
const MAX_FEEDBACK_PER_DEVICE: usize = 1000;

/// Runs until `shutdown`, one tick every `interval`.
pub async fn run(core: Arc<Core>, interval: Duration, shutdown: CancellationToken) {
    loop {
        // Another replica runs it while it holds the lease.
        if core.leader.leads(crate::leader::Task::Rollouts) {
            if let Err(e) = tick(&core, OffsetDateTime::now_utc()).await {
                tracing::error!(error = %e, "rollout tick failed; retrying next tick");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One pass over every unfinished deployment, oldest first, so a newer
/// deployment's writes land after (and win over) an older one's.
pub async fn tick(core: &Core, now: OffsetDateTime) -> Result<()> {
    let mut open: Vec<DeploymentRecord> = core
        .store
        .fleet
        .deployments
        .values()?
        .into_iter()
        .filter(|d| !d.is_terminal())
        .collect();
    open.sort_by_key(|d| d.seq);
    // Taken once: if the lease passes on mid-tick, this tick's writes fail
    // against the new leader's fence instead of mixing with its own.
    let fence = core.leader.fence(crate::leader::Task::Rollouts);
    for record in open {
        let id = record.id.clone();
        if let Err(e) = advance(core, record, now, fence).await {
            tracing::error!(deployment = %id, error = %e, "advancing deployment");
        }
    }
    Ok(())
}

/// What one tick wrote, for the async half to flush, announce and save.
struct Written {
    stepped: super::Deployment,
    assigned_generation: BTreeMap<String, u64>,
    assigned_variant: BTreeMap<String, String>,
    woken: BTreeSet<String>,
}

async fn advance(
    core: &Core,
    record: DeploymentRecord,
    now: OffsetDateTime,
    fence: Option<Fence>,
) -> Result<()> {
    let offline_after = core.offline_after();
    // Reading a whole group and writing its assignments is blocking store
    // work that grows with the fleet; it must not hold up the runtime's
    // workers, which serve every device's heartbeats and streams.
    let store = core.store.clone();
    let id = record.id.clone();
    let written = tokio::task::spawn_blocking(move || {
        step_and_write(&store, &record, now, offline_after, fence)
    })
    .await
    .map_err(|e| Error::Internal(anyhow::anyhow!("rollout step of {id}: {e}")))??;
    let Some(Written {
        stepped,
        assigned_generation,
        assigned_variant,
        woken,
    }) = written
    else {
        return Ok(());
    };
    let store = &core.store;
    let record_id = stepped.id.clone();
    // Durable before any device hears of it, and before the deployment
    // records that it happened.
    store.flush().await?;
    // Woken at the pace their downloads start, not all at once (`wakeups`).
    core.wakeups.push(woken);
    store
        .update_fenced(&store.fleet.deployments, fence, &record_id, |cur| {
            let cur = cur.ok_or_else(|| Error::not_found("deployment", &record_id))?;
            let mut new = cur.clone();
            new.deployment = stepped.clone();
            // Requests that arrived during this tick are kept for the next one.
            new.deployment.cancel_requested |= cur.deployment.cancel_requested;
            new.deployment.superseded_by = stepped
                .superseded_by
                .clone()
                .or(cur.deployment.superseded_by.clone());
            new.assigned_generation = assigned_generation.clone();
            new.assigned_variant = assigned_variant.clone();
            new.updated_at = now;
            Ok::<_, Error>(new)
        })?
        .map_err(crate::leader::not_written)?;
    store.flush().await?;
    Ok(())
}

/// The synchronous half of a tick: observe, step, apply the actions to
/// the store (not yet flushed). `None` when nothing changed.
fn step_and_write(
    store: &Db,
    record: &DeploymentRecord,
    now: OffsetDateTime,
    offline_after: time::Duration,
    fence: Option<Fence>,
) -> Result<Option<Written>> {
    let (fleet, telemetry) = observe(store, record, now, offline_after)?;
    let next = step(&record.deployment, &fleet, &telemetry, now.unix_timestamp());
    if next.deployment == record.deployment && next.actions.is_empty() {
        return Ok(None);
    }
    let mut written = Written {
        stepped: next.deployment,
        assigned_generation: record.assigned_generation.clone(),
        assigned_variant: record.assigned_variant.clone(),
        woken: BTreeSet::new(),
    };
    let mut versions: HashMap<String, Option<ModelVersionRecord>> = HashMap::new();
    let model = record.deployment.model.clone();
    // Consecutive assignment actions are written as one batch; a device
    // named twice starts the next batch, so the second write sees the first.
    let mut batch: Vec<Planned> = Vec::new();
    for action in &next.actions {
        let planned = match action {
            Action::Assign { device, version } => {
                let v = version_record(store, &mut versions, &model, version)?
                    .ok_or_else(|| Error::not_found("model version", version))?;
                Planned {
                    device: device.clone(),
                    version: Some(v),
                    revert: false,
                }
            }
            Action::Revert { device, version } => {
                let v = match version {
                    Some(v) => version_record(store, &mut versions, &model, v)?,
                    None => None,
                };
                if version.is_some() && v.is_none() {
                    tracing::warn!(%device, ?version, "previous version is gone from the registry; removing the assignment instead");
                }
                Planned {
                    device: device.clone(),
                    version: v,
                    revert: true,
                }
            }
            Action::Record { event } => {
                log_event(&record.id, event);
                deployments::append_event(store, &record.id, event.clone(), now)?;
                continue;
            }
        };
        if batch.iter().any(|p| p.device == planned.device) {
            write_batch(
                store,
                record,
                &std::mem::take(&mut batch),
                fence,
                &mut written,
            )?;
        }
        batch.push(planned);
    }
    write_batch(store, record, &batch, fence, &mut written)?;
    Ok(Some(written))
}

/// One device's assignment write of a tick: its new version (`None`: no
/// assignment), and whether it goes back to what it ran before.
struct Planned {
    device: String,
    version: Option<ModelVersionRecord>,
    revert: bool,
}

/// Writes `batch`'s assignments (each the variant of its version that fits
/// the device's execution providers) in a few store calls, and notes what
/// each got in `written`.
fn write_batch(
    store: &Db,
    record: &DeploymentRecord,
    batch: &[Planned],
    fence: Option<Fence>,
    written: &mut Written,
) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let model = &record.deployment.model;
    let devices: Vec<&str> = batch.iter().map(|p| p.device.as_str()).collect();
    let targets: HashMap<&str, &ModelVersionRecord> = batch
        .iter()
        .filter_map(|p| Some((p.device.as_str(), p.version.as_ref()?)))
        .collect();
    let results = assignments::set_models(store, model, record.seq, fence, &devices, |m| {
        let v = targets.get(m.id.as_str())?;
        Some(AssignmentRecord {
            deployment_seq: record.seq,
            ..AssignmentRecord::for_device(
                v,
                &m.capabilities.execution_providers,
                &record.id,
                record.activation_timeout_seconds,
            )
        })
    })?;
    for (p, (outcome, entry)) in batch.iter().zip(results) {
        // Back on what it ran before: no variant of the target.
        match entry.and_then(|e| e.variant).filter(|_| !p.revert) {
            Some(name) => written.assigned_variant.insert(p.device.clone(), name),
            None => written.assigned_variant.remove(&p.device),
        };
        if p.revert && p.version.is_none() && matches!(outcome, SetOutcome::Changed(_)) {
            // The agent unloads an unassigned model and reports nothing
            // for it, so its old status would never clear.
            store
                .fleet
                .assignment_status
                .remove(&status_key(&p.device, model))?;
        }
        note(
            &p.device,
            outcome,
            &mut written.assigned_generation,
            &mut written.woken,
            store,
        )?;
    }
    Ok(())
}

fn note(
    device: &str,
    outcome: SetOutcome,
    assigned_generation: &mut BTreeMap<String, u64>,
    woken: &mut BTreeSet<String>,
    store: &Db,
) -> Result<()> {
    match outcome {
        SetOutcome::Changed(g) => {
            assigned_generation.insert(device.to_string(), g);
            woken.insert(device.to_string());
        }
        SetOutcome::Unchanged => {
            // Applied on an earlier try of this tick (a crash before the
            // deployment was saved): the set's generation is the one.
            if !assigned_generation.contains_key(device) {
                let g = assignments::current(store, device)?.generation;
                assigned_generation.insert(device.to_string(), g);
            }
        }
        SetOutcome::Stale => {
            tracing::info!(%device, "a newer deployment owns this device's model; not written")
        }
        SetOutcome::UnknownDevice => {
            tracing::warn!(%device, "device is no longer enrolled; not written")
        }
    }
    Ok(())
}

fn version_record(
    store: &Db,
    cache: &mut HashMap<String, Option<ModelVersionRecord>>,
    model: &str,
    version: &str,
) -> Result<Option<ModelVersionRecord>> {
    if let Some(v) = cache.get(version) {
        return Ok(v.clone());
    }
    let v = match models::get_version(&store.registry, model, version) {
        Ok(v) => Some(v),
        Err(Error::NotFound { .. }) => None,
        Err(e) => return Err(e),
    };
    cache.insert(version.to_string(), v.clone());
    Ok(v)
}

fn log_event(id: &str, event: &Event) {
    match event {
        Event::WaveStarted {
            index,
            assigned,
            skipped,
        } => tracing::info!(
            deployment = id,
            wave = index,
            assigned = assigned.len(),
            skipped = skipped.len(),
            "wave started"
        ),
        Event::WaveHealthy { index, .. } => {
            tracing::info!(deployment = id, wave = index, "wave healthy")
        }
        Event::RollbackStarted { reason, reverted } => tracing::warn!(
            deployment = id,
            %reason,
            devices = reverted.len(),
            "rolling back"
        ),
        Event::Finished { state, .. } => tracing::info!(
            deployment = id,
            state = state.name().as_str(),
            "deployment finished"
        ),
    }
}

/// The controller's inputs for one deployment, read from the store.
pub fn observe(
    store: &Db,
    record: &DeploymentRecord,
    now: OffsetDateTime,
    offline_after: time::Duration,
) -> Result<(FleetState, Telemetry)> {
    let d = &record.deployment;
    let members = match deployments::parse_selector("selector", &d.group) {
        Ok(selector) => {
            let project = edgeloop_registry::models::project_or_default(&store.registry, &d.model)?;
            deployments::group(store, |p| p == project, &selector)?
        }
        // Validated at creation; a selector this binary cannot parse any
        // more selects nothing, and the waves fail visibly by their deadline.
        Err(_) => Vec::new(),
    };
    let mut fleet = FleetState::default();
    let mut telemetry = Telemetry::default();
    // One read for the whole group's statuses (one round trip on PostgreSQL).
    let keys: Vec<String> = members
        .iter()
        .map(|m| status_key(&m.id, &d.model))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let statuses = store.fleet.assignment_status.get_many(&keys)?;
    for (m, status) in members.into_iter().zip(statuses) {
        let (version, status) = device_status(record, &m.id, status.as_ref());
        fleet.devices.insert(
            m.id.clone(),
            DeviceState {
                online: member_status(&m, now, offline_after) == MemberStatus::Online,
                version,
                status,
                compatibility: deployments::compatibility(&record.requirements, &m.capabilities),
                variant: record.assigned_variant.get(&m.id).cloned(),
            },
        );
        if d.moved.contains_key(&m.id) {
            let windows = device_windows(store, record, &m.id)?;
            if !windows.is_empty() {
                telemetry.windows.insert(m.id.clone(), windows);
            }
        }
    }
    Ok((fleet, telemetry))
}

/// What a device runs, and how its assignment from this deployment went.
/// A status about another version, or from before this deployment's
/// assignment, says nothing about this deployment: it reads as in progress.
pub fn device_status(
    record: &DeploymentRecord,
    device: &str,
    status: Option<&AssignmentStatusRecord>,
) -> (Option<String>, AssignmentStatus) {
    let Some(s) = status else {
        return (None, AssignmentStatus::Downloading);
    };
    let running = s
        .running_version
        .clone()
        .or_else(|| (s.state == AssignmentState::Active).then(|| s.model_version.clone()));
    let ours = record
        .assigned_generation
        .get(device)
        .is_some_and(|g| s.generation >= *g);
    let state = match s.state {
        AssignmentState::Active => AssignmentStatus::Active,
        AssignmentState::Failed if ours => AssignmentStatus::Failed {
            reason: s.reason.clone(),
        },
        AssignmentState::RolledBack if ours => AssignmentStatus::RolledBack {
            reason: s.reason.clone(),
        },
        AssignmentState::Failed
        | AssignmentState::RolledBack
        | AssignmentState::Downloading
        | AssignmentState::Activating => AssignmentStatus::Downloading,
    };
    (running, state)
}

/// Per-version request, error and latency totals from the device's recent
/// reports: the target version since the deployment began, the others
/// (the baseline) since [`BASELINE_LOOKBACK`] before it.
fn device_windows(
    store: &Db,
    record: &DeploymentRecord,
    device: &str,
) -> Result<BTreeMap<String, WindowStats>> {
    let d = &record.deployment;
    let since = record.created_at - BASELINE_LOOKBACK;
    let reports: Vec<TelemetryRecord> = store
        .fleet
        .telemetry
        .scan_prefix_rev_while(&format!("{device}/"), |r| r.received_at >= since)?;
    let mut sums: BTreeMap<String, (u64, u64, f64)> = BTreeMap::new();
    // The devices' counts: held at `u64::MAX` (edgeloop_errors::device_counts).
    let mut add = edgeloop_errors::device_counts::Adder::default();
    for r in &reports {
        for m in r.models.iter().filter(|m| m.model_name == d.model) {
            if m.model_version == d.target_version && r.received_at < record.created_at {
                continue;
            }
            let e = sums.entry(m.model_version.clone()).or_default();
            add.add(&mut e.0, m.requests);
            add.add(&mut e.1, m.errors);
            e.2 += m.latency_p99_ms * m.requests as f64;
        }
    }
    let accuracy = online_accuracy(
        store,
        &d.model,
        &d.target_version,
        device,
        record.created_at,
    )?;
    let mut out: BTreeMap<String, WindowStats> = sums
        .into_iter()
        .map(|(version, (requests, errors, p99_sum))| {
            let p99 = if requests > 0 {
                p99_sum / requests as f64
            } else {
                0.0
            };
            (
                version,
                WindowStats {
                    requests,
                    errors,
                    p99_latency_ms: p99,
                    online_accuracy: None,
                },
            )
        })
        .collect();
    if let (Some(acc), Some(w)) = (accuracy, out.get_mut(&d.target_version)) {
        w.online_accuracy = Some(acc);
    }
    Ok(out)
}

/// The share of labelled feedback the target version got right, over the
/// device's most recent labels since the deployment began.
fn online_accuracy(
    store: &Db,
    model: &str,
    version: &str,
    device: &str,
    since: OffsetDateTime,
) -> Result<Option<f64>> {
    let mut read = 0usize;
    let samples: Vec<SampleRecord> = store.drift.samples.scan_prefix_rev_while(
        &format!("{model}/{version}/{device}/"),
        |s| {
            read += 1;
            read <= MAX_FEEDBACK_PER_DEVICE && s.at().is_none_or(|t| t >= since)
        },
    )?;
    let judged: Vec<bool> = samples
        .iter()
        .filter(|s| s.kind == SampleKind::Feedback)
        .filter_map(|s| Some(s.label? == s.predicted_class?))
        .collect();
    if judged.is_empty() {
        return Ok(None);
    }
    let right = judged.iter().filter(|ok| **ok).count();
    Ok(Some(right as f64 / judged.len() as f64))
}

#[cfg(test)]
mod tests;
