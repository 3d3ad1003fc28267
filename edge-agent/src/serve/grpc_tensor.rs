//! The gRPC service's tensors: a `ModelInferRequest`'s inputs (as
//! `raw_input_contents` or as typed `contents`) into [`Tensor`]s, and
//! outputs into `raw_output_contents`, as Triton answers by default.
//!
//! Pure, and everything here reads untrusted messages: counts and sizes are
//! checked against the shape before anything is allocated, every error names
//! its input, and nothing panics (a property test feeds it arbitrary bytes
//! and shapes).

use edgeloop_models::tensor::{DType, Tensor};
use edgeloop_proto::inference::model_infer_request::InferInputTensor;
use edgeloop_proto::inference::model_infer_response::InferOutputTensor;
use edgeloop_proto::inference::InferTensorContents;
use ndarray::{ArrayD, IxDyn};
use prost::bytes::Bytes;

use super::binary;
use super::error::ServeError;
use super::pool::Named;
use super::protocol::{checked_shape, datatype_name, parse_datatype, supported_datatypes};

/// The request's inputs as tensors. `raw` is `raw_input_contents`: empty
/// (every input carries typed `contents`), or one entry per input, in input
/// order (then no input may carry `contents`).
pub(super) fn decode_inputs(
    inputs: Vec<InferInputTensor>,
    raw: Vec<Bytes>,
) -> Result<Named, ServeError> {
    if !raw.is_empty() && raw.len() != inputs.len() {
        return Err(ServeError::BadBody(format!(
            "raw_input_contents has {} entries for {} inputs; give one per input, in input order",
            raw.len(),
            inputs.len()
        )));
    }
    let mut raw = raw.into_iter();
    inputs
        .into_iter()
        .map(|input| {
            let InferInputTensor {
                name,
                datatype,
                shape,
                contents,
                ..
            } = input;
            match decode_input(&datatype, &shape, contents, raw.next()) {
                Ok(tensor) => Ok((name, tensor)),
                Err(reason) => Err(ServeError::BadInput { name, reason }),
            }
        })
        .collect()
}

fn decode_input(
    datatype: &str,
    shape: &[i64],
    contents: Option<InferTensorContents>,
    raw: Option<Bytes>,
) -> Result<Tensor, String> {
    let dtype = parse_datatype(datatype).ok_or_else(|| {
        format!(
            "datatype {datatype:?} is not supported; use one of {}",
            supported_datatypes()
        )
    })?;
    let (shape, count) = checked_shape(shape)?;
    // A client may send an empty `contents` message beside raw bytes; only
    // contents that hold elements count as given.
    let typed = contents
        .as_ref()
        .is_some_and(|c| !given_fields(c).is_empty());
    match (raw, contents) {
        (Some(_), Some(_)) if typed => Err(
            "has typed contents, but the request has raw_input_contents: give one or the other"
                .into(),
        ),
        (Some(bytes), _) => from_raw(dtype, shape, count, &bytes),
        (None, None) if count > 0 => {
            Err("has no data: no contents, and the request has no raw_input_contents".into())
        }
        (None, contents) => from_contents(dtype, shape, count, contents.unwrap_or_default()),
    }
}

fn from_raw(dtype: DType, shape: Vec<usize>, count: usize, bytes: &[u8]) -> Result<Tensor, String> {
    let size = binary::element_size(dtype);
    let want = count
        .checked_mul(size)
        .ok_or_else(|| format!("shape {shape:?} has too many elements"))?;
    if want != bytes.len() {
        return Err(format!(
            "shape {shape:?} of {} needs {want} bytes, its raw_input_contents has {}",
            datatype_name(dtype),
            bytes.len()
        ));
    }
    binary::to_tensor(dtype, shape, bytes)
}

/// The `contents` fields that hold elements, by name.
fn given_fields(c: &InferTensorContents) -> Vec<&'static str> {
    [
        ("bool_contents", c.bool_contents.is_empty()),
        ("int_contents", c.int_contents.is_empty()),
        ("int64_contents", c.int64_contents.is_empty()),
        ("uint_contents", c.uint_contents.is_empty()),
        ("uint64_contents", c.uint64_contents.is_empty()),
        ("fp32_contents", c.fp32_contents.is_empty()),
        ("fp64_contents", c.fp64_contents.is_empty()),
        ("bytes_contents", c.bytes_contents.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, empty)| (!empty).then_some(name))
    .collect()
}

/// The `contents` field that holds a datatype's elements (the protocol's
/// table); FP16 has none.
fn contents_field(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::Bool => Some("bool_contents"),
        DType::I8 | DType::I32 => Some("int_contents"),
        DType::I64 => Some("int64_contents"),
        DType::U8 => Some("uint_contents"),
        DType::F32 => Some("fp32_contents"),
        DType::F64 => Some("fp64_contents"),
        DType::F16 => None,
    }
}

fn from_contents(
    dtype: DType,
    shape: Vec<usize>,
    count: usize,
    c: InferTensorContents,
) -> Result<Tensor, String> {
    let name = datatype_name(dtype);
    let no_field = || format!("{name} has no typed contents field; send it as raw_input_contents");
    let field = contents_field(dtype).ok_or_else(no_field)?;
    if let Some(other) = given_fields(&c).into_iter().find(|f| *f != field) {
        return Err(format!(
            "{name} elements go in contents.{field}, but contents.{other} holds elements"
        ));
    }
    // The count is checked before anything is converted or allocated.
    let counted = |len: usize| {
        if len == count {
            Ok(())
        } else {
            Err(format!(
                "shape {shape:?} holds {count} elements, but contents.{field} has {len}"
            ))
        }
    };
    /// Narrows each element, naming the first that does not fit.
    fn narrow<S: Copy + std::fmt::Display, T: TryFrom<S>>(
        values: Vec<S>,
        field: &str,
        name: &str,
    ) -> Result<Vec<T>, String> {
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                T::try_from(v).map_err(|_| format!("contents.{field}[{i}] = {v} is not an {name}"))
            })
            .collect()
    }
    fn array<T>(shape: &[usize], values: Vec<T>) -> Result<ArrayD<T>, String> {
        ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| e.to_string())
    }
    Ok(match dtype {
        DType::F32 => {
            counted(c.fp32_contents.len())?;
            Tensor::F32(array(&shape, c.fp32_contents)?)
        }
        DType::F64 => {
            counted(c.fp64_contents.len())?;
            Tensor::F64(array(&shape, c.fp64_contents)?)
        }
        DType::I32 => {
            counted(c.int_contents.len())?;
            Tensor::I32(array(&shape, c.int_contents)?)
        }
        DType::I64 => {
            counted(c.int64_contents.len())?;
            Tensor::I64(array(&shape, c.int64_contents)?)
        }
        DType::Bool => {
            counted(c.bool_contents.len())?;
            Tensor::Bool(array(&shape, c.bool_contents)?)
        }
        DType::I8 => {
            counted(c.int_contents.len())?;
            Tensor::I8(array(&shape, narrow(c.int_contents, field, name)?)?)
        }
        DType::U8 => {
            counted(c.uint_contents.len())?;
            Tensor::U8(array(&shape, narrow(c.uint_contents, field, name)?)?)
        }
        DType::F16 => return Err(no_field()),
    })
}

/// The outputs as the response carries them: descriptions, and each
/// tensor's little-endian bytes in `raw_output_contents`, in the same order.
pub(super) fn encode_outputs(outputs: &[(String, Tensor)]) -> (Vec<InferOutputTensor>, Vec<Bytes>) {
    outputs
        .iter()
        .map(|(name, tensor)| {
            let described = InferOutputTensor {
                name: name.clone(),
                datatype: datatype_name(tensor.dtype()).to_string(),
                shape: tensor
                    .shape()
                    .iter()
                    .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                    .collect(),
                parameters: Default::default(),
                contents: None,
            };
            (described, Bytes::from(binary::to_bytes(tensor)))
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            parameters: Default::default(),
            contents: None,
        }
    }

    fn f32_bytes(values: &[f32]) -> Bytes {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn reason(result: Result<Named, ServeError>) -> (String, String) {
        match result.unwrap_err() {
            ServeError::BadInput { name, reason } => (name, reason),
            other => panic!("not a BadInput: {other:?}"),
        }
    }

    #[test]
    fn raw_and_typed_contents_read_the_same() {
        let values = [1.5f32, -2.0, 0.25, 3.0, 4.0, 5.5];
        let raw =
            decode_inputs(vec![input("x", "FP32", &[2, 3])], vec![f32_bytes(&values)]).unwrap();
        let mut typed = input("x", "FP32", &[2, 3]);
        typed.contents = Some(InferTensorContents {
            fp32_contents: values.to_vec(),
            ..Default::default()
        });
        let typed = decode_inputs(vec![typed], Vec::new()).unwrap();
        assert_eq!(raw, typed);
        assert_eq!(raw[0].1.shape(), &[2, 3]);

        // Each dtype from its field, narrowed where the field is wider.
        let cases: Vec<(&str, InferTensorContents, Tensor)> = vec![
            (
                "INT8",
                InferTensorContents {
                    int_contents: vec![-128, 127],
                    ..Default::default()
                },
                Tensor::I8(ArrayD::from_shape_vec(IxDyn(&[2]), vec![-128, 127]).unwrap()),
            ),
            (
                "UINT8",
                InferTensorContents {
                    uint_contents: vec![0, 255],
                    ..Default::default()
                },
                Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2]), vec![0, 255]).unwrap()),
            ),
            (
                "INT64",
                InferTensorContents {
                    int64_contents: vec![i64::MIN, 7],
                    ..Default::default()
                },
                Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[2]), vec![i64::MIN, 7]).unwrap()),
            ),
            (
                "BOOL",
                InferTensorContents {
                    bool_contents: vec![true, false],
                    ..Default::default()
                },
                Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[2]), vec![true, false]).unwrap()),
            ),
            (
                "FP64",
                InferTensorContents {
                    fp64_contents: vec![1e300, -0.5],
                    ..Default::default()
                },
                Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1e300, -0.5]).unwrap()),
            ),
        ];
        for (datatype, contents, want) in cases {
            let mut i = input("x", datatype, &[2]);
            i.contents = Some(contents);
            let got = decode_inputs(vec![i], Vec::new()).unwrap();
            assert_eq!(got[0].1, want, "{datatype}");
        }
    }

    #[test]
    fn outputs_round_trip_through_raw_bytes() {
        let t = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![0.5, -1.0]).unwrap());
        let (described, raw) = encode_outputs(&[("y".into(), t.clone())]);
        assert_eq!(described[0].name, "y");
        assert_eq!(described[0].datatype, "FP32");
        assert_eq!(described[0].shape, vec![1, 2]);
        let back = decode_inputs(vec![input("y", "FP32", &[1, 2])], raw).unwrap();
        assert_eq!(back[0].1, t);
    }

    #[test]
    fn every_bad_field_is_refused_naming_the_input() {
        let two = || f32_bytes(&[1.0, 2.0]);
        let typed = |datatype: &str, shape: &[i64], contents: InferTensorContents| {
            let mut i = input("x", datatype, shape);
            i.contents = Some(contents);
            i
        };
        let fp32 = |v: Vec<f32>| InferTensorContents {
            fp32_contents: v,
            ..Default::default()
        };
        // (what, inputs, raw, part of the reason)
        let cases: Vec<(&str, Vec<InferInputTensor>, Vec<Bytes>, &str)> = vec![
            (
                "short raw",
                vec![input("x", "FP32", &[3])],
                vec![two()],
                "needs 12 bytes, its raw_input_contents has 8",
            ),
            (
                "long raw",
                vec![input("x", "FP32", &[1])],
                vec![two()],
                "needs 4 bytes",
            ),
            (
                "unknown datatype",
                vec![input("x", "BYTES", &[2])],
                vec![two()],
                "not supported",
            ),
            (
                "lowercase datatype",
                vec![input("x", "fp32", &[2])],
                vec![two()],
                "not supported",
            ),
            (
                "negative dim",
                vec![input("x", "FP32", &[-1, 2])],
                vec![two()],
                "negative",
            ),
            (
                "overflowing shape",
                vec![input("x", "FP32", &[i64::MAX, i64::MAX])],
                vec![two()],
                "too many elements",
            ),
            (
                "both raw and typed",
                vec![typed("FP32", &[2], fp32(vec![1.0, 2.0]))],
                vec![two()],
                "give one or the other",
            ),
            (
                "no data",
                vec![input("x", "FP32", &[2])],
                Vec::new(),
                "has no data",
            ),
            (
                "typed count",
                vec![typed("FP32", &[3], fp32(vec![1.0, 2.0]))],
                Vec::new(),
                "holds 3 elements, but contents.fp32_contents has 2",
            ),
            (
                "typed wrong field",
                vec![typed(
                    "FP32",
                    &[1],
                    InferTensorContents {
                        int_contents: vec![1],
                        ..Default::default()
                    },
                )],
                Vec::new(),
                "go in contents.fp32_contents, but contents.int_contents",
            ),
            (
                "typed two fields",
                vec![typed(
                    "FP32",
                    &[1],
                    InferTensorContents {
                        fp32_contents: vec![1.0],
                        fp64_contents: vec![1.0],
                        ..Default::default()
                    },
                )],
                Vec::new(),
                "contents.fp64_contents holds",
            ),
            (
                "typed FP16",
                vec![typed(
                    "FP16",
                    &[1],
                    InferTensorContents {
                        fp32_contents: vec![1.0],
                        ..Default::default()
                    },
                )],
                Vec::new(),
                "send it as raw_input_contents",
            ),
            (
                "INT8 out of range",
                vec![typed(
                    "INT8",
                    &[2],
                    InferTensorContents {
                        int_contents: vec![1, 128],
                        ..Default::default()
                    },
                )],
                Vec::new(),
                "int_contents[1] = 128 is not an INT8",
            ),
            (
                "UINT8 out of range",
                vec![typed(
                    "UINT8",
                    &[1],
                    InferTensorContents {
                        uint_contents: vec![256],
                        ..Default::default()
                    },
                )],
                Vec::new(),
                "is not an UINT8",
            ),
            (
                "BOOL raw byte",
                vec![input("x", "BOOL", &[1])],
                vec![Bytes::from_static(&[2])],
                "not 0 or 1",
            ),
        ];
        for (what, inputs, raw, want) in cases {
            let (name, reason) = reason(decode_inputs(inputs, raw));
            assert_eq!(name, "x", "{what}");
            assert!(reason.contains(want), "{what}: {reason:?} lacks {want:?}");
        }
        // The count of raw entries is the request's fault, not an input's.
        let err = decode_inputs(
            vec![input("x", "FP32", &[2]), input("z", "FP32", &[2])],
            vec![two()],
        )
        .unwrap_err();
        assert!(
            matches!(&err, ServeError::BadBody(m) if m.contains("1 entries for 2 inputs")),
            "{err:?}"
        );
        // An empty contents message beside raw bytes is no contents, and a
        // zero-element tensor needs no data at all.
        let mut empty = input("x", "FP32", &[2]);
        empty.contents = Some(InferTensorContents::default());
        assert!(decode_inputs(vec![empty], vec![two()]).is_ok());
        let mut none = input("x", "FP32", &[0, 4]);
        none.contents = Some(InferTensorContents::default());
        assert_eq!(
            decode_inputs(vec![none], Vec::new()).unwrap()[0].1.shape(),
            &[0, 4]
        );
    }

    fn any_datatype() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("FP32".to_string()),
            Just("FP64".to_string()),
            Just("FP16".to_string()),
            Just("INT8".to_string()),
            Just("UINT8".to_string()),
            Just("INT32".to_string()),
            Just("INT64".to_string()),
            Just("BOOL".to_string()),
            ".{0,6}",
        ]
    }

    fn any_dim() -> impl Strategy<Value = i64> {
        prop_oneof![4 => -2i64..9, 1 => any::<i64>()]
    }

    fn any_contents() -> impl Strategy<Value = Option<InferTensorContents>> {
        let v = |n| proptest::collection::vec(any::<u8>(), 0..n);
        proptest::option::of(
            (
                proptest::collection::vec(any::<bool>(), 0..9),
                proptest::collection::vec(any::<i32>(), 0..9),
                proptest::collection::vec(any::<i64>(), 0..9),
                proptest::collection::vec(any::<u32>(), 0..9),
                proptest::collection::vec(any::<f32>(), 0..9),
                proptest::collection::vec(any::<f64>(), 0..9),
                proptest::collection::vec(v(4), 0..2),
            )
                .prop_map(|(b, i, i64s, u, f, d, bytes)| InferTensorContents {
                    bool_contents: b,
                    int_contents: i,
                    int64_contents: i64s,
                    uint_contents: u,
                    uint64_contents: Vec::new(),
                    fp32_contents: f,
                    fp64_contents: d,
                    bytes_contents: bytes,
                }),
        )
    }

    proptest! {
        /// Arbitrary raw bytes, shapes, datatypes and contents: an answer or
        /// an error, never a panic; and what decodes has exactly the shape
        /// asked for.
        #[test]
        fn untrusted_messages_never_panic(
            inputs in proptest::collection::vec(
                (any_datatype(), proptest::collection::vec(any_dim(), 0..4), any_contents()),
                0..3,
            ),
            raw in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
        ) {
            let inputs: Vec<InferInputTensor> = inputs
                .into_iter()
                .map(|(datatype, shape, contents)| InferInputTensor {
                    name: "x".into(),
                    datatype,
                    shape,
                    parameters: Default::default(),
                    contents,
                })
                .collect();
            let shapes: Vec<Vec<i64>> = inputs.iter().map(|i| i.shape.clone()).collect();
            let raw: Vec<Bytes> = raw.into_iter().map(Bytes::from).collect();
            if let Ok(named) = decode_inputs(inputs, raw) {
                for ((_, tensor), shape) in named.iter().zip(&shapes) {
                    let got: Vec<i64> = tensor.shape().iter().map(|&d| d as i64).collect();
                    prop_assert_eq!(&got, shape);
                }
                let (described, raw) = encode_outputs(&named);
                prop_assert_eq!(described.len(), raw.len());
            }
        }
    }
}
