//! The gRPC listener's TLS, done here rather than by tonic so that the
//! server certificate comes from [`Pki::server_resolver`](crate::fleet::pki::Pki::server_resolver)
//! at each handshake: a reissued certificate is presented from the next
//! connection on, with no restart. tonic still sees each connection's
//! verified client certificate (`Request::peer_certs`), since it knows the
//! tokio-rustls stream type.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::Core;

/// A handshake that has not finished by then is dropped: a client that
/// connects and sends nothing must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The rustls config: the PKI's current server certificate; client
/// certificates optional at this layer (Enroll has none) but, when
/// presented, chained to our CA or the handshake fails.
pub fn server_config(core: &Core) -> anyhow::Result<rustls::ServerConfig> {
    let mut config = edgeloop_client_core::https::server_config_with_resolver(
        core.pki.server_resolver(),
        Some(core.pki.ca_pem().as_bytes()),
    )?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Accepted connections, their handshakes done concurrently, until
/// `shutdown`.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, say: wait, do not spin.
                        tracing::warn!(error = %e, "accepting a gRPC connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
