//! What a replica does with one task's lease, as a pure function of the
//! stored lease, who it is, and the time.

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

/// One background task's lease, as stored (`leases`, by task name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The replica that holds it (stable across its restarts).
    pub holder: String,
    /// The holder's process: a restart is a new incarnation.
    pub incarnation: u64,
    /// The fencing token: raised on every change of hands, never on a
    /// renewal, so a write stamped with an older token is a stale leader's.
    pub token: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// Who asks, and for how long a lease holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me {
    pub replica: String,
    pub incarnation: u64,
    pub ttl: Duration,
}

/// The lease to store (with compare-and-swap over `current`), or `None`
/// when another replica holds a live one.
///
/// - Its own lease, this process's: renewed, same token.
/// - Its own replica's, from an earlier process (the replica restarted on
///   its data): taken at once with a new token, since that process is gone
///   and waiting out its lease would only stall the work.
/// - Another replica's that has expired, or none: taken, new token.
pub fn next(current: Option<&Lease>, me: &Me, now: OffsetDateTime) -> Option<Lease> {
    let mine = |token| Lease {
        holder: me.replica.clone(),
        incarnation: me.incarnation,
        token,
        expires_at: now + me.ttl,
    };
    match current {
        None => Some(mine(1)),
        Some(l) if l.holder == me.replica && l.incarnation == me.incarnation => Some(mine(l.token)),
        Some(l) if l.holder == me.replica || l.expires_at <= now => Some(mine(l.token + 1)),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_796_083_200;

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(T0 + s).unwrap()
    }

    fn me(replica: &str, incarnation: u64) -> Me {
        Me {
            replica: replica.into(),
            incarnation,
            ttl: Duration::seconds(10),
        }
    }

    fn lease(holder: &str, incarnation: u64, token: u64, expires: i64) -> Lease {
        Lease {
            holder: holder.into(),
            incarnation,
            token,
            expires_at: at(expires),
        }
    }

    #[test]
    fn leases_change_hands_only_when_free_expired_or_the_holders_own() {
        let a = me("a", 1);
        // (stored, who asks, now, (holder, token) after or None).
        type Case<'a> = (Option<Lease>, &'a Me, i64, Option<(&'a str, u64)>);
        let cases: [Case<'_>; 7] = [
            (None, &a, 0, Some(("a", 1))),
            (Some(lease("a", 1, 4, 5)), &a, 3, Some(("a", 4))),
            (Some(lease("a", 1, 4, 5)), &a, 9, Some(("a", 4))),
            (Some(lease("a", 0, 4, 5)), &a, 3, Some(("a", 5))),
            (Some(lease("b", 7, 4, 5)), &a, 4, None),
            (Some(lease("b", 7, 4, 5)), &a, 5, Some(("a", 5))),
            (Some(lease("b", 7, 4, 5)), &a, 60, Some(("a", 5))),
        ];
        for (i, (stored, who, now, want)) in cases.into_iter().enumerate() {
            let got = next(stored.as_ref(), who, at(now));
            assert_eq!(
                got.as_ref().map(|l| (l.holder.as_str(), l.token)),
                want,
                "case {i}"
            );
            if let Some(l) = got {
                assert_eq!(l.expires_at, at(now + 10), "case {i}: ttl from now");
                assert_eq!(l.incarnation, who.incarnation, "case {i}");
            }
        }
    }
}
