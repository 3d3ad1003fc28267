//! Simulated telemetry for the soak benchmark (`bin/telemetry_soak.rs`)
//! and the tests that check what it measures: a `rain` model whose devices
//! report drift sketches and now and then a labelled row and a hard
//! example, fed through the same ingestion functions the gRPC
//! `ReportTelemetry` handler calls (`fleet::telemetry::record_telemetry`,
//! then `drift::retention::enforce`), with one flush per round.

use std::sync::Arc;

use edgeloop_control_plane::fleet::telemetry;
use edgeloop_control_plane::Core;
use edgeloop_models::manifest::ManifestKey;
use edgeloop_proto::agent::v1 as pb;
use serde_json::json;
use time::OffsetDateTime;

use crate::weather::{manifest, sketch};
use crate::ControlPlane;

/// 2026-12-01 00:00 UTC: where simulated time starts.
pub const BASE: i64 = 1_796_083_200;
pub const DAY: i64 = 86_400;

pub fn at(t: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(t).expect("a time")
}

/// What the simulated fleet sends.
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    pub devices: u32,
    /// Reports (each one sketch) per device and day.
    pub reports_per_day: u32,
    /// Labelled feedback rows per device and day.
    pub labels_per_day: u32,
}

/// Registers model `rain` 1.0.0 (signed, with the weather reference),
/// puts `triggers` on it and records it as assigned to every device, so
/// that their reports about it are accepted.
pub async fn register_rain(
    cp: &ControlPlane,
    fleet: Fleet,
    triggers: serde_json::Value,
) -> anyhow::Result<()> {
    let api = cp.api();
    let (status, body) = api.post("/api/v1/models", json!({"name": "rain"})).await;
    anyhow::ensure!(status == 201, "{body}");
    let model = b"rain".to_vec();
    let signed = ManifestKey::generate()
        .sign(manifest(&model))?
        .to_json_pretty()?;
    let artifact = cp.upload(&model).await;
    let manifest_digest = cp.upload(signed.as_bytes()).await;
    let (status, body) = api
        .post(
            "/api/v1/models/rain/versions",
            json!({"version": "1.0.0", "artifact_digest": artifact.to_string(),
                   "manifest_digest": manifest_digest.to_string()}),
        )
        .await;
    anyhow::ensure!(status == 201, "{body}");
    let (status, body) = api.put("/api/v1/models/rain/triggers", triggers).await;
    anyhow::ensure!(status == 200, "{body}");
    for d in 0..fleet.devices {
        cp.assigned(&device(d), "rain", "1.0.0");
    }
    Ok(())
}

pub fn device(d: u32) -> String {
    format!("dev-{d:05}")
}

/// One device's report at `t`: a sketch (hot: the temperature has moved
/// up) and, every so many reports, a labelled row and a hard example.
pub fn report(fleet: Fleet, device: u32, seq: u64, t: i64, hot: bool) -> pb::TelemetryReport {
    let (temp, classes) = if hot {
        ([20, 80, 400], [100, 400])
    } else {
        ([150, 200, 150], [350, 150])
    };
    let mut samples = Vec::new();
    let every = (fleet.reports_per_day / fleet.labels_per_day.max(1)).max(1) as u64;
    if fleet.labels_per_day > 0 && (seq + u64::from(device)).is_multiple_of(every) {
        let row = |kind: pb::SampleKind, label: Option<i64>| pb::Sample {
            kind: kind as i32,
            model_name: "rain".into(),
            model_version: "1.0.0".into(),
            request_id: format!("r{seq}"),
            observed_at: crate::weather::at(t),
            inputs: vec![pb::SampleTensor {
                name: "temp".into(),
                dtype: "float32".into(),
                shape: vec![1, 16],
                data: vec![7; 64],
            }],
            predicted_class: Some(1),
            confidence: Some(0.4),
            label,
        };
        samples.push(row(
            pb::SampleKind::Feedback,
            Some(i64::from(!seq.is_multiple_of(3))),
        ));
        samples.push(row(pb::SampleKind::HardExample, None));
    }
    pb::TelemetryReport {
        sequence: seq,
        sketches: vec![sketch(t, temp, classes)],
        samples,
        ..Default::default()
    }
}

/// One round: every device reports at `t` (report number `seq`), as the
/// handler would, then one flush (the handler's flushes are group
/// commits).
pub async fn round(core: &Arc<Core>, fleet: Fleet, seq: u64, t: i64, hot: bool) {
    let core2 = core.clone();
    tokio::task::spawn_blocking(move || {
        let admit = telemetry::Admission {
            quota: core2.config.device_quota,
            quotas: &core2.device_quotas,
        };
        for d in 0..fleet.devices {
            let (_, models) = telemetry::record_telemetry(
                &core2.store,
                &admit,
                &device(d),
                report(fleet, d, seq, t, hot),
                at(t),
            )
            .expect("a report is stored");
            for model in &models {
                edgeloop_drift::retention::enforce(
                    &core2.store.drift,
                    model,
                    core2.config.max_samples_per_model,
                )
                .expect("sample retention");
            }
        }
    })
    .await
    .expect("a round");
    core.store.flush().await.expect("flush");
}

/// Simulated day `day` (0-based): `reports_per_day` rounds, evenly
/// spaced, each on the core's clock; `seq` is the last report number
/// sent before and is advanced.
pub async fn day(cp: &ControlPlane, fleet: Fleet, day: i64, seq: &mut u64, hot: bool) {
    let step = DAY / i64::from(fleet.reports_per_day.max(1));
    for r in 0..i64::from(fleet.reports_per_day) {
        *seq += 1;
        let t = BASE + day * DAY + r * step;
        cp.core.clock.set(at(t));
        round(&cp.core, fleet, *seq, t, hot).await;
    }
}
