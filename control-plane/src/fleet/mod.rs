//! The fleet wing: enrolled devices and cluster bridges, their PKI, the
//! assignments pushed to devices, and what they report back.

pub mod admission;
pub mod assignments;
pub mod benchmarks;
pub mod cost;
pub mod deployments;
pub mod members;
pub mod pki;
pub mod presence;
pub mod relay;
pub mod renewal;
pub mod rollout;
pub mod selector;
pub mod serving;
pub mod telemetry;
mod trees;
pub mod wakeups;

pub use trees::Trees;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{broadcast, watch};

use members::MemberKind;

/// In-process notifications that let long-lived streams react to changes
/// without polling the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetEvent {
    AssignmentsChanged {
        device: String,
    },
    Revoked {
        kind: MemberKind,
        id: String,
    },
    /// A job was queued, cancelled or otherwise changed.
    JobChanged {
        job: String,
    },
    /// A benchmark was queued for a device.
    BenchmarkQueued {
        device: String,
    },
}

/// What a long-lived stream of one member waits for. A per-member
/// `watch` channel rather than the broadcast: with N devices each watching,
/// a broadcast would wake all N streams for every device's change (N² work
/// in a fleet-wide rollout) and could drop a revocation when a slow stream
/// lags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberSignal {
    /// Bumped whenever the member's assignments change.
    pub assignments: u64,
    /// Bumped whenever a benchmark is queued for the member.
    pub benchmarks: u64,
    pub revoked: bool,
}

type MemberKey = (MemberKind, String);

#[derive(Clone)]
pub struct Events {
    broadcast: broadcast::Sender<FleetEvent>,
    members: Arc<Mutex<HashMap<MemberKey, watch::Sender<MemberSignal>>>>,
    /// Where events go for the other replicas, when there are any.
    relay: Option<relay::Relay>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            broadcast: broadcast::channel(1024).0,
            members: Arc::default(),
            relay: None,
        }
    }
}

impl Events {
    /// Events that other replicas hear too (`relay`).
    pub fn relayed(relay: relay::Relay) -> Self {
        Self {
            relay: Some(relay),
            ..Self::default()
        }
    }

    /// Whether events go to other replicas.
    pub fn is_relayed(&self) -> bool {
        self.relay.is_some()
    }

    /// Routes the event here, and logs it for the other replicas.
    pub fn publish(&self, event: FleetEvent) {
        if let Some(r) = &self.relay {
            r.append(&event);
        }
        self.publish_local(event);
    }

    /// [`Events::publish`] for many events, logged for the other replicas
    /// in one write. The log is a store write: on PostgreSQL, call it off
    /// the runtime's workers.
    pub fn publish_many(&self, events: Vec<FleetEvent>) {
        if let Some(r) = &self.relay {
            r.append_many(&events);
        }
        for event in events {
            self.publish_local(event);
        }
    }

    /// Routes the event: a member's own changes to its signal, and
    /// everything but assignment changes to the broadcast too. Here only
    /// (an event another replica logged).
    pub fn publish_local(&self, event: FleetEvent) {
        match &event {
            FleetEvent::AssignmentsChanged { device } => {
                self.signal(MemberKind::Device, device, |s| s.assignments += 1);
                return;
            }
            FleetEvent::BenchmarkQueued { device } => {
                self.signal(MemberKind::Device, device, |s| s.benchmarks += 1);
                return;
            }
            FleetEvent::Revoked { kind, id } => self.signal(*kind, id, |s| s.revoked = true),
            FleetEvent::JobChanged { .. } => {}
        }
        // No subscribers is fine: nobody is watching.
        let _ = self.broadcast.send(event);
    }

    fn signal(&self, kind: MemberKind, id: &str, change: impl FnOnce(&mut MemberSignal)) {
        self.with_sender(kind, id, |sender| sender.send_modify(change));
    }

    /// Runs `f` on the member's sender, created on first use.
    fn with_sender<T>(
        &self,
        kind: MemberKind,
        id: &str,
        f: impl FnOnce(&watch::Sender<MemberSignal>) -> T,
    ) -> T {
        let mut members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        f(members
            .entry((kind, id.to_string()))
            .or_insert_with(|| watch::channel(MemberSignal::default()).0))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<FleetEvent> {
        self.broadcast.subscribe()
    }

    /// One member's signal. Subscribe before reading the state it guards:
    /// a change after this call makes `changed()` return.
    pub fn member(&self, kind: MemberKind, id: &str) -> watch::Receiver<MemberSignal> {
        self.with_sender(kind, id, watch::Sender::subscribe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_member_hears_only_its_own_changes_and_never_misses_a_revocation() {
        let events = Events::default();
        let mut a = events.member(MemberKind::Device, "a");
        let b = events.member(MemberKind::Device, "b");
        for _ in 0..5000 {
            events.publish(FleetEvent::AssignmentsChanged { device: "b".into() });
        }
        assert!(!a.has_changed().unwrap(), "b's changes do not wake a");
        assert_eq!(b.borrow().assignments, 5000);
        events.publish(FleetEvent::AssignmentsChanged { device: "a".into() });
        events.publish(FleetEvent::Revoked {
            kind: MemberKind::Device,
            id: "a".into(),
        });
        a.changed().await.unwrap();
        assert_eq!(
            *a.borrow_and_update(),
            MemberSignal {
                assignments: 1,
                benchmarks: 0,
                revoked: true
            }
        );
        // A cluster with the same id is another member.
        assert!(!events.member(MemberKind::Cluster, "a").borrow().revoked);
    }
}
