//! `TensorProto` <-> [`Tensor`]. Reading checks the declared element count
//! against the bytes present before allocating, and reads external data only
//! from inside the model's directory.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use ndarray::{ArrayD, IxDyn};

use super::ir;
use crate::tensor::{DType, Tensor};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorError {
    #[error("tensor {tensor:?}: element type {code} is not supported here")]
    UnsupportedType { tensor: String, code: i32 },
    #[error("tensor {tensor:?}: invalid dims {dims:?}")]
    BadDims { tensor: String, dims: Vec<i64> },
    #[error("tensor {tensor:?}: dims declare {declared} elements but the data holds {actual}")]
    DataMismatch {
        tensor: String,
        declared: u64,
        actual: u64,
    },
    #[error("tensor {tensor:?}: external data {reason}")]
    External { tensor: String, reason: String },
}

/// Element count of `dims`, or None if a dim is negative or the product overflows.
pub(crate) fn element_count(dims: &[i64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// The external-data entries of a tensor, checked: a relative path that
/// stays inside the model directory, and numeric offset/length.
pub(crate) struct ExternalRef {
    pub location: PathBuf,
    pub offset: u64,
    pub length: Option<u64>,
}

pub(crate) fn external_ref(t: &ir::TensorProto) -> Result<Option<ExternalRef>, TensorError> {
    let is_external =
        t.data_location.map(|l| l.value()) == Some(ir::tensor_proto::DataLocation::EXTERNAL as i32);
    if !is_external {
        return Ok(None);
    }
    let err = |reason: String| TensorError::External {
        tensor: t.name().to_string(),
        reason,
    };
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &t.external_data {
        match kv.key() {
            "location" => location = Some(kv.value().to_string()),
            "offset" => {
                offset = kv
                    .value()
                    .parse()
                    .map_err(|_| err(format!("offset {:?} is not a number", kv.value())))?
            }
            "length" => {
                length = Some(
                    kv.value()
                        .parse()
                        .map_err(|_| err(format!("length {:?} is not a number", kv.value())))?,
                )
            }
            _ => {}
        }
    }
    let location = location.ok_or_else(|| err("has no location".into()))?;
    let path = PathBuf::from(&location);
    // Only plain relative paths: no root, no "..", nothing that could leave the model directory.
    let plain = !location.is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !plain {
        return Err(err(format!(
            "location {location:?} escapes the model directory"
        )));
    }
    Ok(Some(ExternalRef {
        location: path,
        offset,
        length,
    }))
}

/// The bytes a tensor's values take (element count × element size), when
/// its dims and element type are known.
pub(crate) fn declared_bytes(t: &ir::TensorProto) -> Option<u64> {
    let dtype = DType::from_onnx_code(t.data_type())?;
    element_count(&t.dims)?.checked_mul(dtype.size_bytes() as u64)
}

fn dims_of(t: &ir::TensorProto) -> Result<Vec<usize>, TensorError> {
    let bad = || TensorError::BadDims {
        tensor: t.name().to_string(),
        dims: t.dims.clone(),
    };
    element_count(&t.dims).ok_or_else(bad)?;
    t.dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad()))
        .collect()
}

fn raw_bytes(
    t: &ir::TensorProto,
    model_dir: Option<&Path>,
    declared_bytes: u64,
) -> Result<Option<Vec<u8>>, TensorError> {
    if let Some(ext) = external_ref(t)? {
        let err = |reason: String| TensorError::External {
            tensor: t.name().to_string(),
            reason,
        };
        let dir = model_dir.ok_or_else(|| err("needs the model's directory to be read".into()))?;
        let path = dir.join(&ext.location);
        let mut f =
            std::fs::File::open(&path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        let file_len = f.metadata().map_err(|e| err(e.to_string()))?.len();
        let length = ext.length.unwrap_or(declared_bytes);
        if length != declared_bytes {
            return Err(TensorError::DataMismatch {
                tensor: t.name().to_string(),
                declared: declared_bytes,
                actual: length,
            });
        }
        let end = ext
            .offset
            .checked_add(length)
            .ok_or_else(|| err("offset + length overflows".into()))?;
        if end > file_len {
            return Err(err(format!(
                "needs bytes {}..{end} but {} holds {file_len}",
                ext.offset,
                path.display()
            )));
        }
        f.seek(SeekFrom::Start(ext.offset))
            .map_err(|e| err(e.to_string()))?;
        // Safe to allocate now: the length was checked against the file.
        let mut buf = vec![0u8; length as usize];
        f.read_exact(&mut buf).map_err(|e| err(e.to_string()))?;
        return Ok(Some(buf));
    }
    Ok(t.raw_data.clone())
}

fn from_le<T, const N: usize>(raw: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    raw.chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; N];
            b.copy_from_slice(c);
            f(b)
        })
        .collect()
}

/// Reads a tensor's values. `model_dir` is needed only for external data.
pub fn to_tensor(t: &ir::TensorProto, model_dir: Option<&Path>) -> Result<Tensor, TensorError> {
    let name = t.name().to_string();
    let dtype = DType::from_onnx_code(t.data_type()).ok_or(TensorError::UnsupportedType {
        tensor: name.clone(),
        code: t.data_type(),
    })?;
    let shape = dims_of(t)?;
    let count = element_count(&t.dims).unwrap_or(0);
    let declared_bytes = count.saturating_mul(dtype.size_bytes() as u64);
    let mismatch = |actual: u64| TensorError::DataMismatch {
        tensor: name.clone(),
        declared: count,
        actual,
    };
    let raw = raw_bytes(t, model_dir, declared_bytes)?;
    if let Some(raw) = &raw {
        if raw.len() as u64 != declared_bytes {
            return Err(mismatch(raw.len() as u64 / dtype.size_bytes() as u64));
        }
    }
    let ix = IxDyn(&shape);
    // Typed fields: counts are checked by ArrayD::from_shape_vec below.
    let shaped = |len: usize| {
        if len as u64 == count {
            Ok(())
        } else {
            Err(mismatch(len as u64))
        }
    };
    let tensor = match (dtype, raw) {
        (DType::F32, Some(r)) => Tensor::F32(
            ArrayD::from_shape_vec(ix, from_le(&r, f32::from_le_bytes)).map_err(|_| mismatch(0))?,
        ),
        (DType::F32, None) => {
            shaped(t.float_data.len())?;
            Tensor::F32(ArrayD::from_shape_vec(ix, t.float_data.clone()).map_err(|_| mismatch(0))?)
        }
        (DType::F64, Some(r)) => Tensor::F64(
            ArrayD::from_shape_vec(ix, from_le(&r, f64::from_le_bytes)).map_err(|_| mismatch(0))?,
        ),
        (DType::F64, None) => {
            shaped(t.double_data.len())?;
            Tensor::F64(ArrayD::from_shape_vec(ix, t.double_data.clone()).map_err(|_| mismatch(0))?)
        }
        (DType::I64, Some(r)) => Tensor::I64(
            ArrayD::from_shape_vec(ix, from_le(&r, i64::from_le_bytes)).map_err(|_| mismatch(0))?,
        ),
        (DType::I64, None) => {
            shaped(t.int64_data.len())?;
            Tensor::I64(ArrayD::from_shape_vec(ix, t.int64_data.clone()).map_err(|_| mismatch(0))?)
        }
        (DType::I32, Some(r)) => Tensor::I32(
            ArrayD::from_shape_vec(ix, from_le(&r, i32::from_le_bytes)).map_err(|_| mismatch(0))?,
        ),
        (DType::I32, None) => {
            shaped(t.int32_data.len())?;
            Tensor::I32(ArrayD::from_shape_vec(ix, t.int32_data.clone()).map_err(|_| mismatch(0))?)
        }
        // Small types are stored one per int32 in the typed field.
        (DType::I8, Some(r)) => Tensor::I8(
            ArrayD::from_shape_vec(ix, r.iter().map(|&b| b as i8).collect())
                .map_err(|_| mismatch(0))?,
        ),
        (DType::I8, None) => {
            shaped(t.int32_data.len())?;
            Tensor::I8(
                ArrayD::from_shape_vec(ix, t.int32_data.iter().map(|&v| v as i8).collect())
                    .map_err(|_| mismatch(0))?,
            )
        }
        (DType::U8, Some(r)) => Tensor::U8(ArrayD::from_shape_vec(ix, r).map_err(|_| mismatch(0))?),
        (DType::U8, None) => {
            shaped(t.int32_data.len())?;
            Tensor::U8(
                ArrayD::from_shape_vec(ix, t.int32_data.iter().map(|&v| v as u8).collect())
                    .map_err(|_| mismatch(0))?,
            )
        }
        (DType::Bool, Some(r)) => Tensor::Bool(
            ArrayD::from_shape_vec(ix, r.iter().map(|&b| b != 0).collect())
                .map_err(|_| mismatch(0))?,
        ),
        (DType::Bool, None) => {
            shaped(t.int32_data.len())?;
            Tensor::Bool(
                ArrayD::from_shape_vec(ix, t.int32_data.iter().map(|&v| v != 0).collect())
                    .map_err(|_| mismatch(0))?,
            )
        }
        (DType::F16, Some(r)) => Tensor::F16(
            ArrayD::from_shape_vec(
                ix,
                from_le(&r, |b: [u8; 2]| half::f16::from_bits(u16::from_le_bytes(b))),
            )
            .map_err(|_| mismatch(0))?,
        ),
        (DType::F16, None) => {
            shaped(t.int32_data.len())?;
            Tensor::F16(
                ArrayD::from_shape_vec(
                    ix,
                    t.int32_data
                        .iter()
                        .map(|&v| half::f16::from_bits(v as u16))
                        .collect(),
                )
                .map_err(|_| mismatch(0))?,
            )
        }
    };
    Ok(tensor)
}

/// Builds a `TensorProto` named `name` holding `t` as little-endian raw data.
pub fn from_tensor(name: &str, t: &Tensor) -> ir::TensorProto {
    let mut p = ir::TensorProto::new();
    p.set_name(name.to_string());
    p.set_data_type(t.dtype().onnx_code());
    p.dims = t.shape().iter().map(|&d| d as i64).collect();
    // iter() walks in logical (C) order whatever the memory layout.
    let raw: Vec<u8> = match t {
        Tensor::F32(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Tensor::F64(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Tensor::F16(a) => a.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
        Tensor::I8(a) => a.iter().map(|&v| v as u8).collect(),
        Tensor::U8(a) => a.iter().copied().collect(),
        Tensor::I32(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Tensor::I64(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Tensor::Bool(a) => a.iter().map(|&v| u8::from(v)).collect(),
    };
    p.set_raw_data(raw);
    p
}

/// Reads every external-data initializer into the model itself, so the model
/// can be transformed in memory. Paths, lengths and element types are
/// checked as in [`to_tensor`]. The bytes are moved in as they are (raw
/// little-endian, ONNX's layout for both): no per-element conversion, which
/// for a 2 GB weight is most of the cost. A model over 2 GiB stays over it:
/// run it from a file ([`super::save_with_external_data`]).
pub fn internalize_external_data(
    model: &mut ir::ModelProto,
    model_dir: &Path,
) -> Result<usize, TensorError> {
    let mut count = 0;
    let Some(graph) = model.graph.as_mut() else {
        return Ok(0);
    };
    for t in graph.initializer.iter_mut() {
        if external_ref(t)?.is_none() {
            continue;
        }
        let dtype = DType::from_onnx_code(t.data_type()).ok_or(TensorError::UnsupportedType {
            tensor: t.name().to_string(),
            code: t.data_type(),
        })?;
        dims_of(t)?;
        let declared = element_count(&t.dims)
            .unwrap_or(0)
            .saturating_mul(dtype.size_bytes() as u64);
        // raw_bytes checks the declared length against the file before it
        // allocates, and reads exactly that many bytes.
        let raw = raw_bytes(t, Some(model_dir), declared)?.unwrap_or_default();
        t.external_data.clear();
        t.data_location = None;
        t.set_raw_data(raw);
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        let shape = IxDyn(&[2, 3]);
        let cases = vec![
            Tensor::F32(
                ArrayD::from_shape_vec(shape.clone(), vec![1.5, -2.0, 0.0, 3.25, 1e-3, -7.0])
                    .unwrap(),
            ),
            Tensor::F64(
                ArrayD::from_shape_vec(shape.clone(), vec![1.5, -2.0, 0.0, 3.25, 1e-3, -7.0])
                    .unwrap(),
            ),
            Tensor::F16(
                ArrayD::from_shape_vec(
                    shape.clone(),
                    [1.5f32, -2.0, 0.0, 3.25, 0.5, -7.0]
                        .map(half::f16::from_f32)
                        .to_vec(),
                )
                .unwrap(),
            ),
            Tensor::I8(
                ArrayD::from_shape_vec(shape.clone(), vec![-128, -1, 0, 1, 2, 127]).unwrap(),
            ),
            Tensor::U8(ArrayD::from_shape_vec(shape.clone(), vec![0, 1, 2, 3, 254, 255]).unwrap()),
            Tensor::I32(
                ArrayD::from_shape_vec(shape.clone(), vec![i32::MIN, -1, 0, 1, 2, i32::MAX])
                    .unwrap(),
            ),
            Tensor::I64(
                ArrayD::from_shape_vec(shape.clone(), vec![i64::MIN, -1, 0, 1, 2, i64::MAX])
                    .unwrap(),
            ),
            Tensor::Bool(
                ArrayD::from_shape_vec(shape.clone(), vec![true, false, true, true, false, false])
                    .unwrap(),
            ),
        ];
        for t in cases {
            let p = from_tensor("w", &t);
            assert_eq!(to_tensor(&p, None).unwrap(), t);
        }
    }

    #[test]
    fn typed_fields_are_read() {
        let mut p = ir::TensorProto::new();
        p.set_data_type(1);
        p.dims = vec![2];
        p.float_data = vec![1.0, 2.0];
        assert_eq!(
            to_tensor(&p, None).unwrap(),
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0, 2.0]).unwrap())
        );
        p.float_data.push(3.0);
        assert!(matches!(
            to_tensor(&p, None),
            Err(TensorError::DataMismatch { .. })
        ));
    }

    #[test]
    fn huge_declared_dims_are_refused_without_allocating() {
        let mut p = ir::TensorProto::new();
        p.set_name("bomb".into());
        p.set_data_type(1);
        p.dims = vec![1 << 30, 1 << 30];
        p.set_raw_data(vec![0; 16]);
        assert!(matches!(
            to_tensor(&p, None),
            Err(TensorError::DataMismatch { .. })
        ));
        p.dims = vec![i64::MAX, i64::MAX];
        assert!(matches!(
            to_tensor(&p, None),
            Err(TensorError::BadDims { .. })
        ));
        p.dims = vec![-1];
        assert!(matches!(
            to_tensor(&p, None),
            Err(TensorError::BadDims { .. })
        ));
    }

    #[test]
    fn external_data_is_read_from_inside_the_model_dir_only() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<u8> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut file = vec![0u8; 8];
        file.extend_from_slice(&values);
        std::fs::write(dir.path().join("weights.bin"), &file).unwrap();
        let kv = |k: &str, v: &str| {
            let mut e = ir::StringStringEntryProto::new();
            e.set_key(k.into());
            e.set_value(v.into());
            e
        };
        let mut p = ir::TensorProto::new();
        p.set_name("w".into());
        p.set_data_type(1);
        p.dims = vec![3];
        p.set_data_location(ir::tensor_proto::DataLocation::EXTERNAL);
        p.external_data = vec![
            kv("location", "weights.bin"),
            kv("offset", "8"),
            kv("length", "12"),
        ];
        assert_eq!(
            to_tensor(&p, Some(dir.path())).unwrap(),
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[3]), vec![1.0, 2.0, 3.0]).unwrap())
        );
        for escape in ["../weights.bin", "/etc/passwd", "a/../../x", ""] {
            p.external_data[0] = kv("location", escape);
            assert!(
                matches!(
                    to_tensor(&p, Some(dir.path())),
                    Err(TensorError::External { .. })
                ),
                "{escape}"
            );
        }
        p.external_data = vec![
            kv("location", "weights.bin"),
            kv("offset", "16"),
            kv("length", "12"),
        ];
        assert!(
            matches!(
                to_tensor(&p, Some(dir.path())),
                Err(TensorError::External { .. })
            ),
            "past the end"
        );
    }
}
