//! Rolling a model version out to a device group in waves, with health gates
//! and automatic rollback.
//!
//! [`controller::step`] is a pure function of
//! `(deployment, fleet state, telemetry, now)`; it returns the next
//! deployment (state included) and the [`Action`]s to apply. A thin task owns
//! the I/O: it applies the actions, *then* persists the returned deployment.
//! Actions are desired-state writes and therefore idempotent, so a crash
//! between the two only means the same actions are computed and applied again
//! on the next tick, and a restart continues where the stored state left off.
//!
//! Decisions, and why:
//! - **Cancel reverts** every device already moved, then ends `Cancelled`.
//!   Operators cancel because they no longer trust a rollout; leaving an
//!   unverified version on part of the group, with nobody watching its gates,
//!   is the riskier state. The previous version is the last known good one.
//! - **Supersede does not revert**: the newer deployment for the same group
//!   takes those devices over, and reverting would only churn them.
//! - **A wave that is not healthy by its deadline** (devices offline beyond
//!   the tolerance, stuck downloading, soak unfinished, too little traffic)
//!   reverts the moved devices and ends `Failed{reason}`, for the same
//!   reason as cancel: an unverified version is not left behind.
//! - **Offline devices** are assigned and reverted like online ones; the
//!   actions are stored as the device's desired state, so a device that comes
//!   back converges on its own. A terminal deployment therefore emits nothing
//!   more, which keeps "terminal" final and every deployment bounded in time.
//! - **Activation failures** count devices that report `Failed` or
//!   `RolledBack` (the agent's own rollback) for the assignment we gave them.

pub mod controller;
pub mod plan;
pub mod runner;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use controller::{step, Step};
use edgeloop_errors::{Error, Result};
pub use plan::{Strategy, Waves};

pub use edgeloop_api::deployments::{
    CancelReason, Deployment, Event, Evidence, Gates, Moved, RolloutState, TrafficEvidence,
    OWN_ARTIFACT,
};
pub use edgeloop_api::UnixSeconds;

/// Checks a deployment's numbers; the error names the offending field.
pub fn validate(d: &Deployment) -> Result<()> {
    validate_settings(&d.strategy, &d.gates, d.offline_tolerance)
}

/// [`validate`]'s checks, before there is a deployment: a request's
/// strategy, gates and offline tolerance.
pub fn validate_settings(strategy: &Strategy, g: &Gates, offline_tolerance: f64) -> Result<()> {
    plan::validate_strategy(strategy)?;
    if !(0.0..1.0).contains(&offline_tolerance) {
        return Err(Error::bad_field("offline_tolerance", "must be in [0, 1)"));
    }
    if !(0.0..=1.0).contains(&g.max_error_rate) {
        return Err(Error::bad_field(
            "gates.max_error_rate",
            "must be in [0, 1]",
        ));
    }
    if g.max_p99_latency_ratio.is_nan() || g.max_p99_latency_ratio <= 0.0 {
        return Err(Error::bad_field(
            "gates.max_p99_latency_ratio",
            "must be positive",
        ));
    }
    if let Some(a) = g.min_online_accuracy {
        if !(0.0..=1.0).contains(&a) {
            return Err(Error::bad_field(
                "gates.min_online_accuracy",
                "must be in [0, 1]",
            ));
        }
    }
    Ok(())
}

/// The group as the fleet reports it right now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetState {
    pub devices: BTreeMap<String, DeviceState>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceState {
    pub online: bool,
    /// The version of this model the device reports running.
    pub version: Option<String>,
    pub status: AssignmentStatus,
    pub compatibility: Compatibility,
    /// The variant of the target this deployment gave the device, if not
    /// the version's own artifact; its traffic is gated with its variant's.
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AssignmentStatus {
    Active,
    Downloading,
    Failed {
        reason: String,
    },
    /// The agent put the previous version back itself.
    RolledBack {
        reason: String,
    },
}

/// The result of the compatibility pre-check (runtime, hardware, memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "compatibility", rename_all = "snake_case")]
pub enum Compatibility {
    Compatible,
    Skipped { reason: String },
}

/// Telemetry for the current window: device -> version -> stats. The
/// previous versions' entries are the latency baseline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    pub windows: BTreeMap<String, BTreeMap<String, WindowStats>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    pub requests: u64,
    pub errors: u64,
    pub p99_latency_ms: f64,
    /// Present when some requests were labelled.
    #[serde(default)]
    pub online_accuracy: Option<f64>,
}

/// What the controller wants done. Data only; the caller does the I/O.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Give the device the target version.
    Assign { device: String, version: String },
    /// Send the device back; `None` removes this model's assignment.
    Revert {
        device: String,
        version: Option<String>,
    },
    /// An entry for the deployment's evidence log.
    Record { event: Event },
}
