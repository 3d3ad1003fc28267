//! What devices send for drift analysis and retraining: per-window sketches
//! (feature histograms on the reference edges, predicted classes,
//! confidence, latency) and samples (hard examples, labelled feedback).
//! Everything from the wire is checked here, each error naming its field
//! (`sketches[0].features[2].bin_edges`), before it becomes a record.

use base64::Engine as _;
use edgeloop_models::DType;
use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use edgeloop_errors::device_counts;
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};
use edgeloop_proto::to_time;

pub const MAX_SKETCHES_PER_REPORT: usize = 256;
pub const MAX_FEATURES_PER_SKETCH: usize = 1024;
pub const MAX_BINS: usize = 1024;
pub const MAX_CLASSES: usize = 65_536;
pub const CONFIDENCE_BINS: usize = 10;
pub const MAX_SAMPLES_PER_REPORT: usize = 256;
pub const MAX_TENSORS_PER_SAMPLE: usize = 64;
pub const MAX_TENSOR_RANK: usize = 16;
pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_REQUEST_ID_BYTES: usize = 1024;

/// One model version's window on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SketchRecord {
    pub device: String,
    /// The report's sequence (per device).
    pub sequence: u64,
    pub model_name: String,
    pub model_version: String,
    /// The window as the device's clock saw it: shown, never trusted for
    /// windows (see [`SketchRecord::window_time`]).
    #[serde(with = "time::serde::rfc3339::option")]
    pub window_start: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub window_end: Option<OffsetDateTime>,
    /// When the control plane received it.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub received_at: Option<OffsetDateTime>,
    pub requests: u64,
    pub errors: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub features: Vec<FeatureHistogramRecord>,
    pub classes: Vec<ClassCountRecord>,
    /// Top-class probability in 10 bins over [0, 1] (the last closed at 1);
    /// empty when the model has no classifier output.
    pub confidence_counts: Vec<u64>,
    pub low_confidence: u64,
}

/// `counts[i]` holds `[bin_edges[i], bin_edges[i+1])`, the last bin closed.
/// Values outside the edges are in `underflow`/`overflow`; for PSI against
/// the manifest's reference, fold them into the outer bins
/// ([`FeatureHistogramRecord::folded_counts`]), which is how the reference
/// was counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FeatureHistogramRecord {
    pub name: String,
    pub bin_edges: Vec<f64>,
    pub counts: Vec<u64>,
    pub underflow: u64,
    pub overflow: u64,
    pub non_finite: u64,
}

impl FeatureHistogramRecord {
    /// The counts with underflow added to the first bin and overflow to the
    /// last: comparable bin for bin with the reference histogram. Held at
    /// `u64::MAX`: records stored before [`sketch`] refused counts that
    /// cannot be totalled may still hold some.
    pub fn folded_counts(&self) -> Vec<u64> {
        let mut sum = device_counts::Adder::default();
        let mut c = self.counts.clone();
        if let Some(first) = c.first_mut() {
            sum.add(first, self.underflow);
        }
        if let Some(last) = c.last_mut() {
            sum.add(last, self.overflow);
        }
        c
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClassCountRecord {
    pub class: i64,
    pub count: u64,
}

pub use edgeloop_api::samples::SampleKind;

impl SketchRecord {
    /// The time its window is counted at: when the control plane received
    /// it. A device's own clock can put its data in any window it likes (to
    /// hide drift, or fake it), so only records from before the receive
    /// time was kept fall back to the device's window.
    pub fn window_time(&self) -> Option<OffsetDateTime> {
        self.received_at.or(self.window_end).or(self.window_start)
    }
}

impl SampleRecord {
    /// The time its windows count it at (online accuracy, labels since a
    /// retrain, fresh rows, retention): when the control plane received
    /// it; the device's `observed_at` only for records from before that.
    pub fn at(&self) -> Option<OffsetDateTime> {
        self.received_at.or(self.observed_at)
    }
}

/// One predicted row with its inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SampleRecord {
    pub device: String,
    pub sequence: u64,
    pub kind: SampleKind,
    pub model_name: String,
    pub model_version: String,
    pub request_id: String,
    /// When the device says it predicted: shown, never trusted for
    /// windows (see [`SampleRecord::at`]).
    #[serde(with = "time::serde::rfc3339::option")]
    pub observed_at: Option<OffsetDateTime>,
    /// When the control plane received it.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub received_at: Option<OffsetDateTime>,
    pub inputs: Vec<SampleTensorRecord>,
    pub predicted_class: Option<i64>,
    pub confidence: Option<f64>,
    pub label: Option<i64>,
    /// Set when the label came through the labelling queue, not with the
    /// device's feedback.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub labelled_at: Option<OffsetDateTime>,
    #[serde(default)]
    pub labelled_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SampleTensorRecord {
    pub name: String,
    /// NumPy name (`float32`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Row-major little-endian bytes, base64 (standard alphabet, padded).
    pub data_base64: String,
}

fn check_name(field: &str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_NAME_BYTES {
        return Err(Error::bad_field(
            field,
            format!("must be 1 to {MAX_NAME_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn check_at_most(field: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::bad_field(field, format!("at most {max}, got {len}")));
    }
    Ok(())
}

fn check_latency(field: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(Error::bad_field(
            field,
            format!("must be a finite number >= 0, got {v}"),
        ));
    }
    Ok(())
}

fn feature(at: &str, f: pb::FeatureHistogram) -> Result<FeatureHistogramRecord> {
    check_name(&format!("{at}.name"), &f.name)?;
    let edges = &f.bin_edges;
    if edges.len() < 2 || edges.len() > MAX_BINS + 1 {
        return Err(Error::bad_field(
            format!("{at}.bin_edges"),
            format!("must have 2 to {} edges, got {}", MAX_BINS + 1, edges.len()),
        ));
    }
    if let Some(i) = edges.iter().position(|e| !e.is_finite()) {
        return Err(Error::bad_field(
            format!("{at}.bin_edges[{i}]"),
            "must be a finite number",
        ));
    }
    if let Some(i) = edges.windows(2).position(|w| w[0] >= w[1]) {
        return Err(Error::bad_field(
            format!("{at}.bin_edges[{}]", i + 1),
            "edges must be strictly increasing",
        ));
    }
    if f.counts.len() != edges.len() - 1 {
        return Err(Error::bad_field(
            format!("{at}.counts"),
            format!(
                "must have one count per bin ({}), got {}",
                edges.len() - 1,
                f.counts.len()
            ),
        ));
    }
    // Every sum of them (folded bins, windows) starts from their total.
    let all = f
        .counts
        .iter()
        .copied()
        .chain([f.underflow, f.overflow, f.non_finite]);
    if device_counts::total_or_refuse(all).is_none() {
        return Err(Error::bad_field(
            format!("{at}.counts"),
            "counts, underflow, overflow and non_finite must total at most 2^64-1",
        ));
    }
    Ok(FeatureHistogramRecord {
        name: f.name,
        bin_edges: f.bin_edges,
        counts: f.counts,
        underflow: f.underflow,
        overflow: f.overflow,
        non_finite: f.non_finite,
    })
}

/// Checks and converts one sketch; `at` is its field path.
pub fn sketch(at: &str, device: &str, sequence: u64, s: pb::ModelSketch) -> Result<SketchRecord> {
    validate::name(&format!("{at}.model_name"), &s.model_name)?;
    validate::version(&format!("{at}.model_version"), &s.model_version)?;
    if s.errors > s.requests {
        return Err(Error::bad_field(
            format!("{at}.errors"),
            format!("{} errors of {} requests", s.errors, s.requests),
        ));
    }
    check_latency(&format!("{at}.latency_p50_ms"), s.latency_p50_ms)?;
    check_latency(&format!("{at}.latency_p99_ms"), s.latency_p99_ms)?;
    check_at_most(
        &format!("{at}.features"),
        s.features.len(),
        MAX_FEATURES_PER_SKETCH,
    )?;
    check_at_most(&format!("{at}.classes"), s.classes.len(), MAX_CLASSES)?;
    if !matches!(s.confidence_counts.len(), 0 | CONFIDENCE_BINS) {
        return Err(Error::bad_field(
            format!("{at}.confidence_counts"),
            format!(
                "must have {CONFIDENCE_BINS} bins (or none), got {}",
                s.confidence_counts.len()
            ),
        ));
    }
    let features = s
        .features
        .into_iter()
        .enumerate()
        .map(|(i, f)| feature(&format!("{at}.features[{i}]"), f))
        .collect::<Result<Vec<_>>>()?;
    if device_counts::total_or_refuse(s.classes.iter().map(|c| c.count)).is_none() {
        return Err(Error::bad_field(
            format!("{at}.classes"),
            "class counts must total at most 2^64-1",
        ));
    }
    if device_counts::total_or_refuse(s.confidence_counts.iter().copied()).is_none() {
        return Err(Error::bad_field(
            format!("{at}.confidence_counts"),
            "must total at most 2^64-1",
        ));
    }
    Ok(SketchRecord {
        device: device.to_string(),
        sequence,
        model_name: s.model_name,
        model_version: s.model_version,
        window_start: to_time(s.window_start),
        window_end: to_time(s.window_end),
        received_at: None,
        requests: s.requests,
        errors: s.errors,
        latency_p50_ms: s.latency_p50_ms,
        latency_p99_ms: s.latency_p99_ms,
        features,
        classes: s
            .classes
            .into_iter()
            .map(|c| ClassCountRecord {
                class: c.class,
                count: c.count,
            })
            .collect(),
        confidence_counts: s.confidence_counts,
        low_confidence: s.low_confidence,
    })
}

fn tensor(at: &str, t: pb::SampleTensor) -> Result<SampleTensorRecord> {
    check_name(&format!("{at}.name"), &t.name)?;
    let dtype = DType::ALL
        .into_iter()
        .find(|d| d.numpy_name() == t.dtype)
        .ok_or_else(|| {
            Error::bad_field(
                format!("{at}.dtype"),
                format!("unknown element type {:?}", t.dtype),
            )
        })?;
    check_at_most(&format!("{at}.shape"), t.shape.len(), MAX_TENSOR_RANK)?;
    let expected = t
        .shape
        .iter()
        .try_fold(dtype.size_bytes() as u64, |n, &d| n.checked_mul(d));
    if expected != Some(t.data.len() as u64) {
        return Err(Error::bad_field(
            format!("{at}.data"),
            format!(
                "{} bytes do not hold a {} tensor of shape {:?}",
                t.data.len(),
                t.dtype,
                t.shape
            ),
        ));
    }
    Ok(SampleTensorRecord {
        name: t.name,
        dtype: t.dtype,
        shape: t.shape,
        data_base64: base64::engine::general_purpose::STANDARD.encode(&t.data),
    })
}

/// Checks and converts one sample; `at` is its field path.
pub fn sample(at: &str, device: &str, sequence: u64, s: pb::Sample) -> Result<SampleRecord> {
    let kind = match pb::SampleKind::try_from(s.kind) {
        Ok(pb::SampleKind::HardExample) => SampleKind::HardExample,
        Ok(pb::SampleKind::Feedback) => SampleKind::Feedback,
        _ => {
            return Err(Error::bad_field(
                format!("{at}.kind"),
                format!("must be a known sample kind, got {}", s.kind),
            ))
        }
    };
    validate::name(&format!("{at}.model_name"), &s.model_name)?;
    validate::version(&format!("{at}.model_version"), &s.model_version)?;
    if s.request_id.is_empty() || s.request_id.len() > MAX_REQUEST_ID_BYTES {
        return Err(Error::bad_field(
            format!("{at}.request_id"),
            format!("must be 1 to {MAX_REQUEST_ID_BYTES} bytes"),
        ));
    }
    if let Some(c) = s.confidence {
        if !(0.0..=1.0).contains(&c) {
            return Err(Error::bad_field(
                format!("{at}.confidence"),
                format!("must be in [0, 1], got {c}"),
            ));
        }
    }
    check_at_most(
        &format!("{at}.inputs"),
        s.inputs.len(),
        MAX_TENSORS_PER_SAMPLE,
    )?;
    let inputs = s
        .inputs
        .into_iter()
        .enumerate()
        .map(|(i, t)| tensor(&format!("{at}.inputs[{i}]"), t))
        .collect::<Result<Vec<_>>>()?;
    Ok(SampleRecord {
        device: device.to_string(),
        sequence,
        kind,
        model_name: s.model_name,
        model_version: s.model_version,
        request_id: s.request_id,
        observed_at: to_time(s.observed_at),
        // Set by the caller, which knows when the report arrived.
        received_at: None,
        inputs,
        predicted_class: s.predicted_class,
        confidence: s.confidence,
        label: s.label,
        labelled_at: None,
        labelled_by: None,
    })
}

/// Sketches and samples are keyed by model and version first, so drift
/// analysis reads one model (or version) with one prefix scan; the
/// device, sequence and position make the key unique and deterministic, so
/// storing a report twice writes the same keys.
pub fn record_key(model: &str, version: &str, device: &str, sequence: u64, index: usize) -> String {
    format!("{model}/{version}/{device}/{sequence:020}/{index:04}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_sketch() -> pb::ModelSketch {
        pb::ModelSketch {
            model_name: "m".into(),
            model_version: "1.0.0".into(),
            requests: 3,
            errors: 1,
            latency_p50_ms: 1.0,
            latency_p99_ms: 2.0,
            features: vec![pb::FeatureHistogram {
                name: "x".into(),
                bin_edges: vec![0.0, 1.0, 2.0],
                counts: vec![1, 2],
                underflow: 3,
                overflow: 4,
                non_finite: 0,
            }],
            confidence_counts: vec![0; 10],
            ..Default::default()
        }
    }

    fn good_sample() -> pb::Sample {
        pb::Sample {
            kind: pb::SampleKind::HardExample as i32,
            model_name: "m".into(),
            model_version: "1.0.0".into(),
            request_id: "r".into(),
            inputs: vec![pb::SampleTensor {
                name: "x".into(),
                dtype: "float32".into(),
                shape: vec![1, 2],
                data: vec![0; 8],
            }],
            confidence: Some(0.4),
            ..Default::default()
        }
    }

    fn field_of(e: Error) -> String {
        match e {
            Error::BadRequest { field, .. } => field.unwrap_or_default(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn sketches_are_checked_field_by_field() {
        let r = sketch("sketches[0]", "d", 1, good_sketch()).unwrap();
        assert_eq!(r.features[0].folded_counts(), vec![4, 6]);
        type Edit = fn(&mut pb::ModelSketch);
        let table: Vec<(Edit, &str)> = vec![
            (
                |s| s.model_name = "Bad Name".into(),
                "sketches[0].model_name",
            ),
            (
                |s| s.model_version = String::new(),
                "sketches[0].model_version",
            ),
            (|s| s.errors = 4, "sketches[0].errors"),
            (
                |s| s.latency_p99_ms = f64::NAN,
                "sketches[0].latency_p99_ms",
            ),
            (
                |s| s.confidence_counts = vec![1],
                "sketches[0].confidence_counts",
            ),
            (
                |s| s.features[0].name = String::new(),
                "sketches[0].features[0].name",
            ),
            (
                |s| s.features[0].bin_edges = vec![1.0],
                "sketches[0].features[0].bin_edges",
            ),
            (
                |s| s.features[0].bin_edges = vec![0.0, f64::INFINITY, 2.0],
                "sketches[0].features[0].bin_edges[1]",
            ),
            (
                |s| s.features[0].bin_edges = vec![0.0, 2.0, 2.0],
                "sketches[0].features[0].bin_edges[2]",
            ),
            (
                |s| s.features[0].counts = vec![1],
                "sketches[0].features[0].counts",
            ),
            (
                |s| s.features[0].counts = vec![u64::MAX, 1],
                "sketches[0].features[0].counts",
            ),
            (
                |s| s.features[0].overflow = u64::MAX,
                "sketches[0].features[0].counts",
            ),
            (
                |s| {
                    s.classes = vec![
                        pb::ClassCount {
                            class: 0,
                            count: u64::MAX,
                        },
                        pb::ClassCount { class: 1, count: 1 },
                    ]
                },
                "sketches[0].classes",
            ),
            (
                |s| {
                    s.confidence_counts[8] = u64::MAX;
                    s.confidence_counts[9] = 1;
                },
                "sketches[0].confidence_counts",
            ),
        ];
        for (edit, want) in table {
            let mut s = good_sketch();
            edit(&mut s);
            assert_eq!(
                field_of(sketch("sketches[0]", "d", 1, s).unwrap_err()),
                want
            );
        }
    }

    #[test]
    fn sketches_with_counts_past_u64_are_refused_and_counted() {
        let before = device_counts::refused_total();
        let mut s = good_sketch();
        s.features[0].underflow = u64::MAX;
        assert!(sketch("sketches[0]", "d", 1, s).is_err());
        assert!(device_counts::refused_total() > before);
        // At the limit exactly: a total, so stored.
        let mut s = good_sketch();
        s.features[0].counts = vec![u64::MAX - 7, 0];
        assert!(sketch("sketches[0]", "d", 1, s).is_ok());
    }

    #[test]
    fn an_old_record_with_huge_counts_folds_without_wrapping() {
        let f = FeatureHistogramRecord {
            name: "x".into(),
            bin_edges: vec![0.0, 1.0, 2.0],
            counts: vec![u64::MAX, 5],
            underflow: 10,
            overflow: u64::MAX,
            non_finite: 0,
        };
        assert_eq!(f.folded_counts(), vec![u64::MAX, u64::MAX]);
    }

    proptest::proptest! {
        /// Arbitrary counts from a device: a sketch is accepted or refused
        /// with a field, never a panic, and an accepted one folds.
        #[test]
        fn arbitrary_counts_never_panic(
            counts in proptest::collection::vec(proptest::prelude::any::<u64>(), 2),
            outer in proptest::collection::vec(proptest::prelude::any::<u64>(), 3),
            classes in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..4),
            confidence in proptest::collection::vec(proptest::prelude::any::<u64>(), 10),
        ) {
            let mut s = good_sketch();
            s.features[0].counts = counts;
            s.features[0].underflow = outer[0];
            s.features[0].overflow = outer[1];
            s.features[0].non_finite = outer[2];
            s.classes = classes
                .into_iter()
                .enumerate()
                .map(|(i, count)| pb::ClassCount { class: i as i64, count })
                .collect();
            s.confidence_counts = confidence;
            if let Ok(r) = sketch("sketches[0]", "d", 1, s) {
                let folded = r.features[0].folded_counts();
                proptest::prop_assert!(folded[0] >= r.features[0].counts[0]);
                proptest::prop_assert!(folded[1] >= r.features[0].counts[1]);
            }
        }
    }

    #[test]
    fn samples_are_checked_field_by_field() {
        let r = sample("samples[0]", "d", 1, good_sample()).unwrap();
        assert_eq!(r.inputs[0].data_base64, "AAAAAAAAAAA=");
        type Edit = fn(&mut pb::Sample);
        let table: Vec<(Edit, &str)> = vec![
            (|s| s.kind = 0, "samples[0].kind"),
            (|s| s.kind = 99, "samples[0].kind"),
            (|s| s.request_id = String::new(), "samples[0].request_id"),
            (|s| s.confidence = Some(1.5), "samples[0].confidence"),
            (|s| s.confidence = Some(f64::NAN), "samples[0].confidence"),
            (
                |s| s.inputs[0].dtype = "complex".into(),
                "samples[0].inputs[0].dtype",
            ),
            (
                |s| s.inputs[0].data = vec![0; 7],
                "samples[0].inputs[0].data",
            ),
            (
                |s| s.inputs[0].shape = vec![u64::MAX, 2],
                "samples[0].inputs[0].data",
            ),
            (|s| s.model_name = String::new(), "samples[0].model_name"),
        ];
        for (edit, want) in table {
            let mut s = good_sample();
            edit(&mut s);
            assert_eq!(field_of(sample("samples[0]", "d", 1, s).unwrap_err()), want);
        }
    }
}
