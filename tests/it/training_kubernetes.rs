//! A real control plane and a real trainer bridge whose kubernetes engine
//! talks to a **fake** API server (`edgeloop_tests::fake_k8s`: its fake
//! kubelet runs each pod's command as a local process, ignoring the image).
//! The contract trainer runs to completion and its checkpoints reach the
//! control plane; a kill -9 of the trainer fails the Job and the next
//! attempt, a new Job, resumes from the last checkpoint; cancel deletes it.
//!
//! The engine's settings are environment variables read when the bridge
//! starts, and tests in one binary share the environment: this file holds
//! one test, so nothing else reads or writes them concurrently.

use std::time::Duration;

use edgeloop_tests::fake_k8s::FakeKubernetes;
use edgeloop_tests::{checkpoint_at_least, eventually, kill_trainer_of, ControlPlane};
use edgeloop_trainer_bridge::engines::kubernetes;
use serde_json::{json, Value};

const NS: &str = "edgeloop-test";

fn spec(name: &str, total: u32, step_seconds: &str, max_restarts: u32) -> Value {
    json!({
        "name": name,
        "engine": "kubernetes",
        "image": "registry.example/edgeloop/contract-trainer:1",
        "command": ["sh", edgeloop_tests::contract_trainer()],
        "env": {"TOTAL": total.to_string(), "EVERY": "5", "STEP_SECONDS": step_seconds},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1, "memory_mb": 256},
        "checkpoint": {"every_steps": 5, "keep_last": 3},
        "restarts": {"max_restarts": max_restarts, "backoff_seconds": 1, "backoff_max_seconds": 2}
    })
}

#[tokio::test]
async fn fake_api_kubernetes_jobs_run_the_contract_trainer_resume_and_cancel() {
    // Alone: the bridge finds its Kubernetes API in the process's
    // environment.
    if !edgeloop_tests::in_own_process() {
        return;
    }
    let fake = FakeKubernetes::start().await;
    edgeloop_tests::set_env(kubernetes::API_URL_ENV, &fake.url);
    edgeloop_tests::set_env(kubernetes::NAMESPACE_ENV, NS);

    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, cluster) = cp
        .start_online_bridge(&dir.path().join("bridge"), "k8s")
        .await;
    let engines = cluster["capabilities"]["engines"]
        .as_array()
        .unwrap()
        .clone();
    assert!(engines.contains(&json!("kubernetes")), "{cluster}");
    // The fake's one node without GPUs, as the engine's pool, in the
    // bridge's capabilities: what the pre-flight check holds jobs against.
    eventually(Duration::from_secs(20), "the kubernetes pool", || async {
        let (_, list) = cp.api().get("/api/v1/clusters").await;
        list.as_array()?.iter().find(|c| {
            c["capabilities"]["pools"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["engine"] == "kubernetes" && p["name"] == "cpu" && p["nodes"] == 1)
        })?;
        Some(())
    })
    .await;

    // 1. Runs to completion; every checkpoint reaches the control plane.
    let id = cp.submit_job(spec("on-k8s", 15, "0.02", 0)).await;
    let done = cp.job_ended(&id, Duration::from_secs(120)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let steps: Vec<u64> = done["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![5, 10, 15], "{done}");
    let k8s_job = done["engine_job_id"].as_str().unwrap().to_string();
    let job = fake
        .job(NS, &k8s_job)
        .unwrap_or_else(|| panic!("{k8s_job} in {:?}", fake.jobs()));
    let conditions = job.status.unwrap().conditions.unwrap();
    assert!(
        conditions.iter().any(|c| c.type_ == "Complete"),
        "{conditions:?}"
    );
    assert_eq!(
        job.metadata.annotations.unwrap()[kubernetes::ANNOTATION_JOB_ID],
        id
    );

    // 2. kill -9 of the trainer: the pod fails, so does the Job; the next
    // attempt is a new Job that resumes from the last committed checkpoint.
    let id = cp.submit_job(spec("k8s-killed", 40, "0.1", 2)).await;
    let job_dir = dir.path().join("bridge/jobs").join(&id);
    checkpoint_at_least(&job_dir.join("checkpoints"), 10).await;
    assert!(
        kill_trainer_of(&id) > 0,
        "found the training process of {id}"
    );
    let done = cp.job_ended(&id, Duration::from_secs(120)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        (done["step"].as_u64(), done["attempt"].as_u64()),
        (Some(40), Some(2)),
        "{done}"
    );
    let log = std::fs::read_to_string(job_dir.join("trainer.log")).unwrap();
    assert!(
        log.contains("attempt 2 resumed from") && log.contains("finished at 40"),
        "{log}"
    );
    let first = fake.job(NS, &format!("{id}-1")).unwrap();
    let failed = first
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Failed")
        .unwrap();
    assert!(
        failed.message.unwrap_or_default().contains("exit code 137"),
        "SIGKILL is exit code 137 in a container"
    );
    // The tag was pinned to the digest the node resolved as attempt 1
    // started, and attempt 2's pods ran that digest, not the tag.
    let reference = "registry.example/edgeloop/contract-trainer:1";
    let resolved = edgeloop_models::Digest::of(reference.as_bytes()).to_string();
    assert_eq!(
        (
            &done["image"]["reference"],
            &done["image"]["digest"],
            &done["image"]["kind"]
        ),
        (&json!(reference), &json!(resolved), &json!("manifest")),
        "{done}"
    );
    let second = fake
        .job(NS, &format!("{id}-2"))
        .unwrap_or_else(|| panic!("{:?}", fake.jobs()));
    assert_eq!(
        second.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some(format!("{reference}@sha256:{resolved}").as_str())
    );

    // 3. Cancel: the Job and its Service are deleted, the process stopped.
    let id = cp.submit_job(spec("k8s-cancelled", 1000, "0.1", 2)).await;
    checkpoint_at_least(
        &dir.path().join("bridge/jobs").join(&id).join("checkpoints"),
        5,
    )
    .await;
    let (status, body) = cp
        .api()
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert!(status.is_success(), "{status} {body}");
    let done = cp.job_ended(&id, Duration::from_secs(120)).await;
    assert_eq!(done["state"], "cancelled", "{done}");
    let name = format!("{id}-1");
    assert!(fake.job(NS, &name).is_none(), "{:?}", fake.jobs());
    assert!(fake.service(NS, &name).is_none(), "{:?}", fake.services());
    eventually(Duration::from_secs(10), "trainer stopped", || async {
        Some(()).filter(|_| fake.live_processes() == 0)
    })
    .await;
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
