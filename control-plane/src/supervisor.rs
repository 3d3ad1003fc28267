//! The control plane's background tasks (rollouts, pipelines, triggers,
//! wake-ups, retention, the `last_seen` writer, the lease and relay
//! threads...) run under one supervisor. A task that panics, or returns
//! before shutdown, would otherwise stop until the process restarts: a
//! rollout that no longer advances, heartbeats whose `last_seen` is never
//! written. The supervisor logs the exit with the task's name, counts it
//! (`edgeloop_task_restarts_total{task="..."}` on `/metrics`), and starts
//! the task again after a backoff ([`after_exit`]) that doubles with each
//! failure in a row, is capped, and starts over once a run lasted
//! [`Backoff::healthy_after`]. At shutdown it stops restarting and waits
//! for the task's own graceful end.
//!
//! A task keeps nothing across restarts but what it is given again: each
//! start calls the task's factory afresh.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long to wait before starting a task again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// After the first failure in a row.
    pub initial: Duration,
    /// The cap: doubling stops here.
    pub max: Duration,
    /// A run at least this long counts as healthy: the next failure
    /// starts the doubling over.
    pub healthy_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            healthy_after: Duration::from_secs(300),
        }
    }
}

/// A task's record of failures, for [`after_exit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// When the run that just ended started.
    pub started: Instant,
    /// Failures in a row before this run.
    pub failures: u32,
}

/// The wait before the next start of a task whose run (`attempt`) ended
/// unexpectedly at `now`, and the failures in a row to carry to that
/// start. Pure: `initial · 2^failures`, capped at `max`; a run that lasted
/// `healthy_after` resets the count first.
pub fn after_exit(policy: &Backoff, attempt: Attempt, now: Instant) -> (Duration, u32) {
    let healthy = now.saturating_duration_since(attempt.started) >= policy.healthy_after;
    let failures = if healthy { 0 } else { attempt.failures };
    let delay = policy
        .initial
        .saturating_mul(2u32.saturating_pow(failures))
        .min(policy.max);
    (delay, failures.saturating_add(1))
}

/// Restarts per task since the process started, for `/metrics`.
#[derive(Debug, Default)]
pub struct Restarts(Mutex<BTreeMap<&'static str, u64>>);

impl Restarts {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<&'static str, u64>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Makes the task appear at 0, so a rate over the counter starts at
    /// its first restart.
    fn register(&self, task: &'static str) {
        self.with(|m| {
            m.entry(task).or_default();
        });
    }

    fn count(&self, task: &'static str) {
        self.with(|m| *m.entry(task).or_default() += 1);
    }

    /// How often `task` was restarted.
    #[cfg(test)]
    pub fn get(&self, task: &str) -> u64 {
        self.with(|m| m.get(task).copied().unwrap_or(0))
    }

    /// Appends `edgeloop_task_restarts_total` to `/metrics` text.
    pub fn write_metrics(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP edgeloop_task_restarts_total Background tasks restarted after a panic or an unexpected return, by task.\n\
             # TYPE edgeloop_task_restarts_total counter"
        );
        self.with(|m| {
            for (task, n) in m.iter() {
                let _ = writeln!(out, "edgeloop_task_restarts_total{{task=\"{task}\"}} {n}");
            }
        });
    }
}

/// How one run of a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exit {
    Returned,
    Panicked(String),
    /// It could not be started (a thread the system refused).
    NotStarted(String),
}

type Run = Pin<Box<dyn Future<Output = Exit> + Send>>;

/// Starts tasks under supervision; see the module's documentation.
#[derive(Debug, Clone)]
pub struct Supervisor {
    restarts: Arc<Restarts>,
    shutdown: CancellationToken,
    policy: Backoff,
}

impl Supervisor {
    /// Tasks that stop at `shutdown`, their restarts counted in `restarts`.
    pub fn new(restarts: Arc<Restarts>, shutdown: CancellationToken, policy: Backoff) -> Self {
        Self {
            restarts,
            shutdown,
            policy,
        }
    }

    /// Runs the future `start` makes on the runtime, and a new one after
    /// each unexpected end.
    pub fn spawn<F, Fut>(&self, task: &'static str, mut start: F) -> Supervised
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.supervise(task, move || {
            let run = AbortOnDrop(tokio::spawn(start()));
            Box::pin(async move {
                match run.join().await {
                    Ok(()) => Exit::Returned,
                    Err(e) if e.is_panic() => Exit::Panicked(panic_message(e.into_panic())),
                    // Only the supervisor aborts a run, by being dropped.
                    Err(_) => Exit::Returned,
                }
            })
        })
    }

    /// Runs `run` on a thread of its own named `task` (work that must not
    /// wait for a saturated runtime, like the lease renewals), and again
    /// on a new thread after each unexpected end.
    pub fn spawn_thread<F>(&self, task: &'static str, run: F) -> Supervised
    where
        F: Fn() + Send + Sync + 'static,
    {
        let run = Arc::new(run);
        self.supervise(task, move || {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let run = run.clone();
            let started = std::thread::Builder::new()
                .name(task.into())
                .spawn(move || {
                    let ended = std::panic::catch_unwind(AssertUnwindSafe(|| run()));
                    let _ = tx.send(ended.map_err(panic_message));
                });
            match started {
                Ok(_) => Box::pin(async move {
                    match rx.await {
                        Ok(Ok(())) => Exit::Returned,
                        Ok(Err(why)) => Exit::Panicked(why),
                        Err(_) => Exit::Panicked("the thread ended without a word".into()),
                    }
                }) as Run,
                Err(e) => Box::pin(std::future::ready(Exit::NotStarted(e.to_string()))),
            }
        })
    }

    fn supervise(
        &self,
        task: &'static str,
        start: impl FnMut() -> Run + Send + 'static,
    ) -> Supervised {
        self.restarts.register(task);
        let handle = tokio::spawn(supervise(
            task,
            self.restarts.clone(),
            self.policy,
            self.shutdown.clone(),
            start,
        ));
        Supervised { task, handle }
    }
}

async fn supervise(
    task: &'static str,
    restarts: Arc<Restarts>,
    policy: Backoff,
    shutdown: CancellationToken,
    mut start: impl FnMut() -> Run,
) {
    let mut failures = 0;
    loop {
        let started = Instant::now();
        let exit = start().await;
        if shutdown.is_cancelled() {
            if let Exit::Panicked(why) = exit {
                tracing::error!(task, panic = %why, "background task panicked while stopping");
            }
            return;
        }
        match &exit {
            Exit::Returned => tracing::error!(task, "background task returned before shutdown"),
            Exit::Panicked(why) => tracing::error!(task, panic = %why, "background task panicked"),
            Exit::NotStarted(why) => {
                tracing::error!(task, error = %why, "background task could not start")
            }
        }
        restarts.count(task);
        let (delay, next) = after_exit(&policy, Attempt { started, failures }, Instant::now());
        failures = next;
        tracing::warn!(task, ?delay, failures, "restarting the background task");
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// A supervised task: its supervisor ends when the task has ended after
/// shutdown.
#[derive(Debug)]
pub struct Supervised {
    task: &'static str,
    handle: JoinHandle<()>,
}

impl Supervised {
    /// Waits for the task's end after shutdown.
    pub async fn join(self) {
        if let Err(e) = self.handle.await {
            tracing::warn!(task = self.task, error = %e, "task supervisor ended abnormally");
        }
    }

    /// [`Supervised::join`] for at most `limit`; past it the task is
    /// aborted. Whether it ended in time.
    pub async fn join_within(mut self, limit: Duration) -> bool {
        match tokio::time::timeout(limit, &mut self.handle).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(task = self.task, error = %e, "task supervisor ended abnormally");
                true
            }
            Err(_) => {
                // Dropping the supervisor's future aborts the run it awaits.
                self.handle.abort();
                false
            }
        }
    }
}

/// A run of a task, aborted if its supervisor is dropped (aborted itself).
struct AbortOnDrop(JoinHandle<()>);

impl AbortOnDrop {
    async fn join(mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests;
