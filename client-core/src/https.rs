//! An axum router over TLS: rustls (ring), HTTP/1.1 and HTTP/2 by ALPN,
//! with a graceful drain like `axum::serve`'s. One loop for the control
//! plane's console (`--http-tls`) and the edge agent's inference API
//! (`--api-tls-cert`, with client certificates for mTLS). Each request
//! carries the connection's [`ClientCertificate`] as an extension, so a
//! route can ask whether its caller proved an identity.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// A handshake that has not finished by then is dropped: a client that
/// connects and sends nothing must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The verified client certificate of the request's connection (leaf),
/// when the client presented one that chains to the configured CAs.
#[derive(Debug, Clone, Default)]
pub struct ClientCertificate(pub Option<CertificateDer<'static>>);

/// Reads a PEM certificate chain (leaf first) and its key.
fn identity(
    chain_pem: &[u8],
    key_pem: &[u8],
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("reading the certificate chain (PEM)")?;
    anyhow::ensure!(
        !chain.is_empty(),
        "the certificate file holds no certificate"
    );
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("reading the private key (PEM)")?;
    Ok((chain, key))
}

/// The rustls server config for a PEM chain (leaf first) and key. With
/// `client_ca_pem`, clients may present a certificate, which must chain to
/// one of those CAs (a wrong one fails the handshake); whether a route
/// needs one is the route's call, through [`ClientCertificate`], so that
/// health probes can stay open.
pub fn server_config(
    chain_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> anyhow::Result<rustls::ServerConfig> {
    let (chain, key) = identity(chain_pem, key_pem)?;
    let certified =
        rustls::sign::CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
            .context("the certificate and key do not make a TLS identity")?;
    server_config_with_resolver(
        Arc::new(rustls::sign::SingleCertAndKey::from(certified)),
        client_ca_pem,
    )
}

/// [`server_config`] with the certificate from `resolver` at each
/// handshake: one that can be replaced while the listener runs.
pub fn server_config_with_resolver(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    client_ca_pem: Option<&[u8]>,
) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .context("reading the client CA certificates (PEM)")?;
            anyhow::ensure!(!cas.is_empty(), "the client CA file holds no certificate");
            for ca in cas {
                roots
                    .add(ca)
                    .context("a client CA certificate is not usable")?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .context("the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepted TLS connections, each handshake done on its own task within
/// [`HANDSHAKE_TIMEOUT`], until `shutdown`: what [`serve`] and the control
/// plane's gRPC listener read connections from.
pub fn accept(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
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
                        tracing::warn!(error = %e, "accepting a TLS connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Small answers written at once: Nagle would hold them back.
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

/// Serves `app` over TLS until `shutdown`, then lets open connections
/// finish their requests.
pub async fn serve(
    app: Router,
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let connections = accept(listener, config, shutdown.clone());
    serve_connections(
        app,
        connections,
        auto::Builder::new(TokioExecutor::new()),
        |tls| {
            ClientCertificate(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.clone().into_owned()),
            )
        },
        shutdown,
    )
    .await
}

/// Serves `app` on the TLS `connections` (from [`accept`]) with
/// `builder`'s HTTP settings until `shutdown`, then lets open connections
/// finish their requests. Each request carries `connection_info` of its
/// connection as an extension: [`serve`]'s [`ClientCertificate`], or
/// tonic's `TlsConnectInfo` for the control plane's gRPC services, where
/// `Request::peer_certs` looks for it.
pub async fn serve_connections<I>(
    app: Router,
    mut connections: ReceiverStream<std::io::Result<TlsStream<TcpStream>>>,
    builder: auto::Builder<TokioExecutor>,
    connection_info: impl Fn(&TlsStream<TcpStream>) -> I,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    I: Clone + Send + Sync + 'static,
{
    let graceful = GracefulShutdown::new();
    loop {
        let tls = tokio::select! {
            _ = shutdown.cancelled() => break,
            tls = connections.next() => match tls {
                Some(Ok(tls)) => tls,
                Some(Err(_)) => continue,
                None => break,
            },
        };
        let info = connection_info(&tls);
        let app = app.clone();
        let service = tower::service_fn(move |mut req: axum::http::Request<_>| {
            req.extensions_mut().insert(info.clone());
            app.clone().oneshot(req)
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(service))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "TLS connection ended");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}
