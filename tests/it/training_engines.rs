//! The same contract trainer, run by a bridge on the real Ray and Slurm that
//! scripts/ray-up.sh and scripts/slurm-up.sh start: each runs the job to
//! completion and its checkpoints reach the control plane.
//!
//! One test per process would be cleaner for the environment; the engines'
//! settings are loaded into this test binary's environment once, before any
//! bridge starts.

use std::time::Duration;

use edgeloop_tests::{
    checkpoint_at_least, eventually, kill_trainer_of, load_engine_envs, ControlPlane,
};
use serde_json::{json, Value};

fn spec(name: &str, engine: &str) -> Value {
    json!({
        "name": name,
        "engine": engine,
        "command": ["sh", edgeloop_tests::contract_trainer()],
        "env": {"TOTAL": "15", "EVERY": "5", "STEP_SECONDS": "0.02"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1, "memory_mb": 256},
        "checkpoint": {"every_steps": 5, "keep_last": 3},
        "restarts": {"max_restarts": 0}
    })
}

#[tokio::test]
async fn ray_and_slurm_run_the_contract_trainer_to_completion() {
    // Alone: the bridge finds its engines in the process's environment.
    if !edgeloop_tests::in_own_process() {
        return;
    }
    load_engine_envs();
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, cluster) = cp
        .start_online_bridge(&dir.path().join("bridge"), "engines")
        .await;
    assert_eq!(
        cluster["capabilities"]["engines"],
        json!(["local", "ray", "slurm"])
    );

    for engine in ["ray", "slurm"] {
        let (status, job) = cp
            .api()
            .post(
                "/api/v1/jobs",
                json!({"spec": spec(&format!("on-{engine}"), engine)}),
            )
            .await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_str().unwrap().to_string();
        let done = eventually(Duration::from_secs(120), "job ends", || async {
            let (_, j) = cp.api().get(&format!("/api/v1/jobs/{id}")).await;
            Some(j).filter(|j| {
                matches!(
                    j["state"].as_str(),
                    Some("succeeded" | "failed" | "cancelled")
                )
            })
        })
        .await;
        assert_eq!(done["state"], "succeeded", "{engine}: {done}");
        let steps: Vec<u64> = done["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, vec![5, 10, 15], "{engine}");
        assert!(
            !done["engine_job_id"].as_str().unwrap_or("").is_empty(),
            "{engine}: {done}"
        );
    }

    // kill -9 of the training process on Slurm: the next attempt resumes
    // from the last committed checkpoint and finishes.
    let mut long = spec("slurm-killed", "slurm");
    long["env"] = json!({"TOTAL": "40", "EVERY": "5", "STEP_SECONDS": "0.1"});
    long["restarts"] = json!({"max_restarts": 2, "backoff_seconds": 1, "backoff_max_seconds": 2});
    let (_, job) = cp.api().post("/api/v1/jobs", json!({"spec": long})).await;
    let id = job["id"].as_str().unwrap().to_string();
    let ckpts = dir.path().join("bridge/jobs").join(&id).join("checkpoints");
    checkpoint_at_least(&ckpts, 10).await;
    let killed = kill_trainer_of(&id);
    assert!(killed > 0, "found the training process of {id}");
    let done = eventually(
        Duration::from_secs(120),
        "killed Slurm job recovers",
        || async {
            let (_, j) = cp.api().get(&format!("/api/v1/jobs/{id}")).await;
            Some(j).filter(|j| {
                matches!(
                    j["state"].as_str(),
                    Some("succeeded" | "failed" | "cancelled")
                )
            })
        },
    )
    .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        (done["step"].as_u64(), done["attempt"].as_u64()),
        (Some(40), Some(2)),
        "{done}"
    );
    let log = std::fs::read_to_string(dir.path().join("bridge/jobs").join(&id).join("trainer.log"))
        .unwrap();
    assert!(
        log.contains("attempt 2 resumed from") && log.contains("finished at 40"),
        "{log}"
    );

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
