//! The Open Inference Protocol v2 JSON bodies (as KServe and Triton speak
//! them): datatype names, the infer request and response, and the
//! conversion between JSON tensors and [`Tensor`]s.
//!
//! A tensor's `data` is kept as raw JSON text while the request is parsed
//! (its `datatype` may come after it) and then read in one pass straight
//! into the typed array, whatever its nesting: number parsing is most of
//! the infer path's CPU time, so each number is parsed once, by the
//! standard library, into its final type.

use edgeloop_models::tensor::{DType, Tensor};
use ndarray::{ArrayD, IxDyn};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The server metadata's `name` and `version` (REST `GET /v2`, gRPC
/// `ServerMetadata`).
pub const SERVER_NAME: &str = "edgeloop-edge-agent";
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

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

/// `POST /v2/models/{name}/infer`, borrowing from the body. Unknown fields
/// and parameters are ignored.
#[derive(Debug, Deserialize)]
pub struct InferRequest<'a> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(borrow)]
    pub inputs: Vec<RequestInput<'a>>,
    #[serde(default)]
    pub outputs: Option<Vec<RequestOutput>>,
    #[serde(default)]
    pub parameters: RequestParameters,
}

/// The binary extension's request-wide switch.
#[derive(Debug, Default, Deserialize)]
pub struct RequestParameters {
    /// Every output not listed in `outputs` (or all, when none is) comes
    /// back as binary data.
    #[serde(default)]
    pub binary_data_output: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct RequestInput<'a> {
    pub name: String,
    pub shape: Vec<i64>,
    pub datatype: String,
    /// Valid JSON (the parser checked it), not yet read as numbers; absent
    /// for a tensor sent as binary data.
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
    #[serde(default)]
    pub parameters: InputParameters,
}

#[derive(Debug, Default, Deserialize)]
pub struct InputParameters {
    /// Set when the tensor's bytes are in the binary part of the body.
    #[serde(default)]
    pub binary_data_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct RequestOutput {
    pub name: String,
    #[serde(default)]
    pub parameters: OutputParameters,
}

#[derive(Debug, Default, Deserialize)]
pub struct OutputParameters {
    /// Return this output as binary data.
    #[serde(default)]
    pub binary_data: Option<bool>,
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

/// One scalar of `data`: a JSON number's text, or a boolean.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Token<'a> {
    Number(&'a str),
    Bool(bool),
}

/// Calls `each` on every scalar of a JSON array, flat or nested, in
/// row-major order. `json` is valid JSON (serde_json checked it, with its
/// nesting limit); anything but arrays, numbers and booleans is refused.
fn scan<'a>(
    json: &'a str,
    mut each: impl FnMut(Token<'a>) -> Result<(), String>,
) -> Result<(), String> {
    let bytes = json.as_bytes();
    let not_array = || "data must be an array (flat or nested) of numbers or booleans".to_string();
    let mut i = 0;
    while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    if bytes.get(i) != Some(&b'[') {
        return Err(not_array());
    }
    let mut depth = 0usize;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(());
                }
            }
            b',' | b' ' | b'\t' | b'\n' | b'\r' => {}
            b't' | b'f' => {
                let value = b == b't';
                each(Token::Bool(value))?;
                i += if value { 4 } else { 5 };
                continue;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while bytes
                    .get(i)
                    .is_some_and(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                {
                    i += 1;
                }
                each(Token::Number(&json[start..i]))?;
                continue;
            }
            b'"' => return Err("data holds a string; only numbers and booleans are served".into()),
            b'n' => return Err("data holds null; only numbers and booleans are served".into()),
            _ => return Err(not_array()),
        }
        i += 1;
    }
    Err(not_array())
}

/// A number's text as an integer of type `T`: `7`, or `7.0` (an integer
/// written as a float), but not `7.5` or one out of `T`'s range.
fn integer<T: TryFrom<i64>>(text: &str) -> Option<T> {
    let value = match text.parse::<i64>() {
        Ok(v) => v,
        Err(_) => {
            let f = text.parse::<f64>().ok()?;
            if f.fract() != 0.0 || f.abs() >= 9.0e18 {
                return None;
            }
            f as i64
        }
    };
    T::try_from(value).ok()
}

/// Reads `data` (raw JSON) into a tensor of `dtype` and `shape`, refusing
/// values the element type cannot hold (3.5 or 300 for UINT8, `true` for
/// FP32) and an element count other than the shape's.
pub fn to_tensor(dtype: DType, shape: Vec<usize>, data: &str) -> Result<Tensor, String> {
    let count = shape.iter().product::<usize>();
    fn read<T>(
        data: &str,
        shape: Vec<usize>,
        count: usize,
        what: &str,
        convert: impl Fn(Token<'_>) -> Option<T>,
    ) -> Result<ArrayD<T>, String> {
        // Every element takes at least one byte of JSON, so a shape that
        // claims more than the body holds allocates no more than the body.
        let mut values = Vec::with_capacity(count.min(data.len()));
        let mut seen = 0usize;
        scan(data, |token| {
            if seen < count {
                let value = convert(token).ok_or_else(|| {
                    let text = match token {
                        Token::Number(n) => n.to_string(),
                        Token::Bool(b) => b.to_string(),
                    };
                    format!("data[{seen}] = {text} is not {what}")
                })?;
                values.push(value);
            }
            seen += 1;
            Ok(())
        })?;
        if seen != count {
            return Err(format!(
                "shape {shape:?} holds {count} elements, but data has {seen}"
            ));
        }
        ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|e| e.to_string())
    }
    fn number(t: Token<'_>) -> Option<&str> {
        match t {
            Token::Number(n) => Some(n),
            Token::Bool(_) => None,
        }
    }
    Ok(match dtype {
        DType::F32 => Tensor::F32(read(data, shape, count, "a number", |t| {
            number(t)?.parse().ok()
        })?),
        DType::F64 => Tensor::F64(read(data, shape, count, "a number", |t| {
            number(t)?.parse().ok()
        })?),
        DType::F16 => Tensor::F16(read(data, shape, count, "a number", |t| {
            number(t)?.parse().ok().map(half::f16::from_f64)
        })?),
        DType::I8 => Tensor::I8(read(data, shape, count, "an INT8", |t| {
            integer(number(t)?)
        })?),
        DType::U8 => Tensor::U8(read(data, shape, count, "a UINT8", |t| {
            integer(number(t)?)
        })?),
        DType::I32 => Tensor::I32(read(data, shape, count, "an INT32", |t| {
            integer(number(t)?)
        })?),
        DType::I64 => Tensor::I64(read(data, shape, count, "an INT64", |t| {
            integer(number(t)?)
        })?),
        DType::Bool => Tensor::Bool(read(data, shape, count, "a boolean", |t| match t {
            Token::Bool(b) => Some(b),
            Token::Number(_) => None,
        })?),
    })
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<TensorData<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BinaryParameters>,
}

/// Where a binary output's bytes are: its share of the body after the header.
#[derive(Debug, Serialize)]
pub struct BinaryParameters {
    pub binary_data_size: usize,
}

impl<'a> ResponseOutput<'a> {
    pub fn new(name: &'a str, tensor: &'a Tensor) -> Self {
        ResponseOutput {
            name,
            shape: tensor.shape(),
            datatype: datatype_name(tensor.dtype()),
            data: Some(TensorData(tensor)),
            parameters: None,
        }
    }

    /// The output as binary data of `size` bytes, sent after the header.
    pub fn binary(name: &'a str, tensor: &'a Tensor, size: usize) -> Self {
        ResponseOutput {
            data: None,
            parameters: Some(BinaryParameters {
                binary_data_size: size,
            }),
            ..ResponseOutput::new(name, tensor)
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

    fn f32s(json: &str, shape: &[usize]) -> Result<Tensor, String> {
        to_tensor(DType::F32, shape.to_vec(), json)
    }

    #[test]
    fn nested_and_flat_data_read_the_same() {
        let flat = f32s("[1, 2.5, 3e0, -4]", &[2, 2]).unwrap();
        let nested = f32s(" [[1,2.5],\n [3E0, [-4]]] ", &[2, 2]).unwrap();
        assert_eq!(flat, nested);
        assert_eq!(
            flat,
            Tensor::F32(ArrayD::from_shape_vec(vec![2, 2], vec![1.0, 2.5, 3.0, -4.0]).unwrap())
        );
        let cases = [
            ("3", "must be an array"),
            ("{}", "must be an array"),
            (r#"["a"]"#, "string"),
            ("[null]", "null"),
            ("[[{}]]", "must be an array"),
            ("[1, 2]", "holds 1 elements, but data has 2"),
            ("[]", "holds 1 elements, but data has 0"),
        ];
        for (json, want) in cases {
            let err = f32s(json, &[1]).unwrap_err();
            assert!(err.contains(want), "{json}: {err}");
        }
        // Through serde_json, as requests arrive. Neither its skipping of
        // the raw value nor `scan` recurses, so any depth is safe.
        let depth = 100_000;
        let deep = format!(
            r#"{{"name":"x","shape":[1],"datatype":"FP32","data":{}1{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let input: RequestInput<'_> = serde_json::from_str(&deep).unwrap();
        assert_eq!(f32s(input.data.unwrap().get(), &[1]).unwrap().len(), 1);
    }

    #[test]
    fn conversion_refuses_what_the_dtype_cannot_hold() {
        let t = to_tensor(DType::I64, vec![2], "[9007199254740993, 2.0]").unwrap();
        assert_eq!(
            t,
            Tensor::I64(ArrayD::from_shape_vec(vec![2], vec![9007199254740993, 2]).unwrap())
        );
        let b = to_tensor(DType::Bool, vec![2], "[true, false]").unwrap();
        assert_eq!(
            b,
            Tensor::Bool(ArrayD::from_shape_vec(vec![2], vec![true, false]).unwrap())
        );
        let cases = [
            (DType::U8, "[300]", "data[0] = 300"),
            (DType::I32, "[2.5]", "not an INT32"),
            (DType::I64, "[1e300]", "not an INT64"),
            (DType::F32, "[true]", "not a number"),
            (DType::Bool, "[1]", "not a boolean"),
        ];
        for (dtype, json, want) in cases {
            let err = to_tensor(dtype, vec![1], json).unwrap_err();
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
