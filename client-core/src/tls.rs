//! Channels to the control plane.
//!
//! Before enrollment the device has no CA file, only the CA fingerprint from
//! its bootstrap token: [`PinnedCaVerifier`] accepts a server only if the CA
//! the server presents hashes to that fingerprint, and then verifies the
//! server certificate against it as usual. After enrollment the stored CA is
//! the only trust anchor.

use std::sync::Arc;

use edgeloop_models::Digest;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::identity::Identity;

#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: Digest,
    provider: Arc<CryptoProvider>,
}

impl PinnedCaVerifier {
    pub fn new(pin: Digest) -> Self {
        Self {
            pin,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        }
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| Digest::of(c.as_ref()) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(format!(
                    "server did not present the CA pinned by the bootstrap token ({})",
                    self.pin
                ))
            })?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn endpoint(url: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(url.to_string())?
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(30)))
}

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
