//! What each device should run. A device's set carries a generation number
//! that only grows, so an agent can ignore anything older than what it has.

use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fleet::members::MemberKind;
use crate::fleet::{Events, FleetEvent};
use crate::registry::models::ModelVersionRecord;
use crate::store::Store;
use edgeloop_api::registry::variant_for;

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

pub fn current(store: &Store, device: &str) -> Result<AssignmentSetRecord> {
    Ok(store.assignments.get(device)?.unwrap_or_default())
}

/// Replaces a device's assignments, bumping the generation, and wakes its
/// watch stream. Rollouts (a later wing) are the callers.
pub async fn replace(
    store: &Store,
    events: &Events,
    device: &str,
    assignments: Vec<AssignmentRecord>,
) -> Result<AssignmentSetRecord> {
    if !store.members(MemberKind::Device).contains(device)? {
        return Err(Error::not_found("device", device));
    }
    for a in &assignments {
        super::admission::remember(store, device, &a.model_name, &a.model_version)?;
    }
    let set = store.assignments.update(device, |cur| {
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

/// What [`set_model`] did.
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

/// Sets one model's entry on a device (`None` removes it), keeping its
/// other models, unless a newer deployment (higher `seq`) owns the entry.
/// Neither flushes nor wakes the device: a rollout writes many devices,
/// then flushes once, then publishes [`FleetEvent::AssignmentsChanged`].
pub fn set_model(
    store: &Store,
    device: &str,
    model: &str,
    entry: Option<AssignmentRecord>,
    seq: u64,
    fence: Option<crate::store::Fence>,
) -> Result<SetOutcome> {
    if !store.members(MemberKind::Device).contains(device)? {
        return Ok(SetOutcome::UnknownDevice);
    }
    if let Some(e) = &entry {
        super::admission::remember(store, device, &e.model_name, &e.model_version)?;
    }
    let mut outcome = SetOutcome::Unchanged;
    // A rollout's write, fenced: a stale leader's never lands, so no
    // generation is handed out twice.
    let written = store.update_fenced(&store.assignments, fence, device, |cur| {
        let cur = cur.unwrap_or_default();
        let existing = cur.assignments.iter().find(|a| a.model_name == model);
        if existing.is_some_and(|a| a.deployment_seq > seq) {
            outcome = SetOutcome::Stale;
            return Ok::<_, Error>(cur);
        }
        if existing == entry.as_ref() {
            outcome = SetOutcome::Unchanged;
            return Ok(cur);
        }
        let mut assignments: Vec<AssignmentRecord> = cur
            .assignments
            .iter()
            .filter(|a| a.model_name != model)
            .cloned()
            .collect();
        assignments.extend(entry.clone());
        assignments.sort_by(|a, b| a.model_name.cmp(&b.model_name));
        outcome = SetOutcome::Changed(cur.generation + 1);
        Ok(AssignmentSetRecord {
            generation: cur.generation + 1,
            assignments,
        })
    })?;
    match written {
        Ok(_) => Ok(outcome),
        Err(e) => Err(crate::leader::not_written(e)),
    }
}
