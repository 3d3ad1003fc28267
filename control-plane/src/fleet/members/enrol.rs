//! Enrolment: a bootstrap token and a CSR become a member and its
//! certificate, once; a retry after a lost reply gets the same answer.

use edgeloop_client_core::BootstrapToken;
use edgeloop_models::Digest;
use time::{Duration, OffsetDateTime};

use super::tokens::token_refusal;
use super::{BootstrapTokenRecord, CapabilitiesRecord, EnrolledKey, Member, MemberKind};
use crate::db::Db;
use crate::fleet::pki::{self, Pki, SignedCert};
use edgeloop_errors::{Error, Result};

/// What an Enroll call presents.
pub struct Enrollment<'a> {
    pub kind: MemberKind,
    pub token: &'a str,
    pub csr_pem: &'a str,
    pub capabilities: CapabilitiesRecord,
}

/// Consumes a bootstrap token and signs the caller's CSR. The token is spent
/// only after the CSR is known to be good, so a malformed request can be retried.
pub async fn enroll(
    store: &Db,
    pki: &Pki,
    req: Enrollment<'_>,
    cert_lifetime: Duration,
    now: OffsetDateTime,
) -> Result<(Member, SignedCert)> {
    let Enrollment {
        kind,
        token,
        csr_pem,
        capabilities,
    } = req;
    let token: BootstrapToken = token
        .parse()
        .map_err(|e| Error::Unauthenticated(format!("malformed bootstrap token: {e}")))?;
    let record = store
        .fleet
        .tokens
        .get(&token.id)?
        .ok_or_else(|| Error::Unauthenticated("unknown bootstrap token".into()))?;
    let identity = kind.identity(&record.member_id);
    let key = pki::csr_key(csr_pem)?;
    if let Some(again) = retried(&record, token.secret_hash(), kind, key) {
        return finish_retry(store, &record, again, capabilities, now).await;
    }
    if let Some(refusal) = token_refusal(&record, token.secret_hash(), kind, now) {
        return Err(refusal);
    }
    let signed = pki.sign_client(csr_pem, &identity, now + cert_lifetime)?;
    let enrolled = EnrolledKey {
        key,
        certificate_pem: signed.pem.clone(),
        fingerprint: signed.fingerprint,
        not_after: signed.not_after,
    };
    // The compare-and-swap makes "works once" hold under concurrent
    // enrollments; the key and certificate go with it, so a retry of this
    // one (its reply lost) is told apart from another key.
    let spent = store
        .fleet
        .tokens
        .update(&token.id, |current| match current {
            Some(t) if t.used_at.is_none() => Ok(BootstrapTokenRecord {
                used_at: Some(now),
                enrolled: Some(enrolled.clone()),
                ..t
            }),
            _ => Err(Error::Unauthenticated(
                "bootstrap token was already used".into(),
            )),
        })?;
    spent?;
    let member = new_member(&record, kind, capabilities, &enrolled, now);
    if !store.fleet.members(kind).insert_new(&member.id, &member)? {
        return Err(Error::Conflict(format!("{identity} is already enrolled")));
    }
    store.flush().await?;
    Ok((member, signed))
}

fn new_member(
    record: &BootstrapTokenRecord,
    kind: MemberKind,
    capabilities: CapabilitiesRecord,
    enrolled: &EnrolledKey,
    now: OffsetDateTime,
) -> Member {
    Member {
        project: record.project.clone(),
        labels: record.labels.clone(),
        capabilities,
        token_id: record.id.clone(),
        ..Member::enrolled(
            &record.member_id,
            kind,
            enrolled.fingerprint,
            enrolled.not_after,
            now,
        )
    }
}

/// The first answer, when an Enroll is a retry of the one that spent this
/// token: the same secret, kind and key. Pure. A retry is answered
/// whatever the token's expiry: the secret and the private key together
/// are the member itself.
pub fn retried(
    record: &BootstrapTokenRecord,
    presented_secret_hash: Digest,
    kind: MemberKind,
    key: Digest,
) -> Option<EnrolledKey> {
    let enrolled = record.enrolled.as_ref()?;
    (record.used_at.is_some()
        && record.secret_hash == presented_secret_hash
        && record.kind == kind
        && enrolled.key == key)
        .then(|| enrolled.clone())
}

/// Answers a retried enrollment with the certificate issued the first
/// time, completing the member record if the first call stopped before
/// it. A member revoked since is refused.
async fn finish_retry(
    store: &Db,
    record: &BootstrapTokenRecord,
    enrolled: EnrolledKey,
    capabilities: CapabilitiesRecord,
    now: OffsetDateTime,
) -> Result<(Member, SignedCert)> {
    let kind = record.kind;
    let identity = kind.identity(&record.member_id);
    let member = match store.fleet.members(kind).get(&record.member_id)? {
        Some(m) if m.revoked_at.is_some() => {
            return Err(Error::PermissionDenied(format!(
                "{identity} has been revoked"
            )))
        }
        Some(m) if m.cert_fingerprint == enrolled.fingerprint => m,
        // Renewed or re-issued since: the old certificate is not handed out.
        Some(_) => {
            return Err(Error::Unauthenticated(
                "bootstrap token was already used".into(),
            ))
        }
        None => {
            let m = new_member(record, kind, capabilities, &enrolled, now);
            if !store.fleet.members(kind).insert_new(&m.id, &m)? {
                return Err(Error::Conflict(format!("{identity} is already enrolled")));
            }
            store.flush().await?;
            m
        }
    };
    tracing::info!(%identity, "enrollment retried with the same key: answered with the same certificate");
    Ok((
        member,
        SignedCert {
            pem: enrolled.certificate_pem,
            fingerprint: enrolled.fingerprint,
            not_after: enrolled.not_after,
        },
    ))
}
