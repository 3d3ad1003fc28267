//! The audit log's retention task: prunes `edgeloop_auth::audit` under the
//! audit-retention lease.

use edgeloop_auth::audit::prune;

/// Prunes the log at start and then hourly, until `shutdown`.
pub async fn run_retention(
    core: std::sync::Arc<crate::Core>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !core.leader.leads(crate::leader::Task::AuditRetention) {
            continue;
        }
        let store = core.store.clone();
        let (r, now) = (core.config.audit_retention, core.now());
        let pass = tokio::task::spawn_blocking(move || prune(&store.auth, r, now)).await;
        match pass {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => {
                tracing::info!(dropped = n, "audit log retention");
                if let Err(e) = core.store.flush().await {
                    tracing::warn!(error = %e, "flushing after audit retention");
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "audit log retention failed; retrying in an hour")
            }
            Err(e) => tracing::warn!(error = %e, "audit log retention task panicked"),
        }
    }
}
