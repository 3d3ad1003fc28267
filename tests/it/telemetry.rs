//! Store-and-forward against a real control plane: telemetry recorded while
//! the control plane is down arrives exactly once after it returns, the
//! buffer cap drops the oldest batches and says so, and an agent restart
//! keeps pending batches and the sequence.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use edgeloop_client_core::Role;
use edgeloop_edge_agent::config::TelemetryConfig;
use edgeloop_edge_agent::observe::{Observation, Observer as _};
use edgeloop_edge_agent::telemetry::{self, FeedbackLabel, Telemetry, TelemetryOptions};
use edgeloop_models::tensor::Tensor;
use edgeloop_tests::{eventually, settings, ControlPlane};
use ndarray::{ArrayD, IxDyn};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const DEVICE: &str = "cam-1";

fn options(max_batches: u64) -> TelemetryOptions {
    TelemetryOptions::new(&TelemetryConfig {
        interval: Duration::from_millis(200),
        max_batches,
    })
}

/// Enrolls the device, creates model `m`, and stops the control plane;
/// returns the settings that restart it on the same ports and data dir.
async fn enrolled_then_stopped(
    dir: &Path,
) -> (
    edgeloop_control_plane::ServeSettings,
    edgeloop_client_core::MemberConfig,
) {
    let cp = ControlPlane::start(&dir.join("cp")).await;
    let token = cp.token("device", DEVICE).await;
    cp.enroll(Role::Device, &token, &dir.join("agent")).await;
    let (status, body) = cp.api().post("/api/v1/models", json!({"name": "m"})).await;
    assert_eq!(status, 201, "{body}");
    cp.assigned(DEVICE, "m", "1");
    let member = cp.member_config(&dir.join("agent"), None);
    let mut s = settings(&cp.data_dir);
    s.grpc_listen = Some(cp.grpc_addr);
    s.http_listen = Some(cp.http_addr);
    cp.stop().await;
    (s, member)
}

/// One single-row request; `class` is the confident prediction.
fn request(t: &Telemetry, id: &str, x: f32, class: usize) {
    let mut logits = vec![0.0f32; 3];
    logits[class] = 4.0;
    let inputs = vec![(
        "x".to_string(),
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![x, x]).unwrap()),
    )];
    let outputs = vec![(
        "y".to_string(),
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 3]), logits).unwrap()),
    )];
    t.observe(&Observation {
        model: "m",
        version: "1",
        request_id: id,
        inputs: &inputs,
        outputs: &outputs,
        latency: Duration::from_millis(2),
        ok: true,
    });
}

/// The sequences the control plane stored for the device, and the total of
/// their dropped-batch counts.
fn stored(cp: &ControlPlane) -> (Vec<u64>, u64) {
    let records = cp
        .core
        .store
        .fleet
        .telemetry
        .scan_prefix(&format!("{DEVICE}/"))
        .unwrap();
    (
        records.iter().map(|(_, r)| r.sequence).collect(),
        records.iter().map(|(_, r)| r.dropped_batches).sum(),
    )
}

fn stored_requests(cp: &ControlPlane) -> u64 {
    cp.core
        .store
        .drift
        .sketches
        .scan_prefix("m/1/")
        .unwrap()
        .iter()
        .map(|(_, s)| s.requests)
        .sum()
}

/// The enrolled identity on disk, as the agent's enrollment hands it on.
fn membership(member: &edgeloop_client_core::MemberConfig) -> edgeloop_client_core::Membership {
    let identity = edgeloop_client_core::IdentityStore::new(&member.data_dir)
        .load()
        .unwrap()
        .expect("enrolled");
    edgeloop_client_core::Membership::with_identity(
        &member.control_plane,
        &member.data_dir,
        identity,
    )
    .unwrap()
}

async fn drained(t: &Telemetry) {
    eventually(
        Duration::from_secs(30),
        "every batch acknowledged",
        || async { t.pending().unwrap().is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn telemetry_recorded_offline_arrives_exactly_once_after_the_control_plane_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (cp_settings, member) = enrolled_then_stopped(dir.path()).await;

    let t = Telemetry::open(&member.data_dir, options(1000)).unwrap();
    t.model_activated("m", "1", None);
    let stop = CancellationToken::new();
    let uploader = tokio::spawn(telemetry::run(
        t.clone(),
        member.clone(),
        membership(&member),
        stop.clone(),
    ));
    // Traffic over several windows while the control plane is away.
    let mut sent = 0u64;
    for window in 0..5 {
        for i in 0..10 {
            request(&t, &format!("w{window}-{i}"), i as f32, i % 3);
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let reply = t
        .feedback(
            "m",
            &[
                FeedbackLabel {
                    id: "w4-1".into(),
                    label: 1,
                },
                FeedbackLabel {
                    id: "w4-2".into(),
                    label: 0,
                },
            ],
        )
        .unwrap();
    assert_eq!(reply.matched, 2);
    t.close_window().unwrap();
    let pending = t.pending().unwrap();
    assert!(pending.len() >= 3, "a batch per busy window: {pending:?}");
    assert_eq!(pending[0], 1);
    let created = *pending.last().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        t.pending().unwrap(),
        pending,
        "nothing leaves while offline"
    );

    let cp = ControlPlane::start_with(cp_settings).await;
    drained(&t).await;
    let (sequences, dropped) = stored(&cp);
    assert_eq!(sequences, (1..=created).collect::<Vec<_>>());
    assert_eq!(dropped, 0);
    assert_eq!(
        stored_requests(&cp),
        sent,
        "every request counted exactly once"
    );
    let samples = cp.core.store.drift.samples.scan_prefix("m/1/").unwrap();
    let mut labels: Vec<_> = samples
        .iter()
        .map(|(_, s)| (s.request_id.clone(), s.label))
        .collect();
    labels.sort();
    assert_eq!(
        labels,
        vec![("w4-1".into(), Some(1)), ("w4-2".into(), Some(0))]
    );

    // The console reads them back.
    let api = cp.api();
    let (status, sketches) = api
        .get(&format!(
            "/api/v1/models/m/sketches?version=1&device={DEVICE}"
        ))
        .await;
    assert_eq!(status, 200, "{sketches}");
    assert_eq!(sketches.as_array().unwrap().len() as u64, created);
    let (status, reports) = api
        .get(&format!(
            "/api/v1/devices/{DEVICE}/telemetry?after_sequence=1"
        ))
        .await;
    assert_eq!(status, 200, "{reports}");
    assert_eq!(reports.as_array().unwrap().len() as u64, created - 1);
    let (status, body) = api.get("/api/v1/models/m/samples?kind=feedback").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.as_array().unwrap().len(), 2);
    let (status, body) = api.get("/api/v1/models/nope/sketches").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = api.get("/api/v1/models/m/sketches?limit=0").await;
    assert_eq!(status, 400, "{body}");
    let (_, doc) = api.get("/api/v1/openapi.json").await;
    for path in [
        "/api/v1/devices/{id}/telemetry",
        "/api/v1/models/{name}/sketches",
        "/api/v1/models/{name}/samples",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from OpenAPI"
        );
    }
    assert!(doc["components"]["schemas"]["SketchRecord"].is_object());

    stop.cancel();
    uploader.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn the_cap_drops_the_oldest_batches_and_reports_how_many() {
    let dir = tempfile::tempdir().unwrap();
    let (cp_settings, member) = enrolled_then_stopped(dir.path()).await;
    let t = Telemetry::open(&member.data_dir, options(3)).unwrap();
    for n in 0..7 {
        request(&t, &format!("r{n}"), 0.0, 0);
        t.close_window().unwrap();
    }
    assert_eq!(t.pending().unwrap(), vec![5, 6, 7]);

    let cp = ControlPlane::start_with(cp_settings).await;
    let stop = CancellationToken::new();
    let uploader = tokio::spawn(telemetry::run(
        t.clone(),
        member.clone(),
        membership(&member),
        stop.clone(),
    ));
    drained(&t).await;
    let (sequences, dropped) = stored(&cp);
    assert_eq!(sequences, vec![5, 6, 7]);
    assert_eq!(dropped, 4, "batches 1 to 4 were dropped and reported");
    stop.cancel();
    uploader.await.unwrap().unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn an_agent_restart_keeps_pending_batches_and_the_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let (cp_settings, member) = enrolled_then_stopped(dir.path()).await;
    {
        let t = Telemetry::open(&member.data_dir, options(100)).unwrap();
        // The uploader runs (and fails to send) until the agent stops; on
        // shutdown it persists the open window.
        let stop = CancellationToken::new();
        let uploader = tokio::spawn(telemetry::run(
            t.clone(),
            member.clone(),
            membership(&member),
            stop.clone(),
        ));
        request(&t, "a", 0.0, 0);
        t.close_window().unwrap();
        request(&t, "b", 0.0, 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        uploader.await.unwrap().unwrap();
        assert_eq!(t.pending().unwrap(), vec![1, 2]);
        assert_eq!(Arc::strong_count(&t), 1, "nothing else holds the buffer");
    }
    let t = Telemetry::open(&member.data_dir, options(100)).unwrap();
    assert_eq!(t.pending().unwrap(), vec![1, 2]);
    request(&t, "c", 0.0, 0);
    assert_eq!(t.close_window().unwrap(), Some(3));

    let cp = ControlPlane::start_with(cp_settings).await;
    let stop = CancellationToken::new();
    let uploader = tokio::spawn(telemetry::run(
        t.clone(),
        member.clone(),
        membership(&member),
        stop.clone(),
    ));
    drained(&t).await;
    assert_eq!(stored(&cp).0, vec![1, 2, 3]);
    assert_eq!(stored_requests(&cp), 3);
    stop.cancel();
    uploader.await.unwrap().unwrap();
    cp.stop().await;
}

/// A device's telemetry is rate-limited in bytes: past its hourly rate a
/// report is refused whole with RESOURCE_EXHAUSTED (which the agent's
/// uploader retries later, keeping the report), counted in `/metrics`;
/// another device has its own rate.
#[tokio::test]
async fn a_device_past_its_telemetry_rate_is_told_to_come_back_later() {
    use edgeloop_proto::agent::v1 as pb;
    use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        device_telemetry_mib_per_hour: Some(16),
        ..settings(&dir.path().join("cp"))
    })
    .await;
    // About 6 MiB each: two fit in 16 MiB, a third does not.
    let big = |seq: u64| pb::TelemetryReport {
        sequence: seq,
        events: vec![pb::Event {
            kind: "note".into(),
            message: "x".repeat(6 << 20),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut clients = Vec::new();
    for name in ["edge-1", "edge-2"] {
        let token = cp.token("device", name).await;
        let channel = cp
            .connect(Role::Device, &token, &dir.path().join(name))
            .await;
        clients.push(AgentServiceClient::new(channel));
    }
    let code = |r: Result<tonic::Response<pb::TelemetryAck>, tonic::Status>| match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    };
    for seq in 1..=2 {
        let got = code(clients[0].report_telemetry(big(seq)).await);
        assert_ne!(got, tonic::Code::ResourceExhausted, "report {seq}");
    }
    let refused = clients[0].report_telemetry(big(3)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert!(refused.message().contains("retry later"), "{refused}");
    let other = code(clients[1].report_telemetry(big(1)).await);
    assert_ne!(
        other,
        tonic::Code::ResourceExhausted,
        "edge-2 has its own rate"
    );
    assert_eq!(
        cp.api()
            .metric("edgeloop_device_telemetry_throttled_total")
            .await,
        Some(1)
    );
    cp.stop().await;
}

/// Listing samples pages by key range: each full page carries the next
/// page's cursor in `edgeloop-next-cursor`, `after` starts there, and
/// following the cursors yields every sample once, in order.
#[tokio::test]
async fn samples_page_by_cursor_through_everything_once() {
    use edgeloop_proto::agent::v1 as pb;
    use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (status, _) = cp
        .api()
        .post("/api/v1/models", json!({"name": "rain"}))
        .await;
    assert_eq!(status, 201);
    let token = cp.token("device", "edge-1").await;
    let mut client = AgentServiceClient::new(
        cp.connect(Role::Device, &token, &dir.path().join("edge-1"))
            .await,
    );
    cp.assigned("edge-1", "rain", "1");
    let samples = (0..7)
        .map(|i| pb::Sample {
            kind: pb::SampleKind::Feedback as i32,
            model_name: "rain".into(),
            model_version: "1".into(),
            request_id: format!("r{i}"),
            inputs: vec![pb::SampleTensor {
                name: "input".into(),
                dtype: "float32".into(),
                shape: vec![1, 1],
                data: (i as f32).to_le_bytes().to_vec(),
            }],
            predicted_class: Some(0),
            confidence: Some(0.5),
            label: Some(1),
            ..Default::default()
        })
        .collect();
    client
        .report_telemetry(pb::TelemetryReport {
            sequence: 1,
            samples,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        // Cursors are store keys: names, digits and `/`, all fine in a query.
        let path = match &after {
            Some(a) => format!("/api/v1/models/rain/samples?limit=3&after={a}"),
            None => "/api/v1/models/rain/samples?limit=3".to_string(),
        };
        let (page, next) = cp.api().get_page(&path).await;
        pages += 1;
        assert!(page.len() <= 3);
        assert_eq!(
            next.is_some(),
            page.len() == 3,
            "a cursor only on a full page"
        );
        seen.extend(
            page.into_iter()
                .map(|s| s["request_id"].as_str().unwrap().to_string()),
        );
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
        assert!(pages < 10);
    }
    let want: Vec<String> = (0..7).map(|i| format!("r{i}")).collect();
    assert_eq!(seen, want);
    assert_eq!(pages, 3);
    // A cursor too long is refused, naming it.
    let (status, err) = cp
        .api()
        .get(&format!(
            "/api/v1/models/rain/samples?after={}",
            "x".repeat(2000)
        ))
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(err.to_string().contains("after"), "{err}");
    cp.stop().await;
}
