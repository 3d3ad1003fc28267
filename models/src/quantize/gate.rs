//! The accuracy gate: quantize every candidate, measure it against the float
//! model on a labelled evaluation set in this process, and keep the smallest
//! model that loses at most `budget` accuracy points and is not slower than
//! float. If none qualifies, keep float and say why.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

use super::calibrate::{calibrate, CalibrationMethod, Observed};
use super::{
    calibration_targets, convert_fp16, quantize_dynamic, quantize_static, DynamicOptions,
    Fp16Options, QuantizeError, Report, StaticOptions,
};
use crate::dataset::Dataset;
use crate::onnx::{self, ir};
use crate::runtime::{OrtRuntime, SessionOptions};
use crate::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Candidate {
    Static { method: CalibrationMethodName },
    Dynamic,
    Fp16,
}

/// A serialisable name for a calibration method.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationMethodName {
    Entropy,
    Percentile,
    MinMax,
}

impl CalibrationMethodName {
    pub fn as_str(self) -> &'static str {
        match self {
            CalibrationMethodName::Entropy => "entropy",
            CalibrationMethodName::Percentile => "percentile",
            CalibrationMethodName::MinMax => "minmax",
        }
    }
}

impl Candidate {
    /// The candidate a [`Candidate::label`] names.
    pub fn from_label(label: &str) -> Option<Candidate> {
        let method = |m| Some(Candidate::Static { method: m });
        match label {
            "int8-static-entropy" => method(CalibrationMethodName::Entropy),
            "int8-static-percentile" => method(CalibrationMethodName::Percentile),
            "int8-static-minmax" => method(CalibrationMethodName::MinMax),
            "int8-dynamic" => Some(Candidate::Dynamic),
            "fp16" => Some(Candidate::Fp16),
            _ => None,
        }
    }

    pub fn label(&self) -> String {
        match self {
            Candidate::Static { method } => format!("int8-static-{}", method.as_str()),
            Candidate::Dynamic => "int8-dynamic".into(),
            Candidate::Fp16 => "fp16".into(),
        }
    }

    /// The order the gate tries candidates in: most likely to be small and
    /// fast first.
    pub fn default_order() -> Vec<Candidate> {
        vec![
            Candidate::Static {
                method: CalibrationMethodName::Entropy,
            },
            Candidate::Static {
                method: CalibrationMethodName::Percentile,
            },
            Candidate::Static {
                method: CalibrationMethodName::MinMax,
            },
            Candidate::Dynamic,
            Candidate::Fp16,
        ]
    }
}

#[derive(Debug, Clone)]
pub struct GateOptions {
    /// Largest acceptable top-1 accuracy drop, in percentage points.
    pub budget_points: f64,
    pub candidates: Vec<Candidate>,
    pub percentile: f64,
    /// Timed single-sample runs per model (after warm-up).
    pub latency_runs: usize,
    /// "Not slower" allows this fraction of measurement noise.
    pub latency_tolerance: f64,
    /// Whether "not slower than float" is a gate. Off for an artifact that
    /// will run on another provider (an fp16 variant for CUDA/TensorRT):
    /// its speed on this machine's CPU says nothing about its speed there.
    /// Latency is still measured and reported.
    pub gate_latency: bool,
    pub static_options: StaticOptions,
}

impl Default for GateOptions {
    fn default() -> Self {
        Self {
            budget_points: 1.0,
            candidates: Candidate::default_order(),
            percentile: 99.99,
            latency_runs: 50,
            latency_tolerance: 0.10,
            gate_latency: true,
            static_options: StaticOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub name: String,
    /// Top-1 accuracy, percent.
    pub accuracy: f64,
    /// Share of samples whose prediction equals the float model's, percent.
    pub agreement: f64,
    pub size_bytes: u64,
    /// Median single-sample latency.
    pub latency_ms: f64,
    pub quantize_ms: f64,
    pub accepted: bool,
    pub verdict: String,
    pub report: Report,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateOutcome {
    pub float: Measurement,
    pub candidates: Vec<Measurement>,
    /// Name of the shipped model ("float" when nothing qualified).
    pub chosen: String,
    pub reason: String,
    pub budget_points: f64,
    #[serde(skip)]
    pub chosen_model: ir::ModelProto,
}

/// Predictions (argmax over the last axis of the first output) per sample.
pub fn predictions(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    data: &Dataset,
) -> Result<Vec<i64>, QuantizeError> {
    let mut session = runtime.session(&onnx::encode(model), &single_thread())?;
    let mut out = Vec::with_capacity(data.samples);
    for batch in &data.batches {
        let inputs: Vec<(&str, &Tensor)> = batch.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let outputs = session.run(&inputs)?;
        let (name, first) = outputs
            .first()
            .ok_or_else(|| QuantizeError::Data("model has no outputs".into()))?;
        let Tensor::F32(logits) = first else {
            return Err(QuantizeError::Data(format!(
                "output {name:?} is {}, expected float32 scores",
                first.dtype()
            )));
        };
        let classes = *logits.shape().last().unwrap_or(&1);
        let flat: Vec<f32> = logits.iter().copied().collect();
        for row in flat.chunks(classes.max(1)) {
            let best = row
                .iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
                    if v > b.1 {
                        (i, v)
                    } else {
                        b
                    }
                });
            out.push(best.0 as i64);
        }
    }
    Ok(out)
}

fn single_thread() -> SessionOptions {
    // One thread: steadier timings on a shared machine, and the edge case.
    SessionOptions {
        intra_op_threads: 1,
        ..SessionOptions::default()
    }
}

pub fn median_latency_ms(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    data: &Dataset,
    runs: usize,
) -> Result<f64, QuantizeError> {
    let mut session = runtime.session(&onnx::encode(model), &single_thread())?;
    let first = data
        .batches
        .first()
        .ok_or_else(|| QuantizeError::Data("the dataset has no batches to time".into()))?;
    let sample: Vec<(String, Tensor)> = first
        .iter()
        .map(|(n, t)| (n.clone(), crate::dataset::first_row(t)))
        .collect();
    let inputs: Vec<(&str, &Tensor)> = sample.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for _ in 0..3 {
        session.run(&inputs)?;
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        session.run(&inputs)?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn accuracy(pred: &[i64], labels: &[i64]) -> f64 {
    let hits = pred.iter().zip(labels).filter(|(p, l)| p == l).count();
    100.0 * hits as f64 / labels.len().max(1) as f64
}

/// Runs the gate. `calibration` feeds static quantization; `eval` must have labels.
pub fn run_gate(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    calibration: &Dataset,
    eval: &Dataset,
    opts: &GateOptions,
) -> Result<GateOutcome, QuantizeError> {
    let labels = eval
        .labels
        .as_ref()
        .ok_or_else(|| QuantizeError::Data("the evaluation set has no labels".into()))?;
    let float_pred = predictions(runtime, model, eval)?;
    let float_acc = accuracy(&float_pred, labels);
    let float_latency = median_latency_ms(runtime, model, eval, opts.latency_runs)?;
    let float = Measurement {
        name: "float".into(),
        accuracy: float_acc,
        agreement: 100.0,
        size_bytes: onnx::encode(model).len() as u64,
        latency_ms: float_latency,
        quantize_ms: 0.0,
        accepted: true,
        verdict: "reference".into(),
        report: Report::default(),
    };
    let mut candidates = vec![];
    let mut models = vec![];
    // One calibration pass serves every static candidate: the methods differ
    // only in how they turn the same observations into ranges. Histograms
    // are collected only when a method needs them.
    let needs_histograms = opts.candidates.iter().any(
        |c| matches!(c, Candidate::Static { method } if *method != CalibrationMethodName::MinMax),
    );
    let mut observed: Option<(HashMap<String, Observed>, f64)> = None;
    for candidate in &opts.candidates {
        let start = Instant::now();
        let mut shared_ms = 0.0;
        let (q, report) = match candidate {
            Candidate::Static { method } => {
                let method = match method {
                    CalibrationMethodName::Entropy => CalibrationMethod::Entropy,
                    CalibrationMethodName::Percentile => {
                        CalibrationMethod::Percentile(opts.percentile)
                    }
                    CalibrationMethodName::MinMax => CalibrationMethod::MinMax,
                };
                if observed.is_none() {
                    let pass = Instant::now();
                    let targets = calibration_targets(model, &opts.static_options);
                    let collect = if needs_histograms {
                        CalibrationMethod::Entropy
                    } else {
                        CalibrationMethod::MinMax
                    };
                    let seen = calibrate(runtime, model, &targets, &calibration.batches, collect)?;
                    observed = Some((seen, pass.elapsed().as_secs_f64() * 1000.0));
                } else if let Some((_, ms)) = &observed {
                    // Charge the shared pass to every static candidate, so
                    // each quantize_ms is the cost of making it alone.
                    shared_ms = *ms;
                }
                let (seen, _) = observed.as_ref().expect("calibrated above");
                let ranges = seen
                    .iter()
                    .map(|(k, o)| (k.clone(), o.range(method)))
                    .collect();
                quantize_static(model, &ranges, &opts.static_options)?
            }
            Candidate::Dynamic => quantize_dynamic(model, &DynamicOptions::default())?,
            Candidate::Fp16 => convert_fp16(model, &Fp16Options::default())?,
        };
        let quantize_ms = start.elapsed().as_secs_f64() * 1000.0 + shared_ms;
        let name = candidate.label();
        // A candidate that ONNX Runtime cannot load or run is rejected, not fatal.
        let measured = predictions(runtime, &q, eval)
            .and_then(|p| Ok((p, median_latency_ms(runtime, &q, eval, opts.latency_runs)?)));
        let m = match measured {
            Ok((pred, latency)) => {
                let acc = accuracy(&pred, labels);
                let agree = accuracy(&pred, &float_pred);
                let drop = float_acc - acc;
                let slower =
                    opts.gate_latency && latency > float_latency * (1.0 + opts.latency_tolerance);
                let verdict = if drop > opts.budget_points {
                    format!(
                        "accuracy drop {drop:.2} points exceeds the budget of {:.2}",
                        opts.budget_points
                    )
                } else if slower {
                    format!("slower than float ({latency:.3} ms vs {float_latency:.3} ms)")
                } else {
                    format!("within budget (drop {drop:.2} points)")
                };
                Measurement {
                    name,
                    accuracy: acc,
                    agreement: agree,
                    size_bytes: onnx::encode(&q).len() as u64,
                    latency_ms: latency,
                    quantize_ms,
                    accepted: drop <= opts.budget_points && !slower,
                    verdict,
                    report,
                }
            }
            Err(e) => Measurement {
                name,
                accuracy: 0.0,
                agreement: 0.0,
                size_bytes: onnx::encode(&q).len() as u64,
                latency_ms: 0.0,
                quantize_ms,
                accepted: false,
                verdict: format!("could not be run: {e}"),
                report,
            },
        };
        candidates.push(m);
        models.push(q);
    }
    let best = candidates
        .iter()
        .enumerate()
        .filter(|(_, m)| m.accepted && m.size_bytes < float.size_bytes)
        .min_by(|a, b| {
            a.1.size_bytes
                .cmp(&b.1.size_bytes)
                .then(b.1.accuracy.total_cmp(&a.1.accuracy))
        });
    let (chosen, reason, chosen_model) = match best {
        Some((i, m)) => (
            m.name.clone(),
            format!(
                "{} is the smallest candidate within the {:.2}-point budget and not slower than float ({} vs {} bytes)",
                m.name, opts.budget_points, m.size_bytes, float.size_bytes
            ),
            models[i].clone(),
        ),
        None => (
            "float".to_string(),
            format!(
                "no candidate qualified, keeping float: {}",
                candidates.iter().map(|c| format!("{}: {}", c.name, c.verdict)).collect::<Vec<_>>().join("; ")
            ),
            model.clone(),
        ),
    };
    Ok(GateOutcome {
        float,
        candidates,
        chosen,
        reason,
        budget_points: opts.budget_points,
        chosen_model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_is_named_by_its_label() {
        for c in Candidate::default_order() {
            assert_eq!(Candidate::from_label(&c.label()), Some(c));
        }
        assert_eq!(Candidate::from_label("int4"), None);
    }
}
