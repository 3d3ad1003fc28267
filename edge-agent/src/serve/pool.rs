//! One model version's workers: a thread per ONNX Runtime session
//! (`ModelSession::run` takes `&mut self`, and a run blocks its thread for
//! the whole inference), all fed by one bounded queue that the dynamic
//! batcher drains.
//!
//! Dropping the [`Pool`] closes the queue; the workers still run whatever
//! was queued before, then exit. Requests hold the pool (through their
//! version) until they are answered, so a swap or unload never strands one.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use edgeloop_models::runtime::ModelSession;
use edgeloop_models::tensor::Tensor;
use tokio::sync::oneshot;

use super::batch::{concat, split, BatchKey};
use super::metrics::{QueueDepth, VersionMetrics};
use super::policy::{decide, BatchPolicy, Flush};

pub type Named = Vec<(String, Tensor)>;

/// One request, its inputs in the model's input order.
pub struct Job {
    pub inputs: Named,
    pub key: BatchKey,
    pub rows: usize,
    pub enqueued: Instant,
    /// False for health probes, which stay out of the batch-size metric.
    pub counted: bool,
    pub reply: oneshot::Sender<JobResult>,
}

/// What comes back: the inputs (for the observer), all outputs in model
/// order or why the run failed, and how long the run took.
pub struct JobResult {
    pub inputs: Named,
    pub outputs: Result<Named, String>,
    pub run_time: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    Full,
    Closed,
}

struct State {
    queue: VecDeque<Job>,
    /// Workers running a batch now (the batcher waits only while one is).
    busy: usize,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    policy: BatchPolicy,
    capacity: usize,
    depth: QueueDepth,
    metrics: Arc<VersionMetrics>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A worker that panicked holds no invariant over the queue worth dying for.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct Pool {
    shared: Arc<Shared>,
}

pub struct PoolOptions {
    /// Thread names are `{name}-{i}`.
    pub name: String,
    pub policy: BatchPolicy,
    pub capacity: usize,
    pub depth: QueueDepth,
    pub metrics: Arc<VersionMetrics>,
}

impl Pool {
    /// Starts one worker per session; each first runs `warm_up` (the first
    /// run of a session allocates and optimises, so it must not be a
    /// client's). Blocks until all have warmed up; any failure stops them
    /// all and is returned.
    pub fn start(
        sessions: Vec<ModelSession>,
        warm_up: Arc<Named>,
        options: PoolOptions,
    ) -> Result<Pool, String> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(options.capacity.min(4096)),
                busy: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            policy: options.policy,
            capacity: options.capacity,
            depth: options.depth,
            metrics: options.metrics,
        });
        let pool = Pool {
            shared: Arc::clone(&shared),
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let workers = sessions.len();
        for (i, session) in sessions.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            let ready = ready_tx.clone();
            let warm_up = Arc::clone(&warm_up);
            std::thread::Builder::new()
                .name(format!("{}-{i}", options.name))
                .spawn(move || work(shared, session, &warm_up, ready))
                .map_err(|e| format!("starting a worker thread: {e}"))?;
        }
        drop(ready_tx);
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(format!(
                        "warm-up failed (on the health probe's inputs, else on zeros with every \
                         symbolic dimension 1: give a model with dynamic sizes a probe): {e}"
                    ))
                }
                Err(_) => return Err("a worker died during warm-up".to_string()),
            }
        }
        Ok(pool)
    }

    /// Queues a job without blocking; a full queue refuses it (and hands
    /// it back, so its inputs can still be observed).
    pub fn submit(&self, job: Job) -> Result<(), (Rejected, Job)> {
        let mut state = lock(&self.shared.state);
        if state.closed {
            return Err((Rejected::Closed, job));
        }
        if state.queue.len() >= self.shared.capacity {
            return Err((Rejected::Full, job));
        }
        state.queue.push_back(job);
        drop(state);
        self.shared.depth.fetch_add(1, Ordering::Relaxed);
        self.shared.wake.notify_one();
        Ok(())
    }

    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.wake.notify_all();
    }
}

fn work(
    shared: Arc<Shared>,
    mut session: ModelSession,
    warm_up: &Named,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let refs: Vec<(&str, &Tensor)> = warm_up.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let warmed = session.run(&refs).map(drop).map_err(|e| e.to_string());
    let failed = warmed.is_err();
    let _ = ready.send(warmed);
    drop(ready);
    if failed {
        return;
    }
    while let Some(jobs) = next_batch(&shared) {
        let n = i64::try_from(jobs.len()).unwrap_or(i64::MAX);
        shared.depth.fetch_sub(n, Ordering::Relaxed);
        // A panic inside ONNX Runtime's bindings must not take the worker
        // (and with it a share of the model's capacity) down; the panicking
        // batch's callers see their reply dropped and answer 500.
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_jobs(&mut session, jobs, &shared.metrics);
        }));
        if outcome.is_err() {
            tracing::error!("a model run panicked; its requests failed");
        }
        lock(&shared.state).busy -= 1;
    }
}

/// Waits until the batching policy says run, and takes that batch; `None`
/// once the pool is closed and drained.
fn next_batch(shared: &Shared) -> Option<Vec<Job>> {
    let mut state = lock(&shared.state);
    loop {
        let now = Instant::now();
        let oldest = state.queue.front().map_or(now, |j| j.enqueued);
        let rows = state.queue.iter().map(|j| j.rows);
        match decide(&shared.policy, rows, oldest, state.busy, state.closed, now) {
            Flush::Idle if state.closed => return None,
            Flush::Idle => {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            Flush::WaitUntil(deadline) => {
                state = shared
                    .wake
                    .wait_timeout(state, deadline.saturating_duration_since(now))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            Flush::Now(n) => {
                let jobs: Vec<Job> = state.queue.drain(..n).collect();
                state.busy += 1;
                if !state.queue.is_empty() {
                    // More than this batch was queued: another worker may start on it.
                    shared.wake.notify_one();
                }
                return Some(jobs);
            }
        }
    }
}

/// Runs a drained batch: requests that agree on their non-batch dims go
/// through the model together, the rest one by one.
fn run_jobs(session: &mut ModelSession, jobs: Vec<Job>, metrics: &VersionMetrics) {
    // A client that went away no longer needs its answer.
    let jobs = jobs.into_iter().filter(|j| !j.reply.is_closed());
    let mut groups: Vec<Vec<Job>> = Vec::new();
    for job in jobs {
        let group = job
            .key
            .as_ref()
            .and_then(|key| groups.iter_mut().find(|g| g[0].key.as_ref() == Some(key)));
        match group {
            Some(group) => group.push(job),
            None => groups.push(vec![job]),
        }
    }
    for group in groups {
        let counted = group.iter().filter(|j| j.counted).count();
        if counted > 0 {
            metrics.batch(counted);
        }
        if group.len() == 1 {
            for job in group {
                run_one(session, job);
            }
        } else {
            run_together(session, group);
        }
    }
}

fn run_one(session: &mut ModelSession, job: Job) {
    let started = Instant::now();
    let refs: Vec<(&str, &Tensor)> = job.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let outputs = session.run(&refs).map_err(|e| e.to_string());
    let run_time = started.elapsed();
    let _ = job.reply.send(JobResult {
        inputs: job.inputs,
        outputs,
        run_time,
    });
}

/// One run for the whole group, outputs split back by rows. Anything that
/// does not fit (or a failed run, which may be one request's fault) falls
/// back to running each request alone, so batching never fails a request
/// that would have succeeded on its own.
fn run_together(session: &mut ModelSession, group: Vec<Job>) {
    let started = Instant::now();
    let rows: Vec<usize> = group.iter().map(|j| j.rows).collect();
    let joined: Option<Named> = (0..group[0].inputs.len())
        .map(|i| {
            let parts: Vec<&Tensor> = group.iter().map(|j| &j.inputs[i].1).collect();
            concat(&parts).map(|t| (group[0].inputs[i].0.clone(), t))
        })
        .collect();
    let pieces = joined.and_then(|joined| {
        let refs: Vec<(&str, &Tensor)> = joined.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let outputs = session.run(&refs).ok()?;
        // pieces[o][j]: output o's slice for job j.
        let pieces = outputs
            .iter()
            .map(|(_, t)| split(t, &rows))
            .collect::<Option<Vec<Vec<Tensor>>>>()?;
        let names: Vec<String> = outputs.into_iter().map(|(n, _)| n).collect();
        Some((names, pieces))
    });
    let Some((names, pieces)) = pieces else {
        for job in group {
            run_one(session, job);
        }
        return;
    };
    let run_time = started.elapsed();
    let mut columns: Vec<std::vec::IntoIter<Tensor>> =
        pieces.into_iter().map(Vec::into_iter).collect();
    for job in group {
        let outputs: Named = names
            .iter()
            .zip(columns.iter_mut())
            .filter_map(|(name, column)| column.next().map(|t| (name.clone(), t)))
            .collect();
        let _ = job.reply.send(JobResult {
            inputs: job.inputs,
            outputs: Ok(outputs),
            run_time,
        });
    }
}
