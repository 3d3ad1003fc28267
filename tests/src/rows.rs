//! Tabular test data in the layout dataset snapshots use (`input`, f32
//! `[n, 8]`, and `label`, int64): rows of the shape of the rainfall table.

use edgeloop_models::npz::Npz;
use edgeloop_models::Tensor;
use ndarray::{ArrayD, IxDyn};

/// `n` rows of 8 features rising from 0 to 1, labels alternating 0, 1, as
/// npz bytes.
pub fn rows_npz(n: usize) -> Vec<u8> {
    let x = ArrayD::from_shape_vec(
        IxDyn(&[n, 8]),
        (0..n * 8).map(|v| v as f32 / (n * 8) as f32).collect(),
    )
    .unwrap();
    let y = ArrayD::from_shape_vec(IxDyn(&[n]), (0..n as i64).map(|i| i % 2).collect()).unwrap();
    let mut npz = Npz::new();
    npz.insert("input", Tensor::F32(x));
    npz.insert("label", Tensor::I64(y));
    npz.to_bytes().unwrap()
}
