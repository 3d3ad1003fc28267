//! The accuracy gate on real models: a CNN and an MLP trained on real MNIST
//! digits (scripts/fetch-mnist-models.sh). Int8 static stays within a point
//! of float, the CNN shrinks to at most 0.30 of its size, and a gate that
//! cannot be met falls back to float and says why.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use edgeloop_models::dataset::Dataset;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::quantize::gate::{
    run_gate, CalibrationMethodName, Candidate, GateOptions, GateOutcome, LatencyGate,
};
use edgeloop_models::quantize::task::{MetricKind, Task};
use edgeloop_models::runtime::OrtRuntime;
use edgeloop_models::Tensor;

fn data_dir() -> PathBuf {
    let dir = edgeloop_models::deps::dir().unwrap().join("mnist-models");
    assert!(
        dir.join(".complete").exists(),
        "{} missing: run scripts/fetch-mnist-models.sh",
        dir.display()
    );
    dir
}

fn load(model: &str) -> (ir::ModelProto, Dataset, Dataset) {
    let dir = data_dir();
    let m = onnx::read(&dir.join(format!("{model}.onnx"))).unwrap();
    let inputs = onnx::inspect(&m).inputs;
    let calib = Dataset::read(&dir.join(format!("calib_{model}.npz")), &inputs, false).unwrap();
    let eval = Dataset::read(&dir.join(format!("eval_{model}.npz")), &inputs, true).unwrap();
    (m, calib, eval)
}

fn runtime() -> OrtRuntime {
    OrtRuntime::load(None).expect("ONNX Runtime: run scripts/fetch-onnxruntime.sh")
}

fn static_candidates() -> Vec<Candidate> {
    [
        CalibrationMethodName::Entropy,
        CalibrationMethodName::Percentile,
        CalibrationMethodName::MinMax,
    ]
    .into_iter()
    .map(|method| Candidate::Static { method })
    .collect()
}

/// The gate's choice obeys its own rules: accuracy and size only (latency
/// is recorded, not gated, by default), so timings cannot change it.
fn check_choice_is_consistent(o: &GateOutcome, opts: &GateOptions) {
    let qualifies = |m: &edgeloop_models::quantize::gate::Measurement| {
        o.float.metric - m.metric <= opts.budget.unwrap_or(1.0) && m.size_bytes < o.float.size_bytes
    };
    // The smallest qualifying size wins; among equal sizes (the three static
    // calibrations produce the same layout) the more accurate one does.
    let qualified: Vec<_> = o.candidates.iter().filter(|m| qualifies(m)).collect();
    let smallest = qualified.iter().map(|m| m.size_bytes).min();
    let best = smallest.map(|size| {
        let same_size: Vec<_> = qualified.iter().filter(|m| m.size_bytes == size).collect();
        let top = same_size.iter().map(|m| m.metric).fold(f64::MIN, f64::max);
        same_size
            .iter()
            .filter(|m| m.metric == top)
            .map(|m| m.name.clone())
            .collect::<Vec<_>>()
    });
    match best {
        Some(names) => assert!(
            names.contains(&o.chosen),
            "chose {}, expected one of {names:?}: {}",
            o.chosen,
            o.reason
        ),
        None => {
            assert_eq!(o.chosen, "float");
            assert!(
                o.reason.starts_with("no candidate qualified"),
                "{}",
                o.reason
            );
        }
    }
}

fn agreement(m: &edgeloop_models::quantize::gate::Measurement) -> f64 {
    m.details["top1_agreement"]
}

fn print(o: &GateOutcome) {
    for m in std::iter::once(&o.float).chain(&o.candidates) {
        println!(
            "{:<24} acc {:6.2}  agree {:6.2}  size {:>8}  latency {:.4} ms  {}",
            m.name,
            m.metric,
            agreement(m),
            m.size_bytes,
            m.latency_ms,
            m.verdict
        );
    }
    println!("chosen: {} ({})", o.chosen, o.reason);
}

#[test]
fn cnn_int8_static_keeps_accuracy_within_a_point_at_under_30_percent_size() {
    let rt = runtime();
    let (m, calib, eval) = load("cnn");
    let opts = GateOptions {
        candidates: static_candidates(),
        latency_runs: 30,
        ..GateOptions::default()
    };
    let o = run_gate(&rt, &m, &calib, &eval, &opts).unwrap();
    print(&o);
    assert!(
        o.float.metric > 96.0,
        "float CNN accuracy {}",
        o.float.metric
    );
    for c in &o.candidates {
        let ratio = c.size_bytes as f64 / o.float.size_bytes as f64;
        assert!(ratio <= 0.30, "{}: size ratio {ratio:.3}", c.name);
    }
    // The static int8 model the gate's accuracy rule would ship: the best of
    // the calibration methods (each one's numbers are in the evidence).
    let best = o
        .candidates
        .iter()
        .max_by(|a, b| a.metric.total_cmp(&b.metric))
        .unwrap();
    assert!(
        o.float.metric - best.metric <= 1.0,
        "{}: drop {:.2}",
        best.name,
        o.float.metric - best.metric
    );
    assert!(
        agreement(best) > 98.0,
        "{}: agreement {}",
        best.name,
        agreement(best)
    );
    for name in ["int8-static-minmax", "int8-static-percentile"] {
        let c = o.candidates.iter().find(|c| c.name == name).unwrap();
        assert!(
            o.float.metric - c.metric <= 1.0,
            "{name}: drop {:.2}",
            o.float.metric - c.metric
        );
    }
    check_choice_is_consistent(&o, &opts);
}

#[test]
fn mlp_static_and_dynamic_int8_keep_accuracy_within_a_point() {
    let rt = runtime();
    let (m, calib, eval) = load("mlp");
    let opts = GateOptions {
        latency_runs: 30,
        ..GateOptions::default()
    };
    let o = run_gate(&rt, &m, &calib, &eval, &opts).unwrap();
    print(&o);
    for c in o.candidates.iter().filter(|c| c.name.starts_with("int8")) {
        assert!(
            o.float.metric - c.metric <= 1.0,
            "{}: drop {:.2}",
            c.name,
            o.float.metric - c.metric
        );
        assert!(
            (c.size_bytes as f64) < 0.35 * o.float.size_bytes as f64,
            "{}",
            c.name
        );
    }
    let fp16 = o.candidates.iter().find(|c| c.name == "fp16").unwrap();
    assert!(
        (o.float.metric - fp16.metric).abs() <= 0.2,
        "fp16 accuracy {}",
        fp16.metric
    );
    check_choice_is_consistent(&o, &opts);
}

#[test]
fn a_gate_that_cannot_be_met_keeps_float_and_says_why() {
    let rt = runtime();
    let (m, _, eval) = load("mlp");
    // A calibration set of near-black images gives ranges far too narrow
    // for real digits: the int8 model loses accuracy.
    let mut poisoned = eval.clone();
    poisoned.batches.truncate(2);
    for batch in &mut poisoned.batches {
        for (_, t) in batch.iter_mut() {
            if let Tensor::F32(a) = t {
                a.mapv_inplace(|v| v * 0.02);
            }
        }
    }
    let opts = GateOptions {
        budget: Some(0.0),
        candidates: vec![Candidate::Static {
            method: CalibrationMethodName::MinMax,
        }],
        latency_runs: 5,
        ..GateOptions::default()
    };
    let o = run_gate(&rt, &m, &poisoned, &eval, &opts).unwrap();
    print(&o);
    let c = &o.candidates[0];
    assert!(
        c.metric < o.float.metric,
        "the poisoned candidate must lose accuracy"
    );
    assert!(!c.accepted);
    assert!(
        c.verdict
            .contains("exceeds the budget of 0 percentage points"),
        "{}",
        c.verdict
    );
    assert_eq!(o.chosen, "float");
    assert!(
        o.reason.contains("no candidate qualified, keeping float")
            && o.reason.contains("int8-static-minmax"),
        "{}",
        o.reason
    );
    assert_eq!(
        onnx::encode(&o.chosen_model).unwrap(),
        onnx::encode(&m).unwrap(),
        "the float model ships unchanged"
    );
}

#[test]
fn the_choice_is_the_same_every_run_and_the_metric_is_recorded() {
    let rt = runtime();
    let (m, calib, eval) = load("mlp");
    let opts = GateOptions {
        latency_runs: 3,
        ..GateOptions::default()
    };
    let a = run_gate(&rt, &m, &calib, &eval, &opts).unwrap();
    let b = run_gate(&rt, &m, &calib, &eval, &opts).unwrap();
    print(&a);
    assert_eq!(a.task, Task::Classification, "labels given: classification");
    assert_eq!(a.metric.name, MetricKind::Top1Accuracy);
    assert_eq!(a.chosen, b.chosen);
    for (x, y) in a.candidates.iter().zip(&b.candidates) {
        assert_eq!(
            (x.metric, x.size_bytes, x.accepted),
            (y.metric, y.size_bytes, y.accepted),
            "{}",
            x.name
        );
    }
    // Every int8 candidate stays within a point at a third of the size, so
    // the smallest of them ships, however fast this machine ran it.
    assert!(a.chosen.starts_with("int8"), "{}", a.reason);
    let evidence = serde_json::to_value(&a).unwrap();
    assert_eq!(evidence["metric"]["name"], "top1_accuracy");
    assert_eq!(evidence["latency"]["policy"], "report");
    assert!(evidence["latency"]["timed_on"]
        .as_str()
        .unwrap()
        .contains("quantizing host"));

    // Without labels the same model is judged by agreement with float.
    let mut unlabelled = eval.clone();
    unlabelled.labels = None;
    let c = run_gate(&rt, &m, &calib, &unlabelled, &opts).unwrap();
    assert_eq!(c.metric.name, MetricKind::Top1Agreement);
    assert_eq!(c.float.metric, 100.0);
    assert!(c.chosen.starts_with("int8"), "{}", c.reason);
}

#[test]
fn a_stated_latency_budget_refuses_what_is_slower_here() {
    let rt = runtime();
    let (m, calib, eval) = load("mlp");
    let opts = GateOptions {
        candidates: vec![Candidate::Dynamic],
        latency_runs: 3,
        latency: LatencyGate::Budget { max_ms: 1e-6 },
        ..GateOptions::default()
    };
    let o = run_gate(&rt, &m, &calib, &eval, &opts).unwrap();
    let c = &o.candidates[0];
    assert!(!c.accepted);
    assert!(
        c.verdict.starts_with("slower than the latency budget"),
        "{}",
        c.verdict
    );
    assert_eq!(o.chosen, "float");
}
