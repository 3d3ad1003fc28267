//! The NVIDIA libraries of a GPU build of ONNX Runtime, loaded before ONNX
//! Runtime opens its CUDA or TensorRT provider (re-exported from
//! [`crate::runtime`]). Apart from `runtime.rs` because it is the project's
//! one `unsafe` block, and small enough to audit on its own.

use std::path::{Path, PathBuf};

/// Beside a GPU build of the library, `scripts/fetch-onnxruntime.sh --gpu`
/// puts the NVIDIA libraries its providers need (CUDA, cuBLAS, cuDNN,
/// TensorRT) in this directory.
pub const GPU_RUNTIME_DIR: &str = "cuda";

/// Loads every shared library in `dir` with `RTLD_GLOBAL`, so that when ONNX
/// Runtime later opens its CUDA or TensorRT provider, whose `NEEDED`
/// entries (`libcudart.so.13`, `libnvinfer.so.10`, ...) have no RUNPATH to
/// find them by, the loader finds them already loaded by soname; and cuDNN
/// and TensorRT find the parts they open themselves. This is what the
/// `onnxruntime` Python package's `preload_dlls()` does, and it spares the
/// user an `LD_LIBRARY_PATH`. The libraries depend on each other, so it
/// loads in rounds until a round loads nothing new; what never loads is
/// logged (a provider that needs it then fails, and serving falls back to
/// the CPU with the reason). A missing `dir` is the CPU build: nothing to do.
#[allow(unsafe_code)] // The project's one unsafe block (ARCHITECTURE.md).
pub fn preload_gpu_runtime(dir: &Path) -> Preloaded {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Preloaded::default();
    };
    let mut pending: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(".so"))
        })
        .collect();
    pending.sort();
    let mut loaded = 0;
    // The first error per library: a retry of a failed dlopen may report
    // only "dlopen failed", not the missing dependency.
    let mut first_errors: std::collections::BTreeMap<PathBuf, String> = Default::default();
    loop {
        let before = pending.len();
        let mut failed = Vec::new();
        for path in pending {
            // SAFETY: these are the NVIDIA runtime libraries the fetch script
            // installed; their initialisers only register with the CUDA
            // runtime. The handles are leaked on purpose: they must stay
            // loaded for the life of the process, as ONNX Runtime's are.
            let opened = unsafe {
                libloading::os::unix::Library::open(
                    Some(&path),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            };
            match opened {
                Ok(lib) => {
                    std::mem::forget(lib);
                    loaded += 1;
                }
                Err(e) => {
                    first_errors.entry(path.clone()).or_insert_with(|| {
                        // libloading puts dlerror()'s text in the source.
                        let why = std::error::Error::source(&e)
                            .map_or_else(|| e.to_string(), |s| s.to_string());
                        format!("{}: {why}", path.display())
                    });
                    failed.push(path);
                }
            }
        }
        pending = failed;
        if pending.is_empty() || pending.len() == before {
            break;
        }
    }
    let last_errors: Vec<String> = pending
        .iter()
        .filter_map(|p| first_errors.remove(p))
        .collect();
    if !last_errors.is_empty() {
        tracing::warn!(
            dir = %dir.display(),
            errors = %last_errors.join("; "),
            "some NVIDIA runtime libraries did not load; the GPU providers that need them will fall back to the CPU"
        );
    }
    tracing::info!(dir = %dir.display(), loaded, "preloaded the NVIDIA runtime for the GPU providers");
    Preloaded {
        loaded,
        failed: last_errors,
    }
}

/// What [`preload_gpu_runtime`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preloaded {
    pub loaded: usize,
    /// `path: reason` for each library that did not load (on a machine
    /// without an NVIDIA driver, those that need `libcuda.so.1`).
    pub failed: Vec<String>,
}
