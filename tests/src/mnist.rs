//! The MNIST models and eval digits that `scripts/fetch-mnist-models.sh`
//! puts in the deps dir, for tests that serve a real model.

use std::path::PathBuf;

use edgeloop_models::npz::Npz;
use edgeloop_models::tensor::Tensor;

pub fn mnist_dir() -> PathBuf {
    let dir = edgeloop_models::deps::dir().unwrap().join("mnist-models");
    assert!(
        dir.join("mlp.onnx").exists(),
        "{}: run scripts/fetch-mnist-models.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// The first `n` eval digits, `[n, 784]`.
pub fn digits(n: usize) -> ndarray::ArrayD<f32> {
    let npz = Npz::read(&mnist_dir().join("eval_mlp.npz")).unwrap();
    let Tensor::F32(all) = npz.require("input").unwrap() else {
        panic!("eval input is f32")
    };
    all.slice_axis(ndarray::Axis(0), ndarray::Slice::from(0..n))
        .to_owned()
}

/// The first `n` eval digits as a health probe's inputs: an `.npz` with
/// `input`, `[n, 784]`.
pub fn probe_npz(n: usize) -> Vec<u8> {
    let mut probe = Npz::new();
    probe.insert("input", Tensor::F32(digits(n)));
    probe.to_bytes().unwrap()
}
