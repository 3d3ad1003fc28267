//! The rollout state machine. See the module docs of `rollout` for the
//! decisions it encodes.

use std::collections::BTreeMap;

use super::plan;
use super::{
    Action, AssignmentStatus, CancelReason, Compatibility, Deployment, Event, Evidence, FleetState,
    Moved, RolloutState, Telemetry, TrafficEvidence, UnixSeconds, WindowStats, OWN_ARTIFACT,
};
use edgeloop_errors::Error;

/// The result of one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub deployment: Deployment,
    pub actions: Vec<Action>,
}

/// Advances `deployment` by one tick. Pure: the same inputs give the same
/// output, which is what lets a restarted control plane resume from the
/// persisted deployment.
pub fn step(
    deployment: &Deployment,
    fleet: &FleetState,
    telemetry: &Telemetry,
    now: UnixSeconds,
) -> Step {
    let mut d = deployment.clone();
    let mut actions = Vec::new();
    advance(&mut d, fleet, telemetry, now, &mut actions);
    if d != *deployment {
        d.generation += 1;
    }
    Step {
        deployment: d,
        actions,
    }
}

fn advance(
    d: &mut Deployment,
    fleet: &FleetState,
    telemetry: &Telemetry,
    now: UnixSeconds,
    out: &mut Vec<Action>,
) {
    if d.state.is_terminal() {
        return;
    }
    if let Some(by) = d.superseded_by.clone() {
        let reason = CancelReason::Superseded { by };
        finish(d, RolloutState::Cancelled { reason }, Vec::new(), out);
        return;
    }
    // A cancel during a rollback changes nothing: devices are already going back.
    if d.cancel_requested && !matches!(d.state, RolloutState::RollingBack { .. }) {
        let then = RolloutState::Cancelled {
            reason: CancelReason::Requested,
        };
        roll_back(d, now, "cancel requested".into(), then, out);
        return;
    }
    match d.state.clone() {
        RolloutState::Pending => {
            if let Err(e) = super::validate(d) {
                let reason = describe(&e);
                finish(d, RolloutState::Failed { reason }, Vec::new(), out);
            } else if now >= d.deadline {
                let reason = "deadline passed before the first wave".to_string();
                finish(d, RolloutState::Failed { reason }, Vec::new(), out);
            } else {
                start_wave(d, 0, fleet, now, out);
            }
        }
        RolloutState::Wave {
            index,
            started_at,
            soak_until,
        } => wave_tick(d, index, started_at, soak_until, fleet, telemetry, now, out),
        RolloutState::RollingBack { started_at, then } => {
            // Online moved devices not yet back on their previous version.
            let unconfirmed: Vec<String> = d
                .moved
                .iter()
                .filter(|(dev, m)| {
                    fleet
                        .devices
                        .get(*dev)
                        .is_some_and(|s| s.online && s.version != m.previous)
                })
                .map(|(dev, _)| dev.clone())
                .collect();
            let timed_out = now >= started_at + d.strategy.rollback_timeout_seconds;
            if unconfirmed.is_empty() || timed_out {
                finish(d, *then, unconfirmed, out);
            }
        }
        RolloutState::Succeeded
        | RolloutState::RolledBack { .. }
        | RolloutState::Failed { .. }
        | RolloutState::Cancelled { .. } => {}
    }
}

#[allow(clippy::too_many_arguments)]
fn wave_tick(
    d: &mut Deployment,
    index: usize,
    started_at: UnixSeconds,
    soak_until: Option<UnixSeconds>,
    fleet: &FleetState,
    telemetry: &Telemetry,
    now: UnixSeconds,
    out: &mut Vec<Action>,
) {
    let ev = measure(d, index, fleet, telemetry);
    // Gates are checked on every tick, not only after the soak: a breach
    // should stop the rollout as early as it shows.
    if let Some(reason) = breach(d, &ev) {
        let then = RolloutState::RolledBack {
            reason: reason.clone(),
            evidence: Box::new(ev),
        };
        roll_back(d, now, reason, then, out);
        return;
    }
    let offline_ok = ev.offline.len() as f64 <= d.offline_tolerance * ev.wave_devices as f64;
    let active = ev.not_active.is_empty();
    let soak_until = match soak_until {
        None if active && offline_ok => {
            let s = now + d.strategy.min_soak_seconds;
            d.state = RolloutState::Wave {
                index,
                started_at,
                soak_until: Some(s),
            };
            Some(s)
        }
        other => other,
    };
    let soaked = soak_until.is_some_and(|s| now >= s);
    let enough_traffic = ev.requests >= d.gates.min_requests;
    // The deadline wins over a wave that turns healthy on the same tick, so
    // "bounded time" is strict; ticks are seconds apart, timeouts minutes.
    let wave_deadline = started_at + d.strategy.wave_timeout_seconds;
    if now >= wave_deadline || now >= d.deadline {
        let which = if now >= d.deadline {
            "deployment deadline"
        } else {
            "wave deadline"
        };
        let mut why = Vec::new();
        if !offline_ok {
            why.push(format!(
                "{} of {} devices offline (tolerance {})",
                ev.offline.len(),
                ev.wave_devices,
                d.offline_tolerance
            ));
        }
        if !active {
            why.push(format!("not active: {}", ev.not_active.join(", ")));
        }
        if !soaked {
            why.push("soak not finished".into());
        }
        if !enough_traffic {
            why.push(format!(
                "{} requests < min {}",
                ev.requests, d.gates.min_requests
            ));
        }
        if why.is_empty() {
            why.push("healthy only after the deadline".into());
        }
        let reason = format!(
            "wave {index} not healthy by the {which}: {}",
            why.join("; ")
        );
        roll_back(d, now, reason.clone(), RolloutState::Failed { reason }, out);
        return;
    }
    if soaked && active && offline_ok && enough_traffic {
        out.push(Action::Record {
            event: Event::WaveHealthy {
                index,
                evidence: ev,
            },
        });
        if index + 1 >= d.strategy.waves.len() {
            finish(d, RolloutState::Succeeded, Vec::new(), out);
        } else {
            start_wave(d, index + 1, fleet, now, out);
        }
    }
}

/// Moves every device planned for waves `0..=index` that is not moved yet.
/// Earlier waves are included so a device that joined the group after its
/// wave ran is caught up rather than forgotten.
fn start_wave(
    d: &mut Deployment,
    index: usize,
    fleet: &FleetState,
    now: UnixSeconds,
    out: &mut Vec<Action>,
) {
    let waves = plan::plan(&d.seed, fleet.devices.keys(), &d.strategy.waves);
    let mut assigned = Vec::new();
    let mut skipped = Vec::new();
    for dev in waves.iter().take(index + 1).flatten() {
        if d.moved.contains_key(dev) || d.skipped.contains_key(dev) {
            continue;
        }
        let Some(state) = fleet.devices.get(dev) else {
            continue;
        };
        match &state.compatibility {
            Compatibility::Skipped { reason } => {
                d.skipped.insert(dev.clone(), reason.clone());
                skipped.push((dev.clone(), reason.clone()));
            }
            Compatibility::Compatible => {
                d.moved.insert(
                    dev.clone(),
                    Moved {
                        wave: index,
                        previous: state.version.clone(),
                    },
                );
                assigned.push(dev.clone());
            }
        }
    }
    out.push(Action::Record {
        event: Event::WaveStarted {
            index,
            assigned: assigned.clone(),
            skipped,
        },
    });
    out.extend(assigned.into_iter().map(|device| Action::Assign {
        device,
        version: d.target_version.clone(),
    }));
    d.state = RolloutState::Wave {
        index,
        started_at: now,
        soak_until: None,
    };
}

/// Reverts every moved device, online or not (a revert is stored as desired
/// state, so offline devices pick it up when they return).
fn roll_back(
    d: &mut Deployment,
    now: UnixSeconds,
    reason: String,
    then: RolloutState,
    out: &mut Vec<Action>,
) {
    if d.moved.is_empty() {
        finish(d, then, Vec::new(), out);
        return;
    }
    out.push(Action::Record {
        event: Event::RollbackStarted {
            reason,
            reverted: d.moved.keys().cloned().collect(),
        },
    });
    out.extend(d.moved.iter().map(|(dev, m)| Action::Revert {
        device: dev.clone(),
        version: m.previous.clone(),
    }));
    d.state = RolloutState::RollingBack {
        started_at: now,
        then: Box::new(then),
    };
}

fn finish(
    d: &mut Deployment,
    state: RolloutState,
    unconfirmed: Vec<String>,
    out: &mut Vec<Action>,
) {
    out.push(Action::Record {
        event: Event::Finished {
            state: state.clone(),
            unconfirmed,
        },
    });
    d.state = state;
}

/// Gathers the gate inputs: traffic and failures over every moved device,
/// readiness over the current wave.
/// Traffic of a group of moved devices, summed as [`measure`] reads it.
#[derive(Default)]
struct Traffic {
    devices: usize,
    requests: u64,
    errors: u64,
    p99_sum: f64,
    base_sum: f64,
    paired: u64,
    acc_sum: f64,
    acc_n: u64,
}

impl Traffic {
    /// The counts are the devices': held at `u64::MAX`
    /// (edgeloop_errors::device_counts).
    fn add(&mut self, new: &WindowStats, base: Option<&WindowStats>) {
        let mut sum = edgeloop_errors::device_counts::Adder::default();
        sum.add(&mut self.requests, new.requests);
        sum.add(&mut self.errors, new.errors);
        if let Some(a) = new.online_accuracy {
            self.acc_sum += a * new.requests as f64;
            sum.add(&mut self.acc_n, new.requests);
        }
        if let Some(base) = base {
            if new.requests > 0 && base.requests > 0 {
                self.p99_sum += new.p99_latency_ms * new.requests as f64;
                self.base_sum += base.p99_latency_ms * new.requests as f64;
                sum.add(&mut self.paired, new.requests);
            }
        }
    }

    fn evidence(&self) -> TrafficEvidence {
        let mut ev = TrafficEvidence {
            devices: self.devices,
            requests: self.requests,
            errors: self.errors,
            ..TrafficEvidence::default()
        };
        if self.requests > 0 {
            ev.error_rate = Some(self.errors as f64 / self.requests as f64);
        }
        if self.paired > 0 {
            let (p, b) = (
                self.p99_sum / self.paired as f64,
                self.base_sum / self.paired as f64,
            );
            ev.p99_latency_ms = Some(p);
            ev.baseline_p99_latency_ms = Some(b);
            if b > 0.0 {
                ev.p99_latency_ratio = Some(p / b);
            }
        }
        if self.acc_n > 0 {
            ev.online_accuracy = Some(self.acc_sum / self.acc_n as f64);
        }
        ev
    }
}

fn measure(d: &Deployment, wave: usize, fleet: &FleetState, telemetry: &Telemetry) -> Evidence {
    let mut ev = Evidence {
        wave,
        moved_devices: d.moved.len(),
        ..Evidence::default()
    };
    let mut all = Traffic::default();
    let mut by_variant: BTreeMap<String, Traffic> = BTreeMap::new();
    for (dev, m) in &d.moved {
        let state = fleet.devices.get(dev);
        match state.map(|s| &s.status) {
            Some(AssignmentStatus::Failed { reason }) => {
                ev.activation_failures.push(format!("{dev}: {reason}"))
            }
            Some(AssignmentStatus::RolledBack { reason }) => ev
                .activation_failures
                .push(format!("{dev}: rolled back by the agent: {reason}")),
            _ => {}
        }
        if m.wave == wave {
            ev.wave_devices += 1;
            match state {
                Some(s) if s.online => {
                    let on_target = s.version.as_deref() == Some(d.target_version.as_str());
                    if !(on_target && s.status == AssignmentStatus::Active) {
                        ev.not_active.push(dev.clone());
                    }
                }
                // A device gone from the group is as good as offline.
                _ => ev.offline.push(dev.clone()),
            }
        }
        let variant = state
            .and_then(|s| s.variant.clone())
            .unwrap_or_else(|| OWN_ARTIFACT.to_string());
        let group = by_variant.entry(variant).or_default();
        group.devices += 1;
        let windows = telemetry.windows.get(dev);
        let Some(new) = windows.and_then(|w| w.get(&d.target_version)) else {
            continue;
        };
        let base = m
            .previous
            .as_ref()
            .and_then(|p| windows.and_then(|w| w.get(p)));
        all.devices += 1;
        all.add(new, base);
        group.add(new, base);
    }
    let total = all.evidence();
    ev.requests = total.requests;
    ev.errors = total.errors;
    ev.error_rate = total.error_rate;
    ev.p99_latency_ms = total.p99_latency_ms;
    ev.baseline_p99_latency_ms = total.baseline_p99_latency_ms;
    ev.p99_latency_ratio = total.p99_latency_ratio;
    ev.online_accuracy = total.online_accuracy;
    if by_variant.keys().any(|k| k != OWN_ARTIFACT) {
        ev.variants = by_variant
            .into_iter()
            .map(|(name, t)| (name, t.evidence()))
            .collect();
    }
    ev
}

/// The first gate that trips, as a reason naming the numbers: over every
/// moved device, then over each variant's devices by themselves.
fn breach(d: &Deployment, ev: &Evidence) -> Option<String> {
    let g = &d.gates;
    if ev.activation_failures.len() as u64 > u64::from(g.max_activation_failures) {
        return Some(format!(
            "activation failures {} > max {} ({})",
            ev.activation_failures.len(),
            g.max_activation_failures,
            ev.activation_failures.join("; ")
        ));
    }
    let total = TrafficEvidence {
        devices: ev.moved_devices,
        requests: ev.requests,
        errors: ev.errors,
        error_rate: ev.error_rate,
        p99_latency_ms: ev.p99_latency_ms,
        baseline_p99_latency_ms: ev.baseline_p99_latency_ms,
        p99_latency_ratio: ev.p99_latency_ratio,
        online_accuracy: ev.online_accuracy,
    };
    if let Some(reason) = traffic_breach(g, &total) {
        return Some(reason);
    }
    ev.variants
        .iter()
        .find_map(|(name, t)| traffic_breach(g, t).map(|r| format!("variant {name}: {r}")))
}

/// The rate gates on one group's traffic; they wait for enough traffic to
/// mean something.
fn traffic_breach(g: &super::Gates, t: &TrafficEvidence) -> Option<String> {
    if t.requests == 0 || t.requests < g.min_requests {
        return None;
    }
    if let Some(rate) = t.error_rate {
        if rate > g.max_error_rate {
            return Some(format!(
                "error rate {rate:.4} > max {} ({} of {} requests)",
                g.max_error_rate, t.errors, t.requests
            ));
        }
    }
    if let (Some(r), Some(p), Some(b)) = (
        t.p99_latency_ratio,
        t.p99_latency_ms,
        t.baseline_p99_latency_ms,
    ) {
        if r > g.max_p99_latency_ratio {
            return Some(format!(
                "p99 latency ratio {r:.2} > max {} ({p:.1} ms vs {b:.1} ms on the previous version)",
                g.max_p99_latency_ratio
            ));
        }
    }
    if let (Some(min), Some(acc)) = (g.min_online_accuracy, t.online_accuracy) {
        if acc < min {
            return Some(format!("online accuracy {acc:.4} < min {min}"));
        }
    }
    None
}

/// `field: message` for a validation error, so the stored reason names the field.
fn describe(e: &Error) -> String {
    match e {
        Error::BadRequest {
            field: Some(f),
            message,
        } => format!("{f}: {message}"),
        other => other.to_string(),
    }
}
