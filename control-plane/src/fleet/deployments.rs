//! Deployments as the console API sees them: the request, its validation,
//! the persisted record around the rollout controller's [`Deployment`], its
//! event log, cancel and supersede. The controller itself is in
//! [`super::rollout`]; the task that drives it is [`super::rollout::runner`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::members::{CapabilitiesRecord, MemberKind};
use super::rollout::{
    self, Compatibility, Deployment, Event, Gates, RolloutState, Strategy, Waves,
};
use super::selector::{self, Selector};
use crate::db::Db;
pub use edgeloop_api::deployments::{
    CreateDeployment, DeploymentState, DeploymentView, EventEntry, GatesRequest, Requirements,
    StrategyRequest,
};
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};
use edgeloop_registry::aliases::{self, AliasName};
use edgeloop_registry::artifacts::ArtifactStore;
use edgeloop_registry::models;

pub use edgeloop_models::runtime::INPUT_DTYPES_CAPABILITY as INPUT_DTYPES_KEY;

/// The compatibility pre-check for one device. Pure.
pub fn compatibility(req: &Requirements, caps: &CapabilitiesRecord) -> Compatibility {
    let skip = |reason: String| Compatibility::Skipped { reason };
    if let Some(e) = caps.extra.get("onnxruntime_error") {
        return skip(format!("no usable ONNX Runtime: {e}"));
    }
    if let Some(p) = &req.provider {
        if !caps.execution_providers.iter().any(|have| have == p) {
            return skip(format!(
                "needs execution provider {p}; the device has [{}]",
                caps.execution_providers.join(", ")
            ));
        }
    }
    // An agent that does not list its input types predates the list; it
    // is given the benefit of the doubt (its own load check still runs).
    if let Some(served) = caps.extra.get(INPUT_DTYPES_KEY) {
        let served: Vec<&str> = served.split(',').map(str::trim).collect();
        let missing: Vec<&str> = req
            .input_dtypes
            .iter()
            .map(String::as_str)
            .filter(|d| !served.contains(d))
            .collect();
        if !missing.is_empty() {
            return skip(format!(
                "serves no {} inputs (serves {})",
                missing.join(", "),
                served.join(", ")
            ));
        }
    }
    if caps.free_disk_bytes < req.free_disk_bytes {
        return skip(format!(
            "needs {} bytes of free disk, has {}",
            req.free_disk_bytes, caps.free_disk_bytes
        ));
    }
    Compatibility::Compatible
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentRecord {
    pub id: String,
    /// Creation order; a newer deployment's assignments win (see
    /// `assignments::set_model`).
    pub seq: u64,
    pub deployment: Deployment,
    pub requirements: Requirements,
    /// The alias the request named, if any; `deployment.target_version` is
    /// the version it pointed at when this deployment was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<AliasName>,
    pub activation_timeout_seconds: u32,
    /// The assignment-set generation at which each moved device got its
    /// assignment: a status report from before it is about something else.
    #[serde(default)]
    pub assigned_generation: BTreeMap<String, u64>,
    /// The variant each moved device got, for devices that did not get the
    /// version's own artifact.
    #[serde(default)]
    pub assigned_variant: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl DeploymentRecord {
    pub fn is_terminal(&self) -> bool {
        self.deployment.state.is_terminal()
    }

    /// The console API's view, with `events` (empty in lists).
    pub fn view(self, events: Vec<EventEntry>) -> DeploymentView {
        DeploymentView {
            state: self.deployment.state.name(),
            id: self.id,
            seq: self.seq,
            deployment: self.deployment,
            requirements: self.requirements,
            alias: self.alias,
            activation_timeout_seconds: self.activation_timeout_seconds,
            assigned_generation: self.assigned_generation,
            variants: self.assigned_variant,
            created_at: self.created_at,
            updated_at: self.updated_at,
            events,
        }
    }
}

pub use edgeloop_api::deployments::DEFAULT_WAVES;
pub const DEFAULT_MIN_SOAK_SECONDS: i64 = 300;
pub const DEFAULT_WAVE_TIMEOUT_SECONDS: i64 = 1800;
pub const DEFAULT_ROLLBACK_TIMEOUT_SECONDS: i64 = 600;
pub const DEFAULT_OFFLINE_TOLERANCE: f64 = 0.1;
pub const DEFAULT_ACTIVATION_TIMEOUT_SECONDS: u32 = 600;

fn strategy(req: Option<StrategyRequest>) -> Strategy {
    let req = req.unwrap_or(StrategyRequest {
        waves: Waves::Percent(DEFAULT_WAVES.to_vec()),
        min_soak_seconds: None,
        wave_timeout_seconds: None,
        rollback_timeout_seconds: None,
    });
    Strategy {
        waves: req.waves,
        min_soak_seconds: req.min_soak_seconds.unwrap_or(DEFAULT_MIN_SOAK_SECONDS),
        wave_timeout_seconds: req
            .wave_timeout_seconds
            .unwrap_or(DEFAULT_WAVE_TIMEOUT_SECONDS),
        rollback_timeout_seconds: req
            .rollback_timeout_seconds
            .unwrap_or(DEFAULT_ROLLBACK_TIMEOUT_SECONDS),
    }
}

fn gates(req: Option<GatesRequest>) -> Gates {
    let req = req.unwrap_or_default();
    Gates {
        max_error_rate: req.max_error_rate.unwrap_or(0.05),
        max_p99_latency_ratio: req.max_p99_latency_ratio.unwrap_or(1.5),
        max_activation_failures: req.max_activation_failures.unwrap_or(0),
        min_online_accuracy: req.min_online_accuracy,
        min_requests: req.min_requests.unwrap_or(0),
    }
}

/// The devices of a group: enrolled, not revoked, in a project `in_project`
/// accepts, matching `selector`. A deployment's group is always within its
/// model's project: a project's models never reach another's devices.
pub fn group(
    store: &Db,
    in_project: impl Fn(&str) -> bool,
    selector: &Selector,
) -> Result<Vec<super::members::Member>> {
    Ok(store
        .fleet
        .members(MemberKind::Device)
        .values()?
        .into_iter()
        .filter(|m| m.revoked_at.is_none())
        .filter(|m| in_project(&m.project))
        .filter(|m| selector.matches(&selector::facts(&m.labels, &m.capabilities)))
        .collect())
}

pub fn parse_selector(field: &str, raw: &str) -> Result<Selector> {
    if raw.trim().is_empty() {
        return Err(Error::bad_field(
            field,
            "must not be empty (a deployment targets a device group)",
        ));
    }
    raw.parse::<Selector>().map_err(|e| match e {
        Error::BadRequest { message, .. } => Error::bad_field(field, message),
        other => other,
    })
}

/// A deployment request's settings, checked and with the defaults applied.
pub struct Checked {
    pub selector: Selector,
    pub strategy: Strategy,
    pub gates: Gates,
    pub offline_tolerance: f64,
    pub deadline_seconds: i64,
    pub activation_timeout_seconds: u32,
}

/// Every check of a deployment request that needs no stored state (the
/// model, its version or alias, and the devices the selector matches are
/// [`create`]'s): a retraining policy's rollout template is held to these
/// when the policy is set, not only when its Deploy step runs.
pub fn check_request(req: &CreateDeployment) -> Result<Checked> {
    let selector = parse_selector("selector", &req.selector)?;
    if let Some(p) = &req.required_provider {
        validate::text("required_provider", p, 128)?;
    }
    if let Some(seed) = &req.seed {
        validate::text("seed", seed, 128)?;
    }
    let activation_timeout_seconds = req
        .activation_timeout_seconds
        .unwrap_or(DEFAULT_ACTIVATION_TIMEOUT_SECONDS);
    if activation_timeout_seconds == 0 {
        return Err(Error::bad_field(
            "activation_timeout_seconds",
            "must be positive",
        ));
    }
    let strategy = strategy(req.strategy.clone());
    // Saturating: a huge wave timeout must be refused, not overflow.
    let deadline_seconds = req.deadline_seconds.unwrap_or(
        strategy
            .wave_timeout_seconds
            .saturating_mul(strategy.waves.len() as i64),
    );
    if deadline_seconds <= 0 {
        return Err(Error::bad_field("deadline_seconds", "must be positive"));
    }
    let gates = gates(req.gates.clone());
    let offline_tolerance = req.offline_tolerance.unwrap_or(DEFAULT_OFFLINE_TOLERANCE);
    rollout::validate_settings(&strategy, &gates, offline_tolerance)?;
    Ok(Checked {
        selector,
        strategy,
        gates,
        offline_tolerance,
        deadline_seconds,
        activation_timeout_seconds,
    })
}

/// Validates and stores a deployment, and marks any unfinished deployment
/// of the same model to the same group as superseded by it.
pub async fn create(
    store: &Db,
    artifacts: &dyn ArtifactStore,
    req: CreateDeployment,
    now: OffsetDateTime,
) -> Result<DeploymentRecord> {
    validate::name("model", &req.model)?;
    let project = models::get_model(&store.registry, &req.model)
        .map_err(|_| Error::bad_field("model", format!("model {:?} does not exist", req.model)))?
        .project;
    let target = match (&req.version, &req.alias) {
        (Some(_), Some(_)) => {
            return Err(Error::bad_field("alias", "give version or alias, not both"))
        }
        (None, None) => {
            return Err(Error::bad_field(
                "version",
                "required: give the version to roll out, or an alias",
            ))
        }
        (Some(v), None) => v.clone(),
        // Resolved now: moving the alias later does not move this rollout.
        (None, Some(a)) => aliases::resolve(&store.registry, &req.model, a)?.ok_or_else(|| {
            Error::bad_field(
                "alias",
                format!("model {:?} has no alias {:?}", req.model, a.as_str()),
            )
        })?,
    };
    let version = models::get_version(&store.registry, &req.model, &target).map_err(|_| {
        Error::bad_field(
            "version",
            format!("model {:?} has no version {target:?}", req.model),
        )
    })?;
    let Checked {
        selector,
        strategy,
        gates,
        offline_tolerance,
        deadline_seconds,
        activation_timeout_seconds,
    } = check_request(&req)?;
    let input_dtypes = match version.manifest_digest {
        Some(d) => {
            let signed = models::read_manifest(artifacts, d, "version").await?;
            let mut dtypes: Vec<String> = signed
                .manifest
                .signature
                .inputs
                .iter()
                .map(|t| t.dtype.clone())
                .collect();
            dtypes.sort();
            dtypes.dedup();
            dtypes
        }
        None => Vec::new(),
    };
    let seq = store.next_id()?;
    let id = format!("d-{seq:08}");
    let deployment = Deployment {
        id: id.clone(),
        group: req.selector.trim().to_string(),
        model: req.model.clone(),
        target_version: target.clone(),
        seed: req.seed.unwrap_or_else(|| id.clone()),
        strategy,
        gates,
        offline_tolerance,
        deadline: now.unix_timestamp().saturating_add(deadline_seconds),
        state: RolloutState::Pending,
        moved: BTreeMap::new(),
        skipped: BTreeMap::new(),
        cancel_requested: false,
        superseded_by: None,
        generation: 0,
    };
    if group(store, |p| p == project, &selector)?.is_empty() {
        return Err(Error::bad_field(
            "selector",
            format!(
                "{:?} matches no enrolled device of project {project:?}",
                req.selector
            ),
        ));
    }
    let record = DeploymentRecord {
        id: id.clone(),
        seq,
        deployment,
        requirements: Requirements {
            provider: req.required_provider,
            input_dtypes,
            // The largest artifact a device may get: a variant can be
            // bigger than the version's own (fp16 beside int8).
            free_disk_bytes: version
                .variants
                .iter()
                .map(|v| v.artifact_size)
                .fold(version.artifact_size, u64::max),
        },
        alias: req.alias,
        activation_timeout_seconds,
        assigned_generation: BTreeMap::new(),
        assigned_variant: BTreeMap::new(),
        created_at: now,
        updated_at: now,
    };
    if !store.fleet.deployments.insert_new(&id, &record)? {
        return Err(Error::Conflict(format!(
            "deployment id {id:?} collided; retry"
        )));
    }
    for older in store.fleet.deployments.values()? {
        let same_group = older.deployment.model == record.deployment.model
            && older.deployment.group == record.deployment.group;
        if older.seq < seq && same_group && !older.is_terminal() {
            store.fleet.deployments.update(&older.id, |cur| {
                let mut cur = cur.ok_or_else(|| Error::not_found("deployment", &older.id))?;
                if cur.deployment.superseded_by.is_none() {
                    cur.deployment.superseded_by = Some(id.clone());
                    cur.updated_at = now;
                }
                Ok::<_, Error>(cur)
            })??;
        }
    }
    store.flush().await?;
    Ok(record)
}

pub fn get(store: &Db, id: &str) -> Result<DeploymentRecord> {
    store
        .fleet
        .deployments
        .get(id)?
        .ok_or_else(|| Error::not_found("deployment", id))
}

/// Newest first.
pub fn list(store: &Db) -> Result<Vec<DeploymentRecord>> {
    let mut all = store.fleet.deployments.values()?;
    all.sort_by_key(|d| std::cmp::Reverse(d.seq));
    Ok(all)
}

pub fn events(store: &Db, id: &str) -> Result<Vec<EventEntry>> {
    Ok(store
        .fleet
        .deployment_events
        .scan_prefix(&format!("{id}/"))?
        .into_iter()
        .map(|(_, e)| e)
        .collect())
}

pub fn append_event(store: &Db, id: &str, event: Event, at: OffsetDateTime) -> Result<()> {
    let n = store.next_id()?;
    store
        .fleet
        .deployment_events
        .insert(&format!("{id}/{n:020}"), &EventEntry { at, event })?;
    Ok(())
}

/// Asks the rollout to stop; the runner reverts the moved devices and ends
/// it `Cancelled`. A finished deployment cannot be cancelled (409).
pub async fn cancel(store: &Db, id: &str, now: OffsetDateTime) -> Result<DeploymentRecord> {
    let record = store.fleet.deployments.update(id, |cur| {
        let mut cur = cur.ok_or_else(|| Error::not_found("deployment", id))?;
        if cur.is_terminal() {
            return Err(Error::Conflict(format!(
                "deployment {id} already ended ({})",
                cur.deployment.state.name().as_str()
            )));
        }
        cur.deployment.cancel_requested = true;
        cur.updated_at = now;
        Ok(cur)
    })??;
    store.flush().await?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(providers: &[&str], dtypes: Option<&str>, free: u64) -> CapabilitiesRecord {
        let mut c = CapabilitiesRecord {
            execution_providers: providers.iter().map(|p| p.to_string()).collect(),
            free_disk_bytes: free,
            ..Default::default()
        };
        if let Some(d) = dtypes {
            c.extra.insert(INPUT_DTYPES_KEY.into(), d.into());
        }
        c
    }

    #[test]
    fn compatibility_table() {
        let req = Requirements {
            provider: Some("CUDAExecutionProvider".into()),
            input_dtypes: vec!["float16".into()],
            free_disk_bytes: 1000,
        };
        let ok = caps(
            &["CUDAExecutionProvider", "CPUExecutionProvider"],
            Some("float32,float16"),
            5000,
        );
        let mut broken = ok.clone();
        broken
            .extra
            .insert("onnxruntime_error".into(), "no library".into());
        let cases: Vec<(&str, CapabilitiesRecord, Option<&str>)> = vec![
            ("fits", ok.clone(), None),
            ("no runtime", broken, Some("no usable ONNX Runtime")),
            (
                "cpu only",
                caps(&["CPUExecutionProvider"], Some("float32,float16"), 5000),
                Some("needs execution provider CUDAExecutionProvider"),
            ),
            (
                "no fp16 inputs",
                caps(&["CUDAExecutionProvider"], Some("float32,int64"), 5000),
                Some("serves no float16 inputs"),
            ),
            (
                "types not reported",
                caps(&["CUDAExecutionProvider"], None, 5000),
                None,
            ),
            (
                "disk",
                caps(&["CUDAExecutionProvider"], Some("float16"), 999),
                Some("needs 1000 bytes of free disk, has 999"),
            ),
        ];
        for (name, c, want) in cases {
            match (compatibility(&req, &c), want) {
                (Compatibility::Compatible, None) => {}
                (Compatibility::Skipped { reason }, Some(w)) => {
                    assert!(reason.contains(w), "{name}: {reason}")
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn no_requirements_fit_anything_with_a_runtime() {
        assert_eq!(
            compatibility(&Requirements::default(), &CapabilitiesRecord::default()),
            Compatibility::Compatible
        );
    }
}
