//! A member given several control-plane endpoints (issue #17): it enrolls
//! through one that answers and moves its calls on from one that stops
//! answering, on a real control plane over loopback mTLS. (Two replicas
//! sharing one store need PostgreSQL; here the second endpoint is a port
//! nothing listens on, which fails the same way a killed replica does.)

use std::time::Duration;

use edgeloop_client_core::backoff::Backoff;
use edgeloop_client_core::channel::Membership;
use edgeloop_client_core::session::ensure_identity;
use edgeloop_client_core::{IdentityStore, Role};
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::common::v1::HeartbeatRequest;
use edgeloop_tests::{free_port, ControlPlane};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_enrolls_through_the_endpoint_that_answers_and_fails_over_between_calls() {
    edgeloop_client_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let dead = format!("https://127.0.0.1:{}", free_port());
    let list = format!("{dead},{}", cp.grpc_url);
    let token = cp.token("device", "edge-failover").await;
    let member_dir = dir.path().join("member");
    let store = IdentityStore::new(&member_dir);
    std::fs::create_dir_all(&member_dir).unwrap();
    // The first endpoint refuses; the retry goes to the second.
    let identity = tokio::time::timeout(
        Duration::from_secs(30),
        ensure_identity(
            Role::Device,
            &list,
            Some(&token),
            &store,
            Default::default(),
            Backoff {
                base: Duration::from_millis(50),
                max: Duration::from_millis(200),
            },
            &CancellationToken::new(),
        ),
    )
    .await
    .expect("enrolled within 30 s")
    .unwrap();
    assert_eq!(identity.name, "device/edge-failover");

    // Calls start at the first endpoint: one fails, every later one goes
    // to the second.
    let membership = Membership::new(&list, &member_dir);
    membership.set_identity(identity.clone()).unwrap();
    let mut client = AgentServiceClient::new(membership.channel_now().unwrap());
    let beat = || HeartbeatRequest::default();
    let first = client.heartbeat(beat()).await;
    assert!(first.is_err(), "the dead endpoint first: {first:?}");
    for i in 0..3 {
        client
            .heartbeat(beat())
            .await
            .unwrap_or_else(|e| panic!("call {i} after the failover: {e}"));
    }
    // A renewal keeps the endpoint calls go to.
    membership.set_identity(identity).unwrap();
    client.heartbeat(beat()).await.expect("after a renewal");

    // With both endpoints gone, each call fails within its timeouts, none
    // hangs on the rotation.
    cp.stop().await;
    for _ in 0..3 {
        let r = tokio::time::timeout(Duration::from_secs(15), client.heartbeat(beat()))
            .await
            .expect("a call to a stopped endpoint fails, it does not hang");
        assert!(r.is_err());
    }
}
