//! Heartbeats: what one writes, and when. A member authorised (see
//! [`super::members::authorize`]) hands its heartbeat to
//! [`Presence::heartbeat`], which decides from the record just read: a
//! fresh `last_seen` writes nothing; a stale one (the common case: a
//! member with the same capabilities, every other beat) is noted here and
//! answered at once, and [`run`] writes what was noted every
//! [`FLUSH_EVERY`] in one batched compare-and-swap per member kind (a few
//! statements on PostgreSQL instead of one round trip per heartbeat); a
//! heartbeat that changes the capabilities writes at once
//! ([`write_now`]).
//!
//! Measured at 10 000 agents (docs/fleet-scale.md): a heartbeat's store
//! calls waited little for a connection; their tail was the handler's
//! thread waiting for a core after each hand-off to a pool thread, so one
//! hand-off fewer per heartbeat, and a thousand fewer PostgreSQL writes a
//! second, is what moves it.
//!
//! A crash loses at most [`FLUSH_EVERY`] of refreshes, which an
//! online/offline window of three intervals does not notice; a graceful
//! stop writes them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::members::{CapabilitiesRecord, Member, MemberKind};
use crate::db::Db;
use edgeloop_errors::{Error, Result};

/// How often noted refreshes are written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// What a heartbeat writes, decided from the record it was authorised by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatWrite {
    /// `last_seen` is fresh and nothing changed.
    Nothing,
    /// Only `last_seen` is due: noted, written with the next batch.
    Batched,
    /// The capabilities changed: written now, with `last_seen`.
    Now,
}

/// Whether a heartbeat must write the member record: when its
/// capabilities changed, or its `last_seen` is half of `offline_after`
/// old (an interval and a half, at three intervals to offline). Pure.
/// The others write nothing, which halves the writes of a fleet
/// heartbeating every interval (each one a round trip on PostgreSQL),
/// while a live member's `last_seen` stays under 2.5 intervals old, inside
/// the window that [`super::members::member_status`] allows before it says offline.
pub fn heartbeat_write_due(
    stored: &Member,
    capabilities: Option<&CapabilitiesRecord>,
    now: OffsetDateTime,
    offline_after: time::Duration,
) -> bool {
    let stale = match stored.last_seen {
        None => true,
        Some(seen) => now - seen >= offline_after / 2,
    };
    stale || capabilities.is_some_and(|c| *c != stored.capabilities)
}

/// Writes a heartbeat of `member`, as the caller has just read it: when
/// [`heartbeat_write_due`] says so, `last_seen` and the capabilities are
/// written, still refused for a member revoked meanwhile.
pub fn write_now(
    store: &Db,
    member: &Member,
    capabilities: Option<CapabilitiesRecord>,
    now: OffsetDateTime,
    offline_after: time::Duration,
) -> Result<()> {
    if !heartbeat_write_due(member, capabilities.as_ref(), now, offline_after) {
        return Ok(());
    }
    let (kind, id) = (member.kind, member.id.as_str());
    store
        .fleet
        .members(kind)
        .update_from(id, member, |m| match m {
            Some(m) if m.revoked_at.is_none() => Ok(Member {
                last_seen: Some(now),
                capabilities: capabilities.clone().unwrap_or(m.capabilities.clone()),
                ..m
            }),
            Some(_) => Err(Error::PermissionDenied(format!(
                "{} has been revoked",
                kind.identity(id)
            ))),
            None => Err(Error::not_found(kind.as_str(), id)),
        })??;
    Ok(())
}

/// Pure: see [`HeartbeatWrite`] and [`heartbeat_write_due`].
pub fn heartbeat_write(
    stored: &Member,
    capabilities: Option<&CapabilitiesRecord>,
    now: OffsetDateTime,
    offline_after: time::Duration,
) -> HeartbeatWrite {
    if capabilities.is_some_and(|c| *c != stored.capabilities) {
        HeartbeatWrite::Now
    } else if heartbeat_write_due(stored, capabilities, now, offline_after) {
        HeartbeatWrite::Batched
    } else {
        HeartbeatWrite::Nothing
    }
}

/// Refreshes noted and not yet written: the latest time per member.
#[derive(Debug, Default)]
pub struct Presence {
    pending: Mutex<HashMap<(MemberKind, String), OffsetDateTime>>,
}

impl Presence {
    /// Records a heartbeat of `member`, as authorisation just read it:
    /// nothing, a refresh noted for the next batch, or a write now (see
    /// [`heartbeat_write`]). What it did.
    pub fn heartbeat(
        &self,
        store: &Db,
        member: &Member,
        capabilities: Option<CapabilitiesRecord>,
        now: OffsetDateTime,
        offline_after: time::Duration,
    ) -> Result<HeartbeatWrite> {
        let write = heartbeat_write(member, capabilities.as_ref(), now, offline_after);
        match write {
            HeartbeatWrite::Nothing => {}
            // One store call fewer for most heartbeats.
            HeartbeatWrite::Batched => self.note(member.kind, &member.id, now),
            HeartbeatWrite::Now => write_now(store, member, capabilities, now, offline_after)?,
        }
        Ok(write)
    }

    pub fn note(&self, kind: MemberKind, id: &str, at: OffsetDateTime) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let seen = pending.entry((kind, id.to_string())).or_insert(at);
        *seen = (*seen).max(at);
    }

    /// How many refreshes wait to be written.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Writes every noted refresh: `last_seen` moves forward only, and a
    /// member revoked or removed meanwhile is left as it is. How many
    /// records were written. On a store error the refreshes are noted
    /// again for the next flush.
    pub fn flush(&self, store: &Db) -> Result<usize> {
        let taken = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut written = 0;
        for kind in [MemberKind::Device, MemberKind::Cluster] {
            let batch: Vec<(&str, OffsetDateTime)> = taken
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, id), at)| (id.as_str(), *at))
                .collect();
            if batch.is_empty() {
                continue;
            }
            let at: HashMap<&str, OffsetDateTime> = batch.iter().copied().collect();
            let keys: Vec<&str> = batch.iter().map(|(id, _)| *id).collect();
            let results =
                store.update_many_fenced(store.fleet.members(kind), None, &keys, |id, m| {
                    let seen = at.get(id).copied();
                    match (m, seen) {
                        (Some(m), Some(seen)) if m.revoked_at.is_none() => Ok(Member {
                            last_seen: m.last_seen.max(Some(seen)),
                            ..m
                        }),
                        _ => Err(()),
                    }
                });
            match results {
                Ok(results) => written += results.iter().filter(|r| r.is_ok()).count(),
                Err(e) => {
                    for (id, seen) in batch {
                        self.note(kind, id, seen);
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(written)
    }
}

/// Flushes `presence` every [`FLUSH_EVERY`] until `shutdown`, then once more.
pub async fn run(store: Db, presence: std::sync::Arc<Presence>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = shutdown.cancelled() => true,
        };
        if presence.pending() > 0 {
            let (s, p) = (store.clone(), presence.clone());
            match tokio::task::spawn_blocking(move || p.flush(&s)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "writing heartbeats' last_seen"),
                Err(e) => tracing::warn!(error = %e, "the last_seen writer panicked"),
            }
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
