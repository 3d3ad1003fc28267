//! gRPC for agents (`edgeloop.agent.v1`) and bridges (`edgeloop.bridge.v1`)
//! over TLS. Client certificates are optional at the TLS layer only so that
//! Enroll can be reached with a bootstrap token; every other RPC demands one
//! (see [`auth`]). A certificate from another CA fails the handshake.

mod agent;
pub mod auth;
mod bridge;

use std::sync::Arc;

use edgeloop_proto::agent::v1::agent_service_server::AgentServiceServer;
use edgeloop_proto::bridge::v1::bridge_service_server::BridgeServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::Core;

/// Largest single gRPC message; artifacts and checkpoints move in chunks.
const MAX_MESSAGE_BYTES: usize = 8 << 20;

pub async fn serve(
    core: Arc<Core>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            core.pki.server_chain_pem(),
            core.pki.server_key_pem(),
        ))
        .client_ca_root(Certificate::from_pem(core.pki.ca_pem()))
        .client_auth_optional(true);
    Server::builder()
        .tls_config(tls)?
        .add_service(
            AgentServiceServer::new(agent::AgentApi::new(core.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            BridgeServiceServer::new(bridge::BridgeApi::new(core.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Turns a fleet event subscription into "stop" signals for a stream
/// belonging to `kind/id`: returns once that member is revoked.
pub(crate) async fn revoked(
    mut events: tokio::sync::broadcast::Receiver<crate::fleet::FleetEvent>,
    kind: crate::fleet::members::MemberKind,
    id: &str,
) {
    use crate::fleet::FleetEvent;
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(FleetEvent::Revoked { kind: k, id: i }) if k == kind && i == id => return,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}
