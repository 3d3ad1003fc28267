//! The trained model as ONNX, built with the models crate's IR, and the
//! `.npz` sets the quantizer takes beside it.
//!
//! The graphs are tools/train_mnist.py's: opset 17, IR 8, input `input`
//! (f32, batch dimension `N`), output `logits`, initializers named like the
//! parameters (see `model.rs`). The MLP ends in two logits; softmax is left
//! to the consumer, as for the CNN.

use edgeloop_models::npz::{Npz, NpzError};
use edgeloop_models::onnx::{self, ir, ValidationError};
use edgeloop_models::Tensor as NdTensor;
use ndarray::{ArrayD, IxDyn};

use crate::data::Samples;
use crate::model::Model;
use crate::Workload;

pub const INPUT: &str = "input";
pub const OUTPUT: &str = "logits";
pub const OPSET: i64 = 17;
pub const IR_VERSION: i64 = 8;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("export: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("export: the ONNX graph is invalid: {0}")]
    Invalid(#[from] ValidationError),
    #[error("export: {0}")]
    Npz(#[from] NpzError),
    #[error("export: {0}")]
    Shape(String),
}

fn nd(shape: &[usize], values: Vec<f32>) -> Result<NdTensor, ExportError> {
    ArrayD::from_shape_vec(IxDyn(shape), values)
        .map(NdTensor::F32)
        .map_err(|e| ExportError::Shape(e.to_string()))
}

/// `f32` tensor info with a symbolic batch dimension `N` first.
fn value_info(name: &str, dims_after_batch: &[i64]) -> ir::ValueInfoProto {
    use ir::tensor_shape_proto::dimension::Value;
    let mut v = ir::ValueInfoProto::new();
    v.set_name(name.into());
    let mut t = ir::type_proto::Tensor::new();
    t.set_elem_type(edgeloop_models::DType::F32.onnx_code());
    let shape = t.shape.mut_or_insert_default();
    let dims = std::iter::once(Value::DimParam("N".into()))
        .chain(dims_after_batch.iter().map(|&d| Value::DimValue(d)));
    for value in dims {
        let mut dim = ir::tensor_shape_proto::Dimension::new();
        dim.value = Some(value);
        shape.dim.push(dim);
    }
    v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(t));
    v
}

enum Attr {
    Int(i64),
    Ints(Vec<i64>),
}

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    output: &str,
    attrs: Vec<(&str, Attr)>,
) -> ir::NodeProto {
    use ir::attribute_proto::AttributeType;
    let mut n = ir::NodeProto::new();
    n.set_op_type(op.into());
    n.set_name(name.into());
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = vec![output.to_string()];
    for (key, value) in attrs {
        let mut a = ir::AttributeProto::new();
        a.set_name(key.into());
        match value {
            Attr::Int(i) => {
                a.set_i(i);
                a.set_type(AttributeType::INT);
            }
            Attr::Ints(v) => {
                a.ints = v;
                a.set_type(AttributeType::INTS);
            }
        }
        n.attribute.push(a);
    }
    n
}

fn gemm(name: &str, x: &str, out: &str) -> ir::NodeProto {
    let (w, b) = (format!("{name}.weight"), format!("{name}.bias"));
    // transB=1 with B as [out, in]: PyTorch's exporter's layout, and ours.
    node(
        "Gemm",
        name,
        &[x, &w, &b],
        out,
        vec![("transB", Attr::Int(1))],
    )
}

fn relu(name: &str, x: &str) -> ir::NodeProto {
    node("Relu", name, &[x], name, vec![])
}

/// The ONNX model of `model`'s current weights, validated.
pub fn to_onnx(model: &Model) -> Result<ir::ModelProto, ExportError> {
    let mut m = ir::ModelProto::new();
    m.set_ir_version(IR_VERSION);
    m.set_producer_name("edgeloop-train".into());
    m.set_producer_version(env!("CARGO_PKG_VERSION").into());
    let mut opset = ir::OperatorSetIdProto::new();
    opset.set_domain(String::new());
    opset.set_version(OPSET);
    m.opset_import.push(opset);

    let g = m.graph.mut_or_insert_default();
    for (name, var) in &model.params {
        let t = var.as_tensor();
        let values = t.flatten_all()?.to_vec1::<f32>()?;
        g.initializer
            .push(onnx::from_tensor(name, &nd(t.dims(), values)?));
    }
    let conv = || {
        vec![
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
            ("strides", Attr::Ints(vec![1, 1])),
        ]
    };
    let pool = || {
        vec![
            ("kernel_shape", Attr::Ints(vec![2, 2])),
            ("strides", Attr::Ints(vec![2, 2])),
        ]
    };
    match model.workload {
        Workload::MnistCnn => {
            g.set_name("mnist_cnn".into());
            g.input.push(value_info(INPUT, &[1, 28, 28]));
            g.node = vec![
                node(
                    "Conv",
                    "conv1",
                    &[INPUT, "conv1.weight", "conv1.bias"],
                    "conv1",
                    conv(),
                ),
                relu("relu1", "conv1"),
                node("MaxPool", "pool1", &["relu1"], "pool1", pool()),
                node(
                    "Conv",
                    "conv2",
                    &["pool1", "conv2.weight", "conv2.bias"],
                    "conv2",
                    conv(),
                ),
                relu("relu2", "conv2"),
                node("MaxPool", "pool2", &["relu2"], "pool2", pool()),
                node(
                    "Flatten",
                    "flatten",
                    &["pool2"],
                    "flat",
                    vec![("axis", Attr::Int(1))],
                ),
                gemm("fc1", "flat", "fc1"),
                relu("relu3", "fc1"),
                gemm("fc2", "relu3", OUTPUT),
            ];
            g.output.push(value_info(OUTPUT, &[10]));
        }
        Workload::RainfallMlp => {
            g.set_name("rainfall_mlp".into());
            g.input.push(value_info(INPUT, &[8]));
            g.node = vec![
                gemm("fc1", INPUT, "fc1"),
                relu("relu1", "fc1"),
                gemm("fc2", "relu1", "fc2"),
                relu("relu2", "fc2"),
                gemm("fc3", "relu2", OUTPUT),
            ];
            g.output.push(value_info(OUTPUT, &[2]));
        }
    }
    onnx::validate(&m, None)?;
    Ok(m)
}

/// `input` (f32, `[n, ...sample_shape]`) and, when `labels`, `label`
/// (int64): the layout `edgeloop_models::dataset::Dataset` reads.
pub fn to_npz(samples: &Samples, labels: bool) -> Result<Npz, ExportError> {
    let mut shape = vec![samples.len()];
    shape.extend_from_slice(&samples.sample_shape);
    let mut npz = Npz::new();
    npz.insert(INPUT, nd(&shape, samples.x.clone())?);
    if labels {
        let y: Vec<i64> = samples.y.iter().map(|&c| i64::from(c)).collect();
        let y = ArrayD::from_shape_vec(IxDyn(&[y.len()]), y)
            .map_err(|e| ExportError::Shape(e.to_string()))?;
        npz.insert(edgeloop_models::dataset::LABEL_KEY, NdTensor::I64(y));
    }
    Ok(npz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_graphs_validate_and_carry_the_weights() {
        for workload in [Workload::MnistCnn, Workload::RainfallMlp] {
            let model = Model::init(workload, 4).unwrap();
            let m = to_onnx(&model).unwrap();
            let bytes = onnx::encode(&m).unwrap();
            let back = onnx::decode(&bytes).unwrap();
            assert_eq!(back, m);
            let summary = onnx::inspect(&back);
            assert_eq!(summary.inputs[0].name, INPUT);
            assert_eq!(summary.outputs[0].name, OUTPUT);
            let init = &back.graph.initializer;
            assert_eq!(init.len(), model.params.len());
            let first = onnx::to_tensor(&init[0], None).unwrap();
            let NdTensor::F32(a) = first else {
                panic!("f32 weights")
            };
            let want = model.params[0]
                .1
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(a.iter().copied().collect::<Vec<_>>(), want);
            // Same weights, same bytes: export is deterministic.
            assert_eq!(onnx::encode(&to_onnx(&model).unwrap()).unwrap(), bytes);
        }
    }

    #[test]
    fn npz_has_the_dataset_layout() {
        let s = Samples {
            x: vec![0.5; 3 * 8],
            y: vec![0, 1, 1],
            sample_shape: vec![8],
        };
        let npz = to_npz(&s, true).unwrap();
        assert_eq!(npz.require(INPUT).unwrap().shape(), &[3, 8]);
        assert_eq!(
            npz.require("label").unwrap().dtype(),
            edgeloop_models::DType::I64
        );
        let back = Npz::from_bytes(&npz.to_bytes().unwrap()).unwrap();
        assert_eq!(back, npz);
        assert!(to_npz(&s, false).unwrap().get("label").is_none());
    }
}
