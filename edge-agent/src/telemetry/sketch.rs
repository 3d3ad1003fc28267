//! The arithmetic of drift sketches, as pure functions over values and
//! tensors: which bin a value falls in, what a classifier predicted and how
//! confident it was, and latency quantiles from a small histogram.
//!
//! Feature histograms must line up with the manifest's reference statistics
//! (`edgeloop_models::dataset::reference_stats`), because drift compares the
//! two bin by bin: one histogram per floating-point input, named after the
//! input, pooling every element of the tensor, NaN and infinities skipped.
//! Bin `i` holds `[edges[i], edges[i + 1])` and the last bin also holds the
//! last edge. Values outside the edges are counted apart (underflow,
//! overflow) instead of being clamped, so an out-of-range shift stays
//! visible; folding them into the outer bins gives exactly what the
//! reference computation would have counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use edgeloop_models::tensor::Tensor;
use edgeloop_proto::agent::v1 as pb;

/// Equal-width confidence bins over `[0, 1]`.
pub const CONFIDENCE_BINS: usize = 10;

/// Where a value falls on a histogram's edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bin {
    Under,
    In(usize),
    Over,
    NonFinite,
}

/// The bin of `v` on `edges` (at least two, strictly increasing).
pub fn bin_of(edges: &[f64], v: f64) -> Bin {
    if !v.is_finite() {
        return Bin::NonFinite;
    }
    let (Some(&first), Some(&last)) = (edges.first(), edges.last()) else {
        return Bin::Over;
    };
    if edges.len() < 2 || v > last {
        return Bin::Over;
    }
    if v < first {
        return Bin::Under;
    }
    // The last edge closes the last bin, as in the reference.
    if v == last {
        return Bin::In(edges.len() - 2);
    }
    // edges[k-1] <= v < edges[k], where k counts the edges <= v (k >= 1).
    Bin::In(edges.partition_point(|&e| e <= v) - 1)
}

/// Edges a sketch can use: at least two, finite, strictly increasing. The
/// manifest was validated when it was verified; this guards the arithmetic.
pub fn usable_edges(edges: &[f64]) -> bool {
    edges.len() >= 2 && edges.iter().all(|e| e.is_finite()) && edges.windows(2).all(|w| w[0] < w[1])
}

/// One input's histogram on its reference edges.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureSketch {
    pub name: Arc<str>,
    pub edges: Arc<[f64]>,
    pub counts: Vec<u64>,
    pub underflow: u64,
    pub overflow: u64,
    pub non_finite: u64,
}

impl FeatureSketch {
    pub fn new(name: Arc<str>, edges: Arc<[f64]>) -> FeatureSketch {
        let bins = edges.len().saturating_sub(1);
        FeatureSketch {
            name,
            edges,
            counts: vec![0; bins],
            underflow: 0,
            overflow: 0,
            non_finite: 0,
        }
    }

    pub fn add(&mut self, v: f64) {
        match bin_of(&self.edges, v) {
            Bin::In(i) => self.counts[i] += 1,
            Bin::Under => self.underflow += 1,
            Bin::Over => self.overflow += 1,
            Bin::NonFinite => self.non_finite += 1,
        }
    }

    /// Adds every element of a floating-point tensor. Other element types
    /// have no reference histogram (the reference skips them), so they are
    /// ignored; returns whether the tensor was used.
    pub fn add_tensor(&mut self, t: &Tensor) -> bool {
        match t {
            Tensor::F32(a) => a.iter().for_each(|&v| self.add(f64::from(v))),
            Tensor::F64(a) => a.iter().for_each(|&v| self.add(v)),
            Tensor::F16(a) => a.iter().for_each(|v| self.add(v.to_f64())),
            _ => return false,
        }
        true
    }

    /// Adds index `column` of axis 1 of a floating-point tensor: one
    /// feature column of a tabular `[rows, columns]` input, or one channel
    /// of an `[N, C, ...]` image; returns whether it was used (a tensor of
    /// rank under 2, another type or too narrow is not that feature).
    pub fn add_column(&mut self, t: &Tensor, column: usize) -> bool {
        use ndarray::Axis;
        let fits = |shape: &[usize]| shape.len() >= 2 && column < shape[1];
        match t {
            Tensor::F32(a) if fits(a.shape()) => a
                .index_axis(Axis(1), column)
                .iter()
                .for_each(|&v| self.add(f64::from(v))),
            Tensor::F64(a) if fits(a.shape()) => a
                .index_axis(Axis(1), column)
                .iter()
                .for_each(|&v| self.add(v)),
            Tensor::F16(a) if fits(a.shape()) => a
                .index_axis(Axis(1), column)
                .iter()
                .for_each(|v| self.add(v.to_f64())),
            _ => return false,
        }
        true
    }

    /// Adds `other`'s counts (same edges).
    pub fn merge(&mut self, other: &FeatureSketch) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.underflow += other.underflow;
        self.overflow += other.overflow;
        self.non_finite += other.non_finite;
    }

    pub fn to_proto(&self) -> pb::FeatureHistogram {
        pb::FeatureHistogram {
            name: self.name.to_string(),
            bin_edges: self.edges.to_vec(),
            counts: self.counts.clone(),
            underflow: self.underflow,
            overflow: self.overflow,
            non_finite: self.non_finite,
        }
    }
}

/// What a classifier predicted for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub class: i64,
    /// The top class's probability, in `[0, 1]`.
    pub confidence: f64,
}

/// How far a row of probabilities may sum away from 1 and still be taken
/// as probabilities rather than logits (float32 softmax rounding).
const PROBABILITY_SUM_TOLERANCE: f64 = 1e-3;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The prediction for one row of a classifier output.
///
/// - One value (`[N]` or `[N, 1]`): a probability of class 1 when it lies in
///   `[0, 1]`, else a logit (sigmoid first); class 1 when it is >= 0.5;
///   confidence is the larger of `p` and `1 - p`.
/// - `C >= 2` values: the class is the argmax (the first on ties). If the row
///   is already a distribution (every value in `[0, 1]`, summing to 1 within
///   1e-3) the confidence is its maximum, otherwise the maximum of its
///   softmax.
///
/// `None` for an empty row or one with NaN or infinities.
pub fn predict_row(row: &[f64]) -> Option<Prediction> {
    if row.is_empty() || row.iter().any(|v| !v.is_finite()) {
        return None;
    }
    if let [v] = row {
        let p = if (0.0..=1.0).contains(v) {
            *v
        } else {
            sigmoid(*v)
        };
        let class = i64::from(p >= 0.5);
        return Some(Prediction {
            class,
            confidence: p.max(1.0 - p),
        });
    }
    let (mut best, mut max) = (0usize, row[0]);
    for (i, &v) in row.iter().enumerate().skip(1) {
        if v > max {
            (best, max) = (i, v);
        }
    }
    let sum: f64 = row.iter().sum();
    let is_distribution = row.iter().all(|v| (0.0..=1.0).contains(v))
        && (sum - 1.0).abs() <= PROBABILITY_SUM_TOLERANCE;
    let confidence = if is_distribution {
        max
    } else {
        // softmax(x)[best] = 1 / sum(exp(x_i - max)), stable for large logits.
        1.0 / row.iter().map(|&v| (v - max).exp()).sum::<f64>()
    };
    Some(Prediction {
        class: i64::try_from(best).unwrap_or(i64::MAX),
        confidence: confidence.clamp(0.0, 1.0),
    })
}

/// The output predictions are read from: the first floating-point output of
/// rank 1 (`[N]`) or 2 (`[N, C]`), in the model's output order.
pub fn classifier_output(outputs: &[(String, Tensor)]) -> Option<&Tensor> {
    outputs.iter().map(|(_, t)| t).find(|t| {
        matches!(t, Tensor::F32(_) | Tensor::F64(_) | Tensor::F16(_))
            && t.shape().len() <= 2
            && !t.shape().is_empty()
    })
}

/// One prediction per row of a `[N]` or `[N, C]` floating-point tensor
/// (`None` for rows without one); `None` for any other tensor.
pub fn predictions(output: &Tensor) -> Option<Vec<Option<Prediction>>> {
    let shape = output.shape();
    let (rows, width) = match *shape {
        [n] => (n, 1),
        [n, c] => (n, c),
        _ => return None,
    };
    let values: Vec<f64> = match output {
        Tensor::F32(a) => a.iter().map(|&v| f64::from(v)).collect(),
        Tensor::F64(a) => a.iter().copied().collect(),
        Tensor::F16(a) => a.iter().map(|v| v.to_f64()).collect(),
        _ => return None,
    };
    if width == 0 {
        return Some(vec![None; rows]);
    }
    Some(values.chunks(width).map(predict_row).collect())
}

/// The confidence bin: `[i/10, (i+1)/10)`, the last bin closed at 1.
pub fn confidence_bin(confidence: f64) -> usize {
    let scaled = (confidence.clamp(0.0, 1.0) * CONFIDENCE_BINS as f64) as usize;
    scaled.min(CONFIDENCE_BINS - 1)
}

/// Latencies in log buckets: bucket `i` holds `[2^(i/4), 2^((i+1)/4))`
/// microseconds (about 19% wide), so quantiles are within ~10% with a
/// fixed 1.3 KiB per model; bucket 0 also holds anything under 1 µs and the
/// last anything longer than ~2^40 µs (12 days).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    buckets: Box<[u64; LATENCY_BUCKETS]>,
    total: u64,
}

const LATENCY_BUCKETS: usize = 160;
const BUCKETS_PER_DOUBLING: f64 = 4.0;

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: Box::new([0; LATENCY_BUCKETS]),
            total: 0,
        }
    }
}

impl LatencyHistogram {
    fn bucket(micros: f64) -> usize {
        if micros.is_nan() || micros < 1.0 {
            return 0;
        }
        ((micros.log2() * BUCKETS_PER_DOUBLING) as usize).min(LATENCY_BUCKETS - 1)
    }

    pub fn record(&mut self, latency: std::time::Duration) {
        self.buckets[Self::bucket(latency.as_secs_f64() * 1e6)] += 1;
        self.total += 1;
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.total += other.total;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (0..=1) in milliseconds: the geometric middle of the
    /// bucket holding the `ceil(q * n)`-th latency; 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let micros = 2f64.powf((i as f64 + 0.5) / BUCKETS_PER_DOUBLING);
                return micros / 1e3;
            }
        }
        0.0
    }
}

/// Class counts, ordered by class.
pub fn class_counts(classes: &BTreeMap<i64, u64>) -> Vec<pb::ClassCount> {
    classes
        .iter()
        .map(|(&class, &count)| pb::ClassCount { class, count })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};
    use std::time::Duration;

    #[test]
    fn bins_at_edges_and_outside() {
        let edges = [0.0, 1.0, 2.0, 4.0];
        let table = [
            (-0.001, Bin::Under),
            (0.0, Bin::In(0)),
            (0.999, Bin::In(0)),
            (1.0, Bin::In(1)),
            (1.5, Bin::In(1)),
            (2.0, Bin::In(2)),
            (3.999, Bin::In(2)),
            // The last edge closes the last bin...
            (4.0, Bin::In(2)),
            // ...and anything past it overflows.
            (4.0001, Bin::Over),
            (f64::NAN, Bin::NonFinite),
            (f64::INFINITY, Bin::NonFinite),
            (f64::NEG_INFINITY, Bin::NonFinite),
        ];
        for (v, want) in table {
            assert_eq!(bin_of(&edges, v), want, "value {v}");
        }
    }

    #[test]
    fn edges_must_be_usable() {
        assert!(usable_edges(&[0.0, 1.0]));
        assert!(!usable_edges(&[0.0]));
        assert!(!usable_edges(&[1.0, 1.0]));
        assert!(!usable_edges(&[0.0, f64::NAN]));
        assert!(!usable_edges(&[2.0, 1.0]));
    }

    /// The sketch reproduces the reference histogram for the data the
    /// reference was computed from (so an unchanged distribution has PSI 0).
    #[test]
    fn sketch_matches_reference_stats_on_the_reference_data() {
        use edgeloop_models::dataset::{reference_stats, Dataset};
        let values: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 7.0).collect();
        let t = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[100, 10]), values).unwrap());
        let data = Dataset {
            layout: edgeloop_models::dataset::Layout::Batched,
            boxes: None,
            batches: vec![vec![("x".to_string(), t.clone())]],
            labels: None,
            samples: 100,
        };
        let reference = reference_stats(&data, &[], 10);
        let h = &reference.inputs[0];
        let mut sketch = FeatureSketch::new("x".into(), h.bin_edges.clone().into());
        assert!(sketch.add_tensor(&t));
        assert_eq!(sketch.counts, h.counts);
        assert_eq!((sketch.underflow, sketch.overflow), (0, 0));
    }

    /// Per column and per channel (axis 1), the sketch of the reference
    /// data is the reference's own histogram, and a tensor without that
    /// index is not used.
    #[test]
    fn column_and_channel_sketches_match_their_reference_histograms() {
        use edgeloop_models::dataset::{reference_stats, Dataset};
        for shape in [vec![50, 4], vec![50, 3, 2, 2]] {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 7.0).collect();
            let t = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&shape), values).unwrap());
            let data = Dataset {
                layout: edgeloop_models::dataset::Layout::Batched,
                boxes: None,
                batches: vec![vec![("x".to_string(), t.clone())]],
                labels: None,
                samples: 50,
            };
            let reference = reference_stats(&data, &[], 10);
            assert_eq!(reference.inputs.len(), 1 + shape[1], "{shape:?}");
            for h in &reference.inputs[1..] {
                let column = h.column.unwrap() as usize;
                let mut sketch =
                    FeatureSketch::new(h.name.as_str().into(), h.bin_edges.clone().into());
                assert!(sketch.add_column(&t, column), "{shape:?} {column}");
                assert_eq!(sketch.counts, h.counts, "{shape:?} {}", h.name);
                assert!(!sketch.add_column(&t, shape[1]), "no such index");
            }
        }
        let flat = Tensor::F32(ArrayD::zeros(IxDyn(&[4])));
        let mut s = FeatureSketch::new("x".into(), vec![0.0, 1.0].into());
        assert!(!s.add_column(&flat, 0), "a rank-1 tensor has no axis 1");
    }

    #[test]
    fn feature_sketch_counts_outside_and_ignores_integers() {
        let mut s = FeatureSketch::new("x".into(), vec![0.0, 1.0, 2.0].into());
        let t = Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![-1.0, 0.5, 1.0, 2.0, 3.0, f32::NAN])
                .unwrap(),
        );
        assert!(s.add_tensor(&t));
        assert_eq!(
            (s.counts.clone(), s.underflow, s.overflow, s.non_finite),
            (vec![1, 2], 1, 1, 1)
        );
        assert!(!s.add_tensor(&Tensor::I64(ArrayD::zeros(IxDyn(&[2])))));
        let mut sum = s.clone();
        sum.merge(&s);
        assert_eq!((sum.counts, sum.overflow), (vec![2, 4], 2));
    }

    #[test]
    fn predictions_for_logits_probabilities_and_single_outputs() {
        let softmax_max = |xs: &[f64]| {
            let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = xs.iter().map(|x| (x - m).exp()).sum();
            1.0 / z
        };
        type Row = (Vec<f64>, Option<(i64, f64)>);
        let table: Vec<Row> = vec![
            // Probabilities: taken as they are.
            (vec![0.1, 0.7, 0.2], Some((1, 0.7))),
            (vec![0.5, 0.5], Some((0, 0.5))),
            // Logits: softmax.
            (
                vec![1.0, 3.0, 2.0],
                Some((1, softmax_max(&[1.0, 3.0, 2.0]))),
            ),
            (vec![0.2, 0.2, 0.2], Some((0, 1.0 / 3.0))),
            // Huge logits stay finite.
            (vec![1000.0, 0.0], Some((0, 1.0))),
            // Single probability, thresholded at 0.5.
            (vec![0.8], Some((1, 0.8))),
            (vec![0.5], Some((1, 0.5))),
            (vec![0.3], Some((0, 0.7))),
            // Single logit: sigmoid first.
            (vec![2.0], Some((1, sigmoid(2.0)))),
            (vec![-2.0], Some((0, 1.0 - sigmoid(-2.0)))),
            (vec![f64::NAN, 1.0], None),
            (vec![], None),
        ];
        for (row, want) in table {
            let got = predict_row(&row).map(|p| (p.class, p.confidence));
            match (got, want) {
                (Some((c, p)), Some((wc, wp))) => {
                    assert_eq!(c, wc, "{row:?}");
                    assert!((p - wp).abs() < 1e-9, "{row:?}: {p} vs {wp}");
                }
                (g, w) => assert_eq!(g.is_some(), w.is_some(), "{row:?}"),
            }
        }
    }

    #[test]
    fn predictions_per_row_and_output_choice() {
        let logits = Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0.0, 5.0, 0.0, 9.0, 0.0, 0.0]).unwrap(),
        );
        let rows = predictions(&logits).unwrap();
        assert_eq!(
            rows.iter().map(|p| p.unwrap().class).collect::<Vec<_>>(),
            vec![1, 0]
        );
        let probs = Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0.9, 0.1, 0.5]).unwrap());
        let rows = predictions(&probs).unwrap();
        assert_eq!(
            rows.iter().map(|p| p.unwrap().class).collect::<Vec<_>>(),
            vec![1, 0, 1]
        );
        assert!(predictions(&Tensor::F32(ArrayD::zeros(IxDyn(&[1, 2, 3])))).is_none());
        assert!(predictions(&Tensor::I64(ArrayD::zeros(IxDyn(&[2])))).is_none());

        let outputs = vec![
            ("label".to_string(), Tensor::I64(ArrayD::zeros(IxDyn(&[2])))),
            ("probs".to_string(), probs.clone()),
        ];
        assert_eq!(classifier_output(&outputs), Some(&probs));
    }

    #[test]
    fn confidence_bins() {
        let table = [
            (0.0, 0),
            (0.0999, 0),
            (0.1, 1),
            (0.55, 5),
            (0.9, 9),
            (0.999, 9),
            (1.0, 9),
        ];
        for (c, want) in table {
            assert_eq!(confidence_bin(c), want, "{c}");
        }
    }

    #[test]
    fn latency_quantiles_are_within_a_bucket() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile_ms(0.5), 0.0);
        for _ in 0..98 {
            h.record(Duration::from_millis(10));
        }
        h.record(Duration::from_millis(200));
        h.record(Duration::from_millis(200));
        let close = |got: f64, want: f64| (got / want - 1.0).abs() < 0.1;
        assert!(close(h.quantile_ms(0.5), 10.0), "{}", h.quantile_ms(0.5));
        assert!(close(h.quantile_ms(0.99), 200.0), "{}", h.quantile_ms(0.99));
        let mut sum = h.clone();
        sum.merge(&h);
        assert_eq!(sum.count(), 200);
        // Sub-microsecond and absurd latencies land in the end buckets.
        h.record(Duration::from_nanos(1));
        h.record(Duration::from_secs(10_000_000));
        assert_eq!(h.count(), 102);
    }
}
