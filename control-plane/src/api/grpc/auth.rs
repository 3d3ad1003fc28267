//! Who is calling: the verified client certificate, mapped to an enrolled,
//! unrevoked member whose pinned certificate it is.

use edgeloop_models::Digest;
use tonic::Request;

use crate::error::Error;

use crate::fleet::members::{self, Member, MemberKind};
use crate::fleet::pki::identity_of;
use crate::Core;

pub fn caller<T>(core: &Core, req: &Request<T>, kind: MemberKind) -> Result<Member, Error> {
    let certs = req.peer_certs().filter(|c| !c.is_empty()).ok_or_else(|| {
        Error::Unauthenticated("a client certificate is required; enroll first".into())
    })?;
    // rustls has already verified the chain against our CA.
    let leaf = &certs[0];
    let identity = identity_of(leaf.as_ref());
    members::authorize(
        &core.store,
        kind,
        identity.as_deref(),
        Digest::of(leaf.as_ref()),
    )
}
