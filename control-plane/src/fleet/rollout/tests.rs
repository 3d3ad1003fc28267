//! Table tests with an injected clock. A small simulator plays the agents:
//! it applies the actions the way the store and the agents would, and
//! reports telemetry for whatever version each device runs.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use super::*;

const T0: UnixSeconds = 1_700_000_000;
const OLD: &str = "v1";
const NEW: &str = "v2";

fn stats(requests: u64, errors: u64, p99: f64) -> WindowStats {
    WindowStats {
        requests,
        errors,
        p99_latency_ms: p99,
        online_accuracy: None,
    }
}

fn deployment(waves: Waves) -> Deployment {
    Deployment {
        id: "dep-1".into(),
        group: "site=lab".into(),
        model: "detector".into(),
        target_version: NEW.into(),
        seed: "seed-1".into(),
        strategy: Strategy {
            waves,
            min_soak_seconds: 60,
            wave_timeout_seconds: 600,
            rollback_timeout_seconds: 300,
        },
        gates: Gates {
            max_error_rate: 0.05,
            max_p99_latency_ratio: 1.5,
            max_activation_failures: 0,
            min_online_accuracy: None,
            min_requests: 10,
        },
        offline_tolerance: 0.0,
        deadline: T0 + 10_000,
        state: RolloutState::Pending,
        moved: BTreeMap::new(),
        skipped: BTreeMap::new(),
        cancel_requested: false,
        superseded_by: None,
        generation: 0,
    }
}

struct Sim {
    dep: Deployment,
    fleet: FleetState,
    now: UnixSeconds,
    /// What the store holds for each device, applied when it is online.
    desired: BTreeMap<String, Option<String>>,
    /// Devices whose activation of the target fails.
    failing: BTreeSet<String>,
    new_stats: WindowStats,
    old_stats: WindowStats,
    /// Every device that was ever assigned the target.
    ever_assigned: BTreeSet<String>,
    log: Vec<Action>,
}

impl Sim {
    fn new(n: usize, waves: Waves) -> Sim {
        let devices = (0..n)
            .map(|i| {
                let s = DeviceState {
                    online: true,
                    version: Some(OLD.into()),
                    status: AssignmentStatus::Active,
                    compatibility: Compatibility::Compatible,
                    variant: None,
                };
                (format!("dev-{i:02}"), s)
            })
            .collect();
        Sim {
            dep: deployment(waves),
            fleet: FleetState { devices },
            now: T0,
            desired: BTreeMap::new(),
            failing: BTreeSet::new(),
            new_stats: stats(100, 1, 10.0),
            old_stats: stats(100, 1, 10.0),
            ever_assigned: BTreeSet::new(),
            log: Vec::new(),
        }
    }

    fn telemetry(&self) -> Telemetry {
        let mut t = Telemetry::default();
        for (dev, s) in &self.fleet.devices {
            // The previous version's window is the baseline every device has.
            let w = t.windows.entry(dev.clone()).or_default();
            w.insert(OLD.into(), self.old_stats.clone());
            if s.online && s.version.as_deref() == Some(NEW) {
                w.insert(NEW.into(), self.new_stats.clone());
            }
        }
        t
    }

    /// One controller tick, then the agents converge.
    fn tick(&mut self) -> Vec<Action> {
        let out = step(&self.dep, &self.fleet, &self.telemetry(), self.now);
        for a in &out.actions {
            match a {
                Action::Assign { device, version } => {
                    self.ever_assigned.insert(device.clone());
                    self.desired.insert(device.clone(), Some(version.clone()));
                }
                Action::Revert { device, version } => {
                    self.desired.insert(device.clone(), version.clone());
                }
                Action::Record { .. } => {}
            }
        }
        self.dep = out.deployment;
        self.converge();
        self.log.extend(out.actions.clone());
        out.actions
    }

    fn converge(&mut self) {
        for (dev, want) in &self.desired {
            let s = self.fleet.devices.get_mut(dev).unwrap();
            if !s.online {
                continue;
            }
            if want.as_deref() == Some(NEW) && self.failing.contains(dev) {
                s.status = AssignmentStatus::Failed {
                    reason: "probe failed".into(),
                };
            } else {
                s.version = want.clone();
                s.status = AssignmentStatus::Active;
            }
        }
    }

    fn set_online(&mut self, dev: &str, online: bool) {
        self.fleet.devices.get_mut(dev).unwrap().online = online;
        self.converge();
    }

    /// Ticks every `dt` seconds until terminal or `max` ticks.
    fn run(&mut self, dt: i64, max: usize) {
        for _ in 0..max {
            if self.dep.state.is_terminal() {
                return;
            }
            self.tick();
            self.now += dt;
        }
    }

    fn wave_members(&self, wave: usize) -> BTreeSet<String> {
        self.dep
            .moved
            .iter()
            .filter(|(_, m)| m.wave == wave)
            .map(|(d, _)| d.clone())
            .collect()
    }

    fn on_version(&self, v: &str) -> BTreeSet<String> {
        self.fleet
            .devices
            .iter()
            .filter(|(_, s)| s.version.as_deref() == Some(v))
            .map(|(d, _)| d.clone())
            .collect()
    }

    fn reverted(&self) -> BTreeSet<String> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::Revert { device, .. } => Some(device.clone()),
                _ => None,
            })
            .collect()
    }
}

fn pct(p: &[u32]) -> Waves {
    Waves::Percent(p.to_vec())
}

// ---- plan ----

#[test]
fn rollout_plan_membership_is_stable_and_seeded() {
    let devices: Vec<String> = (0..50).map(|i| format!("dev-{i:02}")).collect();
    let waves = pct(&[1, 10, 50, 100]);
    let a = plan::plan("seed-1", &devices, &waves);
    // Input order does not matter, only the seed.
    let reversed: Vec<String> = devices.iter().rev().cloned().collect();
    assert_eq!(a, plan::plan("seed-1", &reversed, &waves));
    assert_ne!(a, plan::plan("seed-2", &devices, &waves));
    // Pinned: SHA-256 must keep giving this order across processes and releases.
    assert_eq!(
        hex::encode(plan::rank("seed-1", "dev-00")),
        "501ca0e809c7d506312c3cf4fd3a1c92a3eba91f2b7b09881fd2b537cd6229e6"
    );
    let sizes: Vec<usize> = a.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![1, 4, 20, 25]);
    let all: BTreeSet<&String> = a.iter().flatten().collect();
    assert_eq!(all.len(), 50);
}

#[test]
fn rollout_plan_wave_sizes_table() {
    let cases: Vec<(Waves, usize, Vec<usize>)> = vec![
        (pct(&[1, 10, 50, 100]), 50, vec![1, 5, 25, 50]),
        // ceil keeps at least one device in a non-empty first wave
        (pct(&[1, 10, 50, 100]), 3, vec![1, 1, 2, 3]),
        (pct(&[100]), 7, vec![7]),
        (pct(&[1, 100]), 0, vec![0, 0]),
        (Waves::Count(vec![1, 5, 20]), 50, vec![1, 5, 50]),
        (Waves::Count(vec![1, 5, 20]), 3, vec![1, 3, 3]),
    ];
    for (waves, n, want) in cases {
        assert_eq!(plan::wave_ends(&waves, n), want, "{waves:?} n={n}");
    }
}

#[test]
fn rollout_validation_names_the_field() {
    let s = |waves: Waves, soak: i64, timeout: i64| Strategy {
        waves,
        min_soak_seconds: soak,
        wave_timeout_seconds: timeout,
        rollback_timeout_seconds: 60,
    };
    let cases: Vec<(Strategy, Option<&str>)> = vec![
        (s(pct(&[1, 10, 50, 100]), 0, 10), None),
        (s(pct(&[]), 0, 10), Some("strategy.waves")),
        (s(pct(&[0, 100]), 0, 10), Some("strategy.waves[0]")),
        (s(pct(&[10, 10, 100]), 0, 10), Some("strategy.waves[1]")),
        (s(pct(&[1, 50, 40, 100]), 0, 10), Some("strategy.waves[2]")),
        (s(pct(&[1, 50, 101]), 0, 10), Some("strategy.waves[2]")),
        (s(pct(&[1, 50]), 0, 10), Some("strategy.waves[1]")),
        (
            s(Waves::Count(vec![1, 5, 5]), 0, 10),
            Some("strategy.waves[2]"),
        ),
        (
            s(Waves::Count(vec![0, 5]), 0, 10),
            Some("strategy.waves[0]"),
        ),
        (s(pct(&[100]), -1, 10), Some("strategy.min_soak_seconds")),
        (
            s(pct(&[100]), 60, 60),
            Some("strategy.wave_timeout_seconds"),
        ),
    ];
    for (strategy, want) in cases {
        let got = match plan::validate_strategy(&strategy) {
            Ok(()) => None,
            Err(edgeloop_errors::Error::BadRequest { field, .. }) => field,
            Err(e) => panic!("unexpected {e:?}"),
        };
        assert_eq!(got.as_deref(), want, "{strategy:?}");
    }
}

#[test]
fn rollout_invalid_strategy_fails_without_moving_anyone() {
    let mut sim = Sim::new(5, pct(&[1, 50, 40, 100]));
    let actions = sim.tick();
    assert!(sim.ever_assigned.is_empty());
    match &sim.dep.state {
        RolloutState::Failed { reason } => assert!(reason.starts_with("strategy.waves[2]")),
        s => panic!("{s:?}"),
    }
    assert_eq!(actions.len(), 1);
}

// ---- controller ----

#[test]
fn rollout_happy_path_wave_by_wave_to_succeeded() {
    let mut sim = Sim::new(20, pct(&[5, 25, 100]));
    // Tick 1: wave 0 starts with exactly its planned device.
    sim.tick();
    assert!(matches!(sim.dep.state, RolloutState::Wave { index: 0, .. }));
    assert_eq!(sim.ever_assigned.len(), 1);
    // The next tick sees it active and starts the soak; soak has not elapsed.
    sim.now += 10;
    sim.tick();
    assert_eq!(
        sim.dep.state,
        RolloutState::Wave {
            index: 0,
            started_at: T0,
            soak_until: Some(T0 + 70)
        }
    );
    // Before the soak ends nothing moves.
    sim.now = T0 + 69;
    assert!(sim.tick().is_empty());
    sim.now = T0 + 70;
    let actions = sim.tick();
    assert!(matches!(sim.dep.state, RolloutState::Wave { index: 1, .. }));
    assert!(matches!(
        &actions[0],
        Action::Record {
            event: Event::WaveHealthy { index: 0, .. }
        }
    ));
    assert_eq!(sim.ever_assigned.len(), 5);
    sim.run(30, 100);
    assert_eq!(sim.dep.state, RolloutState::Succeeded);
    assert_eq!(sim.on_version(NEW).len(), 20);
    assert!(sim.reverted().is_empty());
    // Terminal: nothing more, and no generation bump.
    let g = sim.dep.generation;
    assert!(sim.tick().is_empty());
    assert_eq!(sim.dep.generation, g);
}

#[test]
fn rollout_gate_breaches_roll_back_only_moved_devices() {
    struct Case {
        name: &'static str,
        setup: fn(&mut Sim),
        reason_starts: &'static str,
    }
    let cases = [
        Case {
            name: "error rate",
            setup: |s| s.new_stats = stats(100, 20, 10.0),
            reason_starts: "error rate 0.2000 > max 0.05",
        },
        Case {
            name: "p99 triples",
            setup: |s| s.new_stats = stats(100, 0, 30.0),
            reason_starts: "p99 latency ratio 3.00 > max 1.5",
        },
        Case {
            name: "activation failures",
            setup: |s| {
                // Fail the activation of every device; wave 0 trips it.
                s.failing = s.fleet.devices.keys().cloned().collect();
            },
            reason_starts: "activation failures 2 > max 0",
        },
        Case {
            name: "online accuracy",
            setup: |s| {
                s.dep.gates.min_online_accuracy = Some(0.9);
                s.new_stats.online_accuracy = Some(0.7);
            },
            reason_starts: "online accuracy 0.7000 < min 0.9",
        },
    ];
    for c in cases {
        let mut sim = Sim::new(20, pct(&[10, 50, 100]));
        (c.setup)(&mut sim);
        sim.tick(); // wave 0 assigned
        let wave0 = sim.wave_members(0);
        assert_eq!(wave0.len(), 2, "{}", c.name);
        sim.now += 10;
        let actions = sim.tick(); // telemetry shows the breach
        let RolloutState::RollingBack { then, .. } = &sim.dep.state else {
            panic!("{}: {:?}", c.name, sim.dep.state);
        };
        let RolloutState::RolledBack { reason, evidence } = then.as_ref() else {
            panic!("{}: {then:?}", c.name);
        };
        assert!(reason.starts_with(c.reason_starts), "{}: {reason}", c.name);
        assert_eq!(evidence.wave, 0);
        let reverts: BTreeSet<String> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Revert { device, version } => {
                    assert_eq!(version.as_deref(), Some(OLD));
                    Some(device.clone())
                }
                _ => None,
            })
            .collect();
        assert_eq!(reverts, wave0, "{}", c.name);
        sim.now += 10;
        sim.tick(); // devices confirm the revert
        assert!(
            matches!(sim.dep.state, RolloutState::RolledBack { .. }),
            "{}: {:?}",
            c.name,
            sim.dep.state
        );
        // Nobody outside wave 0 was ever given the new version.
        assert_eq!(sim.ever_assigned, wave0, "{}", c.name);
        assert!(sim.on_version(NEW).is_empty(), "{}", c.name);
    }
}

/// A variant that fails on its own hardware: one of ten wave-0 devices runs
/// it and fails 40 % of its requests. Over all ten that is 4 %, under the
/// 5 % gate; the variant's own devices are gated by themselves and trip it.
#[test]
fn rollout_a_failing_variant_is_gated_on_its_own_devices() {
    let mut sim = Sim::new(20, pct(&[50, 100]));
    sim.tick(); // wave 0: 10 devices
    let wave0: Vec<String> = sim.wave_members(0).into_iter().collect();
    let gpu = wave0[0].clone();
    sim.fleet.devices.get_mut(&gpu).unwrap().variant = Some("fp16-gpu".into());
    sim.now += 10;
    // 9 healthy devices at 100 requests and 0 errors, the variant's at 100
    // and 40: 40 of 1000 overall (4 %, under the 5 % gate), 40 % on it.
    let mut t = sim.telemetry();
    for (dev, w) in t.windows.iter_mut() {
        if let Some(new) = w.get_mut(NEW) {
            *new = if *dev == gpu {
                stats(100, 40, 10.0)
            } else {
                stats(100, 0, 10.0)
            };
        }
    }
    let out = step(&sim.dep, &sim.fleet, &t, sim.now);
    let RolloutState::RollingBack { then, .. } = &out.deployment.state else {
        panic!("{:?}", out.deployment.state);
    };
    let RolloutState::RolledBack { reason, evidence } = then.as_ref() else {
        panic!("{then:?}");
    };
    assert!(
        reason.starts_with("variant fp16-gpu: error rate 0.4000 > max 0.05 (40 of 100 requests)"),
        "{reason}"
    );
    assert_eq!(evidence.error_rate, Some(0.04));
    assert_eq!(evidence.variants["fp16-gpu"].devices, 1);
    assert_eq!(evidence.variants[OWN_ARTIFACT].requests, 900);
    // Without the variant the same traffic passes: only it was at fault.
    sim.fleet.devices.get_mut(&gpu).unwrap().variant = None;
    let out = step(&sim.dep, &sim.fleet, &t, sim.now);
    assert!(
        matches!(out.deployment.state, RolloutState::Wave { index: 0, .. }),
        "{:?}",
        out.deployment.state
    );
}

#[test]
fn rollout_p99_evidence_carries_the_numbers() {
    let mut sim = Sim::new(10, pct(&[10, 100]));
    sim.new_stats = stats(100, 0, 30.0);
    sim.tick();
    sim.now += 5;
    sim.tick();
    let RolloutState::RollingBack { then, .. } = &sim.dep.state else {
        panic!("{:?}", sim.dep.state)
    };
    let RolloutState::RolledBack { evidence, .. } = then.as_ref() else {
        panic!()
    };
    assert_eq!(evidence.p99_latency_ms, Some(30.0));
    assert_eq!(evidence.baseline_p99_latency_ms, Some(10.0));
    assert_eq!(evidence.p99_latency_ratio, Some(3.0));
}

#[test]
fn rollout_offline_tolerance_table() {
    // (tolerance, devices offline in wave 1, expect Succeeded)
    let cases = [(0.25, 1, true), (0.25, 2, false), (0.0, 1, false)];
    for (tolerance, offline, succeeds) in cases {
        let mut sim = Sim::new(8, Waves::Count(vec![1, 5]));
        sim.dep.offline_tolerance = tolerance;
        sim.tick();
        // Take devices of the coming wave offline before it starts.
        let plan = plan::plan("seed-1", sim.fleet.devices.keys(), &sim.dep.strategy.waves);
        let gone: Vec<String> = plan[1].iter().take(offline).cloned().collect();
        for d in &gone {
            sim.set_online(d, false);
        }
        sim.run(30, 200);
        let name = format!("tolerance {tolerance}, offline {offline}");
        if succeeds {
            assert_eq!(sim.dep.state, RolloutState::Succeeded, "{name}");
            // The offline device was assigned; it converges when it returns.
            sim.set_online(&gone[0], true);
            assert_eq!(sim.on_version(NEW).len(), 8, "{name}");
        } else {
            let RolloutState::Failed { reason } = &sim.dep.state else {
                panic!("{name}: {:?}", sim.dep.state)
            };
            assert!(reason.contains("offline"), "{name}: {reason}");
            assert!(reason.contains("wave deadline"), "{name}: {reason}");
            // Every moved device, the offline ones included, was reverted,
            // and the offline ones land on the old version when they return.
            assert_eq!(sim.reverted(), sim.ever_assigned, "{name}");
            for d in &gone {
                sim.set_online(d, true);
            }
            assert!(sim.on_version(NEW).is_empty(), "{name}");
        }
    }
}

#[test]
fn rollout_incompatible_devices_are_skipped_with_reason() {
    let mut sim = Sim::new(4, pct(&[100]));
    sim.fleet.devices.get_mut("dev-01").unwrap().compatibility = Compatibility::Skipped {
        reason: "needs cuda".into(),
    };
    let actions = sim.tick();
    let Action::Record {
        event: Event::WaveStarted {
            skipped, assigned, ..
        },
    } = &actions[0]
    else {
        panic!("{actions:?}")
    };
    assert_eq!(
        skipped,
        &vec![("dev-01".to_string(), "needs cuda".to_string())]
    );
    assert_eq!(assigned.len(), 3);
    sim.run(30, 20);
    assert_eq!(sim.dep.state, RolloutState::Succeeded);
    assert_eq!(sim.on_version(OLD), BTreeSet::from(["dev-01".to_string()]));
}

#[test]
fn rollout_cancel_reverts_moved_devices() {
    let mut sim = Sim::new(10, pct(&[20, 100]));
    sim.tick();
    let moved: BTreeSet<String> = sim.dep.moved.keys().cloned().collect();
    sim.dep.cancel_requested = true;
    sim.now += 5;
    sim.tick();
    assert!(matches!(sim.dep.state, RolloutState::RollingBack { .. }));
    assert_eq!(sim.reverted(), moved);
    sim.now += 5;
    sim.tick();
    assert_eq!(
        sim.dep.state,
        RolloutState::Cancelled {
            reason: CancelReason::Requested
        }
    );
    assert!(sim.on_version(NEW).is_empty());
}

#[test]
fn rollout_cancel_before_anything_moved_ends_at_once() {
    let mut sim = Sim::new(3, pct(&[100]));
    sim.dep.cancel_requested = true;
    sim.tick();
    assert!(matches!(sim.dep.state, RolloutState::Cancelled { .. }));
    assert!(sim.ever_assigned.is_empty());
}

#[test]
fn rollout_superseded_cancels_without_reverting() {
    let mut sim = Sim::new(10, pct(&[20, 100]));
    sim.tick();
    sim.dep.superseded_by = Some("dep-2".into());
    sim.now += 5;
    sim.tick();
    assert_eq!(
        sim.dep.state,
        RolloutState::Cancelled {
            reason: CancelReason::Superseded { by: "dep-2".into() }
        }
    );
    assert!(sim.reverted().is_empty());
    assert_eq!(sim.on_version(NEW).len(), 2);
}

#[test]
fn rollout_deadline_table() {
    // (what, setup) — each leaves wave 0 unable to pass, then time runs out.
    type Case = (&'static str, fn(&mut Sim), &'static str);
    let cases: [Case; 3] = [
        (
            "no traffic",
            |s| {
                // Devices run the new version but serve nothing, so the wave
                // proves nothing and must not pass.
                s.dep.strategy.min_soak_seconds = 0;
                s.new_stats = stats(0, 0, 0.0);
            },
            "requests < min 10",
        ),
        (
            "deployment deadline",
            |s| s.dep.deadline = T0 + 30,
            "deployment deadline",
        ),
        (
            "wave deadline",
            |s| {
                // The soak starts at the second tick (T0+5) and would end at
                // T0+67; the wave's deadline is T0+63.
                s.dep.strategy.min_soak_seconds = 62;
                s.dep.strategy.wave_timeout_seconds = 63;
            },
            "soak not finished",
        ),
    ];
    for (what, setup, contains) in cases {
        let mut sim = Sim::new(5, pct(&[20, 100]));
        setup(&mut sim);
        sim.run(5, 1000);
        let RolloutState::Failed { reason } = &sim.dep.state else {
            panic!("{what}: {:?}", sim.dep.state)
        };
        assert!(reason.contains(contains), "{what}: {reason}");
        assert!(sim.on_version(NEW).is_empty(), "{what}");
    }
}

#[test]
fn rollout_rollback_ends_after_timeout_with_unconfirmed_devices() {
    let mut sim = Sim::new(10, pct(&[20, 100]));
    sim.new_stats = stats(100, 50, 10.0);
    sim.tick();
    let wave0: Vec<String> = sim.wave_members(0).into_iter().collect();
    // The reverting device stays on the new version (say, its agent hangs).
    sim.now += 5;
    let out = step(&sim.dep, &sim.fleet, &sim.telemetry(), sim.now);
    sim.dep = out.deployment;
    assert!(matches!(sim.dep.state, RolloutState::RollingBack { .. }));
    sim.now += 299;
    sim.tick();
    assert!(matches!(sim.dep.state, RolloutState::RollingBack { .. }));
    sim.now += 1;
    let actions = sim.tick();
    assert!(matches!(sim.dep.state, RolloutState::RolledBack { .. }));
    let Action::Record {
        event: Event::Finished { unconfirmed, .. },
    } = &actions[0]
    else {
        panic!("{actions:?}")
    };
    assert_eq!(unconfirmed, &wave0);
}

#[test]
fn rollout_restart_resumes_from_serialized_state() {
    let mut sim = Sim::new(20, pct(&[10, 50, 100]));
    sim.tick();
    sim.now += 10;
    sim.tick();
    sim.now += 60;
    // "Restart": the stored JSON is all the new process has.
    let stored = serde_json::to_string(&sim.dep).unwrap();
    let restored: Deployment = serde_json::from_str(&stored).unwrap();
    assert_eq!(restored, sim.dep);
    let telemetry = sim.telemetry();
    let a = step(&sim.dep, &sim.fleet, &telemetry, sim.now);
    let b = step(&restored, &sim.fleet, &telemetry, sim.now);
    assert_eq!(a, b);
    assert!(a.actions.iter().any(|x| matches!(x, Action::Assign { .. })));
    // And the rest of the rollout, restarting on every tick, still succeeds
    // without ever re-assigning a device.
    for _ in 0..50 {
        if sim.dep.state.is_terminal() {
            break;
        }
        let json = serde_json::to_string(&sim.dep).unwrap();
        sim.dep = serde_json::from_str(&json).unwrap();
        sim.tick();
        sim.now += 30;
    }
    assert_eq!(sim.dep.state, RolloutState::Succeeded);
    let assigns = sim
        .log
        .iter()
        .filter(|a| matches!(a, Action::Assign { .. }))
        .count();
    assert_eq!(assigns, 20);
}

#[test]
fn rollout_same_seed_retry_picks_same_first_wave() {
    let first = |seed: &str| {
        let mut sim = Sim::new(30, pct(&[10, 100]));
        sim.dep.seed = seed.into();
        sim.tick();
        sim.wave_members(0)
    };
    assert_eq!(first("s"), first("s"));
    assert_ne!(first("s"), first("t"));
}
