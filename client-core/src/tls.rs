//! Channels to the control plane.
//!
//! Before enrollment the device has no CA file, only the CA fingerprint from
//! its bootstrap token: [`PinnedCaVerifier`] (`edgeloop_api::tls`, shared
//! with the console client) accepts a server only if the CA the server
//! presents hashes to that fingerprint, and then verifies the server
//! certificate against it as usual. After enrollment the stored CA is
//! the only trust anchor.

use std::sync::Arc;

use edgeloop_models::Digest;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::identity::Identity;

pub use edgeloop_api::tls::PinnedCaVerifier;

fn endpoint(url: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(url.to_string())?
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(30))
        // HTTP/2 pings find a connection that died without a FIN (a NAT
        // that forgot it, a cable pulled) while a long stream is open on it;
        // the control plane pings from its side too.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

/// How often an idle HTTP/2 connection is pinged, both ways.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
/// A ping unanswered this long closes the connection.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Server-authenticated TLS, trusting only the CA with the pinned fingerprint.
/// Used for Enroll, before the device has a certificate.
pub fn enroll_endpoint(
    url: &str,
    ca_fingerprint: Digest,
) -> Result<Endpoint, tonic::transport::Error> {
    endpoint(url)?.tls_config_with_verifier(
        ClientTlsConfig::new(),
        Arc::new(PinnedCaVerifier::new(ca_fingerprint)),
    )
}

/// Mutual TLS with the enrolled identity; trusts only the stored CA.
pub fn mtls_endpoint(url: &str, identity: &Identity) -> Result<Endpoint, tonic::transport::Error> {
    endpoint(url)?.tls_config(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&identity.ca_pem))
            .identity(tonic::transport::Identity::from_pem(
                &identity.cert_pem,
                &identity.key_pem,
            )),
    )
}
