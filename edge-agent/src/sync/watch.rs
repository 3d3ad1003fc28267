//! The WatchAssignments stream, kept open for the agent's life: every set
//! goes to the reconciler; a broken stream reconnects with jittered backoff,
//! announcing the generation already applied.

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use edgeloop_client_core::Backoff;
use tonic::Code;

use super::client::ControlPlaneClient;
use super::reconcile::Reconciler;
use super::SyncError;

pub async fn watch(
    client: &dyn ControlPlaneClient,
    reconciler: &mut Reconciler,
    backoff: Backoff,
    shutdown: &CancellationToken,
) -> Result<(), SyncError> {
    let mut attempt: u32 = 0;
    loop {
        let known = reconciler.known_generation();
        let opened = tokio::select! {
            r = client.watch(known) => r,
            _ = shutdown.cancelled() => return Ok(()),
        };
        match opened {
            Ok(mut stream) => loop {
                let item = tokio::select! {
                    item = stream.next() => item,
                    _ = shutdown.cancelled() => return Ok(()),
                };
                match item {
                    Some(Ok(set)) => {
                        attempt = 0;
                        reconciler.offer(set).await.map_err(SyncError::Storage)?;
                    }
                    Some(Err(status)) => {
                        check_refusal(status)?;
                        break;
                    }
                    None => {
                        tracing::info!("assignment stream closed; reconnecting");
                        break;
                    }
                }
            },
            Err(status) => check_refusal(status)?,
        }
        let delay = backoff.next(attempt);
        attempt = attempt.saturating_add(1);
        tracing::debug!(?delay, "watching assignments again after a pause");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// A revoked or unknown identity ends sync; anything else is retried.
fn check_refusal(status: tonic::Status) -> Result<(), SyncError> {
    if matches!(
        status.code(),
        Code::Unauthenticated | Code::PermissionDenied
    ) {
        return Err(SyncError::Refused(status));
    }
    tracing::warn!(%status, "assignment watch failed; retrying");
    Ok(())
}
