//! The web console (issue #18) against a live control plane with enrolled
//! devices, in a real browser (Debian's `chromium` through `chromedriver`,
//! `scripts/fetch-chromium.sh`), plus its HTTP-level guarantees checked
//! with a plain client: sessions in HttpOnly SameSite cookies, CSRF on
//! every form that changes something, and roles as the API enforces them.
//! Screenshots of each page go to `$EDGELOOP_SCREENSHOTS`, or
//! `target/console-screenshots`.

use std::time::Duration;

use edgeloop_client_core::Role;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::common::v1::{Capabilities, HeartbeatRequest};
use edgeloop_tests::browser;
use edgeloop_tests::{eventually, ControlPlane};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// Three devices that have enrolled and beaten once (two in Berlin, one in
/// Paris), a model version, its hard examples (four real MNIST digits and
/// a tabular row, reported by edge-berlin-1), and a deployment to Berlin
/// that stays in its first wave (no agent runs to take it). Returns the
/// deployment's id.
async fn fleet(cp: &ControlPlane, dir: &std::path::Path) -> String {
    let mut agents = Vec::new();
    for (name, site) in [
        ("edge-berlin-1", "berlin"),
        ("edge-berlin-2", "berlin"),
        ("edge-paris-1", "paris"),
    ] {
        let token = cp
            .labelled_token("device", name, json!({"site": site}))
            .await;
        let identity = cp.enroll(Role::Device, &token, &dir.join(name)).await;
        let mut agent = AgentServiceClient::new(
            edgeloop_client_core::tls::mtls_endpoint(&cp.grpc_url, &identity)
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
        agent.heartbeat(beat()).await.unwrap();
        agents.push(agent);
    }
    let api = cp.api();
    let digest = cp.upload(&[7u8; 1024]).await;
    let (s, b) = api.post("/api/v1/models", json!({"name": "digits"})).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = api
        .post(
            "/api/v1/models/digits/versions",
            json!({"version": "1.0.0", "artifact_digest": digest.to_string()}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    report_hard_examples(cp, &mut agents[0]).await;
    // The devices stay online as agents do, by heartbeating every interval
    // (1 s here; offline after 3): one beat, then the slow set-up of a
    // loaded machine, had the fleet page show them offline.
    tokio::spawn(async move {
        loop {
            for agent in &mut agents {
                let _ = agent.heartbeat(beat()).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    deploy(cp, "berlin").await
}

/// An agent's heartbeat: CPU only, with room for the version (the
/// compatibility check would skip a device without it).
fn beat() -> HeartbeatRequest {
    HeartbeatRequest {
        sent_at: None,
        capabilities: Some(Capabilities {
            agent_version: "0.1.0".into(),
            execution_providers: vec!["CPUExecutionProvider".into()],
            free_disk_bytes: 1 << 30,
            ..Default::default()
        }),
    }
}

/// Hard examples the model was unsure of, as edge-berlin-1 reports them:
/// [`DIGITS`] real MNIST digits (`[1, 784]` float32, predicted 0..3 at
/// 31 %) and one tabular row of 8 features.
async fn report_hard_examples(
    cp: &ControlPlane,
    agent: &mut AgentServiceClient<tonic::transport::Channel>,
) {
    use edgeloop_proto::agent::v1 as pb;
    cp.assigned("edge-berlin-1", "digits", "1.0.0");
    let digits = edgeloop_tests::mnist::digits(DIGITS);
    let sample = |i: usize, shape: Vec<u64>, data: Vec<u8>| pb::Sample {
        kind: pb::SampleKind::HardExample as i32,
        model_name: "digits".into(),
        model_version: "1.0.0".into(),
        request_id: format!("r{i}"),
        observed_at: Some(edgeloop_proto::Timestamp {
            seconds: 1_796_083_200 + i as i64,
            nanos: 0,
        }),
        inputs: vec![pb::SampleTensor {
            name: "input".into(),
            dtype: "float32".into(),
            shape,
            data,
        }],
        predicted_class: Some(i as i64),
        confidence: Some(0.31),
        label: None,
    };
    let mut samples: Vec<pb::Sample> = digits
        .outer_iter()
        .enumerate()
        .map(|(i, d)| {
            let bytes = d.iter().flat_map(|v| v.to_le_bytes()).collect();
            sample(i, vec![1, 784], bytes)
        })
        .collect();
    let row = (0..8u8).flat_map(|v| f32::from(v).to_le_bytes()).collect();
    samples.push(sample(DIGITS, vec![1, 8], row));
    agent
        .report_telemetry(pb::TelemetryReport {
            sequence: 1,
            samples,
            ..Default::default()
        })
        .await
        .unwrap();
}

const DIGITS: usize = 4;

/// A deployment to one site's devices. A newer one to the same devices
/// supersedes an unfinished one, so each test's live deployments go to
/// different sites.
async fn deploy(cp: &ControlPlane, site: &str) -> String {
    let (s, b) = cp
        .api()
        .post(
            "/api/v1/deployments",
            json!({"model": "digits", "version": "1.0.0", "selector": format!("site={site}"),
                   "strategy": {"waves": {"percent": [50, 100]}, "wave_timeout_seconds": 3600}}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    b["id"].as_str().unwrap().to_string()
}

async fn api_token(cp: &ControlPlane, name: &str, role: &str) -> String {
    let (s, b) = cp
        .api()
        .post("/api/v1/api-tokens", json!({"name": name, "role": role}))
        .await;
    assert_eq!(s, 201, "{b}");
    b["token"].as_str().unwrap().to_string()
}

/// A form's body, each value encoded.
fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser::required("the console") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let first = fleet(&cp, dir.path()).await;
    let second = deploy(&cp, "paris").await;
    let deployer = api_token(&cp, "ui-deployer", "deployer").await;
    let viewer = api_token(&cp, "ui-viewer", "viewer").await;
    let trainer = api_token(&cp, "ui-trainer", "trainer").await;
    let base = cp.api().url("");
    let base = base.trim_end_matches('/');

    let driver = browser::Driver::start(&chromedriver).await.unwrap();
    let b = driver.browser(&chromium).await.unwrap();
    b.log_in(base, &deployer).await.unwrap();

    // The fleet: every device, online, with its labels and runtime.
    assert!(b.url().await.unwrap().ends_with("/ui/fleet"));
    let table = b.text("table.data").await.unwrap();
    for d in [
        "edge-berlin-1",
        "edge-berlin-2",
        "edge-paris-1",
        "site=paris",
        "CPU",
    ] {
        assert!(
            table.contains(d),
            "{d} missing from the fleet table:\n{table}"
        );
    }
    assert_eq!(b.find_all("tbody .badge.good").await.unwrap().len(), 3);
    b.page_shot("fleet.png").await.unwrap();
    // The check finds what it is for: grey text on white (2.3:1).
    b.script(
        "const p = document.createElement('p'); p.id = 'faint'; p.style.color = '#aaaaaa';
         p.textContent = 'faint text'; document.querySelector('main').append(p);",
    )
    .await
    .unwrap();
    let failures = b.contrast_failures().await.unwrap();
    assert!(
        failures.len() == 1 && failures[0].starts_with("p \"faint text\": 2.32"),
        "{failures:?}"
    );
    b.script("document.getElementById('faint').remove()")
        .await
        .unwrap();
    // The session is not the token, and no script can read it.
    let cookies = b.script("return document.cookie").await.unwrap();
    assert_eq!(cookies, json!(""), "the session cookie is HttpOnly");
    assert!(!b.url().await.unwrap().contains(&deployer));

    // Filtering by label selector, on the server.
    let selector = b.find("#selector", WAIT).await.unwrap();
    b.type_into(&selector, "site=paris\u{E007}").await.unwrap();
    b.wait_for_text("table.data caption", "1 devices", WAIT)
        .await
        .unwrap();
    let table = b.text("table.data").await.unwrap();
    assert!(
        table.contains("edge-paris-1") && !table.contains("edge-berlin"),
        "{table}"
    );
    // A selector with a typo: the API's message, on the page.
    let selector = b.find("#selector", WAIT).await.unwrap();
    b.clear(&selector).await.unwrap();
    b.type_into(&selector, "site in (berlin\u{E007}")
        .await
        .unwrap();
    b.find("p.error", WAIT).await.unwrap();

    // Keyboard: the first Tab reaches the skip link. (Pressed once the
    // page is there: a Tab sent while it still loads is lost under load.)
    b.goto(&format!("{base}/ui/fleet")).await.unwrap();
    b.find(".skip", WAIT).await.unwrap();
    b.keys("\u{E004}").await.unwrap(); // Tab
    let focused = b
        .script("return document.activeElement.className")
        .await
        .unwrap();
    assert_eq!(focused, json!("skip"));

    // Models: the version, its aliases, its lineage (an uploaded version:
    // no job or dataset), the deployments that carry it.
    let (st, body) = cp
        .api()
        .put(
            "/api/v1/models/digits/aliases/production",
            json!({"version": "1.0.0"}),
        )
        .await;
    assert_eq!(st, 201, "{body}");
    b.goto(&format!("{base}/ui/models")).await.unwrap();
    let link = b.find("a[href='/ui/models/digits']", WAIT).await.unwrap();
    b.click(&link).await.unwrap();
    let aliases = b.text("table.data").await.unwrap();
    assert!(
        aliases.contains("production") && aliases.contains("1.0.0"),
        "{aliases}"
    );
    let heading = b.text("[id='v-1.0.0']").await.unwrap();
    assert!(heading.contains("production"), "{heading}");
    let lineage = b.text("ol.lineage").await.unwrap();
    for want in [
        "dataset snapshot",
        "training job",
        "artifacts",
        &first,
        "wave",
    ] {
        assert!(
            lineage.contains(want),
            "{want} missing from the lineage:\n{lineage}"
        );
    }
    b.page_shot("model.png").await.unwrap();
    // Its drift page says why there is nothing to chart: the API's reason.
    b.goto(&format!("{base}/ui/models/digits/drift"))
        .await
        .unwrap();
    b.wait_for_text("p.error", "no reference statistics", WAIT)
        .await
        .unwrap();

    // Pipelines and jobs: a job waiting for a bridge, and its page.
    let job = cp
        .submit_job(json!({"name": "train-digits", "command": ["true"]}))
        .await;
    b.goto(&format!("{base}/ui/pipelines")).await.unwrap();
    let link = b
        .find(&format!("a[href='/ui/jobs/{job}']"), WAIT)
        .await
        .unwrap();
    assert!(b.text("main").await.unwrap().contains("train-digits"));
    b.click(&link).await.unwrap();
    b.wait_for_text("main", "queued", WAIT).await.unwrap();
    b.wait_for_text("main", "No metrics reported yet", WAIT)
        .await
        .unwrap();

    // A deployment, live, and cancelled from its page.
    b.goto(&format!("{base}/ui/deployments")).await.unwrap();
    let link = b
        .find(&format!("a[href='/ui/deployments/{first}']"), WAIT)
        .await
        .unwrap();
    b.click(&link).await.unwrap();
    b.wait_for_text("#live", "wave", WAIT).await.unwrap();
    let waves = b.text("#live table.data").await.unwrap();
    assert!(
        waves.contains("moving") || waves.contains("waiting"),
        "{waves}"
    );
    b.page_shot("deployment-live.png").await.unwrap();
    let cancel = b.find("button.danger", WAIT).await.unwrap();
    b.click(&cancel).await.unwrap();
    b.wait_for_text("#live .state", "cancelled", WAIT)
        .await
        .unwrap();
    assert!(b.find_all("button.danger").await.unwrap().is_empty());
    b.page_shot("deployment-cancelled.png").await.unwrap();
    let (_, d) = cp.api().get(&format!("/api/v1/deployments/{first}")).await;
    assert_eq!(d["state"], "cancelled", "{d}");
    // The cancel is in the audit log under the deployer's token.
    let (_, audit) = cp.api().get("/api/v1/audit").await;
    let entries = audit.as_array().cloned().unwrap_or_default();
    assert!(
        entries
            .iter()
            .any(|e| e["route"] == "/api/v1/deployments/{id}/cancel"
                && e["token_name"] == "ui-deployer"),
        "{audit}"
    );

    // The live part follows a change made elsewhere without a reload.
    b.goto(&format!("{base}/ui/deployments/{second}"))
        .await
        .unwrap();
    b.wait_for_text("#live .state", "wave", WAIT).await.unwrap();
    let (s, body) = cp
        .api()
        .post(&format!("/api/v1/deployments/{second}/cancel"), json!({}))
        .await;
    assert_eq!(s, 200, "{body}");
    b.wait_for_text("#live .state", "cancelled", WAIT)
        .await
        .unwrap();

    // Log out: the session is gone, the console asks to log in again.
    let logout = b.find("header form button", WAIT).await.unwrap();
    b.click(&logout).await.unwrap();
    b.find("#token", WAIT).await.unwrap();
    b.goto(&format!("{base}/ui/deployments")).await.unwrap();
    b.find("#token", WAIT).await.unwrap();

    // A viewer sees no action, and is refused if it tries anyway.
    let third = deploy(&cp, "berlin").await;
    b.log_in(base, &viewer).await.unwrap();
    b.goto(&format!("{base}/ui/deployments/{third}"))
        .await
        .unwrap();
    b.wait_for_text("#live .state", "wave", WAIT).await.unwrap();
    assert!(
        b.find_all("button.danger").await.unwrap().is_empty(),
        "a viewer is shown no Cancel"
    );
    let status = b
        .script(&format!(
            "const csrf = document.querySelector('input[name=csrf]').value;
             return fetch('/ui/deployments/{third}/cancel', {{method: 'POST',
               headers: {{'content-type': 'application/x-www-form-urlencoded'}},
               body: 'csrf=' + encodeURIComponent(csrf)}}).then(r => r.status);"
        ))
        .await
        .unwrap();
    assert_eq!(status, json!(403), "a viewer's cancel is refused");
    let (_, d) = cp.api().get(&format!("/api/v1/deployments/{third}")).await;
    assert_ne!(d["state"], "cancelled");
    b.page_shot("viewer-deployment.png").await.unwrap();
    // The viewer sees the labelling queue but no field or button, and
    // its POST is refused.
    b.goto(&format!("{base}/ui/models/digits/labelling"))
        .await
        .unwrap();
    b.find("img.sample-image", WAIT).await.unwrap();
    assert!(b.find_all("input[type=number]").await.unwrap().is_empty());
    assert!(b.find_all("button[value=accept]").await.unwrap().is_empty());
    let status = b
        .script(
            "const csrf = document.querySelector('input[name=csrf]').value;
             return fetch('/ui/models/digits/labelling', {method: 'POST',
               headers: {'content-type': 'application/x-www-form-urlencoded'},
               body: 'action=accept&predicted.x=1&csrf=' + encodeURIComponent(csrf)}).then(r => r.status);",
        )
        .await
        .unwrap();
    assert_eq!(status, json!(403), "a viewer's labels are refused");

    // Labelling, as a trainer: the digits as images, the row as a table;
    // one class typed with the keyboard, then the rest accepted as
    // predicted in bulk.
    let logout = b.find("header form button", WAIT).await.unwrap();
    b.click(&logout).await.unwrap();
    b.find("#token", WAIT).await.unwrap();
    b.log_in(base, &trainer).await.unwrap();
    b.goto(&format!("{base}/ui/models/digits")).await.unwrap();
    let link = b
        .find("a[href='/ui/models/digits/labelling']", WAIT)
        .await
        .unwrap();
    b.click(&link).await.unwrap();
    b.find("ol.samples", WAIT).await.unwrap();
    let images = b
        .script(
            "return Array.from(document.querySelectorAll('img.sample-image'))
               .map(i => [i.complete, i.naturalWidth, i.naturalHeight]);",
        )
        .await
        .unwrap();
    assert_eq!(
        images,
        json!(vec![json!([true, 28, 28]); DIGITS]),
        "each digit is a decoded 28×28 image"
    );
    let row = b.text("ol.samples table.row").await.unwrap();
    assert!(row.contains("7.0000"), "the tabular row's values: {row}");
    // The first field has the focus: type, Tab past nothing but fields.
    let focused = b.script("return document.activeElement.id").await.unwrap();
    assert_eq!(focused, json!("label-0"));
    b.keys("9\u{E004}").await.unwrap(); // 9, Tab
    let focused = b.script("return document.activeElement.id").await.unwrap();
    assert_eq!(focused, json!("label-1"), "Tab goes to the next sample");
    b.page_shot("labelling.png").await.unwrap();
    let accept = b.find("button[value='accept']", WAIT).await.unwrap();
    b.click(&accept).await.unwrap();
    b.wait_for_text("p.notice", "Labelled 5 samples", WAIT)
        .await
        .unwrap();
    b.wait_for_text("main", "No unlabelled hard examples", WAIT)
        .await
        .unwrap();
    let (_, labelled) = cp
        .api()
        .get("/api/v1/models/digits/samples?state=labelled")
        .await;
    let mut got: Vec<(String, i64, String)> = labelled
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["request_id"].as_str().unwrap().to_string(),
                s["label"].as_i64().unwrap(),
                s["labelled_by"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    // Labelled by the trainer's token (its id, as the API records it).
    let (_, tokens) = cp.api().get("/api/v1/api-tokens").await;
    let trainer_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ui-trainer")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let want: Vec<(String, i64, String)> = (0..=DIGITS)
        .map(|i| {
            // The typed class wins over the first digit's prediction (0).
            let label = if i == 0 { 9 } else { i as i64 };
            (format!("r{i}"), label, trainer_id.clone())
        })
        .collect();
    assert_eq!(got, want);

    b.close().await.unwrap();
    drop(driver);
    cp.stop().await;
}

/// What needs no browser: cookies, CSRF, headers, bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_csrf_and_headers_hold_over_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let id = fleet(&cp, dir.path()).await;
    let deployer = api_token(&cp, "http-deployer", "deployer").await;
    let base = cp.api().url("");
    let base = base.trim_end_matches('/').to_string();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // No session: every page sends the browser to log in.
    for page in [
        "/ui/fleet",
        "/ui/deployments",
        &format!("/ui/deployments/{id}"),
    ] {
        let r = http.get(format!("{base}{page}")).send().await.unwrap();
        assert_eq!(r.status(), 303, "{page}");
        let to = r.headers()["location"].to_str().unwrap();
        assert!(to.starts_with("/ui/login?next="), "{page} -> {to}");
    }
    // A wrong token: 401, no cookie.
    let r = http
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "elk1_not-a-token")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    // An empty or huge one: 400.
    for bad in [String::new(), "x".repeat(10_000)] {
        let r = http
            .post(format!("{base}/ui/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("token", bad.as_str())]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }
    // The right one: a session cookie, HttpOnly and SameSite=Strict, and a
    // redirect only to a console page.
    let r = http
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[
            ("token", deployer.as_str()),
            ("next", "https://evil.example/"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/fleet");
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    assert!(!cookie.contains(&deployer), "the cookie is not the token");
    let session = cookie.split(';').next().unwrap().to_string();

    // A page: the headers that keep other origins out.
    let r = http
        .get(format!("{base}/ui/deployments/{id}"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    assert_eq!(r.headers()["cache-control"], "no-store");
    let page = r.text().await.unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();

    // A form without the session's CSRF value changes nothing.
    for wrong in ["", "0000", &"f".repeat(64)] {
        let r = http
            .post(format!("{base}/ui/deployments/{id}/cancel"))
            .header("cookie", &session)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("csrf", wrong)]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "csrf {wrong:?}");
    }
    let (_, d) = cp.api().get(&format!("/api/v1/deployments/{id}")).await;
    assert_ne!(d["state"], "cancelled");
    // With it, the cancel goes through.
    let r = http
        .post(format!("{base}/ui/deployments/{id}/cancel"))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", csrf.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let api = cp.api();
    eventually(WAIT, "the deployment cancelled", || async {
        let (_, d) = api.get(&format!("/api/v1/deployments/{id}")).await;
        (d["state"] == "cancelled").then_some(())
    })
    .await;

    // Ids from the URL are checked before anything else.
    let r = http
        .get(format!("{base}/ui/deployments/..%2F..%2Fapi"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .get(format!("{base}/ui/deployments/d-999999"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // Revoking the token ends its sessions.
    let (_, tokens) = cp.api().get("/api/v1/api-tokens").await;
    let token_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "http-deployer")
        .map(|t| t["id"].as_str().unwrap().to_string())
        .unwrap();
    let (s, _) = cp
        .api()
        .send(cp.api().request(
            reqwest::Method::DELETE,
            &format!("/api/v1/api-tokens/{token_id}"),
        ))
        .await;
    assert!(s.is_success(), "{s}");
    let r = http
        .get(format!("{base}/ui/fleet"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "a revoked token's session is over");

    // The assets are ours and compiled in.
    let r = http
        .get(format!("{base}/ui/assets/console.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let r = http
        .get(format!("{base}/ui/assets/../admin.token"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    cp.stop().await;
}
