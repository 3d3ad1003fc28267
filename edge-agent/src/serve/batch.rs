//! Joining requests into one batch along dim 0 and splitting the outputs
//! back. Both return `None` instead of failing when the tensors do not fit
//! together, so the caller can fall back to running requests one by one.

use edgeloop_models::tensor::Tensor;
use ndarray::{ArrayD, Axis, Slice};

/// What must agree for two requests to share a batch: per input (in model
/// order), the dimensions after the first. `None` when a request cannot be
/// batched (a scalar input, or inputs with different row counts).
pub type BatchKey = Option<Vec<Vec<usize>>>;

/// The key and row count of a request's inputs (in model order).
pub fn batch_key(inputs: &[(String, Tensor)]) -> (BatchKey, usize) {
    let rows = inputs
        .first()
        .and_then(|(_, t)| t.shape().first().copied())
        .unwrap_or(1);
    let mut key = Vec::with_capacity(inputs.len());
    for (_, t) in inputs {
        match t.shape().split_first() {
            Some((&r, rest)) if r == rows => key.push(rest.to_vec()),
            _ => return (None, rows),
        }
    }
    (Some(key), rows)
}

/// Concatenates same-typed tensors along dim 0.
pub fn concat(parts: &[&Tensor]) -> Option<Tensor> {
    macro_rules! join {
        ($variant:ident) => {{
            let views = parts
                .iter()
                .map(|t| match t {
                    Tensor::$variant(a) => Some(a.view()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            ndarray::concatenate(Axis(0), &views)
                .ok()
                .map(Tensor::$variant)
        }};
    }
    match parts.first()? {
        Tensor::F32(_) => join!(F32),
        Tensor::F64(_) => join!(F64),
        Tensor::F16(_) => join!(F16),
        Tensor::I8(_) => join!(I8),
        Tensor::U8(_) => join!(U8),
        Tensor::I32(_) => join!(I32),
        Tensor::I64(_) => join!(I64),
        Tensor::Bool(_) => join!(Bool),
    }
}

/// Splits a tensor along dim 0 into consecutive pieces of `rows` rows.
pub fn split(tensor: &Tensor, rows: &[usize]) -> Option<Vec<Tensor>> {
    fn pieces<T: Clone>(a: &ArrayD<T>, rows: &[usize]) -> Option<Vec<ArrayD<T>>> {
        if a.ndim() == 0 || a.shape()[0] != rows.iter().sum::<usize>() {
            return None;
        }
        let mut start = 0;
        Some(
            rows.iter()
                .map(|&r| {
                    let piece = a
                        .slice_axis(Axis(0), Slice::from(start..start + r))
                        .to_owned();
                    start += r;
                    piece
                })
                .collect(),
        )
    }
    macro_rules! cut {
        ($variant:ident, $a:expr) => {
            pieces($a, rows).map(|p| p.into_iter().map(Tensor::$variant).collect())
        };
    }
    match tensor {
        Tensor::F32(a) => cut!(F32, a),
        Tensor::F64(a) => cut!(F64, a),
        Tensor::F16(a) => cut!(F16, a),
        Tensor::I8(a) => cut!(I8, a),
        Tensor::U8(a) => cut!(U8, a),
        Tensor::I32(a) => cut!(I32, a),
        Tensor::I64(a) => cut!(I64, a),
        Tensor::Bool(a) => cut!(Bool, a),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn f32s(shape: &[usize], start: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::F32(
            ArrayD::from_shape_vec(shape.to_vec(), (0..n).map(|i| start + i as f32).collect())
                .unwrap(),
        )
    }

    #[test]
    fn concat_then_split_gives_the_parts_back() {
        let a = f32s(&[1, 3], 0.0);
        let b = f32s(&[2, 3], 10.0);
        let joined = concat(&[&a, &b]).unwrap();
        assert_eq!(joined.shape(), &[3, 3]);
        assert_eq!(split(&joined, &[1, 2]).unwrap(), vec![a.clone(), b]);
        assert!(split(&joined, &[1, 1]).is_none(), "rows must add up");
        assert!(
            concat(&[&a, &f32s(&[1, 4], 0.0)]).is_none(),
            "widths differ"
        );
        let i = Tensor::I64(ArrayD::zeros(vec![1, 3]));
        assert!(concat(&[&a, &i]).is_none(), "dtypes differ");
    }

    #[test]
    fn keys_group_requests_that_can_share_a_batch() {
        let named = |t: Tensor| vec![("x".to_string(), t)];
        assert_eq!(
            batch_key(&named(f32s(&[4, 3], 0.0))),
            (Some(vec![vec![3]]), 4)
        );
        let scalar = Tensor::F32(ArrayD::zeros(vec![]));
        assert_eq!(batch_key(&named(scalar)).0, None);
        let ragged = vec![
            ("a".to_string(), f32s(&[2, 3], 0.0)),
            ("b".to_string(), f32s(&[3, 3], 0.0)),
        ];
        assert_eq!(batch_key(&ragged).0, None);
    }
}
