//! Who may call: a verified client certificate's identity, mapped to an
//! enrolled, unrevoked member whose certificate it is (what a certificate
//! may do is renewal's decision, asked once from here).

use edgeloop_models::Digest;
use time::OffsetDateTime;

use super::{Member, MemberKind};
use crate::db::Db;
use crate::fleet::renewal;
use edgeloop_errors::{Error, Result};

/// A certificate allowed to act as its member.
#[derive(Debug, Clone)]
pub struct Authorized {
    /// As stored, with a renewed certificate's first use applied.
    pub member: Member,
    /// sha256 of the certificate it called with: renewal depends on
    /// which of the member's certificates it was.
    pub fingerprint: Digest,
    /// Whether a heartbeat answers `renew_certificate` (see
    /// [`renewal::renew_hint`]).
    pub renew_certificate: bool,
}

/// Decides whether a verified client certificate may act as a member at
/// `now` (see [`renewal::admit_in_store`]: a renewed certificate's first
/// use makes it the member's current one).
pub fn authorize(
    store: &Db,
    kind: MemberKind,
    cert_identity: Option<&str>,
    cert_fingerprint: Digest,
    now: OffsetDateTime,
) -> Result<Authorized> {
    let identity = cert_identity
        .ok_or_else(|| Error::Unauthenticated("client certificate has no identity".into()))?;
    let (cert_kind, id) = MemberKind::parse_identity(identity)
        .ok_or_else(|| Error::Unauthenticated(format!("unrecognised identity {identity:?}")))?;
    if cert_kind != kind {
        return Err(Error::PermissionDenied(format!(
            "{identity} may not call the {} service",
            kind.as_str()
        )));
    }
    let member = store
        .fleet
        .members(kind)
        .get(id)?
        .ok_or_else(|| Error::Unauthenticated(format!("{identity} is not enrolled")))?;
    if member.revoked_at.is_some() {
        return Err(Error::PermissionDenied(format!(
            "{identity} has been revoked"
        )));
    }
    let member = renewal::admit_in_store(store, member, cert_fingerprint, now)?;
    Ok(Authorized {
        renew_certificate: renewal::renew_hint(&member, cert_fingerprint, now),
        member,
        fingerprint: cert_fingerprint,
    })
}
