//! What a device may report about: only model versions that are, or were,
//! assigned to it, within a per-model quota. A device's certificate proves
//! who it is, not what it runs, so a report naming another model (to
//! poison its retrain snapshots, online accuracy, label counts or rollout
//! gates) is refused item by item and counted; the rest of the report is
//! kept, so an honest device's store-and-forward queue never jams.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use time::OffsetDateTime;

use crate::db::Db;
use edgeloop_errors::Result;

/// `<device>/<model>/<version>`: the history of assignments, which only
/// grows (a version rolled away from still gets its late reports).
pub fn history_key(device: &str, model: &str, version: &str) -> String {
    format!("{device}/{model}/{version}")
}

/// Records that `device` was assigned `model` `version`. Written before
/// the assignment itself, so a stored assignment always has its history.
pub fn remember(store: &Db, device: &str, model: &str, version: &str) -> Result<()> {
    let key = history_key(device, model, version);
    if !store.fleet.assigned_history.contains(&key)? {
        store.fleet.assigned_history.insert(&key, &())?;
    }
    Ok(())
}

/// [`remember`] of many `(device, model, version)` at once: one read of
/// them all, one write of those not yet remembered (a rollout wave).
pub fn remember_many(store: &Db, assigned: &[(&str, &str, &str)]) -> Result<()> {
    let keys: Vec<String> = assigned
        .iter()
        .map(|(d, m, v)| history_key(d, m, v))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let known = store.fleet.assigned_history.get_many(&refs)?;
    let new: Vec<(&str, &())> = refs
        .iter()
        .zip(known)
        .filter(|(_, k)| k.is_none())
        .map(|(key, _)| (*key, &()))
        .collect();
    store.fleet.assigned_history.insert_many(&new)?;
    Ok(())
}

/// For a data dir from before the history existed: what devices are
/// assigned now, and what they reported running, counts as assigned. Runs
/// only while the history is empty. Returns the pairs written.
pub fn backfill(store: &Db) -> Result<usize> {
    if !store.fleet.assigned_history.is_empty()? {
        return Ok(0);
    }
    let mut n = 0;
    for (device, set) in store.fleet.assignments.scan_prefix("")? {
        for a in set.assignments {
            remember(store, &device, &a.model_name, &a.model_version)?;
            n += 1;
        }
    }
    for (_, s) in store.fleet.assignment_status.scan_prefix("")? {
        for v in std::iter::once(&s.model_version).chain(s.running_version.as_ref()) {
            if !v.is_empty() {
                remember(store, &s.device, &s.model_name, v)?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Whether `device` was ever assigned `model` `version`; memoised per
/// report, since a report names few pairs many times.
pub struct Assigned<'a> {
    store: &'a Db,
    device: &'a str,
    seen: BTreeMap<(String, String), bool>,
}

impl<'a> Assigned<'a> {
    pub fn new(store: &'a Db, device: &'a str) -> Self {
        Assigned {
            store,
            device,
            seen: BTreeMap::new(),
        }
    }

    pub fn check(&mut self, model: &str, version: &str) -> Result<bool> {
        let k = (model.to_string(), version.to_string());
        if let Some(&v) = self.seen.get(&k) {
            return Ok(v);
        }
        let v = self.store.fleet.assigned_history.contains(&history_key(
            self.device,
            model,
            version,
        ))?;
        self.seen.insert(k, v);
        Ok(v)
    }

    /// Whether any version of `model` was ever assigned (for status
    /// reports, which may name the version being replaced).
    pub fn any_version(&self, model: &str) -> Result<bool> {
        Ok(!self
            .store
            .fleet
            .assigned_history
            .first_with_prefix(&format!("{}/{model}/", self.device), 1)?
            .is_empty())
    }
}

/// Per device and model, how many sketches and samples an hour it may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub sketches_per_hour: u32,
    pub samples_per_hour: u32,
    /// Telemetry bytes (encoded reports) each device may send an hour; a
    /// report past it is refused whole (RESOURCE_EXHAUSTED) and the agent
    /// retries it later. At least one report's size (8 MiB).
    pub telemetry_bytes_per_hour: u32,
}

impl Default for Quota {
    /// An agent closes a sketch window every minute or so (60 an hour), and
    /// sends at most a few hundred hard examples and feedback rows a
    /// minute; these leave ten times that headroom.
    fn default() -> Self {
        Quota {
            sketches_per_hour: 3_600,
            samples_per_hour: 36_000,
            // ~290 KB/s sustained: a window's report with its samples
            // every 30 s is well under it, and an agent back from a day
            // offline catches up within hours, not at once.
            telemetry_bytes_per_hour: 1 << 30,
        }
    }
}

/// A token bucket: `tokens` left at `at`. Refills at `per_hour` an hour,
/// holding at most an hour's worth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub at: OffsetDateTime,
}

/// How many of `wanted` the bucket admits at `now`, and the bucket after.
/// Pure; a clock that went backwards refills nothing.
pub fn admit(b: Option<Bucket>, per_hour: u32, wanted: u64, now: OffsetDateTime) -> (u64, Bucket) {
    let cap = f64::from(per_hour);
    let tokens = match b {
        None => cap,
        Some(b) => {
            let elapsed = (now - b.at).as_seconds_f64().max(0.0);
            (b.tokens + elapsed * cap / 3600.0).min(cap)
        }
    };
    let admitted = (tokens.floor() as u64).min(wanted);
    (
        admitted,
        Bucket {
            tokens: tokens - admitted as f64,
            at: now.max(b.map_or(now, |b| b.at)),
        },
    )
}

/// Whether the bucket holds all of `wanted` at `now` (taking it), and the
/// bucket after: for what is admitted whole or not at all. Pure.
pub fn admit_whole(
    b: Option<Bucket>,
    per_hour: u32,
    wanted: u64,
    now: OffsetDateTime,
) -> (bool, Bucket) {
    let (available, refilled) = admit(b, per_hour, 0, now);
    debug_assert_eq!(available, 0);
    if refilled.tokens >= wanted as f64 {
        (
            true,
            Bucket {
                tokens: refilled.tokens - wanted as f64,
                ..refilled
            },
        )
    } else {
        (false, refilled)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Sketch,
    Sample,
}

/// The buckets, in memory: a restart refills them, which costs at most an
/// hour's quota once.
#[derive(Debug, Default)]
pub struct Quotas {
    buckets: Mutex<HashMap<(String, String, Kind), Bucket>>,
    /// Telemetry bytes, per device.
    bytes: Mutex<HashMap<String, Bucket>>,
}

impl Quotas {
    /// Admits a telemetry report of `bytes` from `device`, whole or not.
    pub fn take_report(&self, quota: Quota, device: &str, bytes: u64, now: OffsetDateTime) -> bool {
        let mut buckets = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let (ok, after) = admit_whole(
            buckets.get(device).copied(),
            quota.telemetry_bytes_per_hour,
            bytes,
            now,
        );
        buckets.insert(device.to_string(), after);
        ok
    }

    /// Admits up to `wanted` items of `kind` for `device`'s `model`.
    pub fn take(
        &self,
        quota: Quota,
        device: &str,
        model: &str,
        kind: Kind,
        wanted: u64,
        now: OffsetDateTime,
    ) -> u64 {
        let per_hour = match kind {
            Kind::Sketch => quota.sketches_per_hour,
            Kind::Sample => quota.samples_per_hour,
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let key = (device.to_string(), model.to_string(), kind);
        let (admitted, after) = admit(buckets.get(&key).copied(), per_hour, wanted, now);
        buckets.insert(key, after);
        admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;
    use time::Duration;

    #[test]
    fn the_bucket_admits_an_hours_worth_then_its_refill() {
        let t0 = datetime!(2026-01-01 0:00 UTC);
        let s = |n: i64| t0 + Duration::seconds(n);
        // (bucket before, wanted, now) -> admitted, tokens after
        let full = None;
        let empty = Some(Bucket {
            tokens: 0.0,
            at: t0,
        });
        let table: &[(Option<Bucket>, u64, OffsetDateTime, u64, f64)] = &[
            (full, 10, t0, 10, 3590.0),
            (full, 5000, t0, 3600, 0.0),
            (empty, 5, s(1), 1, 0.0),
            (empty, 5, s(10), 5, 5.0),
            (empty, 99_999, s(7200), 3600, 0.0),
            // A clock that went backwards refills nothing.
            (empty, 5, t0 - Duration::hours(1), 0, 0.0),
        ];
        for (b, wanted, now, admitted, left) in table {
            let (a, after) = admit(*b, 3600, *wanted, *now);
            assert_eq!(
                (a, after.tokens),
                (*admitted, *left),
                "{b:?} {wanted} {now}"
            );
        }
    }

    #[test]
    fn a_report_is_admitted_whole_or_not_at_all() {
        let t0 = datetime!(2026-01-01 0:00 UTC);
        let s = |n: i64| t0 + Duration::seconds(n);
        let half = Some(Bucket {
            tokens: 1800.0,
            at: t0,
        });
        // (bucket before, wanted, now) -> admitted, tokens after
        let table: &[(Option<Bucket>, u64, OffsetDateTime, bool, f64)] = &[
            (None, 3600, t0, true, 0.0),
            (None, 3601, t0, false, 3600.0),
            (half, 1800, t0, true, 0.0),
            (half, 1801, t0, false, 1800.0),
            // The refill counts first: a second later, one more fits.
            (half, 1801, s(1), true, 0.0),
            (half, 1, t0 - Duration::hours(1), true, 1799.0),
        ];
        for (b, wanted, now, ok, left) in table {
            let (a, after) = admit_whole(*b, 3600, *wanted, *now);
            assert_eq!((a, after.tokens), (*ok, *left), "{b:?} {wanted} {now}");
        }
        let q = Quotas::default();
        let quota = Quota {
            telemetry_bytes_per_hour: 100,
            ..Quota::default()
        };
        assert!(q.take_report(quota, "a", 60, t0));
        assert!(!q.take_report(quota, "a", 60, t0), "a's hour is spent");
        assert!(q.take_report(quota, "b", 60, t0), "b has its own");
        assert!(q.take_report(quota, "a", 60, s(36 * 20)));
    }

    #[test]
    fn quotas_are_per_device_model_and_kind() {
        let q = Quotas::default();
        let quota = Quota {
            sketches_per_hour: 2,
            samples_per_hour: 3,
            telemetry_bytes_per_hour: 100,
        };
        let t = datetime!(2026-01-01 0:00 UTC);
        assert_eq!(q.take(quota, "d1", "m", Kind::Sample, 5, t), 3);
        assert_eq!(q.take(quota, "d1", "m", Kind::Sample, 5, t), 0);
        assert_eq!(q.take(quota, "d1", "m", Kind::Sketch, 5, t), 2);
        assert_eq!(q.take(quota, "d1", "other", Kind::Sample, 5, t), 3);
        assert_eq!(q.take(quota, "d2", "m", Kind::Sample, 5, t), 3);
    }
}
