//! `edgeloop model inspect | quantize | verify`, the real binary, on the
//! MNIST MLP from scripts/fetch-mnist-models.sh.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data_dir() -> PathBuf {
    let dir = edgeloop_models::deps::dir().unwrap().join("mnist-models");
    assert!(
        dir.join(".complete").exists(),
        "{} missing: run scripts/fetch-mnist-models.sh",
        dir.display()
    );
    dir
}

fn edgeloop(args: &[&str], home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeloop"))
        .args(args)
        .env("EDGELOOP_HOME", home)
        .env_remove("EDGELOOP_MANIFEST_SIGNING_KEY")
        .env_remove("EDGELOOP_MANIFEST_PUBLIC_KEY")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn quantize_writes_a_signed_manifest_that_verifies_and_catches_tampering() {
    let data = data_dir();
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("mlp.q.onnx");
    let model = data.join("mlp.onnx");
    let s = |p: &Path| p.display().to_string();

    let inspect = edgeloop(&["model", "inspect", &s(&model), "--json"], home.path());
    assert!(inspect.status.success(), "{}", text(&inspect));
    let summary: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(summary["inputs"][0]["name"], "input");
    assert_eq!(summary["valid"], true);
    assert!(summary["op_histogram"]["Gemm"].as_u64().unwrap() >= 3);

    let q = edgeloop(
        &[
            "model",
            "quantize",
            &s(&model),
            "--calibration",
            &s(&data.join("calib_mlp.npz")),
            "--eval",
            &s(&data.join("eval_mlp.npz")),
            "--out",
            &s(&out),
            "--method",
            "static-minmax",
            "--version",
            "1.2.0",
            "--job",
            "train-42",
            "--dataset",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "--json",
        ],
        home.path(),
    );
    assert!(q.status.success(), "{}", text(&q));
    let report: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    assert_eq!(report["candidates"].as_array().unwrap().len(), 1);
    assert!(out.exists());
    let manifest_path = PathBuf::from(format!("{}.manifest.json", out.display()));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    assert_eq!(manifest["manifest"]["version"], "1.2.0");
    assert_eq!(manifest["manifest"]["name"], "mlp");
    assert_eq!(manifest["manifest"]["lineage"]["job"], "train-42");
    assert_eq!(
        manifest["manifest"]["lineage"]["dataset"],
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        manifest["manifest"]["artifact"]["size"],
        std::fs::metadata(&out).unwrap().len()
    );
    let evidence = &manifest["manifest"]["quantization"]["evidence"];
    assert!(
        evidence["candidates"][0]["metric"].is_number(),
        "{evidence}"
    );
    assert_eq!(evidence["task"]["kind"], "classification");
    assert_eq!(evidence["metric"]["name"], "top1_accuracy", "labels given");
    // The first evaluation sample ships as the health probe.
    let probe = std::fs::read(format!("{}.probe.npz", out.display())).unwrap();
    assert_eq!(
        manifest["manifest"]["health_probe"]["sample_inputs"],
        edgeloop_models::Digest::of(&probe).to_string()
    );
    assert_eq!(
        report["probe_inputs"],
        format!("{}.probe.npz", out.display())
    );
    assert!(manifest["manifest"]["reference_stats"]["inputs"][0]["counts"].is_array());
    // The key was created private, its public half beside it.
    let key = home.path().join("keys/manifest-signing.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let ok = edgeloop(
        &["model", "verify", &s(&out), &s(&manifest_path)],
        home.path(),
    );
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).starts_with("OK: mlp 1.2.0"), "{}", text(&ok));

    // One flipped byte in the model.
    let mut bytes = std::fs::read(&out).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    let tampered = home.path().join("tampered.onnx");
    std::fs::write(&tampered, &bytes).unwrap();
    let bad = edgeloop(
        &["model", "verify", &s(&tampered), &s(&manifest_path)],
        home.path(),
    );
    assert!(!bad.status.success());
    assert!(text(&bad).contains("FAILED"), "{}", text(&bad));

    // A manifest edited after signing.
    let edited = std::fs::read_to_string(&manifest_path)
        .unwrap()
        .replace("\"1.2.0\"", "\"1.2.1\"");
    let edited_path = home.path().join("edited.json");
    std::fs::write(&edited_path, edited).unwrap();
    let bad = edgeloop(
        &["model", "verify", &s(&out), &s(&edited_path)],
        home.path(),
    );
    assert!(!bad.status.success(), "{}", text(&bad));

    // A key nobody trusts.
    let other = tempfile::tempdir().unwrap();
    let untrusted = edgeloop(
        &[
            "model",
            "quantize",
            &s(&model),
            "--calibration",
            &s(&data.join("calib_mlp.npz")),
            "--eval",
            &s(&data.join("eval_mlp.npz")),
            "--out",
            &s(&other.path().join("m.onnx")),
            "--method",
            "dynamic",
        ],
        other.path(),
    );
    assert!(untrusted.status.success(), "{}", text(&untrusted));
    let other_manifest = other.path().join("m.onnx.manifest.json");
    let bad = edgeloop(
        &[
            "model",
            "verify",
            &s(&other.path().join("m.onnx")),
            &s(&other_manifest),
        ],
        home.path(),
    );
    assert!(!bad.status.success());
    assert!(text(&bad).contains("FAILED"), "{}", text(&bad));
}

#[test]
fn a_calibration_set_that_does_not_fit_the_model_is_named() {
    let data = data_dir();
    let home = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.display().to_string();
    // CNN data ([N,1,28,28]) for the MLP ([N,784]).
    let q = edgeloop(
        &[
            "model",
            "quantize",
            &s(&data.join("mlp.onnx")),
            "--calibration",
            &s(&data.join("calib_cnn.npz")),
            "--eval",
            &s(&data.join("eval_mlp.npz")),
            "--out",
            &s(&home.path().join("x.onnx")),
        ],
        home.path(),
    );
    assert!(!q.status.success());
    let msg = text(&q);
    assert!(
        msg.contains("calib_cnn.npz")
            && msg.contains("\"input\"")
            && msg.contains("[256, 1, 28, 28]"),
        "{msg}"
    );
    assert!(
        !home.path().join("x.onnx").exists(),
        "nothing written on a refused input"
    );
}

/// A stateful model from the zoo (scripts/fetch-zoo.sh) with its state
/// named on the command line, and the errors a wrong `--state` gets.
#[test]
fn quantize_a_stateful_model_named_by_flags() {
    let zoo = edgeloop_models::deps::dir().unwrap().join("zoo");
    assert!(zoo.join(".fetched").exists(), "run scripts/fetch-zoo.sh");
    let home = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.display().to_string();
    let model = zoo.join("silero-op15.onnx");
    let data = zoo.join("data/silero-op15");
    let out = home.path().join("vad.onnx");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "model".to_string(),
            "quantize".into(),
            s(&model),
            "--calibration".into(),
            s(&data.join("calibration.npz")),
            "--eval".into(),
            s(&data.join("eval.npz")),
            "--out".into(),
            s(&out),
            "--method".into(),
            "static-minmax".into(),
            "--json".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        edgeloop(&args, home.path())
    };
    let q = run(&[
        "--task",
        "stateful",
        "--state",
        "state=stateN",
        "--budget",
        "0.5",
    ]);
    assert!(q.status.success(), "{}", text(&q));
    let report: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    assert_eq!(report["task"]["state"][0]["output"], "stateN");
    assert_eq!(report["metric"]["name"], "step_relative_l2");
    assert_eq!(report["metric"]["budget"], 0.5);
    let c = &report["candidates"][0];
    assert!(
        c["loss"].as_f64().unwrap() > 0.0 && c["accepted"] == true,
        "{c}"
    );

    for (extra, want) in [
        (vec!["--state", "state"], "expected INPUT=OUTPUT"),
        (vec!["--state", "nope=stateN"], "no input \"nope\""),
        (vec!["--state", "state=nope"], "no output \"nope\""),
        (
            vec!["--task", "regression", "--state", "state=stateN"],
            "--state applies to --task stateful",
        ),
        (vec!["--budget=-1"], "--budget must be"),
    ] {
        let o = run(&extra);
        assert!(!o.status.success(), "{extra:?}");
        assert!(text(&o).contains(want), "{extra:?}: {}", text(&o));
    }
}
