//! The accuracy gate on real models: a CNN and an MLP trained on real MNIST
//! digits (scripts/fetch-mnist-models.sh). Int8 static stays within a point
//! of float, the CNN shrinks to at most 0.30 of its size, and a gate that
//! cannot be met falls back to float and says why.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use edgeloop_models::dataset::Dataset;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::quantize::gate::{
    run_gate, CalibrationMethodName, Candidate, GateOptions, GateOutcome,
};
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

/// The gate's choice obeys its own rules, whatever this machine's timings are.
fn check_choice_is_consistent(o: &GateOutcome, opts: &GateOptions) {
    let qualifies = |m: &edgeloop_models::quantize::gate::Measurement| {
        o.float.accuracy - m.accuracy <= opts.budget_points
            && m.latency_ms <= o.float.latency_ms * (1.0 + opts.latency_tolerance)
            && m.size_bytes < o.float.size_bytes
    };
    // The smallest qualifying size wins; among equal sizes (the three static
    // calibrations produce the same layout) the more accurate one does.
    let qualified: Vec<_> = o.candidates.iter().filter(|m| qualifies(m)).collect();
    let smallest = qualified.iter().map(|m| m.size_bytes).min();
    let best = smallest.map(|size| {
        let same_size: Vec<_> = qualified.iter().filter(|m| m.size_bytes == size).collect();
        let top = same_size
            .iter()
            .map(|m| m.accuracy)
            .fold(f64::MIN, f64::max);
        same_size
            .iter()
            .filter(|m| m.accuracy == top)
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

fn print(o: &GateOutcome) {
    for m in std::iter::once(&o.float).chain(&o.candidates) {
        println!(
            "{:<24} acc {:6.2}  agree {:6.2}  size {:>8}  latency {:.4} ms  {}",
            m.name, m.accuracy, m.agreement, m.size_bytes, m.latency_ms, m.verdict
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
        o.float.accuracy > 96.0,
        "float CNN accuracy {}",
        o.float.accuracy
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
        .max_by(|a, b| a.accuracy.total_cmp(&b.accuracy))
        .unwrap();
    assert!(
        o.float.accuracy - best.accuracy <= 1.0,
        "{}: drop {:.2}",
        best.name,
        o.float.accuracy - best.accuracy
    );
    assert!(
        best.agreement > 98.0,
        "{}: agreement {}",
        best.name,
        best.agreement
    );
    for name in ["int8-static-minmax", "int8-static-percentile"] {
        let c = o.candidates.iter().find(|c| c.name == name).unwrap();
        assert!(
            o.float.accuracy - c.accuracy <= 1.0,
            "{name}: drop {:.2}",
            o.float.accuracy - c.accuracy
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
            o.float.accuracy - c.accuracy <= 1.0,
            "{}: drop {:.2}",
            c.name,
            o.float.accuracy - c.accuracy
        );
        assert!(
            (c.size_bytes as f64) < 0.35 * o.float.size_bytes as f64,
            "{}",
            c.name
        );
    }
    let fp16 = o.candidates.iter().find(|c| c.name == "fp16").unwrap();
    assert!(
        (o.float.accuracy - fp16.accuracy).abs() <= 0.2,
        "fp16 accuracy {}",
        fp16.accuracy
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
        budget_points: 0.0,
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
        c.accuracy < o.float.accuracy,
        "the poisoned candidate must lose accuracy"
    );
    assert!(!c.accepted);
    assert!(
        c.verdict.contains("exceeds the budget of 0.00"),
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
        onnx::encode(&o.chosen_model),
        onnx::encode(&m),
        "the float model ships unchanged"
    );
}
