//! The fleet wing: enrolled devices and cluster bridges, their PKI, the
//! assignments pushed to devices, and what they report back.

pub mod assignments;
pub mod deployments;
pub mod drift;
pub mod members;
pub mod pki;
pub mod rollout;
pub mod selector;
pub mod telemetry;

use tokio::sync::broadcast;

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
}

#[derive(Clone)]
pub struct Events(broadcast::Sender<FleetEvent>);

impl Default for Events {
    fn default() -> Self {
        Self(broadcast::channel(1024).0)
    }
}

impl Events {
    pub fn publish(&self, event: FleetEvent) {
        // No subscribers is fine: nobody is watching.
        let _ = self.0.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<FleetEvent> {
        self.0.subscribe()
    }
}
