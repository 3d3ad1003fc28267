//! A fixed-bucket latency histogram for `/metrics` (Prometheus
//! `histogram`): how long the control plane itself took to answer, from
//! the handler's start to its reply, and how long its store calls waited
//! and ran (`store::pg::pool`). A client's round trip adds the
//! network, both TLS stacks and the queues in front of the handler; the
//! fleet-scale benchmark prints both, so a slow figure says which side is
//! slow. Relaxed atomics: a statistic, never a decision.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds (`le`); a last `+Inf` bucket
/// holds the rest.
pub const BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

#[derive(Debug, Default)]
pub struct Latency {
    /// Not cumulative: `buckets[i]` counts observations in
    /// `(BOUNDS[i-1], BOUNDS[i]]`; the last one those above every bound.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_micros: AtomicU64,
}

impl Latency {
    pub fn observe(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = BOUNDS.iter().position(|b| s <= *b).unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            took.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// Appends the histogram as Prometheus text.
    pub fn write(&self, out: &mut String, name: &str, help: &str) {
        write_header(out, name, help);
        self.write_series(out, name, "");
    }

    /// Appends one series of the histogram `name`, under `labels` (e.g.
    /// `lane="urgent"`, or empty), without the `HELP` and `TYPE` lines
    /// that [`write_header`] writes once for all of its series.
    pub fn write_series(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = BOUNDS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

/// The `HELP` and `TYPE` lines of a histogram with several series.
pub fn write_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_with_an_inf_bucket() {
        let h = Latency::default();
        for ms in [0.05, 0.3, 0.3, 7.0, 60_000.0] {
            h.observe(Duration::from_secs_f64(ms / 1000.0));
        }
        let mut out = String::new();
        h.write(&mut out, "x_seconds", "help");
        let line = |le: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("x_seconds_bucket{{le=\"{le}\"}}")))
                .unwrap_or_else(|| panic!("no bucket {le} in {out}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(line("0.0001"), "1");
        assert_eq!(line("0.0005"), "3");
        assert_eq!(line("0.01"), "4");
        assert_eq!(line("30"), "4");
        assert_eq!(line("+Inf"), "5");
        assert!(out.contains("x_seconds_count 5"), "{out}");
        assert!(out.contains("# TYPE x_seconds histogram"), "{out}");
    }

    #[test]
    fn a_labelled_series_puts_its_labels_before_le() {
        let h = Latency::default();
        h.observe(Duration::from_millis(3));
        let mut out = String::new();
        h.write_series(&mut out, "y_seconds", "lane=\"urgent\"");
        assert!(
            out.contains("y_seconds_bucket{lane=\"urgent\",le=\"0.005\"} 1"),
            "{out}"
        );
        assert!(out.contains("y_seconds_count{lane=\"urgent\"} 1"), "{out}");
        assert!(
            !out.contains("# TYPE"),
            "the header is written once, apart: {out}"
        );
    }
}
