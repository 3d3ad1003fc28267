//! The HTTP binary tensor data extension of the Open Inference Protocol, as
//! Triton defines it and `tritonclient` uses by default: a body is a JSON
//! header of `Inference-Header-Content-Length` bytes followed by the
//! tensors' raw bytes (little-endian, row-major), in the order of the
//! inputs (or outputs) whose `parameters.binary_data_size` says how many
//! bytes are theirs. JSON and binary tensors may be mixed in one body.
//!
//! Everything here reads untrusted bytes: sizes are checked against the
//! body and the shape before anything is allocated, and nothing panics.

use edgeloop_models::tensor::{DType, Tensor};
use ndarray::{ArrayD, IxDyn};

/// The header that marks a body as JSON header + binary data.
pub const HEADER: &str = "inference-header-content-length";

/// Splits a body into its JSON header and binary part. `header_len` is the
/// request's `Inference-Header-Content-Length`, or `None` for a JSON body.
pub fn split<'a>(body: &'a [u8], header_len: Option<&str>) -> Result<(&'a [u8], &'a [u8]), String> {
    let Some(raw) = header_len else {
        return Ok((body, &[]));
    };
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| format!("Inference-Header-Content-Length {raw:?} is not a byte count"))?;
    if n > body.len() {
        return Err(format!(
            "Inference-Header-Content-Length {n} is more than the body's {} bytes",
            body.len()
        ));
    }
    Ok(body.split_at(n))
}

/// Bytes one element of `dtype` takes on the wire.
pub fn element_size(dtype: DType) -> usize {
    match dtype {
        DType::F64 | DType::I64 => 8,
        DType::F32 | DType::I32 => 4,
        DType::F16 => 2,
        DType::I8 | DType::U8 | DType::Bool => 1,
    }
}

/// Hands out the binary part's bytes, input by input.
pub struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(binary: &'a [u8]) -> Self {
        Cursor { rest: binary }
    }

    /// The next `n` bytes, or why not.
    pub fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.rest.len())
            .ok_or_else(|| {
                format!(
                    "binary_data_size {n} is more than the {} bytes of binary data left",
                    self.rest.len()
                )
            })?;
        let (mine, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(mine)
    }

    /// Bytes no input claimed: a client and server that disagree on sizes.
    pub fn finish(self) -> Result<(), String> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} bytes of binary data are not claimed by any input's binary_data_size",
                self.rest.len()
            ))
        }
    }
}

/// A tensor from its little-endian bytes; the byte count must be exactly
/// the shape's elements times the element size.
pub fn to_tensor(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, String> {
    let size = element_size(dtype);
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("the shape's element count overflows")?;
    if count.checked_mul(size) != Some(bytes.len()) {
        return Err(format!(
            "shape {shape:?} of {} needs {} bytes, binary_data_size gives {}",
            super::protocol::datatype_name(dtype),
            count.saturating_mul(size),
            bytes.len()
        ));
    }
    fn array<T, const N: usize>(
        shape: Vec<usize>,
        bytes: &[u8],
        f: impl Fn([u8; N]) -> T,
    ) -> Result<ArrayD<T>, String> {
        let values = bytes
            .chunks_exact(N)
            .map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                f(b)
            })
            .collect();
        ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|e| e.to_string())
    }
    Ok(match dtype {
        DType::F32 => Tensor::F32(array(shape, bytes, f32::from_le_bytes)?),
        DType::F64 => Tensor::F64(array(shape, bytes, f64::from_le_bytes)?),
        DType::F16 => Tensor::F16(array(shape, bytes, half::f16::from_le_bytes)?),
        DType::I8 => Tensor::I8(array(shape, bytes, i8::from_le_bytes)?),
        DType::U8 => Tensor::U8(array(shape, bytes, u8::from_le_bytes)?),
        DType::I32 => Tensor::I32(array(shape, bytes, i32::from_le_bytes)?),
        DType::I64 => Tensor::I64(array(shape, bytes, i64::from_le_bytes)?),
        DType::Bool => {
            // Triton's BOOL is one byte, 0 or 1; anything else is not a bool.
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(format!("BOOL element {i} is byte {}, not 0 or 1", bytes[i]));
            }
            Tensor::Bool(array(shape, bytes, |[b]: [u8; 1]| b == 1)?)
        }
    })
}

/// A tensor's little-endian bytes, row-major.
pub fn to_bytes(tensor: &Tensor) -> Vec<u8> {
    fn flat<T: Copy, const N: usize>(a: &ArrayD<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        let mut out = Vec::with_capacity(a.len() * N);
        for &v in a.iter() {
            out.extend_from_slice(&f(v));
        }
        out
    }
    match tensor {
        Tensor::F32(a) => flat(a, f32::to_le_bytes),
        Tensor::F64(a) => flat(a, f64::to_le_bytes),
        Tensor::F16(a) => flat(a, half::f16::to_le_bytes),
        Tensor::I8(a) => flat(a, i8::to_le_bytes),
        Tensor::U8(a) => flat(a, u8::to_le_bytes),
        Tensor::I32(a) => flat(a, i32::to_le_bytes),
        Tensor::I64(a) => flat(a, i64::to_le_bytes),
        Tensor::Bool(a) => flat(a, |b: bool| [u8::from(b)]),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_body_splits_at_the_header_length() {
        let body = b"{\"a\":1}\x01\x02";
        assert_eq!(split(body, Some("7")).unwrap(), (&body[..7], &body[7..]));
        assert_eq!(split(body, None).unwrap(), (&body[..], &b""[..]));
        assert!(split(body, Some("10"))
            .unwrap_err()
            .contains("more than the body"));
        assert!(split(body, Some("-1"))
            .unwrap_err()
            .contains("not a byte count"));
    }

    #[test]
    fn every_dtype_round_trips_through_its_bytes() {
        let tensors = [
            Tensor::F32(
                ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.5, -2.0, 0.0, 3.25]).unwrap(),
            ),
            Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[1]), vec![1e300]).unwrap()),
            Tensor::F16(
                ArrayD::from_shape_vec(IxDyn(&[2]), vec![half::f16::ONE, half::f16::MAX]).unwrap(),
            ),
            Tensor::I8(ArrayD::from_shape_vec(IxDyn(&[2]), vec![-128, 127]).unwrap()),
            Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1]), vec![255]).unwrap()),
            Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[1]), vec![i32::MIN]).unwrap()),
            Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[2]), vec![i64::MAX, -1]).unwrap()),
            Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[3]), vec![true, false, true]).unwrap()),
        ];
        for t in tensors {
            let bytes = to_bytes(&t);
            let back = to_tensor(t.dtype(), t.shape().to_vec(), &bytes).unwrap();
            assert_eq!(back, t);
        }
    }

    #[test]
    fn sizes_that_disagree_are_refused() {
        let err = to_tensor(DType::F32, vec![2, 2], &[0; 15]).unwrap_err();
        assert!(
            err.contains("needs 16 bytes, binary_data_size gives 15"),
            "{err}"
        );
        let err = to_tensor(DType::Bool, vec![1], &[2]).unwrap_err();
        assert!(err.contains("not 0 or 1"), "{err}");
        let err = to_tensor(DType::U8, vec![usize::MAX, 2], &[]).unwrap_err();
        assert!(err.contains("overflows"), "{err}");
        let mut c = Cursor::new(&[1, 2, 3]);
        assert_eq!(c.take(2).unwrap(), &[1, 2]);
        assert!(c
            .take(2)
            .unwrap_err()
            .contains("1 bytes of binary data left"));
        assert!(Cursor::new(&[1])
            .finish()
            .unwrap_err()
            .contains("not claimed"));
    }

    proptest::proptest! {
        #[test]
        fn untrusted_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            dims in proptest::collection::vec(0usize..9, 0..4),
            header in ".{0,12}",
        ) {
            for dtype in DType::ALL {
                let _ = to_tensor(dtype, dims.clone(), &bytes);
            }
            let _ = split(&bytes, Some(&header));
            let mut c = Cursor::new(&bytes);
            let _ = c.take(dims.iter().sum::<usize>() as u64);
            let _ = c.finish();
        }
    }
}
