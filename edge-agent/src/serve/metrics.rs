//! Serving metrics in the Prometheus text format. The request path touches
//! only atomics (each version holds its own [`VersionMetrics`]); the maps
//! are locked only when a version is activated or `/metrics` is rendered.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Latency bucket bounds in nanoseconds (100 µs to 10 s).
const LATENCY_BOUNDS_NS: &[u64] = &[
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Batch size bucket bounds, in requests per run.
const BATCH_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096];

/// A cumulative-on-render histogram of integer observations (nanoseconds,
/// requests), scaled when rendered.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [u64],
    /// Per bucket (not cumulative), plus one for `+Inf`.
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: u64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes `_bucket`, `_sum` and `_count` lines; `scale` turns the integer
    /// unit into the metric's unit.
    fn render(&self, out: &mut String, name: &str, labels: &str, scale: f64) {
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(&b) => format_float(b as f64 * scale),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum.load(Ordering::Relaxed) as f64 * scale;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", format_float(sum));
        // The count is the +Inf bucket, read once so the two always agree.
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

fn format_float(v: f64) -> String {
    // `{:?}` keeps a decimal point or exponent (1.0, 1e-5): valid Go floats.
    format!("{v:?}")
}

/// One model version's counters. Held by the version's worker pool, so they
/// survive swaps: swapping back to a version continues its counts.
#[derive(Debug)]
pub struct VersionMetrics {
    requests: AtomicU64,
    errors: AtomicU64,
    latency: Histogram,
    batch_size: Histogram,
}

impl VersionMetrics {
    fn new() -> Self {
        VersionMetrics {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: Histogram::new(LATENCY_BOUNDS_NS),
            batch_size: Histogram::new(BATCH_BOUNDS),
        }
    }

    /// A finished request, successful or not.
    pub fn request(&self, latency: Duration, ok: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency
            .observe(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
    }

    /// One run of the model carrying `requests` requests.
    pub fn batch(&self, requests: usize) {
        self.batch_size
            .observe(u64::try_from(requests).unwrap_or(u64::MAX));
    }
}

/// Per model, the requests queued now (over all its versions).
pub type QueueDepth = Arc<AtomicI64>;

/// Every model's and version's metrics since the agent started.
#[derive(Debug, Default)]
pub struct Registry {
    versions: Mutex<BTreeMap<(String, String), Arc<VersionMetrics>>>,
    depths: Mutex<BTreeMap<String, QueueDepth>>,
}

/// What serves now, for `edgeloop_model_info`.
#[derive(Debug, Clone)]
pub struct ServingInfo {
    pub model: String,
    pub version: String,
    pub provider: String,
}

impl Registry {
    pub fn version(&self, model: &str, version: &str) -> Arc<VersionMetrics> {
        let mut map = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            map.entry((model.to_string(), version.to_string()))
                .or_insert_with(|| Arc::new(VersionMetrics::new())),
        )
    }

    pub fn queue_depth(&self, model: &str) -> QueueDepth {
        let mut map = self.depths.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(model.to_string()).or_default())
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, serving: &[ServingInfo]) -> String {
        let versions: Vec<((String, String), Arc<VersionMetrics>)> = self
            .versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let depths: Vec<(String, i64)> = self
            .depths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed).max(0)))
            .collect();
        let labels = |(m, v): &(String, String)| {
            format!("model=\"{}\",version=\"{}\"", escape(m), escape(v))
        };

        let mut out = String::with_capacity(4096);
        header(
            &mut out,
            "edgeloop_inference_requests_total",
            "counter",
            "Inference requests routed to a model version, successful or not.",
        );
        for (key, m) in &versions {
            let n = m.requests.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "edgeloop_inference_requests_total{{{}}} {n}",
                labels(key)
            );
        }
        header(
            &mut out,
            "edgeloop_inference_errors_total",
            "counter",
            "Inference requests that failed (any answer but 200).",
        );
        for (key, m) in &versions {
            let n = m.errors.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "edgeloop_inference_errors_total{{{}}} {n}",
                labels(key)
            );
        }
        header(
            &mut out,
            "edgeloop_inference_latency_seconds",
            "histogram",
            "Time from receiving an infer request to answering it.",
        );
        for (key, m) in &versions {
            let name = "edgeloop_inference_latency_seconds";
            m.latency.render(&mut out, name, &labels(key), 1e-9);
        }
        header(
            &mut out,
            "edgeloop_inference_batch_size",
            "histogram",
            "Requests per model run (dynamic batching).",
        );
        for (key, m) in &versions {
            let name = "edgeloop_inference_batch_size";
            m.batch_size.render(&mut out, name, &labels(key), 1.0);
        }
        header(
            &mut out,
            "edgeloop_inference_queue_depth",
            "gauge",
            "Requests waiting for a worker, per model.",
        );
        for (model, depth) in &depths {
            let model = escape(model);
            let _ = writeln!(
                out,
                "edgeloop_inference_queue_depth{{model=\"{model}\"}} {depth}"
            );
        }
        header(
            &mut out,
            "edgeloop_model_info",
            "gauge",
            "The version serving each model, and its execution provider.",
        );
        for info in serving {
            let _ = writeln!(
                out,
                "edgeloop_model_info{{model=\"{}\",version=\"{}\",provider=\"{}\"}} 1",
                escape(&info.model),
                escape(&info.version),
                escape(&info.provider)
            );
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Label values escape `\`, `"` and newlines.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counts_agree() {
        let r = Registry::default();
        let m = r.version("m", "1");
        m.request(Duration::from_micros(50), true);
        m.request(Duration::from_millis(3), false);
        m.batch(3);
        let text = r.render(&[]);
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_string()
        };
        assert!(line(
            "edgeloop_inference_latency_seconds_bucket{model=\"m\",version=\"1\",le=\"0.0001\"}"
        )
        .ends_with(" 1"));
        assert!(line(
            "edgeloop_inference_latency_seconds_bucket{model=\"m\",version=\"1\",le=\"0.005\"}"
        )
        .ends_with(" 2"));
        assert!(line("edgeloop_inference_latency_seconds_count{").ends_with(" 2"));
        assert!(line("edgeloop_inference_errors_total{").ends_with(" 1"));
        assert!(
            line("edgeloop_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"2.0\"}")
                .ends_with(" 0")
        );
        assert!(
            line("edgeloop_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"4.0\"}")
                .ends_with(" 1")
        );
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
