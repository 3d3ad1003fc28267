//! `Telemetry` as the serving path and the feedback API use it: observations
//! with real tensors in, sketches, samples and batches out.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use edgeloop_models::manifest::{
    ArtifactRef, ClassShare, InputHistogram, IoSignature, Lineage, Manifest, ReferenceStats,
};
use edgeloop_models::tensor::Tensor;
use edgeloop_models::Digest;
use http_body_util::BodyExt as _;
use ndarray::{ArrayD, IxDyn};
use serde_json::{json, Value};
use tower::ServiceExt as _;

use super::*;

fn options() -> TelemetryOptions {
    TelemetryOptions {
        max_batches: 1000,
        ..TelemetryOptions::new(&TelemetryConfig {
            interval: Duration::from_secs(3600),
            max_batches: 1000,
        })
    }
}

fn open(dir: &Path, options: TelemetryOptions) -> Arc<Telemetry> {
    Telemetry::open(dir, options).unwrap()
}

fn manifest(edges: Vec<f64>) -> Manifest {
    let bins = edges.len() - 1;
    Manifest {
        schema: 1,
        name: "m".into(),
        version: "1.0.0".into(),
        artifact: ArtifactRef {
            sha256: Digest::of(b"model"),
            size: 5,
            format: "onnx".into(),
        },
        signature: IoSignature {
            inputs: vec![],
            outputs: vec![],
        },
        quantization: None,
        reference_stats: Some(ReferenceStats {
            inputs: vec![InputHistogram {
                name: "x".into(),
                bin_edges: edges,
                counts: vec![1; bins],
                input: None,
                column: None,
            }],
            prediction_distribution: vec![ClassShare {
                class: 0,
                share: 1.0,
            }],
            sample_count: bins as u64,
        }),
        lineage: Lineage::default(),
        health_probe: None,
        created_at: "2026-01-01T00:00:00Z".into(),
        min_version: None,
        rollback: false,
    }
}

fn f32s(shape: &[usize], values: Vec<f32>) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

/// One request with input `x` and classifier output `y`.
fn observe(t: &Telemetry, model: &str, id: &str, x: Tensor, y: Tensor, ok: bool) {
    let inputs = vec![("x".to_string(), x)];
    let outputs = if ok {
        vec![("y".to_string(), y)]
    } else {
        vec![]
    };
    t.observe(&Observation {
        model,
        version: "1.0.0",
        request_id: id,
        inputs: &inputs,
        outputs: &outputs,
        latency: Duration::from_millis(4),
        ok,
    });
}

fn labels(pairs: &[(&str, i64)]) -> Vec<FeedbackLabel> {
    pairs
        .iter()
        .map(|(id, label)| FeedbackLabel {
            id: id.to_string(),
            label: *label,
        })
        .collect()
}

#[test]
fn observations_become_sketches_on_the_reference_edges() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    t.model_activated("m", "1.0.0", Some(&manifest(vec![0.0, 1.0, 2.0])));
    // Two rows; x values 0.5 and 1.5 in range, -1 under, 2 on the last edge,
    // 7 over. Logits: class 1 (confident), class 0 (not).
    observe(
        &t,
        "m",
        "r1",
        f32s(&[2, 3], vec![0.5, 1.5, -1.0, 2.0, 7.0, 0.5]),
        f32s(&[2, 2], vec![0.0, 5.0, 0.1, 0.0]),
        true,
    );
    observe(
        &t,
        "m",
        "r2",
        f32s(&[1, 3], vec![0.0; 3]),
        f32s(&[1], vec![0.0]),
        false,
    );
    assert_eq!(t.close_window().unwrap(), Some(1));

    let reports = t.buffer.reports();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert!(r.window_start.is_some() && r.window_end.is_some());
    let s = &r.sketches[0];
    assert_eq!(
        (s.model_name.as_str(), s.model_version.as_str()),
        ("m", "1.0.0")
    );
    assert_eq!((s.requests, s.errors), (2, 1));
    let f = &s.features[0];
    assert_eq!(f.name, "x");
    assert_eq!(f.bin_edges, vec![0.0, 1.0, 2.0]);
    // 0.5 0.5 | 1.5 2.0 ; -1 under ; 7 over
    assert_eq!(
        (f.counts.clone(), f.underflow, f.overflow),
        (vec![2, 2], 1, 1)
    );
    assert_eq!(
        s.classes,
        vec![
            pb::ClassCount { class: 0, count: 1 },
            pb::ClassCount { class: 1, count: 1 }
        ]
    );
    // softmax([0, 5]) = 0.993 -> bin 9; softmax([0.1, 0]) = 0.525 -> bin 5.
    assert_eq!(s.confidence_counts[9], 1);
    assert_eq!(s.confidence_counts[5], 1);
    assert_eq!(s.low_confidence, 1);
    assert!(
        (s.latency_p50_ms / 4.0 - 1.0).abs() < 0.1,
        "{}",
        s.latency_p50_ms
    );
    assert_eq!(r.models[0].requests, 2, "the summary metrics too");
}

#[test]
fn a_model_the_gate_measured_as_stateful_reports_no_classes() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    let mut m = manifest(vec![0.0, 1.0, 2.0]);
    m.quantization = Some(
        edgeloop_models::manifest::QuantizationRecord::new(
            "fp16",
            &json!({"task": {"kind": "stateful", "state": []}}),
        )
        .unwrap(),
    );
    assert!(!m.is_classifier());
    t.model_activated("m", "1.0.0", Some(&m));
    // A VAD's [1, 1] probability reads like a one-class score; it is not one.
    observe(
        &t,
        "m",
        "r",
        f32s(&[1, 3], vec![0.5; 3]),
        f32s(&[1, 1], vec![0.9]),
        true,
    );
    assert_eq!(t.close_window().unwrap(), Some(1));
    let s = &t.buffer.reports()[0].sketches[0];
    assert_eq!(s.requests, 1);
    assert!(s.classes.is_empty(), "{:?}", s.classes);
    assert_eq!(
        s.features[0].counts,
        vec![3, 0],
        "input drift still sketched"
    );
}

#[test]
fn without_a_manifest_there_are_no_feature_histograms() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    t.model_activated("m", "1.0.0", None);
    observe(
        &t,
        "m",
        "r",
        f32s(&[1, 1], vec![3.0]),
        f32s(&[1, 1], vec![0.95]),
        true,
    );
    t.close_window().unwrap();
    let s = &t.buffer.reports()[0].sketches[0];
    assert!(s.features.is_empty());
    assert_eq!(s.classes, vec![pb::ClassCount { class: 1, count: 1 }]);
    assert_eq!(s.confidence_counts[9], 1);
}

#[test]
fn an_idle_window_creates_no_batch() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    assert_eq!(t.close_window().unwrap(), None);
    observe(
        &t,
        "m",
        "r",
        f32s(&[1, 1], vec![0.0]),
        f32s(&[1, 2], vec![1.0, 0.0]),
        true,
    );
    assert_eq!(t.close_window().unwrap(), Some(1));
    assert_eq!(t.close_window().unwrap(), None);
}

#[test]
fn feedback_matches_predictions_and_keeps_a_rolling_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(
        dir.path(),
        TelemetryOptions {
            accuracy_window: 3,
            ..options()
        },
    );
    assert!(matches!(
        t.feedback("m", &labels(&[("a", 0)])),
        Err(FeedbackError::UnknownModel(_))
    ));
    for (id, class) in [("a", 0), ("b", 1), ("c", 1)] {
        let logits = if class == 0 {
            vec![3.0, 0.0]
        } else {
            vec![0.0, 3.0]
        };
        observe(
            &t,
            "m",
            id,
            f32s(&[1, 2], vec![1.0, 2.0]),
            f32s(&[1, 2], logits),
            true,
        );
    }
    let reply = t
        .feedback("m", &labels(&[("a", 0), ("b", 1), ("c", 0), ("zz", 1)]))
        .unwrap();
    assert_eq!(reply.matched, 3);
    assert_eq!(reply.unknown_ids, vec!["zz".to_string()]);
    assert_eq!(reply.window, 3);
    assert!((reply.rolling_accuracy.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    // A second label for the same prediction is matched, not counted again.
    let again = t.feedback("m", &labels(&[("a", 1)])).unwrap();
    assert_eq!((again.matched, again.window), (1, 3));
    assert_eq!(again.rolling_accuracy, reply.rolling_accuracy);

    // Each first label queued one sample, with the row's inputs.
    assert_eq!(t.stats().unwrap().samples, 3);
    t.close_window().unwrap();
    let head = t.buffer.head().unwrap().unwrap();
    let c = head.samples.iter().find(|s| s.request_id == "c").unwrap();
    assert_eq!(c.kind, pb::SampleKind::Feedback as i32);
    assert_eq!((c.predicted_class, c.label), (Some(1), Some(0)));
    assert_eq!(c.inputs[0].shape, vec![1, 2]);
    assert_eq!(c.inputs[0].data.len(), 8);
}

#[test]
fn rows_of_a_batched_request_are_known_by_id_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    observe(
        &t,
        "m",
        "req",
        f32s(&[2, 1], vec![1.0, 2.0]),
        f32s(&[2, 2], vec![3.0, 0.0, 0.0, 3.0]),
        true,
    );
    let reply = t
        .feedback("m", &labels(&[("req/0", 0), ("req/1", 0), ("req", 0)]))
        .unwrap();
    assert_eq!(reply.matched, 2);
    assert_eq!(reply.unknown_ids, vec!["req".to_string()]);
    assert_eq!(reply.rolling_accuracy, Some(0.5));
}

#[test]
fn hard_examples_are_sampled_per_window_and_take_labels() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(
        dir.path(),
        TelemetryOptions {
            hard_per_window: 4,
            ..options()
        },
    );
    for i in 0..20 {
        // [0.55, 0.45] is a distribution: confidence 0.55 < 0.6.
        observe(
            &t,
            "m",
            &format!("r{i}"),
            f32s(&[1, 1], vec![i as f32]),
            f32s(&[1, 2], vec![0.55, 0.45]),
            true,
        );
    }
    // A confident one is never a hard example.
    observe(
        &t,
        "m",
        "sure",
        f32s(&[1, 1], vec![0.0]),
        f32s(&[1, 2], vec![0.9, 0.1]),
        true,
    );
    let all: Vec<_> = (0..20).map(|i| (format!("r{i}"), 1)).collect();
    let all: Vec<_> = all.iter().map(|(id, l)| (id.as_str(), *l)).collect();
    t.feedback("m", &labels(&all)).unwrap();
    t.close_window().unwrap();

    let r = t.buffer.head().unwrap().unwrap();
    assert_eq!(r.sketches[0].low_confidence, 20);
    let hard: Vec<_> = r
        .samples
        .iter()
        .filter(|s| s.kind == pb::SampleKind::HardExample as i32)
        .collect();
    let labelled: Vec<_> = r
        .samples
        .iter()
        .filter(|s| s.kind == pb::SampleKind::Feedback as i32)
        .collect();
    // The 4 sampled rows took their labels; the other 16 were queued as feedback.
    assert_eq!((hard.len(), labelled.len()), (4, 16));
    for s in &hard {
        assert_eq!((s.predicted_class, s.label), (Some(0), Some(1)));
        assert!((s.confidence.unwrap() - 0.55).abs() < 1e-6);
        assert_eq!(s.inputs[0].data.len(), 4);
    }
}

#[test]
fn a_window_closed_during_requests_loses_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    t.model_activated("m", "1.0.0", Some(&manifest(vec![0.0, 1.0])));
    let (threads, per_thread) = (4, 300);
    std::thread::scope(|s| {
        for n in 0..threads {
            let t = &t;
            s.spawn(move || {
                for i in 0..per_thread {
                    observe(
                        t,
                        "m",
                        &format!("{n}-{i}"),
                        f32s(&[1, 1], vec![0.5]),
                        f32s(&[1, 2], vec![1.0, 0.0]),
                        true,
                    );
                }
            });
        }
        s.spawn(|| {
            for _ in 0..20 {
                t.close_window().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
    });
    t.close_window().unwrap();
    let (mut requests, mut in_bins) = (0, 0);
    for r in t.buffer.reports() {
        for s in r.sketches {
            requests += s.requests;
            in_bins += s.features[0].counts[0];
        }
    }
    assert_eq!(requests, threads * per_thread);
    assert_eq!(in_bins, threads * per_thread);
}

async fn call(router: axum::Router, uri: &str, body: &str) -> (StatusCode, Value) {
    let resp = router
        .oneshot(
            Request::post(uri)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn the_feedback_route() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), options());
    observe(
        &t,
        "m",
        "r1",
        f32s(&[1, 1], vec![0.0]),
        f32s(&[1, 2], vec![0.0, 2.0]),
        true,
    );
    let router = feedback_router(t.clone(), 100_000);

    let ok = json!({"labels": [{"id": "r1", "label": 1}, {"id": "r9", "label": 0}]});
    let (status, body) = call(router.clone(), "/v2/models/m/feedback", &ok.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"matched": 1, "unknown_ids": ["r9"], "rolling_accuracy": 1.0, "window": 1})
    );

    let (status, body) = call(router.clone(), "/v2/models/other/feedback", &ok.to_string()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("other"), "{body}");

    let bad = [
        ("not json", "invalid feedback body"),
        (r#"{"labels": []}"#, "labels"),
        (r#"{"labels": [{"id": "", "label": 1}]}"#, "labels[0].id"),
        (
            r#"{"labels": [{"id": "a", "label": "cat"}]}"#,
            "invalid feedback body",
        ),
        (
            r#"{"labels": [{"id": "a", "label": 1}], "extra": 1}"#,
            "extra",
        ),
        (
            r#"{"labels": [{"id": "a", "label": 1.5}]}"#,
            "invalid feedback body",
        ),
    ];
    for (body, want) in bad {
        let (status, reply) = call(router.clone(), "/v2/models/m/feedback", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let message = reply["error"].as_str().unwrap();
        assert!(message.contains(want), "{body}: {message}");
    }
}

#[test]
fn the_buffer_is_private_to_the_agent() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    drop(open(&data, options()));
    for d in [&data, &data.join("telemetry")] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
}

#[test]
fn the_buffer_and_sequence_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = open(dir.path(), options());
        observe(
            &t,
            "m",
            "r",
            f32s(&[1, 1], vec![0.0]),
            f32s(&[1, 2], vec![1.0, 0.0]),
            true,
        );
        assert_eq!(t.close_window().unwrap(), Some(1));
    }
    let t = open(dir.path(), options());
    assert_eq!(t.pending().unwrap(), vec![1]);
    observe(
        &t,
        "m",
        "r",
        f32s(&[1, 1], vec![0.0]),
        f32s(&[1, 2], vec![1.0, 0.0]),
        true,
    );
    assert_eq!(t.close_window().unwrap(), Some(2));
}

/// A buffer that cannot be opened (here: garbage where sled keeps its
/// files) is moved aside and replaced, so the device goes on serving and
/// reporting; the reset is counted in `/metrics`, and the new buffer has a
/// new epoch, so its sequences (from 1 again) are not taken for the old
/// one's at the control plane.
#[test]
fn a_corrupt_buffer_is_moved_aside_and_a_new_one_reports_under_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let old_epoch = {
        let t = open(dir.path(), options());
        observe(
            &t,
            "m",
            "r",
            f32s(&[1, 1], vec![0.0]),
            f32s(&[1, 2], vec![1.0, 0.0]),
            true,
        );
        assert_eq!(t.close_window().unwrap(), Some(1));
        t.buffer.epoch()
    };
    let store = dir.path().join("telemetry");
    for entry in std::fs::read_dir(&store).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::write(&p, b"not a sled file at all").unwrap();
        }
    }
    std::fs::write(store.join("conf"), b"garbage\x00\xff").unwrap();

    let t = open(dir.path(), options());
    assert!(t.pending().unwrap().is_empty(), "a new, empty buffer");
    assert_ne!(t.buffer.epoch(), old_epoch);
    assert!(t
        .metrics_text()
        .contains("edgeloop_agent_telemetry_store_resets_total 1\n"));
    let aside: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("telemetry.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    observe(
        &t,
        "m",
        "r",
        f32s(&[1, 1], vec![0.0]),
        f32s(&[1, 2], vec![1.0, 0.0]),
        true,
    );
    assert_eq!(t.close_window().unwrap(), Some(1));
    drop(t);
    // Opened again, it is the same new buffer: nothing moves, the count stays.
    let t = open(dir.path(), options());
    assert_eq!(t.pending().unwrap(), vec![1]);
    assert!(t
        .metrics_text()
        .contains("edgeloop_agent_telemetry_store_resets_total 1\n"));
}
