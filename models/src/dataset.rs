//! Calibration and evaluation sets: `.npz` files with one array per model
//! input (keyed by the input's name) and, for evaluation, an int64 `label`
//! array. Checked against the model's declared inputs, each problem named.
//!
//! Two layouts. **Batched**: each array has the input's rank and axis 0 is
//! the sample axis, cut into batches. **Per call**: each array has one axis
//! more than its input, and entry `i` along that axis is the whole tensor of
//! call `i`. The second is for inputs a batch cannot be cut from: a scalar
//! (silero's `sr`), a batch axis that is not axis 0 (its `state`
//! `[2, batch, 128]`), a sequence whose calls run in order.

use std::path::Path;

use ndarray::{Axis, Slice};

use crate::npz::{Npz, NpzError};
use crate::onnx::{Dim, ValueSummary};
use crate::tensor::Tensor;

/// The key of the label array in an evaluation set.
pub const LABEL_KEY: &str = "label";

/// The key of the labelled boxes of a detector's evaluation set: float32
/// `[samples, max_boxes, 5]`, each row `x1, y1, x2, y2, class` in the
/// model's input pixels; rows with a negative class are padding.
pub const BOXES_KEY: &str = "boxes";

/// One labelled box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabelBox {
    pub bbox: [f32; 4],
    pub class: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error(transparent)]
    Npz(#[from] NpzError),
    #[error("{file}: no array for model input {input:?} (the file has: {available})")]
    MissingInput {
        file: String,
        input: String,
        available: String,
    },
    #[error("{file}: array {input:?} is {found}, but the model input is {expected}")]
    DType {
        file: String,
        input: String,
        found: String,
        expected: String,
    },
    #[error("{file}: array {input:?} has shape {found:?}, but the model input is {expected}")]
    Shape {
        file: String,
        input: String,
        found: Vec<usize>,
        expected: String,
    },
    #[error("{file}: arrays disagree on the number of samples ({detail})")]
    SampleCount { file: String, detail: String },
    #[error("{file}: {reason}")]
    Label { file: String, reason: String },
    #[error("{file}: holds no samples")]
    Empty { file: String },
    #[error("{file}: {detail}: every array must be batched (the input's rank) or per call (one axis more)")]
    MixedLayout { file: String, detail: String },
}

/// How a file's arrays map onto model calls (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Batched,
    PerCall,
}

/// Samples for a model, split into batches along axis 0.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Each batch: input name -> tensor.
    pub batches: Vec<Vec<(String, Tensor)>>,
    /// Labels in sample order, when the file had them.
    pub labels: Option<Vec<i64>>,
    /// Labelled boxes per sample, when the file had them ([`BOXES_KEY`]).
    pub boxes: Option<Vec<Vec<LabelBox>>>,
    pub samples: usize,
    pub layout: Layout,
}

fn shape_text(shape: &Option<Vec<Dim>>) -> String {
    match shape {
        None => "of any shape".into(),
        Some(dims) => format!(
            "[{}]",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Rows `start..end` of a tensor (along its first axis).
pub fn slice_rows(t: &Tensor, start: usize, end: usize) -> Tensor {
    let s = Slice::from(start..end);
    match t {
        Tensor::F32(a) => Tensor::F32(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::F64(a) => Tensor::F64(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::F16(a) => Tensor::F16(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::I8(a) => Tensor::I8(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::U8(a) => Tensor::U8(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::I32(a) => Tensor::I32(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::I64(a) => Tensor::I64(a.slice_axis(Axis(0), s).to_owned()),
        Tensor::Bool(a) => Tensor::Bool(a.slice_axis(Axis(0), s).to_owned()),
    }
}

impl Dataset {
    /// Reads `path` for a model with `inputs`. With `need_labels`, the file
    /// must also hold `label` (int64, one per sample).
    pub fn read(
        path: &Path,
        inputs: &[ValueSummary],
        need_labels: bool,
    ) -> Result<Dataset, DatasetError> {
        let npz = Npz::read(path)?;
        Self::from_npz(&npz, &path.display().to_string(), inputs, need_labels)
    }

    pub fn from_npz(
        npz: &Npz,
        file: &str,
        inputs: &[ValueSummary],
        need_labels: bool,
    ) -> Result<Dataset, DatasetError> {
        let file = file.to_string();
        let available = || npz.names().collect::<Vec<_>>().join(", ");
        let mut arrays = vec![];
        let mut layouts: Vec<(String, Layout)> = vec![];
        let mut fixed_batch = None;
        for input in inputs {
            let t = npz
                .get(&input.name)
                .ok_or_else(|| DatasetError::MissingInput {
                    file: file.clone(),
                    input: input.name.clone(),
                    available: available(),
                })?;
            if t.dtype().numpy_name() != input.dtype {
                return Err(DatasetError::DType {
                    file: file.clone(),
                    input: input.name.clone(),
                    found: t.dtype().to_string(),
                    expected: input.dtype.clone(),
                });
            }
            let mut this_layout = Layout::Batched;
            if let Some(dims) = &input.shape {
                let shape = t.shape();
                let bad = || DatasetError::Shape {
                    file: file.clone(),
                    input: input.name.clone(),
                    found: shape.to_vec(),
                    expected: shape_text(&input.shape),
                };
                if shape.len() == dims.len() + 1 {
                    // Per call: every dim of the input is checked, axis 0 too.
                    for (d, &n) in dims.iter().zip(&shape[1..]) {
                        if let Dim::Fixed(f) = d {
                            if *f > 0 && *f != n as i64 {
                                return Err(bad());
                            }
                        }
                    }
                    this_layout = Layout::PerCall;
                } else if shape.len() != dims.len() || shape.is_empty() {
                    return Err(bad());
                } else {
                    // Axis 0 is the sample axis; the rest must match fixed
                    // dims. Exporters write `dim_value: -1` or `0` for
                    // "unknown" (ONNX has no such value), so only a
                    // positive size is fixed.
                    for (d, &n) in dims.iter().zip(shape).skip(1) {
                        if let Dim::Fixed(f) = d {
                            if *f > 0 && *f != n as i64 {
                                return Err(bad());
                            }
                        }
                    }
                }
                if this_layout == Layout::Batched {
                    if let Some(Dim::Fixed(b)) = dims.first() {
                        if let Ok(b) = usize::try_from(*b) {
                            if b > 0 {
                                fixed_batch = Some(b);
                            }
                        }
                    }
                }
            }
            match layouts.first() {
                Some((first, l)) if *l != this_layout => {
                    return Err(DatasetError::MixedLayout {
                        file,
                        detail: format!(
                            "{first:?} is {}, {:?} is {}",
                            layout_text(*l),
                            input.name,
                            layout_text(this_layout)
                        ),
                    })
                }
                _ => layouts.push((input.name.clone(), this_layout)),
            }
            arrays.push((input.name.clone(), t.clone()));
        }
        let layout = layouts.first().map_or(Layout::Batched, |(_, l)| *l);
        let samples = arrays
            .first()
            .map(|(_, t)| t.shape().first().copied().unwrap_or(0))
            .unwrap_or(0);
        if let Some((name, t)) = arrays
            .iter()
            .find(|(_, t)| t.shape().first().copied() != Some(samples))
        {
            return Err(DatasetError::SampleCount {
                file,
                detail: format!(
                    "{name:?} has {:?} along axis 0, {:?} has {samples}",
                    t.shape().first(),
                    arrays[0].0
                ),
            });
        }
        if samples == 0 {
            return Err(DatasetError::Empty { file });
        }
        if let Some(b) = fixed_batch.filter(|&b| b > samples) {
            return Err(DatasetError::SampleCount {
                file,
                detail: format!(
                    "the model takes batches of exactly {b} samples, the file has {samples}"
                ),
            });
        }
        let boxes = read_boxes(npz, &file, samples)?;
        let labels = match npz.get(LABEL_KEY) {
            Some(Tensor::I64(l)) if l.ndim() == 1 && l.len() == samples => Some(l.iter().copied().collect()),
            Some(Tensor::I64(l)) => {
                return Err(DatasetError::Label {
                    file,
                    reason: format!("{LABEL_KEY:?} must be 1-D with {samples} entries, has shape {:?}", l.shape()),
                })
            }
            Some(other) => {
                return Err(DatasetError::Label {
                    file,
                    reason: format!("{LABEL_KEY:?} must be int64 class ids, is {}", other.dtype()),
                })
            }
            None if need_labels => {
                return Err(DatasetError::Label {
                    file,
                    reason: format!("an evaluation set needs a {LABEL_KEY:?} array (int64 class ids); the file has: {}", available()),
                })
            }
            None => None,
        };
        if layout == Layout::PerCall {
            let batches = (0..samples)
                .map(|i| {
                    arrays
                        .iter()
                        .map(|(n, t)| (n.clone(), call_at(t, i)))
                        .collect()
                })
                .collect();
            return Ok(Dataset {
                batches,
                labels,
                boxes,
                samples,
                layout,
            });
        }
        let batch = fixed_batch.unwrap_or(64).max(1);
        let mut batches = vec![];
        let mut start = 0;
        while start < samples {
            let end = (start + batch).min(samples);
            if fixed_batch.is_some() && end - start != batch {
                break; // a fixed-batch model cannot take a short last batch
            }
            batches.push(
                arrays
                    .iter()
                    .map(|(n, t)| (n.clone(), slice_rows(t, start, end)))
                    .collect(),
            );
            start = end;
        }
        Ok(Dataset {
            batches,
            labels,
            boxes,
            samples,
            layout,
        })
    }

    /// One model call's inputs for timing: the first sample of the first
    /// batch (batched), or the first call (per call).
    pub fn timing_sample(&self) -> Option<Vec<(String, Tensor)>> {
        let first = self.batches.first()?;
        Some(match self.layout {
            Layout::PerCall => first.clone(),
            Layout::Batched => first
                .iter()
                .map(|(n, t)| (n.clone(), first_row(t)))
                .collect(),
        })
    }
}

/// The labelled boxes, checked: shape, finite coordinates, x2 ≥ x1, y2 ≥ y1.
fn read_boxes(
    npz: &Npz,
    file: &str,
    samples: usize,
) -> Result<Option<Vec<Vec<LabelBox>>>, DatasetError> {
    let bad = |reason: String| DatasetError::Label {
        file: file.to_string(),
        reason,
    };
    let Some(t) = npz.get(BOXES_KEY) else {
        return Ok(None);
    };
    let Tensor::F32(a) = t else {
        return Err(bad(format!(
            "{BOXES_KEY:?} must be float32, is {}",
            t.dtype()
        )));
    };
    let shape = a.shape();
    if shape.len() != 3 || shape[0] != samples || shape[2] != 5 {
        return Err(bad(format!(
            "{BOXES_KEY:?} must have shape [{samples}, max_boxes, 5], has {shape:?}"
        )));
    }
    let mut out = Vec::with_capacity(samples);
    for (i, image) in a.outer_iter().enumerate() {
        let mut boxes = vec![];
        for (j, row) in image.outer_iter().enumerate() {
            let v: Vec<f32> = row.iter().copied().collect();
            if v[4] < 0.0 {
                continue;
            }
            let sane = v.iter().all(|x| x.is_finite())
                && v[2] >= v[0]
                && v[3] >= v[1]
                && v[4].fract() == 0.0;
            if !sane {
                return Err(bad(format!(
                    "{BOXES_KEY:?}[{i}][{j}] = {v:?} is not x1, y1, x2, y2 (x2 >= x1, y2 >= y1), class (a whole number)"
                )));
            }
            boxes.push(LabelBox {
                bbox: [v[0], v[1], v[2], v[3]],
                class: v[4] as usize,
            });
        }
        out.push(boxes);
    }
    Ok(Some(out))
}

fn layout_text(l: Layout) -> &'static str {
    match l {
        Layout::Batched => "batched",
        Layout::PerCall => "per call",
    }
}

/// Entry `i` along axis 0, that axis removed: call `i`'s whole tensor.
pub fn call_at(t: &Tensor, i: usize) -> Tensor {
    match t {
        Tensor::F32(a) => Tensor::F32(a.index_axis(Axis(0), i).to_owned()),
        Tensor::F64(a) => Tensor::F64(a.index_axis(Axis(0), i).to_owned()),
        Tensor::F16(a) => Tensor::F16(a.index_axis(Axis(0), i).to_owned()),
        Tensor::I8(a) => Tensor::I8(a.index_axis(Axis(0), i).to_owned()),
        Tensor::U8(a) => Tensor::U8(a.index_axis(Axis(0), i).to_owned()),
        Tensor::I32(a) => Tensor::I32(a.index_axis(Axis(0), i).to_owned()),
        Tensor::I64(a) => Tensor::I64(a.index_axis(Axis(0), i).to_owned()),
        Tensor::Bool(a) => Tensor::Bool(a.index_axis(Axis(0), i).to_owned()),
    }
}

/// The first sample of a batch, keeping the batch axis (length 1).
pub fn first_row(t: &Tensor) -> Tensor {
    slice_rows(t, 0, 1)
}

/// Names of a tabular input's feature columns, by input: what
/// [`reference_stats_with`] calls each column's histogram (`dew_point`
/// rather than `input[3]`).
pub type FeatureNames = std::collections::BTreeMap<String, Vec<String>>;

/// The feature names a manifest's reference statistics gave each
/// tabular input's columns: what a new version of the model keeps calling
/// them. An input whose columns are not all there, in order, is left out.
pub fn feature_names_of(stats: &crate::manifest::ReferenceStats) -> FeatureNames {
    let mut by_input: std::collections::BTreeMap<&str, Vec<(u32, &str)>> = Default::default();
    for h in &stats.inputs {
        if let (Some(input), Some(column)) = (&h.input, h.column) {
            by_input.entry(input).or_default().push((column, &h.name));
        }
    }
    by_input
        .into_iter()
        .filter_map(|(input, mut cols)| {
            cols.sort_by_key(|c| c.0);
            let whole = cols.iter().enumerate().all(|(i, c)| c.0 as usize == i);
            whole.then(|| {
                (
                    input.to_string(),
                    cols.iter().map(|c| c.1.to_string()).collect(),
                )
            })
        })
        .collect()
}

/// [`reference_stats_with`], the columns named `<input>[<j>]`.
pub fn reference_stats(
    data: &Dataset,
    predictions: &[i64],
    bins: usize,
) -> crate::manifest::ReferenceStats {
    reference_stats_with(data, predictions, bins, &FeatureNames::new())
}

/// `bins` equal bins over `values`' range (a constant gets one bin of width
/// 1); `None` when no value is finite.
fn histogram(values: impl Fn() -> Vec<f64>, bins: usize) -> Option<(Vec<f64>, Vec<u64>)> {
    let all = values();
    let (lo, hi) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    if !lo.is_finite() {
        return None;
    }
    let hi = if hi > lo { hi } else { lo + 1.0 };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0u64; bins];
    for v in all {
        counts[(((v - lo) / width) as usize).min(bins - 1)] += 1;
    }
    let bin_edges = (0..=bins)
        .map(|i| if i == bins { hi } else { lo + width * i as f64 })
        .collect();
    Some((bin_edges, counts))
}

/// The most channels (axis 1 of an input of rank 3 or more, as NCHW images
/// have) that get a histogram each; more, and the input keeps its pooled
/// histogram only.
pub const MAX_CHANNELS: usize = 16;

/// Reference statistics for drift detection: a histogram of every float
/// input over the whole set and, for a tabular input (`[rows, features]`,
/// 2 to [`MAX_FEATURE_COLUMNS`](crate::manifest::MAX_FEATURE_COLUMNS)
/// columns), one per feature column, named by `names` (else
/// `<input>[<j>]`): pooled, a shift of one feature hides among the others.
/// An image or other input of rank 3 or more keeps a compact summary: its
/// pooled histogram and, with 2 to [`MAX_CHANNELS`] channels (axis 1), one
/// per channel (`<input>[<c>]`, column `c`), so a shift of one colour is
/// told apart. Also the share of each predicted class.
pub fn reference_stats_with(
    data: &Dataset,
    predictions: &[i64],
    bins: usize,
    names: &FeatureNames,
) -> crate::manifest::ReferenceStats {
    use crate::manifest::{ClassShare, InputHistogram, ReferenceStats, MAX_FEATURE_COLUMNS};
    let bins = bins.max(1);
    let mut inputs = vec![];
    let first: Vec<(String, Option<usize>)> = data
        .batches
        .first()
        .map(|b| {
            b.iter()
                .map(|(n, t)| {
                    // Axis 1 is a tabular input's feature columns, or an
                    // image's channels (NCHW): a histogram per column, or a
                    // compact one per channel when there are a few. One
                    // channel is the whole tensor: its pooled histogram.
                    let columns = match t {
                        Tensor::F32(a) if a.ndim() == 2 && data.layout == Layout::Batched => {
                            Some(a.shape()[1])
                        }
                        Tensor::F32(a)
                            if a.ndim() >= 3
                                && data.layout == Layout::Batched
                                && a.shape()[1] <= MAX_CHANNELS =>
                        {
                            Some(a.shape()[1])
                        }
                        _ => None,
                    };
                    (n.clone(), columns)
                })
                .collect()
        })
        .unwrap_or_default();
    for (name, columns) in first {
        let values = |column: Option<usize>| {
            data.batches
                .iter()
                .flat_map(|b| b.iter().filter(|(n, _)| *n == name))
                .flat_map(|(_, t)| match (t, column) {
                    (Tensor::F32(a), None) => a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
                    (Tensor::F32(a), Some(j)) if a.ndim() >= 2 && j < a.shape()[1] => a
                        .index_axis(Axis(1), j)
                        .iter()
                        .map(|&v| f64::from(v))
                        .collect(),
                    _ => vec![],
                })
                .filter(|v| v.is_finite())
                .collect::<Vec<_>>()
        };
        let Some((bin_edges, counts)) = histogram(|| values(None), bins) else {
            continue;
        };
        inputs.push(InputHistogram {
            name: name.clone(),
            bin_edges,
            counts,
            input: None,
            column: None,
        });
        let Some(n) = columns.filter(|n| (2..=MAX_FEATURE_COLUMNS).contains(n)) else {
            continue;
        };
        let named = names.get(&name).filter(|given| given.len() == n);
        for j in 0..n {
            let Some((bin_edges, counts)) = histogram(|| values(Some(j)), bins) else {
                continue;
            };
            inputs.push(InputHistogram {
                name: named.map_or_else(|| format!("{name}[{j}]"), |given| given[j].clone()),
                bin_edges,
                counts,
                input: Some(name.clone()),
                column: Some(j as u32),
            });
        }
    }
    let mut per_class: std::collections::BTreeMap<i64, u64> = std::collections::BTreeMap::new();
    for &p in predictions {
        *per_class.entry(p).or_default() += 1;
    }
    let total = predictions.len().max(1) as f64;
    ReferenceStats {
        inputs,
        prediction_distribution: per_class
            .into_iter()
            .map(|(class, n)| ClassShare {
                class,
                share: n as f64 / total,
            })
            .collect(),
        sample_count: data.samples as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    fn tabular(rows: &[[f32; 3]]) -> Dataset {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let x = ArrayD::from_shape_vec(IxDyn(&[rows.len(), 3]), flat).unwrap();
        Dataset {
            batches: vec![vec![("x".to_string(), Tensor::F32(x))]],
            labels: None,
            boxes: None,
            samples: rows.len(),
            layout: Layout::Batched,
        }
    }

    #[test]
    fn an_image_input_gets_a_histogram_per_channel_and_one_channel_only_its_pooled_one() {
        let image = |channels: usize| {
            // Channel c of sample i holds 10 * c + i everywhere (2 x 2 pixels).
            let data: Vec<f32> = (0..3)
                .flat_map(|i| (0..channels).flat_map(move |c| [(10 * c + i) as f32; 4]))
                .collect();
            let t = Tensor::F32(
                ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[3, channels, 2, 2]), data)
                    .unwrap(),
            );
            Dataset {
                batches: vec![vec![("img".to_string(), t)]],
                labels: None,
                boxes: None,
                samples: 3,
                layout: Layout::Batched,
            }
        };
        let stats = reference_stats(&image(3), &[], 2);
        let got: Vec<(&str, Option<u32>)> = stats
            .inputs
            .iter()
            .map(|h| (h.name.as_str(), h.column))
            .collect();
        assert_eq!(
            got,
            [
                ("img", None),
                ("img[0]", Some(0)),
                ("img[1]", Some(1)),
                ("img[2]", Some(2))
            ]
        );
        // Channel 1 alone: 10, 11, 12 (four pixels each).
        let c1 = &stats.inputs[2];
        assert_eq!(
            (c1.bin_edges.as_slice(), c1.counts.as_slice()),
            ([10.0, 11.0, 12.0].as_slice(), [4, 8].as_slice())
        );
        // One channel (MNIST's [N, 1, 28, 28]) is the whole tensor, and more
        // than MAX_CHANNELS is no compact summary: the pooled one only.
        assert_eq!(reference_stats(&image(1), &[], 2).inputs.len(), 1);
        assert_eq!(
            reference_stats(&image(MAX_CHANNELS + 1), &[], 2)
                .inputs
                .len(),
            1
        );
    }

    #[test]
    fn a_tabular_input_gets_a_histogram_per_column_named_as_given() {
        let data = tabular(&[[0.0, 10.0, 5.0], [1.0, 20.0, 5.0], [2.0, 30.0, 5.0]]);
        let mut names = FeatureNames::new();
        names.insert(
            "x".into(),
            vec!["temp".into(), "dew_point".into(), "wind".into()],
        );
        let stats = reference_stats_with(&data, &[], 2, &names);
        let got: Vec<(&str, Option<&str>, Option<u32>)> = stats
            .inputs
            .iter()
            .map(|h| (h.name.as_str(), h.input.as_deref(), h.column))
            .collect();
        assert_eq!(
            got,
            [
                ("x", None, None),
                ("temp", Some("x"), Some(0)),
                ("dew_point", Some("x"), Some(1)),
                ("wind", Some("x"), Some(2)),
            ]
        );
        let dew = &stats.inputs[2];
        assert_eq!(
            (dew.bin_edges.as_slice(), dew.counts.as_slice()),
            ([10.0, 20.0, 30.0].as_slice(), [1, 2].as_slice())
        );
        // A constant column still gets one bin of width 1 per edge pair.
        assert_eq!(stats.inputs[3].bin_edges[0], 5.0);
        // Without names (or with the wrong count of them), `x[j]`.
        names.insert("x".into(), vec!["only-one".into()]);
        let unnamed = reference_stats_with(&data, &[], 2, &names);
        assert_eq!(unnamed.inputs[1].name, "x[0]");
        assert_eq!(unnamed.inputs.len(), 4);
        // What a manifest named, a new version names the same.
        let mut again = FeatureNames::new();
        again.insert(
            "x".into(),
            vec!["temp".into(), "dew_point".into(), "wind".into()],
        );
        assert_eq!(feature_names_of(&stats), again);
        let mut partial = stats.clone();
        partial.inputs.remove(2);
        assert!(
            feature_names_of(&partial).is_empty(),
            "a missing column names nothing"
        );
    }
}
