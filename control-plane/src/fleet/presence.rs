//! Heartbeats' `last_seen` refreshes, written in batches. A heartbeat
//! whose only change is a stale `last_seen` (the common case: a member
//! with the same capabilities, every other beat) notes it here and answers
//! at once; [`run`] writes what was noted every [`FLUSH_EVERY`] in one
//! batched compare-and-swap per member kind (a few statements on
//! PostgreSQL instead of one round trip per heartbeat). A heartbeat that
//! changes the capabilities still writes at once ([`members::heartbeat`]).
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

use super::members::{self, Member, MemberKind};
use crate::error::Result;
use crate::store::Store;

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

/// Pure: see [`HeartbeatWrite`] and [`members::heartbeat_write_due`].
pub fn heartbeat_write(
    stored: &Member,
    capabilities: Option<&members::CapabilitiesRecord>,
    now: OffsetDateTime,
    offline_after: time::Duration,
) -> HeartbeatWrite {
    if capabilities.is_some_and(|c| *c != stored.capabilities) {
        HeartbeatWrite::Now
    } else if members::heartbeat_write_due(stored, capabilities, now, offline_after) {
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
    pub fn flush(&self, store: &Store) -> Result<usize> {
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
            let results = store.update_many_fenced(store.members(kind), None, &keys, |id, m| {
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
pub async fn run(store: Store, presence: std::sync::Arc<Presence>, shutdown: CancellationToken) {
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
mod tests {
    use super::*;
    use crate::fleet::members::tests::{at, member};

    #[test]
    fn a_heartbeat_batches_a_stale_last_seen_and_writes_new_capabilities_now() {
        use HeartbeatWrite as W;
        let window = time::Duration::seconds(30);
        let gpu = members::CapabilitiesRecord {
            execution_providers: vec!["CUDAExecutionProvider".into()],
            ..Default::default()
        };
        let same = members::CapabilitiesRecord::default();
        // (last seen, capabilities sent, now, want)
        let cases = [
            (Some(100), None, 110, W::Nothing),
            (Some(100), Some(&same), 114, W::Nothing),
            (Some(100), None, 115, W::Batched),
            (Some(100), Some(&same), 200, W::Batched),
            (None, None, 100, W::Batched),
            (Some(100), Some(&gpu), 101, W::Now),
            (Some(100), Some(&gpu), 200, W::Now),
        ];
        for (seen, caps, now, want) in cases {
            assert_eq!(
                heartbeat_write(&member(seen, false), caps, at(now), window),
                want,
                "{seen:?} {caps:?} {now}"
            );
        }
    }

    #[test]
    fn a_flush_moves_last_seen_forward_only_and_skips_revoked_and_unknown_members() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let devices = store.members(MemberKind::Device);
        let fresh = Member {
            id: "fresh".into(),
            ..member(Some(500), false)
        };
        let stale = Member {
            id: "stale".into(),
            ..member(Some(100), false)
        };
        let revoked = Member {
            id: "revoked".into(),
            ..member(Some(100), true)
        };
        for m in [&fresh, &stale, &revoked] {
            devices.insert(&m.id, m).unwrap();
        }
        let p = Presence::default();
        p.note(MemberKind::Device, "stale", at(200));
        p.note(MemberKind::Device, "stale", at(190)); // older: kept at 200
        p.note(MemberKind::Device, "fresh", at(300)); // older than stored
        p.note(MemberKind::Device, "revoked", at(200));
        p.note(MemberKind::Device, "gone", at(200));
        p.note(MemberKind::Cluster, "stale", at(200)); // no such cluster
        assert_eq!(p.pending(), 5);
        assert_eq!(p.flush(&store).unwrap(), 2, "stale and fresh");
        assert_eq!(p.pending(), 0);
        let seen = |id: &str| devices.get(id).unwrap().and_then(|m| m.last_seen);
        assert_eq!(seen("stale"), Some(at(200)));
        assert_eq!(seen("fresh"), Some(at(500)), "never backwards");
        assert_eq!(seen("revoked"), Some(at(100)), "a revoked member is left");
        assert!(devices.get("gone").unwrap().is_none(), "nothing created");
        assert!(store
            .members(MemberKind::Cluster)
            .get("stale")
            .unwrap()
            .is_none());
    }
}
