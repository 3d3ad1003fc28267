//! Training jobs through the control plane: queued over REST, leased by a
//! real bridge identity over mTLS gRPC, reported on, cancelled.

use std::time::Duration;

use edgeloop_client_core::Role;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::bridge::v1::{job_event, JobState, LeaseJobRequest, WatchJobsRequest};
use edgeloop_tests::progress;
use edgeloop_tests::ControlPlane;
use serde_json::json;
use tonic::transport::Channel;
use tonic::Code;

fn spec(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "command": ["python3", "train.py"],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "checkpoint": {"every_steps": 100, "keep_last": 2}
    })
}

async fn bridge(
    cp: &ControlPlane,
    name: &str,
    dir: &std::path::Path,
) -> BridgeServiceClient<Channel> {
    BridgeServiceClient::new(
        cp.connect(Role::Cluster, &cp.token("cluster", name).await, dir)
            .await,
    )
}

#[tokio::test]
async fn a_job_is_queued_leased_reported_and_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let api = cp.api();

    // Invalid specs name the field.
    let mut bad = spec("x");
    bad["resources"]["nodes"] = json!(0);
    let (status, body) = api.post("/api/v1/jobs", json!({"spec": bad})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "spec.resources.nodes", "{body}");
    let (status, body) = api
        .post("/api/v1/jobs", json!({"spec": spec("x"), "extra": 1}))
        .await;
    assert_eq!(
        (status.as_u16(), body["error"]["field"].as_str()),
        (400, Some("extra"))
    );

    let (status, job) = api
        .post("/api/v1/jobs", json!({"spec": spec("mnist")}))
        .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    assert_eq!(job["state"], "queued");

    let mut b = bridge(&cp, "gpu-a", &dir.path().join("b")).await;
    let leased = b
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec!["local".into()],
            running_jobs: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let j = leased.job.unwrap();
    assert_eq!((j.id.as_str(), j.attempt), (id.as_str(), 1));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&j.spec_json).unwrap()["name"],
        "mnist"
    );
    // Nothing else to lease while the bridge says it runs the job: the
    // long-poll returns empty after its wait.
    let empty = b
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec![],
            running_jobs: vec![id.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(empty.job.is_none());

    // Another cluster may not report on it.
    let mut other = bridge(&cp, "gpu-b", &dir.path().join("o")).await;
    let err = other
        .report_progress(progress(&id, 1, JobState::Running, 5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    let ack = b
        .report_progress(progress(&id, 1, JobState::Running, 100))
        .await
        .unwrap()
        .into_inner();
    assert!(!ack.cancel_requested);
    let (_, shown) = api.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (shown["state"].as_str(), shown["step"].as_u64()),
        (Some("running"), Some(100))
    );
    assert_eq!(shown["history"][0]["metrics"]["loss"], 0.25);
    assert_eq!(shown["engine_job_id"], "local-1");

    // Cancel: the watch stream tells the bridge, and so does the next ack.
    let mut watch = b
        .watch_jobs(WatchJobsRequest {})
        .await
        .unwrap()
        .into_inner();
    let (status, _) = api
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
    let ev = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.job_id, id);
    assert!(matches!(ev.event, Some(job_event::Event::Cancel(_))));
    let ack = b
        .report_progress(progress(&id, 1, JobState::Running, 150))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.cancel_requested);
    b.report_progress(progress(&id, 1, JobState::Cancelled, 150))
        .await
        .unwrap();
    let (_, shown) = api.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(shown["state"], "cancelled");
    // A report after the end is refused.
    let err = b
        .report_progress(progress(&id, 1, JobState::Running, 200))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    // A queued job cancelled before anyone leased it ends at once.
    let (_, queued) = api
        .post("/api/v1/jobs", json!({"spec": spec("later")}))
        .await;
    let (_, cancelled) = api
        .post(
            &format!("/api/v1/jobs/{}/cancel", queued["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(cancelled["state"], "cancelled");
    let none = b
        .lease_job(LeaseJobRequest {
            wait_seconds: 0,
            engines: vec![],
            running_jobs: vec![id.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.job.is_none());
    cp.stop().await;
}

#[tokio::test]
async fn a_long_poll_wakes_when_a_job_is_queued_and_a_restarted_bridge_readopts() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let mut b = bridge(&cp, "gpu-a", &dir.path().join("b")).await;
    let waiting = tokio::spawn({
        let mut b = b.clone();
        async move {
            b.lease_job(LeaseJobRequest {
                wait_seconds: 20,
                engines: vec![],
                running_jobs: vec![],
            })
            .await
            .unwrap()
            .into_inner()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, job) = cp
        .api()
        .post("/api/v1/jobs", json!({"spec": spec("wake")}))
        .await;
    let leased = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    let id = job["id"].as_str().unwrap();
    assert_eq!(leased.job.unwrap().id, id);
    b.report_progress(progress(id, 1, JobState::Running, 10))
        .await
        .unwrap();

    // The bridge restarts; its lease lapses; it leases again and gets the same
    // job, same attempt, to re-adopt rather than relaunch.
    cp.core
        .store
        .lifecycle
        .jobs
        .update(id, |j| {
            let mut j = j.unwrap();
            j.lease_expires_at = Some(time::OffsetDateTime::now_utc() - time::Duration::seconds(1));
            Ok::<_, ()>(j)
        })
        .unwrap()
        .unwrap();
    let again = b
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec![],
            running_jobs: vec![],
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!((again.id.as_str(), again.attempt), (id, 1));
    cp.stop().await;
}
