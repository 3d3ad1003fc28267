//! Detection outputs compared the way a user of the detector sees them:
//! after decoding and non-maximum suppression, box for box. Pure functions
//! over one image's raw output.
//!
//! The layout is YOLOv8's (ultralytics' ONNX export, NudeNet's `320n.onnx`):
//! one output `[4 + classes, anchors]` per image, rows `cx, cy, w, h` then
//! one score per class, and NMS outside the model. Two candidates agree on
//! an image when each box of one has a box of the same class in the other
//! with IoU at least `match_iou`; the metric is the F1 of that matching.

use serde::{Deserialize, Serialize};

/// How raw detector output becomes boxes, and when two boxes match.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectionSpec {
    /// Boxes below this class score are dropped before NMS.
    pub score_threshold: f32,
    /// NMS drops a box overlapping a higher-scored one of its class this much.
    pub nms_iou: f32,
    /// Two boxes of the same class match at this IoU or more.
    pub match_iou: f32,
    /// At most this many boxes per image after NMS.
    pub max_detections: usize,
}

impl Default for DetectionSpec {
    fn default() -> Self {
        // ultralytics' defaults for predict (conf 0.25, iou 0.7 is for
        // val; 0.45 is the common deployment setting) and mAP@0.5's IoU.
        Self {
            score_threshold: 0.25,
            nms_iou: 0.45,
            match_iou: 0.5,
            max_detections: 300,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detection {
    /// x1, y1, x2, y2.
    pub bbox: [f32; 4],
    pub score: f32,
    pub class: usize,
}

/// Why an output cannot be read as detections.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DetectError {
    #[error("a detector output is [4 + classes, anchors] per image, got {0:?}")]
    Shape(Vec<usize>),
}

pub fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |r: &[f32; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// Decodes one image's `[4 + classes, anchors]` output (row-major `values`)
/// and runs class-wise NMS. Deterministic: ties keep the lower anchor index.
pub fn decode(
    values: &[f32],
    shape: &[usize],
    spec: &DetectionSpec,
) -> Result<Vec<Detection>, DetectError> {
    let (rows, anchors) = match shape {
        [rows, anchors] if *rows > 4 && rows * anchors == values.len() => (*rows, *anchors),
        _ => return Err(DetectError::Shape(shape.to_vec())),
    };
    let at = |r: usize, a: usize| values[r * anchors + a];
    let mut boxes = vec![];
    for a in 0..anchors {
        let (class, score) =
            (4..rows)
                .map(|r| (r - 4, at(r, a)))
                .fold((0, f32::NEG_INFINITY), |best, (c, s)| {
                    if s > best.1 {
                        (c, s)
                    } else {
                        best
                    }
                });
        // NaN scores are dropped with those below the threshold.
        if score.is_nan() || score < spec.score_threshold {
            continue;
        }
        let (cx, cy, w, h) = (at(0, a), at(1, a), at(2, a), at(3, a));
        boxes.push(Detection {
            bbox: [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0],
            score,
            class,
        });
    }
    boxes.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut kept: Vec<Detection> = vec![];
    for b in boxes {
        if kept.len() >= spec.max_detections {
            break;
        }
        if kept
            .iter()
            .all(|k| k.class != b.class || iou(&k.bbox, &b.bbox) <= spec.nms_iou)
        {
            kept.push(b);
        }
    }
    Ok(kept)
}

/// How well `candidate`'s boxes reproduce `reference`'s on one image.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Agreement {
    pub matched: usize,
    pub reference: usize,
    pub candidate: usize,
    /// Sum over matched pairs of |score difference|.
    pub score_diff: f64,
    /// Sum over matched pairs of their IoU.
    pub iou: f64,
}

impl Agreement {
    pub fn add(&mut self, o: &Agreement) {
        self.matched += o.matched;
        self.reference += o.reference;
        self.candidate += o.candidate;
        self.score_diff += o.score_diff;
        self.iou += o.iou;
    }

    /// F1 of the matching, in percent; 100 when neither found anything.
    pub fn f1_percent(&self) -> f64 {
        let total = self.reference + self.candidate;
        if total == 0 {
            100.0
        } else {
            100.0 * 2.0 * self.matched as f64 / total as f64
        }
    }
}

/// Greedy matching, highest reference score first, each candidate box used
/// once: the best-IoU unused candidate box of the same class at `match_iou`.
pub fn agreement(reference: &[Detection], candidate: &[Detection], match_iou: f32) -> Agreement {
    let mut used = vec![false; candidate.len()];
    let mut out = Agreement {
        reference: reference.len(),
        candidate: candidate.len(),
        ..Agreement::default()
    };
    for r in reference {
        let best = candidate
            .iter()
            .enumerate()
            .filter(|(i, c)| !used[*i] && c.class == r.class)
            .map(|(i, c)| (i, iou(&r.bbox, &c.bbox)))
            .filter(|(_, v)| *v >= match_iou)
            .fold(None, |best: Option<(usize, f32)>, (i, v)| match best {
                Some((_, bv)) if bv >= v => best,
                _ => Some((i, v)),
            });
        if let Some((i, v)) = best {
            used[i] = true;
            out.matched += 1;
            out.iou += f64::from(v);
            out.score_diff += f64::from((r.score - candidate[i].score).abs());
        }
    }
    out
}

/// mAP at IoU `iou_threshold`, in percent, of `detections` (per image)
/// against `truth` (per image): per class, detections of all images by
/// descending score, each matched to the best-IoU unmatched labelled box of
/// its class and image, precision made monotone and integrated over every
/// recall step (all-point interpolation, as PASCAL VOC 2010+); the mean over
/// the classes that have labelled boxes. 100 when no image has any.
pub fn map_percent(
    detections: &[Vec<Detection>],
    truth: &[Vec<crate::dataset::LabelBox>],
    iou_threshold: f32,
) -> f64 {
    let mut classes: Vec<usize> = truth.iter().flatten().map(|b| b.class).collect();
    classes.sort_unstable();
    classes.dedup();
    if classes.is_empty() {
        return 100.0;
    }
    let mut sum = 0.0;
    for &class in &classes {
        let labelled: usize = truth
            .iter()
            .map(|t| t.iter().filter(|b| b.class == class).count())
            .sum();
        let mut ranked: Vec<(usize, &Detection)> = detections
            .iter()
            .enumerate()
            .flat_map(|(i, d)| d.iter().filter(|d| d.class == class).map(move |d| (i, d)))
            .collect();
        // Stable: ties keep image order, so the result is deterministic.
        ranked.sort_by(|a, b| b.1.score.total_cmp(&a.1.score));
        let mut used: Vec<Vec<bool>> = truth.iter().map(|t| vec![false; t.len()]).collect();
        let (mut tp, mut fp) = (0usize, 0usize);
        let mut curve = vec![];
        for (image, d) in ranked {
            let best = truth
                .get(image)
                .into_iter()
                .flatten()
                .enumerate()
                .filter(|(j, b)| b.class == class && !used[image][*j])
                .map(|(j, b)| (j, iou(&d.bbox, &b.bbox)))
                .filter(|(_, v)| *v >= iou_threshold)
                .fold(None, |best: Option<(usize, f32)>, (j, v)| match best {
                    Some((_, bv)) if bv >= v => best,
                    _ => Some((j, v)),
                });
            match best {
                Some((j, _)) => {
                    used[image][j] = true;
                    tp += 1;
                }
                None => fp += 1,
            }
            curve.push((tp as f64 / labelled as f64, tp as f64 / (tp + fp) as f64));
        }
        // Monotone precision from the right, then the area over recall steps.
        let mut ap = 0.0;
        let mut best_precision: f64 = 0.0;
        let mut next_recall = curve.last().map_or(0.0, |c| c.0);
        for &(recall, precision) in curve.iter().rev() {
            ap += (next_recall - recall).max(0.0) * best_precision;
            best_precision = best_precision.max(precision);
            next_recall = recall;
        }
        ap += next_recall * best_precision;
        sum += ap;
    }
    100.0 * sum / classes.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::LabelBox;

    #[test]
    fn map_is_100_for_the_labels_and_falls_with_misses_and_false_alarms() {
        let gt = |x: f32, class| LabelBox {
            bbox: [x, 0.0, x + 10.0, 10.0],
            class,
        };
        let det = |x: f32, class, score| Detection {
            bbox: [x, 0.0, x + 10.0, 10.0],
            score,
            class,
        };
        let truth = vec![vec![gt(0.0, 0), gt(50.0, 1)], vec![gt(0.0, 0)]];
        let perfect = vec![
            vec![det(0.0, 0, 0.9), det(50.0, 1, 0.8)],
            vec![det(1.0, 0, 0.7)],
        ];
        assert!((map_percent(&perfect, &truth, 0.5) - 100.0).abs() < 1e-9);
        // Class 1 missed: its AP is 0, class 0's is 1.
        let missed = vec![vec![det(0.0, 0, 0.9)], vec![det(0.0, 0, 0.7)]];
        assert!((map_percent(&missed, &truth, 0.5) - 50.0).abs() < 1e-9);
        // A confident false alarm ranked first in class 0: precision 1/2 at
        // recall 1/2, then 2/3 at recall 1: AP = 0.5·2/3 + 0.5·2/3.
        let alarm = vec![
            vec![det(200.0, 0, 0.99), det(0.0, 0, 0.9), det(50.0, 1, 0.8)],
            vec![det(0.0, 0, 0.7)],
        ];
        let want = 100.0 * (2.0 / 3.0 + 1.0) / 2.0;
        assert!(
            (map_percent(&alarm, &truth, 0.5) - want).abs() < 1e-9,
            "{}",
            map_percent(&alarm, &truth, 0.5)
        );
        // A wrong-class box matches nothing; no labels at all is perfect.
        assert_eq!(
            map_percent(&[vec![det(0.0, 1, 0.9)]], &[vec![gt(0.0, 0)]], 0.5),
            0.0
        );
        assert_eq!(map_percent(&[vec![]], &[vec![]], 0.5), 100.0);
    }

    /// `[4 + 2 classes, anchors]` from per-anchor (cx, cy, w, h, s0, s1).
    fn raw(anchors: &[[f32; 6]]) -> (Vec<f32>, Vec<usize>) {
        let n = anchors.len();
        let mut v = vec![0.0; 6 * n];
        for (a, row) in anchors.iter().enumerate() {
            for (r, x) in row.iter().enumerate() {
                v[r * n + a] = *x;
            }
        }
        (v, vec![6, n])
    }

    #[test]
    fn decode_thresholds_and_suppresses_per_class() {
        let (v, s) = raw(&[
            [10.0, 10.0, 4.0, 4.0, 0.9, 0.0],      // kept
            [10.5, 10.0, 4.0, 4.0, 0.8, 0.0],      // same class, overlaps: suppressed
            [10.5, 10.0, 4.0, 4.0, 0.0, 0.7],      // other class: kept
            [50.0, 50.0, 4.0, 4.0, 0.1, 0.2],      // below threshold
            [80.0, 80.0, 2.0, 2.0, f32::NAN, 0.0], // NaN score: dropped
        ]);
        let d = decode(&v, &s, &DetectionSpec::default()).unwrap();
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!((d[0].class, d[0].score), (0, 0.9));
        assert_eq!(d[0].bbox, [8.0, 8.0, 12.0, 12.0]);
        assert_eq!((d[1].class, d[1].score), (1, 0.7));
    }

    #[test]
    fn decode_refuses_a_shape_that_is_not_a_detector_output() {
        for shape in [vec![4, 3], vec![6], vec![6, 4, 1], vec![6, 3]] {
            assert!(
                decode(&[0.0; 12], &shape, &DetectionSpec::default()).is_err(),
                "{shape:?}"
            );
        }
    }

    #[test]
    fn agreement_matches_boxes_of_the_same_class_only() {
        let b = |x: f32, class, score| Detection {
            bbox: [x, 0.0, x + 10.0, 10.0],
            score,
            class,
        };
        let reference = [b(0.0, 0, 0.9), b(100.0, 1, 0.8)];
        let same = agreement(&reference, &reference, 0.5);
        assert_eq!((same.matched, same.f1_percent()), (2, 100.0));
        // Shifted by 2 of 10: IoU 8/12 = 0.67, still a match; wrong class is not.
        let candidate = [b(2.0, 0, 0.85), b(100.0, 0, 0.8)];
        let a = agreement(&reference, &candidate, 0.5);
        assert_eq!(a.matched, 1);
        assert!((a.f1_percent() - 50.0).abs() < 1e-9);
        assert!((a.score_diff - 0.05).abs() < 1e-6);
        assert_eq!(agreement(&[], &[], 0.5).f1_percent(), 100.0);
        assert_eq!(agreement(&reference, &[], 0.5).f1_percent(), 0.0);
    }
}
