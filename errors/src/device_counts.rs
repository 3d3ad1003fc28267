//! Counts that devices report (requests, errors, histogram bins, class
//! counts), added without wrapping. They are untrusted `u64`s: a sketch
//! with counts near `u64::MAX` would panic a debug build's `+` and wrap a
//! release build's, turning a huge window into a tiny one. So a single
//! report whose own counts cannot be totalled is refused at the door
//! ([`refused`]), and sums over many reports (windows, groups, a month of
//! traffic) hold at `u64::MAX` ([`Adder`]): a total never goes down.
//!
//! Both are counted for `/metrics`. The counters are the process's, not a
//! server's `Core`'s: the sums run in pure functions far from any handler
//! (drift windows kept as sketches arrive, cost estimates), and a count of
//! what this process saturated is what an operator wants to see.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

static SATURATED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Adds device-reported counts, holding at `u64::MAX` instead of wrapping.
/// A sum that held is counted once, when the adder is dropped, however
/// many of its additions saturated: one count per saturated sum.
#[derive(Debug, Default)]
pub struct Adder {
    saturated: bool,
}

impl Adder {
    /// `*to += n`, held at `u64::MAX`.
    pub fn add(&mut self, to: &mut u64, n: u64) {
        *to = self.plus(*to, n);
    }

    /// `a + n`, held at `u64::MAX`.
    pub fn plus(&mut self, a: u64, n: u64) -> u64 {
        a.checked_add(n).unwrap_or_else(|| {
            self.saturated = true;
            u64::MAX
        })
    }

    /// The total of `counts`, held at `u64::MAX`.
    pub fn sum(&mut self, counts: impl IntoIterator<Item = u64>) -> u64 {
        counts.into_iter().fold(0, |a, n| self.plus(a, n))
    }

    /// Whether an addition so far held at `u64::MAX`.
    #[cfg(test)]
    pub fn saturated(&self) -> bool {
        self.saturated
    }
}

impl Drop for Adder {
    fn drop(&mut self) {
        if self.saturated {
            SATURATED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The total of one report's `counts`, or `None` (counted as refused) when
/// they do not fit in a `u64`: the report is refused, not stored.
pub fn total_or_refuse(counts: impl IntoIterator<Item = u64>) -> Option<u64> {
    let total = counts.into_iter().try_fold(0u64, |a, n| a.checked_add(n));
    if total.is_none() {
        REFUSED.fetch_add(1, Ordering::Relaxed);
    }
    total
}

/// Sums that held at `u64::MAX` since the process started.
pub fn saturated_total() -> u64 {
    SATURATED.load(Ordering::Relaxed)
}

/// Reports refused since the process started because their counts could
/// not be totalled.
pub fn refused_total() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Appends the two counters to `/metrics` text.
pub fn write_metrics(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP edgeloop_device_counts_refused_total Device sketches refused because their counts total more than 2^64-1.\n\
         # TYPE edgeloop_device_counts_refused_total counter\n\
         edgeloop_device_counts_refused_total {}\n\
         # HELP edgeloop_device_counts_saturated_total Sums of device-reported counts (drift windows, traffic) held at 2^64-1 instead of wrapping.\n\
         # TYPE edgeloop_device_counts_saturated_total counter\n\
         edgeloop_device_counts_saturated_total {}",
        refused_total(),
        saturated_total(),
    );
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_sum_holds_at_the_maximum_and_is_counted_once() {
        let before = saturated_total();
        let mut a = Adder::default();
        let mut total = u64::MAX - 1;
        a.add(&mut total, 1);
        assert!(!a.saturated());
        assert_eq!(total, u64::MAX);
        a.add(&mut total, 1);
        a.add(&mut total, u64::MAX);
        assert!(a.saturated());
        assert_eq!(total, u64::MAX);
        drop(a);
        // Other tests may saturate sums concurrently: at least this one.
        assert!(saturated_total() > before);
        let fine = Adder::default().sum([1, 2, 3]);
        assert_eq!(fine, 6);
    }

    #[test]
    fn a_report_that_cannot_be_totalled_is_refused_and_counted() {
        let before = refused_total();
        assert_eq!(total_or_refuse([1, 2, u64::MAX - 3]), Some(u64::MAX));
        assert_eq!(refused_total(), before, "a full total is still a total");
        assert_eq!(total_or_refuse([u64::MAX, 1]), None);
        assert!(refused_total() > before);
        let mut metrics = String::new();
        write_metrics(&mut metrics);
        let line = metrics
            .lines()
            .find(|l| l.starts_with("edgeloop_device_counts_refused_total "))
            .unwrap();
        let shown: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(shown > before, "{line}");
        assert!(metrics.contains("\nedgeloop_device_counts_saturated_total "));
    }

    proptest! {
        /// Whatever devices send: no panic, and the running total never
        /// goes down (it would, were it to wrap).
        #[test]
        fn totals_never_panic_or_go_down(counts in proptest::collection::vec(any::<u64>(), 0..64)) {
            let mut a = Adder::default();
            let mut total = 0u64;
            let mut exact: u128 = 0;
            for n in counts {
                let before = total;
                a.add(&mut total, n);
                exact += u128::from(n);
                prop_assert!(total >= before);
                prop_assert_eq!(u128::from(total), exact.min(u128::from(u64::MAX)));
            }
            prop_assert_eq!(a.saturated(), exact > u128::from(u64::MAX));
        }
    }
}
