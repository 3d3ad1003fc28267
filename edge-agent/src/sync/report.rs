//! ReportAssignmentStatus with retries: the latest status per model waits
//! here until the control plane acknowledges it, however long the device is
//! offline. A newer status for a model replaces an unsent older one (the
//! control plane keeps only the latest per model anyway).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use edgeloop_client_core::Backoff;
use edgeloop_proto::agent::v1 as pb;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client::{is_refusal, ControlPlaneClient};
use super::machine::ReportState;

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub generation: u64,
    pub model: String,
    pub version: String,
    pub state: ReportState,
    pub reason: String,
    pub provider: String,
    /// What serves this model as the report is made (empty: nothing).
    pub serving_version: String,
    pub at: SystemTime,
}

impl Report {
    pub fn to_proto(&self) -> pb::AssignmentStatusReport {
        pb::AssignmentStatusReport {
            generation: self.generation,
            model_name: self.model.clone(),
            model_version: self.version.clone(),
            state: state_to_proto(self.state) as i32,
            reason: self.reason.clone(),
            execution_provider: self.provider.clone(),
            at: Some(self.at.into()),
            serving_version: self.serving_version.clone(),
        }
    }
}

pub fn state_to_proto(s: ReportState) -> pb::AssignmentState {
    match s {
        ReportState::Downloading => pb::AssignmentState::Downloading,
        ReportState::Activating => pb::AssignmentState::Activating,
        ReportState::Active => pb::AssignmentState::Active,
        ReportState::Failed => pb::AssignmentState::Failed,
        ReportState::RolledBack => pb::AssignmentState::RolledBack,
    }
}

/// Unacknowledged reports by model, each with a sequence number so that an
/// acknowledgement removes only the report that was sent, not a newer one.
#[derive(Default)]
struct Pending {
    last_seq: u64,
    by_model: BTreeMap<String, (u64, Report)>,
}

#[derive(Default)]
pub struct Reporter {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl Reporter {
    pub fn submit(&self, report: Report) {
        if let Ok(mut p) = self.pending.lock() {
            p.last_seq += 1;
            let seq = p.last_seq;
            p.by_model.insert(report.model.clone(), (seq, report));
        }
        self.wake.notify_one();
    }

    /// What has not been acknowledged yet.
    pub fn pending(&self) -> Vec<Report> {
        self.pending
            .lock()
            .map(|p| p.by_model.values().map(|(_, r)| r.clone()).collect())
            .unwrap_or_default()
    }

    fn snapshot(&self) -> Vec<(u64, Report)> {
        self.pending
            .lock()
            .map(|p| p.by_model.values().cloned().collect())
            .unwrap_or_default()
    }

    fn acknowledge(&self, model: &str, seq: u64) {
        if let Ok(mut p) = self.pending.lock() {
            if p.by_model.get(model).is_some_and(|(s, _)| *s == seq) {
                p.by_model.remove(model);
            }
        }
    }

    /// Sends pending reports until `shutdown`, backing off while the control
    /// plane is unreachable.
    pub async fn run(
        self: Arc<Self>,
        client: Arc<dyn ControlPlaneClient>,
        backoff: Backoff,
        shutdown: CancellationToken,
    ) {
        let mut attempt: u32 = 0;
        loop {
            let mut failed = false;
            for (seq, report) in self.snapshot() {
                match client.report(report.to_proto()).await {
                    Ok(()) => {
                        attempt = 0;
                        self.acknowledge(&report.model, seq);
                    }
                    // The control plane will never take this one.
                    Err(status) if is_refusal(status.code()) => {
                        tracing::warn!(model = %report.model, %status, "assignment status refused; dropping it");
                        self.acknowledge(&report.model, seq);
                    }
                    Err(status) => {
                        tracing::debug!(%status, "reporting assignment status failed; will retry");
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                let delay = backoff.next(attempt);
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return,
                }
            } else {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }
}
