//! One telemetry window's accumulators for one model version, and the
//! reservoir of hard examples it keeps. The serving path fills them under a
//! per-model mutex with work prepared outside it (see `Telemetry::observe`);
//! closing the window turns them into a `ModelSketch`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use edgeloop_models::manifest::Manifest;
use edgeloop_models::tensor::Tensor;
use edgeloop_proto::agent::v1 as pb;

use super::sketch::{
    class_counts, confidence_bin, usable_edges, FeatureSketch, LatencyHistogram, Prediction,
    CONFIDENCE_BINS,
};

/// A reference histogram's name and edges, from the version's manifest:
/// of a whole input, or of one column of a tabular input.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureRef {
    pub name: Arc<str>,
    pub edges: Arc<[f64]>,
    /// The input it reads (its own name for a whole input).
    pub input: Arc<str>,
    pub column: Option<usize>,
}

/// The features a version's manifest has reference histograms for (those
/// with unusable edges are skipped with a warning).
pub fn feature_refs(manifest: Option<&Manifest>) -> Arc<[FeatureRef]> {
    let Some(stats) = manifest.and_then(|m| m.reference_stats.as_ref()) else {
        return Arc::from([]);
    };
    stats
        .inputs
        .iter()
        .filter(|h| {
            let ok = usable_edges(&h.bin_edges);
            if !ok {
                tracing::warn!(input = %h.name, "reference histogram has unusable edges; not sketched");
            }
            ok
        })
        .map(|h| FeatureRef {
            name: h.name.as_str().into(),
            edges: h.bin_edges.as_slice().into(),
            input: h.input.as_deref().unwrap_or(&h.name).into(),
            column: h.column.map(|c| c as usize),
        })
        .collect()
}

/// One request's feature histograms, computed before taking the window's
/// lock: `(index into the refs, sketch)` for each input with a reference.
pub fn feature_delta(
    refs: &[FeatureRef],
    inputs: &[(String, Tensor)],
) -> Vec<(usize, FeatureSketch)> {
    refs.iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let (_, tensor) = inputs.iter().find(|(n, _)| **n == *r.input)?;
            let mut s = FeatureSketch::new(r.name.clone(), r.edges.clone());
            let used = match r.column {
                None => s.add_tensor(tensor),
                Some(c) => s.add_column(tensor, c),
            };
            used.then_some((i, s))
        })
        .collect()
}

/// A uniform sample of at most `capacity` of the candidates offered
/// (Vitter's algorithm R).
#[derive(Debug, Clone, Default)]
pub struct Reservoir {
    capacity: usize,
    seen: u64,
    kept: Vec<pb::Sample>,
}

impl Reservoir {
    pub fn new(capacity: usize) -> Reservoir {
        Reservoir {
            capacity,
            ..Default::default()
        }
    }

    /// Offers one more candidate; returns the slot to put it in, if it is
    /// chosen. `draw(n)` is uniform in `0..n`.
    pub fn offer(&mut self, draw: impl FnOnce(u64) -> u64) -> Option<usize> {
        if self.capacity == 0 {
            return None;
        }
        self.seen += 1;
        if self.kept.len() < self.capacity {
            return Some(self.kept.len());
        }
        let j = draw(self.seen);
        usize::try_from(j).ok().filter(|&j| j < self.capacity)
    }

    /// Fills a slot `offer` returned.
    pub fn place(&mut self, slot: usize, sample: pb::Sample) {
        if slot == self.kept.len() {
            self.kept.push(sample);
        } else if let Some(s) = self.kept.get_mut(slot) {
            *s = sample;
        }
    }

    /// Labels a kept sample; false if `request_id` is not kept.
    pub fn label(&mut self, request_id: &str, label: i64) -> bool {
        match self.kept.iter_mut().find(|s| s.request_id == request_id) {
            Some(s) => {
                s.label = Some(label);
                true
            }
            None => false,
        }
    }

    pub fn seen(&self) -> u64 {
        self.seen
    }

    pub fn take(&mut self) -> Vec<pb::Sample> {
        std::mem::take(&mut self.kept)
    }
}

/// What one model version did during one window.
#[derive(Debug)]
pub struct ModelWindow {
    /// Set when the window was closed; a request that finds it set records
    /// into the next window instead.
    pub closed: bool,
    pub requests: u64,
    pub errors: u64,
    pub latency: LatencyHistogram,
    pub features: Vec<FeatureSketch>,
    pub classes: BTreeMap<i64, u64>,
    pub confidence: [u64; CONFIDENCE_BINS],
    pub low_confidence: u64,
    pub hard: Reservoir,
}

impl ModelWindow {
    pub fn new(refs: &[FeatureRef], hard_capacity: usize) -> ModelWindow {
        ModelWindow {
            closed: false,
            requests: 0,
            errors: 0,
            latency: LatencyHistogram::default(),
            features: refs
                .iter()
                .map(|r| FeatureSketch::new(r.name.clone(), r.edges.clone()))
                .collect(),
            classes: BTreeMap::new(),
            confidence: [0; CONFIDENCE_BINS],
            low_confidence: 0,
            hard: Reservoir::new(hard_capacity),
        }
    }

    /// Adds one request. Returns the rows whose confidence is under
    /// `threshold` (hard-example candidates).
    pub fn record(
        &mut self,
        ok: bool,
        latency: Duration,
        features: &[(usize, FeatureSketch)],
        predictions: &[Option<Prediction>],
        threshold: f64,
    ) -> Vec<usize> {
        self.requests += 1;
        self.errors += u64::from(!ok);
        self.latency.record(latency);
        for (i, delta) in features {
            if let Some(f) = self.features.get_mut(*i) {
                f.merge(delta);
            }
        }
        let mut low = vec![];
        for (row, p) in predictions.iter().enumerate() {
            let Some(p) = p else { continue };
            *self.classes.entry(p.class).or_default() += 1;
            self.confidence[confidence_bin(p.confidence)] += 1;
            if p.confidence < threshold {
                self.low_confidence += 1;
                low.push(row);
            }
        }
        low
    }

    pub fn to_sketch(
        &self,
        model: &str,
        version: &str,
        start: SystemTime,
        end: SystemTime,
    ) -> pb::ModelSketch {
        pb::ModelSketch {
            model_name: model.to_string(),
            model_version: version.to_string(),
            window_start: Some(start.into()),
            window_end: Some(end.into()),
            requests: self.requests,
            errors: self.errors,
            latency_p50_ms: self.latency.quantile_ms(0.5),
            latency_p99_ms: self.latency.quantile_ms(0.99),
            features: self.features.iter().map(FeatureSketch::to_proto).collect(),
            classes: class_counts(&self.classes),
            confidence_counts: self.confidence.to_vec(),
            low_confidence: self.low_confidence,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    #[test]
    fn reservoir_keeps_the_first_then_replaces_by_draw() {
        let mut r = Reservoir::new(2);
        assert_eq!(r.offer(|_| unreachable!()), Some(0));
        r.place(0, pb::Sample::default());
        assert_eq!(r.offer(|_| unreachable!()), Some(1));
        r.place(
            1,
            pb::Sample {
                request_id: "b".into(),
                ..Default::default()
            },
        );
        // The third candidate replaces slot j when the draw j < capacity.
        assert_eq!(r.offer(|n| n - 1), None);
        assert_eq!(r.offer(|_| 1), Some(1));
        assert_eq!(r.seen(), 4);
        assert!(r.label("b", 7));
        assert!(!r.label("zz", 7));
        assert_eq!(r.take().len(), 2);
        assert_eq!(Reservoir::new(0).offer(|_| 0), None);
    }

    #[test]
    fn a_tabular_input_is_sketched_per_column_under_each_feature_name() {
        let edges: Arc<[f64]> = vec![0.0, 10.0, 20.0].into();
        let refs = [
            FeatureRef {
                name: "x".into(),
                edges: edges.clone(),
                input: "x".into(),
                column: None,
            },
            FeatureRef {
                name: "dew_point".into(),
                edges: edges.clone(),
                input: "x".into(),
                column: Some(1),
            },
            FeatureRef {
                name: "past_the_end".into(),
                edges,
                input: "x".into(),
                column: Some(3),
            },
        ];
        // Two rows of three features: column 1 is 15 in both.
        let x = Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, 15.0, 2.0, 3.0, 15.0, 4.0]).unwrap(),
        );
        let delta = feature_delta(&refs, &[("x".to_string(), x)]);
        let by_name: BTreeMap<&str, Vec<u64>> = delta
            .iter()
            .map(|(_, s)| (&*s.name, s.counts.clone()))
            .collect();
        assert_eq!(by_name["x"], vec![4, 2], "every element, pooled");
        assert_eq!(by_name["dew_point"], vec![0, 2], "column 1 alone");
        assert!(
            !by_name.contains_key("past_the_end"),
            "a column the tensor lacks is skipped"
        );
    }

    #[test]
    fn a_window_counts_classes_confidence_and_features() {
        let refs = [FeatureRef {
            name: "x".into(),
            edges: vec![0.0, 1.0, 2.0].into(),
            input: "x".into(),
            column: None,
        }];
        let mut w = ModelWindow::new(&refs, 4);
        let inputs = vec![(
            "x".to_string(),
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![0.5, 5.0]).unwrap()),
        )];
        let delta = feature_delta(&refs, &inputs);
        let preds = [
            Some(Prediction {
                class: 1,
                confidence: 0.95,
            }),
            Some(Prediction {
                class: 0,
                confidence: 0.3,
            }),
            None,
        ];
        let low = w.record(true, Duration::from_millis(3), &delta, &preds, 0.6);
        assert_eq!(low, vec![1]);
        w.record(false, Duration::from_millis(3), &[], &[], 0.6);
        let s = w.to_sketch("m", "1", SystemTime::UNIX_EPOCH, SystemTime::UNIX_EPOCH);
        assert_eq!((s.requests, s.errors, s.low_confidence), (2, 1, 1));
        assert_eq!(s.features[0].counts, vec![1, 0]);
        assert_eq!(s.features[0].overflow, 1);
        assert_eq!(
            s.classes,
            vec![
                pb::ClassCount { class: 0, count: 1 },
                pb::ClassCount { class: 1, count: 1 }
            ]
        );
        assert_eq!(s.confidence_counts[3], 1);
        assert_eq!(s.confidence_counts[9], 1);
    }
}
