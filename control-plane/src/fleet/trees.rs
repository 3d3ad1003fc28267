//! The fleet wing's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use super::members::{Member, MemberKind};
use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
    /// Enrolled devices, by id.
    pub devices: Tree<Member>,
    /// Enrolled cluster bridges, by id.
    pub clusters: Tree<Member>,
    /// Bootstrap tokens, by the sha256 of their secret.
    pub tokens: Tree<super::members::BootstrapTokenRecord>,
    /// Each device's assignment set, by device.
    pub assignments: Tree<super::assignments::AssignmentSetRecord>,
    /// What each device last reported of each assignment.
    pub assignment_status: Tree<super::telemetry::AssignmentStatusRecord>,
    /// Telemetry batches, by device and sequence.
    pub telemetry: Tree<super::telemetry::TelemetryRecord>,
    /// Where each agent telemetry epoch's sequences start in its device's
    /// one sequence space, by `<device>/<epoch as 16 hex>` (`telemetry`).
    pub telemetry_epochs: Tree<u64>,
    /// Every (model, version) each device was ever assigned, by
    /// `<device>/<model>/<version>`: what its reports may name.
    pub assigned_history: Tree<()>,
    /// Fleet events for the other replicas, by store sequence (`relay`).
    pub fleet_events: Tree<super::relay::Relayed>,
    /// Device benchmarks, by id (`b-<seq>`, so key order is creation order).
    pub benchmarks: Tree<super::benchmarks::BenchmarkRecord>,
    /// Rollouts, by id (`d-<seq>`, so key order is creation order).
    pub deployments: Tree<super::deployments::DeploymentRecord>,
    /// Each deployment's event log, by `<id>/<n>`.
    pub deployment_events: Tree<super::deployments::EventEntry>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            devices: store.tree("devices")?,
            clusters: store.tree("clusters")?,
            tokens: store.tree("bootstrap_tokens")?,
            assignments: store.tree("assignments")?,
            assignment_status: store.tree("assignment_status")?,
            telemetry: store.tree("telemetry")?,
            telemetry_epochs: store.tree("telemetry_epochs")?,
            assigned_history: store.tree("assigned_history")?,
            fleet_events: store.tree("fleet_events")?,
            benchmarks: store.tree("benchmarks")?,
            deployments: store.tree("deployments")?,
            deployment_events: store.tree("deployment_events")?,
        })
    }

    /// The tree of members of `kind`.
    pub fn members(&self, kind: MemberKind) -> &Tree<Member> {
        match kind {
            MemberKind::Device => &self.devices,
            MemberKind::Cluster => &self.clusters,
        }
    }
}
