//! Calibration: run the float model over sample inputs with the tensors to
//! be quantized exposed as extra outputs, and turn what they held into
//! ranges with MinMax, Percentile or Entropy (KL divergence).

use std::collections::HashMap;

use crate::onnx::ir;
use crate::runtime::{ModelSession, OrtRuntime, SessionOptions};
use crate::tensor::Tensor;

use super::QuantizeError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CalibrationMethod {
    MinMax,
    /// Clip at this percentile of |x| (e.g. 99.99).
    Percentile(f64),
    /// The threshold that minimises the KL divergence between the float and
    /// the quantized distribution (TensorRT's method).
    Entropy,
}

impl std::fmt::Display for CalibrationMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CalibrationMethod::MinMax => f.write_str("minmax"),
            CalibrationMethod::Percentile(p) => write!(f, "percentile({p})"),
            CalibrationMethod::Entropy => f.write_str("entropy"),
        }
    }
}

/// Histogram bins over [0, max|x|], as TensorRT and ORT use for Entropy.
pub const HISTOGRAM_BINS: usize = 2048;

/// Everything observed for one tensor.
#[derive(Debug, Clone)]
pub struct Observed {
    pub min: f32,
    pub max: f32,
    /// Counts of non-zero |x| over [0, amax] in HISTOGRAM_BINS bins (second pass).
    pub histogram: Vec<u64>,
}

impl Observed {
    fn amax(&self) -> f32 {
        self.min.abs().max(self.max.abs())
    }

    /// The (min, max) range to quantize with.
    pub fn range(&self, method: CalibrationMethod) -> (f32, f32) {
        let amax = self.amax();
        let threshold = match method {
            CalibrationMethod::MinMax => return (self.min, self.max),
            CalibrationMethod::Percentile(p) => percentile_threshold(&self.histogram, amax, p),
            CalibrationMethod::Entropy => {
                // Non-negative tensors use all 256 uint8 levels on [0, t].
                let levels = if self.min >= 0.0 { 256 } else { 128 };
                entropy_threshold(&self.histogram, amax, levels)
            }
        };
        (self.min.max(-threshold), self.max.min(threshold))
    }
}

/// The |x| value below which `p` percent of the observations fall.
pub fn percentile_threshold(hist: &[u64], amax: f32, p: f64) -> f32 {
    let total: u64 = hist.iter().sum();
    if total == 0 || hist.is_empty() {
        return amax;
    }
    let want = (p / 100.0).clamp(0.0, 1.0) * total as f64;
    let width = amax / hist.len() as f32;
    let mut seen = 0u64;
    for (i, &c) in hist.iter().enumerate() {
        seen += c;
        if seen as f64 >= want {
            return (i + 1) as f32 * width;
        }
    }
    amax
}

fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
    if sp == 0.0 || sq == 0.0 {
        return f64::INFINITY;
    }
    p.iter()
        .zip(q)
        .filter(|(&pi, _)| pi > 0.0)
        .map(|(&pi, &qi)| {
            let (pi, qi) = (pi / sp, qi / sq);
            if qi <= 0.0 {
                // Smoothed so a single empty bin does not rule a threshold out.
                pi * (pi / 1e-10).ln()
            } else {
                pi * (pi / qi).ln()
            }
        })
        .sum()
}

/// TensorRT's entropy calibration: for each candidate threshold, fold the
/// tail into the last bin (P), requantize P into `levels` bins and expand it
/// back (Q), and keep the threshold with the smallest KL(P || Q).
pub fn entropy_threshold(hist: &[u64], amax: f32, levels: usize) -> f32 {
    let bins = hist.len();
    if bins <= levels || hist.iter().all(|&c| c == 0) {
        return amax;
    }
    let width = amax / bins as f32;
    let mut best = (f64::INFINITY, bins);
    for i in (levels..=bins).step_by(8.max(bins / 512)) {
        let mut p: Vec<f64> = hist[..i].iter().map(|&c| c as f64).collect();
        let tail: u64 = hist[i..].iter().sum();
        p[i - 1] += tail as f64;
        // Merge the i bins (without the tail: that is what clipping loses)
        // into `levels` groups, and spread each group's mass evenly over the
        // bins that are non-empty in P.
        let mut q = vec![0.0f64; i];
        for j in 0..levels {
            let start = j * i / levels;
            let end = ((j + 1) * i / levels).max(start + 1);
            let mass: f64 = hist[start..end].iter().map(|&c| c as f64).sum::<f64>();
            let nonzero = (start..end)
                .filter(|&k| hist[k] > 0 || (k == i - 1 && tail > 0))
                .count();
            if nonzero > 0 {
                for k in start..end {
                    if hist[k] > 0 || (k == i - 1 && tail > 0) {
                        q[k] = mass / nonzero as f64;
                    }
                }
            }
        }
        let kl = kl_divergence(&p, &q);
        if kl < best.0 {
            best = (kl, i);
        }
    }
    (best.1 as f32 + 0.5) * width
}

/// A copy of `model` whose graph also outputs each of `targets`.
pub fn expose(model: &ir::ModelProto, targets: &[String]) -> ir::ModelProto {
    let mut m = model.clone();
    let graph = m.graph.mut_or_insert_default();
    for t in targets {
        if graph.output.iter().any(|o| o.name() == t) {
            continue;
        }
        let mut v = ir::ValueInfoProto::new();
        v.set_name(t.clone());
        let mut tt = ir::type_proto::Tensor::new();
        tt.set_elem_type(1);
        v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(tt));
        graph.output.push(v);
    }
    m
}

/// One calibration batch: input name -> tensor.
pub type Batch = Vec<(String, Tensor)>;

fn run_batch(
    session: &mut ModelSession,
    batch: &Batch,
) -> Result<Vec<(String, Tensor)>, QuantizeError> {
    let inputs: Vec<(&str, &Tensor)> = batch.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Ok(session.run(&inputs)?)
}

/// Runs the calibration batches through the float model and returns what
/// each target tensor held. Histograms are built only when `method` needs them.
pub fn calibrate(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    targets: &[String],
    batches: &[Batch],
    method: CalibrationMethod,
) -> Result<HashMap<String, Observed>, QuantizeError> {
    if batches.is_empty() {
        return Err(QuantizeError::Data("the calibration set is empty".into()));
    }
    let exposed = expose(model, targets);
    // Graph optimisations could fold away the tensors we asked to see.
    let options = SessionOptions {
        optimization: crate::runtime::GraphOptimization::Disabled,
        ..SessionOptions::default()
    };
    // A float model over 2 GiB runs from a copy with external data.
    let mut session = super::evaluate::session_for(runtime, &exposed, &options)?;
    let mut observed: HashMap<String, Observed> = targets
        .iter()
        .map(|t| {
            (
                t.clone(),
                Observed {
                    min: f32::INFINITY,
                    max: f32::NEG_INFINITY,
                    histogram: vec![],
                },
            )
        })
        .collect();
    for batch in batches {
        for (name, value) in run_batch(&mut session, batch)? {
            if let (Some(o), Tensor::F32(a)) = (observed.get_mut(&name), &value) {
                for &v in a.iter().filter(|v| v.is_finite()) {
                    o.min = o.min.min(v);
                    o.max = o.max.max(v);
                }
            }
        }
    }
    for (name, o) in observed.iter_mut() {
        if !o.min.is_finite() || !o.max.is_finite() {
            return Err(QuantizeError::Data(format!(
                "tensor {name:?} produced no finite float values"
            )));
        }
    }
    if method != CalibrationMethod::MinMax {
        // Second pass: histograms need the final |x| range to fix bin edges.
        for o in observed.values_mut() {
            o.histogram = vec![0; HISTOGRAM_BINS];
        }
        for batch in batches {
            for (name, value) in run_batch(&mut session, batch)? {
                if let (Some(o), Tensor::F32(a)) = (observed.get_mut(&name), &value) {
                    let amax = o.amax();
                    if amax <= 0.0 {
                        continue;
                    }
                    let scale = HISTOGRAM_BINS as f32 / amax;
                    // Exact zeros (padding, Relu, black pixels) are always
                    // representable and say nothing about where to clip; as a
                    // spike in the first bin they would drag the KL search
                    // towards tiny thresholds.
                    for &v in a.iter().filter(|v| v.is_finite() && **v != 0.0) {
                        let bin = ((v.abs() * scale) as usize).min(HISTOGRAM_BINS - 1);
                        o.histogram[bin] += 1;
                    }
                }
            }
        }
    }
    Ok(observed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_clips_the_tail() {
        let mut hist = vec![0u64; 100];
        hist[9] = 9_999; // values near 0.1
        hist[99] = 1; // one outlier at 1.0
        assert!((percentile_threshold(&hist, 1.0, 99.99) - 0.1).abs() < 1e-6);
        assert!((percentile_threshold(&hist, 1.0, 100.0) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn entropy_ignores_rare_outliers_but_keeps_the_bulk() {
        // A half-normal-ish bulk in the first quarter, and rare outliers.
        let mut hist = vec![0u64; HISTOGRAM_BINS];
        for (i, h) in hist.iter_mut().enumerate().take(512) {
            *h = (10_000.0 * (-(i as f64 / 150.0).powi(2)).exp()) as u64 + 1;
        }
        hist[2047] = 3;
        let t = entropy_threshold(&hist, 8.0, 128);
        assert!(t < 8.0 * 0.5, "threshold {t} should drop the outliers");
        assert!(t > 8.0 * 0.1, "threshold {t} should keep the bulk");
    }

    #[test]
    fn range_by_method() {
        let mut hist = vec![0u64; HISTOGRAM_BINS];
        hist[100] = 1000;
        hist[2047] = 1;
        let o = Observed {
            min: 0.0,
            max: 10.0,
            histogram: hist,
        };
        assert_eq!(o.range(CalibrationMethod::MinMax), (0.0, 10.0));
        let (lo, hi) = o.range(CalibrationMethod::Percentile(99.0));
        assert_eq!(lo, 0.0);
        assert!(hi < 1.0, "{hi}");
    }
}
