//! The Helm chart at `deploy/helm/edgeloop`, rendered and linted by Helm v4
//! itself (its Go SDK in the `helm-python-sdk` wheel, `scripts/helm-env.sh`;
//! no registry has a `helm` binary for this machine) with both value sets:
//! the embedded StatefulSet and the scaled Deployment on PostgreSQL and S3.
//! Every rendered object is read into its Kubernetes API type
//! (`k8s-openapi`, the types the bridge's engine uses) and written back: a
//! field the API does not have would be lost on the way, so the two must be
//! equal. Values that cannot work are refused by the render, naming the
//! value. And the shared Secret the chart generates on first install (an
//! Ed25519 CA, the admin token, the manifest signing key) is what a control
//! plane really runs on: placed in a data dir as the pod mounts it, the
//! control plane serves TLS from that CA, takes that admin token, and an
//! agent enrolls.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use edgeloop_tests::{eventually, ControlPlane};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{json, Value};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn helm_python() -> PathBuf {
    let python = edgeloop_models::deps::dir()
        .unwrap()
        .join("helm/bin/python");
    assert!(
        python.exists(),
        "{}: run scripts/helm-env.sh (scripts/test.sh does)",
        python.display()
    );
    python
}

/// Renders the chart with `values`: the objects by kind and name, with the
/// lint report; or Helm's refusal.
fn render(values: &Value) -> Result<(Vec<Value>, Value), String> {
    let out = Command::new(helm_python())
        .arg(repo().join("tests/fixtures/helm_render.py"))
        .arg(repo().join("deploy/helm/edgeloop"))
        .args(["edge", "mlops", &values.to_string()])
        .output()
        .unwrap();
    if out.status.code() == Some(3) {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut objects = Vec::new();
    for (template, text) in rendered["manifests"].as_object().unwrap() {
        if template.ends_with("NOTES.txt") {
            continue;
        }
        for doc in serde_yaml::Deserializer::from_str(text.as_str().unwrap()) {
            let value: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{template}: not YAML: {e}"));
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    Ok((objects, rendered["lint"].clone()))
}

/// `object` read into `T` and written back is `object`: nothing in it is
/// unknown to the Kubernetes API type.
fn strictly<T: serde::de::DeserializeOwned + serde::Serialize>(object: &Value) -> T {
    let typed: T = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("{}: {e}\n{object:#}", object["kind"]));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        &back, object,
        "{} {}: a field the API does not know was dropped",
        object["kind"], object["metadata"]["name"]
    );
    typed
}

/// The objects by `kind/name`, each checked against its API type.
fn checked(objects: &[Value]) -> BTreeMap<String, Value> {
    let mut by_name = BTreeMap::new();
    for o in objects {
        match (
            o["apiVersion"].as_str().unwrap(),
            o["kind"].as_str().unwrap(),
        ) {
            ("apps/v1", "StatefulSet") => drop(strictly::<StatefulSet>(o)),
            ("apps/v1", "Deployment") => drop(strictly::<Deployment>(o)),
            ("v1", "Service") => drop(strictly::<Service>(o)),
            ("v1", "Secret") => drop(strictly::<Secret>(o)),
            ("networking.k8s.io/v1", "NetworkPolicy") => drop(strictly::<NetworkPolicy>(o)),
            // A CRD of the Prometheus Operator: no type here; its fields
            // are checked by the tests below.
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {}
            (api, kind) => panic!("an object the chart should not make: {api} {kind}"),
        }
        let key = format!(
            "{}/{}",
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap()
        );
        assert!(
            by_name.insert(key.clone(), o.clone()).is_none(),
            "{key} twice"
        );
    }
    by_name
}

fn lint_errors(report: &Value) -> Vec<Value> {
    let mut errors: Vec<Value> = report["errors"].as_array().cloned().unwrap_or_default();
    errors.extend(
        report["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["severity"].as_u64() >= Some(2))
            .cloned(),
    );
    errors
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

fn args(workload: &Value) -> Vec<String> {
    container(workload)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_embedded_chart_is_one_statefulset_on_a_volume_hardened_and_probed() {
    let (objects, lint) = render(&json!({})).unwrap();
    assert_eq!(lint_errors(&lint), Vec::<Value>::new(), "{lint}");
    let all = checked(&objects);
    let names: Vec<&String> = all.keys().collect();
    assert_eq!(
        names,
        [
            "NetworkPolicy/edge-edgeloop",
            "Secret/edge-edgeloop-shared",
            "Service/edge-edgeloop-grpc",
            "Service/edge-edgeloop-headless",
            "Service/edge-edgeloop-http",
            "StatefulSet/edge-edgeloop",
        ]
    );
    let sts = &all["StatefulSet/edge-edgeloop"];
    assert_eq!(sts["spec"]["replicas"], 1);
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "20Gi"
    );
    let c = container(sts);
    assert_eq!(c["image"], "registry.example/edgeloop/control-plane:0.1.0");
    let a = args(sts);
    assert_eq!(
        &a[..6],
        [
            "serve",
            "--grpc-listen",
            "0.0.0.0:7443",
            "--http-listen",
            "0.0.0.0:8080",
            "--http-tls"
        ]
    );
    assert!(
        a.windows(2)
            .any(|w| w == ["--server-name", "edge-edgeloop-grpc.mlops.svc"]),
        "{a:?}"
    );
    assert!(!a.contains(&"--artifact-url".to_string()), "{a:?}");
    for (probe, path) in [
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"], path);
        assert_eq!(c[probe]["httpGet"]["scheme"], "HTTPS");
    }
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["limits"]["memory"].is_string());
    // The shared material lands where the control plane's data dir has it.
    let mounts: BTreeMap<String, String> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "shared")
        .map(|m| {
            (
                m["subPath"].as_str().unwrap().into(),
                m["mountPath"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        BTreeMap::from([
            ("admin.token".into(), "/var/lib/edgeloop/admin.token".into()),
            ("ca.crt".into(), "/var/lib/edgeloop/pki/ca.crt".into()),
            ("ca.key".into(), "/var/lib/edgeloop/pki/ca.key".into()),
            (
                "manifest-signing.key".into(),
                "/var/lib/edgeloop/keys/manifest-signing.key".into()
            ),
        ])
    );
    let shared_volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shared")
        .unwrap();
    assert_eq!(shared_volume["secret"]["defaultMode"], 0o400);
    let secret = &all["Secret/edge-edgeloop-shared"];
    assert_eq!(
        secret["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let http = &all["Service/edge-edgeloop-http"];
    assert_eq!(http["spec"]["ports"][0]["targetPort"], "http");
    let policy = &all["NetworkPolicy/edge-edgeloop"];
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], "grpc");
}

#[test]
fn the_scaled_chart_is_a_deployment_on_postgres_and_s3_with_metrics() {
    let values = json!({
        "mode": "scaled", "replicas": 3,
        "store": {"url": "postgres://edgeloop:pw@db.example/edgeloop?sslmode=require&sslrootcert=/ca.pem"},
        "artifacts": {"url": "s3://models/edgeloop", "existingSecret": "s3-credentials"},
        "serverNames": ["cp.example.com"],
        "metrics": {"serviceMonitor": {"enabled": true, "labels": {"release": "prom"}}},
        "networkPolicy": {"httpFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]},
    });
    let (objects, lint) = render(&values).unwrap();
    assert_eq!(lint_errors(&lint), Vec::<Value>::new(), "{lint}");
    let all = checked(&objects);
    assert!(!all.contains_key("StatefulSet/edge-edgeloop"));
    assert!(!all.contains_key("Service/edge-edgeloop-headless"));
    let deploy = &all["Deployment/edge-edgeloop"];
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert_eq!(
        deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let a = args(deploy);
    assert!(
        a.windows(2)
            .any(|w| w == ["--artifact-url", "s3://models/edgeloop"]),
        "{a:?}"
    );
    assert!(
        a.windows(2)
            .any(|w| w == ["--server-name", "cp.example.com"]),
        "{a:?}"
    );
    let c = container(deploy);
    // The database URL, password and all, only in a Secret.
    assert!(!deploy.to_string().contains("pw@db"), "{deploy}");
    let env = c["env"].as_array().unwrap();
    let store = env
        .iter()
        .find(|e| e["name"] == "EDGELOOP_STORE_URL")
        .unwrap();
    assert_eq!(
        store["valueFrom"]["secretKeyRef"]["name"],
        "edge-edgeloop-store"
    );
    let store_secret = &all["Secret/edge-edgeloop-store"];
    assert_eq!(
        store_secret["stringData"]["store-url"],
        "postgres://edgeloop:pw@db.example/edgeloop?sslmode=require&sslrootcert=/ca.pem"
    );
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], "s3-credentials");
    let data = deploy["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap();
    assert!(
        data["emptyDir"].is_object(),
        "the replicas keep nothing: {data}"
    );
    let monitor = &all["ServiceMonitor/edge-edgeloop"];
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(
        (&endpoint["port"], &endpoint["path"], &endpoint["scheme"]),
        (&json!("http"), &json!("/metrics"), &json!("https"))
    );
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["key"], "ca.crt");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    let policy = &all["NetworkPolicy/edge-edgeloop"];
    assert_eq!(
        policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]["team"],
        "ml"
    );
    // An existing shared Secret is used, not made.
    let (objects, _) = render(&json!({
        "mode": "scaled", "store": {"existingSecret": "db"}, "artifacts": {"url": "s3://b/p"},
        "shared": {"existingSecret": "edgeloop-pki"},
    }))
    .unwrap();
    let all = checked(&objects);
    assert!(
        !all.keys().any(|k| k.starts_with("Secret/")),
        "{:?}",
        all.keys()
    );
    let deploy = &all["Deployment/edge-edgeloop"];
    let shared = deploy["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shared")
        .unwrap();
    assert_eq!(shared["secret"]["secretName"], "edgeloop-pki");
}

#[test]
fn values_that_cannot_work_are_refused_naming_the_value() {
    for (values, names) in [
        (
            json!({"mode": "scaled", "artifacts": {"url": "s3://b/p"}}),
            "store.url",
        ),
        (
            json!({"mode": "scaled", "store": {"url": "postgres://h/db"}}),
            "artifacts.url",
        ),
        (json!({"mode": "cluster"}), "/mode"),
        (json!({"store": {"url": "mysql://h/db"}}), "/store/url"),
        (json!({"replicas": 0}), "/replicas"),
        (
            json!({"service": {"grpc": {"port": 70000}}}),
            "/service/grpc/port",
        ),
    ] {
        let refused = render(&values).expect_err(&values.to_string());
        assert!(refused.contains(names), "{values}: {refused}");
    }
}

/// The Secret the chart makes on first install runs a real control plane:
/// its CA signs the TLS the console is served with, its admin token is the
/// admin's, and an agent enrolls under the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_shared_secret_runs_a_control_plane_and_enrolls_an_agent() {
    let (objects, _) = render(&json!({})).unwrap();
    let secret = objects
        .iter()
        .find(|o| o["kind"] == "Secret")
        .expect("the shared Secret");
    let file = |key: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"][key].as_str().unwrap())
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cp");
    // As the pod mounts the Secret's keys into its data dir.
    for (key, path) in [
        ("ca.crt", "pki/ca.crt"),
        ("ca.key", "pki/ca.key"),
        ("admin.token", "admin.token"),
        ("manifest-signing.key", "keys/manifest-signing.key"),
    ] {
        let to = data.join(path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(&to, file(key)).unwrap();
    }
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        http_tls: true,
        ..edgeloop_tests::settings(&data)
    })
    .await;
    assert!(
        !cp.first_start,
        "the Secret's admin token was taken, not a new one"
    );
    assert_eq!(cp.admin_token.as_bytes(), file("admin.token"));
    // The console over TLS, trusted by the Secret's CA alone.
    let client = edgeloop_api::Client::with_trust(
        &cp.http_base,
        Some(cp.admin_token.clone()),
        Duration::from_secs(10),
        &edgeloop_api::Trust::CaPem(file("ca.crt")),
    )
    .unwrap();
    let models: Value = client.get("/api/v1/models").await.unwrap();
    assert_eq!(models, json!([]));
    // The CA is the Secret's, never replaced by one of the control plane's own.
    assert_eq!(
        std::fs::read(data.join("pki/ca.crt")).unwrap(),
        file("ca.crt")
    );

    let created: Value = client
        .post(
            "/api/v1/tokens",
            &json!({"kind": "device", "name": "helm-device"}),
        )
        .await
        .unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let agent_dir = dir.path().join("agent");
    let config =
        edgeloop_edge_agent::AgentConfig::new(cp.member_config(&agent_dir, Some(token)), vec![]);
    let agent = tokio::spawn(edgeloop_edge_agent::run(config, stop.clone()));
    eventually(Duration::from_secs(30), "the agent online", || async {
        let d: Value = client.get("/api/v1/devices/helm-device").await.ok()?;
        (d["status"] == "online").then_some(())
    })
    .await;
    stop.cancel();
    let _ = agent.await;
    cp.stop().await;
}
