//! What sync does, for observers: tests prove resumption with
//! `FetchStarted`'s offset; telemetry may forward the rest as events.

use edgeloop_models::Digest;

use super::generation::Decision;
use super::machine::ReportState;
use super::slots::SlotId;

#[derive(Debug, Clone, PartialEq)]
pub enum SyncEvent {
    /// An assignment set arrived and was applied, resumed or ignored as stale.
    SetOffered { generation: u64, decision: Decision },
    /// A FetchArtifact call from `offset` (0: from the start).
    FetchStarted { digest: Digest, offset: u64 },
    /// The download of `digest` is complete and its sha256 verified.
    Downloaded { digest: Digest },
    /// A status was handed to the reporter.
    Status {
        model: String,
        version: String,
        state: ReportState,
        reason: String,
        provider: String,
    },
    /// Boot activated a model from disk.
    Booted {
        model: String,
        version: String,
        slot: SlotId,
    },
    /// Boot could not activate any slot of a model.
    BootFailed { model: String, reason: String },
}
