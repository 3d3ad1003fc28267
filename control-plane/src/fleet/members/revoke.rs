//! Revocation: a member's certificates stop authorising anything, for
//! good (ids are never reused), and its open streams hear of it.

use time::OffsetDateTime;

use super::{Member, MemberKind};
use crate::db::Db;
use crate::fleet::{Events, FleetEvent};
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

pub async fn revoke(
    store: &Db,
    events: &Events,
    kind: MemberKind,
    id: &str,
    reason: Option<String>,
    now: OffsetDateTime,
) -> Result<Member> {
    if let Some(r) = &reason {
        validate::text("reason", r, 1024)?;
    }
    let member = store.fleet.members(kind).update(id, |m| match m {
        // Revoking twice keeps the first time and reason.
        Some(m) if m.revoked_at.is_some() => Ok(m),
        Some(m) => Ok(Member {
            revoked_at: Some(now),
            revoked_reason: reason.clone(),
            ..m
        }),
        None => Err(Error::not_found(kind.as_str(), id)),
    })??;
    store.flush().await?;
    events.publish(FleetEvent::Revoked {
        kind,
        id: id.to_string(),
    });
    Ok(member)
}
