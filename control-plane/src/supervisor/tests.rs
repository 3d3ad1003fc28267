use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn the_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_run() {
    let policy = Backoff {
        initial: S(1),
        max: S(60),
        healthy_after: S(300),
    };
    let t0 = Instant::now();
    // (failures before, run lasted, wait, failures after)
    let cases = [
        (0, 0, 1, 1),
        (1, 0, 2, 2),
        (2, 10, 4, 3),
        (5, 299, 32, 6),
        (6, 0, 60, 7), // 64 s, capped
        (40, 0, 60, 41),
        (u32::MAX, 0, 60, u32::MAX), // no overflow
        (7, 300, 1, 1),              // healthy: over again
        (7, 10_000, 1, 1),
    ];
    for (failures, lasted, wait, after) in cases {
        let attempt = Attempt {
            started: t0,
            failures,
        };
        assert_eq!(
            after_exit(&policy, attempt, t0 + S(lasted)),
            (S(wait), after),
            "{failures} failures, ran {lasted} s"
        );
    }
    // A clock that reads earlier than the start is no healthy run.
    let attempt = Attempt {
        started: t0 + S(10),
        failures: 2,
    };
    assert_eq!(after_exit(&policy, attempt, t0), (S(4), 3));
}

fn quick() -> Backoff {
    Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(5),
        healthy_after: S(60),
    }
}

async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_task_that_panics_or_returns_is_restarted_and_counted() {
    let restarts = Arc::new(Restarts::default());
    let shutdown = CancellationToken::new();
    let supervisor = Supervisor::new(restarts.clone(), shutdown.clone(), quick());
    let runs = Arc::new(AtomicU32::new(0));
    let task = supervisor.spawn("flaky", {
        let (runs, shutdown) = (runs.clone(), shutdown.clone());
        move || {
            let (runs, shutdown) = (runs.clone(), shutdown.clone());
            async move {
                match runs.fetch_add(1, Ordering::SeqCst) {
                    0 => panic!("the first run fails"),
                    1 => {} // the second returns early
                    _ => shutdown.cancelled().await,
                }
            }
        }
    });
    until("the third run", || runs.load(Ordering::SeqCst) == 3).await;
    assert_eq!(restarts.get("flaky"), 2);
    let mut metrics = String::new();
    restarts.write_metrics(&mut metrics);
    assert!(
        metrics.contains("edgeloop_task_restarts_total{task=\"flaky\"} 2"),
        "{metrics}"
    );
    shutdown.cancel();
    tokio::time::timeout(S(5), task.join()).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "not started again after shutdown"
    );
    assert_eq!(restarts.get("flaky"), 2);
}

#[tokio::test]
async fn a_thread_that_panics_is_restarted_on_a_new_thread() {
    let restarts = Arc::new(Restarts::default());
    let shutdown = CancellationToken::new();
    let supervisor = Supervisor::new(restarts.clone(), shutdown.clone(), quick());
    let runs = Arc::new(AtomicU32::new(0));
    let task = supervisor.spawn_thread("leases-test", {
        let (runs, shutdown) = (runs.clone(), shutdown.clone());
        move || {
            assert_eq!(std::thread::current().name(), Some("leases-test"));
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("the first run fails");
            }
            while !shutdown.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    until("the second run", || runs.load(Ordering::SeqCst) == 2).await;
    assert_eq!(restarts.get("leases-test"), 1);
    shutdown.cancel();
    tokio::time::timeout(S(5), task.join()).await.unwrap();
}

#[tokio::test]
async fn a_task_is_listed_at_zero_and_one_outlasting_its_limit_is_aborted() {
    let restarts = Arc::new(Restarts::default());
    let shutdown = CancellationToken::new();
    let supervisor = Supervisor::new(restarts.clone(), shutdown.clone(), quick());
    let dropped = Arc::new(AtomicU32::new(0));
    struct Guard(Arc<AtomicU32>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let task = supervisor.spawn("stubborn", {
        let dropped = dropped.clone();
        move || {
            let guard = Guard(dropped.clone());
            async move {
                let _guard = guard;
                // Ignores the shutdown, like a long pipeline step.
                std::future::pending::<()>().await;
            }
        }
    });
    let mut metrics = String::new();
    restarts.write_metrics(&mut metrics);
    assert!(metrics.contains("edgeloop_task_restarts_total{task=\"stubborn\"} 0"));
    shutdown.cancel();
    assert!(!task.join_within(Duration::from_millis(50)).await);
    until("the run's abort", || dropped.load(Ordering::SeqCst) == 1).await;
    assert_eq!(restarts.get("stubborn"), 0);
}
