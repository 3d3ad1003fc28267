//! Loading a version: ONNX Runtime (once, lazily), one session per worker,
//! the check against the manifest's signature, and the warmed-up pool.
//! Everything here blocks; [`Loader::load`] runs on a blocking thread.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use edgeloop_models::runtime::{
    ExecutionProvider, GraphOptimization, IoInfo, ModelSession, OrtRuntime, SessionOptions,
    GPU_RUNTIME_DIR,
};
use edgeloop_models::tensor::{DType, Tensor};
use edgeloop_models::Digest;
use ndarray::{ArrayD, IxDyn};

use super::metrics::{Registry, VersionMetrics};
use super::policy::BatchPolicy;
use super::pool::{Named, Pool, PoolOptions};
use super::probe::check_signature;
use crate::config::{Provider, ServeConfig};
use crate::serving::{ActivationError, PrepareSpec, Timed};
use std::time::Instant;

/// A loaded version: its interface, and the pool that runs it.
pub struct Version {
    pub model: String,
    pub version: String,
    pub path: PathBuf,
    /// The execution provider actually in use.
    pub provider: String,
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    /// Whether requests may share a run (every input and output has a
    /// dynamic first dimension, and batching is on).
    pub batchable: bool,
    pub pool: Pool,
    pub metrics: Arc<VersionMetrics>,
}

/// Holds what loading needs, cheap to clone into a blocking task.
#[derive(Clone)]
pub struct Loader {
    config: ServeConfig,
    /// Loaded on the first activation, not at start: an agent with no model
    /// assigned does not pay ONNX Runtime's memory, and one whose library
    /// is missing still starts (and says why each activation fails).
    runtime: Arc<Mutex<Option<OrtRuntime>>>,
    registry: Arc<Registry>,
    /// This device's GPU, asked once (for the TensorRT cache key).
    gpu: Arc<std::sync::OnceLock<Option<String>>>,
}

/// `<root>/<model digest>/<GPU>/<TensorRT version>/`, each part made safe
/// as a path component.
pub fn trt_cache_dir(root: &std::path::Path, model: &Digest, gpu: &str, trt: &str) -> PathBuf {
    let safe = |s: &str| -> String {
        let cleaned: String = s
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
                    c
                } else {
                    '-'
                }
            })
            .take(96)
            .collect();
        match cleaned.trim_matches(['-', '.']) {
            "" => "unknown".to_string(),
            ok => ok.to_string(),
        }
    };
    root.join(model.to_hex()).join(safe(gpu)).join(safe(trt))
}

/// TensorRT's release from the library the fetch script installed
/// (`libnvinfer.so.10.16.1` → `10.16.1`).
pub fn tensorrt_version(dir: &std::path::Path) -> Option<String> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("libnvinfer.so.").map(str::to_string))
        .filter(|v| v.split('.').count() >= 2 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
        .max_by_key(|v| v.split('.').count())
}

impl Loader {
    pub fn new(config: ServeConfig, registry: Arc<Registry>) -> Self {
        Loader {
            config,
            runtime: Arc::new(Mutex::new(None)),
            registry,
            gpu: Arc::new(std::sync::OnceLock::new()),
        }
    }

    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    fn runtime(&self) -> Result<OrtRuntime, ActivationError> {
        let mut slot = self.runtime.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(runtime) = slot.as_ref() {
            return Ok(runtime.clone());
        }
        let runtime = OrtRuntime::load(self.config.ort_library.as_deref())
            .map_err(|e| ActivationError::Load(e.to_string()))?;
        *slot = Some(runtime.clone());
        Ok(runtime)
    }

    /// The TensorRT engine cache for a model: one directory per model
    /// digest, GPU and TensorRT release, since an engine is built for one
    /// GPU by one TensorRT and is useless (or refused) anywhere else.
    fn trt_cache(&self, runtime: &OrtRuntime, model: &Digest) -> Option<PathBuf> {
        let root = self.config.trt_cache.as_ref()?;
        let gpu = self
            .gpu
            .get_or_init(|| {
                edgeloop_client_core::gpu::LocalGpus::detect()
                    .gpus
                    .first()
                    .map(|g| g.name.clone())
            })
            .clone();
        let trt = runtime
            .library_path()
            .parent()
            .and_then(|d| tensorrt_version(&d.join(GPU_RUNTIME_DIR)));
        Some(trt_cache_dir(
            root,
            model,
            gpu.as_deref().unwrap_or("unknown-gpu"),
            trt.as_deref().unwrap_or("unknown-tensorrt"),
        ))
    }

    fn session_options(&self, trt_cache: Option<PathBuf>) -> SessionOptions {
        // Workers run side by side: split the cores between them rather than
        // letting each session start a thread per core.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let workers = self.config.workers_per_model.max(1);
        let providers = self
            .config
            .providers
            .iter()
            .map(|p| match p {
                Provider::TensorRt => ExecutionProvider::TensorRt {
                    device_id: 0,
                    engine_cache: trt_cache.clone(),
                    fp16: self.config.trt_fp16,
                },
                Provider::Cuda => ExecutionProvider::Cuda {
                    device_id: 0,
                    mem_limit_bytes: self.config.cuda_mem_limit_bytes,
                },
                Provider::Cpu => ExecutionProvider::Cpu,
            })
            .collect();
        SessionOptions {
            intra_op_threads: (cores / workers).max(1),
            optimization: GraphOptimization::All,
            providers,
        }
    }

    /// Loads `spec` into `workers_per_model` sessions, checks them against
    /// the manifest, and starts its warmed-up pool. Blocking.
    pub fn load(&self, spec: &PrepareSpec) -> Result<Version, ActivationError> {
        let load_error = |e: String| ActivationError::Load(e);
        let runtime = self.runtime()?;
        // ONNX Runtime reads the artifact itself: no copy of the model in
        // this process's memory, and a model with external data finds it
        // beside the file. A missing or unreadable file is still said in
        // our words, not ONNX Runtime's.
        std::fs::File::open(&spec.path)
            .map_err(|e| load_error(format!("reading {}: {e}", spec.path.display())))?;
        // Only TensorRT needs the digest: streamed, so hashing costs no
        // memory whatever the model's size.
        let trt_cache = if self.config.providers.contains(&Provider::TensorRt) {
            let (digest, _) = crate::sync::verify::hash_file(&spec.path)
                .map_err(|e| load_error(format!("reading {}: {e}", spec.path.display())))?;
            self.trt_cache(&runtime, &digest)
        } else {
            None
        };
        let options = self.session_options(trt_cache);
        let session = || {
            runtime
                .session_from_file(&spec.path, &options)
                .map_err(|e| load_error(e.to_string()))
        };
        let first = session()?;
        if let Some(manifest) = &spec.manifest {
            check_signature(&manifest.signature, first.inputs(), first.outputs())
                .map_err(ActivationError::Signature)?;
        }
        servable(&first).map_err(load_error)?;
        let inputs = first.inputs().to_vec();
        let outputs = first.outputs().to_vec();
        let provider = first.provider().to_string();
        let mut sessions = vec![first];
        for _ in 1..self.config.workers_per_model.max(1) {
            sessions.push(session()?);
        }

        let dynamic_rows = |io: &[IoInfo]| io.iter().all(|i| matches!(i.shape.first(), Some(None)));
        let batchable =
            self.config.max_batch_size > 1 && dynamic_rows(&inputs) && dynamic_rows(&outputs);
        let policy = BatchPolicy {
            max_batch_size: if batchable {
                self.config.max_batch_size
            } else {
                1
            },
            max_queue_delay: self.config.max_queue_delay,
        };
        let metrics = self.registry.version(&spec.model, &spec.version);
        let depth = self.registry.queue_depth(&spec.model);
        // The probe's inputs have the shapes the model is meant for; zeros
        // with every symbolic dimension at 1 are only a guess, one that a
        // detector with dynamic H×W cannot run.
        // Probe inputs that do not fit are left to the probe to report.
        let warm_up = match &spec.probe {
            Some(probe) if super::infer::check_inputs(&inputs, &probe.inputs).is_ok() => {
                super::infer::in_model_order(&inputs, probe.inputs.clone())
            }
            _ => zero_inputs(&inputs),
        };
        let pool = Pool::start(
            sessions,
            Arc::new(warm_up),
            PoolOptions {
                name: format!("serve-{}", spec.model),
                policy,
                capacity: self.config.queue_capacity,
                depth,
                metrics: Arc::clone(&metrics),
            },
        )
        .map_err(ActivationError::Probe)?;
        Ok(Version {
            model: spec.model.clone(),
            version: spec.version.clone(),
            path: spec.path.clone(),
            provider,
            inputs,
            outputs,
            batchable,
            pool,
            metrics,
        })
    }
}

impl Loader {
    /// Times the model at `path` as this device would serve it (the serving
    /// providers, threads and TensorRT cache) on `inputs`, one call at a
    /// time: a few warm-up calls, then `runs` timed ones. Nothing is
    /// swapped in or counted in the serving metrics. Blocking.
    pub fn time(
        &self,
        path: &std::path::Path,
        inputs: &[(String, Tensor)],
        runs: u32,
    ) -> Result<Timed, ActivationError> {
        let load_error = |e: String| ActivationError::Load(e);
        let runtime = self.runtime()?;
        let trt_cache = if self.config.providers.contains(&Provider::TensorRt) {
            let (digest, _) = crate::sync::verify::hash_file(path)
                .map_err(|e| load_error(format!("reading {}: {e}", path.display())))?;
            self.trt_cache(&runtime, &digest)
        } else {
            None
        };
        let mut session = runtime
            .session_from_file(path, &self.session_options(trt_cache))
            .map_err(|e| load_error(e.to_string()))?;
        let named: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut call = || -> Result<f64, ActivationError> {
            let start = Instant::now();
            session
                .run(&named)
                .map_err(|e| ActivationError::Probe(format!("running: {e}")))?;
            Ok(start.elapsed().as_secs_f64() * 1000.0)
        };
        // The first calls allocate and (on a GPU) build kernels: not what a
        // serving device pays per request.
        for _ in 0..WARM_UP_CALLS {
            call()?;
        }
        let mut times = (0..runs.max(1))
            .map(|_| call())
            .collect::<Result<Vec<_>, _>>()?;
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        Ok(Timed {
            p50_ms: at(0.5),
            p90_ms: at(0.9),
            runs: times.len() as u32,
            provider: session.provider().to_string(),
        })
    }
}

/// Untimed calls before a benchmark's timed ones.
const WARM_UP_CALLS: usize = 3;

/// Every input and output must be a tensor of a [`DType`], or no request
/// could ever be served.
fn servable(session: &ModelSession) -> Result<(), String> {
    let bad = |kind: &str, io: &IoInfo| {
        format!(
            "{kind} `{}` is not a tensor of a type this agent serves ({})",
            io.name,
            super::protocol::supported_datatypes()
        )
    };
    if let Some(i) = session.inputs().iter().find(|i| i.dtype.is_none()) {
        return Err(bad("input", i));
    }
    if let Some(o) = session.outputs().iter().find(|o| o.dtype.is_none()) {
        return Err(bad("output", o));
    }
    Ok(())
}

/// A batch of one, zeros everywhere; symbolic dimensions are 1.
pub fn zero_inputs(inputs: &[IoInfo]) -> Named {
    inputs
        .iter()
        .map(|io| {
            let shape: Vec<usize> = io
                .shape
                .iter()
                .map(|d| d.and_then(|d| usize::try_from(d).ok()).unwrap_or(1))
                .collect();
            let shape = IxDyn(&shape);
            let tensor = match io.dtype.unwrap_or(DType::F32) {
                DType::F32 => Tensor::F32(ArrayD::zeros(shape)),
                DType::F64 => Tensor::F64(ArrayD::zeros(shape)),
                DType::F16 => Tensor::F16(ArrayD::from_elem(shape, half::f16::ZERO)),
                DType::I8 => Tensor::I8(ArrayD::zeros(shape)),
                DType::U8 => Tensor::U8(ArrayD::zeros(shape)),
                DType::I32 => Tensor::I32(ArrayD::zeros(shape)),
                DType::I64 => Tensor::I64(ArrayD::zeros(shape)),
                DType::Bool => Tensor::Bool(ArrayD::from_elem(shape, false)),
            };
            (io.name.clone(), tensor)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trt_cache_is_keyed_by_model_gpu_and_tensorrt() {
        let root = std::path::Path::new("/data/trt-cache");
        let model = Digest::of(b"model");
        let dir = trt_cache_dir(root, &model, "NVIDIA Jetson AGX Orin (64GB)", "10.16.1");
        assert_eq!(
            dir,
            root.join(model.to_hex())
                .join("NVIDIA-Jetson-AGX-Orin--64GB")
                .join("10.16.1")
        );
        // Nothing a reported name holds can leave the cache directory.
        let odd = trt_cache_dir(root, &model, "../..", "");
        assert_eq!(
            odd,
            root.join(model.to_hex()).join("unknown").join("unknown")
        );
    }

    #[test]
    fn the_tensorrt_version_comes_from_its_library_name() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(tensorrt_version(dir.path()), None);
        for f in [
            "libnvinfer.so.10",
            "libnvinfer.so.10.16.1",
            "libnvinfer_plugin.so.10.16.1",
            "libnvinfer.so.10.x",
        ] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        assert_eq!(tensorrt_version(dir.path()).as_deref(), Some("10.16.1"));
    }
}
