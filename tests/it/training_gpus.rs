//! GPU jobs on the real Slurm and Ray that scripts/slurm-up.sh and
//! scripts/ray-up.sh start. Slurm's node has a fake GRES (`gpu:fake:2`,
//! backed by /dev/null and /dev/zero) and Ray's head declares
//! `--num-gpus=2`: both engines schedule those GPUs like real ones and hand
//! them out through `CUDA_VISIBLE_DEVICES`, which is what is under test.
//! No kernel runs on them.
//!
//! For each engine: the bridge reports the engine's node pool with its
//! GPUs (and where that came from) in `GET /api/v1/clusters/{id}`; a 1-GPU
//! job runs and its environment shows the allocation; a 3-GPU job is
//! refused before it reaches the engine, naming `resources.gpus_per_node`
//! and the pool.
//!
//! The engines' settings are environment variables read when the bridge
//! starts; this file holds one test, so nothing else changes them.

use std::time::Duration;

use edgeloop_tests::{load_engine_envs, ControlPlane};
use serde_json::{json, Value};

/// A job that records the GPU part of its environment in `gpu.env`, in
/// its working directory (the job's directory on the bridge).
fn gpu_job(name: &str, engine: &str, gpus: u32) -> Value {
    json!({
        "name": name,
        "engine": engine,
        "command": ["sh", "-c",
            "env | grep -E '^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS|NCCL_SOCKET_IFNAME)=' | sort > gpu.env"],
        "resources": {"nodes": 1, "gpus_per_node": gpus, "cpus": 1, "memory_mb": 256},
        "nccl": {"NCCL_SOCKET_IFNAME": "lo"},
        "restarts": {"max_restarts": 0}
    })
}

#[tokio::test]
async fn slurm_and_ray_schedule_gpus_from_their_pools() {
    // Alone: the bridge finds its engines in the process's environment.
    if !edgeloop_tests::in_own_process() {
        return;
    }
    load_engine_envs();
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, cluster) = cp
        .start_online_bridge(&dir.path().join("bridge"), "gpu-farm")
        .await;
    let pools = cluster["capabilities"]["pools"].as_array().unwrap().clone();
    let pool = |engine: &str| {
        pools
            .iter()
            .find(|p| p["engine"] == engine)
            .unwrap_or_else(|| panic!("no {engine} pool: {cluster:#}"))
            .clone()
    };
    let slurm = pool("slurm");
    assert_eq!(
        (&slurm["name"], &slurm["gpus_per_node"], &slurm["gpu_type"]),
        (&json!("edgeloop"), &json!(2), &json!("fake")),
        "{slurm}"
    );
    assert!(
        slurm["source"]
            .as_str()
            .unwrap()
            .starts_with("slurmrestd GET /slurm/v0.0.38/nodes"),
        "{slurm}"
    );
    let ray = pool("ray");
    assert_eq!(
        (&ray["name"], &ray["gpus_per_node"], &ray["nodes"]),
        (&json!("gpu:2"), &json!(2), &json!(1)),
        "{ray}"
    );
    assert!(
        ray["source"]
            .as_str()
            .unwrap()
            .starts_with("ray GET /api/v0/nodes"),
        "{ray}"
    );

    for engine in ["slurm", "ray"] {
        let id = cp
            .submit_job(gpu_job(&format!("one-gpu-{engine}"), engine, 1))
            .await;
        let done = cp.job_ended(&id, Duration::from_secs(120)).await;
        assert_eq!(done["state"], "succeeded", "{engine}: {done}");
        let id = done["id"].as_str().unwrap();
        let seen = std::fs::read_to_string(dir.path().join("bridge/jobs").join(id).join("gpu.env"))
            .unwrap();
        let visible = seen
            .lines()
            .find_map(|l| l.strip_prefix("CUDA_VISIBLE_DEVICES="))
            .unwrap_or_else(|| panic!("{engine}: no CUDA_VISIBLE_DEVICES in {seen:?}"));
        assert_eq!(
            visible.split(',').count(),
            1,
            "{engine}: one GPU, got {seen:?}"
        );
        assert!(
            seen.contains("NCCL_SOCKET_IFNAME=lo"),
            "{engine}: the spec's NCCL settings reach the job: {seen:?}"
        );
        if engine == "slurm" {
            assert!(seen.contains("SLURM_JOB_GPUS="), "{seen:?}");
        }

        let id = cp
            .submit_job(gpu_job(&format!("three-gpus-{engine}"), engine, 3))
            .await;
        let refused = cp.job_ended(&id, Duration::from_secs(120)).await;
        assert_eq!(refused["state"], "failed", "{engine}: {refused}");
        let why = refused["last_message"].as_str().unwrap();
        let pool_name = if engine == "slurm" {
            "slurm pool \"edgeloop\""
        } else {
            "ray pool \"gpu:2\""
        };
        assert!(
            why.contains("resources.gpus_per_node")
                && why.contains(&format!("needs 3 GPUs per node, {pool_name} has 2")),
            "{engine}: {why}"
        );
        assert!(
            refused["engine_job_id"].as_str().unwrap_or("").is_empty(),
            "{engine}: a refused job never reaches the engine: {refused}"
        );
    }

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
