//! When a failed attempt is restarted, and after how long: pure
//! decisions of the spec and the failures so far, tested with tables. The
//! job loop (`runner.rs`) acts on them.

use std::time::Duration;

use edgeloop_client_core::Backoff;

use crate::spec::JobSpec;

/// The delay before restart number `restart` (0-based): exponential from the
/// spec's backoff, capped at its maximum. Pure, so it is tested directly.
pub fn restart_delay(spec: &JobSpec, restart: u32) -> Duration {
    let base = Duration::from_secs(spec.restarts.backoff_seconds.into());
    let max = Duration::from_secs(spec.restarts.backoff_max_seconds.into());
    Backoff { base, max }.delay(restart, 1.0)
}

/// One failed attempt, as the restart decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedAttempt {
    pub exit_code: Option<i32>,
    /// A newer checkpoint was committed during the attempt.
    pub progressed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartDecision {
    Restart(Duration),
    GiveUp(String),
}

/// Whether to restart after the failures so far (oldest first), given
/// `restarts` already made. Besides the spec's limit, a job that fails twice
/// in a row with the same exit code and no new checkpoint in between is
/// failing deterministically (a bug, a missing file, a bad hyperparameter):
/// restarting it would only burn GPU hours until `max_restarts`. A kill by
/// a signal (no exit code) is the cluster's doing, so it never counts as
/// deterministic. Pure, so it is tested with tables.
pub fn decide_restart(
    spec: &JobSpec,
    restarts: u32,
    failures: &[FailedAttempt],
) -> RestartDecision {
    if let [.., a, b] = failures {
        if !a.progressed && !b.progressed && a.exit_code.is_some() && a.exit_code == b.exit_code {
            let code = b.exit_code.unwrap_or_default();
            return RestartDecision::GiveUp(format!(
                "failing deterministically: exit code {code} twice in a row with no new checkpoint, so not restarting again"
            ));
        }
    }
    if restarts >= spec.restarts.max_restarts {
        return RestartDecision::GiveUp(format!("failed after {restarts} restarts"));
    }
    RestartDecision::Restart(restart_delay(spec, restarts))
}

/// Whether to restart after a preemption, given `preemptions` so far
/// (this one included). A preempted job restarts after the spec's base
/// backoff: the next node is as good as any, and growing the pause would
/// only lose the time spot capacity is there. Pure.
pub fn decide_after_preemption(spec: &JobSpec, preemptions: u32) -> RestartDecision {
    let max = spec.restarts.max_preemptions;
    if preemptions > max {
        return RestartDecision::GiveUp(format!(
            "preempted {preemptions} times, more than restarts.max_preemptions ({max})"
        ));
    }
    RestartDecision::Restart(restart_delay(spec, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_restarts: u32) -> JobSpec {
        let mut s = JobSpec::from_json(br#"{"name": "t", "command": ["true"]}"#).unwrap();
        s.restarts.max_restarts = max_restarts;
        s.restarts.backoff_seconds = 2;
        s.restarts.backoff_max_seconds = 5;
        s
    }

    const fn f(exit_code: Option<i32>, progressed: bool) -> FailedAttempt {
        FailedAttempt {
            exit_code,
            progressed,
        }
    }

    enum Want {
        Restart(u64),
        GiveUp(&'static str),
    }

    #[test]
    fn preemptions_restart_after_the_base_backoff_up_to_their_own_limit() {
        let mut s = spec(0);
        s.restarts.max_preemptions = 2;
        // (preemptions so far, this one included) -> restart after 2 s, or give up
        for (n, restart) in [(1, true), (2, true), (3, false), (50, false)] {
            match decide_after_preemption(&s, n) {
                RestartDecision::Restart(d) => {
                    assert!(restart, "{n}");
                    assert_eq!(d, Duration::from_secs(2), "{n}");
                }
                RestartDecision::GiveUp(why) => {
                    assert!(!restart, "{n}");
                    assert!(why.contains("restarts.max_preemptions (2)"), "{why}");
                }
            }
        }
        // No preemption allowed at all.
        s.restarts.max_preemptions = 0;
        assert!(matches!(
            decide_after_preemption(&s, 1),
            RestartDecision::GiveUp(_)
        ));
    }

    #[test]
    fn restart_decisions() {
        use Want::{GiveUp, Restart};
        let s = spec(3);
        // (restarts so far, failures oldest first, expected)
        let table: &[(u32, &[FailedAttempt], Want)] = &[
            (0, &[f(Some(1), false)], Restart(2)),
            (1, &[f(Some(1), true), f(Some(1), true)], Restart(4)),
            // Backoff is capped at backoff_max_seconds.
            (
                2,
                &[f(Some(1), true), f(Some(2), false), f(Some(1), true)],
                Restart(5),
            ),
            // Same code twice with no new checkpoint: deterministic.
            (
                1,
                &[f(Some(1), false), f(Some(1), false)],
                GiveUp("deterministically: exit code 1"),
            ),
            // Different codes, or progress in between, or killed by a signal: not.
            (1, &[f(Some(1), false), f(Some(2), false)], Restart(4)),
            (1, &[f(Some(1), true), f(Some(1), false)], Restart(4)),
            (1, &[f(None, false), f(None, false)], Restart(4)),
            // Only the last two count.
            (
                2,
                &[f(Some(3), false), f(Some(3), true), f(Some(3), false)],
                Restart(5),
            ),
            // The limit.
            (3, &[f(Some(1), true)], GiveUp("failed after 3 restarts")),
        ];
        for (i, (restarts, failures, want)) in table.iter().enumerate() {
            let got = decide_restart(&s, *restarts, failures);
            let ok = match (want, &got) {
                (Restart(secs), RestartDecision::Restart(d)) => *d == Duration::from_secs(*secs),
                (GiveUp(needle), RestartDecision::GiveUp(why)) => why.contains(needle),
                _ => false,
            };
            assert!(ok, "case {i}: {got:?}");
        }
        let gave_up = |d: &RestartDecision, needle: &str| matches!(d, RestartDecision::GiveUp(w) if w.contains(needle));
        assert!(gave_up(
            &decide_restart(&spec(0), 0, &[f(Some(1), true)]),
            "after 0 restarts"
        ));
    }
}
