//! The real-model zoo (scripts/fetch-zoo.sh) through the gate, side by side
//! with ONNX Runtime's own `quantize_static` (QDQ, MinMax, per channel) on
//! the same calibration data and scored with the same metric. Prints the
//! rows of docs/model-zoo.md: ops and opset, fp32/int8/fp16 sizes, the
//! gate's metric and verdict, latency against float measured in the same
//! run (one thread, this machine's CPU).
//!
//!     scripts/fetch-zoo.sh && cargo bench -p edgeloop-models --bench zoo

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use edgeloop_models::dataset::{Dataset, Layout};
use edgeloop_models::onnx;
use edgeloop_models::quantize::detect::DetectionSpec;
use edgeloop_models::quantize::evaluate::{collect, median_latency_ms};
use edgeloop_models::quantize::gate::{run_gate, GateOptions, GateOutcome};
use edgeloop_models::quantize::task::{score, Task, Truth};
use edgeloop_models::runtime::OrtRuntime;

fn deps() -> PathBuf {
    edgeloop_models::deps::dir().expect("deps dir")
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// ORT's static int8 of `path`, scored like a candidate: (metric, loss,
/// size, latency ratio) or the error it raised.
fn ort_static(
    rt: &OrtRuntime,
    path: &Path,
    calibration: &Path,
    eval: &Dataset,
    task: &Task,
    outcome: &GateOutcome,
) -> Result<(f64, f64, u64, f64), String> {
    let out = std::env::temp_dir().join(format!(
        "edgeloop-zoo-ort-{}.onnx",
        path.file_stem().unwrap().to_string_lossy()
    ));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/ort_quantize.py");
    let mut cmd = Command::new(deps().join("pyenv/bin/python"));
    cmd.arg(script)
        .arg("static")
        .arg(path)
        .arg(&out)
        .arg(calibration);
    if eval.layout == Layout::PerCall {
        cmd.arg("per-call");
    }
    let run = cmd.output().map_err(|e| e.to_string())?;
    if !run.status.success() {
        let err = String::from_utf8_lossy(&run.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed");
        return Err(last.chars().take(140).collect());
    }
    let q = onnx::read(&out).map_err(|e| e.to_string())?;
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    let model = onnx::read(path).map_err(|e| e.to_string())?;
    let reference = collect(rt, &model, eval, task).map_err(|e| e.to_string())?;
    let got = collect(rt, &q, eval, task).map_err(|e| e.to_string())?;
    let kind = outcome.metric.name;
    let s = score(kind, task, &reference, &got, Truth::of(eval)).map_err(|e| e.to_string())?;
    let latency = median_latency_ms(rt, &q, eval, 50).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    Ok((
        s.value,
        kind.loss(outcome.metric.float_value, s.value),
        size,
        latency / outcome.float.latency_ms.max(1e-9),
    ))
}

fn main() {
    let zoo = deps().join("zoo");
    assert!(
        zoo.join(".fetched").exists(),
        "run scripts/fetch-zoo.sh first"
    );
    let rt = OrtRuntime::load(None).expect("ONNX Runtime: run scripts/fetch-onnxruntime.sh");
    let models: [(&str, Option<Task>); 4] = [
        ("magika", None),
        ("nudenet", Some(Task::Detection(DetectionSpec::default()))),
        ("silero-op15", None),
        ("silero-op18", None),
    ];
    println!("| model | opsets | ops (nodes) | fp32 | int8 (ours) | fp16 | metric | chosen | latency vs float | ORT quantize_static |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, task) in models {
        let path = zoo.join(format!("{name}.onnx"));
        let model = onnx::read(&path).expect("model");
        let summary = onnx::inspect(&model);
        let data = zoo.join("data").join(name);
        let calibration =
            Dataset::read(&data.join("calibration.npz"), &summary.inputs, false).unwrap();
        let eval = Dataset::read(&data.join("eval.npz"), &summary.inputs, false).unwrap();
        let opts = GateOptions {
            task,
            latency_runs: 50,
            ..GateOptions::default()
        };
        let o = run_gate(&rt, &model, &calibration, &eval, &opts).expect("gate");
        let pick = |prefix: &str| {
            o.candidates
                .iter()
                .filter(|c| {
                    c.name.starts_with(prefix) && !c.verdict.starts_with("quantized nothing")
                })
                .min_by(|a, b| a.loss.total_cmp(&b.loss))
        };
        let size_of = |prefix: &str| {
            pick(prefix).map_or("—".to_string(), |c| {
                format!(
                    "{} ({:.2}×, loss {:.3}{})",
                    mib(c.size_bytes),
                    c.size_bytes as f64 / o.float.size_bytes as f64,
                    c.loss,
                    if c.accepted { "" } else { ", refused" }
                )
            })
        };
        let opsets = summary
            .opsets
            .iter()
            .map(|(d, v)| format!("{}{v}", if d.is_empty() { "ai.onnx " } else { "" }))
            .collect::<Vec<_>>()
            .join(", ");
        let chosen = o.chosen_measurement();
        let ort = match ort_static(
            &rt,
            &path,
            &data.join("calibration.npz"),
            &eval,
            &o.task,
            &o,
        ) {
            Ok((value, loss, size, ratio)) => {
                format!(
                    "{} ({:.2}×), {} {value:.3} (loss {loss:.3}), latency {ratio:.2}×",
                    mib(size),
                    size as f64 / o.float.size_bytes as f64,
                    o.metric.name.name()
                )
            }
            Err(e) => format!("failed: {e}"),
        };
        println!(
            "| {name} | {opsets} | {} op types ({} nodes) | {} | {} | {} | {} ({}; budget {}) | {} | {:.2}× ({:.3} vs {:.3} ms) | {ort} |",
            summary.op_histogram.len(),
            summary.node_count,
            mib(o.float.size_bytes),
            size_of("int8"),
            size_of("fp16"),
            o.metric.name.name(),
            o.task.name(),
            o.metric.budget,
            o.chosen,
            chosen.latency_ms / o.float.latency_ms.max(1e-9),
            chosen.latency_ms,
            o.float.latency_ms,
        );
        for c in &o.candidates {
            eprintln!("  {name} {}: {}", c.name, c.verdict);
        }
    }
}
