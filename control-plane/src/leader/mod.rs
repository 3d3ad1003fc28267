//! Background work that must run on one replica at a time (issue #17):
//! the rollout runner, the pipeline runner, the trigger task, the
//! compactor and the audit retention each run under a lease in the shared
//! store (`leases`, by task), taken and renewed with compare-and-swap.
//!
//! - A replica leads a task while it holds the task's lease, and for no
//!   longer than a local monotonic deadline set before each renewal
//!   ([`LEAD_FRACTION`] of the lease's time): a replica that stalls or
//!   loses the store stops before its lease can pass to another.
//! - Each change of hands raises the lease's fencing token
//!   ([`decide::Lease::token`]), and the new leader raises the task's
//!   fence (`fences`) to it before acting. A leader's writes of the
//!   records its task owns go through `Store::update_fenced`, which
//!   applies a write only while the fence still holds its token, in one
//!   atomic step: one still at work after its lease passed on writes
//!   nothing. (The rollout's deployment records and device assignments,
//!   the pipeline runner's pipeline records, the trigger task's state.)
//! - On one replica (sled: its data dir is its alone) the lease is always
//!   its own, and a restart takes it at once (`decide::next`).
//!
//! The decision is the pure [`decide::next`]; [`run`] is the thin task
//! that renews every [`RENEW_EVERY`].

pub mod decide;
mod trees;

pub use trees::Trees;

use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::Core;
use decide::{Lease, Me};
use edgeloop_errors::Result;

/// How long a lease holds without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// How often a replica renews (or tries to take) each lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(2);
/// The part of [`LEASE_TTL`] a replica leads for after starting a
/// renewal: the rest is the margin for clock skew between replicas.
pub const LEAD_FRACTION: f64 = 0.7;

/// The background tasks that run on one replica at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Task {
    Rollouts,
    Pipelines,
    Triggers,
    Compactor,
    AuditRetention,
}

impl Task {
    pub const ALL: [Task; 5] = [
        Task::Rollouts,
        Task::Pipelines,
        Task::Triggers,
        Task::Compactor,
        Task::AuditRetention,
    ];

    /// The lease's key.
    pub fn name(self) -> &'static str {
        match self {
            Task::Rollouts => "rollouts",
            Task::Pipelines => "pipelines",
            Task::Triggers => "triggers",
            Task::Compactor => "compactor",
            Task::AuditRetention => "audit-retention",
        }
    }
}

/// A lease this replica holds: its token, until when it may act on it.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: u64,
    until: Instant,
}

/// This replica's leadership of each [`Task`].
pub struct Leadership {
    me: Me,
    ttl: Duration,
    held: Mutex<[Option<Held>; Task::ALL.len()]>,
}

impl Leadership {
    /// `replica` names this replica across restarts; each process is a
    /// new incarnation.
    pub fn new(replica: String) -> Leadership {
        Leadership::with_ttl(replica, LEASE_TTL)
    }

    /// With another lease time (tests of expiry).
    pub fn with_ttl(replica: String, ttl: Duration) -> Leadership {
        Leadership {
            me: Me {
                replica,
                incarnation: rand::random(),
                ttl: time::Duration::try_from(ttl).unwrap_or(time::Duration::seconds(10)),
            },
            ttl,
            held: Mutex::new([None; Task::ALL.len()]),
        }
    }

    pub fn replica(&self) -> &str {
        &self.me.replica
    }

    /// The fencing token of `task` if this replica leads it now.
    pub fn token(&self, task: Task) -> Option<u64> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held[task as usize]
            .filter(|h| Instant::now() < h.until)
            .map(|h| h.token)
    }

    pub fn leads(&self, task: Task) -> bool {
        self.token(task).is_some()
    }

    /// What `task`'s writes carry while this replica leads it
    /// (`Store::update_fenced`); `None` when it does not.
    pub fn fence(&self, task: Task) -> Option<edgeloop_store::Fence> {
        self.token(task).map(|token| edgeloop_store::Fence {
            task: task.name(),
            token,
        })
    }

    /// One round: takes or renews every lease it can. Blocking (store
    /// reads and writes). Returns the tasks it leads after the round.
    pub fn round(&self, store: &Db, now: OffsetDateTime) -> Result<Vec<Task>> {
        let mut led = Vec::new();
        for task in Task::ALL {
            let started = Instant::now();
            let taken = store.leader.leases.update(task.name(), |cur| {
                decide::next(cur.as_ref(), &self.me, now).ok_or(())
            })?;
            if let Ok(Lease { token, .. }) = &taken {
                // The fence goes up before this replica acts with the new
                // token: from then on the last holder's fenced writes fail.
                if store.fences.get(task.name())? != Some(*token) {
                    let t = *token;
                    store
                        .fences
                        .update(task.name(), |cur| Ok::<_, ()>(cur.map_or(t, |c| c.max(t))))?
                        .ok();
                }
            }
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let before = held[task as usize].map(|h| h.token);
            held[task as usize] = match taken {
                Ok(Lease { token, .. }) => {
                    led.push(task);
                    Some(Held {
                        token,
                        until: started + self.ttl.mul_f64(LEAD_FRACTION),
                    })
                }
                Err(()) => None,
            };
            let after = held[task as usize].map(|h| h.token);
            if before != after {
                tracing::info!(task = task.name(), replica = %self.me.replica, token = ?after, "leadership changed");
            }
        }
        Ok(led)
    }

    /// Lets go of every lease (a clean shutdown), so another replica takes
    /// them at once instead of after they expire.
    pub fn release(&self, store: &Db, now: OffsetDateTime) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for task in Task::ALL {
            if held[task as usize].take().is_none() {
                continue;
            }
            let r = store.leader.leases.update(task.name(), |cur| match cur {
                Some(l) if l.holder == self.me.replica && l.incarnation == self.me.incarnation => {
                    Ok(Lease {
                        expires_at: now,
                        ..l
                    })
                }
                _ => Err(()),
            });
            if let Err(e) = r {
                tracing::warn!(task = task.name(), error = %e, "releasing a lease");
            }
        }
    }
}

/// The error of a fenced update that wrote nothing: the update's own, or,
/// when a newer leader's fence refused it, that this replica no longer
/// leads the task (it stops; the new leader does the work).
pub fn not_written(
    e: edgeloop_store::NotWritten<edgeloop_errors::Error>,
) -> edgeloop_errors::Error {
    match e {
        edgeloop_store::NotWritten::Refused(e) => e,
        edgeloop_store::NotWritten::FencedOut(fence) => {
            edgeloop_errors::Error::Unavailable(format!(
            "this replica no longer leads {} (token {}): a newer leader's fence refused the write",
            fence.task, fence.token
        ))
        }
    }
}

/// The store's key for the CA its fleet trusts.
const SHARED_CA_KEY: &str = "~ca-fingerprint";

/// On a shared store, every replica must present the same CA: members
/// pin it at enrollment, and one that fails over to a replica with
/// another CA cannot connect. The first replica records its CA's
/// fingerprint; a later one with another CA refuses to start, saying what
/// to do.
pub fn check_shared_ca(store: &Db, ca: edgeloop_models::Digest) -> anyhow::Result<()> {
    let mine = ca.to_string();
    let recorded = store
        .leader
        .replica_settings
        .update(SHARED_CA_KEY, |cur| {
            Ok::<_, ()>(cur.unwrap_or_else(|| mine.clone()))
        })?
        .unwrap_or_default();
    anyhow::ensure!(
        recorded == mine,
        "this replica's CA ({mine}) is not the CA the shared store's fleet trusts ({recorded}): \
         replicas share one CA; copy pki/ca.crt and pki/ca.key (with keys/ and admin.token) \
         from a running replica's data dir before starting this one"
    );
    Ok(())
}

/// This replica's name: `<data dir>/replica-id`, made once.
pub fn replica_id(data_dir: &Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let path = data_dir.join("replica-id");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let id = format!("r-{:016x}", rand::random::<u64>());
    edgeloop_models::fs::write_atomic(&path, id.as_bytes(), 0o644)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// Renews the leases every [`RENEW_EVERY`] until shutdown (the server
/// lets them go once its background tasks have stopped). Blocking: run on
/// a thread of its own, not the async runtime (the server's supervisor
/// does): a runtime saturated by a rollout to thousands of devices must
/// not stall the renewals and so pause the rollout itself.
pub fn renew_until(core: &Core, shutdown: &CancellationToken) {
    loop {
        let next = Instant::now() + RENEW_EVERY;
        while Instant::now() < next {
            if shutdown.is_cancelled() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Err(e) = core.leader.round(&core.store, core.now()) {
            tracing::warn!(error = %e, "renewing leases");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
