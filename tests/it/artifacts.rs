//! Artifacts over REST and gRPC, assignments, and checkpoint upload.

use edgeloop_client_core::tls::mtls_endpoint;
use edgeloop_client_core::Role;
use edgeloop_control_plane::fleet::assignments::{self, AssignmentRecord};
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::agent::v1::{FetchArtifactRequest, WatchAssignmentsRequest};
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::bridge::v1::{checkpoint_upload::Part, CheckpointHeader, CheckpointUpload};
use edgeloop_proto::common::v1::Chunk;
use edgeloop_tests::{files_under, settings, ControlPlane};
use reqwest::Method;
use tonic::Code;

fn blob(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The status code of a fetch that must be refused.
async fn fetch_refusal(
    client: &mut AgentServiceClient<tonic::transport::Channel>,
    digest: impl ToString,
    offset: u64,
) -> Code {
    let req = FetchArtifactRequest {
        digest: digest.to_string(),
        offset,
        max_chunk_bytes: 0,
    };
    client.fetch_artifact(req).await.unwrap_err().code()
}

/// Stored (or half-written) artifacts; held parts of resumable uploads in
/// `partial/` are not artifacts.
fn stored_blobs(cp: &ControlPlane) -> Vec<std::path::PathBuf> {
    let root = cp.data_dir.join("artifacts");
    files_under(&root)
        .into_iter()
        .filter(|p| !p.starts_with(root.join("partial")))
        .collect()
}

#[tokio::test]
async fn upload_verifies_the_digest_and_a_mismatch_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(&dir.path().join("cp"));
    s.max_artifact_bytes = Some(256 * 1024);
    let cp = ControlPlane::start_with(s).await;
    let api = cp.api();
    let data = blob(100_000, 7);
    let digest = Digest::of(&data);

    // Wrong digest: 400 naming the digest, and no file anywhere.
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
    assert!(stored_blobs(&cp).is_empty(), "{:?}", stored_blobs(&cp));
    let head = api
        .request(Method::HEAD, &format!("/api/v1/artifacts/{wrong}"))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 404);

    // Not a digest at all.
    let (status, body) = api
        .raw(
            Method::PUT,
            "/api/v1/artifacts/..%2F..%2Fetc%2Fpasswd",
            data.clone(),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // Over the size limit: 413, nothing stored.
    let big = blob(300_000, 1);
    let (status, body) = api
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{}", Digest::of(&big)),
            big,
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(stored_blobs(&cp).is_empty());

    // Over the limit without a Content-Length (chunked): still 413.
    let big = blob(300_000, 2);
    let big_digest = Digest::of(&big);
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = big
        .chunks(10_000)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let stream_body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let (status, _) = api
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{big_digest}"),
            stream_body,
        )
        .await;
    assert_eq!(status, 413);
    assert!(stored_blobs(&cp).is_empty());

    // The right digest: stored once, idempotent, readable whole and by range.
    let (status, body) = api
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{digest}"),
            data.clone(),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["size"], 100_000);
    let (status, _) = api
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{digest}"),
            data.clone(),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(stored_blobs(&cp).len(), 1);

    let path = format!("/api/v1/artifacts/{digest}");
    let got = api.request(Method::GET, &path).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().as_ref(), &data[..]);
    let part = api
        .request(Method::GET, &path)
        .header("range", "bytes=99000-")
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 99000-99999/100000");
    assert_eq!(part.bytes().await.unwrap().as_ref(), &data[99_000..]);
    let head = api.request(Method::HEAD, &path).send().await.unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["content-length"], "100000");
    cp.stop().await;
}

#[tokio::test]
async fn devices_watch_assignments_and_fetch_only_assigned_artifacts_from_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let identity = cp
        .enroll(
            Role::Device,
            &cp.token("device", "edge-1").await,
            &dir.path().join("d"),
        )
        .await;
    let model = blob(1_000_000, 3);
    let digest = Digest::of(&model);
    let (status, _) = cp
        .api()
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{digest}"),
            model.clone(),
        )
        .await;
    assert_eq!(status, 201);
    let other = blob(10, 9);
    let other_digest = Digest::of(&other);
    cp.api()
        .raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{other_digest}"),
            other,
        )
        .await;

    let channel = mtls_endpoint(&cp.grpc_url, &identity)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = AgentServiceClient::new(channel);
    let mut watch = client
        .watch_assignments(WatchAssignmentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!((first.generation, first.assignments.len()), (0, 0));

    // Not assigned yet: refused.
    assert_eq!(
        fetch_refusal(&mut client, digest.to_string(), 0).await,
        Code::PermissionDenied
    );

    let assignment = AssignmentRecord {
        model_name: "digits".into(),
        model_version: "1".into(),
        artifact_digest: digest,
        artifact_size: model.len() as u64,
        manifest_digest: None,
        deployment_id: "dep-1".into(),
        activation_timeout_seconds: 60,
        probe_inputs_digest: None,
        deployment_seq: 0,
        variant: None,
    };
    assignments::replace(&cp.core.store, &cp.core.events, "edge-1", vec![assignment])
        .await
        .unwrap();
    let next = watch.message().await.unwrap().unwrap();
    assert_eq!(next.generation, 1);
    assert_eq!(next.assignments[0].artifact_digest, digest.to_string());

    // Resume from an offset, in bounded chunks.
    let offset = 400_000u64;
    let mut stream = client
        .fetch_artifact(FetchArtifactRequest {
            digest: digest.to_string(),
            offset,
            max_chunk_bytes: 65_536,
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(chunk.offset, offset + got.len() as u64);
        assert!(chunk.data.len() <= 65_536);
        assert_eq!(chunk.total_size, model.len() as u64);
        got.extend_from_slice(&chunk.data);
    }
    assert_eq!(&got[..], &model[offset as usize..]);

    // Still refused: assigned to nobody.
    assert_eq!(
        fetch_refusal(&mut client, other_digest.to_string(), 0).await,
        Code::PermissionDenied
    );
    assert_eq!(
        fetch_refusal(&mut client, "not-a-digest", 0).await,
        Code::InvalidArgument
    );
    assert_eq!(
        fetch_refusal(&mut client, digest.to_string(), 2_000_000).await,
        Code::OutOfRange
    );
    cp.stop().await;
}

fn upload(
    header: CheckpointHeader,
    data: &[u8],
    chunk: usize,
) -> impl futures::Stream<Item = CheckpointUpload> {
    let mut msgs = vec![CheckpointUpload {
        part: Some(Part::Header(header)),
    }];
    for (i, c) in data.chunks(chunk).enumerate() {
        msgs.push(CheckpointUpload {
            part: Some(Part::Chunk(Chunk {
                offset: (i * chunk) as u64,
                data: c.to_vec(),
            })),
        });
    }
    futures::stream::iter(msgs)
}

#[tokio::test]
async fn bridges_upload_checkpoints_verified_by_digest_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let channel = cp
        .connect(
            Role::Cluster,
            &cp.token("cluster", "gpu-1").await,
            &dir.path().join("b"),
        )
        .await;
    let mut client = BridgeServiceClient::new(channel);
    // Checkpoints belong to a job this bridge has leased.
    let (status, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            serde_json::json!({"spec": {"name": "train", "command": ["true"], "checkpoint": {"every_steps": 10}}}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let job_id = job["id"].as_str().unwrap().to_string();
    let stranger = CheckpointHeader {
        job_id: job_id.clone(),
        attempt: 1,
        step: 1,
        digest: Digest::of(b"x").to_string(),
        size: 1,
        has_optimizer_state: false,
        metadata: Default::default(),
        offset: 0,
    };
    let err = client
        .upload_checkpoint(upload(stranger, b"x", 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "not leased yet: {err}");
    client
        .lease_job(edgeloop_proto::bridge::v1::LeaseJobRequest {
            wait_seconds: 1,
            engines: vec![],
            running_jobs: vec![],
        })
        .await
        .unwrap();
    let weights = blob(500_000, 5);
    let digest = Digest::of(&weights);
    let header = |digest: String, size: u64| CheckpointHeader {
        job_id: job_id.clone(),
        attempt: 1,
        step: 1000,
        digest,
        size,
        has_optimizer_state: true,
        metadata: Default::default(),
        offset: 0,
    };

    let bad = client
        .upload_checkpoint(upload(
            header(Digest::of(b"x").to_string(), weights.len() as u64),
            &weights,
            100_000,
        ))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad}");
    let short = client
        .upload_checkpoint(upload(
            header(digest.to_string(), weights.len() as u64 + 1),
            &weights,
            100_000,
        ))
        .await
        .unwrap_err();
    // Fewer bytes than declared: held for a resume, not stored.
    assert_eq!(short.code(), Code::Unavailable, "{short}");
    assert!(stored_blobs(&cp).is_empty());
    assert!(
        edgeloop_registry::checkpoints::latest(&cp.core.store.registry, &job_id)
            .unwrap()
            .is_none()
    );

    let receipt = client
        .upload_checkpoint(upload(
            header(digest.to_string(), weights.len() as u64),
            &weights,
            100_000,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.digest, digest.to_string());
    let latest = edgeloop_registry::checkpoints::latest(&cp.core.store.registry, &job_id)
        .unwrap()
        .unwrap();
    assert_eq!(
        (latest.step, latest.digest, latest.has_optimizer_state),
        (1000, digest, true)
    );
    assert_eq!(latest.cluster, "gpu-1");
    let got = cp
        .api()
        .request(Method::GET, &format!("/api/v1/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.bytes().await.unwrap().as_ref(), &weights[..]);

    // The bridge holding the lease can download it again, from an offset.
    let fetch = |digest: String, offset: u64| edgeloop_proto::bridge::v1::FetchCheckpointRequest {
        job_id: job_id.clone(),
        digest,
        offset,
    };
    let mut stream = client
        .fetch_checkpoint(fetch(digest.to_string(), 123_456))
        .await
        .unwrap()
        .into_inner();
    let mut fetched = Vec::new();
    while let Some(c) = stream.message().await.unwrap() {
        assert_eq!(c.offset, 123_456 + fetched.len() as u64);
        fetched.extend_from_slice(&c.data);
    }
    assert_eq!(&fetched[..], &weights[123_456..]);
    // Not a checkpoint of this job: not found, even though the blob exists elsewhere.
    let err = client
        .fetch_checkpoint(fetch(Digest::of(b"x").to_string(), 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let err = client
        .fetch_checkpoint(fetch("nope".into(), 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    // Another cluster, not holding the lease, may not read the weights.
    let other = cp
        .enroll(
            Role::Cluster,
            &cp.token("cluster", "gpu-2").await,
            &dir.path().join("b2"),
        )
        .await;
    let err = BridgeServiceClient::new(
        mtls_endpoint(&cp.grpc_url, &other)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
    .fetch_checkpoint(fetch(digest.to_string(), 0))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");

    // A device certificate cannot use the bridge service.
    let device = cp
        .enroll(
            Role::Device,
            &cp.token("device", "not-a-bridge").await,
            &dir.path().join("d"),
        )
        .await;
    let channel = mtls_endpoint(&cp.grpc_url, &device)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let err = BridgeServiceClient::new(channel)
        .heartbeat(edgeloop_proto::common::v1::HeartbeatRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    cp.stop().await;
}

#[tokio::test]
async fn an_interrupted_checkpoint_upload_resumes_where_it_stopped() {
    use edgeloop_proto::bridge::v1::{CheckpointUploadOffsetRequest, LeaseJobRequest};
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let mut client = BridgeServiceClient::new(
        cp.connect(
            Role::Cluster,
            &cp.token("cluster", "gpu-r").await,
            &dir.path().join("b"),
        )
        .await,
    );
    let (_, job) = cp
        .api()
        .post("/api/v1/jobs", serde_json::json!({"spec": {"name": "resumable", "command": ["true"], "checkpoint": {"every_steps": 1}}}))
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

    let data = blob(300_000, 11);
    let digest = Digest::of(&data);
    let header = |offset: u64| CheckpointHeader {
        job_id: job_id.clone(),
        attempt: 1,
        step: 7,
        digest: digest.to_string(),
        size: data.len() as u64,
        has_optimizer_state: true,
        metadata: Default::default(),
        offset,
    };
    let msgs = |offset: u64, until: usize| {
        let mut m = vec![CheckpointUpload {
            part: Some(Part::Header(header(offset))),
        }];
        for (i, c) in data[offset as usize..until].chunks(50_000).enumerate() {
            m.push(CheckpointUpload {
                part: Some(Part::Chunk(Chunk {
                    offset: offset + (i * 50_000) as u64,
                    data: c.to_vec(),
                })),
            });
        }
        futures::stream::iter(m)
    };
    let ask = |client: &mut BridgeServiceClient<tonic::transport::Channel>| {
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

    // The connection "breaks" after 150 000 bytes.
    let err = client
        .upload_checkpoint(msgs(0, 150_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("resume from offset 150000"), "{err}");
    let held = ask(&mut client).await;
    assert_eq!((held.offset, held.complete), (150_000, false));
    assert!(
        edgeloop_registry::checkpoints::latest(&cp.core.store.registry, &job_id)
            .unwrap()
            .is_none()
    );

    // A wrong offset is refused and changes nothing.
    let err = client
        .upload_checkpoint(msgs(100_000, 200_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert_eq!(ask(&mut client).await.offset, 150_000);

    // The rest, from where it stopped.
    let receipt = client
        .upload_checkpoint(msgs(150_000, data.len()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.digest, digest.to_string());
    let held = ask(&mut client).await;
    assert!(held.complete);
    let got = cp
        .api()
        .request(Method::GET, &format!("/api/v1/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.bytes().await.unwrap().as_ref(), &data[..]);
    let latest = edgeloop_registry::checkpoints::latest(&cp.core.store.registry, &job_id)
        .unwrap()
        .unwrap();
    assert_eq!((latest.step, latest.digest), (7, digest));
    cp.stop().await;
}

/// A bridge holding a lease names an artifact it never had (another
/// team's model) as its job's checkpoint, to fetch it back: refused. The
/// offset RPC tells it nothing about that artifact, and partial uploads of
/// one digest by two jobs are kept apart.
#[tokio::test]
async fn a_bridge_cannot_borrow_a_stored_artifact_as_its_checkpoint() {
    use edgeloop_proto::bridge::v1::{
        CheckpointUploadOffsetRequest, FetchCheckpointRequest, LeaseJobRequest,
    };
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let secret = blob(200_000, 42);
    let digest = cp.upload(&secret).await;

    let mut bridges = Vec::new();
    let mut jobs = Vec::new();
    for name in ["gpu-x", "gpu-y"] {
        let (_, job) = cp
            .api()
            .post(
                "/api/v1/jobs",
                serde_json::json!({"spec": {"name": "borrow", "command": ["true"],
                    "checkpoint": {"every_steps": 1}}, "cluster": name}),
            )
            .await;
        let mut client = BridgeServiceClient::new(
            cp.connect(
                Role::Cluster,
                &cp.token("cluster", name).await,
                &dir.path().join(name),
            )
            .await,
        );
        client
            .lease_job(LeaseJobRequest {
                wait_seconds: 1,
                engines: vec![],
                running_jobs: vec![],
            })
            .await
            .unwrap();
        jobs.push(job["id"].as_str().unwrap().to_string());
        bridges.push(client);
    }
    let header = |job: &str, offset: u64| CheckpointHeader {
        job_id: job.to_string(),
        attempt: 1,
        step: 1,
        digest: digest.to_string(),
        size: secret.len() as u64,
        has_optimizer_state: false,
        metadata: Default::default(),
        offset,
    };
    let offset_of = |client: &mut BridgeServiceClient<tonic::transport::Channel>, job: &str| {
        let req = CheckpointUploadOffsetRequest {
            job_id: job.to_string(),
            digest: digest.to_string(),
        };
        let mut client = client.clone();
        async move {
            let r = client
                .get_checkpoint_upload_offset(req)
                .await
                .unwrap()
                .into_inner();
            (r.offset, r.complete)
        }
    };
    let (a, job_a) = (&mut bridges[0].clone(), jobs[0].clone());
    // The offset RPC does not say the artifact exists, or its size.
    assert_eq!(offset_of(a, &job_a).await, (0, false));
    // "Already complete" with no body: refused, nothing recorded.
    let no_body = futures::stream::iter(vec![CheckpointUpload {
        part: Some(Part::Header(header(&job_a, secret.len() as u64))),
    }]);
    let err = a.upload_checkpoint(no_body).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    // Other bytes under the artifact's digest: refused.
    let err = a
        .upload_checkpoint(upload(header(&job_a, 0), &blob(200_000, 7), 50_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(
        edgeloop_registry::checkpoints::latest(&cp.core.store.registry, &job_a)
            .unwrap()
            .is_none()
    );
    let fetch = FetchCheckpointRequest {
        job_id: job_a.clone(),
        digest: digest.to_string(),
        offset: 0,
    };
    let err = a.fetch_checkpoint(fetch.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");

    // Partial uploads are per job: job A's half is not job B's.
    let half = {
        let mut m = vec![CheckpointUpload {
            part: Some(Part::Header(header(&job_a, 0))),
        }];
        m.push(CheckpointUpload {
            part: Some(Part::Chunk(Chunk {
                offset: 0,
                data: secret[..100_000].to_vec(),
            })),
        });
        futures::stream::iter(m)
    };
    assert_eq!(
        a.upload_checkpoint(half).await.unwrap_err().code(),
        Code::Unavailable
    );
    assert_eq!(offset_of(a, &job_a).await, (100_000, false));
    let (b, job_b) = (&mut bridges[1].clone(), jobs[1].clone());
    assert_eq!(offset_of(b, &job_b).await, (0, false));

    // Whoever sends the whole body has the bytes: that is its checkpoint.
    b.upload_checkpoint(upload(header(&job_b, 0), &secret, 50_000))
        .await
        .unwrap();
    assert_eq!(offset_of(b, &job_b).await, (secret.len() as u64, true));
    assert_eq!(offset_of(a, &job_a).await, (100_000, false));
    cp.stop().await;
}
