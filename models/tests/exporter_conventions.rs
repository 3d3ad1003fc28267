//! The ways real exporters write models, each through the gate
//! (tools/convention_models.py writes them with the pinned onnx): opsets 7
//! to 21, weights in Constant nodes, dims of -1, no value shapes at all,
//! several inputs and outputs of int64, int32, bool and float. Every
//! candidate is accepted or refused with its reason; none panics.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use edgeloop_models::dataset::Dataset;
use edgeloop_models::npz::Npz;
use edgeloop_models::onnx;
use edgeloop_models::quantize::gate::{run_gate, GateOptions, GateOutcome};
use edgeloop_models::quantize::task::Task;
use edgeloop_models::runtime::OrtRuntime;
use edgeloop_models::Tensor;
use ndarray::ArrayD;

fn models() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let python = edgeloop_models::deps::dir()
        .unwrap()
        .join("pyenv/bin/python");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/convention_models.py");
    let out = Command::new(python)
        .arg(script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Deterministic values in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32s(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::F32(ArrayD::from_shape_vec(shape.to_vec(), noise(n, seed)).unwrap())
}

fn sets(path: &Path, make: impl Fn(usize, u64) -> Npz) -> (onnx::ir::ModelProto, Dataset, Dataset) {
    let model = onnx::read(path).unwrap();
    onnx::validate(&model, path.parent()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let inputs = onnx::inspect(&model).inputs;
    let calib = Dataset::from_npz(&make(64, 1), "calibration", &inputs, false).unwrap();
    let eval = Dataset::from_npz(&make(96, 2), "eval", &inputs, false).unwrap();
    (model, calib, eval)
}

fn mlp_data(n: usize, seed: u64) -> Npz {
    let mut npz = Npz::new();
    npz.insert("x", f32s(&[n, 16], seed));
    npz
}

fn gate(model: &onnx::ir::ModelProto, calib: &Dataset, eval: &Dataset) -> GateOutcome {
    let opts = GateOptions {
        task: Some(Task::Regression),
        latency_runs: 3,
        ..GateOptions::default()
    };
    let o = run_gate(&OrtRuntime::load(None).unwrap(), model, calib, eval, &opts).unwrap();
    for m in &o.candidates {
        println!(
            "{:<24} loss {:>8.4} size {:>6} {}",
            m.name, m.loss, m.size_bytes, m.verdict
        );
        assert!(!m.verdict.is_empty());
    }
    o
}

fn verdict<'a>(o: &'a GateOutcome, name: &str) -> &'a str {
    &o.candidates
        .iter()
        .find(|c| c.name == name)
        .unwrap()
        .verdict
}

#[test]
fn opsets_7_to_21_quantize_or_say_why_not() {
    let dir = models();
    for opset in [7, 9, 11, 13, 15, 17, 19, 21] {
        println!("== opset {opset}");
        let (m, calib, eval) = sets(&dir.path().join(format!("mlp_opset{opset}.onnx")), mlp_data);
        let o = gate(&m, &calib, &eval);
        if opset < 10 {
            // QuantizeLinear came in opset 10.
            assert!(
                verdict(&o, "int8-static-minmax").contains(&format!("opset {opset} is too old")),
                "{}",
                verdict(&o, "int8-static-minmax")
            );
        } else {
            let int8 = o
                .candidates
                .iter()
                .find(|c| c.name == "int8-static-minmax")
                .unwrap();
            assert!(int8.accepted, "opset {opset}: {}", int8.verdict);
            assert!(!int8.report.quantized_nodes.is_empty());
            assert_ne!(o.chosen, "float", "opset {opset}: {}", o.reason);
        }
        let fp16 = o.candidates.iter().find(|c| c.name == "fp16").unwrap();
        assert!(fp16.accepted, "opset {opset}: {}", fp16.verdict);
    }
}

#[test]
fn weights_in_constant_nodes_quantize_like_initializers() {
    let dir = models();
    let (with_inits, calib, eval) = sets(&dir.path().join("mlp_opset11.onnx"), mlp_data);
    let (with_constants, calib_c, eval_c) = sets(&dir.path().join("mlp_constants.onnx"), mlp_data);
    assert_eq!(onnx::inspect(&with_constants).initializer_count, 0);
    let a = gate(&with_inits, &calib, &eval);
    let b = gate(&with_constants, &calib_c, &eval_c);
    for (x, y) in a.candidates.iter().zip(&b.candidates) {
        assert_eq!(
            x.accepted, y.accepted,
            "{}: {} / {}",
            x.name, x.verdict, y.verdict
        );
        assert_eq!(
            x.report.quantized_nodes.len(),
            y.report.quantized_nodes.len(),
            "{}",
            x.name
        );
        assert!(
            (x.loss - y.loss).abs() < 1e-6,
            "{}: {} vs {}",
            x.name,
            x.loss,
            y.loss
        );
        // Same weights, same layout, give or take names and the graph's own bytes.
        let ratio = y.size_bytes as f64 / x.size_bytes as f64;
        assert!(
            (0.9..1.1).contains(&ratio),
            "{}: {} vs {} bytes",
            x.name,
            y.size_bytes,
            x.size_bytes
        );
    }
    assert_eq!(a.chosen, b.chosen);
}

#[test]
fn a_model_without_value_shapes_quantizes() {
    let dir = models();
    let (m, calib, eval) = sets(&dir.path().join("mlp_no_shapes.onnx"), mlp_data);
    let o = gate(&m, &calib, &eval);
    let int8 = o
        .candidates
        .iter()
        .find(|c| c.name == "int8-static-minmax")
        .unwrap();
    assert!(
        int8.accepted && !int8.report.quantized_nodes.is_empty(),
        "{}",
        int8.verdict
    );
    // On a model this small fp16 can be smaller than int8 with its scales.
    assert_ne!(o.chosen, "float", "{}", o.reason);
}

#[test]
fn int64_int32_and_bool_inputs_and_two_outputs() {
    let dir = models();
    let make = |n: usize, seed: u64| {
        let mut npz = Npz::new();
        let ids: Vec<i64> = noise(n * 8, seed)
            .iter()
            .map(|v| ((v + 1.0) * 24.9) as i64)
            .collect();
        npz.insert(
            "ids",
            Tensor::I64(ArrayD::from_shape_vec(vec![n, 8], ids).unwrap()),
        );
        let counts: Vec<i32> = noise(n * 8, seed + 1)
            .iter()
            .map(|v| ((v + 1.0) * 2.0) as i32)
            .collect();
        npz.insert(
            "counts",
            Tensor::I32(ArrayD::from_shape_vec(vec![n, 8, 1], counts).unwrap()),
        );
        let mask: Vec<bool> = noise(n * 8, seed + 2).iter().map(|v| *v > -0.5).collect();
        npz.insert(
            "mask",
            Tensor::Bool(ArrayD::from_shape_vec(vec![n, 8, 1], mask).unwrap()),
        );
        npz.insert("bias", f32s(&[n, 8, 8], seed + 3));
        npz
    };
    let (m, calib, eval) = sets(&dir.path().join("multi_io.onnx"), make);
    let o = gate(&m, &calib, &eval);
    // Both outputs are compared: the float reference is perfect on both.
    assert_eq!(o.float.metric, 0.0);
    let fp16 = o.candidates.iter().find(|c| c.name == "fp16").unwrap();
    assert!(fp16.accepted, "{}", fp16.verdict);
    assert!(o.candidates.iter().any(|c| c.accepted), "{}", o.reason);
}
