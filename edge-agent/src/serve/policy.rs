//! When a worker stops waiting and runs what is queued: a pure function of
//! the queue, the clock and how many workers are busy, so the rule is
//! tested with a table instead of with sleeps.
//!
//! The rule: a full batch runs at once; otherwise, if no other worker is
//! running, the batch runs at once too (waiting would only leave the
//! hardware idle and add latency at low load); otherwise the worker waits
//! for more requests until the oldest queued one has waited
//! `max_queue_delay`. Batches form under load, where requests arrive faster
//! than the workers finish, and never delay a lone request.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Most rows (dim-0 entries, summed over requests) in one run; 1 turns
    /// batching off.
    pub max_batch_size: usize,
    pub max_queue_delay: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Nothing queued: sleep until a request arrives.
    Idle,
    /// Take this many requests from the front of the queue and run them.
    Now(usize),
    /// Sleep until then (or until a request arrives), then decide again.
    WaitUntil(Instant),
}

/// Decides what a free worker does.
///
/// `rows` gives each queued request's rows, oldest first (it is read only as
/// far as one batch reaches); `oldest` is when the first was queued; `busy`
/// counts the workers running a batch now; `closing` is set once the version
/// stops taking requests, when nothing more will come to wait for.
/// A request with more rows than `max_batch_size` runs alone.
pub fn decide(
    policy: &BatchPolicy,
    rows: impl IntoIterator<Item = usize>,
    oldest: Instant,
    busy: usize,
    closing: bool,
    now: Instant,
) -> Flush {
    let max = policy.max_batch_size.max(1);
    let (mut take, mut sum, mut full) = (0usize, 0usize, false);
    for r in rows {
        if take > 0 && sum.saturating_add(r) > max {
            // The next request does not fit: this batch is as full as it gets.
            full = true;
            break;
        }
        take += 1;
        sum = sum.saturating_add(r);
        if sum >= max {
            full = true;
            break;
        }
    }
    if take == 0 {
        return Flush::Idle;
    }
    if full || busy == 0 || closing {
        return Flush::Now(take);
    }
    let deadline = oldest + policy.max_queue_delay;
    if now >= deadline {
        Flush::Now(take)
    } else {
        Flush::WaitUntil(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_table() {
        // The injected clock: every instant is an offset from one origin.
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let policy = BatchPolicy {
            max_batch_size: 8,
            max_queue_delay: Duration::from_micros(500),
        };
        let off = BatchPolicy {
            max_batch_size: 1,
            ..policy
        };
        // (policy, rows queued, busy workers, closing, now (µs after the oldest arrived), want)
        type Case = (BatchPolicy, &'static [usize], usize, bool, u64, Flush);
        let cases: &[Case] = &[
            (policy, &[], 1, false, 0, Flush::Idle),
            (policy, &[], 0, true, 900, Flush::Idle),
            // Nobody else is working: a lone request does not wait.
            (policy, &[1], 0, false, 0, Flush::Now(1)),
            (policy, &[1, 1, 1], 0, false, 0, Flush::Now(3)),
            // Another worker is busy: wait for company until the delay is up...
            (policy, &[1], 1, false, 0, Flush::WaitUntil(at(500))),
            (policy, &[1, 1], 1, false, 499, Flush::WaitUntil(at(500))),
            (policy, &[1, 1], 1, false, 500, Flush::Now(2)),
            (policy, &[1, 1], 1, false, 10_000, Flush::Now(2)),
            // ...or until the batch is full.
            (policy, &[1; 8], 1, false, 0, Flush::Now(8)),
            (policy, &[1; 20], 1, false, 0, Flush::Now(8)),
            (policy, &[4, 4, 4], 1, false, 0, Flush::Now(2)),
            // The next one would overflow the batch: run what fits.
            (policy, &[3, 3, 3], 1, false, 0, Flush::Now(2)),
            // Too big for any batch: runs alone, at once.
            (policy, &[20, 1], 1, false, 0, Flush::Now(1)),
            (policy, &[0, 0], 1, false, 0, Flush::WaitUntil(at(500))),
            // Closing: nothing more will come, so do not wait.
            (policy, &[1], 1, true, 0, Flush::Now(1)),
            // Batching off: always one request, never a wait.
            (off, &[1, 1, 1], 1, false, 0, Flush::Now(1)),
            (off, &[5], 3, false, 0, Flush::Now(1)),
        ];
        for (i, (policy, rows, busy, closing, now, want)) in cases.iter().enumerate() {
            let got = decide(policy, rows.iter().copied(), t0, *busy, *closing, at(*now));
            assert_eq!(
                got, *want,
                "case {i}: rows {rows:?}, busy {busy}, t+{now}µs"
            );
        }
    }
}
