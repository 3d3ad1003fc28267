//! Activation: a version that fails to load, does not match its manifest,
//! or fails its health probe never serves, and the serving one stays.

use std::sync::Arc;
use std::time::Duration;

use edgeloop_edge_agent::serving::{ActivationError, ModelServing, PrepareSpec, Serving};
use edgeloop_models::manifest::{DimSpec, IoSignature, TensorSpec};
use edgeloop_models::runtime::CPU_PROVIDER;

use crate::common::*;

fn signature(width: i64) -> IoSignature {
    let spec = |name: &str| TensorSpec {
        name: name.into(),
        dtype: "float32".into(),
        shape: vec![DimSpec::Symbolic("N".into()), DimSpec::Fixed(width)],
    };
    IoSignature {
        inputs: vec![spec("x")],
        outputs: vec![spec("y")],
    }
}

/// A manifest around `signature`, borrowed from the fixtures' shape.
fn manifest(signature: IoSignature) -> edgeloop_models::manifest::Manifest {
    let mut m: edgeloop_models::manifest::Manifest = serde_json::from_value(serde_json::json!({
        "schema": 1,
        "name": "add",
        "version": "2.0.0",
        "artifact": { "sha256": "0".repeat(64), "size": 1, "format": "onnx" },
        "signature": { "inputs": [], "outputs": [] },
        "quantization": null,
        "reference_stats": null,
        "lineage": { "job": null, "checkpoint": null, "dataset": null, "parent_version": null },
        "health_probe": null,
        "created_at": "2026-01-01T00:00:00Z",
    }))
    .unwrap();
    m.signature = signature;
    m
}

/// What was wrong, the activation, the error kind wanted, part of its message.
type Case<'a> = (&'a str, PrepareSpec, fn(&ActivationError) -> bool, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_activation_keeps_the_old_version_serving() {
    let recorder = Arc::new(Recorder::default());
    let server = start_observed(config(), recorder.clone()).await;
    let models = Models::new();
    let v1 = models.write("add1", &add_model(1.0));
    let nan = models.write("nan", &nan_model());
    let sample = vec![("x".to_string(), f32_tensor(&[3, 4], noise(12, 3)))];
    let generous = Duration::from_secs(5);

    let serving = server
        .host
        .activate(PrepareSpec {
            probe: probe(sample.clone(), generous),
            manifest: Some(manifest(signature(4))),
            ..spec("add", "1", &v1)
        })
        .await
        .unwrap();
    assert_eq!(
        serving,
        Serving {
            version: "1".into(),
            provider: CPU_PROVIDER.into()
        }
    );

    let missing = models.dir.path().join("missing.onnx");
    let cases: Vec<Case<'_>> = vec![
        (
            "NaN output",
            PrepareSpec {
                probe: probe(sample.clone(), generous),
                ..spec("add", "2", &nan)
            },
            |e| matches!(e, ActivationError::Probe(_)),
            "not finite",
        ),
        (
            "latency limit 0",
            PrepareSpec {
                probe: probe(sample.clone(), Duration::ZERO),
                ..spec("add", "2", &v1)
            },
            |e| matches!(e, ActivationError::Probe(_)),
            "over its limit",
        ),
        (
            "probe input of the wrong width",
            PrepareSpec {
                probe: probe(
                    vec![("x".to_string(), f32_tensor(&[1, 5], vec![0.0; 5]))],
                    generous,
                ),
                ..spec("add", "2", &v1)
            },
            |e| matches!(e, ActivationError::Probe(_)),
            "sample inputs",
        ),
        (
            "manifest signature differs",
            PrepareSpec {
                manifest: Some(manifest(signature(5))),
                ..spec("add", "2", &v1)
            },
            |e| matches!(e, ActivationError::Signature(_)),
            "the manifest says shape [?, 5], the model has [?, 4]",
        ),
        (
            "no such file",
            spec("add", "2", &missing),
            |e| matches!(e, ActivationError::Load(_)),
            "missing.onnx",
        ),
        (
            "not an ONNX model",
            spec("add", "2", &models.write("junk", b"not a model")),
            |e| matches!(e, ActivationError::Load(_)),
            "",
        ),
    ];
    let body = infer_body("x", &[1, 4], &[0.0, 1.0, 2.0, 3.0]);
    for (what, spec, kind, message) in cases {
        let err = server.host.activate(spec).await.unwrap_err();
        assert!(kind(&err), "{what}: wrong kind {err:?}");
        assert!(err.to_string().contains(message), "{what}: {err}");
        // The old version still serves, and answers as itself.
        assert_eq!(server.host.serving("add").unwrap().version, "1", "{what}");
        let got = server.post("/v2/models/add/infer", &body).await;
        assert_eq!(got.status, 200, "{what}: {}", got.text);
        assert_eq!(got.body["model_version"], "1");
        assert_eq!(output_data(&got.body, 0), vec![1.0, 2.0, 3.0, 4.0]);
    }
    // Only the one good activation was announced.
    assert_eq!(
        *recorder.activated.lock().unwrap(),
        vec![("add".to_string(), "1".to_string(), true)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_swaps_back_to_the_previous_version() {
    let recorder = Arc::new(Recorder::default());
    let server = start_observed(config(), recorder.clone()).await;
    let models = Models::new();
    let v1 = models.write("add1", &add_model(1.0));
    let v2 = models.write("add2", &add_model(2.0));
    let body = infer_body("x", &[1, 4], &[0.0; 4]);
    let answer = |server: &Server| {
        let (client, url, body) = (
            server.client.clone(),
            format!("{}/v2/models/add/infer", server.base),
            body.clone(),
        );
        async move {
            let r: serde_json::Value = client
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (
                r["model_version"].as_str().unwrap().to_string(),
                output_data(&r, 0)[0],
            )
        }
    };
    server.host.activate(spec("add", "1", &v1)).await.unwrap();
    assert_eq!(answer(&server).await, ("1".into(), 1.0));
    server.host.activate(spec("add", "2", &v2)).await.unwrap();
    assert_eq!(answer(&server).await, ("2".into(), 2.0));
    // Re-activating the previous version is a rollback (sync owns the files).
    server.host.activate(spec("add", "1", &v1)).await.unwrap();
    assert_eq!(answer(&server).await, ("1".into(), 1.0));
    // Activating what already serves changes nothing.
    server.host.activate(spec("add", "1", &v1)).await.unwrap();
    assert_eq!(recorder.activated.lock().unwrap().len(), 3);
    // The old version's versioned path is gone once it stops serving.
    let old = server.post("/v2/models/add/versions/2/infer", &body).await;
    assert_eq!(old.status, 404, "{}", old.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_dynamic_sizes_warms_up_on_its_probe_inputs() {
    let server = start(config()).await;
    let host = &server.host;
    let models = Models::new();
    let path = models.write("sized", &sized_model());
    // Without a probe the warm-up guesses 1 for every symbolic dimension,
    // and this model cannot run on that: the activation says what to do.
    let err = host.activate(spec("sized", "1", &path)).await.unwrap_err();
    let ActivationError::Probe(why) = &err else {
        panic!("{err:?}")
    };
    assert!(
        why.contains("give a model with dynamic sizes a probe"),
        "{why}"
    );
    // With a probe of the shape it is meant for, it warms up and serves.
    let mut with_probe = spec("sized", "1", &path);
    with_probe.probe = probe(
        vec![("x".into(), f32_tensor(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]))],
        Duration::from_secs(5),
    );
    host.activate(with_probe).await.unwrap();
}
