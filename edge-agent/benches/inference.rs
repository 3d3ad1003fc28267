//! What serving adds, measured against its own baseline in the same run, on
//! the MNIST MLP (scripts/fetch-mnist-models.sh) and the real ONNX Runtime:
//!
//! (a) latency: sequential batch-1 requests over HTTP on loopback against
//!     raw `ModelSession::run` on an identically configured session, in
//!     interleaved blocks so machine noise hits both alike. Prints p50/p99
//!     of each and what HTTP adds (goal: added p50 <= 0.15 ms).
//! (b) throughput at saturation: many closed-loop clients, dynamic batching
//!     on against off (max batch size 1). Prints both and the ratio (goal >= 2).
//!
//! The client is a minimal keep-alive HTTP/1.1 client on raw TCP with
//! pre-encoded bodies, so what is measured is the server, not a client
//! library.
//!
//!     cargo bench -p edgeloop-edge-agent --bench inference
//!
//! `BENCH_SECONDS` (per throughput phase, default 3) and `BENCH_CLIENTS`
//! (default 32) tune (b).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeloop_edge_agent::config::{Provider, ServeConfig};
use edgeloop_edge_agent::observe::NoopObserver;
use edgeloop_edge_agent::serve::{serve, InferRequest, ModelHost};
use edgeloop_edge_agent::serving::{ModelServing, PrepareSpec};
use edgeloop_models::runtime::{OrtRuntime, SessionOptions};
use edgeloop_models::Tensor;
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
        ort_library: None,
        providers: vec![Provider::Cpu],
        cuda_mem_limit_bytes: None,
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
    shutdown: CancellationToken,
}

async fn start(config: ServeConfig, model: &std::path::Path) -> Served {
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
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(Arc::clone(&host), listener, shutdown.clone()));
    Served {
        host,
        addr,
        shutdown,
    }
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

fn main() {
    // `cargo bench` passes `--bench`; this harness has no options.
    let deps = edgeloop_models::deps::dir().expect("HOME or EDGELOOP_DEPS");
    let model = deps.join("mnist-models/mlp.onnx");
    assert!(
        model.is_file(),
        "{} missing: run scripts/fetch-mnist-models.sh",
        model.display()
    );
    let runtime = OrtRuntime::load(None).expect("ONNX Runtime (scripts/fetch-onnxruntime.sh)");
    let seconds: f64 = env_or("BENCH_SECONDS", 3.0);
    let clients: usize = env_or("BENCH_CLIENTS", 32);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);

    let row: Vec<f32> = (0..784).map(|i| ((i * 37) % 255) as f32 / 255.0).collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "inputs": [{ "name": "input", "shape": [1, 784], "datatype": "FP32", "data": row }]
    }))
    .unwrap();
    let request = http_request("/v2/models/mlp/infer", &body);
    let tensor = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 784]), row.clone()).unwrap());

    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "serving bench: mnist mlp.onnx, {cores} cores, {WORKERS} workers per model, CPU provider"
    );

    // (a) Added latency. The raw session gets the options the host gives
    // each of its workers (intra-op threads = cores / workers).
    let served = server_rt.block_on(start(config(16), &model));
    let mut session = runtime
        .session(
            &std::fs::read(&model).unwrap(),
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
    let (mut raw, mut http, mut inproc) = (Vec::new(), Vec::new(), Vec::new());
    let blocks = 30;
    let per_block = 100;
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
        });
        server_rt.block_on(async {
            for _ in 0..per_block {
                let t = Instant::now();
                served
                    .host
                    .infer(
                        "mlp",
                        None,
                        InferRequest {
                            id: Some("bench".into()),
                            inputs: vec![("input".into(), tensor.clone())],
                            outputs: None,
                        },
                    )
                    .await
                    .unwrap();
                let d = t.elapsed();
                if !warm {
                    inproc.push(d);
                }
            }
        });
    }
    for v in [&mut raw, &mut http, &mut inproc] {
        v.sort();
    }
    let (raw50, raw99) = (percentile(&raw, 0.5), percentile(&raw, 0.99));
    let (http50, http99) = (percentile(&http, 0.5), percentile(&http, 0.99));
    let (in50, in99) = (percentile(&inproc, 0.5), percentile(&inproc, 0.99));
    let added50 = us(http50) - us(raw50);
    let added99 = us(http99) - us(raw99);
    println!(
        "(a) latency, batch 1, {} requests each, interleaved",
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
        "    added by HTTP serving      p50 {added50:8.1} µs   p99 {added99:8.1} µs   (goal: p50 <= 150 µs: {})",
        if added50 <= 150.0 { "met" } else { "NOT met" }
    );
    println!(
        "    ratio HTTP / raw           p50 {:8.2}×       p99 {:8.2}×",
        us(http50) / us(raw50),
        us(http99) / us(raw99)
    );
    drop(conn);
    served.shutdown.cancel();
    drop(served);

    // (b) Throughput at saturation, batching on and off, alternated twice
    // so a noisy neighbour cannot favour one.
    let on = server_rt.block_on(start(config(16), &model));
    let off = server_rt.block_on(start(config(1), &model));
    let (mut rate_on, mut rate_off) = (0.0f64, 0.0f64);
    for _ in 0..2 {
        rate_off = rate_off.max(saturate(&off, &request, clients, seconds));
        rate_on = rate_on.max(saturate(&on, &request, clients, seconds));
    }
    println!(
        "(b) throughput at saturation, {clients} closed-loop clients, best of 2 × {seconds} s"
    );
    println!("    batching off (max batch 1)             {rate_off:9.0} req/s");
    println!("    batching on (max batch 16, 500 µs)     {rate_on:9.0} req/s");
    println!(
        "    ratio on / off                         {:9.2}×   (goal >= 2×: {})",
        rate_on / rate_off,
        if rate_on / rate_off >= 2.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    let batches = on.host.metrics_text();
    let mean = |text: &str| {
        let get = |suffix: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with(&format!(
                        "edgeloop_inference_batch_size_{suffix}{{model=\"mlp\""
                    ))
                })
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        get("sum") / get("count").max(1.0)
    };
    println!(
        "    mean batch with batching on            {:9.1} requests/run",
        mean(&batches)
    );
    on.shutdown.cancel();
    off.shutdown.cancel();
}
