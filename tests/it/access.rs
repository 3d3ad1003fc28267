//! Console access control on a live control plane: every route × every
//! role, generated from the route table, is allowed or refused as the
//! table says; tokens scoped to projects see and change only those; every
//! state-changing call lands in the audit log; revocation is immediate;
//! the CLI manages tokens and reads the log.

use edgeloop_api::access::Role;
use edgeloop_auth::permissions::{allows, Permission, ROUTES};
use edgeloop_tests::{edgeloop_bin, Api, ControlPlane};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// A route template with its parameters filled in: targets that do not
/// exist, so an allowed call is answered by the handler (400, 404, 409)
/// and changes nothing.
fn concrete(path: &str) -> String {
    path.replace("{name}", "no-such-model")
        .replace("{version}", "9.9.9")
        .replace("{alias}", "prod")
        .replace("{digest}", &"0".repeat(64))
        .replace("{id}", "no-such-id")
}

async fn call(api: &Api, method: &Method, path: &str) -> StatusCode {
    let mut r = api.request(method.clone(), path);
    if matches!(*method, Method::POST | Method::PUT) {
        r = if path.starts_with("/api/v1/artifacts/") {
            r.body("bytes whose digest is not the path's")
        } else {
            r.header("content-type", "application/json").body("{}")
        };
    }
    r.send().await.unwrap().status()
}

async fn create_token(admin: &Api, name: &str, body: Value) -> (String, String) {
    let mut body = body;
    body["name"] = json!(name);
    let (status, created) = admin.post("/api/v1/api-tokens", body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(created["token"].as_str().unwrap().starts_with("elk1_"));
    (
        created["token"].as_str().unwrap().to_string(),
        created["id"].as_str().unwrap().to_string(),
    )
}

fn audit_count(entries: &Value) -> usize {
    entries.as_array().unwrap().len()
}

#[tokio::test]
async fn every_route_and_role_is_allowed_or_refused_as_the_table_says() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let admin = cp.api();
    let mut holders = vec![(Role::Admin, admin.clone(), "admin".to_string())];
    for role in [Role::Deployer, Role::Trainer, Role::Viewer] {
        let (secret, id) = create_token(&admin, role.as_str(), json!({"role": role})).await;
        holders.push((role, Api::new(&cp.http_base, Some(&secret)), id));
    }
    let (admin_key, _) = create_token(&admin, "second-admin", json!({"role": "admin"})).await;
    holders.push((
        Role::Admin,
        Api::new(&cp.http_base, Some(&admin_key)),
        String::new(),
    ));

    let anonymous = Api::new(&cp.http_base, None);
    let stranger = Api::new(&cp.http_base, Some("elk1_notatoken"));
    let before = audit_count(&admin.get("/api/v1/audit?limit=1000").await.1);
    let mut state_changing_calls = 0;
    let mut checked = 0;
    for rule in ROUTES {
        let path = concrete(rule.path);
        if rule.permission == Permission::Public {
            let status = call(&anonymous, &rule.method, &path).await;
            assert!(status.is_success(), "{} {path}: {status}", rule.method);
            continue;
        }
        for who in [&anonymous, &stranger] {
            let status = call(who, &rule.method, &path).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{} {path}", rule.method);
        }
        for (role, api, _) in &holders {
            let status = call(api, &rule.method, &path).await;
            if allows(*role, rule.permission) {
                assert!(
                    status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                    "{role} {} {path}: {status}, but the table allows it",
                    rule.method
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{role} {} {path}: the table refuses it",
                    rule.method
                );
            }
            if !matches!(rule.method, Method::GET | Method::HEAD) {
                state_changing_calls += 1;
            }
            checked += 1;
        }
    }
    assert!(checked >= ROUTES.len() * 4, "{checked}");
    // HEAD is GET's permission; a method the table does not list is 405
    // (with Allow), for everyone, without running anything.
    let viewer = &holders[3].1;
    assert_eq!(
        call(viewer, &Method::HEAD, "/api/v1/models").await,
        StatusCode::OK
    );
    for who in [&anonymous, viewer, &admin] {
        let r = who.request(Method::TRACE, "/healthz").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()["allow"], "GET");
        let status = call(who, &Method::PATCH, "/api/v1/models").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    }

    // Every authenticated state-changing call above is in the log, refused
    // or not; the anonymous ones are counted in /metrics instead.
    let log = admin.get("/api/v1/audit?limit=1000").await.1;
    assert_eq!(audit_count(&log) - before, state_changing_calls, "{log}");
    let viewer_id = &holders[3].2;
    let (_, viewer_log) = admin
        .get(&format!("/api/v1/audit?token_id={viewer_id}&limit=1000"))
        .await;
    let viewer_log = viewer_log.as_array().unwrap();
    assert!(!viewer_log.is_empty());
    for e in viewer_log {
        assert_eq!(e["token_id"], json!(viewer_id));
        assert_eq!(e["status"], json!(403), "{e}");
        assert_eq!(e["result"], json!("refused"));
        assert!(e["route"].as_str().unwrap().starts_with('/'));
        assert!(e["target"].as_str().unwrap().starts_with("/api/v1/"));
    }
    assert!(
        admin
            .metric("edgeloop_console_forbidden_total")
            .await
            .unwrap()
            > 0
    );
    assert!(
        admin
            .metric("edgeloop_console_unauthenticated_total")
            .await
            .unwrap()
            > 0
    );

    // Revocation is immediate, and it is audited.
    assert_eq!(viewer.get("/api/v1/models").await.0, StatusCode::OK);
    let status = admin
        .request(Method::DELETE, &format!("/api/v1/api-tokens/{viewer_id}"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        viewer.get("/api/v1/models").await.0,
        StatusCode::UNAUTHORIZED
    );
    let (_, list) = admin.get("/api/v1/api-tokens").await;
    let listed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == json!(viewer_id))
        .unwrap();
    assert_eq!(listed["state"], json!("revoked"));
    assert!(
        listed.get("token").is_none(),
        "a listing never holds a secret"
    );
    let (_, last) = admin.get("/api/v1/audit?limit=1").await;
    assert_eq!(last[0]["method"], json!("DELETE"));
    assert_eq!(last[0]["route"], json!("/api/v1/api-tokens/{id}"));
    assert_eq!(last[0]["result"], json!("ok"));
    cp.stop().await;
}

#[tokio::test]
async fn a_token_scoped_to_projects_sees_and_changes_only_those() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let admin = cp.api();
    for (model, project) in [("eyes", "vision"), ("ears", "audio")] {
        let (s, b) = admin
            .post("/api/v1/models", json!({"name": model, "project": project}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        assert_eq!(b["project"], json!(project));
    }
    // One device in each project, enrolled for real.
    for (device, project) in [("cam-1", "vision"), ("mic-1", "audio")] {
        let (s, b) = admin
            .post(
                "/api/v1/tokens",
                json!({"kind": "device", "name": device, "project": project}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        cp.enroll(
            edgeloop_client_core::Role::Device,
            b["token"].as_str().unwrap(),
            &dir.path().join(device),
        )
        .await;
    }
    let (s, b) = admin
        .post(
            "/api/v1/tokens",
            json!({"kind": "cluster", "name": "gpu", "project": "vision"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "clusters are shared: {b}");
    assert_eq!(b["error"]["field"], json!("project"));

    let (trainer, _) = create_token(
        &admin,
        "vision-trainer",
        json!({"role": "trainer", "projects": ["vision"]}),
    )
    .await;
    let (deployer, _) = create_token(
        &admin,
        "vision-deployer",
        json!({"role": "deployer", "projects": ["vision"]}),
    )
    .await;
    let trainer = Api::new(&cp.http_base, Some(&trainer));
    let deployer = Api::new(&cp.http_base, Some(&deployer));

    let names = |v: &Value, key: &str| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|m| m[key].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&trainer.get("/api/v1/models").await.1, "name"),
        ["eyes"]
    );
    assert_eq!(
        names(&trainer.get("/api/v1/devices").await.1, "id"),
        ["cam-1"]
    );
    assert_eq!(names(&admin.get("/api/v1/models").await.1, "name").len(), 2);
    // Another project's model answers as a missing one does.
    let (s, hidden) = trainer.get("/api/v1/models/ears").await;
    let (_, missing) = trainer.get("/api/v1/models/nothing").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(
        hidden["error"]["message"]
            .as_str()
            .unwrap()
            .replace("ears", "X"),
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .replace("nothing", "X"),
        "{hidden} {missing}"
    );
    assert_eq!(trainer.get("/api/v1/models/eyes").await.0, StatusCode::OK);
    assert_eq!(
        trainer.get("/api/v1/devices/mic-1").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        trainer.get("/api/v1/models/ears/drift").await.0,
        StatusCode::NOT_FOUND
    );
    let retraining = json!({"job": {}});
    assert_eq!(
        trainer
            .put("/api/v1/models/ears/retraining", retraining)
            .await
            .0,
        StatusCode::NOT_FOUND
    );

    // Jobs: created only in its projects; listed only from them.
    let spec = json!({"name": "train-eyes", "command": ["python3", "train.py"],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "checkpoint": {"every_steps": 100, "keep_last": 2}});
    let (s, b) = trainer
        .post("/api/v1/jobs", json!({"spec": spec, "project": "audio"}))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    let (s, b) = trainer.post("/api/v1/jobs", json!({"spec": spec})).await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "the default project is not its: {b}"
    );
    let (s, mine) = trainer
        .post("/api/v1/jobs", json!({"spec": spec, "project": "vision"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{mine}");
    let (s, theirs) = admin
        .post("/api/v1/jobs", json!({"spec": spec, "project": "audio"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{theirs}");
    assert_eq!(
        names(&trainer.get("/api/v1/jobs").await.1, "id"),
        [mine["id"].as_str().unwrap()]
    );
    let their_job = format!("/api/v1/jobs/{}", theirs["id"].as_str().unwrap());
    assert_eq!(trainer.get(&their_job).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        trainer
            .post(&format!("{their_job}/cancel"), json!({}))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(admin.get(&their_job).await.1["state"], json!("queued"));

    // Models: created only in its projects.
    let (s, _) = deployer
        .post(
            "/api/v1/models",
            json!({"name": "nose", "project": "audio"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Deployments: another project's model does not exist for it; and a
    // project's model reaches only that project's devices, whatever the
    // selector says.
    let (s, b) = deployer
        .post(
            "/api/v1/deployments",
            json!({"model": "ears", "version": "1.0.0", "selector": "edgeloop.io/os"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(b["error"]["field"], json!("model"), "{b}");
    // Scoping an admin is refused: an admin could mint itself an unscoped token.
    let (s, b) = admin
        .post(
            "/api/v1/api-tokens",
            json!({"name": "x", "role": "admin", "projects": ["vision"]}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    cp.stop().await;
}

// The CLI runs as a blocking child process: the server needs other workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_lists_and_revokes_tokens_and_reads_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, &cp.admin_token).unwrap();
    let edgeloop = |args: &[&str]| {
        let out = std::process::Command::new(edgeloop_bin())
            .args(args)
            .env("EDGELOOP_SERVER", &cp.http_base)
            .env("EDGELOOP_TOKEN_FILE", &token_file)
            .env_remove("EDGELOOP_TOKEN")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (code, out, err) = edgeloop(&[
        "api-token",
        "create",
        "ci-vision",
        "--role",
        "trainer",
        "--project",
        "vision",
        "--expires-in-seconds",
        "3600",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(err.is_empty(), "no warning without --token: {err}");
    let created: Value = serde_json::from_str(&out).unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    let secret = created["token"].as_str().unwrap().to_string();
    assert_eq!(created["projects"], json!(["vision"]));

    let (code, out, _) = edgeloop(&["api-token", "list"]);
    assert_eq!(code, Some(0));
    let row = out.lines().find(|l| l.starts_with(&id)).unwrap();
    for want in ["ci-vision", "trainer", "vision", "active", "admin"] {
        assert!(row.contains(want), "{want}: {out}");
    }
    assert!(!out.contains(&secret), "a listing never shows a secret");

    // The new token, from the environment: no warning; from --token: a
    // warning that ps shows it. A trainer may not read the audit log (77).
    let out = std::process::Command::new(edgeloop_bin())
        .args(["audit"])
        .env("EDGELOOP_SERVER", &cp.http_base)
        .env("EDGELOOP_TOKEN", &secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused: role trainer may not GET /api/v1/audit"),
        "{out:?}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("visible"),
        "{out:?}"
    );
    let out = std::process::Command::new(edgeloop_bin())
        .args(["model", "list", "--token", &secret])
        .env("EDGELOOP_SERVER", &cp.http_base)
        .env_remove("EDGELOOP_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--token is visible"),
        "{out:?}"
    );

    let (code, out, err) = edgeloop(&["api-token", "revoke", &id]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("revoked"), "{out}");
    let (code, out, _) = edgeloop(&["audit", "--limit", "5"]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[1].contains("DELETE /api/v1/api-tokens/{id}"), "{out}");
    assert!(
        lines[1].contains(&format!("/api/v1/api-tokens/{id}")),
        "{out}"
    );
    assert!(lines[1].contains("admin (bootstrap admin)"), "{out}");
    assert!(lines[2].contains("POST /api/v1/api-tokens"), "{out}");
    let (code, _, err) = edgeloop(&["audit", "--limit", "0"]);
    assert_eq!(code, Some(64), "{err}");
    cp.stop().await;
}

/// A device uses its valid certificate to write into a model it was never
/// assigned: every such item is refused and counted, the rest of its
/// report is kept, and the victim's data stays empty.
#[tokio::test]
async fn a_hostile_device_cannot_write_into_another_models_data() {
    use edgeloop_proto::agent::v1 as pb;
    use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;

    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let api = cp.api();
    for model in ["rain", "victim"] {
        assert_eq!(
            api.post("/api/v1/models", json!({"name": model})).await.0,
            201
        );
    }
    let token = cp.token("device", "edge-evil").await;
    let mut device = AgentServiceClient::new(
        cp.connect(
            edgeloop_client_core::Role::Device,
            &token,
            &dir.path().join("edge-evil"),
        )
        .await,
    );
    cp.assigned("edge-evil", "rain", "1.0.0");
    let honest = edgeloop_tests::weather::sketch(1_796_083_200, [150, 200, 150], [350, 150]);
    let mut forged = honest.clone();
    forged.model_name = "victim".into();
    let mut wrong_version = honest.clone();
    wrong_version.model_version = "9.9.9".into();
    let feedback = |model: &str| pb::Sample {
        kind: pb::SampleKind::Feedback as i32,
        model_name: model.into(),
        model_version: "1.0.0".into(),
        request_id: format!("{model}-1"),
        predicted_class: Some(1),
        label: Some(0),
        ..Default::default()
    };
    let ack = device
        .report_telemetry(pb::TelemetryReport {
            sequence: 1,
            sketches: vec![honest, forged, wrong_version],
            samples: vec![feedback("rain"), feedback("victim")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.acked_sequence, 1, "the report itself is acknowledged");
    let count = |v: &Value| v.as_array().unwrap().len();
    assert_eq!(count(&api.get("/api/v1/models/rain/sketches").await.1), 1);
    assert_eq!(count(&api.get("/api/v1/models/rain/samples").await.1), 1);
    assert_eq!(count(&api.get("/api/v1/models/victim/sketches").await.1), 0);
    assert_eq!(count(&api.get("/api/v1/models/victim/samples").await.1), 0);
    assert_eq!(
        api.metric("edgeloop_device_foreign_data_refused_total")
            .await,
        Some(3)
    );
    let (_, reports) = api.get("/api/v1/devices/edge-evil/telemetry").await;
    assert_eq!(reports[0]["refused_foreign"], json!(3), "{reports}");

    let refused = device
        .report_assignment_status(pb::AssignmentStatusReport {
            generation: 1,
            model_name: "victim".into(),
            model_version: "1.0.0".into(),
            state: pb::AssignmentState::Active as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
    assert_eq!(
        api.metric("edgeloop_device_foreign_data_refused_total")
            .await,
        Some(4)
    );
    cp.stop().await;
}

/// `--http-tls`: the console is served over rustls with the control
/// plane's server certificate; a client trusts it by the CA file or the
/// CA's fingerprint, and nothing else gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_over_tls_is_trusted_by_ca_file_or_fingerprint() {
    use edgeloop_api::{Client, Trust};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        http_tls: true,
        ..edgeloop_tests::settings(&dir.path().join("cp"))
    })
    .await;
    assert!(
        cp.http_base.starts_with("https://localhost:"),
        "{}",
        cp.http_base
    );
    let pin = cp.core.pki.ca_fingerprint();
    let ca_file = cp.data_dir.join("pki").join("ca.crt");
    let ca_pem = std::fs::read(&ca_file).unwrap();
    let client = |trust: Trust| {
        Client::with_trust(
            &cp.http_base,
            Some(cp.admin_token.clone()),
            Duration::from_secs(10),
            &trust,
        )
        .unwrap()
    };
    for trust in [Trust::CaFingerprint(pin), Trust::CaPem(ca_pem.clone())] {
        let models: Value = client(trust.clone()).get("/api/v1/models").await.unwrap();
        assert_eq!(models, json!([]), "{trust:?}");
    }
    let created: Value = client(Trust::CaFingerprint(pin))
        .post(
            "/api/v1/api-tokens",
            &json!({"name": "remote", "role": "viewer"}),
        )
        .await
        .unwrap();
    assert_eq!(created["ca_fingerprint"], json!(pin.to_hex()));
    // Not trusted: a default client, a wrong pin; and plain HTTP gets no answer.
    for trust in [
        Trust::Default,
        Trust::CaFingerprint(edgeloop_models::Digest::of(b"x")),
    ] {
        let e = client(trust.clone())
            .get::<Value>("/api/v1/models")
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            edgeloop_api::ErrorKind::Unreachable,
            "{trust:?}: {e}"
        );
    }
    let plain = format!("http://127.0.0.1:{}/healthz", cp.http_addr.port());
    let answered = reqwest::get(&plain)
        .await
        .is_ok_and(|r| r.status().is_success());
    assert!(!answered, "plain HTTP on the TLS port");

    // The CLI, with either flag.
    let edgeloop = |extra: &[&str]| {
        std::process::Command::new(edgeloop_bin())
            .args(["model", "list"])
            .args(extra)
            .env("EDGELOOP_SERVER", &cp.http_base)
            .env("EDGELOOP_TOKEN", &cp.admin_token)
            .env_remove("EDGELOOP_CA_FILE")
            .env_remove("EDGELOOP_CA_FINGERPRINT")
            .output()
            .unwrap()
    };
    let ca_path = ca_file.to_str().unwrap().to_string();
    let pin_hex = pin.to_hex();
    for extra in [
        ["--ca-file", ca_path.as_str()],
        ["--ca-fingerprint", pin_hex.as_str()],
    ] {
        let out = edgeloop(&extra);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {out:?}");
    }
    let out = edgeloop(&[]);
    assert_eq!(
        out.status.code(),
        Some(69),
        "an untrusted certificate: {out:?}"
    );
    cp.stop().await;
}
