//! Drift analysis end to end: two enrolled devices in two sites report
//! sketches over mTLS (the real `ReportTelemetry`), the version's signed
//! manifest carries the reference statistics, and `GET
//! /api/v1/models/{name}/drift` shows the shift per window and per site,
//! with the hysteresis state. Bad queries get a 400 naming the field.

use edgeloop_client_core::Role;
use edgeloop_models::manifest::ManifestKey;
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_tests::weather::{manifest, sketch};
use edgeloop_tests::ControlPlane;
use serde_json::json;

#[tokio::test]
async fn sketches_from_two_sites_show_drift_per_window_and_site() {
    let dir = tempfile::tempdir().unwrap();
    // Windows count what arrived when: the control plane's clock, set to
    // each hour as its reports arrive (the devices' own times are ignored).
    let base = 1_796_083_200; // 2026-12-01 00:00 UTC
    let at = |t: i64| time::OffsetDateTime::from_unix_timestamp(t).unwrap();
    let cp = ControlPlane::start_with_clock(
        edgeloop_tests::settings(&dir.path().join("cp")),
        edgeloop_control_plane::Clock::manual(at(base)),
    )
    .await;
    let (status, body) = cp
        .api()
        .post("/api/v1/models", json!({"name": "rain"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let model = b"not a real model; drift needs only its manifest".to_vec();
    cp.register_signed(&ManifestKey::generate(), manifest(&model), &model)
        .await;

    // Berlin's weather changes from the fourth hour on; Oslo's does not.
    for (site, shifts) in [("berlin", true), ("oslo", false)] {
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
            let hot = shifts && hour >= 3;
            let (temp, classes) = if hot {
                ([20, 80, 400], [100, 400])
            } else {
                ([150, 200, 150], [350, 150])
            };
            cp.core.clock.set(at(base + hour * 3600 + 1800));
            client
                .report_telemetry(pb::TelemetryReport {
                    sequence: hour as u64 + 1,
                    sketches: vec![sketch(base + hour * 3600, temp, classes)],
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        // Labels for four of the fourth hour's predictions: two right.
        let samples = (0..4)
            .map(|i| pb::Sample {
                kind: pb::SampleKind::Feedback as i32,
                model_name: "rain".into(),
                model_version: "1.0.0".into(),
                request_id: format!("{site}-{i}"),
                observed_at: Some(edgeloop_proto::Timestamp {
                    seconds: base + 3 * 3600 + 60 + i,
                    nanos: 0,
                }),
                inputs: vec![],
                predicted_class: Some(1),
                confidence: Some(0.9),
                label: Some(i64::from(i < 2)),
            })
            .collect();
        cp.core.clock.set(at(base + 3 * 3600 + 120));
        client
            .report_telemetry(pb::TelemetryReport {
                sequence: 7,
                samples,
                ..Default::default()
            })
            .await
            .unwrap();
    }

    let (status, body) = cp
        .api()
        .get("/api/v1/models/rain/drift?group_by=site&set_after=2&clear_after=2")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], "1.0.0");
    let series = body["series"].as_array().unwrap();
    let of = |site: &str| {
        series
            .iter()
            .find(|s| s["group"] == site)
            .unwrap_or_else(|| panic!("{site}: {body}"))
            .clone()
    };
    let flags = |s: &serde_json::Value| -> Vec<bool> {
        s["windows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["drifting"].as_bool().unwrap())
            .collect()
    };
    let berlin = of("berlin");
    assert_eq!(
        flags(&berlin),
        [false, false, false, false, true, true],
        "{berlin}"
    );
    let hot = &berlin["windows"][3];
    assert_eq!(hot["labelled"], 4, "{hot}");
    assert_eq!(hot["accuracy"], 0.5, "{hot}");
    assert!(berlin["windows"][2]["accuracy"].is_null(), "{berlin}");
    assert_eq!(hot["features"][0]["level"], "act", "{hot}");
    assert!(hot["features"][0]["psi"].as_f64().unwrap() > 0.2);
    assert!(hot["features"][0]["ks_p_value"].as_f64().unwrap() < 1e-6);
    assert!(hot["prediction_js"].as_f64().unwrap() > 0.1);
    let oslo = of("oslo");
    assert_eq!(flags(&oslo), [false; 6], "{oslo}");
    assert_eq!(oslo["windows"][5]["features"][0]["level"], "stable");

    // Ungrouped, the two sites sum; Berlin's shift alone still crosses 0.2.
    let (_, all) = cp.api().get("/api/v1/models/rain/drift").await;
    assert_eq!(all["series"].as_array().unwrap().len(), 1);
    assert_eq!(all["series"][0]["windows"][0]["devices"], 2);

    // A range reads only its windows, and their hysteresis goes on from
    // the fold before them: the same flags as the whole answer's tail.
    let whole = all["series"][0]["windows"].as_array().unwrap().clone();
    assert_eq!(whole.len(), 6, "{all}");
    assert_eq!(
        flags(&all["series"][0]),
        [false, false, false, false, false, true],
        "three hot windows set it: {all}"
    );
    let rfc = |t: i64| {
        at(t)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    for (from, until, expect) in [
        (base + 4 * 3600 + 5, None, 4..6),
        (base + 5 * 3600, None, 5..6),
        (base + 3 * 3600 + 1, Some(base + 5 * 3600), 3..5),
        (base - 7 * 86_400, None, 0..6),
    ] {
        let mut path = format!("/api/v1/models/rain/drift?from={}", rfc(from));
        if let Some(u) = until {
            path.push_str(&format!("&until={}", rfc(u)));
        }
        let (status, part) = cp.api().get(&path).await;
        assert_eq!(status, 200, "{path}: {part}");
        assert_eq!(
            part["series"][0]["windows"].as_array().unwrap()[..],
            whole[expect],
            "{path}"
        );
    }
    let (_, after) = cp
        .api()
        .get(&format!(
            "/api/v1/models/rain/drift?from={}",
            rfc(base + 86_400)
        ))
        .await;
    assert_eq!(after["series"], json!([]), "no window after the newest");

    for (query, field) in [
        ("window_seconds=0", "window_seconds"),
        ("psi_act=-1", "psi_act"),
        ("psi_watch=0.5&psi_act=0.2", "psi_watch"),
        ("set_after=0", "set_after"),
        ("version=9.9.9", ""),
        ("bogus=1", "query"),
        ("from=yesterday", "query"),
        (
            "from=2026-12-01T05:00:00Z&until=2026-12-01T04:00:00Z",
            "until",
        ),
    ] {
        let (status, body) = cp
            .api()
            .get(&format!("/api/v1/models/rain/drift?{query}"))
            .await;
        if field.is_empty() {
            assert_eq!(status, 404, "{query}: {body}");
        } else {
            assert_eq!(status, 400, "{query}: {body}");
            assert_eq!(body["error"]["field"], field, "{query}: {body}");
        }
    }
    cp.stop().await;
}
