//! What serving adds, measured against its own baseline in the same run,
//! with the real ONNX Runtime, on two small models:
//!
//! - `mnist-mlp`: the MNIST MLP (scripts/fetch-mnist-models.sh), ~10 µs a
//!   run: HTTP and JSON dominate a request's cost.
//! - `wide-mlp`: 784 -> 1024 -> 1024 -> 10 (7 MB of weights, built here),
//!   where the model dominates and a batch-1 run is bound by reading the
//!   weights, the case dynamic batching exists for.
//!
//! For each:
//!
//! (a) latency: sequential batch-1 requests over HTTP on loopback against
//!     raw `ModelSession::run` on an identically configured session, in
//!     interleaved blocks so machine noise hits both alike. Prints p50/p99
//!     of each and what HTTP adds (goal: added p50 <= 0.15 ms).
//! (b) throughput at saturation: many closed-loop clients, dynamic batching
//!     on against off (max batch size 1). Prints both and the ratio (goal >= 2).
//! (c) the same request with the binary tensor data extension, in (a)'s
//!     interleaved blocks (goal: added p50 <= 50 µs) and at saturation
//!     against JSON (goal >= 2×).
//! (d) the same request over the gRPC service (`ModelInfer` with
//!     `raw_input_contents`, outputs as `raw_output_contents`), in (a)'s
//!     interleaved blocks (goal: added p50 <= 50 µs) and at saturation
//!     against JSON (goal >= 2×).
//!
//! The HTTP client is a minimal keep-alive HTTP/1.1 client on raw TCP with
//! pre-encoded bodies, so what is measured is the server, not a client
//! library. gRPC is measured twice: with tonic's generated client (HTTP/2,
//! protobuf encoding per call: a real client's costs included), and, for
//! latency, with its counterpart of the HTTP client, a minimal HTTP/2
//! client (the `h2` crate) sending one pre-encoded message.
//!
//!     cargo bench -p edgeloop-edge-agent --bench inference
//!
//! `BENCH_SECONDS` (per throughput phase, default 3) and `BENCH_CLIENTS`
//! (default 32) tune (b); `BENCH_MODELS` (default `mnist,wide`) picks the
//! models.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeloop_edge_agent::config::{Provider, ServeConfig};
use edgeloop_edge_agent::observe::NoopObserver;
use edgeloop_edge_agent::serve::{serve, serve_grpc, InferRequest, ModelHost};
use edgeloop_edge_agent::serving::{ModelServing, PrepareSpec};
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::runtime::{OrtRuntime, SessionOptions};
use edgeloop_models::Tensor;
use edgeloop_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use edgeloop_proto::inference::model_infer_request::InferInputTensor;
use edgeloop_proto::inference::{ModelInferRequest, ServerLiveRequest};
use ndarray::{ArrayD, IxDyn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const WORKERS: usize = 2;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(max_batch_size: usize) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        ort_library: None,
        providers: vec![Provider::Cpu],
        cuda_mem_limit_bytes: None,
        trt_cache: None,
        trt_fp16: false,
        workers_per_model: WORKERS,
        max_batch_size,
        max_queue_delay: Duration::from_micros(500),
        queue_capacity: 1024,
        max_request_bytes: 16 << 20,
    }
}

/// A keep-alive HTTP/1.1 connection that sends one request at a time.
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
            buf: Vec::with_capacity(16 << 10),
        }
    }

    /// Sends `request` (complete, with headers) and reads the whole answer;
    /// returns its status.
    async fn send(&mut self, request: &[u8]) -> u16 {
        self.stream.write_all(request).await.unwrap();
        self.buf.clear();
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end]).unwrap();
                let status: u16 = head[9..12].parse().unwrap();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().unwrap())
                    })
                    .expect("a content-length");
                let total = end + 4 + length;
                while self.buf.len() < total {
                    self.read_more().await;
                }
                return status;
            }
            self.read_more().await;
        }
    }

    async fn read_more(&mut self) {
        let mut chunk = [0u8; 16 << 10];
        let n = self.stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

fn http_request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The same request with the binary tensor data extension: a JSON header,
/// then the input's raw bytes, and the output asked for as binary.
fn binary_http_request(path: &str, row: &[f32]) -> Vec<u8> {
    let raw: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
    let header = serde_json::to_vec(&serde_json::json!({
        "inputs": [{ "name": "input", "shape": [1, row.len()], "datatype": "FP32",
                     "parameters": { "binary_data_size": raw.len() } }],
        "parameters": { "binary_data_output": true },
    }))
    .unwrap();
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: {}\r\nContent-Length: {}\r\n\r\n",
        header.len(),
        header.len() + raw.len()
    )
    .into_bytes();
    r.extend_from_slice(&header);
    r.extend_from_slice(&raw);
    r
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Served {
    host: Arc<ModelHost>,
    addr: std::net::SocketAddr,
    grpc_addr: std::net::SocketAddr,
    shutdown: CancellationToken,
}

async fn start(config: ServeConfig, model: &Path) -> Served {
    let host = ModelHost::new(config, Arc::new(NoopObserver));
    host.activate(PrepareSpec {
        model: "mlp".into(),
        version: "1".into(),
        path: model.to_path_buf(),
        manifest: None,
        probe: None,
    })
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc_listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(Arc::clone(&host), listener, shutdown.clone()));
    tokio::spawn(serve_grpc(
        Arc::clone(&host),
        grpc_listener,
        shutdown.clone(),
    ));
    Served {
        host,
        addr,
        grpc_addr,
        shutdown,
    }
}

/// A minimal gRPC client on raw HTTP/2 (the `h2` crate) with one
/// pre-encoded `ModelInferRequest`, the counterpart of [`Conn`]: what it
/// measures is the server, not a client library.
struct H2Conn {
    client: h2::client::SendRequest<prost::bytes::Bytes>,
    /// The length-prefixed message: flag 0 (not compressed), length, bytes.
    message: prost::bytes::Bytes,
}

impl H2Conn {
    async fn open(addr: std::net::SocketAddr, request: &ModelInferRequest) -> H2Conn {
        use prost::Message as _;
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (client, connection) = h2::client::handshake(stream).await.unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let encoded = request.encode_to_vec();
        let mut message = Vec::with_capacity(5 + encoded.len());
        message.push(0);
        message.extend_from_slice(&u32::try_from(encoded.len()).unwrap().to_be_bytes());
        message.extend_from_slice(&encoded);
        H2Conn {
            client,
            message: message.into(),
        }
    }

    /// One ModelInfer call; returns the answer's size in bytes after
    /// checking that its grpc-status is 0.
    async fn infer(&mut self) -> usize {
        let request = http::Request::post("http://bench/inference.GRPCInferenceService/ModelInfer")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let mut client = self.client.clone().ready().await.unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        send.send_data(self.message.clone(), true).unwrap();
        let mut body = response.await.unwrap().into_body();
        let mut n = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            n += chunk.len();
            body.flow_control().release_capacity(chunk.len()).unwrap();
        }
        let trailers = body.trailers().await.unwrap().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
        n
    }
}

/// A tonic client on a connection of its own (call inside a runtime).
async fn grpc_client(
    addr: std::net::SocketAddr,
) -> GrpcInferenceServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    GrpcInferenceServiceClient::new(channel)
}

/// The request as tritonclient.grpc sends it: the input's bytes in
/// `raw_input_contents`, every output (which comes back raw).
fn grpc_request(row: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![1, row.len() as i64],
            parameters: Default::default(),
            contents: None,
        }],
        raw_input_contents: vec![row.iter().flat_map(|v| v.to_le_bytes()).collect()],
        ..Default::default()
    }
}

/// Which gRPC client [`saturate_grpc`] runs.
#[derive(Clone, Copy, PartialEq)]
enum GrpcClient {
    Tonic,
    RawH2,
}

/// [`saturate`] over gRPC: closed-loop clients, each on its own connection
/// like the HTTP ones.
fn saturate_grpc(
    served: &Served,
    request: &ModelInferRequest,
    kind: GrpcClient,
    clients: usize,
    seconds: f64,
) -> f64 {
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let addr = served.grpc_addr;
    client_rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (done, answered, request) =
                (Arc::clone(&done), Arc::clone(&answered), request.clone());
            tasks.push(tokio::spawn(async move {
                match kind {
                    GrpcClient::Tonic => {
                        let mut client = grpc_client(addr).await;
                        while !done.load(Ordering::Relaxed) {
                            client.model_infer(request.clone()).await.unwrap();
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    GrpcClient::RawH2 => {
                        let mut conn = H2Conn::open(addr, &request).await;
                        while !done.load(Ordering::Relaxed) {
                            assert!(conn.infer().await > 0);
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start_count = answered.load(Ordering::Relaxed);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        let n = answered.load(Ordering::Relaxed) - start_count;
        let rate = n as f64 / started.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        rate
    })
}

/// Closed-loop clients for `seconds`; returns answered requests per second.
fn saturate(served: &Served, request: &[u8], clients: usize, seconds: f64) -> f64 {
    // The clients get their own thread, so they never queue behind the server's tasks.
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let addr = served.addr;
    let rate = client_rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (done, answered, request) =
                (Arc::clone(&done), Arc::clone(&answered), request.to_vec());
            tasks.push(tokio::spawn(async move {
                let mut conn = Conn::open(addr).await;
                while !done.load(Ordering::Relaxed) {
                    assert_eq!(conn.send(&request).await, 200);
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        // Warm up, then count.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start_count = answered.load(Ordering::Relaxed);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        let n = answered.load(Ordering::Relaxed) - start_count;
        let rate = n as f64 / started.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        rate
    });
    rate
}

/// 784 -> 1024 -> 1024 -> 10 with ReLUs, random weights, input `input`
/// `[N, 784]` like the MNIST MLP.
fn wide_mlp() -> Vec<u8> {
    let value = |name: &str, width: i64| {
        let mut v = ir::ValueInfoProto::new();
        v.set_name(name.into());
        let mut t = ir::type_proto::Tensor::new();
        t.set_elem_type(1);
        let shape = t.shape.mut_or_insert_default();
        for d in [None, Some(width)] {
            let mut dim = ir::tensor_shape_proto::Dimension::new();
            dim.value = Some(match d {
                None => ir::tensor_shape_proto::dimension::Value::DimParam("N".into()),
                Some(w) => ir::tensor_shape_proto::dimension::Value::DimValue(w),
            });
            shape.dim.push(dim);
        }
        v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(t));
        v
    };
    let node = |op: &str, inputs: &[&str], output: &str| {
        let mut n = ir::NodeProto::new();
        n.set_op_type(op.into());
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = vec![output.to_string()];
        n
    };
    let mut seed = 1u64;
    let mut weights = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let scale = 2.0 / (shape[0] as f32).sqrt();
        let values = (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect();
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
    };
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut opset = ir::OperatorSetIdProto::new();
    opset.set_version(17);
    m.opset_import.push(opset);
    let g = m.graph.mut_or_insert_default();
    g.set_name("wide_mlp".into());
    g.input.push(value("input", 784));
    g.output.push(value("logits", 10));
    let layers = [(784, 1024), (1024, 1024), (1024, 10)];
    let mut last = "input".to_string();
    for (i, (fan_in, fan_out)) in layers.into_iter().enumerate() {
        let (w, b) = (format!("w{i}"), format!("b{i}"));
        g.initializer
            .push(onnx::from_tensor(&w, &weights(&[fan_in, fan_out])));
        g.initializer
            .push(onnx::from_tensor(&b, &weights(&[fan_out])));
        let (mm, add) = (format!("mm{i}"), format!("add{i}"));
        g.node.push(node("MatMul", &[&last, &w], &mm));
        if i + 1 == layers.len() {
            g.node.push(node("Add", &[&mm, &b], "logits"));
        } else {
            g.node.push(node("Add", &[&mm, &b], &add));
            let relu = format!("relu{i}");
            g.node.push(node("Relu", &[&add], &relu));
            last = relu;
        }
    }
    onnx::validate(&m, None).unwrap();
    onnx::encode(&m).expect("the benchmark model is small")
}

struct Options {
    cores: usize,
    clients: usize,
    seconds: f64,
}

fn bench_model(runtime: &OrtRuntime, label: &str, model: &Path, options: &Options) {
    let Options {
        cores,
        clients,
        seconds,
    } = *options;
    let row: Vec<f32> = (0..784).map(|i| ((i * 37) % 255) as f32 / 255.0).collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "inputs": [{ "name": "input", "shape": [1, 784], "datatype": "FP32", "data": row }]
    }))
    .unwrap();
    let request = http_request("/v2/models/mlp/infer", &body);
    let binary_request = binary_http_request("/v2/models/mlp/infer", &row);
    let grpc_req = grpc_request(&row);
    let tensor = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 784]), row.clone()).unwrap());
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("== {label} ({} bytes of JSON per request)", body.len());

    // (a) Added latency. The raw session gets the options the host gives
    // each of its workers (intra-op threads = cores / workers).
    let served = server_rt.block_on(start(config(16), model));
    let mut session = runtime
        .session(
            &std::fs::read(model).unwrap(),
            &SessionOptions {
                intra_op_threads: (cores / WORKERS).max(1),
                ..SessionOptions::default()
            },
        )
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut conn = client_rt.block_on(Conn::open(served.addr));
    let mut grpc = client_rt.block_on(grpc_client(served.grpc_addr));
    let mut h2conn = client_rt.block_on(H2Conn::open(served.grpc_addr, &grpc_req));
    let (mut raw, mut http, mut inproc) = (Vec::new(), Vec::new(), Vec::new());
    let (mut binary, mut over_grpc, mut over_h2) = (Vec::new(), Vec::new(), Vec::new());
    // The transports' floor: a call that runs no model.
    let (mut http_live, mut grpc_live) = (Vec::new(), Vec::new());
    let live_request = b"GET /v2/health/live HTTP/1.1\r\nHost: bench\r\n\r\n";
    let (blocks, per_block) = (30, 100);
    for block in 0..blocks + 2 {
        let warm = block < 2;
        for _ in 0..per_block {
            let t = Instant::now();
            session.run(&[("input", &tensor)]).unwrap();
            let d = t.elapsed();
            if !warm {
                raw.push(d);
            }
        }
        client_rt.block_on(async {
            for _ in 0..per_block {
                let t = Instant::now();
                assert_eq!(conn.send(&request).await, 200);
                let d = t.elapsed();
                if !warm {
                    http.push(d);
                }
            }
            for _ in 0..per_block {
                let t = Instant::now();
                assert_eq!(conn.send(&binary_request).await, 200);
                let d = t.elapsed();
                if !warm {
                    binary.push(d);
                }
            }
            for _ in 0..per_block {
                // Built before the clock starts, as the HTTP bodies are.
                let request = grpc_req.clone();
                let t = Instant::now();
                grpc.model_infer(request).await.unwrap();
                let d = t.elapsed();
                if !warm {
                    over_grpc.push(d);
                }
            }
            for _ in 0..per_block {
                let t = Instant::now();
                assert!(h2conn.infer().await > 0);
                let d = t.elapsed();
                if !warm {
                    over_h2.push(d);
                }
            }
            for _ in 0..per_block {
                let t = Instant::now();
                assert_eq!(conn.send(live_request).await, 200);
                let d = t.elapsed();
                if !warm {
                    http_live.push(d);
                }
                let t = Instant::now();
                grpc.server_live(ServerLiveRequest {}).await.unwrap();
                let d = t.elapsed();
                if !warm {
                    grpc_live.push(d);
                }
            }
        });
        server_rt.block_on(async {
            for _ in 0..per_block {
                let request = InferRequest {
                    id: Some("bench".into()),
                    inputs: vec![("input".into(), tensor.clone())],
                    outputs: None,
                };
                let t = Instant::now();
                served.host.infer("mlp", None, request).await.unwrap();
                let d = t.elapsed();
                if !warm {
                    inproc.push(d);
                }
            }
        });
    }
    for v in [
        &mut raw,
        &mut http,
        &mut inproc,
        &mut binary,
        &mut over_grpc,
        &mut over_h2,
        &mut http_live,
        &mut grpc_live,
    ] {
        v.sort();
    }
    let (grpc50, grpc99) = (percentile(&over_grpc, 0.5), percentile(&over_grpc, 0.99));
    let (bin50, bin99) = (percentile(&binary, 0.5), percentile(&binary, 0.99));
    let (raw50, raw99) = (percentile(&raw, 0.5), percentile(&raw, 0.99));
    let (http50, http99) = (percentile(&http, 0.5), percentile(&http, 0.99));
    let (in50, in99) = (percentile(&inproc, 0.5), percentile(&inproc, 0.99));
    let added50 = us(http50) - us(raw50);
    let added99 = us(http99) - us(raw99);
    println!(
        "(a) latency, batch 1, {} sequential requests each, interleaved",
        raw.len()
    );
    println!(
        "    raw ModelSession::run      p50 {:8.1} µs   p99 {:8.1} µs",
        us(raw50),
        us(raw99)
    );
    println!(
        "    ModelHost::infer (no HTTP) p50 {:8.1} µs   p99 {:8.1} µs",
        us(in50),
        us(in99)
    );
    println!(
        "    HTTP infer (loopback)      p50 {:8.1} µs   p99 {:8.1} µs",
        us(http50),
        us(http99)
    );
    println!(
        "    added by HTTP serving      p50 {added50:8.1} µs   p99 {added99:8.1} µs   (goal p50 <= 150 µs: {})",
        if added50 <= 150.0 { "met" } else { "NOT met" }
    );
    println!(
        "    ratio HTTP / raw           p50 {:8.2}×       p99 {:8.2}×",
        us(http50) / us(raw50),
        us(http99) / us(raw99)
    );
    let bin_added = us(bin50) - us(raw50);
    println!(
        "    HTTP infer, binary tensors p50 {:8.1} µs   p99 {:8.1} µs   added p50 {bin_added:8.1} µs (goal <= 50 µs: {})",
        us(bin50),
        us(bin99),
        if bin_added <= 50.0 { "met" } else { "NOT met" }
    );
    let grpc_added = us(grpc50) - us(raw50);
    println!(
        "    gRPC infer (tonic, raw)    p50 {:8.1} µs   p99 {:8.1} µs   added p50 {grpc_added:8.1} µs (goal <= 50 µs: {})",
        us(grpc50),
        us(grpc99),
        if grpc_added <= 50.0 { "met" } else { "NOT met" }
    );
    let (h2_50, h2_99) = (percentile(&over_h2, 0.5), percentile(&over_h2, 0.99));
    let h2_added = us(h2_50) - us(raw50);
    println!(
        "    gRPC infer (raw h2 client) p50 {:8.1} µs   p99 {:8.1} µs   added p50 {h2_added:8.1} µs (goal <= 50 µs: {})",
        us(h2_50),
        us(h2_99),
        if h2_added <= 50.0 { "met" } else { "NOT met" }
    );
    println!(
        "    gRPC / JSON HTTP           p50 {:8.2}×       p99 {:8.2}×",
        us(grpc50) / us(http50),
        us(grpc99) / us(http99)
    );
    println!(
        "    floor, no model: HTTP GET /v2/health/live p50 {:6.1} µs, gRPC ServerLive p50 {:6.1} µs",
        us(percentile(&http_live, 0.5)),
        us(percentile(&grpc_live, 0.5))
    );
    drop(conn);
    drop(grpc);
    served.shutdown.cancel();
    drop(served);

    // (b) Throughput at saturation, batching off and on, alternated twice
    // so a noisy neighbour cannot favour one.
    let on = server_rt.block_on(start(config(16), model));
    let off = server_rt.block_on(start(config(1), model));
    let (mut rate_on, mut rate_off) = (0.0f64, 0.0f64);
    let (mut rate_binary, mut rate_grpc, mut rate_h2) = (0.0f64, 0.0f64, 0.0f64);
    for _ in 0..2 {
        rate_off = rate_off.max(saturate(&off, &request, clients, seconds));
        rate_on = rate_on.max(saturate(&on, &request, clients, seconds));
        rate_binary = rate_binary.max(saturate(&on, &binary_request, clients, seconds));
        rate_grpc = rate_grpc.max(saturate_grpc(
            &on,
            &grpc_req,
            GrpcClient::Tonic,
            clients,
            seconds,
        ));
        rate_h2 = rate_h2.max(saturate_grpc(
            &on,
            &grpc_req,
            GrpcClient::RawH2,
            clients,
            seconds,
        ));
    }
    println!(
        "(c) binary tensors at saturation (batching on): {rate_binary:.0} req/s against JSON's {rate_on:.0}: {:.2}× (goal >= 2×: {})",
        rate_binary / rate_on,
        if rate_binary >= 2.0 * rate_on { "met" } else { "NOT met" }
    );
    println!(
        "(d) gRPC (tonic client) at saturation (batching on): {rate_grpc:.0} req/s against JSON's {rate_on:.0}: {:.2}× (goal >= 2×: {}); against binary HTTP's {rate_binary:.0}: {:.2}×",
        rate_grpc / rate_on,
        if rate_grpc >= 2.0 * rate_on { "met" } else { "NOT met" },
        rate_grpc / rate_binary,
    );
    println!(
        "    with the raw h2 client: {rate_h2:.0} req/s: {:.2}× JSON's (goal >= 2×: {})",
        rate_h2 / rate_on,
        if rate_h2 >= 2.0 * rate_on {
            "met"
        } else {
            "NOT met"
        },
    );
    let batches = on.host.metrics_text();
    let get = |suffix: &str| {
        batches
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "edgeloop_inference_batch_size_{suffix}{{model=\"mlp\""
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let mean_batch = get("sum") / get("count").max(1.0);
    println!(
        "(b) throughput at saturation, {clients} closed-loop clients, best of 2 × {seconds} s"
    );
    println!("    batching off (max batch 1)             {rate_off:9.0} req/s");
    println!("    batching on (max batch 16, 500 µs)     {rate_on:9.0} req/s   (mean batch {mean_batch:.1})");
    println!(
        "    ratio on / off                         {:9.2}×      (goal >= 2×: {})",
        rate_on / rate_off,
        if rate_on / rate_off >= 2.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    on.shutdown.cancel();
    off.shutdown.cancel();
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no options.
    let deps = edgeloop_models::deps::dir().expect("HOME or EDGELOOP_DEPS");
    let mnist = deps.join("mnist-models/mlp.onnx");
    assert!(
        mnist.is_file(),
        "{} missing: run scripts/fetch-mnist-models.sh",
        mnist.display()
    );
    let runtime = OrtRuntime::load(None).expect("ONNX Runtime (scripts/fetch-onnxruntime.sh)");
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide_mlp.onnx");
    std::fs::write(&wide, wide_mlp()).unwrap();
    let options = Options {
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        clients: env_or("BENCH_CLIENTS", 32),
        seconds: env_or("BENCH_SECONDS", 3.0),
    };
    println!(
        "serving bench: {} cores, {WORKERS} workers per model, CPU provider, client in-process on raw TCP",
        options.cores
    );
    let models = std::env::var("BENCH_MODELS").unwrap_or_else(|_| "mnist,wide".into());
    for (key, label, path) in [
        ("mnist", "mnist-mlp (784-128-10-ish, real model)", &mnist),
        ("wide", "wide-mlp (784-1024-1024-10, synthetic)", &wide),
    ] {
        if models.split(',').any(|m| m.trim() == key) {
            bench_model(&runtime, label, path, &options);
        }
    }
}
