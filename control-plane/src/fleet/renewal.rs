//! Certificate renewal. A member's certificate lasts `--cert-lifetime-days`
//! (365); past two thirds of that, by the control plane's clock (device
//! clocks drift), each heartbeat answers `renew_certificate`, and the
//! member calls `Renew` with its current certificate and a CSR for a fresh
//! key. The new certificate waits as the member's *pending* one: the old
//! stays valid until the new one is first used, then for [`DRAIN`] more
//! (calls already in flight on the member's old connections), or until it
//! expires, whichever comes first. A revoked member cannot renew: its
//! certificate no longer authorizes anything, `Renew` included.
//!
//! The decisions ([`renewal_due`], [`admit`], [`promote`]) are pure
//! functions of the member record and `now`; [`renew`] does the I/O.

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::db::Db;
use crate::fleet::members::{Member, MemberKind};
use crate::fleet::pki::{self, Pki, SignedCert};
use edgeloop_errors::{Error, Result};

/// How long a replaced certificate still works after its successor's first
/// use: long enough for a call that left on an old connection just before
/// the switch, far too short to matter if the old key leaked.
pub const DRAIN: Duration = Duration::seconds(120);

/// A renewed certificate the member has not used yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCert {
    /// sha256 of the public key it certifies: a retried `Renew` with the
    /// same key (its reply lost) gets the same certificate back.
    pub key: Digest,
    pub certificate_pem: String,
    pub fingerprint: Digest,
    #[serde(with = "time::serde::rfc3339")]
    pub not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
}

/// The certificate a renewal replaced, for the [`DRAIN`] after the switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousCert {
    pub fingerprint: Digest,
    #[serde(with = "time::serde::rfc3339")]
    pub valid_until: OffsetDateTime,
}

/// Whether a certificate from `not_before` to `not_after` is due for
/// renewal at `now`: two thirds of its lifetime have passed. Pure.
pub fn renewal_due(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
) -> bool {
    now >= not_before + (not_after - not_before) * 2 / 3
}

/// When the member's current certificate started: recorded since renewal
/// came in; the enrollment time for records from before.
pub fn cert_not_before(m: &Member) -> OffsetDateTime {
    m.cert_not_before.unwrap_or(m.enrolled_at)
}

/// What a certificate with `fingerprint` may do as member `m` at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The member's current certificate.
    Current,
    /// The renewed certificate, used for the first time: it becomes current.
    FirstUseOfRenewed,
    /// The certificate a renewal replaced, within its drain.
    Draining,
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Expired,
    /// Replaced by a renewal (and past its drain), or never this member's.
    Superseded,
}

/// Decides what a verified certificate may do as `m` at `now`. Pure.
/// Revocation is checked before this, by the caller.
pub fn admit(m: &Member, fingerprint: Digest, now: OffsetDateTime) -> Admission {
    if fingerprint == m.cert_fingerprint {
        return if now >= m.cert_not_after {
            Admission::Refused(Refusal::Expired)
        } else {
            Admission::Current
        };
    }
    if let Some(p) = m
        .pending_cert
        .as_ref()
        .filter(|p| p.fingerprint == fingerprint)
    {
        return if now >= p.not_after {
            Admission::Refused(Refusal::Expired)
        } else {
            Admission::FirstUseOfRenewed
        };
    }
    match &m.previous_cert {
        Some(p) if p.fingerprint == fingerprint && now < p.valid_until => Admission::Draining,
        Some(p) if p.fingerprint == fingerprint => Admission::Refused(Refusal::Expired),
        _ => Admission::Refused(Refusal::Superseded),
    }
}

/// `m` with its pending certificate made current at `now`; the old one
/// drains. Unchanged when nothing is pending. Pure.
pub fn promote(m: Member, now: OffsetDateTime) -> Member {
    let Some(p) = m.pending_cert.clone() else {
        return m;
    };
    Member {
        previous_cert: Some(PreviousCert {
            fingerprint: m.cert_fingerprint,
            valid_until: (now + DRAIN).min(m.cert_not_after),
        }),
        cert_fingerprint: p.fingerprint,
        cert_not_after: p.not_after,
        cert_not_before: Some(p.not_before),
        pending_cert: None,
        ..m
    }
}

/// Applies [`admit`] to `member` as read from the store: the member as
/// the caller may act, a renewed certificate's first use promoted (see
/// [`promote_in_store`]), or the refusal. Revocation is checked before
/// this, by the caller.
pub fn admit_in_store(
    store: &Db,
    member: Member,
    fingerprint: Digest,
    now: OffsetDateTime,
) -> Result<Member> {
    let identity = member.kind.identity(&member.id);
    match admit(&member, fingerprint, now) {
        Admission::Current | Admission::Draining => Ok(member),
        Admission::FirstUseOfRenewed => {
            let member = promote_in_store(store, member.kind, &member.id, fingerprint, now)?;
            tracing::info!(%identity, "renewed certificate in use; the old one drains");
            Ok(member)
        }
        Admission::Refused(Refusal::Expired) => Err(Error::Unauthenticated(format!(
            "this certificate for {identity} has expired"
        ))),
        Admission::Refused(Refusal::Superseded) => Err(Error::Unauthenticated(format!(
            "this certificate is no longer valid for {identity}"
        ))),
    }
}

/// Whether a heartbeat made with the certificate `presented` tells `m`
/// to renew at `now`. Only the current certificate is told: one draining
/// has a successor already. Pure.
pub fn renew_hint(m: &Member, presented: Digest, now: OffsetDateTime) -> bool {
    presented == m.cert_fingerprint && renewal_due(cert_not_before(m), m.cert_not_after, now)
}

/// Signs a new certificate for the key in `csr_pem`, as the pending one of
/// `member`, who called with its current certificate `presented`. Flushed
/// before the reply: a member holding a certificate the store forgot would
/// be locked out once its old one ended.
pub async fn renew(
    store: &Db,
    pki: &Pki,
    member: &Member,
    presented: Digest,
    csr_pem: &str,
    lifetime: Duration,
    now: OffsetDateTime,
) -> Result<SignedCert> {
    let kind = member.kind;
    let identity = kind.identity(&member.id);
    if presented != member.cert_fingerprint {
        // Renewed already: this is the replaced certificate, draining.
        return Err(Error::Conflict(format!(
            "{identity} was renewed already; call with the new certificate"
        )));
    }
    let key = pki::csr_key(csr_pem)?;
    // The store's record, not the caller's copy: a retry must see the
    // pending certificate its lost first call left there.
    let stored = store.fleet.members(kind).get(&member.id)?;
    if let Some(p) = stored
        .as_ref()
        .and_then(|m| m.pending_cert.as_ref())
        .filter(|p| p.key == key)
    {
        return Ok(signed(p));
    }
    let cert = pki.sign_client(csr_pem, &identity, now + lifetime)?;
    let pending = PendingCert {
        key,
        certificate_pem: cert.pem.clone(),
        fingerprint: cert.fingerprint,
        not_before: now,
        not_after: cert.not_after,
    };
    store.fleet.members(kind).update(&member.id, |m| match m {
        Some(m) if m.revoked_at.is_some() => Err(Error::PermissionDenied(format!(
            "{identity} has been revoked"
        ))),
        // A renewal's first use (or another renewal) landed meanwhile.
        Some(m) if m.cert_fingerprint != presented => Err(Error::Unavailable(format!(
            "{identity}'s certificate changed during the renewal; renew again"
        ))),
        Some(m) => Ok(Member {
            pending_cert: Some(pending.clone()),
            ..m
        }),
        None => Err(Error::not_found(kind.as_str(), &member.id)),
    })??;
    store.flush().await?;
    tracing::info!(%identity, not_after = %cert.not_after, "certificate renewed; the old one works until the new one is used");
    Ok(cert)
}

fn signed(p: &PendingCert) -> SignedCert {
    SignedCert {
        pem: p.certificate_pem.clone(),
        fingerprint: p.fingerprint,
        not_after: p.not_after,
    }
}

/// Makes `kind/id`'s pending certificate current, if it is still the one
/// with `fingerprint` (a compare-and-swap: concurrent first uses promote
/// once). Not flushed: lost in a crash, the next call with the new
/// certificate promotes it again.
pub fn promote_in_store(
    store: &Db,
    kind: MemberKind,
    id: &str,
    fingerprint: Digest,
    now: OffsetDateTime,
) -> Result<Member> {
    store.fleet.members(kind).update(id, |m| match m {
        Some(m)
            if m.pending_cert
                .as_ref()
                .is_some_and(|p| p.fingerprint == fingerprint) =>
        {
            Ok(promote(m, now))
        }
        Some(m) if m.cert_fingerprint == fingerprint => Ok(m),
        Some(_) => Err(Error::Unauthenticated(format!(
            "this certificate is no longer valid for {}",
            kind.identity(id)
        ))),
        None => Err(Error::Unauthenticated(format!(
            "{} is not enrolled",
            kind.identity(id)
        ))),
    })?
}

#[cfg(test)]
mod tests;
