//! `edgeloop model push | pull | alias` as a user runs them (the binary)
//! against a real control plane on loopback, on the MNIST models: push a
//! model with its signed manifest and probe inputs, push it again (already
//! registered), push other bytes under the same version (a conflict naming
//! it), point `production` at it, roll it out by the alias, move the alias
//! (two history entries), and pull by the alias, byte for byte; a damaged
//! download leaves no file behind.

use std::path::Path;
use std::process::Command;

use edgeloop_client_core::Role;
use edgeloop_models::manifest::ManifestKey;
use edgeloop_models::npz::Npz;
use edgeloop_models::tensor::Tensor;
use edgeloop_models::Digest;
use edgeloop_tests::{manifests, mnist, ControlPlane};
use serde_json::{json, Value};

/// What a run of the binary left: its exit code, stdout and stderr.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", self.stdout, self.stderr))
    }
}

/// `edgeloop <args>` against `cp` as its admin, from the blocking pool (the
/// control plane runs on this test's runtime).
async fn edgeloop(cp: &ControlPlane, cwd: &Path, args: &[&str]) -> Run {
    let mut cmd = cp.edgeloop_command();
    cmd.args(args).current_dir(cwd);
    let out = edgeloop_tests::output_of(cmd).await;
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `model push MODEL --name digits --version V` and `extra`.
fn push_args(model: &str, version: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "model",
        "push",
        model,
        "--name",
        "digits",
        "--version",
        version,
    ];
    args.extend_from_slice(extra);
    args.into_iter().map(String::from).collect()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn push_alias_deploy_and_pull_a_model_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let cp = ControlPlane::start(&work.join("cp")).await;
    let api = cp.api();

    // The files a person has after `edgeloop model quantize`: the model,
    // its signed manifest, and the health probe's inputs it names.
    let mnist = mnist::mnist_dir();
    let (mlp, cnn) = (mnist.join("mlp.onnx"), mnist.join("cnn.onnx"));
    let mlp_bytes = std::fs::read(&mlp).unwrap();
    let mut probe = Npz::new();
    probe.insert("input", Tensor::F32(mnist::digits(2)));
    let probe_path = work.join("probe.npz");
    probe.write(&probe_path).unwrap();
    let probe_digest = Digest::of(&std::fs::read(&probe_path).unwrap());
    let manifest = manifests::mnist_manifest("digits", "1.0.0", &mlp_bytes, probe_digest, 1000.0);
    let manifest_path = work.join("mlp.onnx.manifest.json");
    let signed = ManifestKey::generate().sign(manifest).unwrap();
    std::fs::write(&manifest_path, signed.to_json_pretty().unwrap()).unwrap();
    let manifest_digest = Digest::of(&std::fs::read(&manifest_path).unwrap());

    let push_v1 = |extra: &'static [&'static str]| {
        let mut args = push_args(
            path(&mlp),
            "1.0.0",
            &[
                "--manifest",
                path(&manifest_path),
                "--probe-inputs",
                path(&probe_path),
                "--trigger",
                "manual",
                "--job",
                "mnist-0001",
            ],
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run = |args: Vec<String>| {
        let cp = &cp;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            edgeloop(cp, work, &args).await
        }
    };

    // Without the probe inputs the manifest names, and the server has
    // none: refused (65) before anything is sent.
    let no_probe = run(push_args(
        path(&mlp),
        "1.0.0",
        &["--manifest", path(&manifest_path)],
    ))
    .await;
    assert_eq!(no_probe.code, 65, "{}", no_probe.stderr);
    assert!(
        no_probe.stderr.contains("--probe-inputs"),
        "{}",
        no_probe.stderr
    );

    // The first push creates the model, uploads all three files and
    // registers the version with its lineage.
    let first = run(push_v1(&[])).await.ok();
    assert!(
        first.stdout.starts_with("registered digits 1.0.0"),
        "{}",
        first.stdout
    );
    for role in ["artifact:", "manifest:", "probe_inputs:"] {
        let line = first
            .stdout
            .lines()
            .find(|l| l.starts_with(role))
            .unwrap_or_else(|| panic!("no {role} in {}", first.stdout));
        assert!(line.ends_with("uploaded"), "{}", first.stdout);
    }
    let (status, v1) = api.get("/api/v1/models/digits/versions/1.0.0").await;
    assert_eq!(status, 200, "{v1}");
    assert_eq!(v1["artifact_digest"], Digest::of(&mlp_bytes).to_hex());
    assert_eq!(v1["manifest_digest"], manifest_digest.to_hex());
    assert_eq!(v1["probe_inputs_digest"], probe_digest.to_hex());
    assert_eq!(
        v1["lineage"],
        json!({"trigger": "manual", "job": "mnist-0001"})
    );

    // The same files again: already registered, nothing sent.
    let again = run(push_v1(&["--json"])).await.ok();
    let report = again.json();
    assert_eq!(report["outcome"], "already_registered", "{report}");
    assert!(
        report["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["uploaded"] == false),
        "{report}"
    );
    let human = run(push_v1(&[])).await.ok();
    assert!(
        human.stdout.contains("already registered"),
        "{}",
        human.stdout
    );

    // Other bytes under the same version: a conflict naming it (exit 75),
    // refused before anything is uploaded.
    let clash = run(push_args(path(&cnn), "1.0.0", &[])).await;
    assert_eq!(clash.code, 75, "{}", clash.stderr);
    assert!(
        clash.stderr.contains("409") && clash.stderr.contains("\"1.0.0\""),
        "{}",
        clash.stderr
    );
    let cnn_digest = Digest::of(&std::fs::read(&cnn).unwrap());
    let head = api
        .request(
            reqwest::Method::HEAD,
            &format!("/api/v1/artifacts/{cnn_digest}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 404, "nothing was uploaded for the conflict");
    let (_, unchanged) = api.get("/api/v1/models/digits/versions/1.0.0").await;
    assert_eq!(unchanged, v1);

    // A manifest that describes another file is refused locally (65).
    let wrong = run(push_args(
        path(&cnn),
        "9.0.0",
        &["--manifest", path(&manifest_path)],
    ))
    .await;
    assert_eq!(wrong.code, 65, "{}", wrong.stderr);
    assert!(
        wrong.stderr.contains("describes artifact"),
        "{}",
        wrong.stderr
    );

    // A second version, then `production` on the first.
    run(push_args(
        path(&cnn),
        "2.0.0",
        &["--parent-version", "1.0.0"],
    ))
    .await
    .ok();
    let set = run(vec![
        "model".into(),
        "alias".into(),
        "set".into(),
        "digits".into(),
        "production".into(),
        "1.0.0".into(),
    ])
    .await
    .ok();
    assert!(
        set.stdout.contains("production -> version 1.0.0"),
        "{}",
        set.stdout
    );

    // A deployment by the alias records both the alias and the version.
    let token = cp
        .labelled_token("device", "edge-1", json!({"site": "lab"}))
        .await;
    cp.enroll(Role::Device, &token, &work.join("edge-1")).await;
    let deployed = run(vec![
        "deployment".into(),
        "create".into(),
        "--model".into(),
        "digits".into(),
        "--alias".into(),
        "production".into(),
        "--selector".into(),
        "site=lab".into(),
        "--json".into(),
    ])
    .await
    .ok()
    .json();
    assert_eq!(deployed["alias"], "production", "{deployed}");
    assert_eq!(
        deployed["deployment"]["target_version"], "1.0.0",
        "{deployed}"
    );

    // Moving the alias does not move the deployment; its history has both.
    run(vec![
        "model".into(),
        "alias".into(),
        "set".into(),
        "digits".into(),
        "production".into(),
        "2.0.0".into(),
        "--reason".into(),
        "the CNN is better".into(),
    ])
    .await
    .ok();
    let history = run(vec![
        "model".into(),
        "alias".into(),
        "history".into(),
        "digits".into(),
        "production".into(),
        "--json".into(),
    ])
    .await
    .ok()
    .json();
    let moves = history["history"].as_array().unwrap();
    assert_eq!(moves.len(), 2, "{history}");
    assert_eq!(moves[0]["to"], "1.0.0");
    assert_eq!(moves[1]["from"], "1.0.0");
    assert_eq!(moves[1]["to"], "2.0.0");
    assert_eq!(moves[1]["by"], "admin");
    assert_eq!(moves[1]["reason"], "the CNN is better");
    let id = deployed["id"].as_str().unwrap();
    let (_, d) = api.get(&format!("/api/v1/deployments/{id}")).await;
    assert_eq!(d["deployment"]["target_version"], "1.0.0", "{d}");
    let table = run(vec![
        "model".into(),
        "alias".into(),
        "history".into(),
        "digits".into(),
        "production".into(),
    ])
    .await
    .ok();
    assert!(
        table.stdout.contains("the CNN is better"),
        "{}",
        table.stdout
    );
    let list = run(vec![
        "model".into(),
        "alias".into(),
        "list".into(),
        "digits".into(),
    ])
    .await
    .ok();
    let row = list
        .stdout
        .lines()
        .find(|l| l.starts_with("production"))
        .unwrap_or_else(|| panic!("{}", list.stdout));
    assert!(row.contains("2.0.0") && row.contains("admin"), "{row}");

    // Pull by the alias: the CNN, byte for byte.
    let out = work.join("pulled");
    let pulled = run(vec![
        "model".into(),
        "pull".into(),
        "digits".into(),
        "production".into(),
        "-o".into(),
        path(&out).into(),
    ])
    .await
    .ok();
    assert!(
        pulled
            .stdout
            .starts_with("pulled digits 2.0.0 (production)"),
        "{}",
        pulled.stdout
    );
    assert_eq!(
        std::fs::read(out.join("model.onnx")).unwrap(),
        std::fs::read(&cnn).unwrap()
    );
    // A variant of 1.0.0 (another export of the same network, its own
    // signed manifest), pulled instead of the version's own artifact.
    let mut variant = edgeloop_models::onnx::decode(&mlp_bytes).unwrap();
    variant.set_producer_name("edgeloop-tests variant".into());
    let variant = edgeloop_models::onnx::encode(&variant).unwrap();
    let variant_manifest = ManifestKey::generate()
        .sign(manifests::mnist_manifest(
            "digits",
            "1.0.0",
            &variant,
            probe_digest,
            1000.0,
        ))
        .unwrap()
        .to_json_pretty()
        .unwrap();
    let (va, vm) = (
        cp.upload(&variant).await,
        cp.upload(variant_manifest.as_bytes()).await,
    );
    let (status, body) = api
        .post(
            "/api/v1/models/digits/versions/1.0.0/variants",
            json!({"name": "fp16-gpu", "artifact_digest": va.to_string(),
                   "manifest_digest": vm.to_string(), "providers": ["CUDAExecutionProvider"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let variant_dir = work.join("pulled-variant");
    let pulled = run(vec![
        "model".into(),
        "pull".into(),
        "digits".into(),
        "1.0.0".into(),
        "--variant".into(),
        "fp16-gpu".into(),
        "-o".into(),
        path(&variant_dir).into(),
    ])
    .await
    .ok();
    assert!(
        pulled
            .stdout
            .starts_with("pulled digits 1.0.0, variant fp16-gpu"),
        "{}",
        pulled.stdout
    );
    assert_eq!(
        std::fs::read(variant_dir.join("model.onnx")).unwrap(),
        variant
    );
    assert_eq!(
        std::fs::read_to_string(variant_dir.join("model.onnx.manifest.json")).unwrap(),
        variant_manifest
    );
    assert!(variant_dir.join("probe_inputs.npz").is_file());
    let unknown = run(vec![
        "model".into(),
        "pull".into(),
        "digits".into(),
        "1.0.0".into(),
        "--variant".into(),
        "int4".into(),
    ])
    .await;
    assert_eq!(unknown.code, 66, "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("no variant \"int4\" (it has: fp16-gpu)"),
        "{}",
        unknown.stderr
    );
    assert!(!work.join("digits-1.0.0-int4").exists());

    // Pull the first version by its number: all three files, as pushed,
    // into the default directory; nothing but them is left there.
    run(vec![
        "model".into(),
        "pull".into(),
        "digits".into(),
        "1.0.0".into(),
    ])
    .await
    .ok();
    let v1_dir = work.join("digits-1.0.0");
    assert_eq!(std::fs::read(v1_dir.join("model.onnx")).unwrap(), mlp_bytes);
    assert_eq!(
        std::fs::read(v1_dir.join("model.onnx.manifest.json")).unwrap(),
        std::fs::read(&manifest_path).unwrap()
    );
    assert_eq!(
        std::fs::read(v1_dir.join("probe_inputs.npz")).unwrap(),
        std::fs::read(&probe_path).unwrap()
    );
    let mut names: Vec<String> = std::fs::read_dir(&v1_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["model.onnx", "model.onnx.manifest.json", "probe_inputs.npz"]
    );
    // What was pulled pushes again as the same version.
    let repush = run(push_args(
        path(&v1_dir.join("model.onnx")),
        "1.0.0",
        &[
            "--manifest",
            path(&v1_dir.join("model.onnx.manifest.json")),
            "--probe-inputs",
            path(&v1_dir.join("probe_inputs.npz")),
        ],
    ))
    .await
    .ok();
    assert!(
        repush.stdout.contains("already registered"),
        "{}",
        repush.stdout
    );

    // A download that does not hash to its digest (the stored bytes were
    // damaged) fails, and leaves nothing under the final name, nor a temp
    // file.
    let hex = cnn_digest.to_hex();
    let stored = cp
        .data_dir
        .join("artifacts")
        .join("sha256")
        .join(&hex[..2])
        .join(&hex);
    let mut damaged = std::fs::read(&stored).unwrap();
    damaged[100] ^= 0xff;
    std::fs::write(&stored, &damaged).unwrap();
    let broken_dir = work.join("broken");
    let broken = run(vec![
        "model".into(),
        "pull".into(),
        "digits".into(),
        "2.0.0".into(),
        "-o".into(),
        path(&broken_dir).into(),
    ])
    .await;
    assert_eq!(broken.code, 70, "{}", broken.stderr);
    assert!(broken.stderr.contains("hash to"), "{}", broken.stderr);
    assert_eq!(std::fs::read_dir(&broken_dir).unwrap().count(), 0);

    // A name that is neither a version nor an alias is not found (66).
    let missing = run(vec![
        "model".into(),
        "pull".into(),
        "digits".into(),
        "staging".into(),
    ])
    .await;
    assert_eq!(missing.code, 66, "{}", missing.stderr);
    assert!(!work.join("digits-staging").exists());
    cp.stop().await;
}

/// The two-command path: `edgeloop model quantize --out M` then `edgeloop
/// model push M`, which finds the manifest and probe quantize wrote beside
/// M, uploads all three and registers the version with its probe.
#[tokio::test]
async fn quantize_then_push_finds_the_manifest_and_probe_beside_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let cp = ControlPlane::start(&work.join("cp")).await;
    let mnist = edgeloop_models::deps::dir().unwrap().join("mnist-models");
    let out = work.join("digits.onnx");
    let home = work.join("home");
    let quantize = Command::new(edgeloop_tests::edgeloop_bin())
        .args([
            "model",
            "quantize",
            path(&mnist.join("mlp.onnx")),
            "--calibration",
            path(&mnist.join("calib_mlp.npz")),
            "--eval",
            path(&mnist.join("eval_mlp.npz")),
            "--out",
            path(&out),
            "--name",
            "digits",
            "--version",
            "1.0.0",
        ])
        .env("EDGELOOP_HOME", &home)
        .env_remove("EDGELOOP_MANIFEST_SIGNING_KEY")
        .output()
        .unwrap();
    assert!(
        quantize.status.success(),
        "{}",
        String::from_utf8_lossy(&quantize.stderr)
    );
    let pushed = edgeloop(
        &cp,
        work,
        &[
            "model",
            "push",
            path(&out),
            "--name",
            "digits",
            "--version",
            "1.0.0",
            "--json",
        ],
    )
    .await
    .ok();
    let report = pushed.json();
    let probe = Digest::of(&std::fs::read(work.join("digits.onnx.probe.npz")).unwrap());
    assert_eq!(
        report["version"]["probe_inputs_digest"],
        probe.to_string(),
        "{report}"
    );
    let roles: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles.len(), 3, "{roles:?}");
    assert!(
        roles.contains(&"manifest") && roles.contains(&"probe_inputs"),
        "{roles:?}"
    );
}
