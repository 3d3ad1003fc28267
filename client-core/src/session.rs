//! Enrollment and the heartbeat loop, shared by agents ([`Role::Device`]) and
//! bridges ([`Role::Cluster`]).

use std::time::{Duration, SystemTime};

use edgeloop_models::Digest;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::common::v1::{
    Capabilities, EnrollRequest, EnrollResponse, HeartbeatRequest, HeartbeatResponse, RenewRequest,
    RenewResponse,
};
use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::Code;

use crate::backoff::Backoff;
use crate::channel::{MemberChannel, Membership};
use crate::identity::{Identity, IdentityStore};
use crate::tls::enroll_endpoint;
use crate::token::BootstrapToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Device,
    Cluster,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no identity in {0} and no bootstrap token given: pass --bootstrap-token")]
    NoIdentity(String),
    #[error("invalid bootstrap token: {0}")]
    Token(#[from] crate::token::TokenError),
    /// The control plane said no; retrying will not help.
    #[error("control plane refused {what}: {status}")]
    Refused {
        what: &'static str,
        status: tonic::Status,
    },
    #[error("enrollment reply is inconsistent: {0}")]
    BadReply(String),
    #[error("key or CSR generation failed: {0}")]
    Crypto(#[from] rcgen::Error),
    #[error("identity store: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid control-plane URL: {0}")]
    Url(tonic::transport::Error),
    #[error(transparent)]
    Endpoints(#[from] crate::endpoints::EndpointsError),
    #[error("shut down before enrollment finished")]
    Cancelled,
    #[error("not enrolled yet")]
    NotEnrolled,
    #[error("certificate renewal failed: {0}")]
    Renewal(tonic::Status),
}

/// True for statuses that mean "you are not allowed", as opposed to "try later".
fn is_refusal(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::FailedPrecondition
    )
}

async fn call_enroll(
    role: Role,
    channel: Channel,
    req: EnrollRequest,
) -> Result<EnrollResponse, tonic::Status> {
    let resp = match role {
        Role::Device => AgentServiceClient::new(channel).enroll(req).await?,
        Role::Cluster => BridgeServiceClient::new(channel).enroll(req).await?,
    };
    Ok(resp.into_inner())
}

async fn call_renew(
    role: Role,
    channel: MemberChannel,
    req: RenewRequest,
) -> Result<RenewResponse, tonic::Status> {
    let resp = match role {
        Role::Device => AgentServiceClient::new(channel).renew(req).await?,
        Role::Cluster => BridgeServiceClient::new(channel).renew(req).await?,
    };
    Ok(resp.into_inner())
}

async fn call_heartbeat(
    role: Role,
    channel: MemberChannel,
    req: HeartbeatRequest,
) -> Result<HeartbeatResponse, tonic::Status> {
    let resp = match role {
        Role::Device => AgentServiceClient::new(channel).heartbeat(req).await?,
        Role::Cluster => BridgeServiceClient::new(channel).heartbeat(req).await?,
    };
    Ok(resp.into_inner())
}

/// Enrolls once: generates a key, sends a CSR with the token, checks the reply
/// against the token's CA pin, and persists the identity before returning.
pub async fn enroll(
    role: Role,
    url: &str,
    token: &BootstrapToken,
    store: &IdentityStore,
    capabilities: Capabilities,
) -> Result<Identity, EnrollAttemptError> {
    // The key is on disk before the control plane sees it: if the reply is
    // lost (a timeout, a kill, a dropped connection), the retry presents
    // the same key, which the control plane answers with the same
    // certificate, where a fresh key would meet a spent token.
    let kept = store
        .load_enroll_key()
        .map_err(SessionError::from)?
        .and_then(|pem| match KeyPair::from_pem(&pem) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(error = %e, "the kept enrollment key is unreadable; making another");
                None
            }
        });
    let key = match kept {
        Some(key) => key,
        None => {
            let key = KeyPair::generate().map_err(SessionError::from)?;
            store
                .save_enroll_key(&key.serialize_pem())
                .map_err(SessionError::from)?;
            key
        }
    };
    let csr_pem = CertificateParams::default()
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(SessionError::from)?;
    let endpoint = enroll_endpoint(url, token.ca_fingerprint).map_err(SessionError::Url)?;
    let channel = endpoint
        .connect()
        .await
        .map_err(EnrollAttemptError::Unreachable)?;
    let reply = call_enroll(
        role,
        channel,
        EnrollRequest {
            bootstrap_token: token.to_string(),
            csr_pem,
            capabilities: Some(capabilities),
        },
    )
    .await
    .map_err(|status| {
        if is_refusal(status.code()) {
            EnrollAttemptError::Fatal(SessionError::Refused {
                what: "enrollment",
                status,
            })
        } else {
            EnrollAttemptError::Retryable(status)
        }
    })?;
    let ca = CertificateDer::from_pem_slice(reply.ca_certificate_pem.as_bytes())
        .map_err(|e| SessionError::BadReply(format!("CA certificate: {e}")))?;
    if Digest::of(ca.as_ref()) != token.ca_fingerprint {
        return Err(
            SessionError::BadReply("CA certificate does not match the token's pin".into()).into(),
        );
    }
    let identity = Identity {
        name: reply.identity,
        key_pem: key.serialize_pem(),
        cert_pem: reply.certificate_pem,
        ca_pem: reply.ca_certificate_pem,
    };
    store.save(&identity).map_err(SessionError::from)?;
    Ok(identity)
}

#[derive(Debug, thiserror::Error)]
pub enum EnrollAttemptError {
    #[error(transparent)]
    Fatal(#[from] SessionError),
    #[error("control plane unreachable: {0}")]
    Unreachable(tonic::transport::Error),
    #[error("enrollment failed, will retry: {0}")]
    Retryable(tonic::Status),
}

/// Loads the stored identity, or enrolls with `token` (retrying with backoff
/// while the control plane is unreachable) if there is none yet.
pub async fn ensure_identity(
    role: Role,
    url: &str,
    token: Option<&str>,
    store: &IdentityStore,
    capabilities: Capabilities,
    backoff: Backoff,
    shutdown: &CancellationToken,
) -> Result<Identity, SessionError> {
    if let Some(identity) = store.load()? {
        tracing::info!(identity = %identity.name, "using stored identity");
        return Ok(identity);
    }
    let token: BootstrapToken = token
        .ok_or_else(|| SessionError::NoIdentity(store.dir().display().to_string()))?
        .parse()?;
    // Each attempt goes to the next endpoint: one that is down costs one
    // attempt, not the enrollment.
    let urls = crate::endpoints::parse(url)?;
    let mut attempt = 0;
    loop {
        let url = &urls[attempt as usize % urls.len()];
        match enroll(role, url, &token, store, capabilities.clone()).await {
            Ok(identity) => {
                tracing::info!(identity = %identity.name, "enrolled");
                return Ok(identity);
            }
            Err(EnrollAttemptError::Fatal(e)) => return Err(e),
            Err(e) => {
                let delay = backoff.next(attempt);
                tracing::warn!(error = %e, ?delay, "enrollment attempt failed");
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return Err(SessionError::Cancelled),
                }
            }
        }
    }
}

/// Renews the certificate: a fresh key, a CSR for it, `Renew` with the
/// current certificate; the reply is checked (this key, this identity) and
/// stored as the next generation before anything uses it, and then the
/// membership's channel switches to it. A lost reply costs nothing: the
/// next heartbeat says renew again and the control plane replaces the
/// certificate it never saw used.
pub async fn renew(role: Role, membership: &Membership) -> Result<(), SessionError> {
    let current = membership.identity().ok_or(SessionError::NotEnrolled)?;
    let channel = membership.channel_now().ok_or(SessionError::NotEnrolled)?;
    let key = KeyPair::generate()?;
    let csr_pem = CertificateParams::default()
        .serialize_request(&key)
        .and_then(|csr| csr.pem())?;
    let reply = call_renew(role, channel, RenewRequest { csr_pem })
        .await
        .map_err(SessionError::Renewal)?;
    let renewed = Identity {
        name: current.name.clone(),
        key_pem: key.serialize_pem(),
        cert_pem: reply.certificate_pem,
        ca_pem: current.ca_pem.clone(),
    };
    check_renewed(&renewed)?;
    let store = membership.store().clone();
    let saved = renewed.clone();
    tokio::task::spawn_blocking(move || store.save_renewed(&saved))
        .await
        .map_err(|e| SessionError::Io(std::io::Error::other(e)))??;
    membership
        .set_identity(renewed)
        .map_err(SessionError::Url)?;
    Ok(())
}

/// A renewed certificate must certify the key just made, as the identity
/// this member already has.
fn check_renewed(identity: &Identity) -> Result<(), SessionError> {
    use rustls::pki_types::PrivateKeyDer;
    let bad = |what: &str| SessionError::BadReply(format!("renewed certificate: {what}"));
    let cert = CertificateDer::from_pem_slice(identity.cert_pem.as_bytes())
        .map_err(|e| bad(&e.to_string()))?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| bad(&e.to_string()))?;
    let name = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    if name.as_deref() != Some(identity.name.as_str()) {
        return Err(bad(&format!("names {name:?}, not {:?}", identity.name)));
    }
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
        .map_err(|e| bad(&e.to_string()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| bad(&e.to_string()))?;
    rustls::sign::CertifiedKey::new(vec![cert.into_owned()], signing)
        .keys_match()
        .map_err(|e| bad(&format!("not for the new key: {e}")))
}

/// Sends heartbeats until `shutdown`, reconnecting with jittered backoff when
/// the control plane is away, and renews the certificate when a reply says
/// so. Returns an error only when the control plane refuses this identity
/// (revoked), since retrying cannot fix that.
pub async fn heartbeat_loop(
    role: Role,
    membership: &Membership,
    // The latest facts: each beat sends what the member knows now (a
    // bridge refreshes its engines' pools while it runs).
    capabilities: tokio::sync::watch::Receiver<Capabilities>,
    backoff: Backoff,
    shutdown: CancellationToken,
) -> Result<(), SessionError> {
    // It follows renewals; one TLS session serves many beats.
    let channel = membership.channel_now().ok_or(SessionError::NotEnrolled)?;
    let mut attempt: u32 = 0;
    let mut interval = Duration::from_secs(10);
    loop {
        let req = HeartbeatRequest {
            sent_at: Some(SystemTime::now().into()),
            capabilities: Some(capabilities.borrow().clone()),
        };
        let result = call_heartbeat(role, channel.clone(), req).await;
        let delay = match result {
            Ok(reply) => {
                if attempt > 0 {
                    tracing::info!("reconnected to control plane");
                }
                attempt = 0;
                if reply.heartbeat_interval_seconds > 0 {
                    interval = Duration::from_secs(reply.heartbeat_interval_seconds.into());
                }
                tracing::debug!(?interval, "heartbeat sent");
                if reply.renew_certificate {
                    match renew(role, membership).await {
                        Ok(()) => {
                            tracing::info!("certificate renewed");
                            // The next beat is the new certificate's first
                            // use, which retires the old one: soon.
                            Duration::ZERO
                        }
                        Err(e) => {
                            // Said again on the next beat; the current
                            // certificate still works meanwhile.
                            tracing::warn!(error = %e, "certificate renewal failed; will retry");
                            interval
                        }
                    }
                } else {
                    interval
                }
            }
            Err(status) if is_refusal(status.code()) => {
                tracing::error!(%status, "control plane refused this identity");
                return Err(SessionError::Refused {
                    what: "heartbeat",
                    status,
                });
            }
            Err(status) => {
                let delay = backoff.next(attempt);
                attempt = attempt.saturating_add(1);
                tracing::warn!(%status, ?delay, "heartbeat failed; retrying");
                delay
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod renewal_tests {
    use super::*;

    fn cert_for(key: &KeyPair, name: &str) -> String {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.self_signed(key).unwrap().pem()
    }

    #[test]
    fn a_renewed_certificate_must_be_for_the_new_key_and_the_same_name() {
        let key = KeyPair::generate().unwrap();
        let other = KeyPair::generate().unwrap();
        let identity = |cert_pem: String, key: &KeyPair| Identity {
            name: "device/cam".into(),
            key_pem: key.serialize_pem(),
            cert_pem,
            ca_pem: String::new(),
        };
        check_renewed(&identity(cert_for(&key, "device/cam"), &key)).unwrap();
        for (bad, why) in [
            (
                identity(cert_for(&other, "device/cam"), &key),
                "not for the new key",
            ),
            (identity(cert_for(&key, "device/other"), &key), "names"),
            (identity("garbage".into(), &key), "renewed certificate"),
        ] {
            let err = check_renewed(&bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }
}
