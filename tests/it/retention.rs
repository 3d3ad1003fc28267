//! Retention of jobs and checkpoints, and artifact garbage collection, on
//! a job that really ran through a trainer bridge: once it ended long
//! enough ago (an injected clock), the job and its checkpoints go, except
//! the checkpoint a registered version was made from; once their bytes are
//! past the grace period, the sweep deletes them and keeps the version's.

use std::path::Path;
use std::time::{Duration, SystemTime};

use edgeloop_control_plane::Clock;
use edgeloop_models::Digest;
use edgeloop_tests::{eventually, settings, ControlPlane};
use serde_json::json;

/// Every stored artifact's file, set `age` back (the grace period counts
/// on the file's own time).
fn age_artifacts(data_dir: &Path, age: Duration) -> usize {
    let mut n = 0;
    for f in edgeloop_tests::files_under(&data_dir.join("artifacts").join("sha256")) {
        let f = std::fs::File::options().write(true).open(f).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
        n += 1;
    }
    n
}

async fn start_at(dir: &Path, at: time::OffsetDateTime) -> ControlPlane {
    ControlPlane::start_with_clock(settings(dir), Clock::manual(at)).await
}

#[tokio::test]
async fn a_finished_jobs_checkpoints_age_out_but_the_registered_versions_stays() {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let t0 = time::OffsetDateTime::now_utc();
    let cp = start_at(&cp_dir, t0).await;
    let (stop, bridge) = cp.start_bridge(&dir.path().join("bridge")).await;
    let id = cp
        .submit_job(json!({
            "name": "aging",
            "command": ["sh", edgeloop_tests::contract_trainer()],
            "env": {"TOTAL": "20", "EVERY": "5", "STEP_SECONDS": "0.02"},
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
            "checkpoint": {"every_steps": 5, "keep_last": 2},
        }))
        .await;
    let done = cp.job_ended(&id, Duration::from_secs(60)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    stop.cancel();
    let _ = bridge.await;
    let ckpts: Vec<(u64, Digest)> = done["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let digest = c["digest"].as_str().unwrap().parse().unwrap();
            (c["step"].as_u64().unwrap(), digest)
        })
        .collect();
    assert_eq!(
        ckpts.iter().map(|c| c.0).collect::<Vec<_>>(),
        [5, 10, 15, 20]
    );
    // A version made from step 10's checkpoint (the job itself unnamed).
    let exported = ckpts[1].1;
    let api = cp.api();
    let (s, b) = api.post("/api/v1/models", json!({"name": "aged"})).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = api
        .post(
            "/api/v1/models/aged/versions",
            json!({"artifact_digest": exported.to_string(), "format": "checkpoint",
                   "lineage": {"checkpoint": exported.to_string()}}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    cp.stop().await;

    // 100 days on: the compactor at start drops the job and every
    // checkpoint but the version's. Their bytes are young: kept.
    let cp = start_at(&cp_dir, t0 + time::Duration::days(100)).await;
    let store = cp.core.store.clone();
    let left = eventually(Duration::from_secs(30), "the job ages out", || {
        let store = store.clone();
        let id = id.clone();
        async move {
            let gone = store.lifecycle.jobs.get(&id).unwrap().is_none();
            let left: Vec<Digest> = store
                .registry
                .checkpoints
                .scan_prefix(&format!("{id}/"))
                .unwrap()
                .into_iter()
                .map(|(_, c)| c.digest)
                .collect();
            Some(left).filter(|_| gone)
        }
    })
    .await;
    assert_eq!(left, [exported], "only the version's checkpoint stays");
    let (s, _) = cp.api().get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(s, 404);
    for (_, d) in &ckpts {
        let held = cp.core.artifacts.head(*d).await.unwrap();
        assert!(held.is_some(), "young bytes are kept by the grace period");
    }
    // The store's lock goes with its last handle.
    drop(store);
    cp.stop().await;

    // Past the grace period, the sweep deletes the dropped checkpoints'
    // bytes and keeps the version's.
    assert!(age_artifacts(&cp_dir, Duration::from_secs(2 * 86_400)) >= 4);
    let cp = start_at(&cp_dir, t0 + time::Duration::days(100)).await;
    let api = cp.api();
    let collected = eventually(Duration::from_secs(30), "the sweep runs", || async {
        api.metric("edgeloop_artifacts_collected_total")
            .await
            .filter(|n| *n >= 3)
    })
    .await;
    assert_eq!(collected, 3, "steps 5, 15 and 20");
    for (step, d) in &ckpts {
        let held = cp.core.artifacts.head(*d).await.unwrap();
        assert_eq!(held.is_some(), *step == 10, "step {step}");
    }
    let (s, v) = api.get("/api/v1/models/aged/versions/1").await;
    assert_eq!(s, 200, "{v}");
    cp.stop().await;
}
