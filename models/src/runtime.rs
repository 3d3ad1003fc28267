//! ONNX Runtime, loaded at run time from a path (never downloaded at build time).
//!
//! [`OrtRuntime::load`] opens the ONNX Runtime 1.31 shared library and creates the
//! process's one ONNX Runtime environment; [`OrtRuntime::session`] turns model bytes
//! into a [`ModelSession`], which checks its inputs against the model before every
//! [`ModelSession::run`] and returns the outputs as owned [`Tensor`]s.
//!
//! Install the library with `scripts/fetch-onnxruntime.sh`. Where [`OrtRuntime::load`]
//! looks for it is described there.
//!
//! This module assumes it is the only user of `ort` in the process: `ort` keeps the
//! loaded library and the environment in process globals, and a library loaded by
//! someone else first would be used silently.

pub use crate::gpu_libs::{preload_gpu_runtime, Preloaded, GPU_RUNTIME_DIR};
use std::borrow::Cow;
use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ndarray::ArrayD;
use ort::environment::Environment;
use ort::ep;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::{OutputSelector, RunOptions, Session, SessionInputValue, SessionOutputs};
use ort::value::{DynValue, PrimitiveTensorElementType, TensorElementType, TensorRef, ValueType};

use crate::tensor::{DType, Tensor};

/// The ONNX Runtime release this crate is built against (`ort` 2.0.0-rc.15, API 31).
pub const ORT_VERSION: &str = "1.31.1";
/// The library's file name, as the PyPI wheel ships it.
pub const LIBRARY_FILE_NAME: &str = "libonnxruntime.so.1.31.1";
/// Environment variable naming the library file; it overrides the default location.
pub const ORT_DYLIB_PATH_ENV: &str = "ORT_DYLIB_PATH";
/// Environment variable naming the directory that holds `onnxruntime-1.31.1/`.
pub use crate::deps::DEPS_DIR_ENV;

/// The name ONNX Runtime gives its always-present CPU provider.
pub const CPU_PROVIDER: &str = "CPUExecutionProvider";

/// The capability key under which an agent lists, comma separated, the
/// tensor element types (NumPy names, as in manifests) its inference API
/// accepts; the control plane's rollout pre-check compares a model's inputs
/// with it.
pub const INPUT_DTYPES_CAPABILITY: &str = "edgeloop.io/input-dtypes";
const CUDA_PROVIDER: &str = "CUDAExecutionProvider";
const TENSORRT_PROVIDER: &str = "TensorrtExecutionProvider";

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("ONNX Runtime library not found at {}: {hint}", path.display())]
    LibraryNotFound { path: PathBuf, hint: String },
    #[error("could not load ONNX Runtime from {}: {reason}", path.display())]
    LoadFailed { path: PathBuf, reason: String },
    #[error(
        "ONNX Runtime is already loaded from {} in this process; it cannot also be loaded from {} \
         (ONNX Runtime can be initialised only once per process)",
        loaded.display(),
        requested.display()
    )]
    AlreadyLoaded { loaded: PathBuf, requested: PathBuf },
    #[error("could not create the session: {0}")]
    Session(String),
    #[error("input `{name}`: {reason}")]
    Input { name: String, reason: String },
    #[error("output `{name}`: {reason}")]
    Output { name: String, reason: String },
    #[error("inference failed: {0}")]
    Run(String),
}

/// Where the library path came from; it decides what the "not found" hint says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LibrarySource {
    Explicit,
    EnvOrtDylibPath,
    /// Beside the executable, as a package or the offline bundle installs it.
    Installed,
    DefaultLocation,
}

/// The environment variables that take part in resolving the library path, read
/// once so that resolution itself is a pure function (and testable without
/// touching the process environment).
#[derive(Debug, Default, Clone)]
struct ResolutionEnv {
    ort_dylib_path: Option<OsString>,
    edgeloop_deps: Option<OsString>,
    home: Option<OsString>,
    /// The library installed beside this executable, when it is there.
    installed: Option<PathBuf>,
}

/// Where a package or the offline bundle puts the library, relative to the
/// directory of the binary that loads it: `bin/x` finds `lib/edgeloop/`.
pub const INSTALLED_DIR: &str = "../lib/edgeloop";

impl ResolutionEnv {
    fn from_process() -> Self {
        // An empty value counts as unset, as `ort` itself treats ORT_DYLIB_PATH.
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        ResolutionEnv {
            ort_dylib_path: var(ORT_DYLIB_PATH_ENV),
            edgeloop_deps: var(DEPS_DIR_ENV),
            home: var("HOME"),
            installed: installed_beside(std::env::current_exe().ok().as_deref()),
        }
    }
}

/// The library at [`INSTALLED_DIR`] from `exe`'s real directory, if there.
fn installed_beside(exe: Option<&Path>) -> Option<PathBuf> {
    let exe = std::fs::canonicalize(exe?).ok()?;
    let dir = exe.parent()?.parent()?;
    let path = dir.join("lib").join("edgeloop").join(LIBRARY_FILE_NAME);
    path.is_file().then_some(path)
}

fn fetch_hint() -> String {
    format!(
        "install ONNX Runtime {ORT_VERSION} with scripts/fetch-onnxruntime.sh (it prints the \
         library path), then pass that path or set {ORT_DYLIB_PATH_ENV} to it, or set \
         {DEPS_DIR_ENV} to the deps directory the script used ($HOME/.edgeloop/deps unless \
         {DEPS_DIR_ENV} was set)"
    )
}

fn resolve(
    explicit: Option<&Path>,
    env: &ResolutionEnv,
) -> Result<(PathBuf, LibrarySource), RuntimeError> {
    if let Some(path) = explicit {
        return Ok((path.to_path_buf(), LibrarySource::Explicit));
    }
    if let Some(path) = &env.ort_dylib_path {
        return Ok((PathBuf::from(path), LibrarySource::EnvOrtDylibPath));
    }
    if let Some(path) = &env.installed {
        return Ok((path.clone(), LibrarySource::Installed));
    }
    let deps = match (&env.edgeloop_deps, &env.home) {
        (Some(deps), _) => PathBuf::from(deps),
        (None, Some(home)) => Path::new(home).join(".edgeloop").join("deps"),
        (None, None) => {
            return Err(RuntimeError::LibraryNotFound {
                path: Path::new("~/.edgeloop/deps")
                    .join(format!("onnxruntime-{ORT_VERSION}"))
                    .join(LIBRARY_FILE_NAME),
                hint: format!(
                    "neither {ORT_DYLIB_PATH_ENV}, {DEPS_DIR_ENV} nor HOME is set, so there is \
                     no default location; {}",
                    fetch_hint()
                ),
            })
        }
    };
    Ok((
        deps.join(format!("onnxruntime-{ORT_VERSION}"))
            .join(LIBRARY_FILE_NAME),
        LibrarySource::DefaultLocation,
    ))
}

/// Checks that `path` names something that can be a shared library, before handing
/// it to the dynamic loader: a missing file must be [`RuntimeError::LibraryNotFound`]
/// whatever else has been loaded, and a non-ELF file a clear error rather than the
/// loader's terse one. Returns the canonical path, so that two spellings of one file
/// count as one library.
fn check_library_file(path: &Path, source: LibrarySource) -> Result<PathBuf, RuntimeError> {
    let canonical = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let hint = match source {
                LibrarySource::Explicit => {
                    format!("the path given does not exist; {}", fetch_hint())
                }
                LibrarySource::EnvOrtDylibPath => format!(
                    "{ORT_DYLIB_PATH_ENV} names a file that does not exist; fix or unset it, or {}",
                    fetch_hint()
                ),
                LibrarySource::Installed => format!(
                    "it was beside the executable a moment ago; reinstall the package or \
                     bundle, or {}",
                    fetch_hint()
                ),
                LibrarySource::DefaultLocation => format!(
                    "this is the default location \
                     (<{DEPS_DIR_ENV} or ~/.edgeloop/deps>/onnxruntime-{ORT_VERSION}/); {}",
                    fetch_hint()
                ),
            };
            return Err(RuntimeError::LibraryNotFound {
                path: path.to_path_buf(),
                hint,
            });
        }
        Err(e) => {
            return Err(RuntimeError::LoadFailed {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        }
    };
    let load_failed = |reason: String| RuntimeError::LoadFailed {
        path: canonical.clone(),
        reason,
    };
    if canonical.is_dir() {
        return Err(load_failed(format!(
            "it is a directory; expected the library file ({LIBRARY_FILE_NAME})"
        )));
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(&canonical)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(|e| load_failed(format!("cannot read it: {e}")))?;
    if cfg!(target_os = "linux") && magic != *b"\x7fELF" {
        return Err(load_failed(
            "it is not a shared library (no ELF header)".to_string(),
        ));
    }
    Ok(canonical)
}

/// Turns `ort`'s loader error into a reason that says what to do about it.
fn load_error_reason(error: &ort::LoadDynamicError) -> String {
    match error {
        ort::LoadDynamicError::BadVersion { version_str, .. } => format!(
            "it is ONNX Runtime {version_str}, which is too old: this build needs {ORT_VERSION} \
             (at least 1.{}.x); {}",
            ort::MINOR_VERSION,
            fetch_hint()
        ),
        ort::LoadDynamicError::MissingApi { .. } => {
            "it does not export `OrtGetApiBase`, so it is not ONNX Runtime".to_string()
        }
        other => other.to_string(),
    }
}

struct LoadedRuntime {
    library_path: PathBuf,
    environment: Environment,
}

/// The one environment of this process. `ort` allows a single library load and a
/// single environment per process, so the first successful [`OrtRuntime::load`]
/// fills this and every later one either shares it or is refused.
static LOADED: Mutex<Option<Arc<LoadedRuntime>>> = Mutex::new(None);

/// A handle to the process's loaded ONNX Runtime. Cheap to clone; all clones share
/// one environment.
#[derive(Clone)]
pub struct OrtRuntime {
    inner: Arc<LoadedRuntime>,
}

impl fmt::Debug for OrtRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrtRuntime")
            .field("library_path", &self.inner.library_path)
            .finish_non_exhaustive()
    }
}

impl OrtRuntime {
    /// Loads ONNX Runtime and creates its environment, or returns a handle to the
    /// one already created in this process.
    ///
    /// The library is looked for, in order:
    /// 1. at `path`, if given;
    /// 2. at the file named by the environment variable `ORT_DYLIB_PATH`, if set and
    ///    non-empty;
    /// 3. beside the executable, at `<its dir>/../lib/edgeloop/libonnxruntime.so.1.31.1`,
    ///    if it is there (a package or the offline bundle put it there);
    /// 4. at the default location
    ///    `<EDGELOOP_DEPS or ~/.edgeloop/deps>/onnxruntime-1.31.1/libonnxruntime.so.1.31.1`
    ///    (`EDGELOOP_DEPS` if set and non-empty, else `$HOME/.edgeloop/deps`).
    ///
    /// The first candidate is used; a missing file is not skipped in favour of the
    /// next. A relative path is taken relative to the current directory. Note that
    /// `scripts/fetch-onnxruntime.sh` installs into `<repo>/.edgeloop/deps` unless
    /// `EDGELOOP_DEPS` is set.
    ///
    /// ONNX Runtime can be initialised only once per process: a later call that
    /// resolves to the same file (compared after resolving symlinks) returns a handle
    /// to the same environment; one that resolves to another file gets
    /// [`RuntimeError::AlreadyLoaded`]. A missing file is always
    /// [`RuntimeError::LibraryNotFound`]; a file that is not ONNX Runtime, or is older
    /// than 1.31, is [`RuntimeError::LoadFailed`].
    pub fn load(path: Option<&Path>) -> Result<OrtRuntime, RuntimeError> {
        let (path, source) = resolve(path, &ResolutionEnv::from_process())?;
        let library_path = check_library_file(&path, source)?;

        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(inner) = loaded.as_ref() {
            if inner.library_path == library_path {
                return Ok(OrtRuntime {
                    inner: Arc::clone(inner),
                });
            }
            return Err(RuntimeError::AlreadyLoaded {
                loaded: inner.library_path.clone(),
                requested: library_path,
            });
        }

        let load_failed = |reason: String| RuntimeError::LoadFailed {
            path: library_path.clone(),
            reason,
        };
        if let Some(dir) = library_path.parent() {
            preload_gpu_runtime(&dir.join(GPU_RUNTIME_DIR));
        }
        let environment = ort::init_from(&library_path)
            .map_err(|e| load_failed(load_error_reason(&e)))?
            .with_name("edgeloop")
            // Edge devices report only through Edgeloop's own telemetry.
            .with_telemetry(false)
            .build()
            .map_err(|e| load_failed(format!("creating the environment: {e}")))?;

        let inner = Arc::new(LoadedRuntime {
            library_path,
            environment,
        });
        *loaded = Some(Arc::clone(&inner));
        Ok(OrtRuntime { inner })
    }

    /// Where [`OrtRuntime::load`] would look for the library, without loading it (see
    /// there for the order). The path is not checked for existence.
    pub fn resolve_library_path(path: Option<&Path>) -> Result<PathBuf, RuntimeError> {
        resolve(path, &ResolutionEnv::from_process()).map(|(p, _)| p)
    }

    /// The library file in use, with symlinks resolved.
    pub fn library_path(&self) -> &Path {
        &self.inner.library_path
    }

    /// Creates a session for an ONNX model held in memory (at most 2 GiB:
    /// protobuf's limit; a bigger model is loaded with
    /// [`OrtRuntime::session_from_file`]).
    ///
    /// GPU providers that this ONNX Runtime build lacks, that fail to register, or
    /// that make session creation fail are dropped with a `warn` log, and the session
    /// runs on the CPU instead; see [`ModelSession::provider`].
    pub fn session(
        &self,
        model_bytes: &[u8],
        options: &SessionOptions,
    ) -> Result<ModelSession, RuntimeError> {
        self.commit(options, |builder| builder.commit_from_memory(model_bytes))
    }

    /// Creates a session for the ONNX model at `path`. ONNX Runtime reads
    /// (or maps) the file itself, and resolves external data relative to
    /// the file's directory: this is how a model over 2 GiB loads, and it
    /// spares the caller a copy of the model in memory. GPU fallback as in
    /// [`OrtRuntime::session`].
    pub fn session_from_file(
        &self,
        path: &Path,
        options: &SessionOptions,
    ) -> Result<ModelSession, RuntimeError> {
        self.commit(options, |builder| builder.commit_from_file(path))
    }

    fn commit(
        &self,
        options: &SessionOptions,
        commit: impl Fn(&mut SessionBuilder) -> ort::Result<Session>,
    ) -> Result<ModelSession, RuntimeError> {
        let (mut builder, accelerator) = self.builder(options, true)?;
        let (session, accelerator) = match commit(&mut builder) {
            Ok(session) => (session, accelerator),
            Err(error) => match accelerator {
                // The GPU may be what failed (no device, out of memory, missing
                // CUDA libraries only found at session creation): retry on the CPU,
                // and report the model's own error only if that fails too.
                Some(provider) => {
                    tracing::warn!(
                        provider,
                        %error,
                        "session creation failed with a GPU provider; retrying on the CPU"
                    );
                    let (mut builder, _) = self.builder(options, false)?;
                    let session =
                        commit(&mut builder).map_err(|e| RuntimeError::Session(e.to_string()))?;
                    (session, None)
                }
                None => return Err(RuntimeError::Session(error.to_string())),
            },
        };
        Ok(ModelSession::new(
            session,
            accelerator.unwrap_or(CPU_PROVIDER),
        ))
    }

    /// A configured session builder, and the GPU provider it registered first (the
    /// one ONNX Runtime prefers), if any.
    fn builder(
        &self,
        options: &SessionOptions,
        with_gpu: bool,
    ) -> Result<(SessionBuilder, Option<&'static str>), RuntimeError> {
        let session_error = |e: ort::Error<SessionBuilder>| RuntimeError::Session(e.to_string());
        let mut builder = Session::builder(&self.inner.environment)
            .map_err(|e| RuntimeError::Session(e.to_string()))?
            .with_optimization_level(options.optimization.into())
            .map_err(session_error)?;
        if options.intra_op_threads > 0 {
            builder = builder
                .with_intra_threads(options.intra_op_threads)
                .map_err(session_error)?;
        }
        if !with_gpu {
            return Ok((builder, None));
        }
        let mut accelerator = None;
        for provider in &options.providers {
            let Some((name, dispatch)) = gpu_provider_dispatch(provider) else {
                continue;
            };
            builder = match builder.with_execution_providers([dispatch.error_on_failure()]) {
                Ok(builder) => {
                    accelerator.get_or_insert(name);
                    builder
                }
                Err(error) => {
                    tracing::warn!(
                        provider = name,
                        library = %self.inner.library_path.display(),
                        %error,
                        "execution provider unavailable; falling back to the next provider (finally CPU)"
                    );
                    error.recover()
                }
            };
        }
        Ok((builder, accelerator))
    }
}

/// The `ort` provider for a GPU entry, or `None` (with a warning where that is a
/// fallback) when there is nothing to register: `Cpu` is always present and last.
fn gpu_provider_dispatch(
    provider: &ExecutionProvider,
) -> Option<(&'static str, ep::ExecutionProviderDispatch)> {
    let (name, device_id, available) = match provider {
        ExecutionProvider::Cpu => return None,
        ExecutionProvider::Cuda { device_id, .. } => (
            CUDA_PROVIDER,
            *device_id,
            <ep::CUDA as ep::ExecutionProvider>::is_available(),
        ),
        ExecutionProvider::TensorRt { device_id, .. } => (
            TENSORRT_PROVIDER,
            *device_id,
            <ep::TensorRT as ep::ExecutionProvider>::is_available(),
        ),
    };
    match available {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(
                provider = name,
                "this ONNX Runtime build has no such execution provider (a CPU-only library?); \
                 falling back to the next provider (finally CPU)"
            );
            return None;
        }
        Err(error) => {
            tracing::warn!(provider = name, %error, "cannot list ONNX Runtime's providers; skipping it");
            return None;
        }
    }
    let Ok(device_id) = i32::try_from(device_id) else {
        tracing::warn!(
            provider = name,
            device_id,
            "device id out of range; skipping it"
        );
        return None;
    };
    let dispatch = match provider {
        ExecutionProvider::Cuda {
            mem_limit_bytes, ..
        } => {
            let mut cuda = ep::CUDA::default().with_device_id(device_id);
            if let Some(limit) = mem_limit_bytes {
                cuda = cuda.with_memory_limit(*limit);
            }
            cuda.build()
        }
        ExecutionProvider::TensorRt {
            engine_cache, fp16, ..
        } => {
            let mut trt = ep::TensorRT::default()
                .with_device_id(device_id)
                .with_fp16(*fp16);
            if let Some(dir) = engine_cache {
                if let Err(error) = std::fs::create_dir_all(dir) {
                    tracing::warn!(dir = %dir.display(), %error, "cannot create the TensorRT engine cache; building without it");
                } else {
                    let dir = dir.display().to_string();
                    trt = trt
                        .with_engine_cache(true)
                        .with_engine_cache_path(&dir)
                        .with_timing_cache(true)
                        .with_timing_cache_path(&dir);
                }
            }
            trt.build()
        }
        ExecutionProvider::Cpu => return None,
    };
    Some((name, dispatch))
}

/// ONNX Runtime's graph optimization levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphOptimization {
    Disabled,
    Basic,
    Extended,
    #[default]
    All,
}

impl From<GraphOptimization> for GraphOptimizationLevel {
    fn from(level: GraphOptimization) -> Self {
        match level {
            GraphOptimization::Disabled => GraphOptimizationLevel::Disable,
            GraphOptimization::Basic => GraphOptimizationLevel::Level1,
            GraphOptimization::Extended => GraphOptimizationLevel::Level2,
            GraphOptimization::All => GraphOptimizationLevel::All,
        }
    }
}

/// An execution provider to ask for, in order of preference. `Cpu` is always
/// available and always the final fallback, wherever it appears in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionProvider {
    Cpu,
    /// NVIDIA CUDA; needs the GPU build of ONNX Runtime (PyPI `onnxruntime-gpu`) and
    /// CUDA 13. `mem_limit_bytes: None` leaves ONNX Runtime's arena unlimited.
    Cuda {
        device_id: u32,
        mem_limit_bytes: Option<usize>,
    },
    /// NVIDIA TensorRT; needs the GPU build of ONNX Runtime, TensorRT 10 and cuDNN 9.
    TensorRt {
        device_id: u32,
        /// Where built engines (and TensorRT's timing cache) are kept, so a
        /// reload or a restart skips the build (minutes on a Jetson). `None`
        /// builds on every load.
        engine_cache: Option<PathBuf>,
        /// Allow fp16 kernels.
        fp16: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// Threads within one operator; 0 leaves ONNX Runtime's default (one per core).
    pub intra_op_threads: usize,
    pub optimization: GraphOptimization,
    /// Preferred providers, first preferred. GPU providers that are unavailable are
    /// skipped with a warning, never an error.
    pub providers: Vec<ExecutionProvider>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            intra_op_threads: 0,
            optimization: GraphOptimization::All,
            providers: vec![ExecutionProvider::Cpu],
        }
    }
}

/// A model input or output as the model declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoInfo {
    pub name: String,
    /// `None` when it is not a tensor (a sequence or map, say) or is a tensor of an
    /// element type [`DType`] lacks.
    pub dtype: Option<DType>,
    /// One entry per dimension; `None` for a symbolic or unknown one. Empty for a
    /// scalar, and for values that are not tensors.
    pub shape: Vec<Option<i64>>,
}

/// A model loaded into ONNX Runtime, ready to run.
///
/// `run` takes `&mut self` because ONNX Runtime's `Run` is not thread safe for all
/// providers (and `ort` rc.15 enforces that): use one session per worker, or a lock.
pub struct ModelSession {
    session: Session,
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    /// ONNX Runtime's own description of each input and output type (such as
    /// `Sequence<Map<i64, f32>>`), for error messages.
    input_types: Vec<String>,
    output_types: Vec<String>,
    provider: &'static str,
}

impl fmt::Debug for ModelSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelSession")
            .field("provider", &self.provider)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish_non_exhaustive()
    }
}

impl ModelSession {
    fn new(session: Session, provider: &'static str) -> Self {
        let describe = |outlets: &[ort::value::Outlet]| -> (Vec<IoInfo>, Vec<String>) {
            outlets
                .iter()
                .map(|o| (io_info(o.name(), o.dtype()), o.dtype().to_string()))
                .unzip()
        };
        let (inputs, input_types) = describe(session.inputs());
        let (outputs, output_types) = describe(session.outputs());
        ModelSession {
            session,
            inputs,
            outputs,
            input_types,
            output_types,
            provider,
        }
    }

    pub fn inputs(&self) -> &[IoInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoInfo] {
        &self.outputs
    }

    /// The execution provider in use: the first GPU provider that registered and
    /// let the session be created, else `CPUExecutionProvider`. (ONNX Runtime may
    /// still place operators the GPU provider lacks on the CPU.)
    pub fn provider(&self) -> &str {
        self.provider
    }

    /// Runs with named inputs; returns all outputs, in the model's output order, as
    /// owned Tensors.
    ///
    /// Inputs are checked first: an unknown, repeated or missing name, a dtype other
    /// than the model's, or a rank or fixed dimension that differs give
    /// [`RuntimeError::Input`] naming the input. An output that is not a tensor of a
    /// [`DType`] gives [`RuntimeError::Output`] naming it; use
    /// [`ModelSession::run_outputs`] to leave such outputs out.
    pub fn run(
        &mut self,
        inputs: &[(&str, &Tensor)],
    ) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        let all: Vec<String> = self.outputs.iter().map(|o| o.name.clone()).collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        self.run_outputs(inputs, &all)
    }

    /// Like [`ModelSession::run`], but computes and returns only the named outputs,
    /// in the order named. ONNX Runtime may then skip work that only other outputs
    /// need.
    pub fn run_outputs(
        &mut self,
        inputs: &[(&str, &Tensor)],
        outputs: &[&str],
    ) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        validate_inputs(&self.inputs, &self.input_types, inputs)?;
        self.validate_outputs(outputs)?;

        let mut values: Vec<(Cow<'_, str>, SessionInputValue<'_>)> =
            Vec::with_capacity(inputs.len());
        for (name, tensor) in inputs {
            let value = to_ort_value(tensor).map_err(|e| RuntimeError::Input {
                name: (*name).to_string(),
                reason: format!("cannot hand it to ONNX Runtime: {e}"),
            })?;
            values.push((Cow::Borrowed(*name), value));
        }

        let selecting_all = outputs.len() == self.outputs.len()
            && outputs.iter().zip(&self.outputs).all(|(a, b)| *a == b.name);
        let run_options;
        let result: SessionOutputs<'_> = if selecting_all {
            self.session.run(values)
        } else {
            let selector = outputs
                .iter()
                .fold(OutputSelector::no_default(), |s, name| s.with(*name));
            run_options = RunOptions::new()
                .map_err(|e| RuntimeError::Run(e.to_string()))?
                .with_outputs(selector);
            self.session.run_with_options(values, &run_options)
        }
        .map_err(|e| RuntimeError::Run(e.to_string()))?;

        outputs
            .iter()
            .map(|name| {
                let value = result.get(name).ok_or_else(|| RuntimeError::Output {
                    name: (*name).to_string(),
                    reason: "ONNX Runtime returned no value for it".to_string(),
                })?;
                Ok(((*name).to_string(), from_ort_value(name, value)?))
            })
            .collect()
    }

    /// Refuses, before running, outputs that do not exist or cannot become a
    /// [`Tensor`], so that no inference is wasted on them.
    fn validate_outputs(&self, requested: &[&str]) -> Result<(), RuntimeError> {
        for (i, name) in requested.iter().enumerate() {
            let output_error = |reason: String| RuntimeError::Output {
                name: (*name).to_string(),
                reason,
            };
            if requested[..i].contains(name) {
                return Err(output_error("requested more than once".to_string()));
            }
            let Some(index) = self.outputs.iter().position(|o| o.name == *name) else {
                return Err(output_error(format!(
                    "the model has no such output; its outputs are {}",
                    name_list(&self.outputs)
                )));
            };
            if self.outputs[index].dtype.is_none() {
                return Err(output_error(format!(
                    "it is {}, which is not a tensor of a supported dtype ({})",
                    self.output_types[index],
                    supported_dtypes()
                )));
            }
        }
        Ok(())
    }
}

fn name_list(infos: &[IoInfo]) -> String {
    let names: Vec<String> = infos.iter().map(|i| format!("`{}`", i.name)).collect();
    if names.is_empty() {
        "(none)".to_string()
    } else {
        names.join(", ")
    }
}

fn supported_dtypes() -> String {
    DType::ALL.map(|d| d.numpy_name()).join(", ")
}

fn io_info(name: &str, value_type: &ValueType) -> IoInfo {
    match value_type {
        ValueType::Tensor { ty, shape, .. } => IoInfo {
            name: name.to_string(),
            dtype: dtype_from_ort(*ty),
            shape: shape.iter().map(|&d| dim_from_ort(d)).collect(),
        },
        _ => IoInfo {
            name: name.to_string(),
            dtype: None,
            shape: Vec::new(),
        },
    }
}

/// ONNX Runtime reports a symbolic or unknown dimension as -1.
fn dim_from_ort(dim: i64) -> Option<i64> {
    (dim >= 0).then_some(dim)
}

fn dtype_from_ort(ty: TensorElementType) -> Option<DType> {
    Some(match ty {
        TensorElementType::Float32 => DType::F32,
        TensorElementType::Float64 => DType::F64,
        TensorElementType::Float16 => DType::F16,
        TensorElementType::Int8 => DType::I8,
        TensorElementType::Uint8 => DType::U8,
        TensorElementType::Int32 => DType::I32,
        TensorElementType::Int64 => DType::I64,
        TensorElementType::Bool => DType::Bool,
        _ => return None,
    })
}

fn format_shape(shape: &[Option<i64>]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| d.map_or_else(|| "?".to_string(), |d| d.to_string()))
        .collect();
    format!("[{}]", dims.join(", "))
}

/// Checks the inputs against the model's declarations. `expected_types` holds ONNX
/// Runtime's description of each expected input, for inputs [`DType`] cannot express.
fn validate_inputs(
    expected: &[IoInfo],
    expected_types: &[String],
    given: &[(&str, &Tensor)],
) -> Result<(), RuntimeError> {
    for (i, (name, tensor)) in given.iter().enumerate() {
        let input_error = |reason: String| RuntimeError::Input {
            name: (*name).to_string(),
            reason,
        };
        if given[..i].iter().any(|(n, _)| n == name) {
            return Err(input_error("given more than once".to_string()));
        }
        let Some(index) = expected.iter().position(|e| e.name == *name) else {
            return Err(input_error(format!(
                "the model has no such input; its inputs are {}",
                name_list(expected)
            )));
        };
        let info = &expected[index];
        let Some(dtype) = info.dtype else {
            let ty = expected_types
                .get(index)
                .map_or("an unsupported type", String::as_str);
            return Err(input_error(format!(
                "the model expects {ty}, which cannot be given as a Tensor (supported: {})",
                supported_dtypes()
            )));
        };
        if tensor.dtype() != dtype {
            return Err(input_error(format!(
                "the model expects dtype {dtype}, got {}",
                tensor.dtype()
            )));
        }
        let shape = tensor.shape();
        if shape.len() != info.shape.len() {
            return Err(input_error(format!(
                "the model expects rank {} (shape {}), got rank {} (shape {shape:?})",
                info.shape.len(),
                format_shape(&info.shape),
                shape.len()
            )));
        }
        for (axis, (want, got)) in info.shape.iter().zip(shape).enumerate() {
            if let Some(want) = *want {
                if u64::try_from(want).ok() != u64::try_from(*got).ok() {
                    return Err(input_error(format!(
                        "dimension {axis} must be {want} (model shape {}), got {got} (shape {shape:?})",
                        format_shape(&info.shape)
                    )));
                }
            }
        }
    }
    if let Some(missing) = expected
        .iter()
        .find(|e| !given.iter().any(|(n, _)| *n == e.name))
    {
        return Err(RuntimeError::Input {
            name: missing.name.clone(),
            reason: format!(
                "missing: the model requires it (shape {}, dtype {})",
                format_shape(&missing.shape),
                missing
                    .dtype
                    .map_or_else(|| "unsupported".to_string(), |d| d.to_string())
            ),
        });
    }
    Ok(())
}

fn to_ort_value(tensor: &Tensor) -> ort::Result<SessionInputValue<'_>> {
    fn convert<T>(array: &ArrayD<T>) -> ort::Result<SessionInputValue<'_>>
    where
        T: PrimitiveTensorElementType + fmt::Debug + Clone + 'static,
    {
        if array.is_standard_layout() {
            // Zero copy: ONNX Runtime reads the array in place during the run.
            Ok(TensorRef::from_array_view(array.view())?.into())
        } else {
            Ok(ort::value::Tensor::from_array(array.as_standard_layout().into_owned())?.into())
        }
    }
    crate::with_array!(tensor, a => convert(a))
}

fn from_ort_value(name: &str, value: &DynValue) -> Result<Tensor, RuntimeError> {
    let output_error = |reason: String| RuntimeError::Output {
        name: name.to_string(),
        reason,
    };
    let dtype = match value.dtype() {
        ValueType::Tensor { ty, .. } => dtype_from_ort(*ty).ok_or_else(|| {
            output_error(format!(
                "it is a tensor of {ty}, which is not a supported dtype ({})",
                supported_dtypes()
            ))
        })?,
        other => {
            return Err(output_error(format!(
                "it is {other}, not a tensor of a supported dtype ({})",
                supported_dtypes()
            )))
        }
    };
    fn extract<E>(value: &DynValue) -> ort::Result<ArrayD<E>>
    where
        E: PrimitiveTensorElementType + Clone,
    {
        Ok(value.try_extract_array::<E>()?.to_owned())
    }
    let tensor = match dtype {
        DType::F32 => extract(value).map(Tensor::F32),
        DType::F64 => extract(value).map(Tensor::F64),
        DType::F16 => extract(value).map(Tensor::F16),
        DType::I8 => extract(value).map(Tensor::I8),
        DType::U8 => extract(value).map(Tensor::U8),
        DType::I32 => extract(value).map(Tensor::I32),
        DType::I64 => extract(value).map(Tensor::I64),
        DType::Bool => extract(value).map(Tensor::Bool),
    };
    tensor.map_err(|e| output_error(format!("cannot read it: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(ort: Option<&str>, deps: Option<&str>, home: Option<&str>) -> ResolutionEnv {
        ResolutionEnv {
            ort_dylib_path: ort.map(OsString::from),
            edgeloop_deps: deps.map(OsString::from),
            home: home.map(OsString::from),
            installed: None,
        }
    }

    /// The library beside the executable comes after an explicit path and
    /// ORT_DYLIB_PATH, before the deps dir; it counts only where it is.
    #[test]
    fn an_installed_library_beside_the_executable_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("edgeloop"), b"").unwrap();
        assert_eq!(installed_beside(Some(&bin.join("edgeloop"))), None);
        let lib = dir.path().join("lib/edgeloop");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(LIBRARY_FILE_NAME), b"").unwrap();
        // Through a symlink to the binary, too (`/usr/local/bin/edgeloop`).
        let link = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(bin.join("edgeloop"), &link).unwrap();
        let found = installed_beside(Some(&link)).unwrap();
        assert_eq!(
            found,
            std::fs::canonicalize(lib.join(LIBRARY_FILE_NAME)).unwrap()
        );
        let with = |ort: Option<&str>| ResolutionEnv {
            installed: Some(found.clone()),
            ..env(ort, Some("/deps"), Some("/home/u"))
        };
        assert_eq!(
            resolve(None, &with(None)).unwrap(),
            (found.clone(), LibrarySource::Installed)
        );
        assert_eq!(
            resolve(None, &with(Some("/env/libort.so"))).unwrap().1,
            LibrarySource::EnvOrtDylibPath
        );
        assert_eq!(
            resolve(Some(Path::new("/x.so")), &with(None)).unwrap().1,
            LibrarySource::Explicit
        );
    }

    #[test]
    fn resolution_order_explicit_then_env_then_deps_then_home() {
        let all = env(Some("/env/libort.so"), Some("/deps"), Some("/home/u"));
        let cases: [(Option<&Path>, &ResolutionEnv, &str, LibrarySource); 5] = [
            (
                Some(Path::new("/x/lib.so")),
                &all,
                "/x/lib.so",
                LibrarySource::Explicit,
            ),
            (None, &all, "/env/libort.so", LibrarySource::EnvOrtDylibPath),
            (
                None,
                &env(None, Some("/deps"), Some("/home/u")),
                "/deps/onnxruntime-1.31.1/libonnxruntime.so.1.31.1",
                LibrarySource::DefaultLocation,
            ),
            (
                None,
                &env(None, None, Some("/home/u")),
                "/home/u/.edgeloop/deps/onnxruntime-1.31.1/libonnxruntime.so.1.31.1",
                LibrarySource::DefaultLocation,
            ),
            (
                Some(Path::new("rel/lib.so")),
                &env(None, None, None),
                "rel/lib.so",
                LibrarySource::Explicit,
            ),
        ];
        for (explicit, env, want_path, want_source) in cases {
            let (path, source) = resolve(explicit, env).unwrap();
            assert_eq!(
                (path.as_path(), source),
                (Path::new(want_path), want_source)
            );
        }
    }

    #[test]
    fn empty_env_values_count_as_unset() {
        // `from_process` filters empties; emulate its result for ORT_DYLIB_PATH="".
        let var = |v: &str| Some(OsString::from(v)).filter(|v| !v.is_empty());
        let env = ResolutionEnv {
            ort_dylib_path: var(""),
            edgeloop_deps: var(""),
            home: var("/h"),
            installed: None,
        };
        let (path, source) = resolve(None, &env).unwrap();
        assert_eq!(source, LibrarySource::DefaultLocation);
        assert!(path.starts_with("/h/.edgeloop/deps"));
    }

    #[test]
    fn no_home_and_no_env_is_not_found_with_a_hint() {
        let err = resolve(None, &env(None, None, None)).unwrap_err();
        let RuntimeError::LibraryNotFound { hint, .. } = &err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        assert!(hint.contains("HOME"), "{hint}");
        assert!(hint.contains("fetch-onnxruntime.sh"), "{hint}");
    }

    #[test]
    fn library_file_checks() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.so");
        let err = check_library_file(&missing, LibrarySource::EnvOrtDylibPath).unwrap_err();
        let RuntimeError::LibraryNotFound { path, hint } = &err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        assert_eq!(path, &missing);
        assert!(hint.contains(ORT_DYLIB_PATH_ENV), "{hint}");

        let err = check_library_file(dir.path(), LibrarySource::Explicit).unwrap_err();
        assert!(
            matches!(&err, RuntimeError::LoadFailed { reason, .. } if reason.contains("directory")),
            "{err:?}"
        );

        let text = dir.path().join("text.so");
        std::fs::write(&text, b"not a library").unwrap();
        let err = check_library_file(&text, LibrarySource::Explicit).unwrap_err();
        assert!(
            matches!(&err, RuntimeError::LoadFailed { reason, .. } if reason.contains("ELF")),
            "{err:?}"
        );

        let short = dir.path().join("short.so");
        std::fs::write(&short, b"\x7f").unwrap();
        let err = check_library_file(&short, LibrarySource::Explicit).unwrap_err();
        assert!(matches!(err, RuntimeError::LoadFailed { .. }), "{err:?}");

        let elf = dir.path().join("elf.so");
        std::fs::write(&elf, b"\x7fELF rest").unwrap();
        let link = dir.path().join("link.so");
        std::os::unix::fs::symlink(&elf, &link).unwrap();
        assert_eq!(
            check_library_file(&link, LibrarySource::Explicit).unwrap(),
            std::fs::canonicalize(&elf).unwrap()
        );
    }

    #[test]
    fn too_old_library_reason_names_both_versions() {
        let error = ort::LoadDynamicError::BadVersion {
            version_str: "1.20.1".to_string(),
            path: PathBuf::from("/x/libonnxruntime.so"),
        };
        let reason = load_error_reason(&error);
        assert!(
            reason.contains("1.20.1") && reason.contains(ORT_VERSION),
            "{reason}"
        );
        assert!(reason.contains("too old"), "{reason}");
    }

    #[test]
    fn ort_types_map_to_dtypes() {
        let pairs = [
            (TensorElementType::Float32, DType::F32),
            (TensorElementType::Float64, DType::F64),
            (TensorElementType::Float16, DType::F16),
            (TensorElementType::Int8, DType::I8),
            (TensorElementType::Uint8, DType::U8),
            (TensorElementType::Int32, DType::I32),
            (TensorElementType::Int64, DType::I64),
            (TensorElementType::Bool, DType::Bool),
        ];
        for (ort, dtype) in pairs {
            assert_eq!(dtype_from_ort(ort), Some(dtype));
        }
        assert_eq!(pairs.len(), DType::ALL.len());
        for unsupported in [
            TensorElementType::String,
            TensorElementType::Bfloat16,
            TensorElementType::Uint64,
        ] {
            assert_eq!(dtype_from_ort(unsupported), None);
        }
        assert_eq!(
            [dim_from_ort(-1), dim_from_ort(0), dim_from_ort(3)],
            [None, Some(0), Some(3)]
        );
    }

    fn info(name: &str, dtype: Option<DType>, shape: &[Option<i64>]) -> IoInfo {
        IoInfo {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn input_validation_names_the_input_at_fault() {
        let expected = [
            info("x", Some(DType::F32), &[None, Some(4)]),
            info("mask", Some(DType::Bool), &[]),
        ];
        let types = [
            "Tensor<f32>(batch, 4)".to_string(),
            "Tensor<bool>()".to_string(),
        ];
        let x = Tensor::F32(ArrayD::zeros(vec![2, 4]));
        let x_batch1 = Tensor::F32(ArrayD::zeros(vec![1, 4]));
        let x_i64 = Tensor::I64(ArrayD::zeros(vec![2, 4]));
        let x_rank1 = Tensor::F32(ArrayD::zeros(vec![4]));
        let x_wide = Tensor::F32(ArrayD::zeros(vec![2, 5]));
        let mask = Tensor::Bool(ArrayD::from_elem(vec![], true));

        assert!(validate_inputs(&expected, &types, &[("x", &x), ("mask", &mask)]).is_ok());
        assert!(validate_inputs(&expected, &types, &[("mask", &mask), ("x", &x_batch1)]).is_ok());

        type Inputs<'a> = &'a [(&'a str, &'a Tensor)];
        let cases: [(Inputs<'_>, &str, &str); 6] = [
            (&[("y", &x), ("mask", &mask)], "y", "no such input"),
            (&[("x", &x)], "mask", "missing"),
            (
                &[("x", &x_i64), ("mask", &mask)],
                "x",
                "expects dtype float32, got int64",
            ),
            (&[("x", &x_rank1), ("mask", &mask)], "x", "rank 2"),
            (
                &[("x", &x_wide), ("mask", &mask)],
                "x",
                "dimension 1 must be 4",
            ),
            (
                &[("x", &x), ("x", &x), ("mask", &mask)],
                "x",
                "more than once",
            ),
        ];
        for (given, want_name, want_reason) in cases {
            match validate_inputs(&expected, &types, given) {
                Err(RuntimeError::Input { name, reason }) => {
                    assert_eq!(name, want_name, "{reason}");
                    assert!(
                        reason.contains(want_reason),
                        "{reason:?} lacks {want_reason:?}"
                    );
                }
                other => panic!("expected an Input error for {want_name}, got {other:?}"),
            }
        }

        let unsupported = [info("s", None, &[])];
        let err = validate_inputs(
            &unsupported,
            &["Tensor<String>()".to_string()],
            &[("s", &mask)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("Tensor<String>"), "{err}");
    }

    #[test]
    fn errors_read_well() {
        let err = RuntimeError::Input {
            name: "x".into(),
            reason: "missing".into(),
        };
        assert_eq!(err.to_string(), "input `x`: missing");
        let err = RuntimeError::AlreadyLoaded {
            loaded: "/a.so".into(),
            requested: "/b.so".into(),
        };
        assert!(err.to_string().contains("/a.so") && err.to_string().contains("/b.so"));
    }

    #[test]
    fn default_options_are_cpu_with_all_optimizations() {
        let options = SessionOptions::default();
        assert_eq!(options.providers, [ExecutionProvider::Cpu]);
        assert_eq!(options.optimization, GraphOptimization::All);
        assert_eq!(options.intra_op_threads, 0);
    }
}
