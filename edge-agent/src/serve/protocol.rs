//! The Open Inference Protocol v2 JSON bodies (as KServe and Triton speak
//! them): datatype names, the infer request and response, and the
//! conversion between JSON tensors and [`Tensor`]s.
//!
//! `data` is read straight into one flat list of scalars whatever its
//! nesting, without building a `serde_json::Value` tree first: the infer
//! path parses every request, so this is where its time goes.

use std::fmt;

use edgeloop_models::tensor::{DType, Tensor};
use ndarray::{ArrayD, IxDyn};
use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// The protocol's name for an element type.
pub fn datatype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "FP32",
        DType::F64 => "FP64",
        DType::F16 => "FP16",
        DType::I8 => "INT8",
        DType::U8 => "UINT8",
        DType::I32 => "INT32",
        DType::I64 => "INT64",
        DType::Bool => "BOOL",
    }
}

/// The element type a protocol datatype name stands for, if this agent serves it.
pub fn parse_datatype(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| datatype_name(*d) == name)
}

/// Every datatype name this agent accepts, for error messages.
pub fn supported_datatypes() -> String {
    DType::ALL.map(datatype_name).join(", ")
}

/// `POST /v2/models/{name}/infer`. Unknown fields (`parameters`) are ignored.
#[derive(Debug, Deserialize)]
pub struct InferRequest {
    #[serde(default)]
    pub id: Option<String>,
    pub inputs: Vec<RequestInput>,
    #[serde(default)]
    pub outputs: Option<Vec<RequestOutput>>,
}

#[derive(Debug, Deserialize)]
pub struct RequestInput {
    pub name: String,
    pub shape: Vec<i64>,
    pub datatype: String,
    pub data: FlatData,
}

#[derive(Debug, Deserialize)]
pub struct RequestOutput {
    pub name: String,
}

/// One JSON scalar from a tensor's `data`, kept as JSON gave it so that
/// integers never pass through `f64` (an INT64 beyond 2^53 stays exact).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Float(f64),
    Int(i64),
    UInt(u64),
    Bool(bool),
}

/// A tensor's `data`, flattened in row-major order: `[1, 2, 3, 4]` and
/// `[[1, 2], [3, 4]]` read the same.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlatData(pub Vec<Scalar>);

impl<'de> Deserialize<'de> for FlatData {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut out = Vec::new();
        // The top level must be an array; nested levels may be arrays or scalars.
        deserializer.deserialize_seq(Flatten { out: &mut out })?;
        Ok(FlatData(out))
    }
}

/// Appends every scalar it meets to `out`, descending into arrays
/// (serde_json's recursion limit bounds the depth).
struct Flatten<'a> {
    out: &'a mut Vec<Scalar>,
}

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of numbers or booleans (flat or nested)")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.out.push(Scalar::Bool(v));
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.out.push(Scalar::Int(v));
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.out.push(Scalar::UInt(v));
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.out.push(Scalar::Float(v));
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(Flatten {
                out: &mut *self.out,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// Checks a request shape and returns it as dimensions, with their product.
pub fn checked_shape(shape: &[i64]) -> Result<(Vec<usize>, usize), String> {
    let mut dims = Vec::with_capacity(shape.len());
    let mut count: usize = 1;
    for &d in shape {
        let d =
            usize::try_from(d).map_err(|_| format!("shape {shape:?} has a negative dimension"))?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?} has too many elements"))?;
        dims.push(d);
    }
    Ok((dims, count))
}

/// Builds a tensor of `dtype` and `shape` from JSON scalars, refusing values
/// the element type cannot hold (3.5 or 300 for UINT8, `true` for FP32).
pub fn to_tensor(dtype: DType, shape: Vec<usize>, data: &[Scalar]) -> Result<Tensor, String> {
    fn build<T>(
        shape: Vec<usize>,
        data: &[Scalar],
        what: &str,
        convert: impl Fn(Scalar) -> Option<T>,
    ) -> Result<ArrayD<T>, String> {
        let values = data
            .iter()
            .enumerate()
            .map(|(i, v)| {
                convert(*v).ok_or_else(|| format!("data[{i}] = {} is not {what}", show(*v)))
            })
            .collect::<Result<Vec<T>, String>>()?;
        ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|e| e.to_string())
    }
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: Scalar) -> Option<T> {
        match v {
            Scalar::Int(i) => T::try_from(i).ok(),
            Scalar::UInt(u) => T::try_from(u).ok(),
            // 2.0 is an integer written as a float; 2.5 is not.
            Scalar::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => T::try_from(f as i64).ok(),
            _ => None,
        }
    }
    fn float(v: Scalar) -> Option<f64> {
        match v {
            Scalar::Float(f) => Some(f),
            Scalar::Int(i) => Some(i as f64),
            Scalar::UInt(u) => Some(u as f64),
            Scalar::Bool(_) => None,
        }
    }
    Ok(match dtype {
        DType::F32 => Tensor::F32(build(shape, data, "a number", |v| {
            float(v).map(|f| f as f32)
        })?),
        DType::F64 => Tensor::F64(build(shape, data, "a number", float)?),
        DType::F16 => Tensor::F16(build(shape, data, "a number", |v| {
            float(v).map(half::f16::from_f64)
        })?),
        DType::I8 => Tensor::I8(build(shape, data, "an INT8", int)?),
        DType::U8 => Tensor::U8(build(shape, data, "a UINT8", int)?),
        DType::I32 => Tensor::I32(build(shape, data, "an INT32", int)?),
        DType::I64 => Tensor::I64(build(shape, data, "an INT64", int)?),
        DType::Bool => Tensor::Bool(build(shape, data, "a boolean", |v| match v {
            Scalar::Bool(b) => Some(b),
            _ => None,
        })?),
    })
}

fn show(v: Scalar) -> String {
    match v {
        Scalar::Float(f) => f.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::UInt(u) => u.to_string(),
        Scalar::Bool(b) => b.to_string(),
    }
}

/// The infer response, borrowed from the results so nothing is copied
/// before serialisation.
#[derive(Debug, Serialize)]
pub struct InferResponse<'a> {
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub id: &'a str,
    pub outputs: Vec<ResponseOutput<'a>>,
}

#[derive(Debug, Serialize)]
pub struct ResponseOutput<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
    pub datatype: &'static str,
    pub data: TensorData<'a>,
}

impl<'a> ResponseOutput<'a> {
    pub fn new(name: &'a str, tensor: &'a Tensor) -> Self {
        ResponseOutput {
            name,
            shape: tensor.shape(),
            datatype: datatype_name(tensor.dtype()),
            data: TensorData(tensor),
        }
    }
}

/// A tensor's elements as a flat JSON array in row-major order. FP16 is
/// written as the f32 it widens to exactly; NaN and infinities become `null`
/// (JSON has no spelling for them).
#[derive(Debug)]
pub struct TensorData<'a>(pub &'a Tensor);

impl Serialize for TensorData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        fn seq<S: Serializer, T: Serialize>(
            s: S,
            len: usize,
            items: impl Iterator<Item = T>,
        ) -> Result<S::Ok, S::Error> {
            let mut out = s.serialize_seq(Some(len))?;
            for item in items {
                out.serialize_element(&item)?;
            }
            out.end()
        }
        let len = self.0.len();
        match self.0 {
            Tensor::F32(a) => seq(s, len, a.iter()),
            Tensor::F64(a) => seq(s, len, a.iter()),
            Tensor::F16(a) => seq(s, len, a.iter().map(|v| v.to_f32())),
            Tensor::I8(a) => seq(s, len, a.iter()),
            Tensor::U8(a) => seq(s, len, a.iter()),
            Tensor::I32(a) => seq(s, len, a.iter()),
            Tensor::I64(a) => seq(s, len, a.iter()),
            Tensor::Bool(a) => seq(s, len, a.iter()),
        }
    }
}

/// A tensor's description in model metadata: -1 for a dynamic dimension.
#[derive(Debug, Serialize)]
pub struct MetadataTensor {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

/// `GET /v2/models/{name}`.
#[derive(Debug, Serialize)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: &'static str,
    pub inputs: Vec<MetadataTensor>,
    pub outputs: Vec<MetadataTensor>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn datatype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(parse_datatype(datatype_name(d)), Some(d));
        }
        assert_eq!(parse_datatype("BYTES"), None);
        assert_eq!(parse_datatype("fp32"), None, "names are case sensitive");
    }

    #[test]
    fn nested_and_flat_data_read_the_same() {
        let flat: FlatData = serde_json::from_str("[1, 2.5, 3, 4]").unwrap();
        let nested: FlatData = serde_json::from_str("[[1, 2.5], [3, [4]]]").unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.0[1], Scalar::Float(2.5));
        assert!(
            serde_json::from_str::<FlatData>("3").is_err(),
            "not an array"
        );
        assert!(serde_json::from_str::<FlatData>("[\"a\"]").is_err());
        assert!(serde_json::from_str::<FlatData>("[{}]").is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(
            serde_json::from_str::<FlatData>(&deep).is_err(),
            "depth is bounded"
        );
    }

    #[test]
    fn conversion_refuses_what_the_dtype_cannot_hold() {
        let data = |s: &str| serde_json::from_str::<FlatData>(s).unwrap().0;
        let t = to_tensor(DType::I64, vec![2], &data("[9007199254740993, 2.0]")).unwrap();
        assert_eq!(
            t,
            Tensor::I64(ArrayD::from_shape_vec(vec![2], vec![9007199254740993, 2]).unwrap())
        );
        let cases = [
            (DType::U8, "[300]", "data[0] = 300"),
            (DType::I32, "[2.5]", "not an INT32"),
            (DType::F32, "[true]", "not a number"),
            (DType::Bool, "[1]", "not a boolean"),
        ];
        for (dtype, json, want) in cases {
            let err = to_tensor(dtype, vec![1], &data(json)).unwrap_err();
            assert!(err.contains(want), "{dtype}: {err}");
        }
        assert_eq!(checked_shape(&[2, 3]).unwrap(), (vec![2, 3], 6));
        assert!(checked_shape(&[-1, 3]).is_err());
        assert!(checked_shape(&[i64::MAX, i64::MAX]).is_err());
    }

    #[test]
    fn response_data_is_flat_row_major() {
        let t = Tensor::F32(ArrayD::from_shape_vec(vec![2, 2], vec![1.0, 2.0, 3.0, 0.5]).unwrap());
        let json = serde_json::to_string(&ResponseOutput::new("y", &t)).unwrap();
        assert_eq!(
            json,
            r#"{"name":"y","shape":[2,2],"datatype":"FP32","data":[1.0,2.0,3.0,0.5]}"#
        );
    }
}
