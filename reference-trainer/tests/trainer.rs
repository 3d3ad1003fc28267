//! The built `edgeloop-train` binary, run as the bridge runs it: a run
//! stopped at a checkpoint (or killed) and resumed in a new process matches
//! an uninterrupted one bit for bit; torn checkpoints and missing data are
//! clear errors; reports reach EDGELOOP_REPORT_URL; and the exported ONNX
//! model computes in ONNX Runtime what candle computed.
//!
//! Needs the data of scripts/fetch-mnist.sh and scripts/fetch-rainfall.sh and
//! ONNX Runtime (scripts/fetch-onnxruntime.sh); scripts/test.sh runs all
//! three. A missing one fails the test with the script to run.
//!
//! One test file, not several: each test binary links candle and ONNX
//! Runtime's bindings, and linking is what costs on a 2-core CI machine.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use edgeloop_models::dataset::Dataset;
use edgeloop_models::npz::Npz;
use edgeloop_models::onnx;
use edgeloop_models::runtime::{OrtRuntime, SessionOptions};
use edgeloop_models::Tensor as NdTensor;
use edgeloop_reference_trainer::model::{argmax_rows, Model};
use edgeloop_reference_trainer::{checkpoint, data, Workload};

const BIN: &str = env!("CARGO_BIN_EXE_edgeloop-train");

/// The contract's variables, removed so that the test's own environment
/// cannot leak into a run.
const CONTRACT_VARS: &[&str] = &[
    "EDGELOOP_CHECKPOINT_DIR",
    "EDGELOOP_RESUME_FROM",
    "EDGELOOP_JOB_ID",
    "EDGELOOP_REPORT_URL",
    "EDGELOOP_ATTEMPT",
    "EDGELOOP_CHECKPOINT_EVERY_STEPS",
    "EDGELOOP_CHECKPOINT_EVERY_MINUTES",
    "EDGELOOP_PRECISION",
    "EDGELOOP_DATASETS",
    "EDGELOOP_HYPERPARAMETERS",
    "RAYON_NUM_THREADS",
];

fn require_data(workload: Workload) -> PathBuf {
    let path = data::default_path(workload).expect("HOME or EDGELOOP_DEPS is set");
    let script = match workload {
        Workload::MnistCnn => "scripts/fetch-mnist.sh",
        Workload::RainfallMlp => "scripts/fetch-rainfall.sh",
    };
    assert!(
        path.exists(),
        "{} is missing: run {script} (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A run of the binary with the contract's environment.
struct Run<'a> {
    checkpoint_dir: &'a Path,
    resume_from: Option<PathBuf>,
    hyperparameters: String,
    every_steps: Option<u64>,
    report_url: Option<String>,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
}

impl<'a> Run<'a> {
    fn new(checkpoint_dir: &'a Path, hyperparameters: serde_json::Value) -> Self {
        Run {
            checkpoint_dir,
            resume_from: None,
            hyperparameters: hyperparameters.to_string(),
            every_steps: None,
            report_url: None,
            args: vec!["--report-every".into(), "1".into()],
            env: vec![],
        }
    }

    fn output(&self) -> Output {
        self.command().output().unwrap()
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        for var in CONTRACT_VARS {
            cmd.env_remove(var);
        }
        cmd.env("EDGELOOP_CHECKPOINT_DIR", self.checkpoint_dir)
            .env("EDGELOOP_JOB_ID", "job-1")
            .env("EDGELOOP_ATTEMPT", "1")
            // Empty on a first run, as the bridge sets it.
            .env(
                "EDGELOOP_RESUME_FROM",
                self.resume_from.as_deref().unwrap_or(Path::new("")),
            )
            .env("EDGELOOP_HYPERPARAMETERS", &self.hyperparameters)
            .env(
                "EDGELOOP_REPORT_URL",
                self.report_url.as_deref().unwrap_or(""),
            )
            .args(&self.args);
        if let Some(n) = self.every_steps {
            cmd.env("EDGELOOP_CHECKPOINT_EVERY_STEPS", n.to_string());
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs to success; returns the report lines (step, metrics).
    fn ok(&self) -> Vec<(u64, BTreeMap<String, f64>)> {
        let out = self.output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "edgeloop-train failed: {stderr}");
        reports(&String::from_utf8(out.stdout).unwrap())
    }
}

fn reports(stdout: &str) -> Vec<(u64, BTreeMap<String, f64>)> {
    stdout
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let obj = v.as_object().unwrap();
            assert_eq!(obj.len(), 2, "only step and metrics: {line}");
            let metrics = serde_json::from_value(v["metrics"].clone()).unwrap();
            (v["step"].as_u64().unwrap(), metrics)
        })
        .collect()
}

/// The training loss of each step, as exact bits.
fn loss_bits(reports: &[(u64, BTreeMap<String, f64>)]) -> Vec<(u64, u64)> {
    reports
        .iter()
        .filter_map(|(step, m)| m.get("loss").map(|l| (*step, l.to_bits())))
        .collect()
}

fn file(dir: &Path, step: u64, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(format!("step-{step}")).join(name)).unwrap()
}

/// Runs `hyper` for its `steps` in one process, and again stopped at each
/// of `stops` and resumed in a new process each time; the losses and every
/// deterministic file of the final checkpoint must be identical.
fn check_resume_is_bit_for_bit(hyper: serde_json::Value, stops: &[u64]) {
    let steps = hyper["steps"].as_u64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let parts = tmp.path().join("parts");

    let t = Instant::now();
    let mut run = Run::new(&whole, hyper.clone());
    // Another checkpoint cadence than the interrupted run's: where
    // checkpoints fall must not change the training.
    run.every_steps = Some(5);
    let uninterrupted = run.ok();
    let whole_secs = t.elapsed().as_secs_f64();
    assert_eq!(
        loss_bits(&uninterrupted)
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        (1..=steps).collect::<Vec<_>>()
    );

    let mut pieces = Vec::new();
    let mut resume_from = None;
    for &stop in stops.iter().chain([&steps]) {
        let mut run = Run::new(&parts, hyper.clone());
        if stop != steps {
            run.args
                .extend(["--stop-after-step".into(), stop.to_string()]);
        }
        run.resume_from = resume_from.take();
        let out = run.ok();
        // The process really ended at the stop: nothing after it ran.
        assert_eq!(out.last().unwrap().0, stop);
        assert!(!parts.join(format!("step-{steps}")).exists() || stop == steps);
        pieces.extend(out);
        resume_from = Some(parts.join(format!("step-{stop}")));
    }
    let (got, want) = (loss_bits(&pieces), loss_bits(&uninterrupted));
    if let Some(((step, a), (_, b))) = got.iter().zip(&want).find(|(a, b)| a != b) {
        panic!(
            "step {step}: the resumed run's loss is {}, the uninterrupted run's {}",
            f64::from_bits(*a),
            f64::from_bits(*b)
        );
    }
    assert_eq!(got, want, "the same steps");
    for name in [
        "weights.safetensors",
        "optimizer.safetensors",
        "state.json",
        "model.onnx",
        "eval.npz",
        "calib.npz",
        "metrics.json",
    ] {
        assert!(
            file(&whole, steps, name) == file(&parts, steps, name),
            "{name} differs between the uninterrupted and the resumed run"
        );
    }
    println!(
        "{}: {steps} steps uninterrupted in {whole_secs:.1}s; resumed at {stops:?}: identical \
         losses and final files (weights sha256 {})",
        hyper["workload"].as_str().unwrap(),
        edgeloop_models::Digest::of(&file(&whole, steps, "weights.safetensors"))
    );
}

#[test]
fn mnist_resume_is_bit_for_bit() {
    require_data(Workload::MnistCnn);
    check_resume_is_bit_for_bit(
        serde_json::json!({"workload": "mnist-cnn", "steps": 12, "batch_size": 32, "seed": 7}),
        &[6],
    );
}

#[test]
fn rainfall_resume_is_bit_for_bit_across_epochs() {
    require_data(Workload::RainfallMlp);
    // 10 steps per epoch: the stops fall inside the first and second epochs,
    // and the resumed runs cross two epoch boundaries.
    check_resume_is_bit_for_bit(
        serde_json::json!({"workload": "rainfall-mlp", "steps": 25, "batch_size": 1000,
                           "learning_rate": 0.01}),
        &[7, 16],
    );
}

/// The newest committed checkpoint under `root`, as the bridge picks it.
fn newest_committed(root: &Path) -> Option<(u64, PathBuf)> {
    let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(root)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let step = path
                .file_name()?
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()?;
            Some((step, path))
        })
        .collect();
    steps.sort();
    steps
        .into_iter()
        .rev()
        .find(|(_, dir)| checkpoint::read(dir).is_ok())
}

/// A run killed with SIGKILL (not stopped politely) and resumed from its
/// newest committed checkpoint ends exactly as a run that never died.
#[test]
fn mnist_killed_run_resumes_bit_for_bit() {
    require_data(Workload::MnistCnn);
    let hyper =
        serde_json::json!({"workload": "mnist-cnn", "steps": 16, "batch_size": 16, "seed": 3});
    let tmp = tempfile::tempdir().unwrap();
    let (whole, killed) = (tmp.path().join("whole"), tmp.path().join("killed"));
    let uninterrupted = Run::new(&whole, hyper.clone()).ok();

    let mut run = Run::new(&killed, hyper.clone());
    run.every_steps = Some(2);
    let mut child = run.command().stdout(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    while !killed.join("step-4").join("manifest.json").exists() {
        assert!(t.elapsed().as_secs() < 300, "no checkpoint at step 4");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "killed before the end");
    let before = reports(&String::from_utf8_lossy(&out.stdout));
    let (resume_step, resume_dir) = newest_committed(&killed).unwrap();
    assert!(
        (4..16).contains(&resume_step),
        "resuming from step {resume_step}"
    );

    let mut run = Run::new(&killed, hyper);
    run.every_steps = Some(2);
    run.resume_from = Some(resume_dir);
    let after = run.ok();
    // The killed attempt's steps, then the resumed one's: each the same as
    // in the run that never died (steps after the checkpoint are redone).
    let want: BTreeMap<u64, u64> = loss_bits(&uninterrupted).into_iter().collect();
    for (step, bits) in loss_bits(&before).into_iter().chain(loss_bits(&after)) {
        assert_eq!(want[&step], bits, "step {step}");
    }
    assert_eq!(after.first().unwrap().0, resume_step + 1);
    assert!(
        file(&whole, 16, "weights.safetensors") == file(&killed, 16, "weights.safetensors"),
        "final weights differ after a kill at step {} and a resume from {resume_step}",
        before.last().map_or(0, |r| r.0)
    );
    println!(
        "mnist-cnn: killed after step {}, resumed from step {resume_step}: identical final weights",
        before.last().map_or(0, |r| r.0)
    );
}

#[test]
fn torn_checkpoints_are_refused() {
    require_data(Workload::RainfallMlp);
    let tmp = tempfile::tempdir().unwrap();
    let hyper = serde_json::json!({"workload": "rainfall-mlp", "steps": 6, "batch_size": 100});
    let mut run = Run::new(tmp.path(), hyper.clone());
    run.every_steps = Some(3);
    run.ok();
    let step3 = tmp.path().join("step-3");

    let resume = |dir: &Path| {
        let mut r = Run::new(tmp.path(), hyper.clone());
        r.resume_from = Some(dir.to_path_buf());
        let out = r.output();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // One flipped bit in the weights.
    let weights = step3.join("weights.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, &bytes).unwrap();
    let (code, err) = resume(&step3);
    assert_eq!(code, Some(1), "an error, not a panic: {err}");
    assert!(
        err.contains("is torn") && err.contains("weights.safetensors: sha256"),
        "{err}"
    );

    // A checkpoint whose manifest was never written.
    std::fs::remove_file(step3.join("manifest.json")).unwrap();
    let (code, err) = resume(&step3);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("is torn") && err.contains("manifest.json"),
        "{err}"
    );

    // Nothing was written past the refusal.
    assert!(!tmp.path().join("step-4").exists());
    // A resume with other settings is refused too, naming them.
    let mut r = Run::new(tmp.path(), serde_json::json!({"batch_size": 50}));
    r.resume_from = Some(tmp.path().join("step-6"));
    let out = r.output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("batch_size: checkpoint 100, now 50"), "{err}");
}

#[test]
fn missing_data_is_an_error_naming_the_fetch_script() {
    let tmp = tempfile::tempdir().unwrap();
    for (workload, script) in [
        ("mnist-cnn", "scripts/fetch-mnist.sh"),
        ("rainfall-mlp", "scripts/fetch-rainfall.sh"),
    ] {
        let mut run = Run::new(tmp.path(), serde_json::json!({"workload": workload}));
        run.env.push((
            "EDGELOOP_DEPS",
            tmp.path().join("empty").display().to_string(),
        ));
        let out = run.output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "an error, not a panic: {err}");
        assert!(err.contains(script), "{err}");
    }
}

#[test]
fn reports_are_posted_to_the_report_url() {
    require_data(Workload::RainfallMlp);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/v1/jobs/job-1/progress",
        listener.local_addr().unwrap()
    );
    // Accepts until the trainer is done (it sends 4 + 1 reports), answering
    // each like the bridge does.
    let server = std::thread::spawn(move || {
        let mut bodies = Vec::new();
        for _ in 0..5 {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).unwrap();
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .parse()
                        .unwrap();
                    if req.len() >= end + 4 + len {
                        assert!(text.starts_with("POST /v1/jobs/job-1/progress HTTP/1.1"));
                        bodies.push(text[end + 4..].to_string());
                        break;
                    }
                }
                assert!(n > 0, "connection closed mid-request");
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
        }
        bodies
    });
    let tmp = tempfile::tempdir().unwrap();
    let mut run = Run::new(
        tmp.path(),
        serde_json::json!({"workload": "rainfall-mlp", "steps": 4, "batch_size": 50}),
    );
    run.report_url = Some(url);
    let out = run.output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let bodies = server.join().unwrap();
    assert_eq!(bodies, stdout.lines().collect::<Vec<_>>());
    let last = reports(&stdout).pop().unwrap();
    assert_eq!(last.0, 4);
    assert!(last.1.contains_key("eval_accuracy"));
}

fn f32s(t: &NdTensor) -> Vec<f32> {
    match t {
        NdTensor::F32(a) => a.iter().copied().collect(),
        other => panic!("expected f32, got {:?}", other.dtype()),
    }
}

/// Trains `hyper`, then runs the exported model.onnx in ONNX Runtime on the
/// exported eval set: logits within `tol` of candle's, the same accuracy
/// as the manifest's, and at least `min_accuracy`.
fn check_export(hyper: serde_json::Value, min_accuracy: f64, tol: f32) {
    let workload: Workload = serde_json::from_value(hyper["workload"].clone()).unwrap();
    let steps = hyper["steps"].as_u64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let mut run = Run::new(tmp.path(), hyper);
    run.args = vec!["--report-every".into(), "50".into()];
    run.ok();
    let train_secs = t.elapsed().as_secs_f64();
    let dir = tmp.path().join(format!("step-{steps}"));

    let model = onnx::read(&dir.join("model.onnx")).unwrap();
    onnx::validate(&model, Some(&dir)).unwrap();
    let inputs = onnx::inspect(&model).inputs;
    // The quantizer's reader takes both sets as they are.
    let eval = Dataset::read(&dir.join("eval.npz"), &inputs, true).unwrap();
    let calib = Dataset::read(&dir.join("calib.npz"), &inputs, false).unwrap();
    assert_eq!(calib.samples, data::CALIB_SAMPLES);
    let npz = Npz::read(&dir.join("eval.npz")).unwrap();
    let x = npz.require("input").unwrap();
    let labels = eval.labels.clone().unwrap();

    let runtime = OrtRuntime::load(None).expect("ONNX Runtime: run scripts/fetch-onnxruntime.sh");
    let mut session = runtime
        .session(&onnx::encode(&model).unwrap(), &SessionOptions::default())
        .unwrap();
    let ort = f32s(&session.run(&[("input", x)]).unwrap()[0].1);

    let trained = Model::from_safetensors(
        workload,
        &std::fs::read(dir.join("weights.safetensors")).unwrap(),
    )
    .unwrap();
    let candle = trained.logits(&f32s(x), &x.shape()[1..]).unwrap();
    assert_eq!(ort.len(), candle.len());
    let max_diff = ort
        .iter()
        .zip(&candle)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);

    let classes = workload.classes();
    let accuracy = |logits: &[f32]| {
        let hits = argmax_rows(logits, classes)
            .iter()
            .zip(&labels)
            .filter(|(p, l)| **p as i64 == **l)
            .count();
        hits as f64 / labels.len() as f64
    };
    let (ort_acc, candle_acc) = (accuracy(&ort), accuracy(&candle));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let reported = manifest["metrics"]["eval_accuracy"].as_f64().unwrap();
    let majority = {
        let ones = labels.iter().filter(|&&l| l == 1).count() as f64 / labels.len() as f64;
        if classes == 2 {
            ones.max(1.0 - ones)
        } else {
            0.1
        }
    };
    println!(
        "{workload}: {steps} steps trained in {train_secs:.1}s; eval accuracy: ONNX Runtime \
         {ort_acc:.4}, candle {candle_acc:.4} (manifest {reported:.4}, chance/majority \
         {majority:.4}); max |logit diff| {max_diff:.2e} over {} samples",
        labels.len()
    );
    assert!(
        max_diff <= tol,
        "ONNX Runtime and candle disagree by {max_diff}"
    );
    assert_eq!(candle_acc, reported, "the manifest's accuracy is candle's");
    assert!(
        (ort_acc - candle_acc).abs() <= 2.0 / labels.len() as f64,
        "ORT {ort_acc} vs candle {candle_acc}"
    );
    assert!(
        ort_acc >= min_accuracy && ort_acc > majority + 0.02,
        "accuracy {ort_acc} is too low (want >= {min_accuracy})"
    );
}

#[test]
fn exported_mnist_cnn_runs_in_onnx_runtime() {
    require_data(Workload::MnistCnn);
    check_export(
        serde_json::json!({"workload": "mnist-cnn", "steps": 150, "batch_size": 64}),
        0.85,
        1e-4,
    );
}

#[test]
fn exported_rainfall_mlp_runs_in_onnx_runtime() {
    require_data(Workload::RainfallMlp);
    check_export(
        serde_json::json!({"workload": "rainfall-mlp", "steps": 400, "batch_size": 64}),
        0.78,
        1e-5,
    );
}

/// A run stopped by SIGTERM (a preemption) commits the step it is at, not
/// the last scheduled checkpoint, exits with 143, and resumed from that
/// commit ends exactly as a run that never stopped.
#[test]
fn mnist_sigterm_commits_the_step_it_is_at_and_resumes_bit_for_bit() {
    use std::io::BufRead as _;
    require_data(Workload::MnistCnn);
    let hyper =
        serde_json::json!({"workload": "mnist-cnn", "steps": 16, "batch_size": 16, "seed": 3});
    let tmp = tempfile::tempdir().unwrap();
    let (whole, stopped) = (tmp.path().join("whole"), tmp.path().join("stopped"));
    Run::new(&whole, hyper.clone()).ok();

    // Checkpoints every 100 steps: only the SIGTERM can make one mid-run.
    let mut run = Run::new(&stopped, hyper.clone());
    run.every_steps = Some(100);
    let mut child = run
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read to the end in a thread: a closed pipe would fail the trainer's
    // next report before the signal could.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let (step, _) = reports(&line.unwrap()).pop().unwrap();
            let _ = tx.send(step);
        }
    });
    while rx.recv().unwrap() < 5 {}
    let pid = i32::try_from(child.id()).unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let (step, dir) = newest_committed(&stopped).unwrap();
    assert!((5..16).contains(&step), "committed step {step}: {stderr}");
    assert!(
        stderr.contains(&format!("SIGTERM: committed step {step}")),
        "{stderr}"
    );

    let mut run = Run::new(&stopped, hyper);
    run.every_steps = Some(100);
    run.resume_from = Some(dir);
    let after = run.ok();
    assert_eq!(after.first().unwrap().0, step + 1);
    assert!(
        file(&whole, 16, "weights.safetensors") == file(&stopped, 16, "weights.safetensors"),
        "final weights differ after a SIGTERM at step {step}"
    );
}
