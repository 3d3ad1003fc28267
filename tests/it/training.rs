//! A trainer bridge running jobs end to end on the local engine: the job
//! runs, its committed checkpoints reach the control plane, a kill -9 of
//! the training process resumes from the last checkpoint, cancel stops it,
//! and an incompatible job is refused by the pre-flight check.

use std::time::Duration;

use edgeloop_tests::{checkpoint_at_least, eventually, ControlPlane};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn spec(name: &str, total: u32, step_seconds: &str) -> Value {
    json!({
        "name": name,
        "command": ["sh", edgeloop_tests::contract_trainer()],
        "env": {"TOTAL": total.to_string(), "EVERY": "5", "STEP_SECONDS": step_seconds},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "checkpoint": {"every_steps": 5, "keep_last": 2},
        "restarts": {"max_restarts": 2, "backoff_seconds": 1, "backoff_max_seconds": 2}
    })
}

async fn job_state(cp: &ControlPlane, id: &str) -> Value {
    cp.api().get(&format!("/api/v1/jobs/{id}")).await.1
}

async fn submit(cp: &ControlPlane, spec: Value) -> String {
    let (status, job) = cp.api().post("/api/v1/jobs", json!({"spec": spec})).await;
    assert_eq!(status, 201, "{job}");
    job["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_job_runs_uploads_checkpoints_and_resumes_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let bridge_dir = dir.path().join("bridge");
    let (stop, bridge) = cp.start_bridge(&bridge_dir).await;

    // A clean run.
    let id = submit(&cp, spec("clean", 20, "0.02")).await;
    let done = eventually(Duration::from_secs(60), "clean job succeeds", || async {
        Some(job_state(&cp, &id).await).filter(|j| j["state"] == "succeeded")
    })
    .await;
    assert_eq!(done["step"], 20);
    let steps: Vec<u64> = done["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        steps,
        vec![5, 10, 15, 20],
        "every committed checkpoint reached the control plane"
    );
    assert_eq!(done["checkpoints"][3]["has_optimizer_state"], true);
    // Only the last keep_last stay on the bridge's disk.
    let local: Vec<String> =
        std::fs::read_dir(bridge_dir.join("jobs").join(&id).join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
    assert_eq!(local.len(), 2, "{local:?}");
    // Every progress report the trainer sent became TensorBoard scalars.
    let tb = bridge_dir.join("jobs").join(&id).join("tensorboard");
    let file = std::fs::read_dir(&tb)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let records =
        edgeloop_trainer_bridge::tensorboard::read_records(&std::fs::read(&file).unwrap()).unwrap();
    assert!(
        records.len() >= 11,
        "file version + one event per reported step: {}",
        records.len()
    );
    assert!(records
        .iter()
        .skip(1)
        .all(|r| r.windows(4).any(|w| w == b"loss")));

    // kill -9 mid-run: the next attempt resumes from the last checkpoint.
    let id = submit(&cp, spec("killed", 40, "0.1")).await;
    let ckpts = bridge_dir.join("jobs").join(&id).join("checkpoints");
    checkpoint_at_least(&ckpts, 10).await;
    let state_dir = bridge_dir.join("engine-local").join(format!("{id}-a1"));
    let pgid: i32 = std::fs::read_to_string(state_dir.join("pgid-0"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let done = eventually(
        Duration::from_secs(90),
        "killed job recovers and succeeds",
        || async {
            Some(job_state(&cp, &id).await)
                .filter(|j| j["state"] == "succeeded" || j["state"] == "failed")
        },
    )
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["step"], 40);
    assert_eq!(done["attempt"], 2, "one restart");
    let log =
        std::fs::read_to_string(bridge_dir.join("jobs").join(&id).join("trainer.log")).unwrap();
    let resumed: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("attempt 2 resumed from "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(resumed >= 10 && resumed.is_multiple_of(5), "{log}");
    assert!(log.contains("finished at 40"), "{log}");

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn cancel_stops_a_running_job_and_preflight_refuses_what_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge) = cp.start_bridge(&dir.path().join("bridge")).await;

    let id = submit(&cp, spec("long", 10_000, "0.05")).await;
    eventually(Duration::from_secs(30), "running", || async {
        Some(job_state(&cp, &id).await).filter(|j| j["state"] == "running")
    })
    .await;
    cp.api()
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    eventually(Duration::from_secs(30), "cancelled", || async {
        Some(job_state(&cp, &id).await).filter(|j| j["state"] == "cancelled")
    })
    .await;

    // This machine has no GPUs: a job needing 4 per node is refused with the reason.
    let mut gpu = spec("gpu-job", 10, "0.01");
    gpu["resources"]["gpus_per_node"] = json!(4);
    let id = submit(&cp, gpu).await;
    let failed = eventually(Duration::from_secs(30), "refused", || async {
        Some(job_state(&cp, &id).await).filter(|j| j["state"] == "failed")
    })
    .await;
    let msg = failed["last_message"].as_str().unwrap();
    assert!(msg.contains("pre-flight") && msg.contains("4"), "{msg}");

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn a_restarted_bridge_adopts_its_running_job_instead_of_starting_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let bridge_dir = dir.path().join("bridge");
    let (stop, bridge) = cp.start_bridge(&bridge_dir).await;
    let id = submit(&cp, spec("adopted", 60, "0.05")).await;
    let ckpts = bridge_dir.join("jobs").join(&id).join("checkpoints");
    eventually(
        Duration::from_secs(60),
        "running with a checkpoint",
        || async {
            edgeloop_trainer_bridge::checkpoint::scan(&ckpts)
                .last()
                .map(|c| c.step)
        },
    )
    .await;
    // The bridge goes away; the training processes do not.
    stop.cancel();
    bridge.await.unwrap().unwrap();

    // Same data dir, so the same identity: no token this time.
    let config = cp.bridge_config(&bridge_dir, None);
    let stop = CancellationToken::new();
    let bridge = tokio::spawn(edgeloop_trainer_bridge::run(config, stop.clone()));
    let done = eventually(Duration::from_secs(90), "adopted job ends", || async {
        Some(job_state(&cp, &id).await)
            .filter(|j| matches!(j["state"].as_str(), Some("succeeded" | "failed")))
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 1, "adopted, not restarted");
    let engine_runs: Vec<String> = std::fs::read_dir(bridge_dir.join("engine-local"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(&id))
        .collect();
    assert_eq!(engine_runs, vec![format!("{id}-a1")], "started once");
    let log =
        std::fs::read_to_string(bridge_dir.join("jobs").join(&id).join("trainer.log")).unwrap();
    assert!(!log.contains("resumed"), "{log}");
    assert!(log.contains("finished at 60"), "{log}");
    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn a_job_whose_bridge_died_resumes_on_another_bridge_from_the_uploaded_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::config::ServeSettings {
        job_lease_secs: Some(3),
        ..edgeloop_tests::settings(&dir.path().join("cp"))
    })
    .await;
    let first_dir = dir.path().join("bridge-a");
    let (stop, bridge) = cp.start_bridge(&first_dir).await;
    let mut s = spec("moved", 60, "0.1");
    // Progress as JSON lines on stdout, the other half of the contract.
    s["env"]["REPORT_VIA"] = json!("stdout");
    let id = submit(&cp, s).await;

    // Wait until the control plane holds a checkpoint of step >= 10.
    let uploaded = eventually(
        Duration::from_secs(60),
        "an uploaded checkpoint",
        || async {
            job_state(&cp, &id).await["checkpoints"]
                .as_array()
                .and_then(|c| c.last().cloned())
                .and_then(|c| c["step"].as_u64())
                .filter(|s| *s >= 10)
        },
    )
    .await;
    let job = job_state(&cp, &id).await;
    let from_stdout = job["history"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["metrics"]["from_stdout"] == 1.0);
    assert!(
        from_stdout,
        "stdout progress reached the control plane: {job}"
    );

    // The first machine dies: its bridge and its training processes.
    stop.cancel();
    bridge.await.unwrap().unwrap();
    let engine =
        edgeloop_trainer_bridge::engines::local::LocalEngine::new(&first_dir.join("engine-local"))
            .unwrap();
    edgeloop_trainer_bridge::engines::Engine::cancel(
        &engine,
        &edgeloop_trainer_bridge::engines::EngineJobId(format!("{id}-a1")),
    )
    .await
    .unwrap();

    // Another bridge, with an empty disk, takes the job once the lease lapses.
    let second_dir = dir.path().join("bridge-b");
    let token = cp.token("cluster", "other-gpu").await;
    let stop = CancellationToken::new();
    let bridge = tokio::spawn(edgeloop_trainer_bridge::run(
        cp.bridge_config(&second_dir, Some(token)),
        stop.clone(),
    ));
    let done = eventually(Duration::from_secs(120), "the moved job ends", || async {
        Some(job_state(&cp, &id).await)
            .filter(|j| matches!(j["state"].as_str(), Some("succeeded" | "failed")))
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 2, "{done}");
    let log =
        std::fs::read_to_string(second_dir.join("jobs").join(&id).join("trainer.log")).unwrap();
    let resumed: u64 = log
        .lines()
        .find_map(|l| l.split("resumed from ").nth(1))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("the second bridge resumed: {log}"));
    assert!(
        resumed >= uploaded,
        "resumed from {resumed}, uploaded {uploaded}"
    );
    assert!(log.contains("finished at 60"), "{log}");
    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn a_job_failing_the_same_way_twice_without_progress_is_not_restarted_again() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge) = cp.start_bridge(&dir.path().join("bridge")).await;
    let id = submit(
        &cp,
        json!({
            "name": "broken",
            "command": ["sh", "-c", "echo 'config.yaml: no such file' >&2; exit 3"],
            "restarts": {"max_restarts": 10, "backoff_seconds": 1, "backoff_max_seconds": 1}
        }),
    )
    .await;
    let done = eventually(Duration::from_secs(60), "the broken job ends", || async {
        Some(job_state(&cp, &id).await).filter(|j| j["state"] == "failed")
    })
    .await;
    assert_eq!(
        done["attempt"], 2,
        "stopped after the second identical failure: {done}"
    );
    assert_eq!(done["exit_code"], 3, "{done}");
    let msg = done["last_message"].as_str().unwrap();
    assert!(msg.contains("deterministically"), "{msg}");
    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn the_reference_trainer_killed_mid_run_ends_with_the_weights_of_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let trainer = edgeloop_tests::reference_trainer();
    let hyper = json!({"workload": "mnist-cnn", "steps": 240, "seed": 7});

    // Uninterrupted, outside the bridge.
    let reference = dir.path().join("reference");
    let out = std::process::Command::new(&trainer)
        .env("EDGELOOP_CHECKPOINT_DIR", &reference)
        .env("EDGELOOP_RESUME_FROM", "")
        .env("EDGELOOP_CHECKPOINT_EVERY_STEPS", "40")
        .env("EDGELOOP_HYPERPARAMETERS", hyper.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = std::fs::read(reference.join("step-240/weights.safetensors")).unwrap();
    let want_opt = std::fs::read(reference.join("step-240/optimizer.safetensors")).unwrap();

    // Through the bridge, killed with -9 after a checkpoint.
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let bridge_dir = dir.path().join("bridge");
    let (stop, bridge) = cp.start_bridge(&bridge_dir).await;
    let id = submit(
        &cp,
        json!({
            "name": "mnist-killed",
            "command": [trainer.display().to_string()],
            "hyperparameters": hyper,
            "checkpoint": {"every_steps": 40, "keep_last": 10},
            "restarts": {"max_restarts": 2, "backoff_seconds": 1, "backoff_max_seconds": 1}
        }),
    )
    .await;
    let ckpts = bridge_dir.join("jobs").join(&id).join("checkpoints");
    let at = checkpoint_at_least(&ckpts, 80).await;
    assert!(at < 240, "killed mid-run, not after the end ({at})");
    let pgid: i32 = std::fs::read_to_string(
        bridge_dir
            .join("engine-local")
            .join(format!("{id}-a1"))
            .join("pgid-0"),
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let done = eventually(Duration::from_secs(180), "the killed job ends", || async {
        Some(job_state(&cp, &id).await)
            .filter(|j| j["state"] == "succeeded" || j["state"] == "failed")
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(done["step"], 240, "{done}");
    let got = std::fs::read(ckpts.join("step-240/weights.safetensors")).unwrap();
    let got_opt = std::fs::read(ckpts.join("step-240/optimizer.safetensors")).unwrap();
    assert!(
        got == want,
        "final weights differ from the uninterrupted run"
    );
    assert!(got_opt == want_opt, "final optimizer state differs");
    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
