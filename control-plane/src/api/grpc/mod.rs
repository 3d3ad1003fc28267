//! gRPC for agents (`edgeloop.agent.v1`) and bridges (`edgeloop.bridge.v1`)
//! over TLS ([`tls`]: the server certificate can be reissued live). Client certificates are optional at the TLS layer only so that
//! Enroll can be reached with a bootstrap token; every other RPC demands one
//! (see [`auth`]). A certificate from another CA fails the handshake.

mod agent;
pub mod auth;
mod bridge;
pub mod downloads;
mod tls;

use std::sync::Arc;

use edgeloop_proto::agent::v1::agent_service_server::AgentServiceServer;
use edgeloop_proto::bridge::v1::bridge_service_server::BridgeServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::Core;

/// Largest single gRPC message; artifacts and checkpoints move in chunks.
const MAX_MESSAGE_BYTES: usize = 8 << 20;

pub async fn serve(
    core: Arc<Core>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tls = Arc::new(tls::server_config(&core)?);
    let incoming = edgeloop_client_core::https::accept(listener, tls, shutdown.clone());
    Server::builder()
        // Finds members whose connection died without a FIN, so their
        // streams (and the download permits they hold) end.
        .http2_keepalive_interval(Some(edgeloop_client_core::tls::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(edgeloop_client_core::tls::KEEPALIVE_TIMEOUT))
        .add_service(
            AgentServiceServer::new(agent::AgentApi::new(core.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            BridgeServiceServer::new(bridge::BridgeApi::new(core.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Returns once `kind/id` is revoked: told by the member's own signal (a
/// watch channel, which keeps the latest state and so cannot miss one the
/// way a lagging broadcast receiver could), and checked in the store every
/// heartbeat interval as well, for a revocation the signal did not carry
/// (one that landed before the subscription, say). So a revoked member's
/// open streams end within one heartbeat interval.
pub(crate) async fn revoked(core: Arc<Core>, kind: crate::fleet::members::MemberKind, id: String) {
    let mut signal = core.events.member(kind, &id);
    let mut recheck = tokio::time::interval(core.config.heartbeat_interval);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if signal.borrow_and_update().revoked || revoked_in_store(&core, kind, &id) {
            return;
        }
        tokio::select! {
            changed = signal.changed() => if changed.is_err() {
                // No more signals: the store check alone goes on.
                recheck.tick().await;
            },
            _ = recheck.tick() => {}
        }
    }
}

fn revoked_in_store(core: &Core, kind: crate::fleet::members::MemberKind, id: &str) -> bool {
    match core.store.members(kind).get(id) {
        Ok(Some(m)) => m.revoked_at.is_some(),
        // Gone is as good as revoked; a store error is not proof of either,
        // and the next check comes a heartbeat later.
        Ok(None) => true,
        Err(_) => false,
    }
}

/// `stream`, ended with PERMISSION_DENIED once `kind/id` is revoked (see
/// [`revoked`]): a download in progress does not outlive its certificate.
pub(crate) fn until_revoked<T: Send + 'static>(
    core: Arc<Core>,
    kind: crate::fleet::members::MemberKind,
    id: String,
    stream: futures::stream::BoxStream<'static, Result<T, tonic::Status>>,
) -> futures::stream::BoxStream<'static, Result<T, tonic::Status>> {
    use futures::StreamExt as _;
    let label = kind.identity(&id);
    let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
        Box::pin(revoked(core, kind, id));
    futures::stream::unfold(Some((stream, stop)), move |state| {
        let label = label.clone();
        async move {
            let (mut stream, mut stop) = state?;
            tokio::select! {
                biased;
                () = &mut stop => Some((
                    Err(tonic::Status::permission_denied(format!("{label} has been revoked"))),
                    None,
                )),
                item = stream.next() => item.map(|i| (i, Some((stream, stop)))),
            }
        }
    })
    .boxed()
}
