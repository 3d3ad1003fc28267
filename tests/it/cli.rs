//! The `edgeloop` CLI against a real control plane on loopback: models and
//! versions with lineage, jobs (one followed to its end by `show --wait`
//! while a bridge reports over mTLS), devices by selector, drift, and the
//! cost report. The output checked is the text a person sees (tables) and
//! the `--json` a script parses; failures exit with their sysexits codes.
//!
//! The drift and cost data arrive as agents send them: enrolled devices
//! report telemetry (sketches and per-model request counts and latency)
//! over mTLS with `ReportTelemetry`, and `GET /api/v1/models/{name}/cost`
//! is checked against numbers worked out by hand from configured prices.
//!
//! Retraining: a policy set from a file, a real pipeline (dataset snapshot
//! from a base set and a device's labelled samples, then a training job
//! that a bridge leases over mTLS and reports failed) followed by
//! `pipeline show --wait` to its failure, coalescing, and cancel.
//!
//! Triggers: set from a file and shown with each condition in words; the
//! control plane's trigger task evaluates them on its tick, and `trigger
//! show` prints what it saw (labels from a device) and decided (a retrain
//! it started, then coalesced into).

use std::process::ExitCode;
use std::time::Duration;

use edgeloop_cli::api::ServerArgs;
use edgeloop_cli::trigger::{execute, TriggerCommand};
use edgeloop_client_core::Role;
use edgeloop_control_plane::config::{CostSettings, ServeSettings};
use edgeloop_models::manifest::ManifestKey;
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::bridge::v1::{JobState, LeaseJobRequest, ProgressReport};
use edgeloop_tests::weather::{self, at};
use edgeloop_tests::{eventually, free_port, settings, ControlPlane};
use serde_json::{json, Value};

/// The CLI as a control plane's admin (the tests' usual caller).
struct Admin {
    base: String,
    token: String,
}

impl Admin {
    fn of(cp: &ControlPlane) -> Admin {
        Admin {
            base: cp.http_base.clone(),
            token: cp.admin_token.clone(),
        }
    }

    async fn run(&self, args: &[&str]) -> (ExitCode, String) {
        edgeloop(&self.base, &self.token, args).await
    }

    async fn run_owned(&self, args: Vec<String>) -> (ExitCode, String) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args).await
    }
}

/// `edgeloop <args> --server <base> --token <token>`, in process; the exit
/// code and what it printed on stdout.
async fn edgeloop(base: &str, token: &str, args: &[&str]) -> (ExitCode, String) {
    let mut argv: Vec<String> = std::iter::once("edgeloop")
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    argv.extend([
        "--server".into(),
        base.into(),
        "--token".into(),
        token.into(),
    ]);
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let cli = clap::Parser::parse_from(argv);
        let code = edgeloop_cli::run_with(cli, &mut out).unwrap();
        (code, String::from_utf8(out).unwrap())
    })
    .await
    .unwrap()
}

/// The table row whose first cell is `first`.
fn row<'a>(out: &'a str, first: &str) -> &'a str {
    out.lines()
        .find(|l| l.split("  ").next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{out}"))
}

fn spec(name: &str) -> Value {
    json!({
        "name": name,
        "command": ["python3", "train.py"],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        "checkpoint": {"every_steps": 100, "keep_last": 2}
    })
}

fn progress(job: &str, state: JobState, step: u64) -> ProgressReport {
    edgeloop_tests::progress(job, 1, state, step)
}

#[tokio::test]
async fn models_jobs_and_devices_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let api = cp.api();
    let (base, admin) = (cp.http_base.clone(), cp.admin_token.clone());
    let as_admin = Admin::of(&cp);
    let run = |args: &'static [&'static str]| as_admin.run(args);

    // Models and versions, the second with its lineage.
    let (status, body) = api
        .post(
            "/api/v1/models",
            json!({"name": "digits", "task": "classification",
                   "description": "MNIST digits", "labels": {"team": "vision"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let v1 = cp.upload(b"digits model, version one").await;
    let v2 = cp.upload(b"digits model, version two").await;
    let dataset = Digest::of(b"the dataset snapshot");
    for body in [
        json!({"version": "1.0.0", "artifact_digest": v1.to_string(),
               "metrics": {"accuracy": 0.97}}),
        json!({"version": "2.0.0", "artifact_digest": v2.to_string(),
               "metrics": {"accuracy": 0.985},
               "lineage": {"parent_version": "1.0.0", "trigger": "drift",
                           "job": "mnist-0000abcd",
                           "dataset": dataset.to_string()}}),
    ] {
        let (status, body) = api.post("/api/v1/models/digits/versions", body).await;
        assert_eq!(status, 201, "{body}");
    }

    let (code, out) = run(&["model", "list"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let r = row(&out, "digits");
    assert!(
        r.contains("classification") && r.contains("team=vision"),
        "{out}"
    );
    assert!(r.contains("MNIST digits"), "{out}");

    let (code, out) = run(&["model", "show", "digits"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("task:         classification\n"), "{out}");
    let r = row(&out, "2.0.0");
    let hex = dataset.to_string();
    let short = &hex.strip_prefix("sha256:").unwrap_or(&hex)[..12];
    for want in ["1.0.0", "drift", "mnist-0000abcd", short, "accuracy=0.985"] {
        assert!(r.contains(want), "{want}: {out}");
    }
    assert!(row(&out, "1.0.0").contains("accuracy=0.97"), "{out}");
    let header = out.lines().find(|l| l.starts_with("VERSION")).unwrap();
    assert_eq!(header.find("TRIGGER"), r.find("drift"), "{out}");

    let (code, out) = run(&["model", "versions", "digits", "--json"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let versions: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(versions[1]["lineage"]["parent_version"], "1.0.0", "{out}");
    let (_, out) = run(&["model", "show", "digits", "--json"]).await;
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["model"]["name"], "digits");
    assert_eq!(shown["versions"].as_array().unwrap().len(), 2);
    assert_eq!(shown["aliases"], json!([]));
    // `show` lists the aliases too.
    let (status, body) = api
        .put(
            "/api/v1/models/digits/aliases/production",
            json!({"version": "2.0.0"}),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let (_, out) = run(&["model", "show", "digits"]).await;
    let r = row(&out, "production");
    assert!(r.contains("2.0.0") && r.contains("admin"), "{out}");

    // Jobs: one a bridge runs to the end while `show --wait` follows it,
    // one cancelled from the CLI while queued.
    let (status, job) = api
        .post("/api/v1/jobs", json!({"spec": spec("mnist")}))
        .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let mut bridge = BridgeServiceClient::new(
        cp.connect(
            Role::Cluster,
            &cp.token("cluster", "gpu-a").await,
            &dir.path().join("bridge"),
        )
        .await,
    );
    let leased = bridge
        .lease_job(LeaseJobRequest {
            wait_seconds: 1,
            engines: vec!["local".into()],
            running_jobs: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(leased.job.unwrap().id, id);
    bridge
        .report_progress(progress(&id, JobState::Running, 100))
        .await
        .unwrap();
    let waiting = {
        let (base, admin, id) = (base.clone(), admin.clone(), id.clone());
        tokio::spawn(async move { edgeloop(&base, &admin, &["job", "show", &id, "--wait"]).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "--wait returned while the job ran");
    bridge
        .report_progress(progress(&id, JobState::Succeeded, 200))
        .await
        .unwrap();
    let (code, out) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(out.contains("state:        succeeded\n"), "{out}");
    assert!(out.contains("leased by:    gpu-a\n"), "{out}");
    assert!(out.contains("loss=0.25"), "{out}");

    let (_, queued) = api
        .post("/api/v1/jobs", json!({"spec": spec("later")}))
        .await;
    let later = queued["id"].as_str().unwrap().to_string();
    let (code, out) = edgeloop(&base, &admin, &["job", "cancel", &later]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        out.contains("state:        cancelled (cancel requested)\n"),
        "{out}"
    );
    // Waiting on a job that did not succeed exits 1.
    let (code, _) = edgeloop(&base, &admin, &["job", "show", &later, "--wait"]).await;
    assert_eq!(code, ExitCode::FAILURE);
    let (code, out) = run(&["job", "list"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let r = row(&out, &id);
    assert!(
        r.contains("succeeded") && r.contains("200") && r.contains("gpu-a"),
        "{out}"
    );
    assert!(row(&out, &later).contains("cancelled"), "{out}");
    let (_, out) = run(&["job", "list", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Devices, by selector.
    for (name, site) in [("edge-berlin", "berlin"), ("edge-oslo", "oslo")] {
        let token = cp
            .labelled_token("device", name, json!({"site": site}))
            .await;
        cp.enroll(Role::Device, &token, &dir.path().join(name))
            .await;
    }
    let (code, out) = run(&["device", "list"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(row(&out, "edge-berlin").contains("site=berlin"), "{out}");
    assert!(row(&out, "edge-oslo").contains("site=oslo"), "{out}");
    let (code, out) = run(&["device", "list", "--selector", "site in (oslo)"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(row(&out, "edge-oslo").contains("site=oslo"), "{out}");
    let (code, out) = run(&["device", "show", "edge-berlin", "--json"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["labels"]["site"],
        "berlin"
    );
    let (_, out) = run(&["device", "show", "edge-oslo"]).await;
    assert!(out.starts_with("id:"), "{out}");
    assert!(out.contains("labels:      site=oslo\n"), "{out}");

    // Exit codes: 404 → EX_NOINPUT, 400 → EX_DATAERR, 401 → EX_NOPERM,
    // nothing listening → EX_UNAVAILABLE, a bad id → EX_USAGE.
    assert_eq!(run(&["model", "show", "nope"]).await.0, ExitCode::from(66));
    assert_eq!(
        run(&["model", "versions", "nope"]).await.0,
        ExitCode::from(66)
    );
    assert_eq!(run(&["job", "show", "nope-1"]).await.0, ExitCode::from(66));
    assert_eq!(run(&["device", "show", "nope"]).await.0, ExitCode::from(66));
    assert_eq!(
        run(&["device", "list", "--selector", "site in (("]).await.0,
        ExitCode::from(65)
    );
    assert_eq!(
        run(&["model", "show", "../tokens"]).await.0,
        ExitCode::from(64)
    );
    assert_eq!(
        edgeloop(&base, "wrong", &["model", "list"]).await.0,
        ExitCode::from(77)
    );
    assert_eq!(
        edgeloop(&base, "wrong", &["device", "list"]).await.0,
        ExitCode::from(77)
    );
    let dead = format!("http://127.0.0.1:{}", free_port());
    assert_eq!(
        edgeloop(&dead, &admin, &["job", "list"]).await.0,
        ExitCode::from(69)
    );
    assert_eq!(
        edgeloop(&dead, &admin, &["model", "list"]).await.0,
        ExitCode::from(69)
    );
    cp.stop().await;
}

/// One device's report for one window, as an agent sends it: the window,
/// the model's request count and latency, and its drift sketch.
fn report(
    sequence: u64,
    start: i64,
    requests: u64,
    latency: (f64, f64),
    temp: Option<([u64; 3], [u64; 2])>,
) -> pb::TelemetryReport {
    let sketches = temp
        .map(|(temp, classes)| weather::sketch(start, temp, classes))
        .into_iter()
        .collect();
    pb::TelemetryReport {
        sequence,
        recorded_at: at(start + 3599),
        window_start: at(start),
        window_end: at(start + 3599),
        models: vec![pb::ModelMetrics {
            model_name: "rain".into(),
            model_version: "1.0.0".into(),
            requests,
            errors: u64::from(latency.0 < 20.0),
            latency_p50_ms: latency.0,
            latency_p99_ms: latency.1,
            execution_provider: String::new(),
        }],
        sketches,
        ..Default::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[tokio::test]
async fn drift_and_cost_from_agent_telemetry() {
    let dir = tempfile::tempdir().unwrap();
    // Prices from the config, chosen so the edge cost is easy to check.
    let mut s = settings(&dir.path().join("cp"));
    s.cost = CostSettings {
        electricity_usd_per_kwh: Some(0.5),
        edge_idle_watts: Some(2.0),
        edge_busy_watts: Some(2.0),
        edge_hardware_usd: Some(360.0),
        edge_amortization_months: Some(36),
        cloud_instance_hourly_usd: Some(0.1),
        ..Default::default()
    };
    // Drift windows count what arrived when, by the control plane's clock:
    // a manual one, moved to each hour as its reports arrive.
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let at = |t: i64| time::OffsetDateTime::from_unix_timestamp(t).unwrap();
    let cp =
        ControlPlane::start_with_clock(s, edgeloop_control_plane::Clock::manual(at(now))).await;
    let api = cp.api();
    let base = cp.http_base.clone();
    let as_admin = Admin::of(&cp);
    let run = |args: &'static [&'static str]| as_admin.run(args);

    // The model, its version's signed manifest with reference statistics.
    for name in ["rain", "idle"] {
        let (status, body) = api.post("/api/v1/models", json!({"name": name})).await;
        assert_eq!(status, 201, "{body}");
    }
    let model = b"not a real model; drift and cost need only telemetry".to_vec();
    cp.register_signed(&ManifestKey::generate(), weather::manifest(&model), &model)
        .await;

    // Six hours just past: Berlin's weather shifts from the fourth hour,
    // Oslo's does not. Each device serves 500 requests an hour, Berlin at
    // 10 ms (p50), Oslo at 30 ms. Ten days ago Berlin had a busy hour
    // that only a 30-day look back sees.
    let base_hour = now - now.rem_euclid(3600) - 6 * 3600;
    for (site, shifts, latency) in [
        ("berlin", true, (10.0, 25.0)),
        ("oslo", false, (30.0, 45.0)),
    ] {
        let name = format!("edge-{site}");
        let token = cp
            .labelled_token("device", &name, json!({"site": site}))
            .await;
        let mut client = AgentServiceClient::new(
            cp.connect(Role::Device, &token, &dir.path().join(&name))
                .await,
        );
        cp.assigned(&name, "rain", "1.0.0");
        for hour in 0..6i64 {
            let sketch = if shifts && hour >= 3 {
                ([20, 80, 400], [100, 400])
            } else {
                ([150, 200, 150], [350, 150])
            };
            // The end of the hour: the cost report takes a window to end no later
            // than its report arrived.
            cp.core.clock.set(at(base_hour + hour * 3600 + 3599));
            client
                .report_telemetry(report(
                    hour as u64 + 1,
                    base_hour + hour * 3600,
                    500,
                    latency,
                    Some(sketch),
                ))
                .await
                .unwrap();
        }
        if shifts {
            cp.core.clock.set(at(now - 10 * 86_400 + 3599));
            client
                .report_telemetry(report(100, now - 10 * 86_400, 1_000_000, latency, None))
                .await
                .unwrap();
        }
    }

    cp.core.clock.set(at(now));

    // The cost report over the last week, by hand: 6 000 requests in
    // 6 h − 1 s from 2 devices, p50 weighted (10 + 30) / 2 = 20 ms.
    let (status, c) = api.get("/api/v1/models/rain/cost?days=7").await;
    assert_eq!(status, 200, "{c}");
    let t = &c["traffic"];
    assert_eq!(
        (t["requests"].as_u64(), t["errors"].as_u64()),
        (Some(6000), Some(6)),
        "{c}"
    );
    assert_eq!(t["devices"], 2, "{c}");
    assert!(
        close(t["observed_seconds"].as_f64().unwrap(), 21_599.0),
        "{c}"
    );
    assert!(close(t["latency_p50_ms"].as_f64().unwrap(), 20.0), "{c}");
    assert!(close(t["latency_p99_ms"].as_f64().unwrap(), 35.0), "{c}");
    assert_eq!(c["prices"]["electricity_usd_per_kwh"], 0.5, "{c}");
    let e = &c["estimate"];
    let monthly = 6000.0 / 21_599.0 * 730.0 * 3600.0;
    assert!(
        close(e["monthly_requests"].as_f64().unwrap(), monthly),
        "{c}"
    );
    // Edge: 2 devices × 2 W × 730 h = 2.92 kWh × 0.5, + 2 × 360 / 36.
    let edge = 2.92 * 0.5 + 20.0;
    assert!(close(e["edge"]["total_usd"].as_f64().unwrap(), edge), "{c}");
    // One instance all month (the peak is far under its capacity).
    assert_eq!(e["cloud_instances"]["instances"], 1, "{c}");
    assert!(
        close(e["cloud_instances"]["total_usd"].as_f64().unwrap(), 73.0),
        "{c}"
    );
    // Serverless: per request, and 20 ms × 2 GB at the Lambda price.
    let serverless = monthly / 1e6 * 0.20 + monthly * 0.02 * 2.0 * 0.000_016_666_7;
    assert!(
        close(
            e["cloud_serverless"]["total_usd"].as_f64().unwrap(),
            serverless
        ),
        "{c}"
    );
    assert_eq!(e["cheapest"], "cloud_serverless", "{c}");
    assert!(
        close(e["edge_saves_usd"].as_f64().unwrap(), serverless - edge),
        "{c}"
    );

    // The 30-day default includes the busy hour ten days ago.
    let (_, month) = api.get("/api/v1/models/rain/cost").await;
    assert_eq!(month["days"], 30);
    assert_eq!(month["traffic"]["requests"], 1_006_000, "{month}");
    let (_, v) = api
        .get("/api/v1/models/rain/cost?version=1.0.0&days=7")
        .await;
    assert_eq!(v["traffic"]["requests"], 6000, "{v}");
    // A model nobody served: no estimate, not an error.
    let (status, idle) = api.get("/api/v1/models/idle/cost").await;
    assert_eq!(status, 200, "{idle}");
    assert!(
        idle["estimate"].is_null() && idle["traffic"]["requests"] == 0,
        "{idle}"
    );
    for (query, status, field) in [
        ("days=0", 400, "days"),
        ("days=91", 400, "days"),
        ("days=x", 400, "query"),
        ("bogus=1", 400, "query"),
        ("version=bad%21", 400, "version"),
        ("version=9.9.9", 404, ""),
    ] {
        let (got, body) = api.get(&format!("/api/v1/models/rain/cost?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
        if !field.is_empty() {
            assert_eq!(body["error"]["field"], field, "{query}: {body}");
        }
    }
    let (status, _) = api.get("/api/v1/models/nope/cost").await;
    assert_eq!(status, 404);
    let (_, doc) = api.get("/api/v1/openapi.json").await;
    assert!(doc["paths"]["/api/v1/models/{name}/cost"]["get"].is_object());
    for schema in [
        "CostView", "Prices", "Traffic", "Estimate", "EdgeCost", "Venue",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }

    // The same through the CLI.
    let (code, out) = run(&["cost", "rain", "--days", "7"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        out.contains("6000 requests (6 errors) from 2 devices over 6.0 h"),
        "{out}"
    );
    assert!(row(&out, "edge").contains(&format!("{edge:.2}")), "{out}");
    assert!(row(&out, "cloud instances").contains("73.00"), "{out}");
    assert!(
        row(&out, "cloud serverless").contains(&format!("{serverless:.2}")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "cheapest:  cloud serverless (the edge costs {:.2} USD a month more)",
            edge - serverless
        )),
        "{out}"
    );
    let (code, out) = run(&["cost", "rain", "--days", "7", "--json"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["estimate"]["cheapest"], "cloud_serverless");
    assert_eq!(json["traffic"], c["traffic"]);
    let (code, out) = run(&["cost", "idle"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("nothing to estimate"), "{out}");
    assert_eq!(
        run(&["cost", "rain", "--days", "0"]).await.0,
        ExitCode::from(65)
    );
    assert_eq!(run(&["cost", "nope"]).await.0, ExitCode::from(66));

    // Drift: the latest window per site and feature, and the state.
    let (code, out) = run(&[
        "drift",
        "rain",
        "--group-by",
        "site",
        "--set-after",
        "2",
        "--clear-after",
        "2",
    ])
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("model:       rain 1.0.0\n"), "{out}");
    let berlin = row(&out, "berlin");
    for want in ["500", "yes", "2 of 6", "DRIFTING"] {
        assert!(berlin.contains(want), "{want}: {out}");
    }
    let oslo = row(&out, "oslo");
    assert!(oslo.contains("0 of 6") && oslo.ends_with("ok"), "{out}");
    let features: Vec<&str> = out.lines().filter(|l| l.contains("  temp  ")).collect();
    assert_eq!(features.len(), 2, "{out}");
    assert!(
        features[0].starts_with("berlin") && features[0].ends_with("act"),
        "{out}"
    );
    assert!(
        features[1].starts_with("oslo") && features[1].ends_with("stable"),
        "{out}"
    );
    let (code, out) = run(&["drift", "rain", "--group-by", "site", "--json"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let view: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(view["series"].as_array().unwrap().len(), 2, "{out}");
    let (_, out) = run(&["drift", "rain"]).await;
    assert!(row(&out, "all").contains("1000"), "{out}");
    assert_eq!(
        run(&["drift", "rain", "--window-seconds", "0"]).await.0,
        ExitCode::from(65)
    );
    assert_eq!(run(&["drift", "nope"]).await.0, ExitCode::from(66));
    assert_eq!(
        edgeloop(&base, "wrong", &["drift", "rain"]).await.0,
        ExitCode::from(77)
    );
    cp.stop().await;
}

/// Eight labelled feedback samples from one device, as an agent uploads
/// them, observed from `t0` (unix seconds) on.
fn labelled_samples(t0: i64) -> pb::TelemetryReport {
    let samples = (0..8u8)
        .map(|i| pb::Sample {
            kind: pb::SampleKind::Feedback as i32,
            model_name: "rain".into(),
            model_version: "1".into(),
            request_id: format!("r{i}"),
            observed_at: at(t0 + i64::from(i)),
            inputs: vec![pb::SampleTensor {
                name: "input".into(),
                dtype: "float32".into(),
                shape: vec![1, 8],
                data: (0..8u8)
                    .flat_map(|f| f32::from(i * 8 + f).to_le_bytes())
                    .collect(),
            }],
            predicted_class: Some(0),
            confidence: Some(0.7),
            label: Some(i64::from(i % 2)),
        })
        .collect();
    pb::TelemetryReport {
        sequence: 1,
        samples,
        ..Default::default()
    }
}

fn failed_job(job: &str) -> ProgressReport {
    ProgressReport {
        state: JobState::Failed as i32,
        exit_code: 3,
        message: "exit code 3".into(),
        metrics: Default::default(),
        ..progress(job, JobState::Failed, 0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retraining_policies_and_pipelines_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(ServeSettings {
        rollout_tick_ms: Some(100),
        ..settings(&dir.path().join("cp"))
    })
    .await;
    let api = cp.api();
    let (base, admin) = (cp.http_base.clone(), cp.admin_token.clone());
    let as_admin = Admin::of(&cp);
    let run = |args: Vec<String>| as_admin.run_owned(args);
    macro_rules! cli {
        ($($arg:expr),* $(,)?) => { run(vec![$(String::from($arg)),*]) };
    }

    for name in ["rain", "idle"] {
        let (status, body) = api.post("/api/v1/models", json!({"name": name})).await;
        assert_eq!(status, 201, "{body}");
    }
    // No policy yet: nothing to show, and a retrain cannot start.
    assert_eq!(
        cli!("retraining", "show", "rain").await.0,
        ExitCode::from(66)
    );
    assert_eq!(cli!("retrain", "rain").await.0, ExitCode::from(75));

    // The policy, from a file.
    let data = cp.upload(&edgeloop_tests::rows::rows_npz(20)).await;
    let policy = json!({
        "job": {"name": "retrain-rain", "command": ["python3", "train.py"],
                "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
                "restarts": {"max_restarts": 0, "backoff_seconds": 0, "backoff_max_seconds": 0}},
        "base_dataset": data.to_string(),
        "eval_fraction": 0.25,
        "min_eval_samples": 2,
        "max_attempts": 2,
        "rollout": {"selector": "site=lab"}
    });
    let file = dir.path().join("policy.json");
    std::fs::write(&file, policy.to_string()).unwrap();
    let file = file.display().to_string();
    let (code, out) = cli!("retraining", "set", "rain", "--file", &file).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(out.starts_with("retraining policy of rain set\n"), "{out}");
    let short = &data.to_string()[..12];
    assert!(out.contains(&format!("base dataset:  {short}\n")), "{out}");
    let (code, out) = cli!("retraining", "show", "rain").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    for want in [
        "job:           retrain-rain\n",
        "command:       python3 train.py\n",
        "evaluate on:   the newest 25 % of labelled edge samples (at least 2)\n",
        "attempts:      2 per step\n",
        "rollout:       {\"selector\":\"site=lab\"}\n",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let (code, out) = cli!("retraining", "show", "rain", "--json").await;
    assert_eq!(code, ExitCode::SUCCESS);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["min_eval_samples"], 2, "{out}");
    assert_eq!(shown["base_dataset"], data.to_string(), "{out}");
    // A policy the server refuses names the field (65); a missing file is 66.
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        json!({"job": policy["job"], "rollout": {"selector": "a=b"},
                                "eval_fraction": 1.5})
        .to_string(),
    )
    .unwrap();
    let bad = bad.display().to_string();
    assert_eq!(
        cli!("retraining", "set", "rain", "--file", &bad).await.0,
        ExitCode::from(65)
    );
    let missing = dir.path().join("missing.json").display().to_string();
    assert_eq!(
        cli!("retraining", "set", "rain", "--file", &missing)
            .await
            .0,
        ExitCode::from(66)
    );
    assert_eq!(
        cli!("retraining", "set", "nope", "--file", &file).await.0,
        ExitCode::from(66)
    );

    // A device's labelled samples: 6 train beside the base set, 2 evaluate.
    let token = cp
        .labelled_token("device", "edge-1", json!({"site": "lab"}))
        .await;
    cp.assigned("edge-1", "rain", "1");
    AgentServiceClient::new(
        cp.connect(Role::Device, &token, &dir.path().join("edge-1"))
            .await,
    )
    .report_telemetry(labelled_samples(1_796_083_200))
    .await
    .unwrap();

    // A retrain; a second one while it runs is coalesced into it.
    let (code, out) = cli!("retrain", "rain", "--reason", "cli").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let id = out
        .strip_prefix("pipeline ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no pipeline id in {out:?}"))
        .to_string();
    assert_eq!(
        out,
        format!("pipeline {id} started for rain (trigger: manual: cli)\n")
    );
    let (code, out) = cli!("retrain", "rain", "--reason", "again").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(
        out.starts_with(&format!(
            "rain is already retraining: the request was coalesced into pipeline {id} (running: step "
        )),
        "{out}"
    );

    // A bridge leases the pipeline's training job and reports it running.
    let job = format!("{id}-train-1");
    let mut bridge = BridgeServiceClient::new(
        cp.connect(
            Role::Cluster,
            &cp.token("cluster", "gpu-a").await,
            &dir.path().join("bridge"),
        )
        .await,
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let leased = bridge
            .lease_job(LeaseJobRequest {
                wait_seconds: 1,
                engines: vec!["local".into()],
                running_jobs: vec![],
            })
            .await
            .unwrap()
            .into_inner();
        if let Some(j) = leased.job {
            assert_eq!(j.id, job);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pipeline's training job was never leasable"
        );
    }
    bridge
        .report_progress(progress(&job, JobState::Running, 10))
        .await
        .unwrap();

    let (code, out) = cli!("pipeline", "show", &id).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(
        out.contains("status:     running: step 2/8 train, attempt 1\n"),
        "{out}"
    );
    assert!(out.contains("coalesced:  manual: again ("), "{out}");
    let dataset = row(&out, "build_dataset");
    for want in [
        "succeeded",
        "26 rows, 2 to evaluate, 8 from devices; snapshot ",
    ] {
        assert!(dataset.contains(want), "{want}: {out}");
    }
    assert!(row(&out, "train").contains("running"), "{out}");

    // `show --wait` follows it to the failure the bridge reports.
    let waiting = {
        let (base, admin, id) = (base.clone(), admin.clone(), id.clone());
        tokio::spawn(
            async move { edgeloop(&base, &admin, &["pipeline", "show", &id, "--wait"]).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "--wait returned while it ran");
    bridge.report_progress(failed_job(&job)).await.unwrap();
    let (code, out) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, ExitCode::FAILURE, "{out}");
    let reason = format!("training job {job} failed: exit code 3");
    assert!(out.contains("status:     failed at train\n"), "{out}");
    assert!(out.contains(&format!("reason:     {reason}\n")), "{out}");
    assert!(out.contains("trigger:    manual: cli\n"), "{out}");
    let header = out.lines().find(|l| l.starts_with("STEP")).unwrap();
    for col in ["ATTEMPT", "STATUS", "STARTED", "DURATION", "OUTPUT"] {
        assert!(header.contains(col), "{col}: {out}");
    }
    let dataset = row(&out, "build_dataset");
    assert!(dataset.contains("26 rows"), "{out}");
    assert_eq!(header.find("STATUS"), dataset.find("succeeded"), "{out}");
    let train = row(&out, "train");
    assert!(train.contains(&reason[..30]), "{out}");
    assert_eq!(header.find("STATUS"), train.find("training job"), "{out}");
    // Nothing after train ran.
    for step in ["export", "quantize", "register", "compare", "deploy"] {
        assert!(
            !out.lines().any(|l| l.starts_with(step)),
            "{step} ran: {out}"
        );
    }

    let (code, out) = cli!("pipeline", "show", &id, "--json").await;
    assert_eq!(code, ExitCode::SUCCESS);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["status"], "failed", "{out}");
    assert_eq!(shown["reason"], reason.as_str(), "{out}");
    let (code, out) = cli!("pipeline", "list").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let r = row(&out, &id);
    for want in ["rain", "failed", "train", "manual: cli", "training job"] {
        assert!(r.contains(want), "{want}: {out}");
    }
    let (code, out) = cli!("pipeline", "list", "--json").await;
    assert_eq!(code, ExitCode::SUCCESS);
    let all: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(all[0]["id"], id.as_str());
    let (_, out) = cli!("pipeline", "list", "--model", "idle", "--json").await;
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!([]));

    // A new retrain followed by `retrain --wait`, cancelled from the CLI:
    // the wait exits non-zero, and a second cancel is a conflict.
    let waiting = {
        let (base, admin) = (base.clone(), admin.clone());
        tokio::spawn(async move { edgeloop(&base, &admin, &["retrain", "rain", "--wait"]).await })
    };
    let second = eventually(Duration::from_secs(20), "a second pipeline", || async {
        let (_, all) = api.get("/api/v1/pipelines?model=rain").await;
        all.as_array()?
            .iter()
            .find(|p| p["id"] != id.as_str() && p["status"] == "running")
            .map(|p| p["id"].as_str().unwrap().to_string())
    })
    .await;
    let cancelled = |out: &str| {
        out.lines()
            .any(|l| l.starts_with("status:") && l.contains(" cancelled at "))
    };
    let (code, out) = cli!("pipeline", "cancel", &second).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(cancelled(&out), "{out}");
    let (code, out) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, ExitCode::FAILURE, "{out}");
    assert!(
        out.starts_with(&format!(
            "pipeline {second} started for rain (trigger: manual)\n"
        )),
        "{out}"
    );
    assert!(cancelled(&out), "{out}");
    assert_eq!(
        cli!("pipeline", "cancel", &second).await.0,
        ExitCode::from(75)
    );

    // Exit codes: no policy → 75, no such model or pipeline → 66, a bad id → 64.
    assert_eq!(cli!("retrain", "idle").await.0, ExitCode::from(75));
    assert_eq!(cli!("retrain", "nope").await.0, ExitCode::from(66));
    assert_eq!(
        cli!("pipeline", "show", "p-99999999").await.0,
        ExitCode::from(66)
    );
    assert_eq!(
        cli!("pipeline", "cancel", "p-99999999").await.0,
        ExitCode::from(66)
    );
    assert_eq!(
        cli!("pipeline", "show", "../jobs").await.0,
        ExitCode::from(64)
    );
    assert_eq!(
        edgeloop(&base, "wrong", &["pipeline", "list"]).await.0,
        ExitCode::from(77)
    );
    cp.stop().await;
}

/// One trigger of each kind, as in a `triggers.json`.
fn triggers_file() -> Value {
    json!({
        "cooldown_seconds": 3600,
        "accuracy_window": 200,
        "accuracy_min_samples": 50,
        "triggers": [
            {"id": "hurts", "kind": "drift", "min_severity": 0.2,
             "min_duration_seconds": 60, "min_accuracy_drop_points": 5},
            {"id": "acc", "kind": "accuracy_drop", "points": 5},
            {"id": "labels", "kind": "new_labels", "min": 1000},
            {"id": "nightly", "kind": "schedule", "cron": "0 2 * * *", "window": "02:00-04:00"}
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    // The trigger task evaluates every `rollout_tick_ms`.
    let cp = ControlPlane::start_with(ServeSettings {
        rollout_tick_ms: Some(100),
        ..settings(&dir.path().join("cp"))
    })
    .await;
    let api = cp.api();
    let (base, admin) = (cp.http_base.clone(), cp.admin_token.clone());
    let as_admin = Admin::of(&cp);
    let run = |args: Vec<String>| as_admin.run_owned(args);
    macro_rules! cli {
        ($($arg:expr),* $(,)?) => { run(vec![$(String::from($arg)),*]) };
    }
    let write = |name: &str, body: Value| {
        let path = dir.path().join(name);
        std::fs::write(&path, body.to_string()).unwrap();
        path.display().to_string()
    };

    for name in ["rain", "idle"] {
        let (status, body) = api.post("/api/v1/models", json!({"name": name})).await;
        assert_eq!(status, 201, "{body}");
    }
    // No triggers yet.
    assert_eq!(cli!("trigger", "show", "rain").await.0, ExitCode::from(66));

    let file = write("triggers.json", triggers_file());
    let (code, out) = cli!("trigger", "set", "rain", "--file", &file).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(out.starts_with("triggers of rain set\n"), "{out}");
    let conditions = [
        (
            "hurts",
            "drift",
            "drift >= 0.2 for 60 s and accuracy down >= 5 points",
        ),
        ("acc", "accuracy_drop", "accuracy down >= 5 points"),
        ("labels", "new_labels", ">= 1000 new labels"),
        ("nightly", "schedule", "cron 0 2 * * * within 02:00-04:00"),
    ];
    let (code, out) = cli!("trigger", "show", "rain").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let header = out.lines().find(|l| l.starts_with("ID")).unwrap();
    for (id, kind, condition) in conditions {
        let r = row(&out, id);
        assert!(r.contains(kind), "{kind}: {out}");
        assert!(r.contains(condition), "{condition}: {out}");
        assert_eq!(header.find("CONDITION"), r.find(condition), "{out}");
    }
    assert!(
        out.contains("cooldown:          1h00m between automatic retrains\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "online accuracy:   over the newest 200 labelled samples, once there are 50\n"
        ),
        "{out}"
    );
    let (code, out) = cli!("trigger", "show", "rain", "--json").await;
    assert_eq!(code, ExitCode::SUCCESS);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["model"], "rain", "{out}");
    assert_eq!(shown["config"]["cooldown_seconds"], 3600, "{out}");
    let ids: Vec<&str> = shown["config"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["hurts", "acc", "labels", "nightly"], "{out}");

    // A file the server refuses exits 65 naming the field, and changes
    // nothing; an unknown model is 66, and so is a missing file.
    let bad = write(
        "bad.json",
        json!({"triggers": [{"id": "sometimes", "kind": "sometimes"}]}),
    );
    assert_eq!(
        cli!("trigger", "set", "rain", "--file", &bad).await.0,
        ExitCode::from(65)
    );
    let server = ServerArgs {
        server: base.clone(),
        token: Some(admin.clone()),
        env_token: None,
        token_file: None,
        ca_file: None,
        ca_fingerprint: None,
        json: false,
    };
    let e = execute(
        TriggerCommand::Set {
            model: "rain".into(),
            file: bad.clone().into(),
        },
        &server,
    )
    .await
    .err()
    .unwrap();
    assert_eq!(e.exit_code(), ExitCode::from(65), "{e}");
    assert!(
        e.to_string()
            .starts_with("triggers[0].kind: unknown kind \"sometimes\""),
        "{e}"
    );
    let (_, still) = api.get("/api/v1/models/rain/triggers").await;
    assert_eq!(still["config"], shown["config"]);
    assert_eq!(
        cli!("trigger", "set", "nope", "--file", &file).await.0,
        ExitCode::from(66)
    );
    assert_eq!(cli!("trigger", "show", "nope").await.0, ExitCode::from(66));
    assert_eq!(cli!("trigger", "show", "idle").await.0, ExitCode::from(66));
    let missing = dir.path().join("missing.json").display().to_string();
    assert_eq!(
        cli!("trigger", "set", "rain", "--file", &missing).await.0,
        ExitCode::from(66)
    );
    assert_eq!(
        cli!("trigger", "show", "../rain").await.0,
        ExitCode::from(64)
    );

    // A device's labelled feedback: new labels for any retrain that
    // started before it arrived (the control plane's receive time counts,
    // not the device's).
    let token = cp
        .labelled_token("device", "edge-1", json!({"site": "lab"}))
        .await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    cp.assigned("edge-1", "rain", "1");
    let mut device = AgentServiceClient::new(
        cp.connect(Role::Device, &token, &dir.path().join("edge-1"))
            .await,
    );
    device
        .report_telemetry(labelled_samples(now))
        .await
        .unwrap();

    // The trigger task sees them: 8 labels, under the 1000 needed, and no
    // version serving to drift or lose accuracy, so nothing fires. (At
    // 02:00 UTC the schedule fires and, without a retraining policy, that
    // minute's evaluations fail; the wait outlasts it.)
    eventually(
        Duration::from_secs(90),
        "an evaluation with the labels",
        || async {
            let (_, v) = api.get("/api/v1/models/rain/triggers").await;
            (v["state"]["last"]["state"]["labels_since_last"] == 8).then_some(())
        },
    )
    .await;
    let (code, out) = cli!("trigger", "show", "rain").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let evaluated = out
        .lines()
        .find_map(|l| l.strip_prefix("last evaluation:"))
        .unwrap_or_else(|| panic!("no last evaluation in {out}"))
        .trim();
    let evaluated =
        time::OffsetDateTime::parse(evaluated, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{evaluated:?}: {e}: {out}"))
            .unix_timestamp();
    assert!((now - 5..now + 100).contains(&evaluated), "{out}");
    for want in [
        "serving version:   -\n",
        "drifting:          no\n",
        "accuracy:          evaluated -, online -\n",
        "new labels:        8 since the last retrain\n",
        "last retrain:      -\n",
        "running pipeline:  -\n",
        "decision:          none: no trigger fired\n",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }

    // With a retraining policy and a trigger those labels meet, the task
    // starts a retrain; labels that arrive after its start are new for it,
    // so the task coalesces them into it.
    let data = cp.upload(&edgeloop_tests::rows::rows_npz(20)).await;
    let (status, body) = api
        .put(
            "/api/v1/models/rain/retraining",
            json!({
                "job": {"name": "retrain-rain", "command": ["python3", "train.py"],
                        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1}},
                "base_dataset": data.to_string(),
                "eval_fraction": 0.25,
                "min_eval_samples": 2,
                "rollout": {"selector": "site=lab"}
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let few = write(
        "few.json",
        json!({"cooldown_seconds": 600,
               "triggers": [{"id": "labels", "kind": "new_labels", "min": 5}]}),
    );
    let (code, out) = cli!("trigger", "set", "rain", "--file", &few).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    assert!(row(&out, "labels").contains(">= 5 new labels"), "{out}");
    eventually(
        Duration::from_secs(30),
        "a retrain on the labels",
        || async {
            let (_, v) = api.get("/api/v1/pipelines?model=rain").await;
            v.as_array().is_some_and(|p| !p.is_empty()).then_some(())
        },
    )
    .await;
    // Starts are recorded to the second, and only labels after that second
    // are new for a retrain.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut later = labelled_samples(now);
    later.sequence = 2;
    for s in &mut later.samples {
        s.request_id = format!("later-{}", s.request_id);
    }
    device.report_telemetry(later).await.unwrap();
    let pipeline = eventually(Duration::from_secs(30), "a coalesced trigger", || async {
        let (_, v) = api.get("/api/v1/models/rain/triggers").await;
        let last = &v["state"]["last"];
        (last["decision"] == "coalesce").then(|| last["pipeline"].as_str().unwrap().to_string())
    })
    .await;
    let (_, p) = api.get(&format!("/api/v1/pipelines/{pipeline}")).await;
    assert_eq!(p["trigger"], "labels: 8 new labelled samples", "{p}");
    let (code, out) = cli!("trigger", "show", "rain").await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    for want in [
        "cooldown:          10m00s between automatic retrains\n".to_string(),
        format!("running pipeline:  {pipeline}\n"),
        format!("decision:          coalesce: recorded on the running pipeline {pipeline}\n"),
        "reason:            labels: 8 new labelled samples\n".to_string(),
        "new labels:        8 since the last retrain\n".to_string(),
    ] {
        assert!(out.contains(&want), "{want}: {out}");
    }
    assert!(!out.contains("last retrain:      -\n"), "{out}");
    let (code, out) = cli!("trigger", "show", "rain", "--json").await;
    assert_eq!(code, ExitCode::SUCCESS);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        shown["state"]["last"]["state"]["running"],
        pipeline.as_str()
    );
    cp.stop().await;
}
