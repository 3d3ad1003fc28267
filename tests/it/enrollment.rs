//! Enrollment and mTLS: real control plane, real agents and bridges, loopback.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use edgeloop_client_core::tls::{enroll_endpoint, mtls_endpoint};
use edgeloop_client_core::{
    enroll, BootstrapToken, EnrollAttemptError, Identity, IdentityStore, Role, SessionError,
};
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::agent::v1::WatchAssignmentsRequest;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::common::v1::HeartbeatRequest;
use edgeloop_tests::{eventually, ControlPlane};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio_util::sync::CancellationToken;
use tonic::Code;

async fn status_of(cp: &ControlPlane, kind: &str, id: &str) -> Option<serde_json::Value> {
    let (status, body) = cp.api().get(&format!("/api/v1/{kind}")).await;
    assert_eq!(status, 200, "{body}");
    body.as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .cloned()
}

async fn heartbeat(cp: &ControlPlane, identity: &Identity) -> Result<(), tonic::Status> {
    let channel = mtls_endpoint(&cp.grpc_url, identity)
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    AgentServiceClient::new(channel)
        .heartbeat(HeartbeatRequest::default())
        .await
        .map(|_| ())
}

#[tokio::test]
async fn agent_and_bridge_enroll_heartbeat_and_are_listed_online_then_offline() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let device_token = cp.token("device", "cam-01").await;
    let cluster_token = cp.token("cluster", "gpu-a").await;

    let stop_agents = CancellationToken::new();
    let agent_dir = dir.path().join("agent");
    let bridge_dir = dir.path().join("bridge");
    let agent = tokio::spawn(edgeloop_edge_agent::run(
        edgeloop_edge_agent::AgentConfig::new(
            cp.member_config(&agent_dir, Some(device_token)),
            vec![],
        ),
        stop_agents.clone(),
    ));
    let bridge = tokio::spawn(edgeloop_trainer_bridge::run(
        cp.bridge_config(&bridge_dir, Some(cluster_token)),
        stop_agents.clone(),
    ));

    let device = eventually(Duration::from_secs(20), "device online", || async {
        status_of(&cp, "devices", "cam-01")
            .await
            .filter(|d| d["status"] == "online")
    })
    .await;
    assert!(device["last_seen"].is_string(), "{device}");
    assert_eq!(device["capabilities"]["os"], std::env::consts::OS);
    let cluster = eventually(Duration::from_secs(20), "cluster online", || async {
        status_of(&cp, "clusters", "gpu-a")
            .await
            .filter(|d| d["status"] == "online")
    })
    .await;
    assert_eq!(cluster["capabilities"]["engines"][0], "local");

    // Heartbeats keep last_seen moving.
    let first_seen = device["last_seen"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(10), "last_seen advances", || async {
        status_of(&cp, "devices", "cam-01")
            .await
            .filter(|d| d["last_seen"].as_str() != Some(&first_seen))
    })
    .await;

    // The key stayed on the device, private.
    for d in [&agent_dir, &bridge_dir] {
        let key = d.join("identity/key.pem");
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    stop_agents.cancel();
    agent.await.unwrap().unwrap();
    bridge.await.unwrap().unwrap();
    // Three missed heartbeats (1 s interval in tests) and it shows offline.
    eventually(Duration::from_secs(10), "device offline", || async {
        status_of(&cp, "devices", "cam-01")
            .await
            .filter(|d| d["status"] == "offline")
    })
    .await;

    // A restarted agent reuses its identity: no token needed.
    let stop_again = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(
        edgeloop_edge_agent::AgentConfig::new(cp.member_config(&agent_dir, None), vec![]),
        stop_again.clone(),
    ));
    eventually(Duration::from_secs(20), "device online again", || async {
        status_of(&cp, "devices", "cam-01")
            .await
            .filter(|d| d["status"] == "online")
    })
    .await;
    stop_again.cancel();
    agent.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn calls_without_a_client_certificate_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let token: BootstrapToken = cp.token("device", "d1").await.parse().unwrap();
    // Server-authenticated TLS only, as used for Enroll.
    let channel = enroll_endpoint(&cp.grpc_url, token.ca_fingerprint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut agent = AgentServiceClient::new(channel.clone());
    let err = agent
        .heartbeat(HeartbeatRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let err = agent
        .watch_assignments(WatchAssignmentsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let mut bridge = BridgeServiceClient::new(channel);
    let err = bridge
        .heartbeat(HeartbeatRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    cp.stop().await;
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let real = cp
        .enroll(
            Role::Device,
            &cp.token("device", "victim").await,
            &dir.path().join("d"),
        )
        .await;
    heartbeat(&cp, &real).await.unwrap();

    // A rogue CA issues a certificate claiming the same identity.
    let rogue_key = KeyPair::generate().unwrap();
    let mut rogue_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    rogue_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    rogue_params
        .distinguished_name
        .push(DnType::CommonName, "Rogue CA");
    let rogue_ca = rogue_params.self_signed(&rogue_key).unwrap();
    let issuer = Issuer::new(rogue_params, rogue_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "device/victim");
    let cert = params.signed_by(&key, &issuer).unwrap();
    let forged = Identity {
        name: "device/victim".into(),
        key_pem: key.serialize_pem(),
        cert_pem: format!("{}{}", cert.pem(), rogue_ca.pem()),
        ca_pem: real.ca_pem.clone(),
    };
    let err = heartbeat(&cp, &forged).await.unwrap_err();
    // Refused in the TLS handshake, before any RPC code runs.
    assert!(format!("{err:?}").contains("UnknownCA"), "{err:?}");
    cp.stop().await;
}

#[tokio::test]
async fn a_revoked_device_is_refused_on_its_next_call_and_its_agent_stops() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let token = cp.token("device", "lost-01").await;
    let agent_dir = dir.path().join("agent");
    let stop = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(
        edgeloop_edge_agent::AgentConfig::new(cp.member_config(&agent_dir, Some(token)), vec![]),
        stop.clone(),
    ));
    eventually(Duration::from_secs(20), "device online", || async {
        status_of(&cp, "devices", "lost-01")
            .await
            .filter(|d| d["status"] == "online")
    })
    .await;
    let identity = IdentityStore::new(&agent_dir).load().unwrap().unwrap();

    // A watch stream open at revocation time is closed too.
    let channel = mtls_endpoint(&cp.grpc_url, &identity)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = AgentServiceClient::new(channel)
        .watch_assignments(WatchAssignmentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().generation, 0);

    let (status, body) = cp
        .api()
        .post(
            "/api/v1/devices/lost-01/revoke",
            serde_json::json!({"reason": "stolen"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "revoked");
    assert_eq!(body["revoked_reason"], "stolen");

    let err = heartbeat(&cp, &identity).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    let err = watch.message().await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");

    // The agent's loop ends with the refusal instead of retrying forever.
    let result = tokio::time::timeout(Duration::from_secs(20), agent)
        .await
        .unwrap()
        .unwrap();
    let err = result.unwrap_err();
    assert!(format!("{err:#}").contains("revoked"), "{err:#}");
    cp.stop().await;
}

#[tokio::test]
async fn a_token_works_once_expires_and_enrolls_only_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;

    let once = cp.token("device", "once").await;
    cp.enroll(Role::Device, &once, &dir.path().join("a")).await;
    let reuse = enroll(
        Role::Device,
        &cp.grpc_url,
        &once.parse().unwrap(),
        &IdentityStore::new(&dir.path().join("b")),
        Default::default(),
    )
    .await;
    match reuse {
        Err(EnrollAttemptError::Fatal(SessionError::Refused { status, .. })) => {
            assert_eq!(status.code(), Code::Unauthenticated);
            assert!(status.message().contains("already used"), "{status}");
        }
        other => panic!("reused token: {other:?}"),
    }
    assert!(IdentityStore::new(&dir.path().join("b"))
        .load()
        .unwrap()
        .is_none());

    // Let time pass for a token by moving its expiry into the past.
    let stale = cp.token("device", "stale").await;
    let stale_id = stale.parse::<BootstrapToken>().unwrap().id;
    cp.core
        .store
        .fleet
        .tokens
        .update(&stale_id, |t| {
            let mut t = t.unwrap();
            t.expires_at = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
            Ok::<_, ()>(t)
        })
        .unwrap()
        .unwrap();
    let expired = enroll(
        Role::Device,
        &cp.grpc_url,
        &stale.parse().unwrap(),
        &IdentityStore::new(&dir.path().join("c")),
        Default::default(),
    )
    .await;
    match expired {
        Err(EnrollAttemptError::Fatal(SessionError::Refused { status, .. })) => {
            assert_eq!(status.code(), Code::Unauthenticated);
            assert!(status.message().contains("expired"), "{status}");
        }
        other => panic!("expired token: {other:?}"),
    }
    let (_, tokens) = cp.api().get("/api/v1/tokens").await;
    let states: Vec<_> = tokens
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["member_id"].clone(), t["state"].clone()))
        .collect();
    assert!(
        states.contains(&("once".into(), "used".into())),
        "{states:?}"
    );
    assert!(
        states.contains(&("stale".into(), "expired".into())),
        "{states:?}"
    );

    // A device token cannot enroll a bridge, and is not spent by trying.
    let device_only = cp.token("device", "dev-only").await;
    let wrong = enroll(
        Role::Cluster,
        &cp.grpc_url,
        &device_only.parse().unwrap(),
        &IdentityStore::new(&dir.path().join("d")),
        Default::default(),
    )
    .await;
    match wrong {
        Err(EnrollAttemptError::Fatal(SessionError::Refused { status, .. })) => {
            assert_eq!(status.code(), Code::PermissionDenied)
        }
        other => panic!("wrong kind: {other:?}"),
    }
    cp.enroll(Role::Device, &device_only, &dir.path().join("e"))
        .await;

    // A made-up secret with a real id is refused.
    let mut forged: BootstrapToken = cp.token("device", "forged").await.parse().unwrap();
    forged.secret = "0".repeat(64);
    let bad = enroll(
        Role::Device,
        &cp.grpc_url,
        &forged,
        &IdentityStore::new(&dir.path().join("f")),
        Default::default(),
    )
    .await;
    assert!(
        matches!(
            bad,
            Err(EnrollAttemptError::Fatal(SessionError::Refused { .. }))
        ),
        "{bad:?}"
    );
    cp.stop().await;
}

#[tokio::test]
async fn a_token_pinned_to_another_ca_never_reaches_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let mut token: BootstrapToken = cp.token("device", "pinned").await.parse().unwrap();
    token.ca_fingerprint = edgeloop_models::Digest::of(b"some other CA");
    let result = enroll(
        Role::Device,
        &cp.grpc_url,
        &token,
        &IdentityStore::new(&dir.path().join("a")),
        Default::default(),
    )
    .await;
    assert!(result.is_err(), "{result:?}");
    // The real token is still unused: the secret never left the device.
    let (_, tokens) = cp.api().get("/api/v1/tokens").await;
    assert_eq!(tokens[0]["state"], "unused");
    cp.stop().await;
}

#[tokio::test]
async fn the_agent_reconnects_after_the_control_plane_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let cp = ControlPlane::start(&cp_dir).await;
    let token = cp.token("device", "steady").await;
    let stop = CancellationToken::new();
    let agent = tokio::spawn(edgeloop_edge_agent::run(
        edgeloop_edge_agent::AgentConfig::new(
            cp.member_config(&dir.path().join("agent"), Some(token)),
            vec![],
        ),
        stop.clone(),
    ));
    eventually(Duration::from_secs(20), "device online", || async {
        status_of(&cp, "devices", "steady")
            .await
            .filter(|d| d["status"] == "online")
    })
    .await;
    // Same ports, so the agent's URL stays valid.
    let mut s = edgeloop_tests::settings(&cp_dir);
    s.grpc_listen = Some(cp.grpc_addr);
    s.http_listen = Some(cp.http_addr);
    cp.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !agent.is_finished(),
        "the agent keeps retrying while the control plane is away"
    );

    let cp = ControlPlane::start_with(s).await;
    let restarted_at = time::OffsetDateTime::now_utc();
    eventually(
        Duration::from_secs(20),
        "heartbeat after restart",
        || async {
            status_of(&cp, "devices", "steady").await.filter(|d| {
                let seen = time::OffsetDateTime::parse(
                    d["last_seen"].as_str().unwrap(),
                    &time::format_description::well_known::Rfc3339,
                )
                .unwrap();
                seen > restarted_at && d["status"] == "online"
            })
        },
    )
    .await;
    stop.cancel();
    agent.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn concurrent_enrollments_with_one_token_yield_exactly_one_identity() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let token: BootstrapToken = cp.token("device", "racer").await.parse().unwrap();
    let attempts = (0..8).map(|i| {
        let url = cp.grpc_url.clone();
        let token = token.clone();
        let store = IdentityStore::new(&dir.path().join(format!("r{i}")));
        tokio::spawn(async move {
            enroll(Role::Device, &url, &token, &store, Default::default())
                .await
                .is_ok()
        })
    });
    let wins = futures::future::join_all(attempts)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().unwrap())
        .count();
    assert_eq!(wins, 1);
    cp.stop().await;
}

#[tokio::test]
async fn labels_are_replaced_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (status, body) = cp
        .api()
        .post(
            "/api/v1/tokens",
            serde_json::json!({"kind": "device", "name": "lab", "labels": {"site": "berlin"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    cp.enroll(
        Role::Device,
        body["token"].as_str().unwrap(),
        &dir.path().join("d"),
    )
    .await;
    let (_, device) = cp.api().get("/api/v1/devices/lab").await;
    assert_eq!(
        device["labels"],
        serde_json::json!({"site": "berlin"}),
        "labels from the token"
    );
    let (status, device) = cp
        .api()
        .put(
            "/api/v1/devices/lab/labels",
            serde_json::json!({"labels": {"gpu": "cuda", "site": "paris"}}),
        )
        .await;
    assert_eq!(status, 200, "{device}");
    let (_, device) = cp.api().get("/api/v1/devices/lab").await;
    assert_eq!(
        device["labels"],
        serde_json::json!({"gpu": "cuda", "site": "paris"})
    );
    cp.stop().await;
}

/// A bridge revoked while it streams a dataset from the artifact store
/// (a FetchCheckpoint of its leased job's `edgeloop-artifact://` dataset)
/// gets PERMISSION_DENIED on that open stream, within one heartbeat
/// interval, instead of reading on to the end; its WatchJobs stream ends
/// the same way.
#[tokio::test]
async fn a_revoked_bridges_open_streams_end_with_the_refusal() {
    use edgeloop_proto::bridge::v1::{FetchCheckpointRequest, LeaseJobRequest, WatchJobsRequest};
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    // 64 MiB: far more than HTTP/2 flow control lets the server send
    // before the client reads, so the stream is still open at revocation.
    let data: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    let digest = cp.upload(&data).await;
    let token = cp.token("cluster", "farm-1").await;
    let identity = cp
        .enroll(Role::Cluster, &token, &dir.path().join("bridge"))
        .await;
    let (status, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            serde_json::json!({"spec": {"name": "train", "command": ["true"],
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
    client
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec![],
            running_jobs: vec![],
        })
        .await
        .unwrap();
    let mut watch = client
        .watch_jobs(WatchJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut fetch = client
        .fetch_checkpoint(FetchCheckpointRequest {
            job_id: job["id"].as_str().unwrap().into(),
            digest: digest.to_string(),
            offset: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let first = fetch.message().await.unwrap().unwrap();
    assert_eq!(first.offset, 0);

    let (status, body) = cp
        .api()
        .post("/api/v1/clusters/farm-1/revoke", serde_json::json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    // Reads on: what was in flight arrives, then the refusal, not the end.
    let mut got = first.data.len() as u64;
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match fetch.message().await {
                Ok(Some(c)) => got += c.data.len() as u64,
                Ok(None) => panic!("the stream ran to its end after revocation ({got} bytes)"),
                Err(status) => break status,
            }
        }
    })
    .await
    .expect("the stream ends within the heartbeat interval");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    assert!(got < data.len() as u64, "{got}");
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("WatchJobs ended without the refusal"),
                Err(status) => break status,
            }
        }
    })
    .await
    .expect("WatchJobs ends within the heartbeat interval");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    cp.stop().await;
}

/// Enrollment when its reply is lost (here: the first call's answer is
/// dropped, as a kill between the control plane's commit and the reply
/// would): the agent kept its key on disk before calling, so its retry
/// presents the same key and gets the same certificate, where it used to
/// meet "already used" and stay bricked. Another key still cannot use the
/// spent token, and a member revoked since cannot retry.
#[tokio::test]
async fn a_lost_enrollment_reply_is_answered_again_for_the_same_key() {
    use edgeloop_proto::common::v1::EnrollRequest;
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let token = cp.token("device", "cam-7").await;
    let parsed: BootstrapToken = token.parse().unwrap();

    // The first attempt: the key kept as enroll() keeps it, the call made,
    // the answer lost.
    let store = IdentityStore::new(&dir.path().join("agent"));
    let key = rcgen::KeyPair::generate().unwrap();
    store.save_enroll_key(&key.serialize_pem()).unwrap();
    let csr = CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let channel = enroll_endpoint(&cp.grpc_url, parsed.ca_fingerprint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let lost = AgentServiceClient::new(channel)
        .enroll(EnrollRequest {
            bootstrap_token: token.clone(),
            csr_pem: csr,
            capabilities: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        store.load().unwrap().is_none(),
        "nothing saved: the reply was lost"
    );

    // The retry: the same key, the same certificate, and a working identity.
    let identity = enroll(
        Role::Device,
        &cp.grpc_url,
        &parsed,
        &store,
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(identity.cert_pem, lost.certificate_pem);
    assert_eq!(identity.key_pem, key.serialize_pem());
    assert!(
        !store.enroll_key_path().exists(),
        "the kept key moved into the identity"
    );
    heartbeat(&cp, &identity).await.unwrap();
    let (_, devices) = cp.api().get("/api/v1/devices").await;
    assert_eq!(devices.as_array().unwrap().len(), 1, "{devices}");

    // Another key: the token is spent.
    let other = enroll(
        Role::Device,
        &cp.grpc_url,
        &parsed,
        &IdentityStore::new(&dir.path().join("imposter")),
        Default::default(),
    )
    .await;
    match other {
        Err(EnrollAttemptError::Fatal(SessionError::Refused { status, .. })) => {
            assert!(status.message().contains("already used"), "{status}");
        }
        other => panic!("another key with a spent token: {other:?}"),
    }

    // Revoked since: the same key's retry is refused too.
    let (status, body) = cp
        .api()
        .post("/api/v1/devices/cam-7/revoke", serde_json::json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let again = IdentityStore::new(&dir.path().join("again"));
    again.save_enroll_key(&key.serialize_pem()).unwrap();
    match enroll(
        Role::Device,
        &cp.grpc_url,
        &parsed,
        &again,
        Default::default(),
    )
    .await
    {
        Err(EnrollAttemptError::Fatal(SessionError::Refused { status, .. })) => {
            assert_eq!(status.code(), Code::PermissionDenied, "{status}");
        }
        other => panic!("a revoked member's retry: {other:?}"),
    }
    cp.stop().await;
}
