//! What each device should run. A device's set carries a generation number
//! that only grows, so an agent can ignore anything older than what it has.

use std::collections::HashMap;

use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::db::Db;
use crate::fleet::members::{Member, MemberKind};
use crate::fleet::{Events, FleetEvent};
use edgeloop_api::registry::variant_for;
use edgeloop_errors::{Error, Result};
use edgeloop_registry::models::ModelVersionRecord;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssignmentSetRecord {
    pub generation: u64,
    pub assignments: Vec<AssignmentRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssignmentRecord {
    pub model_name: String,
    pub model_version: String,
    pub artifact_digest: Digest,
    pub artifact_size: u64,
    #[serde(default)]
    pub manifest_digest: Option<Digest>,
    #[serde(default)]
    pub deployment_id: String,
    #[serde(default)]
    pub activation_timeout_seconds: u32,
    /// The health probe's sample inputs, when the version's manifest has a probe.
    #[serde(default)]
    pub probe_inputs_digest: Option<Digest>,
    /// The creation order of the deployment that wrote this entry: a write
    /// from an older deployment never replaces a newer one's.
    #[serde(default)]
    pub deployment_seq: u64,
    /// The version's variant this device got; `None`: its own artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl AssignmentRecord {
    /// An assignment of `version`, carrying everything a device fetches.
    pub fn for_version(
        version: &ModelVersionRecord,
        deployment_id: impl Into<String>,
        activation_timeout_seconds: u32,
    ) -> AssignmentRecord {
        AssignmentRecord {
            model_name: version.model.clone(),
            model_version: version.version.clone(),
            artifact_digest: version.artifact_digest,
            artifact_size: version.artifact_size,
            manifest_digest: version.manifest_digest,
            deployment_id: deployment_id.into(),
            activation_timeout_seconds,
            probe_inputs_digest: version.probe_inputs_digest,
            deployment_seq: 0,
            variant: None,
        }
    }

    /// The assignment of `version` for a device with these execution
    /// providers: the first of its variants that names one of them, else
    /// the version's own artifact.
    pub fn for_device(
        version: &ModelVersionRecord,
        providers: &[String],
        deployment_id: impl Into<String>,
        activation_timeout_seconds: u32,
    ) -> AssignmentRecord {
        let own = Self::for_version(version, deployment_id, activation_timeout_seconds);
        match variant_for(&version.variants, providers) {
            None => own,
            Some(v) => AssignmentRecord {
                artifact_digest: v.artifact_digest,
                artifact_size: v.artifact_size,
                manifest_digest: Some(v.manifest_digest),
                probe_inputs_digest: v.probe_inputs_digest,
                variant: Some(v.name.clone()),
                ..own
            },
        }
    }
}

impl AssignmentSetRecord {
    /// Whether `digest` is something this device was told to fetch. Devices
    /// may only read artifacts assigned to them.
    pub fn references(&self, digest: Digest) -> bool {
        self.assignments.iter().any(|a| {
            a.artifact_digest == digest
                || a.manifest_digest == Some(digest)
                || a.probe_inputs_digest == Some(digest)
        })
    }

    pub fn to_proto(&self) -> pb::AssignmentSet {
        pb::AssignmentSet {
            generation: self.generation,
            assignments: self
                .assignments
                .iter()
                .map(|a| pb::Assignment {
                    model_name: a.model_name.clone(),
                    model_version: a.model_version.clone(),
                    artifact_digest: a.artifact_digest.to_string(),
                    artifact_size: a.artifact_size,
                    manifest_digest: a.manifest_digest.map(|d| d.to_string()).unwrap_or_default(),
                    deployment_id: a.deployment_id.clone(),
                    activation_timeout_seconds: a.activation_timeout_seconds,
                    probe_inputs_digest: a
                        .probe_inputs_digest
                        .map(|d| d.to_string())
                        .unwrap_or_default(),
                })
                .collect(),
        }
    }
}

pub fn current(store: &Db, device: &str) -> Result<AssignmentSetRecord> {
    Ok(store.fleet.assignments.get(device)?.unwrap_or_default())
}

/// Replaces a device's assignments, bumping the generation, and wakes its
/// watch stream. Rollouts (a later wing) are the callers.
pub async fn replace(
    store: &Db,
    events: &Events,
    device: &str,
    assignments: Vec<AssignmentRecord>,
) -> Result<AssignmentSetRecord> {
    if !store.fleet.members(MemberKind::Device).contains(device)? {
        return Err(Error::not_found("device", device));
    }
    for a in &assignments {
        super::admission::remember(store, device, &a.model_name, &a.model_version)?;
    }
    let set = store.fleet.assignments.update(device, |cur| {
        let generation = cur.map_or(0, |c| c.generation) + 1;
        Ok::<_, Error>(AssignmentSetRecord {
            generation,
            assignments: assignments.clone(),
        })
    })??;
    store.flush().await?;
    events.publish(FleetEvent::AssignmentsChanged {
        device: device.to_string(),
    });
    Ok(set)
}

/// What [`set_models`] did to one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    /// The set changed; its new generation.
    Changed(u64),
    /// The device already had exactly this.
    Unchanged,
    /// A newer deployment owns this model on the device; nothing was written.
    Stale,
    /// The device is not enrolled (any more).
    UnknownDevice,
}

/// Sets one model's entry on each of `devices` (distinct): the entry
/// `entry_for` makes from the device's member record (`None` removes it),
/// keeping the device's other models, unless a newer deployment (higher
/// `seq`) owns the entry. A few store calls whatever the number of devices
/// (on PostgreSQL, a few round trips instead of a few per device): one read
/// of the members, the assignment history's read and write, then the sets'
/// reads and one fenced transaction (again for sets another writer changed
/// meanwhile). Per device, in order: what happened, and the entry it got.
/// Neither flushes nor wakes the devices: a rollout writes many, then
/// flushes once, then publishes [`FleetEvent::AssignmentsChanged`].
pub fn set_models(
    store: &Db,
    model: &str,
    seq: u64,
    fence: Option<edgeloop_store::Fence>,
    devices: &[&str],
    entry_for: impl Fn(&Member) -> Option<AssignmentRecord>,
) -> Result<Vec<(SetOutcome, Option<AssignmentRecord>)>> {
    let members = store.fleet.members(MemberKind::Device).get_many(devices)?;
    let mut entries: HashMap<&str, Option<AssignmentRecord>> = HashMap::new();
    for (device, member) in devices.iter().zip(&members) {
        if let Some(m) = member {
            entries.insert(device, entry_for(m));
        }
    }
    // The history before the sets, so a stored assignment always has its.
    let remembered: Vec<(&str, &str, &str)> = entries
        .iter()
        .filter_map(|(d, e)| {
            e.as_ref()
                .map(|e| (*d, e.model_name.as_str(), e.model_version.as_str()))
        })
        .collect();
    super::admission::remember_many(store, &remembered)?;
    let enrolled: Vec<&str> = devices
        .iter()
        .copied()
        .filter(|d| entries.contains_key(d))
        .collect();
    // What the last run of the update decided, per device: that run's
    // value is the one written.
    let mut decided: HashMap<String, SetOutcome> = HashMap::new();
    // A rollout's write, fenced: a stale leader's never lands, so no
    // generation is handed out twice.
    let written =
        store.update_many_fenced(&store.fleet.assignments, fence, &enrolled, |device, cur| {
            let entry = entries.get(device).cloned().flatten();
            let (outcome, set) = set_entry(cur.unwrap_or_default(), model, entry, seq);
            decided.insert(device.to_string(), outcome);
            Ok::<_, Error>(set)
        })?;
    for w in written {
        w.map_err(crate::leader::not_written)?;
    }
    Ok(devices
        .iter()
        .map(|d| match entries.get(d) {
            None => (SetOutcome::UnknownDevice, None),
            Some(entry) => (
                decided.get(*d).copied().unwrap_or(SetOutcome::Unchanged),
                entry.clone(),
            ),
        })
        .collect())
}

/// One device's set with `model`'s entry replaced by `entry` (removed when
/// `None`), unless a newer deployment's entry is there.
fn set_entry(
    cur: AssignmentSetRecord,
    model: &str,
    entry: Option<AssignmentRecord>,
    seq: u64,
) -> (SetOutcome, AssignmentSetRecord) {
    let existing = cur.assignments.iter().find(|a| a.model_name == model);
    if existing.is_some_and(|a| a.deployment_seq > seq) {
        return (SetOutcome::Stale, cur);
    }
    if existing == entry.as_ref() {
        return (SetOutcome::Unchanged, cur);
    }
    let mut assignments: Vec<AssignmentRecord> = cur
        .assignments
        .iter()
        .filter(|a| a.model_name != model)
        .cloned()
        .collect();
    assignments.extend(entry);
    assignments.sort_by(|a, b| a.model_name.cmp(&b.model_name));
    let generation = cur.generation + 1;
    (
        SetOutcome::Changed(generation),
        AssignmentSetRecord {
            generation,
            assignments,
        },
    )
}
