//! The retraining pipeline against a real control plane and a real trainer
//! bridge (local engine): the dataset snapshot reaches the job through the
//! artifact store, a failed training job fails the pipeline without
//! deploying anything, a second retrain request is coalesced into the
//! running one, a control-plane restart mid-pipeline resumes the same
//! pipeline and job instead of starting another, and a policy that signs
//! offline stops at `awaiting_signature` until `edgeloop model sign`.

use std::path::Path;
use std::time::Duration;

use edgeloop_control_plane::config::ServeSettings;
use edgeloop_models::manifest::{Manifest, ManifestKey, SignedManifest};
use edgeloop_tests::{eventually, settings, ControlPlane};
use serde_json::{json, Value};

const MODEL: &str = "rain";

fn cp_settings(dir: &Path) -> ServeSettings {
    ServeSettings {
        rollout_tick_ms: Some(100),
        ..settings(dir)
    }
}

/// Model `rain` with its base dataset, policy and labelled samples
/// (`edgeloop_tests::retrain::setup`).
async fn setup(cp: &ControlPlane, dir: &Path, job: Value, extra: Value) {
    edgeloop_tests::retrain::setup(cp, dir, MODEL, job, extra).await;
}

async fn pipeline(cp: &ControlPlane, id: &str) -> Value {
    let (status, body) = cp.api().get(&format!("/api/v1/pipelines/{id}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn wait_ended(cp: &ControlPlane, id: &str) -> Value {
    eventually(Duration::from_secs(90), "the pipeline ends", || async {
        let p = pipeline(cp, id).await;
        (p["status"] != "running").then_some(p)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_training_job_fails_the_pipeline_and_deploys_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(cp_settings(&dir.path().join("cp"))).await;
    // Exits 3 only if the snapshot arrived as a non-empty local file, so the
    // reason below proves the edgeloop-artifact:// dataset was fetched.
    let job = json!({
        "name": "retrain-rain",
        "command": ["sh", "-c",
            "f=$(echo \"$EDGELOOP_DATASETS\" | sed -e 's|.*file://||' -e 's|\".*||'); test -s \"$f\" && exit 3; exit 4"],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "restarts": {"max_restarts": 0, "backoff_seconds": 0, "backoff_max_seconds": 0}
    });
    setup(&cp, dir.path(), job, json!({})).await;
    let (_stop, _bridge) = cp.start_bridge(&dir.path().join("bridge")).await;

    let (status, started) = cp
        .api()
        .post(
            &format!("/api/v1/models/{MODEL}/retrain"),
            json!({"reason": "test"}),
        )
        .await;
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["trigger"], "manual: test");
    let id = started["id"].as_str().unwrap().to_string();

    let ended = wait_ended(&cp, &id).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["step"], "train", "{ended}");
    let reason = ended["reason"].as_str().unwrap();
    assert!(
        reason.contains("training job") && reason.contains('3'),
        "{reason}"
    );
    // The snapshot: the base window (60 rows) and the 30 older edge rows
    // train; the newest quarter (10) evaluates.
    let dataset = &ended["history"][0];
    assert_eq!(dataset["step"], "build_dataset");
    assert_eq!(dataset["output"]["rows"], 90, "{dataset}");
    assert_eq!(dataset["output"]["eval_rows"], 10, "{dataset}");
    assert_eq!(dataset["output"]["edge_rows"], 40, "{dataset}");
    // One attempt only: a failed job is not retried by the pipeline (the
    // bridge already applied the job's own restart policy).
    let trains: Vec<&Value> = ended["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["step"] == "train")
        .collect();
    assert_eq!(trains.len(), 1, "{ended}");

    let (_, deployments) = cp.api().get("/api/v1/deployments").await;
    assert_eq!(deployments.as_array().unwrap().len(), 0, "{deployments}");
    let (_, versions) = cp
        .api()
        .get(&format!("/api/v1/models/{MODEL}/versions"))
        .await;
    assert_eq!(versions.as_array().unwrap().len(), 0, "{versions}");

    // The slot is free again: a new retrain starts a new pipeline.
    let (status, again) = cp
        .api()
        .post(&format!("/api/v1/models/{MODEL}/retrain"), json!({}))
        .await;
    assert_eq!(status, 201, "{again}");
    assert_ne!(again["id"], started["id"]);
    let (status, body) = cp
        .api()
        .post(
            &format!("/api/v1/pipelines/{}/cancel", again["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    let (status, body) = cp
        .api()
        .post(
            &format!("/api/v1/pipelines/{}/cancel", again["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_pipeline_resumes_it_and_a_second_request_is_coalesced() {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let mut cp = ControlPlane::start_with(cp_settings(&cp_dir)).await;
    // Checkpoints, but no model.onnx in them: the pipeline gets past
    // training and fails at export, which is as far as this test needs.
    let job = json!({
        "name": "retrain-rain",
        "command": ["sh", edgeloop_tests::contract_trainer()],
        "env": {"TOTAL": "30", "EVERY": "10", "STEP_SECONDS": "0.2"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "checkpoint": {"every_steps": 10, "keep_last": 2},
        "restarts": {"max_restarts": 0, "backoff_seconds": 0, "backoff_max_seconds": 0}
    });
    setup(&cp, dir.path(), job, json!({})).await;
    let (_stop, _bridge) = cp.start_bridge(&dir.path().join("bridge")).await;
    let (status, started) = cp
        .api()
        .post(&format!("/api/v1/models/{MODEL}/retrain"), json!({}))
        .await;
    assert_eq!(status, 201, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let job_id = format!("{id}-train-1");
    eventually(Duration::from_secs(30), "the training job runs", || async {
        let (status, job) = cp.api().get(&format!("/api/v1/jobs/{job_id}")).await;
        (status == 200 && job["state"] == "running").then_some(())
    })
    .await;

    cp = cp.restart(cp_settings(&cp_dir)).await;
    let (status, again) = cp
        .api()
        .post(
            &format!("/api/v1/models/{MODEL}/retrain"),
            json!({"reason": "again"}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], id.as_str());
    assert_eq!(again["coalesced_request"], true);
    assert_eq!(again["coalesced"][0]["trigger"], "manual: again", "{again}");

    let ended = wait_ended(&cp, &id).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["step"], "export", "{ended}");
    assert!(
        ended["reason"].as_str().unwrap().contains("model.onnx"),
        "{ended}"
    );
    let history = ended["history"].as_array().unwrap();
    let train: Vec<&Value> = history.iter().filter(|r| r["step"] == "train").collect();
    assert_eq!(
        train.len(),
        1,
        "one training attempt across the restart: {ended}"
    );
    assert_eq!(train[0]["output"]["id"], job_id.as_str());
    assert_eq!(ended["coalesced"][0]["trigger"], "manual: again", "{ended}");
    let (_, pipelines) = cp.api().get("/api/v1/pipelines").await;
    assert_eq!(pipelines.as_array().unwrap().len(), 1, "{pipelines}");
    let (_, jobs) = cp.api().get("/api/v1/jobs").await;
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
}

#[tokio::test]
async fn bad_policies_and_requests_get_a_4xx_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(cp_settings(&dir.path().join("cp"))).await;
    let (status, _) = cp
        .api()
        .post("/api/v1/models", json!({"name": MODEL}))
        .await;
    assert_eq!(status, 201);
    let good_job = json!({"name": "retrain-rain", "command": ["true"]});
    let url = format!("/api/v1/models/{MODEL}/retraining");
    let cases = [
        (
            json!({"job": good_job, "rollout": {"selector": "site=lab"}, "eval_fraction": 1.5}),
            "eval_fraction",
        ),
        (
            json!({"job": {"name": "x"}, "rollout": {"selector": "site=lab"}}),
            "job.command",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": ""}}),
            "rollout.selector",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b", "version": "3"}}),
            "rollout.version",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"}, "max_attempts": 0}),
            "max_attempts",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"}, "base_window_rows": 0}),
            "base_window_rows",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "edge_window_rows": 20, "min_fresh_edge_rows": 30}),
            "min_fresh_edge_rows",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"}, "nope": 1}),
            "nope",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"}, "compare_with": "Production"}),
            "compare_with",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b", "alias": "production"}}),
            "rollout.alias",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "variants": [{"name": "gpu", "candidates": ["int4"],
                                 "providers": ["CUDAExecutionProvider"]}]}),
            "variants[0].candidates[0]",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "variants": [{"name": "gpu", "candidates": ["fp16"], "providers": ["cuda"]}]}),
            "variants[0].providers[0]",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "latency": {"benchmark_selector": "a in ("}}),
            "latency.benchmark_selector",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "latency": {"benchmark_selector": "a=b", "max_latency_ms": 0}}),
            "latency.max_latency_ms",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "latency": {"benchmark_selector": "a=b", "runs": 0}}),
            "latency.runs",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "latency": {"benchmark_selector": "a=b", "timeout_seconds": 1}}),
            "latency.timeout_seconds",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "signing": {"mode": "offline", "public_keys": ["not-a-key"]}}),
            "signing.public_keys[0]",
        ),
        (
            json!({"job": good_job, "rollout": {"selector": "a=b"},
                   "signing": {"mode": "notary"}}),
            "signing",
        ),
    ];
    for (body, field) in cases {
        let (status, err) = cp.api().put(&url, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {err}");
        assert!(
            err.to_string().contains(field),
            "{body}: error {err} should name {field}"
        );
    }
    let (status, _) = cp
        .api()
        .put(
            "/api/v1/models/nope/retraining",
            json!({"job": good_job, "rollout": {"selector": "a=b"}}),
        )
        .await;
    assert_eq!(status, 404);
    // No policy yet: a retrain cannot start.
    let (status, err) = cp
        .api()
        .post(&format!("/api/v1/models/{MODEL}/retrain"), json!({}))
        .await;
    assert_eq!(status, 409, "{err}");
    let (status, _) = cp
        .api()
        .post("/api/v1/models/nope/retrain", json!({}))
        .await;
    assert_eq!(status, 404);
    let (status, _) = cp.api().get("/api/v1/pipelines/p-404").await;
    assert_eq!(status, 404);
    let (status, _) = cp.api().get("/api/v1/pipelines?bogus=1").await;
    assert_eq!(status, 400);
}

/// A signature over the unsigned manifest `digest`, made in the test with
/// `key`, as `edgeloop model sign` would send it.
async fn signature(cp: &ControlPlane, digest: &str, key: &ManifestKey) -> Value {
    let (status, bytes) = cp
        .api()
        .send(
            cp.api()
                .request(reqwest::Method::GET, &format!("/api/v1/artifacts/{digest}")),
        )
        .await;
    assert_eq!(status, 200, "{bytes}");
    let manifest: Manifest = serde_json::from_value(bytes).unwrap();
    let signed = key.sign(manifest).unwrap();
    json!({"manifest": digest, "key_id": signed.key_id, "signature": signed.signature})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_signing_pipeline_waits_for_edgeloop_model_sign_and_ships_what_it_signed() {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let cp = ControlPlane::start_with(cp_settings(&cp_dir)).await;
    // The key is kept outside the control plane's data dir: its owner's.
    let key_path = dir.path().join("offline.key");
    let key = ManifestKey::generate();
    key.write_to(&key_path).unwrap();
    let public = key.public();
    let job = json!({
        "name": "retrain-rain",
        "command": [edgeloop_tests::reference_trainer().display().to_string()],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "hyperparameters": {"workload": "rainfall-mlp", "steps": 30, "batch_size": 16},
        "checkpoint": {"every_steps": 10, "keep_last": 2},
        "restarts": {"max_restarts": 0, "backoff_seconds": 0, "backoff_max_seconds": 0}
    });
    setup(
        &cp,
        dir.path(),
        job,
        json!({
            "signing": {"mode": "offline", "public_keys": [public.to_hex()]},
            "variants": [{"name": "fp16-gpu", "candidates": ["fp16"],
                          "providers": ["CUDAExecutionProvider"]}]
        }),
    )
    .await;
    let (_stop, _bridge) = cp.start_bridge(&dir.path().join("bridge")).await;
    let (status, started) = cp
        .api()
        .post(&format!("/api/v1/models/{MODEL}/retrain"), json!({}))
        .await;
    assert_eq!(status, 201, "{started}");
    let id = started["id"].as_str().unwrap().to_string();

    let waiting = wait_ended(&cp, &id).await;
    assert_eq!(waiting["status"], "awaiting_signature", "{waiting}");
    assert_eq!(waiting["step"], "sign", "{waiting}");
    let quantized = waiting["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == "quantize")
        .unwrap()["output"]
        .clone();
    assert_eq!(quantized["output"], "unsigned", "{quantized}");
    let own = quantized["manifest"].as_str().unwrap().to_string();
    let variant = quantized["variants"][0]["manifest"]
        .as_str()
        .unwrap()
        .to_string();
    // The control plane never made or read a signing key of its own.
    assert!(
        !cp_dir.join("keys/manifest-signing.key").exists(),
        "the control plane holds a signing key"
    );
    // Waiting is not running: no step timeout, no versions yet.
    let (_, versions) = cp
        .api()
        .get(&format!("/api/v1/models/{MODEL}/versions"))
        .await;
    assert_eq!(versions.as_array().unwrap().len(), 0, "{versions}");

    let url = format!("/api/v1/pipelines/{id}/signatures");
    // A key the policy does not name is refused, naming the signature.
    let stranger = ManifestKey::generate();
    let (status, err) = cp
        .api()
        .post(
            &url,
            json!({"signatures": [signature(&cp, &own, &stranger).await,
                                  signature(&cp, &variant, &key).await]}),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["field"], "signatures[0].signature", "{err}");
    // A variant left unsigned is refused, naming it.
    let (status, err) = cp
        .api()
        .post(
            &url,
            json!({"signatures": [signature(&cp, &own, &key).await]}),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(err.to_string().contains("fp16-gpu"), "{err}");
    // So is a manifest of nothing this pipeline made.
    let mut other = signature(&cp, &own, &key).await;
    other["manifest"] = json!("0".repeat(64));
    let (status, err) = cp.api().post(&url, json!({"signatures": [other]})).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["field"], "signatures[0].manifest", "{err}");
    // The CLI with the stranger's key gets the same refusal, and nothing moved.
    let stranger_path = dir.path().join("stranger.key");
    stranger.write_to(&stranger_path).unwrap();
    let refused = cp
        .edgeloop(&[
            "model",
            "sign",
            &id,
            "--signing-key",
            stranger_path.to_str().unwrap(),
        ])
        .await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("does not verify"), "{stderr}");
    assert_eq!(pipeline(&cp, &id).await["status"], "awaiting_signature");

    // The owner signs with the CLI: the pipeline goes on to register.
    let signed = cp
        .edgeloop(&[
            "model",
            "sign",
            &id,
            "--signing-key",
            key_path.to_str().unwrap(),
            "--json",
        ])
        .await;
    let stdout = String::from_utf8_lossy(&signed.stdout);
    assert!(
        signed.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["key_id"], public.key_id(), "{report}");
    assert_eq!(report["signed"].as_array().unwrap().len(), 2, "{report}");
    assert_eq!(report["status"], "running", "{report}");

    // The version is registered with manifests that verify with the
    // offline key, for its artifact and its variant's.
    let version = eventually(
        Duration::from_secs(30),
        "the version is registered",
        || async {
            let (_, v) = cp
                .api()
                .get(&format!("/api/v1/models/{MODEL}/versions"))
                .await;
            // The variants are added right after the version: wait for them.
            v.as_array()
                .and_then(|a| a.first().cloned())
                .filter(|v| v["variants"].as_array().is_some_and(|vs| !vs.is_empty()))
        },
    )
    .await;
    let download = |d: Value| {
        let api = cp.api();
        async move {
            let path = format!("/api/v1/artifacts/{}", d.as_str().unwrap());
            api.request(reqwest::Method::GET, &path)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
                .to_vec()
        }
    };
    let manifest = download(version["manifest_digest"].clone()).await;
    let artifact = download(version["artifact_digest"].clone()).await;
    let m = SignedManifest::from_json(&manifest).unwrap();
    m.verify_artifact(std::slice::from_ref(&public), artifact.as_slice())
        .unwrap();
    assert_eq!(m.manifest.name, MODEL);
    let v = &version["variants"][0];
    let variant_manifest = download(v["manifest_digest"].clone()).await;
    let variant_artifact = download(v["artifact_digest"].clone()).await;
    SignedManifest::from_json(&variant_manifest)
        .unwrap()
        .verify_artifact(std::slice::from_ref(&public), variant_artifact.as_slice())
        .unwrap();
    // And with nothing else: not with the stranger's key.
    assert!(m.verify(&[stranger.public()]).is_err());

    // Signed once: a second signing is a conflict.
    let (status, err) = cp
        .api()
        .post(
            &url,
            json!({"signatures": [signature(&cp, &own, &key).await]}),
        )
        .await;
    assert_eq!(status, 409, "{err}");
    let (status, body) = cp
        .api()
        .post(&format!("/api/v1/pipelines/{id}/cancel"), json!({}))
        .await;
    assert!(status == 200 || status == 409, "{body}");
    assert!(!cp_dir.join("keys/manifest-signing.key").exists());
}
