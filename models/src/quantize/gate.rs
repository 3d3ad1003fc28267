//! The accuracy gate: quantize every candidate, measure it against the float
//! model on an evaluation set in this process with the task's metric, and
//! keep the smallest candidate within the budget. If none qualifies, keep
//! float and say why.
//!
//! The decision is deterministic: the metric (top-1 against labels, or
//! agreement with float's top-1, boxes or numbers, see `task`) and the size
//! decide. Latency is measured here, on the quantizing host's CPU, and
//! gates only when asked ([`LatencyGate`]): this machine is not the device
//! that will serve the model, and on small models its timings changed the
//! choice from run to run.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::calibrate::{calibrate, CalibrationMethod, Observed};
pub use super::evaluate::median_latency_ms;
use super::evaluate::{collect, Outputs};
pub use super::evidence::{GateOutcome, LatencyRecord, Measurement, MetricRecord};
use super::task::{score, top1, MetricKind, Task, Truth};
use super::{
    calibration_targets, convert_fp16, hoist_constants, quantize_dynamic, quantize_static,
    DynamicOptions, Fp16Options, QuantizeError, Report, StaticOptions,
};
use crate::dataset::Dataset;
use crate::onnx::{self, ir};
use crate::runtime::OrtRuntime;

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

/// Whether, and against what, latency measured here gates a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum LatencyGate {
    /// Measured and recorded, never a reason to refuse (the default: the
    /// quantizing host is not the device).
    Report,
    /// Refused when slower than float by more than `tolerance` (a fraction).
    NotSlowerThanFloat { tolerance: f64 },
    /// Refused when slower than a stated budget, in milliseconds per call.
    Budget { max_ms: f64 },
}

#[derive(Debug, Clone)]
pub struct GateOptions {
    /// What the model does; `None` infers it ([`Task::infer`]).
    pub task: Option<Task>,
    /// Largest acceptable loss against float, in the metric's own unit
    /// ([`MetricKind::unit`]); `None` takes the metric's default.
    pub budget: Option<f64>,
    pub candidates: Vec<Candidate>,
    pub percentile: f64,
    /// Timed single-call runs per model (after warm-up).
    pub latency_runs: usize,
    pub latency: LatencyGate,
    pub static_options: StaticOptions,
}

impl Default for GateOptions {
    fn default() -> Self {
        Self {
            task: None,
            budget: None,
            candidates: Candidate::default_order(),
            percentile: 99.99,
            latency_runs: 50,
            latency: LatencyGate::Report,
            static_options: StaticOptions::default(),
        }
    }
}

/// Predictions (argmax over the last axis of the first output) per sample.
pub fn predictions(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    data: &Dataset,
) -> Result<Vec<i64>, QuantizeError> {
    let outputs = collect(runtime, model, data, &Task::Classification)?;
    if let Some(row) = outputs.samples.first().and_then(|s| s.first()) {
        if row.values.is_empty() {
            return Err(QuantizeError::Data("the first output is empty".into()));
        }
    }
    Ok(top1(&outputs))
}

/// The machine the latencies were taken on, in words.
fn this_host() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "the quantizing host ({} {}, {cpus} CPUs), ONNX Runtime CPU provider, one thread",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Runs the gate. `calibration` feeds static quantization; `eval` is what
/// every candidate is measured on (its labels, if any, for classification).
pub fn run_gate(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    calibration: &Dataset,
    eval: &Dataset,
    opts: &GateOptions,
) -> Result<GateOutcome, QuantizeError> {
    let truth = Truth::of(eval);
    let summary = onnx::inspect(model);
    let task = match &opts.task {
        Some(t) => t.clone(),
        None => Task::infer(&summary, truth.classes.is_some()),
    };
    let kind = MetricKind::for_task(&task, &truth);
    let budget = opts.budget.unwrap_or_else(|| kind.default_budget());
    if !(budget.is_finite() && budget >= 0.0) {
        return Err(QuantizeError::Data(format!(
            "the budget must be a finite number >= 0 ({}), got {budget}",
            kind.unit()
        )));
    }
    let reference = collect(runtime, model, eval, &task)?;
    if reference.samples.is_empty() {
        return Err(QuantizeError::Data(
            "the evaluation set gave no samples".into(),
        ));
    }
    let float_score = score(kind, &task, &reference, &reference, truth)?;
    let float_latency = median_latency_ms(runtime, model, eval, opts.latency_runs)?;
    let float = Measurement {
        name: "float".into(),
        metric: float_score.value,
        loss: 0.0,
        details: float_score.details,
        // The bytes on disk, exact without encoding (which a model over
        // 2 GiB cannot be).
        size_bytes: onnx::serialized_size(model),
        latency_ms: float_latency,
        quantize_ms: 0.0,
        within_budget: true,
        accepted: true,
        verdict: "reference".into(),
        report: Report::default(),
    };
    let judge = Judge {
        kind,
        task: &task,
        reference: &reference,
        truth,
        budget,
        float_metric: float.metric,
        float_latency,
        latency: opts.latency,
    };
    // Candidates are made from the model with its Constant-node weights as
    // initializers (exact), so they quantize like any other weights.
    let (hoisted, hoist_report) = hoist_constants(model);
    let main_nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
    let nested_nodes = summary.node_count.saturating_sub(main_nodes);
    let source = &hoisted;
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
        let made = match candidate {
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
                    let targets = calibration_targets(source, &opts.static_options);
                    let collect = if needs_histograms {
                        CalibrationMethod::Entropy
                    } else {
                        CalibrationMethod::MinMax
                    };
                    let seen = calibrate(runtime, source, &targets, &calibration.batches, collect)?;
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
                quantize_static(source, &ranges, &opts.static_options)
            }
            Candidate::Dynamic => quantize_dynamic(source, &DynamicOptions::default()),
            Candidate::Fp16 => convert_fp16(source, &Fp16Options::default()),
        };
        let quantize_ms = start.elapsed().as_secs_f64() * 1000.0 + shared_ms;
        let name = candidate.label();
        // A candidate the quantizer cannot make, or ONNX Runtime cannot load
        // or run, is refused with its reason, never fatal.
        let (q, mut report) = match made {
            Ok(made) => made,
            Err(e) => {
                candidates.push(refused(
                    name,
                    quantize_ms,
                    format!("could not be quantized: {e}"),
                    Report::default(),
                    0,
                ));
                models.push(None);
                continue;
            }
        };
        report.notes.extend(hoist_report.notes.iter().cloned());
        let size = onnx::serialized_size(&q);
        if size > onnx::MAX_MODEL_BYTES as u64 {
            // A shipped artifact is one ONNX file: it must fit in protobuf.
            let why = format!("is {size} bytes, over the 2 GiB protobuf limit of one ONNX file");
            candidates.push(refused(name, quantize_ms, why, report, size));
            models.push(None);
            continue;
        }
        if report.quantized_nodes.is_empty() {
            // Float re-encoded is not a candidate, however it measures.
            let mut why = format!(
                "quantized nothing ({} nodes left in float)",
                report.left_in_float.len()
            );
            if nested_nodes > 0 {
                why.push_str(&format!(
                    "; {nested_nodes} nodes are inside If/Loop/Scan bodies, which the quantizers do not enter"
                ));
            }
            candidates.push(refused(name, quantize_ms, why, report, size));
            models.push(None);
            continue;
        }
        let measured = collect(runtime, &q, eval, &task).and_then(|out| {
            Ok((
                out,
                median_latency_ms(runtime, &q, eval, opts.latency_runs)?,
            ))
        });
        let m = match measured.and_then(|(out, latency)| Ok((judge.score(&out)?, latency))) {
            Ok((scored, latency)) => {
                judge.measure(name, scored, latency, size, quantize_ms, report)
            }
            Err(e) => refused(
                name,
                quantize_ms,
                format!("could not be run: {e}"),
                report,
                size,
            ),
        };
        candidates.push(m);
        models.push(Some(q));
    }
    let (chosen, reason, chosen_model) = choose(&float, &candidates, &models, model, kind, budget);
    Ok(GateOutcome {
        metric: MetricRecord::new(kind, budget, float.metric),
        latency: LatencyRecord {
            gate: opts.latency,
            timed_on: this_host(),
        },
        task,
        float,
        candidates,
        chosen,
        reason,
        chosen_model,
        candidate_models: models,
    })
}

/// The deterministic choice: the smallest accepted candidate smaller than
/// float (ties to the smaller loss), else float with every verdict.
fn choose(
    float: &Measurement,
    candidates: &[Measurement],
    models: &[Option<ir::ModelProto>],
    float_model: &ir::ModelProto,
    kind: MetricKind,
    budget: f64,
) -> (String, String, ir::ModelProto) {
    let best = candidates
        .iter()
        .enumerate()
        .filter(|(_, m)| m.accepted && m.size_bytes < float.size_bytes)
        .min_by(|a, b| {
            a.1.size_bytes
                .cmp(&b.1.size_bytes)
                .then(a.1.loss.total_cmp(&b.1.loss))
        });
    let unit = kind.unit();
    match best.and_then(|(i, m)| Some((m, models.get(i)?.clone()?))) {
        Some((m, q)) => (
            m.name.clone(),
            format!(
                "{} is the smallest candidate within the budget of {budget} {unit} of {} ({} vs {} bytes)",
                m.name,
                kind.name(),
                m.size_bytes,
                float.size_bytes
            ),
            q,
        ),
        None => (
            "float".to_string(),
            format!(
                "no candidate qualified, keeping float: {}",
                candidates.iter().map(|c| why_not(c, float)).collect::<Vec<_>>().join("; ")
            ),
            float_model.clone(),
        ),
    }
}

/// Why `candidate` was not chosen over `float`: its verdict, and for one the
/// budget accepted, that it is no smaller (a gate keeps float then, and
/// "within budget" alone would not say why).
fn why_not(candidate: &Measurement, float: &Measurement) -> String {
    if candidate.accepted && candidate.size_bytes >= float.size_bytes {
        format!(
            "{}: {}, but not smaller than float ({} vs {} bytes)",
            candidate.name, candidate.verdict, candidate.size_bytes, float.size_bytes
        )
    } else {
        format!("{}: {}", candidate.name, candidate.verdict)
    }
}

/// Why a latency refuses a candidate under `rule`, if it does.
fn too_slow(rule: LatencyGate, latency: f64, float_latency: f64, where_: &str) -> Option<String> {
    match rule {
        LatencyGate::Report => None,
        LatencyGate::NotSlowerThanFloat { tolerance } => {
            (latency > float_latency * (1.0 + tolerance)).then(|| {
                format!("slower than float{where_} ({latency:.3} ms vs {float_latency:.3} ms)")
            })
        }
        LatencyGate::Budget { max_ms } => (latency > max_ms).then(|| {
            format!("slower than the latency budget{where_} ({latency:.3} ms vs {max_ms:.3} ms)")
        }),
    }
}

/// Judges latency again with timings taken elsewhere, on the device
/// that will serve (a benchmark over the agent's channel), and makes the
/// choice again. Pure. `timings` holds each timed model's median latency by
/// name, or why the device could not run it; float must have one. A
/// candidate within the accuracy budget without a timing is refused, with
/// the device's reason. The accuracy verdicts stand; `timed_on` says where
/// the timings were taken, in the evidence.
pub fn judge_latency_on(
    outcome: &mut GateOutcome,
    float_model: &ir::ModelProto,
    timings: &BTreeMap<String, Result<f64, String>>,
    rule: LatencyGate,
    timed_on: String,
) -> Result<(), QuantizeError> {
    let float_latency = match timings.get("float") {
        Some(Ok(l)) if l.is_finite() && *l >= 0.0 => *l,
        Some(Ok(l)) => {
            return Err(QuantizeError::Data(format!(
                "float's latency on {timed_on} is not a finite number >= 0: {l}"
            )))
        }
        Some(Err(why)) => {
            return Err(QuantizeError::Data(format!(
                "float could not be timed on {timed_on}: {why}"
            )))
        }
        None => {
            return Err(QuantizeError::Data(format!(
                "the benchmark on {timed_on} gave no timing for float"
            )))
        }
    };
    outcome.float.latency_ms = float_latency;
    let kind = outcome.metric.name;
    let budget = outcome.metric.budget;
    for m in outcome.candidates.iter_mut().filter(|m| m.within_budget) {
        match timings.get(&m.name) {
            Some(Ok(latency)) if latency.is_finite() && *latency >= 0.0 => {
                m.latency_ms = *latency;
                let slow = too_slow(rule, *latency, float_latency, " on the device");
                (m.accepted, m.verdict) = verdict(kind, m.loss, budget, slow);
            }
            Some(Ok(latency)) => {
                m.accepted = false;
                m.verdict = format!(
                    "within budget, but its device latency is not a number >= 0 ({latency})"
                );
            }
            Some(Err(why)) => {
                m.accepted = false;
                m.verdict = format!("within budget, but could not run on the device: {why}");
            }
            None => {
                m.accepted = false;
                m.verdict = "within budget, but not timed on the device".into();
            }
        }
    }
    let (chosen, reason, chosen_model) = choose(
        &outcome.float,
        &outcome.candidates,
        &outcome.candidate_models,
        float_model,
        kind,
        budget,
    );
    outcome.chosen = chosen;
    outcome.reason = format!("{reason}; latency judged on {timed_on}");
    outcome.chosen_model = chosen_model;
    outcome.latency = LatencyRecord {
        gate: rule,
        timed_on,
    };
    Ok(())
}

/// What a device should time for [`judge_latency_on`]: float, and each
/// candidate within the accuracy budget (by name). The others' verdicts
/// cannot change, so timing them would only cost the device.
pub fn to_time_on_device<'a>(
    outcome: &'a GateOutcome,
    float: &'a ir::ModelProto,
) -> Vec<(String, &'a ir::ModelProto)> {
    let mut out = vec![("float".to_string(), float)];
    for (m, model) in outcome.candidates.iter().zip(&outcome.candidate_models) {
        if let (true, Some(model)) = (m.within_budget, model) {
            out.push((m.name.clone(), model));
        }
    }
    out
}

/// A candidate's verdict from its loss and, if it is too slow, why.
fn verdict(kind: MetricKind, loss: f64, budget: f64, too_slow: Option<String>) -> (bool, String) {
    let unit = kind.unit();
    if loss > budget {
        (
            false,
            format!(
                "{} loss {loss:.4} exceeds the budget of {budget} {unit}",
                kind.name()
            ),
        )
    } else if let Some(why) = too_slow {
        (false, why)
    } else {
        (
            true,
            format!("within budget ({} loss {loss:.4} {unit})", kind.name()),
        )
    }
}

fn refused(
    name: String,
    quantize_ms: f64,
    verdict: String,
    report: Report,
    size: u64,
) -> Measurement {
    Measurement {
        name,
        metric: 0.0,
        loss: 0.0,
        details: BTreeMap::new(),
        size_bytes: size,
        latency_ms: 0.0,
        quantize_ms,
        within_budget: false,
        accepted: false,
        verdict,
        report,
    }
}

/// What every candidate is judged against.
struct Judge<'a> {
    kind: MetricKind,
    task: &'a Task,
    reference: &'a Outputs,
    truth: Truth<'a>,
    budget: f64,
    float_metric: f64,
    float_latency: f64,
    latency: LatencyGate,
}

impl Judge<'_> {
    fn score(&self, out: &Outputs) -> Result<super::task::Score, QuantizeError> {
        score(self.kind, self.task, self.reference, out, self.truth)
    }

    fn measure(
        &self,
        name: String,
        scored: super::task::Score,
        latency: f64,
        size: u64,
        quantize_ms: f64,
        report: Report,
    ) -> Measurement {
        let loss = self.kind.loss(self.float_metric, scored.value);
        let slow = too_slow(self.latency, latency, self.float_latency, "");
        let (accepted, verdict) = verdict(self.kind, loss, self.budget, slow);
        Measurement {
            name,
            metric: scored.value,
            loss,
            details: scored.details,
            size_bytes: size,
            latency_ms: latency,
            quantize_ms,
            within_budget: loss <= self.budget,
            accepted,
            verdict,
            report,
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
