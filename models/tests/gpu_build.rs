//! The GPU build of ONNX Runtime as `scripts/fetch-onnxruntime.sh --gpu`
//! installs it: the library finds the NVIDIA runtime beside it without
//! `LD_LIBRARY_PATH`, and a session asked for CUDA runs on CUDA where there
//! is a GPU (and a driver), and on the CPU, with the reason logged, where
//! there is none. Opt-in: the GPU build is 2.4 GB. `scripts/gpu-check.sh`
//! runs it; by hand: `EDGELOOP_ORT_GPU_LIBRARY=<deps>/onnxruntime-gpu-1.31.1/
//! libonnxruntime.so.1.31.1 cargo test -p edgeloop-models --test gpu_build
//! -- --ignored`. Its own binary: one ONNX Runtime is loaded per process.

use std::path::PathBuf;

use edgeloop_models::runtime::{
    preload_gpu_runtime, ExecutionProvider, OrtRuntime, SessionOptions, GPU_RUNTIME_DIR,
};
use edgeloop_models::Tensor;
use ndarray::ArrayD;

#[test]
#[ignore = "needs scripts/fetch-onnxruntime.sh --gpu (2.4 GB); scripts/gpu-check.sh runs it"]
fn the_gpu_build_loads_its_runtime_and_serves_on_cuda_or_says_why_not() {
    let library = PathBuf::from(
        std::env::var_os("EDGELOOP_ORT_GPU_LIBRARY")
            .expect("EDGELOOP_ORT_GPU_LIBRARY names the GPU build's libonnxruntime.so"),
    );
    let cuda_dir = library.parent().unwrap().join(GPU_RUNTIME_DIR);
    // Loading twice is harmless (the loader counts references), and shows
    // that every library in cuda/ loads: their dependencies are all there.
    let files = std::fs::read_dir(&cuda_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().contains(".so"))
        })
        .count();
    let preloaded = preload_gpu_runtime(&cuda_dir);
    assert!(
        files >= 10,
        "{} holds {files} libraries",
        cuda_dir.display()
    );
    assert_eq!(preloaded.loaded + preloaded.failed.len(), files);
    let has_gpu = !listed_gpus().is_empty();
    if has_gpu {
        assert_eq!(preloaded.failed, Vec::<String>::new());
    } else {
        // Only what needs the driver itself may fail: the rest is all there.
        for why in &preloaded.failed {
            assert!(why.contains("libcuda.so.1"), "{why}");
        }
    }

    let runtime = OrtRuntime::load(Some(&library)).unwrap();
    let model = std::fs::read(
        edgeloop_models::deps::dir()
            .unwrap()
            .join("onnxruntime-1.31.1/datasets/mul_1.onnx"),
    )
    .expect("the CPU install's test models (scripts/fetch-onnxruntime.sh)");
    let options = SessionOptions {
        providers: vec![
            ExecutionProvider::Cuda {
                device_id: 0,
                mem_limit_bytes: Some(256 << 20),
            },
            ExecutionProvider::Cpu,
        ],
        ..SessionOptions::default()
    };
    let mut session = runtime.session(&model, &options).unwrap();
    let want = if has_gpu {
        "CUDAExecutionProvider"
    } else {
        "CPUExecutionProvider"
    };
    assert_eq!(session.provider(), want);
    let x = Tensor::F32(ArrayD::from_shape_vec(vec![3, 2], vec![1., 2., 3., 4., 5., 6.]).unwrap());
    let out = session.run(&[("X", &x)]).unwrap();
    let Tensor::F32(y) = &out[0].1 else {
        panic!("{out:?}")
    };
    assert_eq!(
        y.iter().copied().collect::<Vec<f32>>(),
        [1., 4., 9., 16., 25., 36.]
    );
}

/// Whether `nvidia-smi` lists a GPU (the models crate does not depend on
/// client-core, so this asks the tool directly).
fn listed_gpus() -> String {
    std::process::Command::new("nvidia-smi")
        .arg("--list-gpus")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
