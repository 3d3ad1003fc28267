//! A few dedicated threads, each owning one `postgres::Client`, fed by a
//! channel. The `Tree` API is synchronous and is called from async tasks,
//! the blocking pool and current-thread test runtimes; the sync client
//! runs its own `block_on`, which panics when called on a tokio worker. So
//! no caller ever touches a client: it sends its operation here and blocks
//! on the reply, as it blocks on sled's I/O.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::error::Severity;
use postgres::{Client, Statement};

use super::url::PostgresUrl;
use crate::store::StoreError;

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

pub struct Pool {
    jobs: mpsc::Sender<Job>,
    url: PostgresUrl,
}

impl Pool {
    /// Starts the threads; they connect on their first call and end when
    /// the pool is dropped.
    pub fn start(url: &PostgresUrl) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..POOL_SIZE {
            let rx = rx.clone();
            let mut session = Session::new(url.clone());
            std::thread::Builder::new()
                .name(format!("edgeloop-pg-{i}"))
                .spawn(move || loop {
                    // The lock is held only to take one job; a poisoned
                    // lock still holds a usable receiver.
                    let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(job) = job else {
                        return; // the pool is gone
                    };
                    // A panic in one call must not shrink the pool: its
                    // caller sees the reply channel close ("gone"), and
                    // the connection, in an unknown state, is replaced.
                    let run = std::panic::AssertUnwindSafe(|| job(&mut session));
                    if std::panic::catch_unwind(run).is_err() {
                        session.reset();
                    }
                })
                .map_err(|e| StoreError::Unavailable(format!("starting a store thread: {e}")))?;
        }
        Ok(Self {
            jobs: tx,
            url: url.clone(),
        })
    }

    /// Runs `op` on a pool connection and waits for its answer.
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
        let job: Job = Box::new(move |session: &mut Session| {
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
            // The caller may have gone (a cancelled task): nothing to do.
            let _ = reply.send(result);
        });
        self.jobs.send(job).map_err(|_| {
            StoreError::Unavailable(format!("the store threads for {} are gone", self.url))
        })?;
        wait_off_the_worker(|| answer.recv()).map_err(|_| {
            StoreError::Unavailable(format!(
                "a store thread for {} failed during the call",
                self.url
            ))
        })?
    }
}
