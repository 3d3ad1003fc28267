//! Console API: each error case gets its status and names the field, and a
//! rejected request changes nothing. Plus health, readiness and OpenAPI.

use edgeloop_models::Digest;
use edgeloop_tests::{on_each_store, settings, Api, ControlPlane, TestStore};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// Everything the API can list, to compare before and after a rejection.
async fn snapshot(api: &Api) -> Value {
    let mut all = serde_json::Map::new();
    for path in [
        "/api/v1/tokens",
        "/api/v1/devices",
        "/api/v1/clusters",
        "/api/v1/models",
        "/api/v1/models/digits/versions",
    ] {
        let (status, body) = api.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        all.insert(path.to_string(), body);
    }
    Value::Object(all)
}

struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    body: Vec<u8>,
    auth: Option<&'static str>,
    status: u16,
    field: Option<&'static str>,
}

fn case(
    name: &'static str,
    method: Method,
    path: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    field: Option<&'static str>,
) -> Case {
    Case {
        name,
        method,
        path,
        body: body.into(),
        auth: Some("admin"),
        status,
        field,
    }
}

on_each_store!(
    #[tokio::test]
    bad_inputs_get_the_right_status_name_the_field_and_change_nothing
);
async fn bad_inputs_get_the_right_status_name_the_field_and_change_nothing(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = store.settings(&dir.path().join("cp"));
    s.max_json_bytes = Some(4096);
    let cp = ControlPlane::start_with(s).await;
    let api = cp.api();

    // Some state for conflicts to hit.
    let artifact = b"model bytes".to_vec();
    let digest = Digest::of(&artifact);
    assert_eq!(
        api.raw(
            Method::PUT,
            &format!("/api/v1/artifacts/{digest}"),
            artifact
        )
        .await
        .0,
        201
    );
    assert_eq!(
        api.post(
            "/api/v1/models",
            json!({"name": "digits", "task": "classification"})
        )
        .await
        .0,
        201
    );
    let (status, v1) = api
        .post(
            "/api/v1/models/digits/versions",
            json!({"version": "1", "artifact_digest": digest.to_string()}),
        )
        .await;
    assert_eq!(status, 201, "{v1}");
    assert_eq!(
        api.post("/api/v1/tokens", json!({"kind": "device", "name": "taken"}))
            .await
            .0,
        201
    );
    let before = snapshot(&api).await;

    let d = digest.to_string();
    let version_with_parent =
        format!(r#"{{"version":"2","artifact_digest":"{d}","lineage":{{"parent_version":"9"}}}}"#);
    let version_dup = format!(r#"{{"version":"1","artifact_digest":"{d}"}}"#);
    let version_unknown_lineage =
        format!(r#"{{"artifact_digest":"{d}","lineage":{{"parent":"1"}}}}"#);
    let huge = format!(r#"{{"kind":"device","name":"{}"}}"#, "a".repeat(10_000));
    let cases = vec![
        case(
            "malformed JSON",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind": "device""#,
            400,
            None,
        ),
        case(
            "not an object",
            Method::POST,
            "/api/v1/tokens",
            "42",
            400,
            None,
        ),
        case(
            "unknown field",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","colour":"red"}"#,
            400,
            Some("colour"),
        ),
        case(
            "missing field",
            Method::POST,
            "/api/v1/tokens",
            r#"{"name":"x"}"#,
            400,
            Some("kind"),
        ),
        case(
            "wrong enum",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"toaster"}"#,
            400,
            Some("kind"),
        ),
        case(
            "wrong type",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","ttl_seconds":"soon"}"#,
            400,
            Some("ttl_seconds"),
        ),
        case(
            "ttl out of range",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","ttl_seconds":1}"#,
            400,
            Some("ttl_seconds"),
        ),
        case(
            "bad name",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","name":"../etc"}"#,
            400,
            Some("name"),
        ),
        case(
            "bad label",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","labels":{"site":"a b"}}"#,
            400,
            Some("labels.site"),
        ),
        case(
            "nested wrong type",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","labels":{"site":1}}"#,
            400,
            Some("labels.site"),
        ),
        case(
            "token conflict",
            Method::POST,
            "/api/v1/tokens",
            r#"{"kind":"device","name":"taken"}"#,
            409,
            None,
        ),
        case(
            "body over limit",
            Method::POST,
            "/api/v1/tokens",
            huge,
            413,
            None,
        ),
        case(
            "model conflict",
            Method::POST,
            "/api/v1/models",
            r#"{"name":"digits"}"#,
            409,
            None,
        ),
        case(
            "model bad name",
            Method::POST,
            "/api/v1/models",
            r#"{"name":"Digits!"}"#,
            400,
            Some("name"),
        ),
        case(
            "version conflict",
            Method::POST,
            "/api/v1/models/digits/versions",
            version_dup,
            409,
            None,
        ),
        case(
            "version of missing model",
            Method::POST,
            "/api/v1/models/nope/versions",
            format!(r#"{{"artifact_digest":"{d}"}}"#),
            404,
            None,
        ),
        case(
            "version bad digest",
            Method::POST,
            "/api/v1/models/digits/versions",
            r#"{"artifact_digest":"abc"}"#,
            400,
            Some("artifact_digest"),
        ),
        case(
            "version artifact missing",
            Method::POST,
            "/api/v1/models/digits/versions",
            format!(r#"{{"artifact_digest":"{}"}}"#, Digest::of(b"nope")),
            400,
            Some("artifact_digest"),
        ),
        case(
            "version unknown parent",
            Method::POST,
            "/api/v1/models/digits/versions",
            version_with_parent,
            400,
            Some("lineage.parent_version"),
        ),
        case(
            "lineage unknown field",
            Method::POST,
            "/api/v1/models/digits/versions",
            version_unknown_lineage,
            400,
            Some("lineage.parent"),
        ),
        case(
            "missing device",
            Method::GET,
            "/api/v1/devices/ghost",
            "",
            404,
            None,
        ),
        case(
            "revoke missing device",
            Method::POST,
            "/api/v1/devices/ghost/revoke",
            "",
            404,
            None,
        ),
        case(
            "labels missing cluster",
            Method::PUT,
            "/api/v1/clusters/ghost/labels",
            r#"{"labels":{}}"#,
            404,
            None,
        ),
        case(
            "missing model",
            Method::GET,
            "/api/v1/models/ghost",
            "",
            404,
            None,
        ),
        case(
            "missing version",
            Method::GET,
            "/api/v1/models/digits/versions/9",
            "",
            404,
            None,
        ),
        case(
            "missing artifact",
            Method::GET,
            "/api/v1/artifacts/0000000000000000000000000000000000000000000000000000000000000000",
            "",
            404,
            None,
        ),
        case(
            "unknown route",
            Method::GET,
            "/api/v1/nothing-here",
            "",
            404,
            None,
        ),
        Case {
            auth: None,
            ..case(
                "no token",
                Method::POST,
                "/api/v1/models",
                r#"{"name":"sneaky"}"#,
                401,
                None,
            )
        },
        Case {
            auth: Some("wrong"),
            ..case(
                "bad token",
                Method::POST,
                "/api/v1/models",
                r#"{"name":"sneaky"}"#,
                401,
                None,
            )
        },
        Case {
            auth: None,
            ..case(
                "no token on read",
                Method::GET,
                "/api/v1/devices",
                "",
                401,
                None,
            )
        },
    ];
    for c in cases {
        let token = match c.auth {
            Some("admin") => Some(cp.admin_token.as_str()),
            other => other,
        };
        let client = Api::new(&cp.http_base, token);
        let (status, body) = client.raw(c.method.clone(), c.path, c.body.clone()).await;
        assert_eq!(
            status,
            StatusCode::from_u16(c.status).unwrap(),
            "{}: {body}",
            c.name
        );
        assert!(
            body["error"]["code"].is_string(),
            "{}: error body {body}",
            c.name
        );
        assert!(
            body["error"]["message"].is_string(),
            "{}: error body {body}",
            c.name
        );
        if let Some(field) = c.field {
            assert_eq!(body["error"]["field"], field, "{}: {body}", c.name);
        }
        assert_eq!(snapshot(&api).await, before, "{} changed state", c.name);
    }
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    registry_records_versions_with_lineage
);
async fn registry_records_versions_with_lineage(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(store.settings(&dir.path().join("cp"))).await;
    let api = cp.api();
    let a = Digest::of(b"v1");
    let b = Digest::of(b"v2");
    api.raw(
        Method::PUT,
        &format!("/api/v1/artifacts/{a}"),
        b"v1".to_vec(),
    )
    .await;
    api.raw(
        Method::PUT,
        &format!("/api/v1/artifacts/{b}"),
        b"v2".to_vec(),
    )
    .await;
    assert_eq!(
        api.post("/api/v1/models", json!({"name": "digits"}))
            .await
            .0,
        201
    );
    let (s, v1) = api
        .post(
            "/api/v1/models/digits/versions",
            json!({"artifact_digest": a.to_string()}),
        )
        .await;
    assert_eq!(s, 201, "{v1}");
    assert_eq!(v1["version"], "1", "versions number themselves");
    let (s, v2) = api
        .post(
            "/api/v1/models/digits/versions",
            json!({
                "artifact_digest": b.to_string(),
                "metrics": {"top1": 0.97},
                "lineage": {"parent_version": "1", "trigger": "manual", "quantization": {"chosen": "int8-static"}}
            }),
        )
        .await;
    assert_eq!(s, 201, "{v2}");
    assert_eq!(v2["version"], "2");
    assert_eq!(v2["artifact_size"], 2);
    let (_, got) = api.get("/api/v1/models/digits/versions/2").await;
    assert_eq!(got["lineage"]["parent_version"], "1");
    assert_eq!(got["lineage"]["quantization"]["chosen"], "int8-static");
    assert_eq!(got["metrics"]["top1"], 0.97);
    let (_, list) = api.get("/api/v1/models/digits/versions").await;
    assert_eq!(list.as_array().unwrap().len(), 2);
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    aliases_point_move_keep_their_history_and_survive_a_restart
);
/// Aliases: created (201), moved (200), each move in the history with who,
/// when, from and to; refused with the field named (400), for a missing
/// model or version (404), or when an alias and a version would share a
/// name (409); deployments name them; all of it durable across a restart.
async fn aliases_point_move_keep_their_history_and_survive_a_restart(store: TestStore) {
    use edgeloop_client_core::Role;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cp");
    let cp = ControlPlane::start_with(store.settings(&data)).await;
    let api = cp.api();
    let digest = cp.upload(b"digits model").await;
    assert_eq!(
        api.post("/api/v1/models", json!({"name": "digits"}))
            .await
            .0,
        201
    );
    for v in ["1", "2", "canary"] {
        let (s, body) = api
            .post(
                "/api/v1/models/digits/versions",
                json!({"version": v, "artifact_digest": digest.to_string()}),
            )
            .await;
        assert_eq!(s, 201, "{body}");
    }
    let alias = "/api/v1/models/digits/aliases/production";

    let (s, created) = api.put(alias, json!({"version": "1"})).await;
    assert_eq!(s, 201, "{created}");
    assert_eq!(created["alias"], "production");
    assert_eq!(created["version"], "1");
    assert_eq!(created["updated_by"], "admin");
    // Pointing it where it points: 200, and nothing recorded.
    let (s, same) = api.put(alias, json!({"version": "1"})).await;
    assert_eq!(s, 200, "{same}");
    let (s, moved) = api
        .put(alias, json!({"version": "2", "reason": "promoted"}))
        .await;
    assert_eq!(s, 200, "{moved}");
    assert_eq!(moved["version"], "2");
    let (s, shown) = api.get(alias).await;
    assert_eq!((s.as_u16(), &shown), (200, &moved));
    let (_, list) = api.get("/api/v1/models/digits/aliases").await;
    assert_eq!(list, json!([moved]));
    let (s, history) = api.get(&format!("{alias}/history")).await;
    assert_eq!(s, 200, "{history}");
    let moves = history["history"].as_array().unwrap();
    assert_eq!(moves.len(), 2, "{history}");
    assert_eq!(moves[0]["from"], Value::Null);
    assert_eq!(moves[0]["to"], "1");
    assert_eq!(
        (&moves[1]["from"], &moves[1]["to"]),
        (&json!("1"), &json!("2"))
    );
    assert_eq!(moves[1]["reason"], "promoted");
    assert_eq!(moves[1]["by"], "admin");
    let at = time::OffsetDateTime::parse(
        moves[1]["at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(at >= time::OffsetDateTime::now_utc() - time::Duration::minutes(5));

    // Refusals, each naming what is wrong; none changes the alias.
    let staging = "/api/v1/models/digits/aliases/staging";
    let refusals: Vec<(&str, String, Value, u16, Option<&str>)> = vec![
        (
            "uppercase alias",
            "/api/v1/models/digits/aliases/Staging".into(),
            json!({"version": "1"}),
            400,
            Some("alias"),
        ),
        (
            "alias like a version",
            "/api/v1/models/digits/aliases/v2".into(),
            json!({"version": "1"}),
            400,
            Some("alias"),
        ),
        (
            "numeric alias",
            "/api/v1/models/digits/aliases/2".into(),
            json!({"version": "1"}),
            400,
            Some("alias"),
        ),
        (
            "bad version",
            staging.into(),
            json!({"version": "../1"}),
            400,
            Some("version"),
        ),
        (
            "unknown field",
            staging.into(),
            json!({"version": "1", "to": "2"}),
            400,
            None,
        ),
        (
            "no version",
            staging.into(),
            json!({}),
            400,
            Some("version"),
        ),
        (
            "missing version",
            staging.into(),
            json!({"version": "9"}),
            404,
            None,
        ),
        (
            "missing model",
            "/api/v1/models/nope/aliases/staging".into(),
            json!({"version": "1"}),
            404,
            None,
        ),
        (
            "a version's name",
            "/api/v1/models/digits/aliases/canary".into(),
            json!({"version": "1"}),
            409,
            None,
        ),
    ];
    for (name, path, body, status, field) in refusals {
        let (s, got) = api.put(&path, body).await;
        assert_eq!(s.as_u16(), status, "{name}: {got}");
        if let Some(f) = field {
            assert_eq!(got["error"]["field"], f, "{name}: {got}");
        }
    }
    let (s, body) = api
        .post(
            "/api/v1/models/digits/versions",
            json!({"version": "production", "artifact_digest": digest.to_string()}),
        )
        .await;
    assert_eq!(s, 409, "a version may not take an alias's name: {body}");
    assert_eq!(api.get(staging).await.0, 404);
    assert_eq!(
        api.get("/api/v1/models/digits/aliases").await.1,
        json!([moved])
    );
    let anon = Api::new(&cp.http_base, None);
    assert_eq!(anon.put(alias, json!({"version": "1"})).await.0, 401);

    // Deployments by alias: resolved when created, both recorded.
    let token = cp
        .labelled_token("device", "edge-1", json!({"site": "lab"}))
        .await;
    cp.enroll(Role::Device, &token, &dir.path().join("edge-1"))
        .await;
    let deploy = |body: Value| api.post("/api/v1/deployments", body);
    let (s, d) =
        deploy(json!({"model": "digits", "alias": "production", "selector": "site=lab"})).await;
    assert_eq!(s, 201, "{d}");
    assert_eq!(d["alias"], "production");
    assert_eq!(d["deployment"]["target_version"], "2");
    for (name, body, field) in [
        (
            "both",
            json!({"model": "digits", "version": "1", "alias": "production", "selector": "site=lab"}),
            "alias",
        ),
        (
            "neither",
            json!({"model": "digits", "selector": "site=lab"}),
            "version",
        ),
        (
            "unknown alias",
            json!({"model": "digits", "alias": "staging", "selector": "site=lab"}),
            "alias",
        ),
        (
            "invalid alias",
            json!({"model": "digits", "alias": "Prod", "selector": "site=lab"}),
            "alias",
        ),
    ] {
        let (s, got) = deploy(body).await;
        assert_eq!(s, 400, "{name}: {got}");
        assert_eq!(got["error"]["field"], field, "{name}: {got}");
    }

    // Deleted: 204, gone from the list, history kept with the deletion.
    let (s, _) = api.send(api.request(Method::DELETE, alias)).await;
    assert_eq!(s, 204);
    assert_eq!(api.send(api.request(Method::DELETE, alias)).await.0, 404);
    assert_eq!(api.get(alias).await.0, 404);
    assert_eq!(api.get("/api/v1/models/digits/aliases").await.1, json!([]));

    // Durable: the history and the deletion survive a restart.
    let cp = cp.restart(settings(&data)).await;
    let api = cp.api();
    let (s, history) = api.get(&format!("{alias}/history")).await;
    assert_eq!(s, 200, "{history}");
    let moves = history["history"].as_array().unwrap();
    assert_eq!(moves.len(), 3, "{history}");
    assert_eq!(
        (&moves[2]["from"], &moves[2]["to"]),
        (&json!("2"), &Value::Null)
    );
    assert_eq!(history.get("version"), None, "{history}");
    assert_eq!(api.get(staging).await.0, 404);
    let (s, again) = api.put(alias, json!({"version": "1"})).await;
    assert_eq!(s, 201, "set again after deletion: {again}");
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    health_readiness_and_openapi_need_no_token
);
async fn health_readiness_and_openapi_need_no_token(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(store.settings(&dir.path().join("cp"))).await;
    let anon = Api::new(&cp.http_base, None);
    assert_eq!(
        anon.get("/healthz").await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    // Readiness tells when the certificates end (the CA's ten years, the
    // server's 397 days) and warns of nothing yet; /metrics has the same.
    let (status, ready) = anon.get("/readyz").await;
    assert_eq!(
        (status, &ready["status"]),
        (StatusCode::OK, &json!("ready"))
    );
    let ends = |field: &str| {
        let at = ready["certificates"][field].as_str().unwrap().to_string();
        time::OffsetDateTime::parse(&at, &time::format_description::well_known::Rfc3339).unwrap()
    };
    let now = time::OffsetDateTime::now_utc();
    assert!(
        (ends("ca_expires_at") - now).whole_days() >= 3648,
        "{ready}"
    );
    assert!(
        (ends("server_certificate_expires_at") - now).whole_days() >= 395,
        "{ready}"
    );
    assert_eq!(ready["certificates"]["warnings"], json!([]), "{ready}");
    let ca_end = cp
        .api()
        .metric("edgeloop_ca_expiry_timestamp_seconds")
        .await;
    assert_eq!(ca_end, Some(ends("ca_expires_at").unix_timestamp() as u64));
    let (status, doc) = anon.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    // Generated from the handlers: every route is there, with its schemas.
    for path in [
        "/api/v1/tokens",
        "/api/v1/devices",
        "/api/v1/devices/{id}/revoke",
        "/api/v1/clusters",
        "/api/v1/artifacts/{digest}",
        "/api/v1/models/{name}/versions/{version}",
        "/api/v1/models/{name}/aliases",
        "/api/v1/models/{name}/aliases/{alias}",
        "/api/v1/models/{name}/aliases/{alias}/history",
        "/healthz",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from OpenAPI"
        );
    }
    for schema in [
        "CreateToken",
        "MemberView",
        "ModelVersionView",
        "Lineage",
        "ErrorBody",
        "AliasView",
        "AliasHistoryView",
        "SetAlias",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    // The alias routes state their rule and every status they answer.
    let alias_route = &doc["paths"]["/api/v1/models/{name}/aliases/{alias}"];
    let alias_param = alias_route["put"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "alias")
        .unwrap();
    assert_eq!(
        alias_param["schema"]["pattern"],
        edgeloop_api::aliases::ALIAS_PATTERN
    );
    for (method, codes) in [
        (
            "put",
            &["200", "201", "400", "401", "403", "404", "409", "413"][..],
        ),
        ("get", &["200", "400", "401", "403", "404"][..]),
        ("delete", &["204", "400", "401", "403", "404"][..]),
    ] {
        let responses = alias_route[method]["responses"].as_object().unwrap();
        let got: Vec<&str> = responses.keys().map(String::as_str).collect();
        assert_eq!(
            got, codes,
            "{method} /api/v1/models/{{name}}/aliases/{{alias}}"
        );
    }
    assert_eq!(
        doc["components"]["schemas"]["SetAlias"]["properties"]["version"]["pattern"],
        edgeloop_api::registry::VERSION_PATTERN
    );
    assert_eq!(
        doc["components"]["schemas"]["AliasName"]["pattern"],
        edgeloop_api::aliases::ALIAS_PATTERN
    );
    for (schema, field) in [
        ("CreateDeployment", "alias"),
        ("RetrainingConfig", "compare_with"),
    ] {
        let property = doc["components"]["schemas"][schema]["properties"][field].to_string();
        assert!(
            property.contains("#/components/schemas/AliasName"),
            "{schema}.{field}: {property}"
        );
    }
    // Every path parameter is a `{name}` of its path, and every `{name}` is
    // a declared path parameter: a query parameter declared "in: path" (as
    // `selector` of GET /api/v1/devices once was) fails OpenAPI validators.
    for (path, item) in doc["paths"].as_object().unwrap() {
        let in_template: std::collections::BTreeSet<&str> = path
            .split('{')
            .skip(1)
            .filter_map(|p| p.split('}').next())
            .collect();
        for (method, op) in item.as_object().unwrap() {
            let declared: std::collections::BTreeSet<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "path")
                .filter_map(|p| p["name"].as_str())
                .collect();
            assert_eq!(declared, in_template, "{method} {path}: path parameters");
        }
    }
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    devices_are_selected_by_labels_and_reported_capabilities
);
async fn devices_are_selected_by_labels_and_reported_capabilities(store: TestStore) {
    use edgeloop_client_core::session::enroll;
    use edgeloop_client_core::{IdentityStore, Role};
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(store.settings(&dir.path().join("cp"))).await;
    let devices = [
        (
            "cam-1",
            "berlin",
            vec!["CUDAExecutionProvider", "CPUExecutionProvider"],
        ),
        ("cam-2", "berlin", vec!["CPUExecutionProvider"]),
        ("cam-3", "paris", vec!["CPUExecutionProvider"]),
    ];
    for (name, site, providers) in &devices {
        let (status, body) = cp
            .api()
            .post(
                "/api/v1/tokens",
                json!({"kind": "device", "name": name, "labels": {"site": site}}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let token = body["token"].as_str().unwrap().parse().unwrap();
        let caps = edgeloop_proto::common::v1::Capabilities {
            arch: "aarch64".into(),
            execution_providers: providers.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        };
        enroll(
            Role::Device,
            &cp.grpc_url,
            &token,
            &IdentityStore::new(&dir.path().join(name)),
            caps,
        )
        .await
        .unwrap();
    }
    let select = |s: &'static str| {
        let api = cp.api();
        async move {
            let url = format!("/api/v1/devices?selector={}", urlencode(s));
            let (status, body) = api.get(&url).await;
            assert_eq!(status, 200, "{s}: {body}");
            let mut ids: Vec<String> = body
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(select("site=berlin").await, vec!["cam-1", "cam-2"]);
    assert_eq!(
        select("site=berlin,edgeloop.io/provider=CUDAExecutionProvider").await,
        vec!["cam-1"]
    );
    assert_eq!(select("site notin (berlin)").await, vec!["cam-3"]);
    assert_eq!(select("edgeloop.io/arch=aarch64").await.len(), 3);
    assert_eq!(select("").await.len(), 3);
    let (status, body) = cp
        .api()
        .get(&format!(
            "/api/v1/devices?selector={}",
            urlencode("site in (berlin")
        ))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "selector", "{body}");
    // Pages by id from the cursor, the selector applied on the way: the
    // two Berlin devices one page at a time, then an empty last page.
    let page = |after: Option<String>| {
        let api = cp.api();
        async move {
            let mut path = format!(
                "/api/v1/devices?limit=1&selector={}",
                urlencode("site=berlin")
            );
            if let Some(a) = after {
                path.push_str(&format!("&after={a}"));
            }
            let (body, next) = api.get_page(&path).await;
            let ids: Vec<String> = body
                .iter()
                .map(|d| d["id"].as_str().unwrap().to_string())
                .collect();
            (ids, next)
        }
    };
    let (first, next) = page(None).await;
    assert_eq!(first, ["cam-1"]);
    assert_eq!(
        next.as_deref(),
        Some("cam-1"),
        "a full page names its cursor"
    );
    let (second, next) = page(next).await;
    assert_eq!(second, ["cam-2"]);
    let (third, next) = page(next).await;
    assert!(third.is_empty() && next.is_none(), "{third:?} {next:?}");
    for bad in ["0", "1001", "x"] {
        let (status, body) = cp.api().get(&format!("/api/v1/devices?limit={bad}")).await;
        assert_eq!(status, 400, "limit={bad}: {body}");
    }
    cp.stop().await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Reads every page of `path` (`limit` 2) and the cursor each named.
async fn all_pages(api: &Api, path: &str, key: &str) -> (Vec<String>, Vec<String>) {
    let (mut ids, mut cursors, mut after) = (Vec::new(), Vec::new(), None::<String>);
    for _ in 0..10 {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut page = format!("{path}{sep}limit=2");
        if let Some(a) = &after {
            page.push_str(&format!("&after={a}"));
        }
        let (items, next) = api.get_page(&page).await;
        ids.extend(items.iter().map(|v| v[key].as_str().unwrap().to_string()));
        match next {
            Some(n) => {
                cursors.push(n.clone());
                after = Some(n);
            }
            None => return (ids, cursors),
        }
    }
    panic!("{path}: more than 10 pages of 2");
}

on_each_store!(
    #[tokio::test]
    jobs_deployments_and_pipelines_page_by_key_range
);
async fn jobs_deployments_and_pipelines_page_by_key_range(store: TestStore) {
    use edgeloop_control_plane::lifecycle::pipeline::{Pipeline, PipelineState, Step};
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(store.settings(&dir.path().join("cp"))).await;
    let api = cp.api();

    // Jobs: id order from the cursor, each once, the same set as the whole list.
    for name in ["c-job", "a-job", "b-job"] {
        let spec = json!({"name": name, "command": ["true"]});
        assert_eq!(api.post("/api/v1/jobs", json!({"spec": spec})).await.0, 201);
    }
    let (paged, cursors) = all_pages(&api, "/api/v1/jobs", "id").await;
    let mut whole: Vec<String> = api
        .get("/api/v1/jobs")
        .await
        .1
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    whole.sort();
    assert_eq!(paged, whole, "id order, every job once");
    assert_eq!(
        cursors.len(),
        1,
        "the full page names a cursor, the short last one none"
    );
    assert!(
        paged[0].starts_with("a-job-") && paged[2].starts_with("c-job-"),
        "{paged:?}"
    );

    // Deployments: newest first from the cursor down.
    let digest = cp.upload(b"weights").await;
    assert_eq!(
        api.post("/api/v1/models", json!({"name": "m"})).await.0,
        201
    );
    let (s, b) = api
        .post(
            "/api/v1/models/m/versions",
            json!({"version": "1.0.0", "artifact_digest": digest.to_string()}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    for site in ["x", "y", "z"] {
        let token = cp
            .labelled_token("device", &format!("cam-{site}"), json!({"site": site}))
            .await;
        cp.enroll(
            edgeloop_client_core::Role::Device,
            &token,
            &dir.path().join(site),
        )
        .await;
    }
    let mut created = Vec::new();
    for site in ["x", "y", "z"] {
        let (s, d) = api
            .post(
                "/api/v1/deployments",
                json!({"model": "m", "version": "1.0.0", "selector": format!("site={site}")}),
            )
            .await;
        assert_eq!(s, 201, "{d}");
        created.push(d["id"].as_str().unwrap().to_string());
    }
    created.reverse();
    let (paged, _) = all_pages(&api, "/api/v1/deployments", "id").await;
    assert_eq!(paged, created, "newest first, each once");
    let whole: Vec<String> = api
        .get("/api/v1/deployments")
        .await
        .1
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(whole, created, "without limit, every one as before");

    // Pipelines (records written as the runner writes them; ended, so it
    // leaves them be): newest first, the model filter applied on the way.
    for (id, model) in [
        ("p-00000001", "m"),
        ("p-00000002", "other"),
        ("p-00000003", "m"),
        ("p-00000004", "m"),
    ] {
        let (mut p, _) = Pipeline::new(id.into(), model.into(), "manual".into(), 0);
        p.state = PipelineState::Cancelled {
            step: Step::BuildDataset,
        };
        cp.core.store.lifecycle.pipelines.insert(id, &p).unwrap();
    }
    let (paged, _) = all_pages(&api, "/api/v1/pipelines?model=m", "id").await;
    assert_eq!(paged, ["p-00000004", "p-00000003", "p-00000001"]);
    let (paged, _) = all_pages(&api, "/api/v1/pipelines", "id").await;
    assert_eq!(paged.len(), 4);

    for path in ["/api/v1/jobs", "/api/v1/deployments", "/api/v1/pipelines"] {
        let long_cursor = format!("after={}", "a".repeat(1025));
        for bad in ["limit=0", "limit=1001", "limit=x", &long_cursor] {
            let (status, body) = api.get(&format!("{path}?{bad}")).await;
            assert_eq!(status, 400, "{path}?{bad}: {body}");
        }
    }
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    store_call_times_are_in_the_metrics_by_lane
);
/// On PostgreSQL, `/metrics` tells how long store calls waited for a
/// connection, ran, and took in all, apart for the urgent lane (a
/// heartbeat's calls) and the rest; sled has no queue and no such series.
async fn store_call_times_are_in_the_metrics_by_lane(store: TestStore) {
    use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(store.settings(&dir.path().join("cp"))).await;
    let token = cp.labelled_token("device", "m-1", json!({})).await;
    let mut agent = AgentServiceClient::new(
        cp.connect(
            edgeloop_client_core::Role::Device,
            &token,
            &dir.path().join("m-1"),
        )
        .await,
    );
    agent
        .heartbeat(edgeloop_proto::common::v1::HeartbeatRequest::default())
        .await
        .unwrap();
    let text = reqwest::get(format!("{}/metrics", cp.http_base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |name: &str, lane: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_count{{lane=\"{lane}\"}} ")))
            .map(|v| v.parse().unwrap())
    };
    for name in [
        "edgeloop_store_wait_seconds",
        "edgeloop_store_run_seconds",
        "edgeloop_store_call_seconds",
    ] {
        if store.url().is_some() {
            for lane in ["urgent", "normal"] {
                assert!(
                    count(name, lane).is_some_and(|n| n >= 1),
                    "{name} {lane}: {text}"
                );
            }
            assert!(
                text.contains(&format!("{name}_bucket{{lane=\"urgent\",le=\"+Inf\"}}")),
                "{text}"
            );
        } else {
            assert!(!text.contains(name), "sled has no store queue: {text}");
        }
    }
    cp.stop().await;
}

on_each_store!(
    #[tokio::test]
    heartbeats_move_last_seen_through_the_batched_writer_and_a_stop_keeps_them
);
/// A heartbeat whose only change is a stale `last_seen` is written with the
/// next batch (within a quarter of a second), and one noted just before a
/// graceful stop is not lost: the restarted control plane shows it.
async fn heartbeats_move_last_seen_through_the_batched_writer_and_a_stop_keeps_them(
    store: TestStore,
) {
    use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let settings = store.settings(&dir.path().join("cp"));
    let cp = ControlPlane::start_with(settings.clone()).await;
    let token = cp.labelled_token("device", "hb-1", json!({})).await;
    let channel = cp
        .connect(
            edgeloop_client_core::Role::Device,
            &token,
            &dir.path().join("hb-1"),
        )
        .await;
    let seen = |body: &Value| {
        time::OffsetDateTime::parse(
            body["last_seen"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    let beat = || {
        let mut agent = AgentServiceClient::new(channel.clone());
        async move {
            agent
                .heartbeat(edgeloop_proto::common::v1::HeartbeatRequest::default())
                .await
                .unwrap();
        }
    };
    let (_, enrolled) = cp.api().get("/api/v1/devices/hb-1").await;
    // Past half the offline window (3 intervals of 1 s): the write is due.
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let sent = time::OffsetDateTime::now_utc();
    beat().await;
    let refreshed = edgeloop_tests::eventually(
        std::time::Duration::from_secs(5),
        "last_seen written by the batch",
        || async {
            let (_, d) = cp.api().get("/api/v1/devices/hb-1").await;
            (seen(&d) > seen(&enrolled)).then_some(d)
        },
    )
    .await;
    assert!(
        seen(&refreshed) >= sent - time::Duration::seconds(1),
        "{refreshed}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let sent = time::OffsetDateTime::now_utc();
    beat().await;
    let cp = cp.restart(settings).await;
    let (_, after) = cp.api().get("/api/v1/devices/hb-1").await;
    assert!(
        seen(&after) >= sent - time::Duration::seconds(1),
        "the last refresh survived the stop: {after}"
    );
    cp.stop().await;
}
