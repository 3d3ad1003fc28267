//! A few dedicated threads, each owning one `postgres::Client`, fed by a
//! channel. The `Tree` API is synchronous and is called from async tasks,
//! the blocking pool and current-thread test runtimes; the sync client
//! runs its own `block_on`, which panics when called on a tokio worker. So
//! no caller ever touches a client: it sends its operation here and blocks
//! on the reply, as it blocks on sled's I/O.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use postgres::error::Severity;

use crate::latency::{self, Latency};
use postgres::{Client, Statement};

use super::url::PostgresUrl;
use crate::StoreError;

/// Connections per store. Callers block while theirs runs, so this bounds
/// how many store calls run at once; each is a PostgreSQL backend process.
pub const POOL_SIZE: usize = 8;

/// How long a connection may sit unused before it is checked before use.
const IDLE_CHECK: Duration = Duration::from_secs(5);
const IDLE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// One pool thread's connection, made on first use and again after it broke.
pub struct Session {
    url: PostgresUrl,
    client: Option<Client>,
    /// When `client` last answered: one idle for long is checked before
    /// use, so that a write after a server restart meets a fresh
    /// connection instead of failing with an unknown outcome.
    last_used: Instant,
    /// Prepared statements of `client`, by their SQL.
    statements: HashMap<String, Statement>,
}

impl Session {
    fn new(url: PostgresUrl) -> Self {
        Self {
            url,
            client: None,
            last_used: Instant::now(),
            statements: HashMap::new(),
        }
    }

    /// The connection, made now if there is none (or it closed).
    pub fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.reset();
        }
        if self.last_used.elapsed() > IDLE_CHECK {
            let valid = self
                .client
                .as_mut()
                .is_some_and(|c| c.is_valid(IDLE_CHECK_TIMEOUT).is_ok());
            if !valid {
                self.reset();
            }
        }
        self.last_used = Instant::now();
        if self.client.is_none() {
            // With its causes (`{:#}`): the driver's own message for a
            // failed TLS handshake leaves out why it failed.
            let client = self.url.connect().map_err(|e| {
                StoreError::Unavailable(format!(
                    "connecting to {}: {:#}",
                    self.url,
                    anyhow::Error::from(e)
                ))
            })?;
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// The connection and `sql` prepared on it (once per connection).
    pub fn prepared(&mut self, sql: &str) -> Result<(&mut Client, Statement), StoreError> {
        self.client()?;
        let client = self.client.as_mut().expect("connected above");
        let statement = match self.statements.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = client.prepare(sql)?;
                self.statements.insert(sql.to_string(), s.clone());
                s
            }
        };
        Ok((client, statement))
    }

    fn reset(&mut self) {
        self.client = None;
        self.statements.clear();
    }
}

/// Whether `e` leaves the connection in doubt: anything but an error the
/// server answered within a session that goes on (a broken socket, a
/// closed connection, a timeout, or a FATAL such as the server's
/// shutdown or `pg_terminate_backend`).
fn connection_lost(e: &StoreError) -> bool {
    match e {
        StoreError::Postgres(e) => e.as_db_error().is_none_or(|db| {
            matches!(
                db.parsed_severity(),
                Some(Severity::Fatal | Severity::Panic)
            )
        }),
        StoreError::Unavailable(_) => true,
        _ => false,
    }
}

/// The server rolled the statement's transaction back because it lost a
/// deadlock or a serialization check: nothing of it was written, so running
/// it again is safe whatever the operation.
fn rolled_back_by_conflict(e: &StoreError) -> bool {
    use postgres::error::SqlState;
    match e {
        StoreError::Postgres(e) => e.code().is_some_and(|c| {
            *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        }),
        _ => false,
    }
}

/// Runs after a conflict the server rolled back; deadlocks are rare once
/// rows are locked in key order, so a few tries always suffice in practice.
const CONFLICT_RETRIES: u32 = 5;

type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// How long store calls took, by lane: waiting for a pool thread, running
/// on its connection, and in all as their caller saw it. The call less the
/// other two is the caller's own wake-up after the answer (its thread
/// waiting for a core). Statistics for `/metrics`, never decisions.
#[derive(Default)]
pub struct PoolStats {
    /// Index 0: normal; 1: urgent.
    lanes: [LaneStats; 2],
}

#[derive(Default)]
struct LaneStats {
    wait: Latency,
    run: Latency,
    call: Latency,
}

impl PoolStats {
    fn lane(&self, urgent: bool) -> &LaneStats {
        &self.lanes[usize::from(urgent)]
    }

    pub fn write(&self, out: &mut String) {
        type Pick = fn(&LaneStats) -> &Latency;
        let histograms: [(&str, &str, Pick); 3] = [
            (
                "edgeloop_store_wait_seconds",
                "How long PostgreSQL store calls waited for a pool connection, by lane.",
                |l| &l.wait,
            ),
            (
                "edgeloop_store_run_seconds",
                "How long PostgreSQL store calls ran on their connection (retries included), by lane.",
                |l| &l.run,
            ),
            (
                "edgeloop_store_call_seconds",
                "How long PostgreSQL store calls took as their callers saw them, by lane.",
                |l| &l.call,
            ),
        ];
        for (name, help, pick) in histograms {
            latency::write_header(out, name, help);
            for (lane, urgent) in [("normal", false), ("urgent", true)] {
                pick(self.lane(urgent)).write_series(out, name, &format!("lane=\"{lane}\""));
            }
        }
    }
}

/// Waits for a pool thread's answer: a PostgreSQL round trip, or a queue
/// behind eight of them. On a multi-thread runtime's worker a wait that
/// long stalls every task queued on that worker; on two cores a rollout's
/// store calls held both workers and heartbeats waited seconds behind them.
/// `block_in_place` hands the worker's queue to another thread for the
/// wait. A current-thread runtime has no other thread to hand it to (it
/// would panic), so there, and off any runtime, the wait is plain; on a
/// blocking-pool thread `block_in_place` just runs the wait.
fn wait_off_the_worker<R>(wait: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

thread_local! {
    static URGENT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with its store calls ahead of every call queued for a
/// PostgreSQL connection that was not made this way (sled has no queue;
/// there it changes nothing). For the calls whose latency is what callers
/// watch, heartbeats: during a rollout hundreds of status writes and
/// assignment reads can wait for the pool's eight connections, and a
/// heartbeat behind them waited as long. The flag is the calling thread's
/// and `f` is synchronous, so it covers exactly `f`'s own calls.
pub fn urgent<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            URGENT.with(|u| u.set(self.0));
        }
    }
    let _restore = Restore(URGENT.with(|u| u.replace(true)));
    f()
}

/// Jobs waiting for a connection, in two lanes: a pool thread takes the
/// oldest urgent job before any other.
#[derive(Default)]
struct Queue {
    lanes: Mutex<Lanes>,
    ready: Condvar,
}

#[derive(Default)]
struct Lanes {
    urgent: VecDeque<Job>,
    normal: VecDeque<Job>,
    closed: bool,
}

impl Queue {
    fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes> {
        // A poisoned lock still holds usable queues: pushes and pops do
        // not panic between their reads and writes.
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `false` once the pool is closed.
    fn push(&self, job: Job, urgent: bool) -> bool {
        let mut lanes = self.lanes();
        if lanes.closed {
            return false;
        }
        if urgent {
            lanes.urgent.push_back(job);
        } else {
            lanes.normal.push_back(job);
        }
        drop(lanes);
        self.ready.notify_one();
        true
    }

    /// The next job; `None` once the pool is closed and nothing is left.
    fn pop(&self) -> Option<Job> {
        let mut lanes = self.lanes();
        loop {
            if let Some(job) = lanes
                .urgent
                .pop_front()
                .or_else(|| lanes.normal.pop_front())
            {
                return Some(job);
            }
            if lanes.closed {
                return None;
            }
            lanes = self.ready.wait(lanes).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn close(&self) {
        self.lanes().closed = true;
        self.ready.notify_all();
    }
}

pub struct Pool {
    queue: Arc<Queue>,
    url: PostgresUrl,
    stats: Arc<PoolStats>,
}

/// The threads finish the queued jobs, then end.
impl Drop for Pool {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl Pool {
    /// Starts the threads; they connect on their first call and end when
    /// the pool is dropped.
    pub fn start(url: &PostgresUrl) -> Result<Self, StoreError> {
        let queue = Arc::new(Queue::default());
        for i in 0..POOL_SIZE {
            let jobs = queue.clone();
            let mut session = Session::new(url.clone());
            let started = std::thread::Builder::new()
                .name(format!("edgeloop-pg-{i}"))
                .spawn(move || {
                    while let Some(job) = jobs.pop() {
                        // A panic in one call must not shrink the pool: its
                        // caller sees the reply channel close ("gone"), and
                        // the connection, in an unknown state, is replaced.
                        let run = std::panic::AssertUnwindSafe(|| job(&mut session));
                        if std::panic::catch_unwind(run).is_err() {
                            session.reset();
                        }
                    }
                });
            if let Err(e) = started {
                queue.close();
                return Err(StoreError::Unavailable(format!(
                    "starting a store thread: {e}"
                )));
            }
        }
        Ok(Self {
            queue,
            url: url.clone(),
            stats: Arc::default(),
        })
    }

    pub fn stats(&self) -> &PoolStats {
        &self.stats
    }

    /// Runs `op` on a pool connection and waits for its answer; inside
    /// [`urgent`], ahead of the calls queued outside it.
    ///
    /// A connection that broke is dropped, and the next call reconnects.
    /// A `retry_safe` op (a read, or a write whose repeat is harmless)
    /// that failed because the connection broke is run once more on a new
    /// one; any other op returns the error: a compare-and-swap whose
    /// outcome is unknown must not be repeated and reported as lost.
    pub fn call<R: Send + 'static>(
        &self,
        retry_safe: bool,
        op: impl Fn(&mut Session) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (reply, answer) = mpsc::sync_channel(1);
        let urgent = URGENT.with(Cell::get);
        let queued = Instant::now();
        let stats = self.stats.clone();
        let job: Job = Box::new(move |session: &mut Session| {
            let started = Instant::now();
            stats.lane(urgent).wait.observe(started - queued);
            let mut result = op(session);
            let mut tries = 0;
            while tries < CONFLICT_RETRIES && result.as_ref().is_err_and(rolled_back_by_conflict) {
                tries += 1;
                // Spread the losers so they do not meet again at once.
                std::thread::sleep(Duration::from_millis(u64::from(tries) * 3));
                result = op(session);
            }
            if result.as_ref().is_err_and(connection_lost) {
                session.reset();
                if retry_safe {
                    result = op(session);
                    if result.as_ref().is_err_and(connection_lost) {
                        session.reset();
                    }
                }
            }
            stats.lane(urgent).run.observe(started.elapsed());
            // The caller may have gone (a cancelled task): nothing to do.
            let _ = reply.send(result);
        });
        if !self.queue.push(job, urgent) {
            return Err(StoreError::Unavailable(format!(
                "the store threads for {} are gone",
                self.url
            )));
        }
        let answer = wait_off_the_worker(|| answer.recv());
        self.stats.lane(urgent).call.observe(queued.elapsed());
        answer.map_err(|_| {
            StoreError::Unavailable(format!(
                "a store thread for {} failed during the call",
                self.url
            ))
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that records its name when run.
    fn job(name: &'static str, ran: &Arc<Mutex<Vec<&'static str>>>) -> Job {
        let ran = ran.clone();
        Box::new(move |_| ran.lock().unwrap().push(name))
    }

    #[test]
    fn urgent_jobs_go_first_each_lane_in_order_and_a_closed_queue_drains() {
        let q = Queue::default();
        let ran = Arc::new(Mutex::new(Vec::new()));
        assert!(q.push(job("n1", &ran), false));
        assert!(q.push(job("n2", &ran), false));
        assert!(q.push(job("u1", &ran), true));
        assert!(q.push(job("u2", &ran), true));
        q.close();
        assert!(!q.push(job("late", &ran), true), "closed: refused");
        let mut session = Session::new(PostgresUrl::parse("postgres://u@127.0.0.1:1/db").unwrap());
        while let Some(j) = q.pop() {
            j(&mut session);
        }
        assert_eq!(*ran.lock().unwrap(), ["u1", "u2", "n1", "n2"]);
    }

    #[test]
    fn urgent_marks_only_the_calls_inside_it_and_nests() {
        let now = || URGENT.with(Cell::get);
        assert!(!now());
        urgent(|| {
            assert!(now());
            urgent(|| assert!(now()));
            assert!(now(), "the inner scope restores the outer's flag");
        });
        assert!(!now());
        let caught = std::panic::catch_unwind(|| urgent(|| panic!("in the scope")));
        assert!(caught.is_err());
        assert!(!now(), "a panic inside does not leave the flag set");
    }

    /// A blocked pool thread takes a waiting urgent job before the normal
    /// ones queued earlier.
    #[test]
    fn a_pool_thread_waiting_for_jobs_takes_the_urgent_one_first() {
        let q = Arc::new(Queue::default());
        let ran = Arc::new(Mutex::new(Vec::new()));
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (took_tx, took_rx) = mpsc::channel::<()>();
        let worker = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut session =
                    Session::new(PostgresUrl::parse("postgres://u@127.0.0.1:1/db").unwrap());
                while let Some(j) = q.pop() {
                    took_tx.send(()).unwrap();
                    gate_rx.recv().unwrap();
                    j(&mut session);
                }
            })
        };
        for name in ["n1", "n2", "n3"] {
            q.push(job(name, &ran), false);
        }
        // The thread holds n1 at the gate; u1 arrives behind n2 and n3.
        took_rx.recv().unwrap();
        q.push(job("u1", &ran), true);
        for _ in 0..4 {
            gate_tx.send(()).unwrap();
        }
        q.close();
        worker.join().unwrap();
        let ran = ran.lock().unwrap();
        assert_eq!(ran.len(), 4);
        assert_eq!(ran[1], "u1", "{ran:?}");
    }
}
