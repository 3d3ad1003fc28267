//! Edgeloop's quantizer against ONNX Runtime's Python quantizer, in one run,
//! on the same MNIST models, calibration and evaluation sets. Prints
//! accuracy, size, quantization wall time and inference latency for both,
//! and the ratios (Edgeloop / ORT).
//!
//! Needs scripts/fetch-onnxruntime.sh and scripts/fetch-mnist-models.sh
//! (which also makes the Python venv with onnxruntime and onnx).
//!
//!     cargo bench -p edgeloop-models --bench quantize_vs_ort

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use edgeloop_models::dataset::Dataset;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::quantize::gate::{median_latency_ms, predictions};
use edgeloop_models::quantize::{
    calibrate, calibration_targets, quantize_dynamic, quantize_static, CalibrationMethod,
    DynamicOptions, StaticOptions,
};
use edgeloop_models::runtime::OrtRuntime;

struct Row {
    model: &'static str,
    variant: String,
    accuracy: f64,
    size: u64,
    quantize_ms: f64,
    latency_ms: f64,
}

fn accuracy(rt: &OrtRuntime, m: &ir::ModelProto, eval: &Dataset) -> f64 {
    let pred = predictions(rt, m, eval).expect("model runs");
    let labels = eval.labels.as_ref().expect("labels");
    100.0 * pred.iter().zip(labels).filter(|(p, l)| p == l).count() as f64 / labels.len() as f64
}

fn measure(
    rt: &OrtRuntime,
    model: &'static str,
    variant: &str,
    m: &ir::ModelProto,
    eval: &Dataset,
    quantize_ms: f64,
) -> Row {
    Row {
        model,
        variant: variant.to_string(),
        accuracy: accuracy(rt, m, eval),
        size: onnx::serialized_size(m),
        quantize_ms,
        latency_ms: median_latency_ms(rt, m, eval, 200).expect("latency"),
    }
}

fn ours_static(
    rt: &OrtRuntime,
    m: &ir::ModelProto,
    calib: &Dataset,
    method: CalibrationMethod,
) -> (ir::ModelProto, f64) {
    let start = Instant::now();
    let opts = StaticOptions::default();
    let targets = calibration_targets(m, &opts);
    let observed = calibrate(rt, m, &targets, &calib.batches, method).expect("calibrate");
    let ranges: HashMap<String, (f32, f32)> = observed
        .iter()
        .map(|(k, o)| (k.clone(), o.range(method)))
        .collect();
    let (q, _) = quantize_static(m, &ranges, &opts).expect("quantize");
    (q, start.elapsed().as_secs_f64() * 1000.0)
}

fn ort_quantize(
    python: &Path,
    mode: &str,
    model: &Path,
    calib: Option<&Path>,
    out: &Path,
) -> (ir::ModelProto, f64) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/ort_quantize.py");
    let mut cmd = Command::new(python);
    cmd.arg(script).arg(mode).arg(model).arg(out);
    if let Some(c) = calib {
        cmd.arg(c);
    }
    let output = cmd.output().expect("run the ORT quantizer");
    assert!(
        output.status.success(),
        "ORT quantizer failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = String::from_utf8_lossy(&output.stdout);
    let ms = line
        .lines()
        .last()
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().trim_end_matches('}').trim().parse::<f64>().ok())
        .expect("quantize_ms in the ORT quantizer's output");
    (onnx::read(out).expect("ORT's output decodes"), ms)
}

fn main() {
    let deps = edgeloop_models::deps::dir().expect("HOME or EDGELOOP_DEPS");
    let data = deps.join("mnist-models");
    let python = deps.join("pyenv/bin/python");
    assert!(
        data.join(".complete").exists() && python.exists(),
        "run scripts/fetch-mnist-models.sh first"
    );
    let rt = OrtRuntime::load(None).expect("run scripts/fetch-onnxruntime.sh first");
    let tmp = std::env::temp_dir().join(format!("edgeloop-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let mut rows = vec![];
    for model in ["cnn", "mlp"] {
        let path: PathBuf = data.join(format!("{model}.onnx"));
        let m = onnx::read(&path).expect("model");
        let inputs = onnx::inspect(&m).inputs;
        let calib_path = data.join(format!("calib_{model}.npz"));
        let calib = Dataset::read(&calib_path, &inputs, false).expect("calibration set");
        let eval = Dataset::read(&data.join(format!("eval_{model}.npz")), &inputs, true)
            .expect("eval set");
        rows.push(measure(&rt, model, "float", &m, &eval, 0.0));
        let (q, ms) = ours_static(&rt, &m, &calib, CalibrationMethod::MinMax);
        rows.push(measure(&rt, model, "edgeloop static minmax", &q, &eval, ms));
        let (q, ms) = ort_quantize(
            &python,
            "static",
            &path,
            Some(&calib_path),
            &tmp.join(format!("{model}_ort_static.onnx")),
        );
        rows.push(measure(&rt, model, "ort static minmax", &q, &eval, ms));
        let (q, ms) = ours_static(&rt, &m, &calib, CalibrationMethod::Entropy);
        rows.push(measure(
            &rt,
            model,
            "edgeloop static entropy",
            &q,
            &eval,
            ms,
        ));
        let start = Instant::now();
        let (q, _) = quantize_dynamic(&m, &DynamicOptions::default()).expect("dynamic");
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        rows.push(measure(&rt, model, "edgeloop dynamic", &q, &eval, ms));
        let (q, ms) = ort_quantize(
            &python,
            "dynamic",
            &path,
            None,
            &tmp.join(format!("{model}_ort_dynamic.onnx")),
        );
        rows.push(measure(&rt, model, "ort dynamic", &q, &eval, ms));
    }
    let _ = std::fs::remove_dir_all(&tmp);

    println!(
        "{:<5} {:<24} {:>8} {:>9} {:>12} {:>11}",
        "model", "variant", "top-1 %", "bytes", "quantize ms", "latency ms"
    );
    for r in &rows {
        println!(
            "{:<5} {:<24} {:>8.2} {:>9} {:>12.1} {:>11.4}",
            r.model, r.variant, r.accuracy, r.size, r.quantize_ms, r.latency_ms
        );
    }
    println!();
    println!("ratios, Edgeloop / ORT (accuracy: difference in points)");
    println!(
        "{:<5} {:<10} {:>14} {:>8} {:>14} {:>10}",
        "model", "mode", "accuracy diff", "size", "quantize time", "latency"
    );
    for model in ["cnn", "mlp"] {
        for (mode, ours, theirs) in [
            ("static", "edgeloop static minmax", "ort static minmax"),
            ("dynamic", "edgeloop dynamic", "ort dynamic"),
        ] {
            let find = |v: &str| {
                rows.iter()
                    .find(|r| r.model == model && r.variant == v)
                    .expect("row")
            };
            let (a, b) = (find(ours), find(theirs));
            println!(
                "{:<5} {:<10} {:>+14.2} {:>8.3} {:>14.3} {:>10.3}",
                model,
                mode,
                a.accuracy - b.accuracy,
                a.size as f64 / b.size as f64,
                a.quantize_ms / b.quantize_ms,
                a.latency_ms / b.latency_ms
            );
        }
    }
}
