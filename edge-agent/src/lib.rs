//! The Edgeloop edge agent: enrolls with the control plane (mTLS identity
//! kept in the device's data dir, key mode 0600) and heartbeats with
//! reconnect backoff; syncs its assigned models into A/B slots; serves them
//! over the Open Inference Protocol v2 (REST and gRPC); records drift sketches and
//! buffers telemetry while offline.

pub mod config;
pub mod crash_point;
pub mod observe;
pub mod serve;
pub mod serving;
pub mod sync;
pub mod telemetry;

use std::sync::Arc;

use anyhow::Context as _;
use edgeloop_client_core::member::{create_private_dir, host_capabilities};
use edgeloop_client_core::{run_member, Membership, Role};
use edgeloop_proto::common::v1::Capabilities;
use tokio_util::sync::CancellationToken;

pub use config::{AgentConfig, AgentSettings};

/// The file, in the data dir, that holds the inference API's bound address
/// (`127.0.0.1:8000`), so scripts and tests can find a port chosen by the OS.
pub const INFERENCE_ADDR_FILE: &str = "inference.addr";

/// The file, in the data dir, that holds the gRPC inference service's bound
/// address, for the same reason.
pub const GRPC_INFERENCE_ADDR_FILE: &str = "grpc-inference.addr";

/// What this device reports at enrollment and in heartbeats: the host, and
/// the execution providers its ONNX Runtime library ships (a GPU build has
/// `libonnxruntime_providers_<name>.so` beside the library). The library is
/// looked at, not loaded: loading it costs about 10 MB of resident memory,
/// which an idle device without a model should not pay. A missing library
/// is reported in `extra` instead.
pub fn capabilities(config: &AgentConfig) -> Capabilities {
    capabilities_on(config, &edgeloop_client_core::gpu::LocalGpus::detect())
}

/// [`capabilities`] on a machine with `gpus`.
pub fn capabilities_on(
    config: &AgentConfig,
    gpus: &edgeloop_client_core::gpu::LocalGpus,
) -> Capabilities {
    let mut caps = host_capabilities(&config.member.data_dir, env!("CARGO_PKG_VERSION"), gpus);
    let library = edgeloop_models::runtime::OrtRuntime::resolve_library_path(
        config.serve.ort_library.as_deref(),
    );
    let driver_problem = gpu_driver_problem(gpus);
    if let Some(problem) = &driver_problem {
        caps.extra.insert("gpu_error".into(), problem.clone());
    }
    match library {
        Ok(path) if path.is_file() => {
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            // A driver too old for the GPU build runs none of its providers.
            let gpu_providers = if driver_problem.is_some() {
                &[][..]
            } else {
                &[
                    (
                        "libonnxruntime_providers_tensorrt.so",
                        "TensorrtExecutionProvider",
                    ),
                    ("libonnxruntime_providers_cuda.so", "CUDAExecutionProvider"),
                ][..]
            };
            for &(file, provider) in gpu_providers {
                if dir.join(file).is_file() {
                    caps.execution_providers.push(provider.into());
                }
            }
            caps.execution_providers
                .push(edgeloop_models::runtime::CPU_PROVIDER.into());
            caps.extra.insert(
                edgeloop_models::runtime::INPUT_DTYPES_CAPABILITY.into(),
                edgeloop_models::tensor::DType::ALL
                    .map(|d| d.numpy_name())
                    .join(","),
            );
        }
        Ok(path) => {
            caps.extra.insert(
                "onnxruntime_error".into(),
                format!("no ONNX Runtime library at {}", path.display()),
            );
        }
        Err(e) => {
            caps.extra.insert("onnxruntime_error".into(), e.to_string());
        }
    }
    caps
}

/// Why this machine's NVIDIA driver cannot run the GPU build of ONNX
/// Runtime (it is older than the one CUDA 13 needs), or `None`.
fn gpu_driver_problem(gpus: &edgeloop_client_core::gpu::LocalGpus) -> Option<String> {
    if gpus.gpus.is_empty() {
        return None;
    }
    edgeloop_models::cuda::gpu_build_driver_problem(gpus.driver_version.as_deref())
}

/// `config` serving on the CPU alone when the driver cannot run the GPU
/// build: said once, at start, as an error naming the driver and the
/// version it needs, rather than as a provider warning at each load.
fn with_usable_providers(mut config: AgentConfig) -> AgentConfig {
    let wants_gpu = config
        .serve
        .providers
        .iter()
        .any(|p| *p != config::Provider::Cpu);
    if wants_gpu {
        let gpus = edgeloop_client_core::gpu::LocalGpus::detect();
        if let Some(problem) = gpu_driver_problem(&gpus) {
            tracing::error!("{problem}; serving on the CPU");
            config.serve.providers = vec![config::Provider::Cpu];
        }
    }
    config
}

/// Runs the agent until `shutdown`: the inference API (REST and gRPC, each on
/// its own listener, one request path), model sync, the
/// telemetry uploader and the heartbeat side by side. Serving stops first
/// on the way out, so the last requests still land in the final telemetry
/// window, which the uploader then persists.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    edgeloop_client_core::install_crypto_provider();
    let config = with_usable_providers(config);
    let data_dir = config.member.data_dir.clone();
    create_private_dir(&data_dir)
        .with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let telemetry = telemetry::Telemetry::open(
        &data_dir,
        telemetry::TelemetryOptions::new(&config.telemetry),
    )
    .context("opening the telemetry buffer")?;
    let host = serve::ModelHost::new(config.serve.clone(), telemetry.clone());

    let listener = bind(
        &data_dir,
        config.serve.listen,
        INFERENCE_ADDR_FILE,
        "inference API",
    )
    .await?;
    let grpc_listener = bind(
        &data_dir,
        config.serve.grpc_listen,
        GRPC_INFERENCE_ADDR_FILE,
        "gRPC inference service",
    )
    .await?;
    let serve_stop = CancellationToken::new();
    let app = serve::router(host.clone()).merge(telemetry::feedback_router(
        telemetry.clone(),
        config.api.feedback_labels_per_minute,
    ));
    let app = serve::access::http(app, &config.api);
    let api = match &config.api.tls {
        None => tokio::spawn(serve::serve_app(app, listener, serve_stop.clone())),
        Some(tls) => {
            let tls = edgeloop_client_core::https::server_config(
                &tls.cert_pem,
                &tls.key_pem,
                tls.client_ca_pem.as_deref(),
            )
            .context("the inference API's TLS")?;
            tokio::spawn(edgeloop_client_core::https::serve(
                app,
                listener,
                Arc::new(tls),
                serve_stop.clone(),
            ))
        }
    };
    let grpc = {
        let (host, access, stop) = (host.clone(), config.api.clone(), serve_stop.clone());
        tokio::spawn(async move {
            serve::serve_grpc_with_access(host, grpc_listener, &access, stop).await
        })
    };
    // Enrollment (in run_member) fills it; sync and telemetry wait for it.
    let membership = Membership::new(&config.member.control_plane, &config.member.data_dir);
    let telemetry_stop = CancellationToken::new();
    let uploader = tokio::spawn(telemetry::run(
        telemetry.clone(),
        config.member.clone(),
        membership.clone(),
        telemetry_stop.clone(),
    ));

    let member = run_member(
        Role::Device,
        &config.member,
        &membership,
        capabilities(&config),
        shutdown.clone(),
    );
    let serving: Arc<dyn serving::ModelServing> = host.clone();
    let sync = async {
        sync::run(&config, &membership, serving, shutdown.clone())
            .await
            .context("model sync")
    };
    let result = tokio::try_join!(member, sync).map(|_| ());
    // A revoked device ends here too: stop everything, in order.
    shutdown.cancel();
    serve_stop.cancel();
    let served = api.await.context("inference API task")?;
    let served_grpc = grpc.await.context("gRPC inference service task")?;
    telemetry_stop.cancel();
    let uploaded = uploader.await.context("telemetry task")?;
    result?;
    served.context("inference API")?;
    served_grpc.context("gRPC inference service")?;
    uploaded.context("telemetry")?;
    tracing::info!("edge agent stopped");
    Ok(())
}

/// Binds `addr` and writes the bound address (the OS picks the port for
/// `:0`) to `file` in the data dir.
async fn bind(
    data_dir: &std::path::Path,
    addr: std::net::SocketAddr,
    file: &str,
    what: &str,
) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} on {addr}"))?;
    let bound = listener.local_addr()?;
    edgeloop_models::fs::write_atomic(&data_dir.join(file), bound.to_string().as_bytes(), 0o644)
        .with_context(|| format!("writing the {what}'s address file"))?;
    tracing::info!(addr = %bound, "{what} (Open Inference Protocol v2) listening");
    Ok(listener)
}
