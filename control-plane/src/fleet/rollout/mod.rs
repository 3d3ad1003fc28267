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

use crate::error::{Error, Result};
pub use controller::{step, Step};
pub use plan::{Strategy, Waves};

/// Unix time in seconds. The clock is an input so tests can inject it.
pub type UnixSeconds = i64;

/// Health gates, read from agent telemetry while a wave soaks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gates {
    /// Errors / requests on the new version, over every moved device.
    pub max_error_rate: f64,
    /// New p99 latency / the previous version's p99 on the same devices.
    pub max_p99_latency_ratio: f64,
    /// Devices whose activation failed, over the whole deployment.
    pub max_activation_failures: u32,
    #[serde(default)]
    pub min_online_accuracy: Option<f64>,
    /// Traffic needed before the rate gates are judged and before a wave may
    /// pass: with a handful of requests one error would trip the gate, and a
    /// wave that saw no traffic has proven nothing.
    #[serde(default)]
    pub min_requests: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    pub id: String,
    /// The device group's label selector, for the record; the fleet state
    /// passed to [`step`] is already that group.
    pub group: String,
    pub model: String,
    pub target_version: String,
    /// Picks the wave order; a retry with the same seed picks the same devices.
    pub seed: String,
    pub strategy: Strategy,
    pub gates: Gates,
    /// Fraction of a wave's devices allowed to be offline when it passes.
    pub offline_tolerance: f64,
    /// The whole deployment must finish its waves by this time.
    pub deadline: UnixSeconds,
    pub state: RolloutState,
    /// Devices given the target, with what they ran before (captured when
    /// they were moved, so a rollback knows where to send each one back).
    #[serde(default)]
    pub moved: BTreeMap<String, Moved>,
    /// Devices the compatibility pre-check excluded, with the reason.
    #[serde(default)]
    pub skipped: BTreeMap<String, String>,
    #[serde(default)]
    pub cancel_requested: bool,
    /// Set when a newer deployment for the same group replaces this one.
    #[serde(default)]
    pub superseded_by: Option<String>,
    /// Bumped on every change, so the persisting task can compare and swap.
    #[serde(default)]
    pub generation: u64,
}

impl Deployment {
    pub fn validate(&self) -> Result<()> {
        self.strategy.validate()?;
        if !(0.0..1.0).contains(&self.offline_tolerance) {
            return Err(Error::bad_field("offline_tolerance", "must be in [0, 1)"));
        }
        let g = &self.gates;
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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub wave: usize,
    /// `None`: the device ran no version of this model before.
    pub previous: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RolloutState {
    Pending,
    Wave {
        index: usize,
        started_at: UnixSeconds,
        /// Set once every online device in the wave runs the target, so the
        /// soak measures time on the new version, not download time.
        soak_until: Option<UnixSeconds>,
    },
    /// Reverts were issued; waiting for online devices to confirm.
    RollingBack {
        started_at: UnixSeconds,
        /// The terminal state to end in.
        then: Box<RolloutState>,
    },
    Succeeded,
    RolledBack {
        reason: String,
        evidence: Evidence,
    },
    Failed {
        reason: String,
    },
    Cancelled {
        reason: CancelReason,
    },
}

impl RolloutState {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            RolloutState::Succeeded
                | RolloutState::RolledBack { .. }
                | RolloutState::Failed { .. }
                | RolloutState::Cancelled { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CancelReason {
    Requested,
    Superseded { by: String },
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

/// The numbers a gate decision was made on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub wave: usize,
    pub moved_devices: usize,
    pub requests: u64,
    pub errors: u64,
    pub error_rate: Option<f64>,
    /// Request-weighted mean of per-device p99s (p99s cannot be merged
    /// exactly), on the new version and on the previous one, over devices
    /// that have both.
    pub p99_latency_ms: Option<f64>,
    pub baseline_p99_latency_ms: Option<f64>,
    pub p99_latency_ratio: Option<f64>,
    /// `device: reason` for each device whose activation failed.
    pub activation_failures: Vec<String>,
    pub online_accuracy: Option<f64>,
    /// About the current wave only.
    pub wave_devices: usize,
    pub offline: Vec<String>,
    pub not_active: Vec<String>,
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    WaveStarted {
        index: usize,
        assigned: Vec<String>,
        /// `(device, reason)` for devices the compatibility check excluded.
        skipped: Vec<(String, String)>,
    },
    WaveHealthy {
        index: usize,
        evidence: Evidence,
    },
    RollbackStarted {
        reason: String,
        reverted: Vec<String>,
    },
    Finished {
        state: RolloutState,
        /// Online devices that had not confirmed the revert when the
        /// rollback timed out; they converge from their stored assignment.
        unconfirmed: Vec<String>,
    },
}
