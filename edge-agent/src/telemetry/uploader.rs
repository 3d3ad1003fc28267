//! The background half: close a window every interval (persisting its
//! batch), and send pending batches in order, with backoff while the control
//! plane is away, deleting each only once its sequence is acknowledged.

use std::sync::Arc;

use anyhow::Context as _;
use edgeloop_client_core::{MemberConfig, Membership};
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::Telemetry;

/// Runs until `shutdown`: closes a window every `interval`, and the last
/// one on shutdown, so nothing observed is lost across a restart; sends
/// pending batches as soon as this device has an identity (enrollment runs
/// concurrently in `run_member`).
pub async fn run(
    telemetry: Arc<Telemetry>,
    member: MemberConfig,
    membership: Membership,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (closed, sent) = tokio::join!(
        close_windows(telemetry.clone(), shutdown.clone()),
        send_batches(telemetry, member, membership, shutdown),
    );
    closed.and(sent)
}

async fn close_once(telemetry: &Arc<Telemetry>) {
    let t = telemetry.clone();
    match tokio::task::spawn_blocking(move || t.close_window()).await {
        Ok(Ok(Some(seq))) => tracing::debug!(seq, "telemetry batch persisted"),
        Ok(Ok(None)) => {}
        // A full disk is no reason to stop serving: try again next window.
        Ok(Err(e)) => tracing::error!(error = %format!("{e:#}"), "closing a telemetry window"),
        Err(e) => tracing::error!(error = %e, "telemetry window task"),
    }
}

async fn close_windows(
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let interval = telemetry.options().interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => close_once(&telemetry).await,
            _ = shutdown.cancelled() => {
                close_once(&telemetry).await;
                return Ok(());
            }
        }
    }
}

/// Runs blocking buffer work off the async workers.
async fn blocking<T: Send + 'static>(
    telemetry: &Arc<Telemetry>,
    f: impl FnOnce(&Telemetry) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let t = telemetry.clone();
    tokio::task::spawn_blocking(move || f(&t))
        .await
        .context("telemetry buffer task")?
}

async fn send_batches(
    telemetry: Arc<Telemetry>,
    member: MemberConfig,
    membership: Membership,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // The membership's channel reconnects by itself once the control plane
    // is back, and follows certificate renewals.
    let Some(channel) = membership.channel(&shutdown).await else {
        return Ok(());
    };
    let mut client = AgentServiceClient::new(channel);
    let mut attempt: u32 = 0;
    loop {
        let head = match blocking(&telemetry, |t| t.buffer.head()).await {
            Ok(head) => head,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "reading the telemetry buffer");
                None
            }
        };
        let Some(report) = head else {
            tokio::select! {
                _ = telemetry.wake.notified() => continue,
                // Also look again now and then, in case a read failed.
                _ = tokio::time::sleep(telemetry.options().interval) => continue,
                _ = shutdown.cancelled() => return Ok(()),
            }
        };
        let seq = report.sequence;
        let result = tokio::select! {
            r = client.report_telemetry(report) => r,
            _ = shutdown.cancelled() => {
                telemetry.buffer.send_failed();
                return Ok(());
            }
        };
        let retry = match result {
            Ok(ack) if ack.get_ref().acked_sequence >= seq => {
                let acked = ack.into_inner().acked_sequence;
                match blocking(&telemetry, move |t| t.buffer.ack(acked)).await {
                    Ok(n) => tracing::debug!(acked, deleted = n, "telemetry acknowledged"),
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "deleting acknowledged telemetry")
                    }
                }
                attempt = 0;
                false
            }
            Ok(ack) => {
                tracing::warn!(
                    seq,
                    acked = ack.get_ref().acked_sequence,
                    "control plane acknowledged less than was sent; retrying"
                );
                true
            }
            // The control plane will never take this batch; keeping it
            // would block every later one.
            Err(status) if status.code() == Code::InvalidArgument => {
                tracing::error!(seq, %status, "control plane refused a telemetry batch; dropping it");
                if let Err(e) = blocking(&telemetry, move |t| t.buffer.reject(seq)).await {
                    tracing::error!(error = %format!("{e:#}"), "dropping a refused batch");
                }
                false
            }
            Err(status) => {
                tracing::warn!(seq, %status, "sending telemetry failed; will retry");
                true
            }
        };
        if retry {
            telemetry.buffer.send_failed();
            let delay = member.backoff.next(attempt);
            attempt = attempt.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => return Ok(()),
            }
        }
    }
}
