//! The audit log: every state-changing console call, who made it (token
//! id), what (method and route), on what (the path), with what result, and
//! when. Append-only: nothing edits or deletes an entry but retention,
//! which drops the oldest by age and by count.

use edgeloop_api::access::{AuditEntry, AuditResult};
use time::{Duration, OffsetDateTime};

use crate::Trees;
use edgeloop_errors::Result;

/// How long and how many entries are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_entries: u64,
}

impl Default for Retention {
    /// Thirteen months: a year of history plus the month an annual review
    /// takes. A million entries is about 300 MB of JSON.
    fn default() -> Self {
        Retention {
            max_age: Duration::days(400),
            max_entries: 1_000_000,
        }
    }
}

/// Keys sort as the sequence: zero-padded.
fn key(seq: u64) -> String {
    format!("{seq:020}")
}

pub struct Call<'a> {
    pub token_id: &'a str,
    pub token_name: &'a str,
    pub method: &'a str,
    pub route: &'a str,
    pub target: &'a str,
    pub status: u16,
}

/// Appends one entry and makes it durable before the call is answered, so
/// an acknowledged change is never missing from the log.
pub async fn record(store: &Trees, call: Call<'_>, now: OffsetDateTime) -> Result<()> {
    let seq = store.next_id()?;
    let entry = AuditEntry {
        seq,
        at: now,
        token_id: call.token_id.to_string(),
        token_name: call.token_name.to_string(),
        method: call.method.to_string(),
        route: call.route.to_string(),
        target: call.target.to_string(),
        status: call.status,
        result: AuditResult::of_status(call.status),
    };
    store.audit.insert(&key(seq), &entry)?;
    store.flush().await?;
    Ok(())
}

/// Newest first, `limit` entries with `seq` below `before`, optionally of
/// one token only. Reads pages of the log until the page is full, so a
/// filter over a long log costs what it skips, not the whole log.
pub fn list(
    store: &Trees,
    before: Option<u64>,
    token_id: Option<&str>,
    limit: usize,
) -> Result<Vec<AuditEntry>> {
    let mut out = Vec::new();
    let mut cursor = before.map(key);
    loop {
        let page = store.audit.page_rev_before(cursor.as_deref(), 512)?;
        let Some((last, _)) = page.last() else {
            return Ok(out);
        };
        cursor = Some(last.clone());
        for (_, e) in page {
            if token_id.is_none_or(|t| e.token_id == t) {
                out.push(e);
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
    }
}

/// How many of the oldest entries retention drops, given the oldest ones'
/// times (oldest first), how many there are, and now. Pure.
pub fn to_drop(oldest: &[OffsetDateTime], len: u64, now: OffsetDateTime, r: Retention) -> u64 {
    let over_count = len.saturating_sub(r.max_entries);
    let too_old = oldest
        .iter()
        .take_while(|at| now - **at > r.max_age)
        .count() as u64;
    over_count.max(too_old).min(len)
}

/// One retention pass: drops what [`to_drop`] says, in batches. Returns
/// how many entries went. Blocking (it counts the log); the caller
/// flushes.
pub fn prune(store: &Trees, r: Retention, now: OffsetDateTime) -> Result<u64> {
    const BATCH: usize = 1024;
    let mut dropped = 0;
    loop {
        let len = store.audit.len()? as u64;
        let oldest = store.audit.first(BATCH)?;
        let times: Vec<_> = oldest.iter().map(|(_, e)| e.at).collect();
        let n = to_drop(&times, len, now, r).min(BATCH as u64);
        if n == 0 {
            break;
        }
        for (k, _) in oldest.iter().take(n as usize) {
            store.audit.remove(k)?;
        }
        dropped += n;
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn retention_drops_by_age_and_by_count() {
        let now = datetime!(2027-01-01 0:00 UTC);
        let r = Retention {
            max_age: Duration::days(10),
            max_entries: 5,
        };
        let d = |days: i64| now - Duration::days(days);
        let table: &[(&[OffsetDateTime], u64, u64)] = &[
            (&[], 0, 0),
            (&[d(3), d(2), d(1)], 3, 0),
            (&[d(11), d(10), d(1)], 3, 1),
            (&[d(30), d(20), d(11), d(1)], 4, 3),
            (&[d(1), d(1)], 7, 2),
            (&[d(12), d(1)], 7, 2),
            (&[d(12), d(11), d(11), d(1)], 6, 3),
            (&[d(99), d(99)], 2, 2),
        ];
        for (oldest, len, want) in table {
            assert_eq!(to_drop(oldest, *len, now, r), *want, "{oldest:?} of {len}");
        }
    }

    #[tokio::test]
    async fn entries_page_newest_first_and_retention_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Trees::open(&edgeloop_store::Store::open(&dir.path().join("db")).unwrap()).unwrap();
        let t0 = datetime!(2026-01-01 0:00 UTC);
        for i in 0..20i64 {
            let token = if i % 2 == 0 { "k-1" } else { "k-2" };
            let call = Call {
                token_id: token,
                token_name: "ci",
                method: "POST",
                route: "/api/v1/models",
                target: "/api/v1/models",
                status: 201,
            };
            record(&store, call, t0 + Duration::days(i)).await.unwrap();
        }
        let first = list(&store, None, None, 5).unwrap();
        assert_eq!(first.len(), 5);
        assert!(first.windows(2).all(|w| w[0].seq > w[1].seq));
        assert_eq!(first[0].at, t0 + Duration::days(19));
        let next = list(&store, Some(first[4].seq), None, 100).unwrap();
        assert_eq!(next.len(), 15);
        assert!(next[0].seq < first[4].seq);
        let k2 = list(&store, None, Some("k-2"), 100).unwrap();
        assert_eq!(k2.len(), 10);
        assert!(k2.iter().all(|e| e.token_id == "k-2"));

        let r = Retention {
            max_age: Duration::days(10),
            max_entries: 8,
        };
        // Day 19 is now: days 0..=8 are over 10 days old; the count cap
        // then keeps 8 of the remaining 11.
        let dropped = prune(&store, r, t0 + Duration::days(19)).unwrap();
        assert_eq!(dropped, 12);
        let left = list(&store, None, None, 100).unwrap();
        assert_eq!(left.len(), 8);
        assert_eq!(left.last().unwrap().at, t0 + Duration::days(12));
    }
}
