//! One request row's inputs as upload-ready bytes: the wire form of a
//! sample (dtype name, shape with a leading 1, row-major little-endian data),
//! so that a kept sample costs one copy and nothing more on the way out.

use edgeloop_models::tensor::Tensor;
use edgeloop_proto::agent::v1 as pb;
use ndarray::{ArrayViewD, Axis};

fn le_bytes<T>(view: ArrayViewD<'_, T>, width: usize, f: impl Fn(&T, &mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(view.len() * width);
    view.iter().for_each(|v| f(v, &mut out));
    out
}

/// Row `row` of `tensor` (whose leading dimension is the batch), keeping a
/// leading dimension of 1. `None` when the tensor has no such row.
pub fn encode_row(name: &str, tensor: &Tensor, row: usize) -> Option<pb::SampleTensor> {
    let shape = tensor.shape();
    if shape.first().is_none_or(|&n| row >= n) {
        return None;
    }
    let mut row_shape = vec![1u64];
    row_shape.extend(shape[1..].iter().map(|&d| d as u64));
    let width = tensor.dtype().size_bytes();
    let data = match tensor {
        Tensor::F32(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.extend_from_slice(&v.to_le_bytes())
        }),
        Tensor::F64(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.extend_from_slice(&v.to_le_bytes())
        }),
        Tensor::F16(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.extend_from_slice(&v.to_bits().to_le_bytes())
        }),
        Tensor::I8(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.extend_from_slice(&v.to_le_bytes())
        }),
        Tensor::U8(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| o.push(*v)),
        Tensor::I32(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.extend_from_slice(&v.to_le_bytes())
        }),
        Tensor::I64(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.extend_from_slice(&v.to_le_bytes())
        }),
        Tensor::Bool(a) => le_bytes(a.index_axis(Axis(0), row), width, |v, o| {
            o.push(u8::from(*v))
        }),
    };
    Some(pb::SampleTensor {
        name: name.to_string(),
        dtype: tensor.dtype().numpy_name().to_string(),
        shape: row_shape,
        data,
    })
}

/// Every input's row `row`, or `None` when any input lacks it or the row is
/// over `max_bytes` (such a sample is not kept at all: half an input is
/// useless for retraining).
pub fn encode_inputs(
    inputs: &[(String, Tensor)],
    row: usize,
    max_bytes: usize,
) -> Option<Vec<pb::SampleTensor>> {
    let row_bytes: usize = inputs
        .iter()
        .map(|(_, t)| {
            let rows = t.shape().first().copied().unwrap_or(0).max(1);
            (t.len() / rows) * t.dtype().size_bytes()
        })
        .sum();
    if row_bytes > max_bytes {
        return None;
    }
    inputs
        .iter()
        .map(|(name, t)| encode_row(name, t, row))
        .collect()
}

/// The bytes a sample's inputs hold (for budgets).
pub fn inputs_bytes(inputs: &[pb::SampleTensor]) -> usize {
    inputs
        .iter()
        .map(|t| t.data.len() + t.name.len() + 16)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    #[test]
    fn rows_are_little_endian_with_a_leading_one() {
        let t =
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.0, 2.0, 3.0, -0.5]).unwrap());
        let r = encode_row("x", &t, 1).unwrap();
        assert_eq!((r.dtype.as_str(), r.shape.clone()), ("float32", vec![1, 2]));
        let mut want = 3.0f32.to_le_bytes().to_vec();
        want.extend_from_slice(&(-0.5f32).to_le_bytes());
        assert_eq!(r.data, want);
        assert!(encode_row("x", &t, 2).is_none());

        let h = Tensor::F16(ArrayD::from_elem(IxDyn(&[1, 1]), half::f16::from_f32(1.0)));
        assert_eq!(encode_row("h", &h, 0).unwrap().data, vec![0x00, 0x3c]);
        let b = Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![true, false]).unwrap());
        assert_eq!(encode_row("b", &b, 0).unwrap().data, vec![1, 0]);
        let i = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1]), vec![-2]).unwrap());
        let r = encode_row("i", &i, 0).unwrap();
        assert_eq!((r.shape, r.data), (vec![1], (-2i64).to_le_bytes().to_vec()));
    }

    #[test]
    fn inputs_over_the_budget_are_not_kept() {
        let inputs = vec![("x".to_string(), Tensor::F32(ArrayD::zeros(IxDyn(&[4, 8]))))];
        assert_eq!(encode_inputs(&inputs, 3, 32).unwrap()[0].data.len(), 32);
        assert!(encode_inputs(&inputs, 3, 31).is_none());
    }
}
