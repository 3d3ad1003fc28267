//! The control plane's download limits against real bridges over mTLS:
//! one member may hold only so many open downloads, and a download whose
//! reader takes nothing gives its sending permit back after the send
//! deadline, so another member's download goes ahead.

use std::time::Duration;

use edgeloop_client_core::tls::mtls_endpoint;
use edgeloop_client_core::Role;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::bridge::v1::{FetchCheckpointRequest, LeaseJobRequest};
use edgeloop_proto::common::v1::Chunk;
use edgeloop_tests::{settings, ControlPlane};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

/// A bridge named `name` that has leased a job whose dataset is `digest`.
async fn bridge_with_job(
    cp: &ControlPlane,
    dir: &std::path::Path,
    name: &str,
    digest: &str,
) -> (BridgeServiceClient<Channel>, String) {
    let token = cp.token("cluster", name).await;
    let identity = cp.enroll(Role::Cluster, &token, &dir.join(name)).await;
    let (status, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            serde_json::json!({"spec": {"name": format!("train-{name}"), "command": ["true"],
                "datasets": [format!("edgeloop-artifact://{digest}")]}}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let channel = mtls_endpoint(&cp.grpc_url, &identity)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = BridgeServiceClient::new(channel);
    let leased = client
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec![],
            running_jobs: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(leased.job.is_some(), "{name} leased nothing");
    (client, job["id"].as_str().unwrap().to_string())
}

async fn fetch(
    client: &mut BridgeServiceClient<Channel>,
    job: &str,
    digest: &str,
) -> Result<Streaming<Chunk>, tonic::Status> {
    client
        .fetch_checkpoint(FetchCheckpointRequest {
            job_id: job.into(),
            digest: digest.into(),
            offset: 0,
        })
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_gives_its_turn_back_and_one_member_holds_only_so_many() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        max_concurrent_downloads: Some(1),
        max_downloads_per_member: Some(2),
        download_send_timeout_secs: Some(1),
        ..settings(&dir.path().join("cp"))
    })
    .await;
    // 8 MiB: far past what HTTP/2 flow control lets through unread.
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
    let digest = cp.upload(&data).await.to_string();
    let (mut stalled, stalled_job) = bridge_with_job(&cp, dir.path(), "farm-1", &digest).await;
    let (mut reader, reader_job) = bridge_with_job(&cp, dir.path(), "farm-2", &digest).await;

    // farm-1 opens two and reads neither: a third is refused.
    let held = fetch(&mut stalled, &stalled_job, &digest).await.unwrap();
    let queued = fetch(&mut stalled, &stalled_job, &digest).await.unwrap();
    let third = fetch(&mut stalled, &stalled_job, &digest).await;
    let refused = match third {
        Err(s) => s,
        Ok(mut s) => s.message().await.unwrap_err(),
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");

    // farm-1 holds the only sending permit and reads nothing; past the send
    // deadline it is given back, and farm-2's download runs to its end.
    let mut got = 0u64;
    let mut stream = fetch(&mut reader, &reader_job, &digest).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(c) = stream.message().await.unwrap() {
            assert_eq!(c.offset, got);
            got += c.data.len() as u64;
        }
    })
    .await
    .expect("farm-2's download goes ahead after farm-1's deadline");
    assert_eq!(got, data.len() as u64);
    drop((held, queued));
    // farm-1's slots come back once its streams end: it may download again.
    let mut again = None;
    for _ in 0..50 {
        if let Ok(s) = fetch(&mut stalled, &stalled_job, &digest).await {
            again = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut again = again.expect("farm-1 may open a download again");
    let first = tokio::time::timeout(Duration::from_secs(30), again.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.offset, 0);
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_share_the_replicas_byte_rate_turn_by_turn() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        max_download_bytes_per_sec: Some(1 << 20),
        ..settings(&dir.path().join("cp"))
    })
    .await;
    // 1 MiB each, two at once, at 1 MiB/s together: four 256 KiB chunks
    // each, taking turns, so the pair needs about 2 s and neither can end
    // before about 1.4 s. Uncapped they take milliseconds; one after the
    // other, the first would end at about 0.65 s.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let digest = cp.upload(&data).await.to_string();
    let (mut a, a_job) = bridge_with_job(&cp, dir.path(), "farm-a", &digest).await;
    let (mut b, b_job) = bridge_with_job(&cp, dir.path(), "farm-b", &digest).await;
    let t0 = std::time::Instant::now();
    let streams = [
        fetch(&mut a, &a_job, &digest).await.unwrap(),
        fetch(&mut b, &b_job, &digest).await.unwrap(),
    ];
    let mut readers = Vec::new();
    for mut stream in streams {
        readers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(c) = stream.message().await.unwrap() {
                assert_eq!(c.offset, got.len() as u64);
                got.extend_from_slice(&c.data);
            }
            (got, t0.elapsed())
        }));
    }
    let mut ended = Vec::new();
    for r in readers {
        let (got, at) = tokio::time::timeout(Duration::from_secs(30), r)
            .await
            .unwrap()
            .unwrap();
        assert!(got == data, "a download's bytes differ");
        ended.push(at);
    }
    ended.sort();
    assert!(
        ended[0] >= Duration::from_millis(1200),
        "a download ended at {:?}: not sharing the rate, or not capped",
        ended[0]
    );
    assert!(
        ended[1] >= Duration::from_millis(1600),
        "2 MiB at 1 MiB/s ended at {:?}",
        ended[1]
    );
    cp.stop().await;
}
