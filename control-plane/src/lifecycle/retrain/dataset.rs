//! The dataset snapshot of a retrain: a recent window of the original
//! training set plus the labelled samples the devices uploaded, with the
//! newest labelled samples held out as the eval set. Pure: the step reads
//! the store and the artifact, this decides what goes in.
//!
//! Layout (npz): `input` (f32, `[n, ...sample shape]`) and `label` (int64)
//! train; `eval_input` and `eval_label` evaluate. Single-input models only.

use std::collections::BTreeSet;

use base64::Engine as _;
use edgeloop_models::npz::Npz;
use edgeloop_models::Tensor;
use ndarray::{ArrayD, IxDyn};

use edgeloop_drift::records::{SampleKind, SampleRecord};

pub const INPUT: &str = "input";
pub const LABEL: &str = "label";
pub const EVAL_INPUT: &str = "eval_input";
pub const EVAL_LABEL: &str = "eval_label";

/// One labelled row a device saw.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeRow {
    /// Unix nanoseconds; rows sort by it.
    pub at: i128,
    pub x: Vec<f32>,
    pub label: i64,
    /// A hard example (a row the device was unsure of, labelled through
    /// the labelling queue or by feedback), not plain feedback: the policy
    /// may weight it.
    pub hard: bool,
}

/// Rows in `base` (`input`, `label`).
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub sample_shape: Vec<usize>,
    pub x: Vec<f32>,
    pub y: Vec<i64>,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.y.len()
    }

    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// The last `n` rows.
    pub fn tail(&self, n: usize) -> Rows {
        let skip = self.len().saturating_sub(n);
        let width = self.x.len() / self.len().max(1);
        Rows {
            sample_shape: self.sample_shape.clone(),
            x: self.x[skip * width..].to_vec(),
            y: self.y[skip..].to_vec(),
        }
    }

    /// Reads `input`/`label` from an uploaded npz; errors say what is wrong.
    pub fn from_npz(npz: &Npz) -> Result<Rows, String> {
        let x = npz
            .get(INPUT)
            .ok_or("the base dataset has no `input` array")?;
        let y = npz
            .get(LABEL)
            .ok_or("the base dataset has no `label` array")?;
        let Tensor::F32(x) = x else {
            return Err(format!(
                "the base dataset's input is {}, not float32",
                x.dtype()
            ));
        };
        let Tensor::I64(y) = y else {
            return Err(format!(
                "the base dataset's label is {}, not int64",
                y.dtype()
            ));
        };
        if x.ndim() < 2 || y.ndim() != 1 || x.shape()[0] != y.len() {
            return Err(format!(
                "the base dataset's input {:?} and label {:?} do not have one label per row",
                x.shape(),
                y.shape()
            ));
        }
        Ok(Rows {
            sample_shape: x.shape()[1..].to_vec(),
            x: x.iter().copied().collect(),
            y: y.iter().copied().collect(),
        })
    }
}

/// The labelled rows of `records` whose input has `width` f32 values, once
/// per `(device, request)`, oldest first. Rows that do not fit (another
/// input layout, no label) are counted in the second value and skipped.
pub fn edge_rows(records: &[SampleRecord], width: Option<usize>) -> (Vec<EdgeRow>, usize) {
    let mut seen = BTreeSet::new();
    let mut rows = vec![];
    let mut skipped = 0;
    for r in records {
        let Some(label) = r.label else {
            continue;
        };
        if !seen.insert((r.device.as_str(), r.request_id.as_str())) {
            continue;
        }
        let decoded = (r.inputs.len() == 1 && r.inputs[0].dtype == "float32")
            .then(|| {
                base64::engine::general_purpose::STANDARD
                    .decode(&r.inputs[0].data_base64)
                    .ok()
            })
            .flatten()
            .filter(|b| b.len() % 4 == 0)
            .map(|b| {
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect::<Vec<f32>>()
            })
            .filter(|x| width.is_none_or(|w| x.len() == w) && x.iter().all(|v| v.is_finite()));
        match decoded {
            Some(x) => rows.push(EdgeRow {
                at: r.at().map_or(0, |t| t.unix_timestamp_nanos()),
                x,
                label,
                hard: r.kind == SampleKind::HardExample,
            }),
            None => skipped += 1,
        }
    }
    rows.sort_by_key(|r| r.at);
    (rows, skipped)
}

/// Edge rows (sorted by time) observed after `since` (Unix nanoseconds):
/// what a pipeline started at `since` can learn that it could not before.
pub fn fresh_rows(edge: &[EdgeRow], since: i128) -> usize {
    edge.len() - edge.partition_point(|r| r.at <= since)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub npz: Npz,
    pub train_rows: usize,
    pub eval_rows: usize,
    pub edge_rows: usize,
    /// Labelled hard examples among the edge rows (each counted once,
    /// however weighted).
    pub hard_examples: usize,
}

/// `base` (already windowed) and the older edge rows train, each labelled
/// hard example `hard_weight` times; the newest `eval_fraction` of the
/// edge rows evaluate, once each (weighting the measure would only
/// distort it).
pub fn build(
    base: Option<&Rows>,
    edge: &[EdgeRow],
    sample_shape: &[usize],
    eval_fraction: f64,
    min_eval: u64,
    hard_weight: u32,
) -> Result<Snapshot, String> {
    let n_eval = ((edge.len() as f64) * eval_fraction).round() as usize;
    if (n_eval as u64) < min_eval {
        return Err(format!(
            "{} labelled edge samples give {n_eval} to evaluate on; the policy needs at least {min_eval} \
             (min_eval_samples): send more feedback labels",
            edge.len()
        ));
    }
    let width: usize = sample_shape.iter().product();
    let (train_edge, eval_edge) = edge.split_at(edge.len() - n_eval);
    let mut x = vec![];
    let mut y = vec![];
    if let Some(b) = base {
        if b.sample_shape != sample_shape {
            return Err(format!(
                "the base dataset's rows are {:?}, the model's input rows {sample_shape:?}",
                b.sample_shape
            ));
        }
        x.extend_from_slice(&b.x);
        y.extend_from_slice(&b.y);
    }
    for r in train_edge {
        let times = if r.hard { hard_weight.max(1) } else { 1 };
        for _ in 0..times {
            x.extend_from_slice(&r.x);
            y.push(r.label);
        }
    }
    if y.is_empty() {
        return Err("nothing to train on: no base dataset rows and no older edge samples".into());
    }
    let ex: Vec<f32> = eval_edge.iter().flat_map(|r| r.x.iter().copied()).collect();
    let ey: Vec<i64> = eval_edge.iter().map(|r| r.label).collect();
    debug_assert_eq!(x.len(), y.len() * width);
    let shaped = |n: usize| {
        let mut s = vec![n];
        s.extend_from_slice(sample_shape);
        s
    };
    let arr = |shape: Vec<usize>, v: Vec<f32>| {
        ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| e.to_string())
    };
    let labels =
        |v: Vec<i64>| ArrayD::from_shape_vec(IxDyn(&[v.len()]), v).map_err(|e| e.to_string());
    let (train_rows, eval_rows) = (y.len(), ey.len());
    let mut npz = Npz::new();
    npz.insert(INPUT, Tensor::F32(arr(shaped(train_rows), x)?));
    npz.insert(LABEL, Tensor::I64(labels(y)?));
    npz.insert(EVAL_INPUT, Tensor::F32(arr(shaped(eval_rows), ex)?));
    npz.insert(EVAL_LABEL, Tensor::I64(labels(ey)?));
    Ok(Snapshot {
        npz,
        train_rows,
        eval_rows,
        edge_rows: edge.len(),
        hard_examples: edge.iter().filter(|r| r.hard).count(),
    })
}

/// The snapshot's eval (or training) part under the model's input name,
/// as `edgeloop_models::dataset::Dataset` reads it.
pub fn part_for_model(snapshot: &Npz, input_name: &str, eval: bool) -> Result<Npz, String> {
    let (xk, yk) = if eval {
        (EVAL_INPUT, EVAL_LABEL)
    } else {
        (INPUT, LABEL)
    };
    let mut out = Npz::new();
    out.insert(
        input_name,
        snapshot
            .get(xk)
            .ok_or(format!("snapshot has no {xk}"))?
            .clone(),
    );
    out.insert(
        edgeloop_models::dataset::LABEL_KEY,
        snapshot
            .get(yk)
            .ok_or(format!("snapshot has no {yk}"))?
            .clone(),
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeloop_drift::records::SampleTensorRecord;

    fn sample(device: &str, req: &str, at: i64, x: &[f32], label: Option<i64>) -> SampleRecord {
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        SampleRecord {
            received_at: None,
            device: device.into(),
            sequence: 1,
            kind: SampleKind::Feedback,
            model_name: "m".into(),
            model_version: "1".into(),
            request_id: req.into(),
            observed_at: Some(time::OffsetDateTime::from_unix_timestamp(at).unwrap()),
            inputs: vec![SampleTensorRecord {
                name: "input".into(),
                dtype: "float32".into(),
                shape: vec![1, x.len() as u64],
                data_base64: base64::engine::general_purpose::STANDARD.encode(bytes),
            }],
            predicted_class: Some(0),
            confidence: Some(0.9),
            label,
            labelled_at: None,
            labelled_by: None,
        }
    }

    #[test]
    fn fresh_rows_are_the_ones_observed_after_the_start() {
        let at = |t: i128| EdgeRow {
            at: t,
            x: vec![0.0],
            label: 0,
            hard: false,
        };
        let rows: Vec<EdgeRow> = [10, 20, 20, 30].into_iter().map(at).collect();
        for (since, want) in [(0, 4), (10, 3), (19, 3), (20, 1), (30, 0), (99, 0)] {
            assert_eq!(fresh_rows(&rows, since), want, "since {since}");
        }
        assert_eq!(fresh_rows(&[], 0), 0);
    }

    #[test]
    fn edge_rows_are_labelled_deduplicated_and_in_time_order() {
        let records = vec![
            sample("a", "r2", 20, &[2.0, 2.0], Some(1)),
            sample("a", "r1", 10, &[1.0, 1.0], Some(0)),
            sample("a", "r1", 10, &[1.0, 1.0], Some(0)), // hard example + feedback
            sample("b", "r1", 15, &[3.0, 3.0], Some(1)), // same id, other device
            sample("a", "r3", 30, &[4.0, 4.0], None),    // unlabelled
            sample("a", "r4", 40, &[5.0], Some(1)),      // another layout
        ];
        let (rows, skipped) = edge_rows(&records, Some(2));
        assert_eq!(skipped, 1);
        let xs: Vec<f32> = rows.iter().map(|r| r.x[0]).collect();
        assert_eq!(xs, [1.0, 3.0, 2.0]);
    }

    #[test]
    fn labelled_hard_examples_train_as_often_as_the_policy_weights_them() {
        let mut edge = rows(10, 0);
        for r in edge.iter_mut().take(4) {
            r.hard = true;
        }
        edge[9].hard = true; // evaluates: once, unweighted
        for (weight, train_rows) in [(1, 7), (3, 15)] {
            let s = build(None, &edge, &[2], 0.3, 3, weight).unwrap();
            assert_eq!(
                (s.train_rows, s.eval_rows, s.edge_rows, s.hard_examples),
                (train_rows, 3, 10, 5),
                "weight {weight}"
            );
        }
        // The hard rows come in whole: x and label repeated together.
        let s = build(None, &edge, &[2], 0.3, 3, 2).unwrap();
        let Tensor::I64(y) = s.npz.get(LABEL).unwrap() else {
            panic!()
        };
        assert_eq!(y.iter().copied().collect::<Vec<_>>()[..4], [0, 0, 1, 1]);
    }

    fn rows(n: usize, at0: i128) -> Vec<EdgeRow> {
        (0..n)
            .map(|i| EdgeRow {
                at: at0 + i as i128,
                x: vec![i as f32, 0.0],
                label: (i % 2) as i64,
                hard: false,
            })
            .collect()
    }

    #[test]
    fn the_newest_edge_rows_evaluate_and_the_rest_train_with_the_base_window() {
        let base = Rows {
            sample_shape: vec![2],
            x: (0..20).map(|v| v as f32).collect(),
            y: vec![0; 10],
        };
        let s = build(Some(&base.tail(4)), &rows(10, 0), &[2], 0.3, 3, 1).unwrap();
        assert_eq!((s.train_rows, s.eval_rows, s.edge_rows), (4 + 7, 3, 10));
        let Tensor::F32(ex) = s.npz.get(EVAL_INPUT).unwrap() else {
            panic!()
        };
        assert_eq!(ex.shape(), &[3, 2]);
        assert_eq!(ex[[0, 0]], 7.0, "rows 7..10 are the newest");
        let Tensor::F32(x) = s.npz.get(INPUT).unwrap() else {
            panic!()
        };
        assert_eq!(x[[0, 0]], 12.0, "the base window is its last 4 rows");
        let back = Npz::from_bytes(&s.npz.to_bytes().unwrap()).unwrap();
        assert_eq!(back, s.npz);
    }

    #[test]
    fn too_few_labels_or_a_mismatched_base_are_refused_with_the_reason() {
        let e = build(None, &rows(10, 0), &[2], 0.3, 5, 1).unwrap_err();
        assert!(e.contains("min_eval_samples"), "{e}");
        let base = Rows {
            sample_shape: vec![3],
            x: vec![0.0; 3],
            y: vec![0],
        };
        let e = build(Some(&base), &rows(10, 0), &[2], 0.3, 1, 1).unwrap_err();
        assert!(e.contains("[3]"), "{e}");
        let e = build(None, &rows(2, 0), &[2], 0.5, 1, 1).unwrap();
        assert_eq!((e.train_rows, e.eval_rows), (1, 1));
        let e = build(None, &rows(1, 0), &[2], 0.9, 1, 1).unwrap_err();
        assert!(e.contains("nothing to train on"), "{e}");
    }
}
