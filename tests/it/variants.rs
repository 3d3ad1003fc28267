//! Variants per hardware class: one model version carries its own artifact
//! and a variant for devices with a GPU provider; one deployment gives each
//! device the one that fits the execution providers it reports.
//!
//! There is no GPU here. The "GPU" device is a real agent whose ONNX
//! Runtime directory also holds an (empty) `libonnxruntime_providers_cuda.so`,
//! so it reports `CUDAExecutionProvider` the way a GPU build makes it; it
//! serves on the CPU, which is all this test needs: the variant is a second
//! signed artifact of the same model with the same interface, and what is
//! under test is who gets which.

use std::time::Duration;

use edgeloop_edge_agent::AgentConfig;
use edgeloop_models::manifest::{Manifest, ManifestKey, QuantizationRecord};
use edgeloop_models::onnx;
use edgeloop_models::Digest;
use edgeloop_tests::mnist::{mnist_dir, probe_npz};
use edgeloop_tests::{eventually, settings, ControlPlane};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const MODEL: &str = "digits";
const VERSION: &str = "1.0.0";
const WAIT: Duration = Duration::from_secs(120);

/// Uploads `model` and its manifest signed by `key`; the two digests.
async fn upload_signed(
    cp: &ControlPlane,
    key: &ManifestKey,
    manifest: Manifest,
    model: &[u8],
) -> (Digest, Digest) {
    let artifact = cp.upload(model).await;
    let signed = key.sign(manifest).unwrap().to_json_pretty().unwrap();
    (artifact, cp.upload(signed.as_bytes()).await)
}

/// The same network with another producer name: another artifact (another
/// digest) with the same interface, as an fp16 or TensorRT-tuned export is.
fn re_exported(model: &[u8]) -> Vec<u8> {
    let mut m = onnx::decode(model).unwrap();
    m.set_producer_name("edgeloop-tests variant".into());
    // Larger than the version's own, as an fp16 artifact beside an int8
    // one is: the deployment's disk check must count the larger.
    m.set_doc_string("a variant ".repeat(100));
    onnx::encode(&m).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_device_gets_the_variant_that_fits_its_providers() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(edgeloop_control_plane::ServeSettings {
        rollout_tick_ms: Some(200),
        ..settings(&dir.path().join("cp"))
    })
    .await;
    let (status, body) = cp
        .api()
        .post("/api/v1/models", json!({"name": MODEL}))
        .await;
    assert_eq!(status, 201, "{body}");
    let key = ManifestKey::generate();
    let own = std::fs::read(mnist_dir().join("mlp.onnx")).unwrap();
    let gpu = re_exported(&own);
    let probe = cp.upload(&probe_npz(4)).await;
    let manifest = |bytes: &[u8]| {
        edgeloop_tests::manifests::mnist_manifest(MODEL, VERSION, bytes, probe, 5000.0)
    };

    cp.register_signed(&key, manifest(&own), &own).await;
    let artifact = Digest::of(&own);

    // The variant, with its own gate evidence in its manifest.
    let evidence = QuantizationRecord::new(
        "fp16",
        &json!({"chosen": "fp16", "accuracy_drop_points": 0.1}),
    )
    .unwrap();
    let (gpu_artifact, gpu_manifest) = upload_signed(
        &cp,
        &key,
        Manifest {
            quantization: Some(evidence),
            ..manifest(&gpu)
        },
        &gpu,
    )
    .await;
    let variants = format!("/api/v1/models/{MODEL}/versions/{VERSION}/variants");
    let request = |name: &str, providers: Value, manifest: Digest| {
        json!({"name": name, "artifact_digest": gpu_artifact.to_string(),
               "manifest_digest": manifest.to_string(), "providers": providers})
    };
    let gpu_providers = json!(["TensorrtExecutionProvider", "CUDAExecutionProvider"]);
    let (status, body) = cp
        .api()
        .post(
            &variants,
            request("gpu", gpu_providers.clone(), gpu_manifest),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let variant = &body["variants"][0];
    assert_eq!(variant["name"], "gpu");
    assert_eq!(variant["artifact_digest"], gpu_artifact.to_hex());
    assert_eq!(variant["quantization"]["method"], "fp16", "{body}");

    // What the registry refuses, each naming the field.
    let (status, body) = cp
        .api()
        .post(
            &variants,
            request("gpu", gpu_providers.clone(), gpu_manifest),
        )
        .await;
    assert_eq!(status, 409, "the same name twice: {body}");
    let (status, body) = cp
        .api()
        .post(&variants, request("other", json!(["cuda"]), gpu_manifest))
        .await;
    assert_eq!(
        (status.as_u16(), body["error"]["field"].as_str()),
        (400, Some("providers[0]")),
        "{body}"
    );
    let narrower =
        edgeloop_tests::manifests::manifest(MODEL, VERSION, &gpu, ("input", 784), ("logits", 5));
    let (_, narrower) = upload_signed(&cp, &key, narrower, &gpu).await;
    let (status, body) = cp
        .api()
        .post(
            &variants,
            request("narrow", gpu_providers.clone(), narrower),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("drop-in"),
        "{body}"
    );
    let later = manifest(&gpu);
    let (_, later) = upload_signed(
        &cp,
        &key,
        Manifest {
            version: "2.0.0".into(),
            ..later
        },
        &gpu,
    )
    .await;
    let (status, body) = cp
        .api()
        .post(&variants, request("later", gpu_providers.clone(), later))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("2.0.0"),
        "{body}"
    );

    // Two devices: one reports CUDA (a GPU build's provider library beside
    // its ONNX Runtime), one does not.
    let real = edgeloop_models::runtime::OrtRuntime::resolve_library_path(None).unwrap();
    let gpu_build = dir.path().join("ort-gpu");
    std::fs::create_dir_all(&gpu_build).unwrap();
    let linked = gpu_build.join(real.file_name().unwrap());
    std::os::unix::fs::symlink(&real, &linked).unwrap();
    std::fs::write(gpu_build.join("libonnxruntime_providers_cuda.so"), b"").unwrap();
    let stop = CancellationToken::new();
    let mut agents = Vec::new();
    for (name, library) in [("edge-cpu", None), ("edge-gpu", Some(linked.clone()))] {
        let token = cp
            .labelled_token("device", name, json!({"site": "lab"}))
            .await;
        let mut config = AgentConfig::new(
            cp.member_config(&dir.path().join(name), Some(token)),
            vec![key.public()],
        );
        if library.is_some() {
            config.serve.ort_library = library;
        }
        agents.push(tokio::spawn(edgeloop_edge_agent::run(config, stop.clone())));
    }
    eventually(
        WAIT,
        "both devices online, the GPU one with CUDA",
        || async {
            let (_, gpu) = cp.api().get("/api/v1/devices/edge-gpu").await;
            let (_, cpu) = cp.api().get("/api/v1/devices/edge-cpu").await;
            let cuda = gpu["capabilities"]["execution_providers"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p == "CUDAExecutionProvider"));
            (gpu["status"] == "online" && cpu["status"] == "online" && cuda).then_some(())
        },
    )
    .await;

    let (status, body) = cp
        .api()
        .post(
            "/api/v1/deployments",
            json!({"model": MODEL, "version": VERSION, "selector": "site=lab",
                   "strategy": {"waves": {"count": [2]}, "min_soak_seconds": 1,
                                "wave_timeout_seconds": 90, "rollback_timeout_seconds": 60},
                   "gates": {"min_requests": 0}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let ended = eventually(WAIT, "the deployment ends", || async {
        let (_, d) = cp.api().get(&format!("/api/v1/deployments/{id}")).await;
        matches!(
            d["state"].as_str(),
            Some("succeeded" | "rolled_back" | "failed" | "cancelled")
        )
        .then_some(d)
    })
    .await;
    assert_eq!(ended["state"], "succeeded", "{ended}");
    assert_eq!(ended["variants"], json!({"edge-gpu": "gpu"}), "{ended}");
    // Disk is checked for the largest artifact a device may get.
    assert!(gpu.len() > own.len());
    assert_eq!(
        ended["requirements"]["free_disk_bytes"],
        own.len().max(gpu.len()) as u64,
        "{ended}"
    );
    for (device, want) in [("edge-gpu", gpu_artifact), ("edge-cpu", artifact)] {
        let set = cp
            .core
            .store
            .fleet
            .assignments
            .get(device)
            .unwrap()
            .unwrap();
        let a = set
            .assignments
            .iter()
            .find(|a| a.model_name == MODEL)
            .unwrap();
        assert_eq!(
            (a.model_version.as_str(), a.artifact_digest),
            (VERSION, want),
            "{device}"
        );
        let status = cp
            .core
            .store
            .fleet
            .assignment_status
            .get(&format!("{device}/{MODEL}"))
            .unwrap()
            .unwrap();
        assert_eq!(
            status.running_version.as_deref(),
            Some(VERSION),
            "{device} serves it"
        );
    }

    // The CPU device now claims a GPU: that changes what a future rollout
    // may pick for it, never what it may fetch now. The GPU variant is not
    // in its assignment set, so its bytes are refused.
    use edgeloop_proto::agent::v1 as pb;
    use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
    let identity = edgeloop_client_core::identity::IdentityStore::new(&dir.path().join("edge-cpu"))
        .load()
        .unwrap()
        .expect("the CPU agent's identity");
    let mut liar = AgentServiceClient::new(
        edgeloop_client_core::tls::mtls_endpoint(&cp.grpc_url, &identity)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    liar.heartbeat(edgeloop_proto::common::v1::HeartbeatRequest {
        sent_at: None,
        capabilities: Some(edgeloop_proto::common::v1::Capabilities {
            execution_providers: vec![
                "TensorrtExecutionProvider".into(),
                "CUDAExecutionProvider".into(),
            ],
            ..Default::default()
        }),
    })
    .await
    .unwrap();
    let (_, shown) = cp.api().get("/api/v1/devices/edge-cpu").await;
    assert_eq!(
        shown["capabilities"]["execution_providers"][1], "CUDAExecutionProvider",
        "the claim is recorded: {shown}"
    );
    let refused = match liar
        .fetch_artifact(pb::FetchArtifactRequest {
            digest: gpu_artifact.to_string(),
            offset: 0,
            max_chunk_bytes: 0,
        })
        .await
    {
        Err(status) => status,
        Ok(stream) => stream.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(
        refused.code(),
        tonic::Code::PermissionDenied,
        "the GPU variant is not the CPU device's: {refused}"
    );
    // Its own assignment still downloads.
    let mut own_bytes = liar
        .fetch_artifact(pb::FetchArtifactRequest {
            digest: artifact.to_string(),
            offset: 0,
            max_chunk_bytes: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(own_bytes.message().await.unwrap().is_some());

    stop.cancel();
    for a in agents {
        a.await.unwrap().unwrap();
    }
    cp.stop().await;
}

/// A GPU build of ONNX Runtime on a machine whose NVIDIA driver is older
/// than CUDA 13 needs: the device claims no GPU provider, and says why in
/// its capabilities (`gpu_error`, naming the driver and the version it
/// needs); on a new enough driver it claims them.
#[test]
fn a_driver_too_old_for_the_gpu_build_claims_no_gpu_provider_and_says_why() {
    use edgeloop_client_core::gpu::{LocalGpu, LocalGpus};
    let dir = tempfile::tempdir().unwrap();
    let real = edgeloop_models::runtime::OrtRuntime::resolve_library_path(None).unwrap();
    let gpu_build = dir.path().join("ort-gpu");
    std::fs::create_dir_all(&gpu_build).unwrap();
    let linked = gpu_build.join(real.file_name().unwrap());
    std::os::unix::fs::symlink(&real, &linked).unwrap();
    for provider in ["cuda", "tensorrt"] {
        std::fs::write(
            gpu_build.join(format!("libonnxruntime_providers_{provider}.so")),
            b"",
        )
        .unwrap();
    }
    let member = edgeloop_client_core::MemberConfig {
        data_dir: dir.path().join("agent"),
        control_plane: "https://localhost:1".into(),
        bootstrap_token: None,
        backoff: edgeloop_client_core::Backoff::default(),
    };
    let mut config = AgentConfig::new(member, vec![]);
    config.serve.ort_library = Some(linked);
    let machine = |driver: &str| LocalGpus {
        gpus: vec![LocalGpu {
            index: 0,
            name: "NVIDIA A100".into(),
            memory_bytes: 40 << 30,
        }],
        driver_version: Some(driver.into()),
        source: "test".into(),
        ..Default::default()
    };
    let old = edgeloop_edge_agent::capabilities_on(&config, &machine("535.104.05"));
    assert_eq!(old.execution_providers, ["CPUExecutionProvider"]);
    let why = &old.extra["gpu_error"];
    assert!(
        why.contains("535.104.05") && why.contains("580.65.06") && why.contains("CUDA 13"),
        "{why}"
    );
    let new = edgeloop_edge_agent::capabilities_on(&config, &machine("580.95.05"));
    assert_eq!(
        new.execution_providers,
        [
            "TensorrtExecutionProvider",
            "CUDAExecutionProvider",
            "CPUExecutionProvider"
        ]
    );
    assert!(!new.extra.contains_key("gpu_error"));
}
