//! The life of one assignment on one device, as a pure function
//! `(machine, event, now) -> (machine, actions)`: every path ends in a
//! definite state (`Active`, `Failed`, `RolledBack`), and a deadline turns a
//! download that never finishes into `Failed` instead of "in progress"
//! forever. The worker performs the actions and feeds back what happened.

use std::time::{Duration, Instant};

use super::failure::Failure;
use crate::serving::Serving;

/// The states a device reports (`AssignmentState` on the wire). On disk (a
/// model's `status.json`) in snake case: `"failed"`, `"rolled_back"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportState {
    Downloading,
    Activating,
    Active,
    Failed,
    RolledBack,
}

/// Where the assigned content already is when the assignment starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// Not on this device: download it.
    Nowhere,
    /// In the active slot and serving already.
    Serving(Serving),
    /// In the active slot but not serving (boot could not activate it).
    ActiveSlot,
    /// In the other slot, which served before: the control plane assigned
    /// the previous version back.
    PreviousSlot,
    /// In the other slot, downloaded but never served.
    StagedSlot,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    Downloading,
    /// `rollback`: the assignment brings back the version that served before.
    Activating {
        rollback: bool,
    },
    Active {
        provider: String,
    },
    Failed {
        reason: Failure,
    },
    RolledBack {
        reason: String,
    },
}

impl Phase {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Phase::Active { .. } | Phase::Failed { .. } | Phase::RolledBack { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub phase: Phase,
    pub started: Instant,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Every file is downloaded and verified.
    Downloaded,
    /// The content cannot be used (digest, signature, space, ...).
    Refused(Failure),
    /// The files already in a slot no longer verify (damaged on disk):
    /// download them again rather than give up.
    SlotDamaged(Failure),
    Activated {
        provider: String,
    },
    /// `still_serving`: what serves after the failed activation, if anything.
    ActivationFailed {
        error: String,
        still_serving: Option<Serving>,
    },
    /// Time passed; checks the deadline.
    Tick,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Report {
        state: ReportState,
        reason: String,
        provider: String,
    },
    Download,
    /// Stop the download (its progress stays on disk for a later try).
    StopDownload,
    Activate,
}

fn report(state: ReportState, reason: impl Into<String>, provider: impl Into<String>) -> Action {
    Action::Report {
        state,
        reason: reason.into(),
        provider: provider.into(),
    }
}

fn failed(reason: Failure) -> (Phase, Vec<Action>) {
    let action = report(ReportState::Failed, reason.to_string(), "");
    (Phase::Failed { reason }, vec![action])
}

impl Machine {
    /// The first state of an assignment and what to do first.
    pub fn start(installed: Installed, timeout: Duration, now: Instant) -> (Machine, Vec<Action>) {
        let (phase, actions) = match installed {
            Installed::Nowhere => (
                Phase::Downloading,
                vec![report(ReportState::Downloading, "", ""), Action::Download],
            ),
            Installed::Serving(s) => (
                Phase::Active {
                    provider: s.provider.clone(),
                },
                vec![report(ReportState::Active, "", s.provider)],
            ),
            Installed::ActiveSlot | Installed::StagedSlot => (
                Phase::Activating { rollback: false },
                vec![report(ReportState::Activating, "", ""), Action::Activate],
            ),
            Installed::PreviousSlot => (
                Phase::Activating { rollback: true },
                vec![
                    report(
                        ReportState::Activating,
                        "restoring the previous version from disk",
                        "",
                    ),
                    Action::Activate,
                ],
            ),
        };
        (
            Machine {
                phase,
                started: now,
                timeout,
            },
            actions,
        )
    }

    pub fn deadline(&self) -> Instant {
        self.started + self.timeout
    }

    /// The next state. Terminal states absorb every event.
    pub fn step(self, event: Event, now: Instant) -> (Machine, Vec<Action>) {
        let deadline = self.deadline();
        let (phase, actions) = match (self.phase, event) {
            (phase, _) if phase.is_terminal() => (phase, vec![]),
            (Phase::Downloading, Event::Tick) if now >= deadline => {
                let (phase, mut actions) = failed(Failure::TimedOut {
                    seconds: self.timeout.as_secs(),
                });
                actions.insert(0, Action::StopDownload);
                (phase, actions)
            }
            (Phase::Downloading, Event::Downloaded) => (
                Phase::Activating { rollback: false },
                vec![report(ReportState::Activating, "", ""), Action::Activate],
            ),
            (_, Event::Refused(reason)) => failed(reason),
            (Phase::Activating { .. }, Event::SlotDamaged(why)) => (
                Phase::Downloading,
                vec![
                    report(
                        ReportState::Downloading,
                        format!("the copy on disk is damaged ({why}); downloading again"),
                        "",
                    ),
                    Action::Download,
                ],
            ),
            (Phase::Activating { rollback }, Event::Activated { provider }) => {
                if rollback {
                    (
                        Phase::RolledBack {
                            reason: "the previous version was assigned back".into(),
                        },
                        vec![report(
                            ReportState::RolledBack,
                            "the previous version was assigned back and serves again",
                            provider,
                        )],
                    )
                } else {
                    (
                        Phase::Active {
                            provider: provider.clone(),
                        },
                        vec![report(ReportState::Active, "", provider)],
                    )
                }
            }
            (
                Phase::Activating { rollback },
                Event::ActivationFailed {
                    error,
                    still_serving,
                },
            ) => match still_serving {
                // Bringing back an old version failed: the current one keeps
                // serving, which is not what was asked for.
                Some(serving) if !rollback => {
                    let reason = format!(
                        "activation failed: {error}; version {} still serves",
                        serving.version
                    );
                    (
                        Phase::RolledBack {
                            reason: reason.clone(),
                        },
                        vec![report(ReportState::RolledBack, reason, serving.provider)],
                    )
                }
                _ => failed(Failure::Activation(error)),
            },
            // Anything else (a Tick before the deadline, a late download
            // result while activating) changes nothing.
            (phase, _) => (phase, vec![]),
        };
        (
            Machine {
                phase,
                started: self.started,
                timeout: self.timeout,
            },
            actions,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving(version: &str) -> Serving {
        Serving {
            version: version.into(),
            provider: "CPUExecutionProvider".into(),
        }
    }

    fn states(actions: &[Action]) -> Vec<ReportState> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Report { state, .. } => Some(*state),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn start_table() {
        let now = Instant::now();
        let t = Duration::from_secs(10);
        let table: Vec<(Installed, Phase, Vec<ReportState>, bool, bool)> = vec![
            (
                Installed::Nowhere,
                Phase::Downloading,
                vec![ReportState::Downloading],
                true,
                false,
            ),
            (
                Installed::Serving(serving("2")),
                Phase::Active {
                    provider: "CPUExecutionProvider".into(),
                },
                vec![ReportState::Active],
                false,
                false,
            ),
            (
                Installed::ActiveSlot,
                Phase::Activating { rollback: false },
                vec![ReportState::Activating],
                false,
                true,
            ),
            (
                Installed::StagedSlot,
                Phase::Activating { rollback: false },
                vec![ReportState::Activating],
                false,
                true,
            ),
            (
                Installed::PreviousSlot,
                Phase::Activating { rollback: true },
                vec![ReportState::Activating],
                false,
                true,
            ),
        ];
        for (installed, phase, reports, download, activate) in table {
            let (m, actions) = Machine::start(installed.clone(), t, now);
            assert_eq!(m.phase, phase, "{installed:?}");
            assert_eq!(states(&actions), reports, "{installed:?}");
            assert_eq!(actions.contains(&Action::Download), download);
            assert_eq!(actions.contains(&Action::Activate), activate);
        }
    }

    #[test]
    fn step_table() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(60);
        let at = |phase: Phase| Machine {
            phase,
            started: t0,
            timeout,
        };
        let before = t0 + Duration::from_secs(59);
        let after = t0 + Duration::from_secs(60);
        let no_space = Failure::NoSpace {
            dir: "/d".into(),
            needed: 10,
            free: 1,
        };
        let activating = Phase::Activating { rollback: false };
        let rollback = Phase::Activating { rollback: true };
        let active = Phase::Active {
            provider: "CPUExecutionProvider".into(),
        };
        // (from, event, now, to, reports, other actions)
        type Row = (Phase, Event, Instant, Phase, Vec<ReportState>, Vec<Action>);
        let table: Vec<Row> = vec![
            (
                Phase::Downloading,
                Event::Tick,
                before,
                Phase::Downloading,
                vec![],
                vec![],
            ),
            (
                Phase::Downloading,
                Event::Tick,
                after,
                Phase::Failed {
                    reason: Failure::TimedOut { seconds: 60 },
                },
                vec![ReportState::Failed],
                vec![Action::StopDownload],
            ),
            (
                Phase::Downloading,
                Event::Downloaded,
                before,
                activating.clone(),
                vec![ReportState::Activating],
                vec![Action::Activate],
            ),
            (
                Phase::Downloading,
                Event::Refused(no_space.clone()),
                before,
                Phase::Failed {
                    reason: no_space.clone(),
                },
                vec![ReportState::Failed],
                vec![],
            ),
            (
                activating.clone(),
                Event::Activated {
                    provider: "CPUExecutionProvider".into(),
                },
                after,
                active.clone(),
                vec![ReportState::Active],
                vec![],
            ),
            // Activation is bounded by the host; the deadline covers downloads.
            (
                activating.clone(),
                Event::Tick,
                after,
                activating.clone(),
                vec![],
                vec![],
            ),
            (
                activating.clone(),
                Event::ActivationFailed {
                    error: "probe".into(),
                    still_serving: Some(serving("1")),
                },
                before,
                Phase::RolledBack {
                    reason: "activation failed: probe; version 1 still serves".into(),
                },
                vec![ReportState::RolledBack],
                vec![],
            ),
            (
                activating.clone(),
                Event::ActivationFailed {
                    error: "probe".into(),
                    still_serving: None,
                },
                before,
                Phase::Failed {
                    reason: Failure::Activation("probe".into()),
                },
                vec![ReportState::Failed],
                vec![],
            ),
            (
                rollback.clone(),
                Event::Activated {
                    provider: "CPUExecutionProvider".into(),
                },
                before,
                Phase::RolledBack {
                    reason: "the previous version was assigned back".into(),
                },
                vec![ReportState::RolledBack],
                vec![],
            ),
            (
                rollback.clone(),
                Event::ActivationFailed {
                    error: "load".into(),
                    still_serving: Some(serving("2")),
                },
                before,
                Phase::Failed {
                    reason: Failure::Activation("load".into()),
                },
                vec![ReportState::Failed],
                vec![],
            ),
            (
                activating.clone(),
                Event::Refused(Failure::BadSignature("x".into())),
                before,
                Phase::Failed {
                    reason: Failure::BadSignature("x".into()),
                },
                vec![ReportState::Failed],
                vec![],
            ),
            (
                rollback.clone(),
                Event::SlotDamaged(Failure::Storage("gone".into())),
                before,
                Phase::Downloading,
                vec![ReportState::Downloading],
                vec![Action::Download],
            ),
            // Terminal states absorb everything.
            (
                active.clone(),
                Event::Tick,
                after,
                active.clone(),
                vec![],
                vec![],
            ),
            (
                active.clone(),
                Event::Refused(no_space.clone()),
                after,
                active.clone(),
                vec![],
                vec![],
            ),
            (
                Phase::Failed {
                    reason: no_space.clone(),
                },
                Event::Downloaded,
                before,
                Phase::Failed {
                    reason: no_space.clone(),
                },
                vec![],
                vec![],
            ),
        ];
        for (from, event, now, to, reports, others) in table {
            let what = format!("{from:?} + {event:?}");
            let (m, actions) = at(from).step(event, now);
            assert_eq!(m.phase, to, "{what}");
            assert_eq!(states(&actions), reports, "{what}");
            let rest: Vec<_> = actions
                .into_iter()
                .filter(|a| !matches!(a, Action::Report { .. }))
                .collect();
            assert_eq!(rest, others, "{what}");
        }
    }

    #[test]
    fn reports_carry_the_reason_and_provider() {
        let now = Instant::now();
        let (m, _) = Machine::start(Installed::Nowhere, Duration::from_secs(5), now);
        let (_, actions) = m.step(Event::Tick, now + Duration::from_secs(5));
        assert!(actions.contains(&Action::Report {
            state: ReportState::Failed,
            reason: "download timed out after 5s".into(),
            provider: String::new(),
        }));
        let (m, _) = Machine::start(Installed::StagedSlot, Duration::from_secs(5), now);
        let (_, actions) = m.step(
            Event::Activated {
                provider: "CUDAExecutionProvider".into(),
            },
            now,
        );
        assert_eq!(
            actions,
            vec![Action::Report {
                state: ReportState::Active,
                reason: String::new(),
                provider: "CUDAExecutionProvider".into()
            }]
        );
    }
}
