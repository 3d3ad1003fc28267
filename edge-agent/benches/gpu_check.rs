//! The GPU check (`scripts/gpu-check.sh` runs it): the agent's serving path
//! on each GPU execution provider, against ONNX Runtime itself in the same
//! run, for each model given.
//!
//! For every model and provider (`cuda`, `tensorrt`):
//! - **provider**: the version must actually serve on it (no silent CPU
//!   fallback), and `/metrics` must name it;
//! - **outputs**: one deterministic input through the agent's HTTP API,
//!   against a CPU session, within `GPU_CHECK_TOLERANCE` (default 1e-3
//!   absolute);
//! - **latency**: sequential batch-1 requests over HTTP against raw
//!   `ModelSession::run` on a session with the same provider, in interleaved
//!   blocks; p50/p99 of each and what the agent adds (goal: ≤ 0.1 ms p50);
//! - **ready time**: activation cold (TensorRT builds its engine) and after
//!   a restart with the same engine cache (goal: < 5 s);
//! - **GPU memory**: what `nvidia-smi` says the process uses, against the
//!   CUDA arena limit.
//!
//! Writes a Markdown report to `GPU_CHECK_REPORT` (and stdout). Exits 1 if a
//! hard check fails (wrong provider, outputs out of tolerance); the goals
//! are reported, not enforced: these numbers vary by GPU.
//!
//! `GPU_CHECK_PROVIDERS=cpu` runs the same plumbing on the CPU (the check
//! of this program itself on a machine without a GPU).
//!
//!     GPU_CHECK_MODELS=a.onnx,b.onnx EDGELOOP_ORT_LIBRARY=... \
//!       cargo bench -p edgeloop-edge-agent --bench gpu_check

#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeloop_edge_agent::config::{Provider, ServeConfig};
use edgeloop_edge_agent::observe::NoopObserver;
use edgeloop_edge_agent::serve::{serve, ModelHost};
use edgeloop_edge_agent::serving::{ModelServing, PrepareSpec, ProbeSpec};
use edgeloop_models::runtime::{ExecutionProvider, IoInfo, OrtRuntime, SessionOptions};
use edgeloop_models::{DType, Tensor};
use ndarray::{ArrayD, IxDyn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const ARENA_LIMIT: usize = 1 << 30;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::TensorRt => "TensorrtExecutionProvider",
        Provider::Cuda => "CUDAExecutionProvider",
        Provider::Cpu => "CPUExecutionProvider",
    }
}

fn ep(p: Provider, cache: Option<PathBuf>) -> ExecutionProvider {
    match p {
        Provider::TensorRt => ExecutionProvider::TensorRt {
            device_id: 0,
            engine_cache: cache,
            fp16: false,
        },
        Provider::Cuda => ExecutionProvider::Cuda {
            device_id: 0,
            mem_limit_bytes: Some(ARENA_LIMIT),
        },
        Provider::Cpu => ExecutionProvider::Cpu,
    }
}

fn config(library: &Path, provider: Provider, cache: &Path) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        ort_library: Some(library.to_path_buf()),
        providers: vec![provider, Provider::Cpu],
        cuda_mem_limit_bytes: Some(ARENA_LIMIT),
        trt_cache: Some(cache.to_path_buf()),
        trt_fp16: false,
        workers_per_model: 1,
        // Batch-1 latency is what is compared; batching would only wait.
        max_batch_size: 1,
        max_queue_delay: Duration::ZERO,
        queue_capacity: 1024,
        max_request_bytes: 64 << 20,
    }
}

/// A deterministic input for each of the model's inputs; dynamic
/// dimensions are 1 (`GPU_CHECK_DYNAMIC` overrides, e.g. 320 for a
/// detector's H×W).
fn inputs_for(io: &[IoInfo]) -> Vec<(String, Tensor)> {
    let dynamic: i64 = env("GPU_CHECK_DYNAMIC")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    io.iter()
        .map(|i| {
            let shape: Vec<usize> = i
                .shape
                .iter()
                .enumerate()
                .map(|(k, d)| match d {
                    Some(n) if *n > 0 => *n as usize,
                    _ if k == 0 => 1,
                    _ => dynamic as usize,
                })
                .collect();
            let n: usize = shape.iter().product();
            let tensor = match i.dtype {
                Some(DType::F32) | None => Tensor::F32(
                    ArrayD::from_shape_vec(
                        IxDyn(&shape),
                        (0..n).map(|j| ((j * 37) % 255) as f32 / 255.0).collect(),
                    )
                    .unwrap(),
                ),
                Some(DType::I64) => Tensor::I64(
                    ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(|j| (j % 7) as i64).collect())
                        .unwrap(),
                ),
                Some(other) => panic!("input {} is {other:?}; the check feeds f32 and i64", i.name),
            };
            (i.name.clone(), tensor)
        })
        .collect()
}

fn datatype(t: &Tensor) -> &'static str {
    match t {
        Tensor::F32(_) => "FP32",
        Tensor::I64(_) => "INT64",
        _ => "FP32",
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    match t {
        Tensor::F32(a) => a.iter().map(|&v| f64::from(v)).collect(),
        Tensor::I64(a) => a.iter().map(|&v| v as f64).collect(),
        Tensor::F16(a) => a.iter().map(|v| f64::from(v.to_f32())).collect(),
        Tensor::I32(a) => a.iter().map(|&v| f64::from(v)).collect(),
        _ => Vec::new(),
    }
}

fn infer_body(inputs: &[(String, Tensor)]) -> Vec<u8> {
    let inputs: Vec<serde_json::Value> = inputs
        .iter()
        .map(|(name, t)| {
            serde_json::json!({
                "name": name,
                "shape": t.shape(),
                "datatype": datatype(t),
                "data": values(t),
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({ "inputs": inputs })).unwrap()
}

/// A keep-alive HTTP/1.1 connection, one request at a time.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends a request; returns the status and the body.
    async fn send(&mut self, request: &[u8]) -> (u16, Vec<u8>) {
        self.stream.write_all(request).await.unwrap();
        self.buf.clear();
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end]).unwrap().to_string();
                let status: u16 = head[9..12].parse().unwrap();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                while self.buf.len() < end + 4 + length {
                    let mut chunk = [0u8; 64 << 10];
                    let n = self.stream.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the server closed the connection");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                return (status, self.buf[end + 4..end + 4 + length].to_vec());
            }
            let mut chunk = [0u8; 64 << 10];
            let n = self.stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn request(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: check\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// MiB of GPU memory this process holds, as `nvidia-smi` sees it.
fn gpu_memory_mib() -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    let me = std::process::id().to_string();
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (pid, mib) = l.split_once(',')?;
        (pid.trim() == me).then(|| mib.trim().parse().ok())?
    })
}

struct Outcome {
    failed: bool,
}

/// Activates `model` with the check's inputs as its health probe, as a
/// signed manifest's probe would be: the warm-up on zeros uses 1 for every
/// dynamic dimension, which a detector with dynamic H×W cannot run.
async fn activate(host: &ModelHost, model: &Path, inputs: &[(String, Tensor)]) -> Duration {
    let t = Instant::now();
    host.activate(PrepareSpec {
        model: "m".into(),
        version: "1".into(),
        path: model.to_path_buf(),
        manifest: None,
        probe: Some(ProbeSpec {
            inputs: inputs.to_vec(),
            max_latency: Duration::from_secs(600),
        }),
    })
    .await
    .unwrap();
    t.elapsed()
}

async fn check(
    report: &mut String,
    runtime: &OrtRuntime,
    library: &Path,
    model: &Path,
    provider: Provider,
    tolerance: f64,
) -> Outcome {
    let mut failed = false;
    let bytes = std::fs::read(model).unwrap();
    let cpu = runtime.session(&bytes, &SessionOptions::default()).unwrap();
    let inputs = inputs_for(cpu.inputs());
    let mut cpu = cpu;
    let named: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let reference = cpu.run(&named).unwrap();
    let want = provider_name(provider);
    let _ = writeln!(report, "\n### {} on {want}\n", model.display());

    let cache = tempfile::tempdir().unwrap();
    let host = ModelHost::new(
        config(library, provider, cache.path()),
        Arc::new(NoopObserver),
    );
    let cold = activate(&host, model, &inputs).await;
    let serving = host
        .serving_info()
        .first()
        .map(|i| i.provider.clone())
        .unwrap_or_default();
    let ok = serving == want;
    failed |= !ok;
    let _ = writeln!(
        report,
        "- provider in use: `{serving}` {}",
        if ok { "✓" } else { "✗ (fell back)" }
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(Arc::clone(&host), listener, stop.clone()));
    let mut conn = Conn::open(addr).await;

    // Outputs against the CPU.
    let infer = request("POST", "/v2/models/m/infer", &infer_body(&inputs));
    let (status, body) = conn.send(&infer).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let mut worst = 0.0f64;
    for (name, t) in &reference {
        let got: Vec<f64> = answer["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == name.as_str())
            .and_then(|o| o["data"].as_array())
            .map(|d| d.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default();
        let want = values(t);
        assert_eq!(got.len(), want.len(), "output {name}");
        for (a, b) in got.iter().zip(&want) {
            worst = worst.max((a - b).abs());
        }
    }
    let close = worst <= tolerance;
    failed |= !close;
    let _ = writeln!(
        report,
        "- outputs vs CPU: max |Δ| = {worst:.3e} (tolerance {tolerance:.0e}) {}",
        if close { "✓" } else { "✗" }
    );

    // Latency: the agent over HTTP against a raw session on the same provider.
    let mut raw = runtime
        .session(
            &bytes,
            &SessionOptions {
                providers: vec![
                    ep(provider, Some(cache.path().join("raw"))),
                    ExecutionProvider::Cpu,
                ],
                ..SessionOptions::default()
            },
        )
        .unwrap();
    let (mut raw_t, mut http_t) = (Vec::new(), Vec::new());
    let blocks: usize = env("GPU_CHECK_BLOCKS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for block in 0..blocks + 2 {
        let warm = block < 2;
        for _ in 0..50 {
            let t = Instant::now();
            raw.run(&named).unwrap();
            if !warm {
                raw_t.push(t.elapsed());
            }
        }
        for _ in 0..50 {
            let t = Instant::now();
            let (status, _) = conn.send(&infer).await;
            assert_eq!(status, 200);
            if !warm {
                http_t.push(t.elapsed());
            }
        }
    }
    raw_t.sort();
    http_t.sort();
    let added = ms(percentile(&http_t, 0.5)) - ms(percentile(&raw_t, 0.5));
    let _ = writeln!(
        report,
        "- latency, batch 1, {} requests each: raw session p50 {:.3} ms / p99 {:.3} ms; \
         agent over HTTP p50 {:.3} ms / p99 {:.3} ms; added p50 {added:.3} ms (goal ≤ 0.1) {}",
        raw_t.len(),
        ms(percentile(&raw_t, 0.5)),
        ms(percentile(&raw_t, 0.99)),
        ms(percentile(&http_t, 0.5)),
        ms(percentile(&http_t, 0.99)),
        if added <= 0.1 {
            "✓"
        } else {
            "(over the goal)"
        }
    );

    // /metrics names the provider.
    let (_, metrics) = conn.send(&request("GET", "/metrics", b"")).await;
    let metrics = String::from_utf8_lossy(&metrics);
    let named_in_metrics = metrics.lines().any(|l| {
        l.starts_with("edgeloop_model_info") && l.contains(&format!("provider=\"{want}\""))
    });
    failed |= !named_in_metrics;
    let _ = writeln!(
        report,
        "- `/metrics` names the provider: {}",
        if named_in_metrics { "✓" } else { "✗" }
    );
    let _ = match gpu_memory_mib() {
        Some(mib) => writeln!(
            report,
            "- GPU memory of this process: {mib} MiB (CUDA arena limit {} MiB per session, two sessions here)",
            ARENA_LIMIT >> 20
        ),
        None => writeln!(report, "- GPU memory: nvidia-smi lists no memory for this process"),
    };

    // Restart: a new host on the same engine cache.
    stop.cancel();
    drop(conn);
    drop(host);
    let again = ModelHost::new(
        config(library, provider, cache.path()),
        Arc::new(NoopObserver),
    );
    let warm = activate(&again, model, &inputs).await;
    let fast = warm < Duration::from_secs(5);
    let _ = writeln!(
        report,
        "- ready: cold {:.2} s, after a restart {:.2} s (goal < 5 s) {}",
        cold.as_secs_f64(),
        warm.as_secs_f64(),
        if fast { "✓" } else { "(over the goal)" }
    );
    if provider == Provider::TensorRt {
        let engines = walk(cache.path())
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "engine"))
            .count();
        let _ = writeln!(report, "- TensorRT engines in the cache: {engines}");
    }
    Outcome { failed }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn main() {
    let library = PathBuf::from(
        env("EDGELOOP_ORT_LIBRARY")
            .expect("EDGELOOP_ORT_LIBRARY: the ONNX Runtime library to check"),
    );
    let models: Vec<PathBuf> = env("GPU_CHECK_MODELS")
        .expect("GPU_CHECK_MODELS: comma-separated ONNX files")
        .split(',')
        .map(PathBuf::from)
        .collect();
    let providers: Vec<Provider> = env("GPU_CHECK_PROVIDERS")
        .unwrap_or_else(|| "cuda,tensorrt".into())
        .split(',')
        .map(|p| match p.trim() {
            "cuda" => Provider::Cuda,
            "tensorrt" => Provider::TensorRt,
            "cpu" => Provider::Cpu,
            other => panic!("GPU_CHECK_PROVIDERS: unknown provider {other:?}"),
        })
        .collect();
    let tolerance: f64 = env("GPU_CHECK_TOLERANCE")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1e-3);
    let runtime = OrtRuntime::load(Some(&library)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut report = format!(
        "## Agent serving on GPU execution providers\n\nONNX Runtime: `{}`\n",
        runtime.library_path().display()
    );
    let mut failed = false;
    for model in &models {
        for &p in &providers {
            let outcome = rt.block_on(check(&mut report, &runtime, &library, model, p, tolerance));
            failed |= outcome.failed;
            // Written after each check, so a later panic keeps what ran.
            if let Some(path) = env("GPU_CHECK_REPORT") {
                std::fs::write(&path, &report).unwrap();
            }
        }
    }
    print!("{report}");
    if let Some(path) = env("GPU_CHECK_REPORT") {
        std::fs::write(&path, &report).unwrap();
    }
    if failed {
        eprintln!("gpu-check: a hard check failed (see the ✗ above)");
        std::process::exit(1);
    }
}
