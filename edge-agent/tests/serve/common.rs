//! What the serving tests share: the real ONNX Runtime and models, small
//! ONNX graphs built here, and a host served over real HTTP and gRPC on
//! loopback.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeloop_edge_agent::config::{Provider, ServeConfig};
use edgeloop_edge_agent::observe::{NoopObserver, Observation, Observer};
use edgeloop_edge_agent::serve::{serve, serve_grpc, ModelHost};
use edgeloop_edge_agent::serving::{PrepareSpec, ProbeSpec};
use edgeloop_models::manifest::Manifest;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::runtime::{LIBRARY_FILE_NAME, ORT_VERSION};
use edgeloop_models::Tensor;
use edgeloop_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use ndarray::{ArrayD, IxDyn};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

pub fn deps() -> PathBuf {
    edgeloop_models::deps::dir().expect("HOME or EDGELOOP_DEPS is set")
}

/// The ONNX Runtime library; these tests fail, never skip, without it.
pub fn library_path() -> PathBuf {
    let path = match std::env::var_os("ORT_DYLIB_PATH").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => deps()
            .join(format!("onnxruntime-{ORT_VERSION}"))
            .join(LIBRARY_FILE_NAME),
    };
    assert!(
        path.is_file(),
        "ONNX Runtime {ORT_VERSION} not found at {}: run scripts/fetch-onnxruntime.sh",
        path.display()
    );
    path
}

/// `cnn` or `mlp` from scripts/fetch-mnist-models.sh.
pub fn mnist_model(name: &str) -> PathBuf {
    let path = deps().join("mnist-models").join(format!("{name}.onnx"));
    assert!(
        path.is_file(),
        "{} not found: run scripts/fetch-mnist-models.sh",
        path.display()
    );
    path
}

/// The venv with Python ONNX Runtime (scripts/python-env.sh).
pub fn python() -> PathBuf {
    let path = deps().join("pyenv/bin/python");
    assert!(
        path.is_file(),
        "{} not found: run scripts/python-env.sh",
        path.display()
    );
    path
}

pub fn config() -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        ort_library: Some(library_path()),
        providers: vec![Provider::Cpu],
        cuda_mem_limit_bytes: None,
        trt_cache: None,
        trt_fp16: false,
        workers_per_model: 2,
        max_batch_size: 8,
        max_queue_delay: Duration::from_micros(500),
        queue_capacity: 1024,
        max_request_bytes: 1 << 20,
    }
}

pub fn spec(model: &str, version: &str, path: &Path) -> PrepareSpec {
    PrepareSpec {
        model: model.into(),
        version: version.into(),
        path: path.to_path_buf(),
        manifest: None,
        probe: None,
    }
}

pub fn probe(inputs: Vec<(String, Tensor)>, max_latency: Duration) -> Option<ProbeSpec> {
    Some(ProbeSpec {
        inputs,
        max_latency,
    })
}

/// A host with its REST API and its gRPC service, each on an ephemeral
/// loopback port.
pub struct Server {
    pub host: Arc<ModelHost>,
    pub base: String,
    pub client: reqwest::Client,
    /// The gRPC service's bound address.
    pub grpc_addr: std::net::SocketAddr,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn start(config: ServeConfig) -> Server {
    start_observed(config, Arc::new(NoopObserver)).await
}

pub async fn start_observed(config: ServeConfig, observer: Arc<dyn Observer>) -> Server {
    edgeloop_client_core::install_crypto_provider();
    let host = ModelHost::new(config, observer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc_listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(Arc::clone(&host), listener, shutdown.clone()));
    tokio::spawn(serve_grpc(
        Arc::clone(&host),
        grpc_listener,
        shutdown.clone(),
    ));
    Server {
        host,
        base,
        grpc_addr,
        client: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        shutdown,
    }
}

pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub text: String,
}

impl Server {
    /// A tonic client of the gRPC service, on a connection of its own.
    pub async fn grpc(&self) -> GrpcInferenceServiceClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.grpc_addr))
            .unwrap()
            .timeout(Duration::from_secs(60))
            .connect()
            .await
            .unwrap();
        // Answers may be larger than tonic's 4 MB default; the server's
        // limit is on requests.
        GrpcInferenceServiceClient::new(channel).max_decoding_message_size(usize::MAX)
    }

    pub async fn get(&self, path: &str) -> Reply {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        reply(r).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_bytes(path, serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn post_bytes(&self, path: &str, body: Vec<u8>) -> Reply {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        reply(r).await
    }
}

async fn reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, body, text }
}

/// Python ONNX Runtime's answer to an infer request (tools/oip_reference.py).
pub fn python_reference(model: &Path, request: &Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("request.json");
    std::fs::write(&file, serde_json::to_vec(request).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/oip_reference.py");
    let out = std::process::Command::new(python())
        .arg(script)
        .arg(model)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oip_reference.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The largest absolute difference between two answers of equal length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "answers of different lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// Deterministic pseudo-random floats in [0, 1).
pub fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

pub fn f32_tensor(shape: &[usize], values: Vec<f32>) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

/// An infer body with one FP32 input.
pub fn infer_body(input: &str, shape: &[usize], data: &[f32]) -> Value {
    json!({ "inputs": [{ "name": input, "shape": shape, "datatype": "FP32", "data": data }] })
}

/// The flat f32 data of output `i` of an infer answer.
pub fn output_data(body: &Value, i: usize) -> Vec<f32> {
    body["outputs"][i]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no outputs[{i}].data in {body}"))
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

// --- small ONNX graphs --------------------------------------------------------

fn value(name: &str, dims: &[i64]) -> ir::ValueInfoProto {
    let mut v = ir::ValueInfoProto::new();
    v.set_name(name.into());
    let mut t = ir::type_proto::Tensor::new();
    t.set_elem_type(1);
    let shape = t.shape.mut_or_insert_default();
    for &d in dims {
        let mut dim = ir::tensor_shape_proto::Dimension::new();
        dim.value = Some(if d < 0 {
            ir::tensor_shape_proto::dimension::Value::DimParam("N".into())
        } else {
            ir::tensor_shape_proto::dimension::Value::DimValue(d)
        });
        shape.dim.push(dim);
    }
    v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(t));
    v
}

fn node(op: &str, inputs: &[&str], output: &str) -> ir::NodeProto {
    let mut n = ir::NodeProto::new();
    n.set_op_type(op.into());
    n.set_name(format!("{op}_{output}"));
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = vec![output.to_string()];
    n
}

fn model(
    name: &str,
    width: usize,
    initializers: Vec<ir::TensorProto>,
    nodes: Vec<ir::NodeProto>,
) -> Vec<u8> {
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut o = ir::OperatorSetIdProto::new();
    o.set_version(17);
    m.opset_import.push(o);
    let g = m.graph.mut_or_insert_default();
    g.set_name(name.into());
    g.input.push(value("x", &[-1, width as i64]));
    g.output.push(value("y", &[-1, width as i64]));
    g.initializer = initializers;
    g.node = nodes;
    onnx::validate(&m, None).unwrap();
    onnx::encode(&m).unwrap()
}

/// `y = x + c`, x and y `[N, 4]`: each version answers differently, so a
/// response shows which version computed it.
pub fn add_model(c: f32) -> Vec<u8> {
    let c = onnx::from_tensor("c", &f32_tensor(&[4], vec![c; 4]));
    model("add", 4, vec![c], vec![node("Add", &["x", "c"], "y")])
}

/// `y = x W`, with x `[N, K]` (K symbolic) and W `[2, 2]`: it runs only
/// when K is 2. Zeros with every symbolic dimension 1 cannot warm it up,
/// which is what a detector with dynamic H×W does to that guess.
pub fn sized_model() -> Vec<u8> {
    let w = onnx::from_tensor("w", &f32_tensor(&[2, 2], vec![1.0, 0.0, 0.0, 1.0]));
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut o = ir::OperatorSetIdProto::new();
    o.set_version(17);
    m.opset_import.push(o);
    let g = m.graph.mut_or_insert_default();
    g.set_name("sized".into());
    let mut x = value("x", &[-1, -1]);
    // A second symbol, so N and K are independent.
    if let Some(ir::type_proto::Value::TensorType(t)) =
        x.type_.mut_or_insert_default().value.as_mut()
    {
        t.shape.mut_or_insert_default().dim[1].value = Some(
            ir::tensor_shape_proto::dimension::Value::DimParam("K".into()),
        );
    }
    g.input.push(x);
    g.output.push(value("y", &[-1, 2]));
    g.initializer = vec![w];
    g.node = vec![node("MatMul", &["x", "w"], "y")];
    onnx::validate(&m, None).unwrap();
    onnx::encode(&m).unwrap()
}

/// `y = x + NaN`: loads and runs, and fails any health probe.
pub fn nan_model() -> Vec<u8> {
    add_model(f32::NAN)
}

/// `depth` rounds of `x = tanh(x W)` with W `[width, width]`: slow enough to
/// make a queue build up, with outputs that depend on every input.
pub fn slow_model(width: usize, depth: usize) -> Vec<u8> {
    let scale = 1.0 / width as f32;
    let w = onnx::from_tensor(
        "w",
        &f32_tensor(
            &[width, width],
            noise(width * width, 7)
                .iter()
                .map(|v| (v - 0.5) * 4.0 * scale)
                .collect(),
        ),
    );
    let mut nodes = Vec::new();
    let mut last = "x".to_string();
    for i in 0..depth {
        let mm = format!("mm{i}");
        nodes.push(node("MatMul", &[&last, "w"], &mm));
        let out = if i + 1 == depth {
            "y".to_string()
        } else {
            format!("t{i}")
        };
        nodes.push(node("Tanh", &[&mm], &out));
        last = out;
    }
    model("slow", width, vec![w], nodes)
}

/// Model files for one test.
pub struct Models {
    pub dir: tempfile::TempDir,
}

impl Models {
    pub fn new() -> Self {
        Models {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.onnx"));
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

/// Records everything the serving path tells telemetry.
#[derive(Default)]
pub struct Recorder {
    pub activated: Mutex<Vec<(String, String, bool)>>,
    pub observed: Mutex<Vec<Observed>>,
}

/// One observation, tensors reduced to their names.
#[derive(Debug, Clone)]
pub struct Observed {
    pub model: String,
    pub version: String,
    pub id: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub ok: bool,
}

impl Observer for Recorder {
    fn model_activated(&self, model: &str, version: &str, manifest: Option<&Manifest>) {
        self.activated
            .lock()
            .unwrap()
            .push((model.into(), version.into(), manifest.is_some()));
    }

    fn observe(&self, o: &Observation<'_>) {
        let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect();
        self.observed.lock().unwrap().push(Observed {
            model: o.model.into(),
            version: o.version.into(),
            id: o.request_id.into(),
            inputs: names(o.inputs),
            outputs: names(o.outputs),
            ok: o.ok,
        });
    }
}
