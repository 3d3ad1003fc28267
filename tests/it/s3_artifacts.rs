//! A control plane started with `--artifact-url` on an S3 server (s3s-fs
//! from `scripts/s3-up.sh`, its env file exported as `scripts/test.sh`
//! does): REST uploads and downloads, and a bridge's resumable checkpoint
//! upload, go through S3 end to end, and a second control plane with
//! another data dir serves what the first stored.

use edgeloop_client_core::Role;
use edgeloop_control_plane::fleet::assignments::{self, AssignmentRecord};
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::agent::v1::FetchArtifactRequest;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::bridge::v1::{
    checkpoint_upload::Part, CheckpointHeader, CheckpointUpload, CheckpointUploadOffsetRequest,
    LeaseJobRequest,
};
use edgeloop_proto::common::v1::Chunk;
use edgeloop_registry::artifacts::ArtifactStore;
use edgeloop_registry::s3::{S3ArtifactStore, PART_BYTES};
use edgeloop_tests::{files_under, settings, ControlPlane};
use reqwest::Method;
use tonic::Code;

fn s3_url() -> Option<String> {
    edgeloop_tests::s3_test_url()
}

fn blob(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// What the bucket holds under `url`, as the store lists it.
async fn listed(url: &str) -> Vec<(Digest, u64)> {
    let store = S3ArtifactStore::open(url.parse().unwrap()).await.unwrap();
    let mut all: Vec<(Digest, u64)> = tokio::task::spawn_blocking(move || store.list())
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|a| (a.digest, a.size))
        .collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_on_s3_stores_verifies_and_serves_artifacts_there() {
    edgeloop_client_core::install_crypto_provider();
    let Some(url) = s3_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(&dir.path().join("cp"));
    s.artifact_url = Some(url.clone());
    let cp = ControlPlane::start_with(s.clone()).await;
    let api = cp.api();

    // Past one multipart part, so the upload streams in parts.
    let data = blob(PART_BYTES + 3_000_001, 7);
    let digest = Digest::of(&data);
    let path = format!("/api/v1/artifacts/{digest}");

    // A wrong digest: 400, and nothing in the bucket.
    let wrong = Digest::of(b"something else");
    let (status, body) = api
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{wrong}"),
            data.clone(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "digest");
    assert_eq!(listed(&url).await, vec![]);

    let (status, body) = api.raw(Method::PUT, &path, data.clone()).await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = api.raw(Method::PUT, &path, data.clone()).await;
    assert_eq!(status, 200, "stored already");
    assert_eq!(listed(&url).await, vec![(digest, data.len() as u64)]);
    // Nothing of it in the data dir.
    let local = files_under(&dir.path().join("cp").join("artifacts").join("sha256"));
    assert!(local.is_empty(), "{local:?}");

    let got = api.request(Method::GET, &path).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert!(got.bytes().await.unwrap().as_ref() == &data[..]);
    let from = data.len() - 1_000_000;
    let part = api
        .request(Method::GET, &path)
        .header("range", format!("bytes={from}-"))
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert!(part.bytes().await.unwrap().as_ref() == &data[from..]);
    let head = api.request(Method::HEAD, &path).send().await.unwrap();
    assert_eq!(head.headers()["content-length"], data.len().to_string());

    // A device downloads it through the in-memory cache, loaded from S3
    // once.
    device_fetches(&cp, &dir.path().join("d"), &data).await;

    // A bridge's checkpoint upload breaks past the first part and resumes
    // from the offset the control plane holds.
    let checkpoint = blob(PART_BYTES + 1_500_000, 9);
    let held = resumable_checkpoint_upload(&cp, &dir.path().join("b"), &checkpoint).await;
    assert_eq!(held, PART_BYTES as u64, "S3 holds whole parts");
    let ck = Digest::of(&checkpoint);
    assert!(listed(&url).await.contains(&(ck, checkpoint.len() as u64)));
    cp.stop().await;

    // Another control plane (another data dir: a replica) on the same
    // bucket serves both.
    let mut other = settings(&dir.path().join("cp2"));
    other.artifact_url = Some(url.clone());
    let cp2 = ControlPlane::start_with(other).await;
    let api = cp2.api();
    let got = api.request(Method::GET, &path).send().await.unwrap();
    assert!(got.bytes().await.unwrap().as_ref() == &data[..]);
    let got = api
        .request(Method::GET, &format!("/api/v1/artifacts/{ck}"))
        .send()
        .await
        .unwrap();
    assert!(got.bytes().await.unwrap().as_ref() == &checkpoint[..]);
    cp2.stop().await;
}

/// Uploads `data` as a leased job's checkpoint: cut after one part and a
/// half, then resumed. Returns the offset held after the cut.
async fn resumable_checkpoint_upload(cp: &ControlPlane, dir: &std::path::Path, data: &[u8]) -> u64 {
    let mut client = BridgeServiceClient::new(
        cp.connect(Role::Cluster, &cp.token("cluster", "gpu-s3").await, dir)
            .await,
    );
    let (_, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            serde_json::json!({"spec": {"name": "s3", "command": ["true"], "checkpoint": {"every_steps": 1}}}),
        )
        .await;
    let job_id = job["id"].as_str().unwrap().to_string();
    client
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec![],
            running_jobs: vec![],
        })
        .await
        .unwrap();
    let digest = Digest::of(data);
    let chunk = 1 << 20;
    let msgs = |offset: u64, until: usize| {
        let mut m = vec![CheckpointUpload {
            part: Some(Part::Header(CheckpointHeader {
                job_id: job_id.clone(),
                attempt: 1,
                step: 3,
                digest: digest.to_string(),
                size: data.len() as u64,
                has_optimizer_state: false,
                metadata: Default::default(),
                offset,
            })),
        }];
        for (i, c) in data[offset as usize..until].chunks(chunk).enumerate() {
            m.push(CheckpointUpload {
                part: Some(Part::Chunk(Chunk {
                    offset: offset + (i * chunk) as u64,
                    data: c.to_vec(),
                })),
            });
        }
        futures::stream::iter(m)
    };
    let offset = |client: &mut BridgeServiceClient<tonic::transport::Channel>| {
        let req = CheckpointUploadOffsetRequest {
            job_id: job_id.clone(),
            digest: digest.to_string(),
        };
        let mut client = client.clone();
        async move {
            client
                .get_checkpoint_upload_offset(req)
                .await
                .unwrap()
                .into_inner()
        }
    };
    let cut = PART_BYTES + 700_000;
    let err = client.upload_checkpoint(msgs(0, cut)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let held = offset(&mut client).await;
    assert!(!held.complete);
    assert!(
        err.message()
            .contains(&format!("resume from offset {}", held.offset)),
        "{err}"
    );
    // Not at the end of what was sent: refused, nothing lost.
    let err = client
        .upload_checkpoint(msgs(cut as u64, data.len()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let receipt = client
        .upload_checkpoint(msgs(held.offset, data.len()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.digest, digest.to_string());
    assert!(offset(&mut client).await.complete);
    held.offset
}

/// The process's peak resident memory (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// `total` bytes made as they are sent, in 1 MiB chunks: nothing holds
/// the whole body.
fn generated(total: u64) -> edgeloop_registry::artifacts::ByteStream {
    let chunk = 1u64 << 20;
    Box::pin(futures::stream::iter((0..total.div_ceil(chunk)).map(
        move |i| {
            let len = chunk.min(total - i * chunk) as usize;
            Ok(bytes::Bytes::from(vec![(i % 251) as u8; len]))
        },
    )))
}

/// An artifact many times the part size goes up and comes back down
/// streamed: the process's peak memory grows by a few parts, not by the
/// artifact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_artifact_streams_through_s3_in_bounded_memory() {
    use edgeloop_registry::artifacts::UploadLimits;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    // Alone: it measures the process's peak memory.
    if !edgeloop_tests::in_own_process() {
        return;
    }
    edgeloop_client_core::install_crypto_provider();
    let Some(url) = s3_url() else { return };
    let total: u64 = 256 << 20;
    let mut hasher = edgeloop_models::Sha256Writer::new();
    let mut body = generated(total);
    while let Some(c) = body.next().await {
        hasher.update(&c.unwrap());
    }
    let digest = hasher.finish();
    let store = S3ArtifactStore::open(url.parse().unwrap()).await.unwrap();
    // Peak memory from here on (Linux: 5 resets VmHWM to the current RSS).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = peak_rss();
    let started = std::time::Instant::now();
    let limits = UploadLimits {
        max_bytes: total,
        declared_size: Some(total),
    };
    let out = store.put(digest, generated(total), limits).await.unwrap();
    assert!(out.created);
    let up = started.elapsed();
    let started = std::time::Instant::now();
    let (size, mut reader) = store.open_at(digest, 0).await.unwrap();
    assert_eq!(size, total);
    let mut back = edgeloop_models::Sha256Writer::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        back.update(&buf[..n]);
    }
    assert_eq!(back.finish(), digest);
    let down = started.elapsed();
    let grew = peak_rss().saturating_sub(before);
    eprintln!(
        "256 MiB through s3s-fs: up {up:?}, down {down:?}, peak memory +{} MiB",
        grew >> 20
    );
    assert!(
        grew < 96 << 20,
        "peak memory grew by {} MiB for a 256 MiB artifact",
        grew >> 20
    );
    // Not left on the test server's disk.
    let far = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let freed = tokio::task::spawn_blocking(move || store.delete_if_older(digest, far))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(freed, Some(total));
}

/// `data` (stored already) assigned to a device, which fetches it twice
/// from an offset: the cache reads it from S3 once, then serves it.
async fn device_fetches(cp: &ControlPlane, dir: &std::path::Path, data: &[u8]) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut client = AgentServiceClient::new(
        cp.connect(Role::Device, &cp.token("device", "edge-s3").await, dir)
            .await,
    );
    let digest = Digest::of(data);
    let assignment = AssignmentRecord {
        model_name: "digits".into(),
        model_version: "1".into(),
        artifact_digest: digest,
        artifact_size: data.len() as u64,
        manifest_digest: None,
        deployment_id: "dep-s3".into(),
        activation_timeout_seconds: 60,
        probe_inputs_digest: None,
        deployment_seq: 0,
        variant: None,
    };
    assignments::replace(&cp.core.store, &cp.core.events, "edge-s3", vec![assignment])
        .await
        .unwrap();
    let counters = &cp.core.artifact_cache.counters;
    let read_before = counters.store_read_bytes.load(Relaxed);
    for _ in 0..2 {
        let offset = 1_234_567u64;
        let mut stream = client
            .fetch_artifact(FetchArtifactRequest {
                digest: digest.to_string(),
                offset,
                max_chunk_bytes: 1 << 20,
            })
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            assert_eq!(chunk.offset, offset + got.len() as u64);
            got.extend_from_slice(&chunk.data);
        }
        assert!(got == data[offset as usize..], "the device got other bytes");
    }
    assert_eq!(
        counters.store_read_bytes.load(Relaxed) - read_before,
        data.len() as u64,
        "read from S3 once"
    );
}
