//! What the gate measures, by task: the metric, its unit, and how a
//! candidate's outputs are scored against float's (and labels, when given).
//! Pure functions over collected outputs; `evaluate` runs the models.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::detect::{self, Agreement, DetectionSpec};
use super::evaluate::Outputs;
use super::QuantizeError;
use crate::dataset::{Dataset, LabelBox};
use crate::onnx::{Dim, Inspection};

/// What the evaluation set says is right, when it says anything: class
/// labels, labelled boxes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Truth<'a> {
    pub classes: Option<&'a [i64]>,
    pub boxes: Option<&'a [Vec<LabelBox>]>,
}

impl<'a> Truth<'a> {
    pub fn of(data: &'a Dataset) -> Truth<'a> {
        Truth {
            classes: data.labels.as_deref(),
            boxes: data.boxes.as_deref(),
        }
    }
}

/// A recurrent state: the output fed back into the input at the next call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePair {
    pub input: String,
    pub output: String,
}

/// What the model does, which decides what the gate measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Task {
    /// Top-1 of the first output (scores over the last axis).
    Classification,
    /// Boxes after decoding and NMS (YOLOv8 layout, see `detect`).
    Detection(DetectionSpec),
    /// Every output compared as numbers: regression, embeddings.
    Regression,
    /// Calls run in order with each state output fed back; the outputs
    /// that are not state are compared step by step.
    Stateful { state: Vec<StatePair> },
}

impl Task {
    pub fn name(&self) -> &'static str {
        match self {
            Task::Classification => "classification",
            Task::Detection(_) => "detection",
            Task::Regression => "regression",
            Task::Stateful { .. } => "stateful",
        }
    }

    /// The task a model most likely has, when the user did not say. A
    /// detector is never guessed: its raw output reads as regression.
    pub fn infer(summary: &Inspection, has_labels: bool) -> Task {
        let state = state_pairs(summary);
        if !state.is_empty() {
            return Task::Stateful { state };
        }
        if has_labels {
            return Task::Classification;
        }
        let scores = summary.outputs.first().is_some_and(|o| {
            o.dtype == "float32" && matches!(o.shape.as_deref(), Some([_, Dim::Fixed(c)]) if *c > 1)
        });
        if scores {
            Task::Classification
        } else {
            Task::Regression
        }
    }
}

/// Inputs with an output named after them (`state` → `stateN`, `h` →
/// `h_out`) of the same type and rank: the recurrent state.
pub fn state_pairs(summary: &Inspection) -> Vec<StatePair> {
    let mut pairs = vec![];
    for i in &summary.inputs {
        let Some(rank) = i.shape.as_ref().map(Vec::len) else {
            continue;
        };
        if rank == 0 {
            continue;
        }
        if let Some(o) = summary.outputs.iter().find(|o| {
            o.name != i.name
                && o.name.starts_with(&i.name)
                && o.dtype == i.dtype
                && o.shape.as_ref().map(Vec::len) == Some(rank)
        }) {
            pairs.push(StatePair {
                input: i.name.clone(),
                output: o.name.clone(),
            });
        }
    }
    pairs
}

/// The gate's measure of a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// Percent of samples whose top-1 class equals the label.
    Top1Accuracy,
    /// Percent of samples whose top-1 class equals float's (no labels).
    Top1Agreement,
    /// F1, in percent, of the candidate's boxes matched to float's.
    BoxAgreementF1,
    /// mAP at IoU 0.5, in percent, against labelled boxes.
    BoxMap50,
    /// ‖candidate − float‖₂ / ‖float‖₂ over the whole set.
    RelativeL2,
    /// The same over a sequence run with its state carried.
    StepRelativeL2,
}

impl MetricKind {
    pub fn for_task(task: &Task, truth: &Truth<'_>) -> MetricKind {
        match task {
            Task::Classification if truth.classes.is_some() => MetricKind::Top1Accuracy,
            Task::Classification => MetricKind::Top1Agreement,
            Task::Detection(_) if truth.boxes.is_some() => MetricKind::BoxMap50,
            Task::Detection(_) => MetricKind::BoxAgreementF1,
            Task::Regression => MetricKind::RelativeL2,
            Task::Stateful { .. } => MetricKind::StepRelativeL2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MetricKind::Top1Accuracy => "top1_accuracy",
            MetricKind::Top1Agreement => "top1_agreement",
            MetricKind::BoxAgreementF1 => "box_agreement_f1",
            MetricKind::BoxMap50 => "box_map50",
            MetricKind::RelativeL2 => "relative_l2",
            MetricKind::StepRelativeL2 => "step_relative_l2",
        }
    }

    /// The unit of the metric, which is also the unit of the budget.
    pub fn unit(self) -> &'static str {
        match self {
            MetricKind::Top1Accuracy
            | MetricKind::Top1Agreement
            | MetricKind::BoxAgreementF1
            | MetricKind::BoxMap50 => "percentage points",
            MetricKind::RelativeL2 | MetricKind::StepRelativeL2 => "fraction of float's L2 norm",
        }
    }

    pub fn higher_is_better(self) -> bool {
        matches!(
            self,
            MetricKind::Top1Accuracy
                | MetricKind::Top1Agreement
                | MetricKind::BoxAgreementF1
                | MetricKind::BoxMap50
        )
    }

    /// The budget when the user gives none: one top-1 point, two points of
    /// box F1 (a box flickering at the threshold costs more than a class),
    /// 5 % of the output's norm.
    pub fn default_budget(self) -> f64 {
        match self {
            MetricKind::Top1Accuracy | MetricKind::Top1Agreement => 1.0,
            MetricKind::BoxAgreementF1 | MetricKind::BoxMap50 => 2.0,
            MetricKind::RelativeL2 | MetricKind::StepRelativeL2 => 0.05,
        }
    }

    /// How much worse `value` is than float's, in the metric's unit.
    pub fn loss(self, float: f64, value: f64) -> f64 {
        if self.higher_is_better() {
            float - value
        } else {
            value - float
        }
    }
}

/// A metric's value and the numbers that explain it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    pub value: f64,
    pub details: BTreeMap<String, f64>,
}

/// Top-1 class of each sample's first output.
pub fn top1(outputs: &Outputs) -> Vec<i64> {
    outputs
        .samples
        .iter()
        .map(|s| {
            let values = s.first().map(|r| r.values.as_slice()).unwrap_or(&[]);
            values
                .iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
                    if v > b.1 {
                        (i, v)
                    } else {
                        b
                    }
                })
                .0 as i64
        })
        .collect()
}

fn percent_equal(a: &[i64], b: &[i64]) -> f64 {
    let hits = a.iter().zip(b).filter(|(x, y)| x == y).count();
    100.0 * hits as f64 / b.len().max(1) as f64
}

/// Scores `candidate` against `reference` (float's outputs on the same set).
/// Scoring float against itself gives its own value (its accuracy, or the
/// perfect agreement), so losses are comparable.
pub fn score(
    kind: MetricKind,
    task: &Task,
    reference: &Outputs,
    candidate: &Outputs,
    truth: Truth<'_>,
) -> Result<Score, QuantizeError> {
    let labels = truth.classes;
    if reference.samples.len() != candidate.samples.len() {
        return Err(QuantizeError::Data(format!(
            "{} samples against float's {}",
            candidate.samples.len(),
            reference.samples.len()
        )));
    }
    if let Some(bad) = candidate.first_non_finite() {
        return Err(QuantizeError::Data(format!(
            "output {bad:?} holds NaN or infinity"
        )));
    }
    let mut details = BTreeMap::new();
    let value = match kind {
        MetricKind::Top1Accuracy | MetricKind::Top1Agreement => {
            let pred = top1(candidate);
            let float = top1(reference);
            let agreement = percent_equal(&pred, &float);
            details.insert("top1_agreement".into(), agreement);
            match (kind, labels) {
                (MetricKind::Top1Accuracy, Some(l)) => percent_equal(&pred, l),
                (MetricKind::Top1Accuracy, None) => {
                    return Err(QuantizeError::Data("top-1 accuracy needs labels".into()))
                }
                _ => agreement,
            }
        }
        MetricKind::BoxMap50 => {
            let (Task::Detection(spec), Some(boxes)) = (task, truth.boxes) else {
                return Err(QuantizeError::Data(
                    "mAP needs a detection task and labelled boxes".into(),
                ));
            };
            let decoded = candidate
                .samples
                .iter()
                .map(|s| s.first().map_or(Ok(vec![]), |r| boxes_of(r, spec)))
                .collect::<Result<Vec<_>, _>>()?;
            let agreement = box_agreement(reference, candidate, spec)?;
            details.insert("box_agreement_f1".into(), agreement.f1_percent());
            details.insert(
                "boxes_labelled".into(),
                boxes.iter().map(Vec::len).sum::<usize>() as f64,
            );
            detect::map_percent(&decoded, boxes, 0.5)
        }
        MetricKind::BoxAgreementF1 => {
            let Task::Detection(spec) = task else {
                return Err(QuantizeError::Data(
                    "box agreement needs a detection task".into(),
                ));
            };
            let total = box_agreement(reference, candidate, spec)?;
            details.insert("boxes_float".into(), total.reference as f64);
            details.insert("boxes_candidate".into(), total.candidate as f64);
            details.insert("boxes_matched".into(), total.matched as f64);
            let m = total.matched.max(1) as f64;
            details.insert(
                "mean_matched_iou".into(),
                if total.matched > 0 {
                    total.iou / m
                } else {
                    0.0
                },
            );
            details.insert("mean_score_difference".into(), total.score_diff / m);
            total.f1_percent()
        }
        MetricKind::RelativeL2 | MetricKind::StepRelativeL2 => {
            let (rel, cosine, max_abs) = relative_l2(reference, candidate);
            details.insert("mean_cosine".into(), cosine);
            details.insert("max_abs_difference".into(), max_abs);
            rel
        }
    };
    Ok(Score { value, details })
}

/// One sample's first output as boxes: a batched row is `[4 + classes,
/// anchors]`; a per-call one has the batch axis of 1 in front.
fn boxes_of(
    o: &super::evaluate::Row,
    spec: &DetectionSpec,
) -> Result<Vec<detect::Detection>, QuantizeError> {
    let shape: Vec<usize> = match o.shape.as_slice() {
        [1, rest @ ..] if rest.len() == 2 => rest.to_vec(),
        s => s.to_vec(),
    };
    detect::decode(&o.values, &shape, spec).map_err(|e| QuantizeError::Data(e.to_string()))
}

fn box_agreement(
    reference: &Outputs,
    candidate: &Outputs,
    spec: &DetectionSpec,
) -> Result<Agreement, QuantizeError> {
    let mut total = Agreement::default();
    for (r, c) in reference.samples.iter().zip(&candidate.samples) {
        let (Some(r), Some(c)) = (r.first(), c.first()) else {
            return Err(QuantizeError::Data("the detector has no outputs".into()));
        };
        total.add(&detect::agreement(
            &boxes_of(r, spec)?,
            &boxes_of(c, spec)?,
            spec.match_iou,
        ));
    }
    Ok(total)
}

/// (‖c − f‖ / ‖f‖ over everything, mean per-sample cosine, max |c − f|).
fn relative_l2(reference: &Outputs, candidate: &Outputs) -> (f64, f64, f64) {
    let (mut diff2, mut ref2, mut cos_sum, mut max_abs) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (r, c) in reference.samples.iter().zip(&candidate.samples) {
        let (mut dot, mut rr, mut cc) = (0.0f64, 0.0f64, 0.0f64);
        for (ro, co) in r.iter().zip(c) {
            for (&a, &b) in ro.values.iter().zip(&co.values) {
                let (a, b) = (f64::from(a), f64::from(b));
                diff2 += (b - a) * (b - a);
                max_abs = max_abs.max((b - a).abs());
                dot += a * b;
                rr += a * a;
                cc += b * b;
            }
        }
        ref2 += rr;
        cos_sum += if rr == 0.0 && cc == 0.0 {
            1.0
        } else if rr == 0.0 || cc == 0.0 {
            0.0
        } else {
            dot / (rr.sqrt() * cc.sqrt())
        };
    }
    let n = reference.samples.len().max(1) as f64;
    let rel = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else if diff2 == 0.0 {
        0.0
    } else {
        1.0
    };
    (rel, cos_sum / n, max_abs)
}

#[cfg(test)]
mod tests {
    use super::super::evaluate::Row;
    use super::*;

    fn outputs(rows: &[&[f32]]) -> Outputs {
        Outputs {
            names: vec!["y".into()],
            samples: rows
                .iter()
                .map(|r| {
                    vec![Row {
                        shape: vec![r.len()],
                        values: r.to_vec(),
                    }]
                })
                .collect(),
        }
    }

    #[test]
    fn each_metric_scores_float_against_itself_as_perfect() {
        let f = outputs(&[&[0.1, 0.9], &[0.8, 0.2]]);
        let table = [
            (MetricKind::Top1Agreement, Task::Classification, 100.0),
            (MetricKind::RelativeL2, Task::Regression, 0.0),
            (
                MetricKind::StepRelativeL2,
                Task::Stateful { state: vec![] },
                0.0,
            ),
        ];
        for (kind, task, want) in table {
            let s = score(kind, &task, &f, &f, Truth::default()).unwrap();
            assert_eq!(s.value, want, "{kind:?}");
            assert_eq!(kind.loss(s.value, s.value), 0.0);
        }
    }

    #[test]
    fn classification_with_and_without_labels() {
        let f = outputs(&[&[0.1, 0.9], &[0.8, 0.2], &[0.3, 0.7], &[0.6, 0.4]]);
        let c = outputs(&[&[0.1, 0.9], &[0.4, 0.6], &[0.3, 0.7], &[0.6, 0.4]]);
        let labels = [1, 0, 0, 0];
        let acc = score(
            MetricKind::Top1Accuracy,
            &Task::Classification,
            &f,
            &c,
            Truth {
                classes: Some(&labels),
                boxes: None,
            },
        )
        .unwrap();
        assert_eq!(acc.value, 50.0);
        assert_eq!(acc.details["top1_agreement"], 75.0);
        let agree = score(
            MetricKind::Top1Agreement,
            &Task::Classification,
            &f,
            &c,
            Truth::default(),
        )
        .unwrap();
        assert_eq!(agree.value, 75.0);
        assert_eq!(MetricKind::Top1Agreement.loss(100.0, agree.value), 25.0);
        assert!(score(
            MetricKind::Top1Accuracy,
            &Task::Classification,
            &f,
            &c,
            Truth::default()
        )
        .is_err());
    }

    #[test]
    fn relative_l2_is_over_the_whole_set_and_cosine_per_sample() {
        let f = outputs(&[&[3.0, 4.0], &[0.0, 0.0]]);
        let c = outputs(&[&[3.0, 4.5], &[0.0, 0.0]]);
        let s = score(
            MetricKind::RelativeL2,
            &Task::Regression,
            &f,
            &c,
            Truth::default(),
        )
        .unwrap();
        assert!((s.value - 0.1).abs() < 1e-9, "{s:?}");
        assert!((s.details["max_abs_difference"] - 0.5).abs() < 1e-9);
        assert!(s.details["mean_cosine"] > 0.99);
        // A near-zero reference sample does not blow the metric up.
        let tiny = outputs(&[&[3.0, 4.0], &[1e-6, 0.0]]);
        let off = outputs(&[&[3.0, 4.0], &[2e-6, 0.0]]);
        let s = score(
            MetricKind::RelativeL2,
            &Task::Regression,
            &tiny,
            &off,
            Truth::default(),
        )
        .unwrap();
        assert!(s.value < 1e-6, "{s:?}");
        assert_eq!(MetricKind::RelativeL2.loss(0.0, 0.1), 0.1);
    }

    #[test]
    fn non_finite_outputs_are_an_error_not_a_score() {
        let f = outputs(&[&[1.0, 2.0]]);
        let c = outputs(&[&[1.0, f32::NAN]]);
        assert!(score(
            MetricKind::RelativeL2,
            &Task::Regression,
            &f,
            &c,
            Truth::default()
        )
        .is_err());
        let short = outputs(&[]);
        assert!(score(
            MetricKind::RelativeL2,
            &Task::Regression,
            &f,
            &short,
            Truth::default()
        )
        .is_err());
    }

    #[test]
    fn detection_against_labelled_boxes_is_map_at_half_iou() {
        // One image, 2 classes, 2 anchors: (cx, cy, w, h, s0, s1) per anchor.
        let raw = |anchors: &[[f32; 6]]| {
            let n = anchors.len();
            let mut v = vec![0.0; 6 * n];
            for (a, row) in anchors.iter().enumerate() {
                for (r, x) in row.iter().enumerate() {
                    v[r * n + a] = *x;
                }
            }
            Outputs {
                names: vec!["output0".into()],
                samples: vec![vec![Row {
                    shape: vec![6, n],
                    values: v,
                }]],
            }
        };
        let float = raw(&[
            [5.0, 5.0, 10.0, 10.0, 0.9, 0.0],
            [55.0, 5.0, 10.0, 10.0, 0.0, 0.8],
        ]);
        let lost_one = raw(&[
            [5.0, 5.0, 10.0, 10.0, 0.9, 0.0],
            [55.0, 5.0, 10.0, 10.0, 0.0, 0.1],
        ]);
        let labelled = vec![vec![
            LabelBox {
                bbox: [0.0, 0.0, 10.0, 10.0],
                class: 0,
            },
            LabelBox {
                bbox: [50.0, 0.0, 60.0, 10.0],
                class: 1,
            },
        ]];
        let truth = Truth {
            classes: None,
            boxes: Some(&labelled),
        };
        let task = Task::Detection(DetectionSpec::default());
        assert_eq!(MetricKind::for_task(&task, &truth), MetricKind::BoxMap50);
        assert_eq!(
            MetricKind::for_task(&task, &Truth::default()),
            MetricKind::BoxAgreementF1
        );
        let f = score(MetricKind::BoxMap50, &task, &float, &float, truth).unwrap();
        assert!((f.value - 100.0).abs() < 1e-9, "{f:?}");
        let c = score(MetricKind::BoxMap50, &task, &float, &lost_one, truth).unwrap();
        assert!((c.value - 50.0).abs() < 1e-9, "{c:?}");
        assert!((c.details["box_agreement_f1"] - 100.0 * 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(MetricKind::BoxMap50.loss(f.value, c.value), 50.0);
    }
}
