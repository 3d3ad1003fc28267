//! Who is calling: the verified client certificate, mapped to an enrolled,
//! unrevoked member whose current (or renewed, or draining) certificate it is.

use edgeloop_models::Digest;
use tonic::Request;

use edgeloop_errors::Error;

use crate::fleet::members::{self, Authorized, Member, MemberKind};
use crate::fleet::pki::identity_of;
use crate::Core;

pub fn caller<T>(core: &Core, req: &Request<T>, kind: MemberKind) -> Result<Member, Error> {
    caller_with_cert(core, req, kind).map(|a| a.member)
}

/// [`caller`], with the certificate it called with and whether that one
/// is due for renewal: renewal and the heartbeat's answer depend on them.
pub fn caller_with_cert<T>(
    core: &Core,
    req: &Request<T>,
    kind: MemberKind,
) -> Result<Authorized, Error> {
    let certs = req.peer_certs().filter(|c| !c.is_empty()).ok_or_else(|| {
        Error::Unauthenticated("a client certificate is required; enroll first".into())
    })?;
    // rustls has already verified the chain against our CA.
    let leaf = &certs[0];
    let identity = identity_of(leaf.as_ref());
    let fingerprint = Digest::of(leaf.as_ref());
    members::authorize(
        &core.store,
        kind,
        identity.as_deref(),
        fingerprint,
        core.now(),
    )
}
