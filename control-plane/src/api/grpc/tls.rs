//! The gRPC listener's TLS, done here rather than by tonic so that the
//! server certificate comes from [`Pki::server_resolver`](crate::fleet::pki::Pki::server_resolver)
//! at each handshake: a reissued certificate is presented from the next
//! connection on, with no restart. tonic still sees each connection's
//! verified client certificate (`Request::peer_certs`), since it knows the
//! tokio-rustls stream type. Connections come from
//! [`edgeloop_client_core::https::accept`], as the console's do.

use crate::Core;

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
