//! Certificate renewal with the real agent, bridge and control plane on
//! loopback, the control plane on an injected clock: two renewals each,
//! years apart by that clock, while both keep working; the replaced
//! certificate stops after its drain; a revoked device cannot renew.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use edgeloop_client_core::tls::mtls_endpoint;
use edgeloop_client_core::{Identity, IdentityStore};
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::common::v1::{HeartbeatRequest, RenewRequest};
use edgeloop_tests::{eventually, settings, ControlPlane};
use serde_json::json;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tonic::Code;

async fn member(cp: &ControlPlane, kind: &str, id: &str) -> serde_json::Value {
    let (status, body) = cp.api().get(&format!("/api/v1/{kind}/{id}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn time_of(view: &serde_json::Value, field: &str) -> OffsetDateTime {
    OffsetDateTime::parse(
        view[field].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
}

fn cert_not_after(view: &serde_json::Value) -> OffsetDateTime {
    time_of(view, "cert_not_after")
}

/// Waits for a heartbeat received at `t` or later by the control plane's
/// clock (which stands still between the test's moves).
async fn heard_since(cp: &ControlPlane, kind: &str, id: &str, t: OffsetDateTime) {
    eventually(Duration::from_secs(10), "heartbeats go on", || async {
        let view = member(cp, kind, id).await;
        (time_of(&view, "last_seen") >= t && view["status"] == "online").then_some(())
    })
    .await;
}

fn generation(dir: &Path) -> u64 {
    let raw = std::fs::read(dir.join("identity/identity.json")).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    v["generation"].as_u64().unwrap_or(0)
}

async fn channel(cp: &ControlPlane, identity: &Identity) -> tonic::transport::Channel {
    mtls_endpoint(&cp.grpc_url, identity)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_agent_and_a_bridge_renew_twice_and_a_revoked_device_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let day0 = OffsetDateTime::now_utc();
    let day = |d: i64| day0 + time::Duration::days(d);
    let clock = edgeloop_control_plane::Clock::manual(day0);
    let cp = ControlPlane::start_with_clock(settings(&dir.path().join("cp")), clock.clone()).await;
    let device_token = cp.token("device", "cam-01").await;
    let cluster_token = cp.token("cluster", "gpu-a").await;
    let stop = CancellationToken::new();
    let agent_dir = dir.path().join("agent");
    let bridge_dir = dir.path().join("bridge");
    let agent = tokio::spawn(edgeloop_edge_agent::run(
        edgeloop_edge_agent::AgentConfig::new(
            cp.member_config(&agent_dir, Some(device_token)),
            vec![],
        ),
        stop.clone(),
    ));
    let bridge = tokio::spawn(edgeloop_trainer_bridge::run(
        cp.bridge_config(&bridge_dir, Some(cluster_token)),
        stop.clone(),
    ));
    let members = [
        ("devices", "cam-01", agent_dir.as_path()),
        ("clusters", "gpu-a", bridge_dir.as_path()),
    ];
    for (kind, id, _) in members {
        eventually(Duration::from_secs(20), "enrolled and online", || async {
            let (status, body) = cp.api().get(&format!("/api/v1/{kind}/{id}")).await;
            (status == 200 && body["status"] == "online").then_some(())
        })
        .await;
    }

    for (round, renew_on) in [(1u64, 250), (2, 500)] {
        let before: Vec<Identity> = members
            .iter()
            .map(|(_, _, d)| IdentityStore::new(d).load().unwrap().unwrap())
            .collect();
        // Past two thirds of the lifetime (243 days), by the control
        // plane's clock: the next heartbeat says renew.
        let now = day(renew_on);
        clock.set(now);
        for (kind, id, data) in members {
            let want = now + time::Duration::days(365);
            // The view changes only when the new certificate is first
            // used: the member renewed, stored it and switched to it.
            eventually(
                Duration::from_secs(20),
                "the renewed certificate in use",
                || async {
                    let view = member(&cp, kind, id).await;
                    ((cert_not_after(&view) - want).abs() < time::Duration::minutes(1))
                        .then_some(())
                },
            )
            .await;
            assert_eq!(
                generation(data),
                round,
                "{id}: stored as the next generation"
            );
            let identity = data.join("identity");
            let key = identity.join(format!("key-{round}.pem"));
            assert_eq!(
                std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
                0o600
            );
            let replaced = if round == 1 {
                identity.join("key.pem")
            } else {
                identity.join(format!("key-{}.pem", round - 1))
            };
            assert!(!replaced.exists(), "{}: the replaced key is removed", id);
        }
        // The replaced certificates work through their drain, then stop.
        let drained = now + edgeloop_control_plane::fleet::renewal::DRAIN;
        clock.set(drained - time::Duration::seconds(1));
        AgentServiceClient::new(channel(&cp, &before[0]).await)
            .heartbeat(HeartbeatRequest::default())
            .await
            .unwrap();
        clock.set(drained + time::Duration::seconds(1));
        let err = AgentServiceClient::new(channel(&cp, &before[0]).await)
            .heartbeat(HeartbeatRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
        let err = BridgeServiceClient::new(channel(&cp, &before[1]).await)
            .heartbeat(HeartbeatRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
        // ... while the members go on with their new ones.
        for (kind, id, _) in members {
            heard_since(&cp, kind, id, drained + time::Duration::seconds(1)).await;
        }
    }
    // Day 800: the first certificates ended on day 365, the second ones on
    // day 615; the fleet runs on the third.
    clock.set(day(800));
    for (kind, id, _) in members {
        heard_since(&cp, kind, id, day(800)).await;
    }

    // A revoked device cannot renew, and its agent stops.
    let identity = IdentityStore::new(&agent_dir).load().unwrap().unwrap();
    let (status, body) = cp
        .api()
        .post("/api/v1/devices/cam-01/revoke", json!({"reason": "stolen"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let key = rcgen::KeyPair::generate().unwrap();
    let csr_pem = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let err = AgentServiceClient::new(channel(&cp, &identity).await)
        .renew(RenewRequest { csr_pem })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    let stopped = tokio::time::timeout(Duration::from_secs(20), agent)
        .await
        .expect("a revoked agent stops")
        .unwrap();
    assert!(format!("{:#}", stopped.unwrap_err()).contains("revoked"));
    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
