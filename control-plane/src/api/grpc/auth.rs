//! Who is calling: the verified client certificate, mapped to an enrolled,
//! unrevoked member whose current (or renewed, or draining) certificate it is.

use edgeloop_models::Digest;
use tonic::Request;

use crate::error::Error;

use crate::fleet::members::{self, Member, MemberKind};
use crate::fleet::pki::identity_of;
use crate::Core;

pub fn caller<T>(core: &Core, req: &Request<T>, kind: MemberKind) -> Result<Member, Error> {
    caller_with_cert(core, req, kind).map(|(member, _)| member)
}

/// [`caller`] and the sha256 of the certificate it called with: renewal
/// and the heartbeat's renewal hint depend on which one it was.
pub fn caller_with_cert<T>(
    core: &Core,
    req: &Request<T>,
    kind: MemberKind,
) -> Result<(Member, Digest), Error> {
    let certs = req.peer_certs().filter(|c| !c.is_empty()).ok_or_else(|| {
        Error::Unauthenticated("a client certificate is required; enroll first".into())
    })?;
    // rustls has already verified the chain against our CA.
    let leaf = &certs[0];
    let identity = identity_of(leaf.as_ref());
    let fingerprint = Digest::of(leaf.as_ref());
    let member = members::authorize(
        &core.store,
        kind,
        identity.as_deref(),
        fingerprint,
        core.now(),
    )?;
    Ok((member, fingerprint))
}
