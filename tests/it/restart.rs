//! A restarted control plane keeps its CA, admin token, devices, tokens,
//! artifacts and models; a store from a newer schema is refused.

use edgeloop_client_core::tls::mtls_endpoint;
use edgeloop_client_core::Role;
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::common::v1::HeartbeatRequest;
use edgeloop_tests::{on_each_store, ControlPlane, TestStore};
use reqwest::Method;
use serde_json::json;

on_each_store!(
    #[tokio::test]
    restart_keeps_identity_devices_tokens_artifacts_and_models
);
async fn restart_keeps_identity_devices_tokens_artifacts_and_models(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let cp = ControlPlane::start_with(store.settings(&cp_dir)).await;
    assert!(cp.first_start);
    let admin = cp.admin_token.clone();
    let identity = cp
        .enroll(
            Role::Device,
            &cp.token("device", "keeper").await,
            &dir.path().join("d"),
        )
        .await;
    let unused = cp.token("device", "later").await;
    let data = b"weights".to_vec();
    let digest = Digest::of(&data);
    assert_eq!(
        cp.api()
            .raw(
                Method::PUT,
                &format!("/api/v1/artifacts/{digest}"),
                data.clone()
            )
            .await
            .0,
        201
    );
    assert_eq!(
        cp.api()
            .post("/api/v1/models", json!({"name": "m"}))
            .await
            .0,
        201
    );
    assert_eq!(
        cp.api()
            .post(
                "/api/v1/models/m/versions",
                json!({"artifact_digest": digest.to_string()})
            )
            .await
            .0,
        201
    );
    let ca_before = std::fs::read(cp_dir.join("pki/ca.crt")).unwrap();
    cp.stop().await;

    let cp = ControlPlane::start_with(store.settings(&cp_dir)).await;
    assert!(!cp.first_start, "the admin token is created once");
    assert_eq!(cp.admin_token, admin);
    assert_eq!(std::fs::read(cp_dir.join("pki/ca.crt")).unwrap(), ca_before);
    let api = cp.api();
    let (_, devices) = api.get("/api/v1/devices").await;
    assert_eq!(devices[0]["id"], "keeper");
    let (_, tokens) = api.get("/api/v1/tokens").await;
    assert_eq!(tokens.as_array().unwrap().len(), 2);
    let got = api
        .request(Method::GET, &format!("/api/v1/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.bytes().await.unwrap().as_ref(), &data[..]);
    let (status, v) = api.get("/api/v1/models/m/versions/1").await;
    assert_eq!(status, 200, "{v}");

    // The enrolled device's certificate still works (same CA, same pin)...
    let channel = mtls_endpoint(&cp.grpc_url, &identity)
        .unwrap()
        .connect()
        .await
        .unwrap();
    AgentServiceClient::new(channel)
        .heartbeat(HeartbeatRequest::default())
        .await
        .unwrap();
    // ...and a token created before the restart still enrolls.
    cp.enroll(Role::Device, &unused, &dir.path().join("d2"))
        .await;
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    a_store_from_a_newer_schema_is_refused_with_a_clear_error
);
async fn a_store_from_a_newer_schema_is_refused_with_a_clear_error(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let cp = ControlPlane::start_with(store.settings(&cp_dir)).await;
    cp.core
        .store
        .force_schema_version(edgeloop_store::SCHEMA_VERSION + 1)
        .unwrap();
    cp.stop().await;
    let config = edgeloop_control_plane::Config::from_settings(store.settings(&cp_dir)).unwrap();
    let err = edgeloop_control_plane::Server::start(config)
        .await
        .err()
        .unwrap();
    let msg = format!("{err:#}");
    assert!(msg.contains("newer Edgeloop"), "{msg}");
}
