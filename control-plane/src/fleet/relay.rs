//! Fleet events across replicas (issue #17): a device's watch stream is on
//! one replica, and the assignment that should wake it may be written on
//! another. Each replica appends the events it publishes to a log in the
//! shared store (`fleet_events`, keyed by the store's sequence), and tails
//! the log every [`POLL`], publishing the other replicas' events to its
//! own streams: a wake-up crosses replicas within about [`POLL`].
//!
//! Sequence numbers are taken before the write commits, so a reader may
//! see a later number before an earlier one lands. Each poll therefore
//! reads again from where the reader stood [`LAG`] ago, by its own clock,
//! and skips what it has already seen: a write that takes longer than
//! [`LAG`] to commit is the only one missed, and then the device's next
//! heartbeat or watch resync picks the change up.
//!
//! On one replica (sled) nothing is logged: there is no one to tell.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::members::MemberKind;
use super::FleetEvent;
use crate::db::Db;
use edgeloop_errors::Result;

/// How often a replica reads the other replicas' events.
pub const POLL: Duration = Duration::from_millis(250);
/// How long a write may take to commit and still be relayed.
pub const LAG: Duration = Duration::from_secs(3);
/// Entries older than this (by sequence age at pruning) are dropped.
pub const KEEP: Duration = Duration::from_secs(60);

/// One logged event, with the replica that published it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relayed {
    pub replica: String,
    pub event: LoggedEvent,
}

/// [`FleetEvent`] as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LoggedEvent {
    AssignmentsChanged { device: String },
    Revoked { member: MemberKind, id: String },
    JobChanged { job: String },
    BenchmarkQueued { device: String },
}

impl From<&FleetEvent> for LoggedEvent {
    fn from(e: &FleetEvent) -> Self {
        match e.clone() {
            FleetEvent::AssignmentsChanged { device } => LoggedEvent::AssignmentsChanged { device },
            FleetEvent::Revoked { kind, id } => LoggedEvent::Revoked { member: kind, id },
            FleetEvent::JobChanged { job } => LoggedEvent::JobChanged { job },
            FleetEvent::BenchmarkQueued { device } => LoggedEvent::BenchmarkQueued { device },
        }
    }
}

impl From<LoggedEvent> for FleetEvent {
    fn from(e: LoggedEvent) -> Self {
        match e {
            LoggedEvent::AssignmentsChanged { device } => FleetEvent::AssignmentsChanged { device },
            LoggedEvent::Revoked { member, id } => FleetEvent::Revoked { kind: member, id },
            LoggedEvent::JobChanged { job } => FleetEvent::JobChanged { job },
            LoggedEvent::BenchmarkQueued { device } => FleetEvent::BenchmarkQueued { device },
        }
    }
}

fn key(seq: u64) -> String {
    format!("{seq:020}")
}

/// The key of the `i`th event logged under one sequence number: after
/// `key(seq)` and before `key(seq + 1)`, as the tail reads keys in order.
fn batch_key(seq: u64, i: usize) -> String {
    format!("{}.{i:06}", key(seq))
}

/// Where a replica's events go in the shared store.
#[derive(Clone)]
pub struct Relay {
    store: Db,
    replica: Arc<str>,
}

impl Relay {
    pub fn new(store: Db, replica: &str) -> Relay {
        Relay {
            store,
            replica: replica.into(),
        }
    }

    /// Logs `event` for the other replicas. A failure is logged, not
    /// returned: the write that caused the event has succeeded, and the
    /// member's next resync picks the change up.
    pub fn append(&self, event: &FleetEvent) {
        self.append_many(std::slice::from_ref(event));
    }

    /// Logs `events` for the other replicas in one write under one
    /// sequence number: a rollout's batch of wake-ups is two store calls
    /// (two round trips on PostgreSQL), not two per device. Failures as
    /// [`Relay::append`].
    pub fn append_many(&self, events: &[FleetEvent]) {
        if events.is_empty() {
            return;
        }
        let r = self
            .store
            .next_id()
            .map_err(edgeloop_errors::Error::from)
            .and_then(|seq| {
                let entries: Vec<(String, Relayed)> = events
                    .iter()
                    .enumerate()
                    .map(|(i, event)| {
                        let entry = Relayed {
                            replica: self.replica.to_string(),
                            event: event.into(),
                        };
                        (batch_key(seq, i), entry)
                    })
                    .collect();
                let refs: Vec<(&str, &Relayed)> =
                    entries.iter().map(|(k, v)| (k.as_str(), v)).collect();
                Ok(self.store.fleet.fleet_events.insert_many(&refs)?)
            });
        if let Err(e) = r {
            tracing::warn!(error = %e, events = events.len(), "logging fleet events for the other replicas");
        }
    }
}

/// A replica's position in the log.
pub struct Tail {
    replica: String,
    /// Keys seen at or after the oldest re-read position.
    seen: BTreeSet<String>,
    /// (when, the highest key seen then), oldest first, over [`LAG`].
    marks: VecDeque<(Instant, Option<String>)>,
    pruned_at: Instant,
    /// The highest key seen at the last prune: old by the next one.
    old_mark: Option<String>,
}

impl Tail {
    /// Starts at the log's end: what was logged before this replica
    /// started is not news to any stream it serves.
    pub fn new(store: &Db, replica: &str) -> Result<Tail> {
        let end = store
            .fleet
            .fleet_events
            .last_with_prefix("")?
            .map(|(k, _)| k);
        Ok(Tail {
            replica: replica.to_string(),
            seen: BTreeSet::new(),
            marks: VecDeque::from([(Instant::now(), end.clone())]),
            pruned_at: Instant::now(),
            old_mark: end,
        })
    }

    /// One poll: the other replicas' events not seen yet, in log order.
    pub fn poll(&mut self, store: &Db) -> Result<Vec<FleetEvent>> {
        let now = Instant::now();
        // Re-read from where this replica stood LAG ago.
        while self.marks.len() > 1 && now.duration_since(self.marks[1].0) >= LAG {
            self.marks.pop_front();
        }
        let from = self.marks.front().and_then(|(_, k)| k.clone());
        if let Some(f) = &from {
            self.seen = self.seen.split_off(f);
        }
        let mut out = Vec::new();
        let mut after = from;
        let mut highest = self.marks.back().and_then(|(_, k)| k.clone());
        loop {
            let page =
                store
                    .fleet
                    .fleet_events
                    .page_after("", after.as_deref(), 1024, |_, _| true)?;
            let full = page.len() == 1024;
            for (k, r) in page {
                after = Some(k.clone());
                if highest.as_ref().is_none_or(|h| k > *h) {
                    highest = Some(k.clone());
                }
                if self.seen.insert(k) && r.replica != self.replica {
                    out.push(r.event.into());
                }
            }
            if !full {
                break;
            }
        }
        self.marks.push_back((now, highest));
        Ok(out)
    }

    /// Once a [`KEEP`]: drops the entries up to the highest key this
    /// replica had seen at the previous prune, so each entry lives from
    /// one to two [`KEEP`]s (any replica may drop it; all of them read it
    /// long before). Returns how many.
    pub fn prune(&mut self, store: &Db) -> Result<u64> {
        if self.pruned_at.elapsed() < KEEP {
            return Ok(0);
        }
        self.pruned_at = Instant::now();
        let newest = self.marks.back().and_then(|(_, k)| k.clone());
        let Some(upto) = std::mem::replace(&mut self.old_mark, newest) else {
            return Ok(0);
        };
        // A page of keys per call: on PostgreSQL a wave's 10 000 entries
        // are ten statements, not 10 000 round trips.
        let mut dropped = 0;
        loop {
            let page = store.fleet.fleet_events.first_with_prefix("", 1024)?;
            let full = page.len() == 1024;
            let old: Vec<&str> = page
                .iter()
                .map(|(k, _)| k.as_str())
                .take_while(|k| *k <= upto.as_str())
                .collect();
            let reached_upto = old.len() < page.len();
            store.fleet.fleet_events.remove_many(&old)?;
            dropped += old.len() as u64;
            if reached_upto || !full {
                return Ok(dropped);
            }
        }
    }
}

/// Tails the log from `tail` every [`POLL`] until shutdown, publishing the
/// other replicas' events here. Blocking: on a thread of its own, as the
/// leases are. `tail` is taken before the replica serves (a device's
/// stream opened before it would not hear what was logged in between),
/// and kept by the caller across restarts.
pub fn tail_until(
    core: &crate::Core,
    tail: &std::sync::Mutex<Tail>,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    while !shutdown.is_cancelled() {
        std::thread::sleep(POLL);
        // A run that panicked mid-poll leaves a usable place: re-reads are
        // told apart by the keys seen.
        let mut tail = tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match tail.poll(&core.store) {
            Ok(events) => {
                for e in events {
                    core.events.publish_local(e);
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading other replicas' fleet events"),
        }
        if let Err(e) = tail.prune(&core.store) {
            tracing::warn!(error = %e, "pruning the fleet event log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Events;

    use crate::leader::tests::stores;

    /// The `i`th device's wake-up.
    fn changed(i: usize) -> FleetEvent {
        FleetEvent::AssignmentsChanged {
            device: format!("d{i}"),
        }
    }

    #[test]
    fn an_event_published_on_one_replica_wakes_a_stream_on_the_other() {
        for (store, _keep) in stores("relay wakes") {
            wakes(&store);
        }
    }

    fn wakes(store: &Db) {
        let a = Events::relayed(Relay::new(store.clone(), "a"));
        let b = Events::relayed(Relay::new(store.clone(), "b"));
        let mut tail_a = Tail::new(store, "a").unwrap();
        let mut tail_b = Tail::new(store, "b").unwrap();
        let mut watch = b.member(MemberKind::Device, "d1");
        a.publish(FleetEvent::AssignmentsChanged {
            device: "d1".into(),
        });
        a.publish(FleetEvent::Revoked {
            kind: MemberKind::Cluster,
            id: "c1".into(),
        });
        assert!(!watch.has_changed().unwrap(), "not before b reads the log");
        let heard = tail_b.poll(store).unwrap();
        assert_eq!(heard.len(), 2, "{heard:?}");
        for e in heard {
            b.publish_local(e);
        }
        assert!(watch.has_changed().unwrap());
        assert_eq!(watch.borrow_and_update().assignments, 1);
        assert!(
            tail_a.poll(store).unwrap().is_empty(),
            "its own are not news"
        );
        assert!(tail_b.poll(store).unwrap().is_empty(), "each event once");
    }

    #[test]
    fn a_batch_is_heard_in_order_between_the_events_around_it_and_once() {
        for (store, _keep) in stores("relay batch") {
            batch(&store);
        }
    }

    fn batch(store: &Db) {
        let a = Events::relayed(Relay::new(store.clone(), "a"));
        let mut tail_b = Tail::new(store, "b").unwrap();
        a.publish(changed(0));
        a.publish_many((1..=11).map(changed).collect());
        a.publish(changed(12));
        assert_eq!(
            tail_b.poll(store).unwrap(),
            (0..=12).map(changed).collect::<Vec<_>>()
        );
        assert!(tail_b.poll(store).unwrap().is_empty(), "each event once");
        a.publish_many(vec![]);
        assert!(tail_b.poll(store).unwrap().is_empty());
    }

    #[test]
    fn an_entry_that_lands_behind_a_later_one_is_still_read_once() {
        for (store, _keep) in stores("relay late entry") {
            late_entry(&store);
        }
    }

    fn late_entry(store: &Db) {
        let mut tail = Tail::new(store, "b").unwrap();
        let entry = |device: &str| Relayed {
            replica: "a".into(),
            event: LoggedEvent::AssignmentsChanged {
                device: device.into(),
            },
        };
        // Sequence 2 commits first; 1, taken earlier, lands after the poll.
        let (one, two) = (store.next_id().unwrap(), store.next_id().unwrap());
        store
            .fleet
            .fleet_events
            .insert(&key(two), &entry("late-second"))
            .unwrap();
        assert_eq!(tail.poll(store).unwrap().len(), 1);
        store
            .fleet
            .fleet_events
            .insert(&key(one), &entry("first"))
            .unwrap();
        let heard = tail.poll(store).unwrap();
        assert_eq!(
            heard,
            vec![FleetEvent::AssignmentsChanged {
                device: "first".into()
            }]
        );
        assert!(tail.poll(store).unwrap().is_empty());
    }

    #[test]
    fn a_prune_drops_what_was_seen_a_keep_ago_and_keeps_the_rest() {
        for (store, _keep) in stores("relay prune") {
            prune(&store);
        }
    }

    fn prune(store: &Db) {
        let a = Events::relayed(Relay::new(store.clone(), "a"));
        let mut tail = Tail::new(store, "b").unwrap();
        let keep_ago = || Instant::now().checked_sub(KEEP).unwrap();
        // More than a page of old entries, then a poll that sees them.
        a.publish_many((0..1500).map(changed).collect());
        assert_eq!(tail.poll(store).unwrap().len(), 1500);
        assert_eq!(tail.prune(store).unwrap(), 0, "not before a KEEP");
        tail.pruned_at = keep_ago();
        // The first prune only marks what it has seen: old by the next.
        assert_eq!(tail.prune(store).unwrap(), 0);
        a.publish_many((1500..1510).map(changed).collect());
        tail.pruned_at = keep_ago();
        assert_eq!(tail.prune(store).unwrap(), 1500);
        assert_eq!(
            store.fleet.fleet_events.len().unwrap(),
            10,
            "the unseen entries stay"
        );
        assert_eq!(tail.poll(store).unwrap().len(), 10, "and are heard");
        tail.pruned_at = keep_ago();
        assert_eq!(
            tail.prune(store).unwrap(),
            0,
            "seen at this prune: old by the next"
        );
        tail.pruned_at = keep_ago();
        assert_eq!(tail.prune(store).unwrap(), 10);
        assert!(store.fleet.fleet_events.is_empty().unwrap());
    }

    #[test]
    fn logged_events_round_trip() {
        for e in [
            FleetEvent::AssignmentsChanged { device: "d".into() },
            FleetEvent::Revoked {
                kind: MemberKind::Device,
                id: "d".into(),
            },
            FleetEvent::JobChanged { job: "j".into() },
            FleetEvent::BenchmarkQueued { device: "d".into() },
        ] {
            let logged = LoggedEvent::from(&e);
            let json = serde_json::to_string(&logged).unwrap();
            let back: LoggedEvent = serde_json::from_str(&json).unwrap();
            assert_eq!(FleetEvent::from(back), e);
        }
    }
}
