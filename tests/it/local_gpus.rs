//! The local engine with injected GPU facts (`EDGELOOP_GPU_FACTS`): this
//! machine has no GPU, so the bridge is told it has two on driver 470.82.
//! Two 1-GPU jobs that run at the same time get different devices, and a
//! job whose image needs CUDA 12.2 is refused by the pre-flight check with
//! the driver's limit, before anything runs.
//!
//! `EDGELOOP_GPU_FACTS` is read when the bridge starts and the environment
//! is shared by the tests of one binary: this file holds one test.

use std::time::Duration;

use edgeloop_tests::ControlPlane;
use serde_json::{json, Value};

/// Holds its GPU long enough for the other job to start beside it.
fn gpu_job(name: &str, requirements: &[&str]) -> Value {
    json!({
        "name": name,
        "command": ["sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES\" > gpu.txt; sleep 2"],
        "resources": {"nodes": 1, "gpus_per_node": 1, "cpus": 1, "memory_mb": 64},
        "requirements": requirements,
        "restarts": {"max_restarts": 0}
    })
}

#[tokio::test]
async fn concurrent_gpu_jobs_get_their_own_device_and_old_drivers_are_refused() {
    // Alone: the bridge reads its GPUs from the process's environment.
    if !edgeloop_tests::in_own_process() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let facts = dir.path().join("gpus.json");
    std::fs::write(
        &facts,
        json!({
            "gpus": [
                {"index": 0, "name": "NVIDIA Tesla T4", "memory_bytes": 16u64 << 30},
                {"index": 1, "name": "NVIDIA Tesla T4", "memory_bytes": 16u64 << 30}
            ],
            "driver_version": "470.82"
        })
        .to_string(),
    )
    .unwrap();
    edgeloop_tests::set_env(edgeloop_trainer_bridge::facts::GPU_FACTS_ENV, &facts);
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, cluster) = cp
        .start_online_bridge(&dir.path().join("bridge"), "workstation")
        .await;
    let caps = &cluster["capabilities"];
    assert_eq!(
        caps["gpus"],
        json!([{"model": "NVIDIA Tesla T4", "memory_bytes": 16u64 << 30, "count": 2}])
    );
    assert_eq!(caps["driver_version"], "470.82");
    let local = &caps["pools"][0];
    assert_eq!(
        (
            &local["engine"],
            &local["gpus_per_node"],
            &local["gpu_type"]
        ),
        (&json!("local"), &json!(2), &json!("NVIDIA Tesla T4")),
        "{cluster:#}"
    );
    assert!(
        local["source"].as_str().unwrap().starts_with("file "),
        "{local}"
    );

    let a = cp.submit_job(gpu_job("gpu-a", &[])).await;
    let b = cp.submit_job(gpu_job("gpu-b", &[])).await;
    let mut devices = Vec::new();
    for id in [&a, &b] {
        let done = cp.job_ended(id, Duration::from_secs(60)).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let seen = std::fs::read_to_string(dir.path().join("bridge/jobs").join(id).join("gpu.txt"))
            .unwrap();
        devices.push(seen.trim().to_string());
    }
    devices.sort();
    assert_eq!(devices, ["0", "1"], "each job had a device of its own");

    let old = cp
        .submit_job(gpu_job("needs-cuda-12", &["cuda>=12.2"]))
        .await;
    let refused = cp.job_ended(&old, Duration::from_secs(60)).await;
    assert_eq!(refused["state"], "failed", "{refused}");
    assert_eq!(
        refused["last_message"],
        "pre-flight check refused: requirements[0]: image needs CUDA 12.2, cluster driver \
         470.82 supports ≤ 11.4"
    );

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
