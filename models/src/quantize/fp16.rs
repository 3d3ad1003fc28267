//! float32 -> float16 conversion for GPU targets. Ops that lose too much
//! precision in half (or have no half kernel) stay in float32 with Casts
//! around them; graph inputs and outputs can keep their float32 types.

use std::collections::{HashMap, HashSet};

use ndarray::ArrayD;

use super::graph::{consumers, int_attr, node, topological_sort, Editor};
use super::{FloatNode, QuantizeError, Report};
use crate::onnx::{from_tensor, ir, to_tensor};
use crate::tensor::Tensor;

/// Ops whose float outputs have the type of their float inputs and that
/// have float16 kernels in ONNX Runtime's CPU and CUDA providers.
const HALF_SAFE: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Softmax",
    "LogSoftmax",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "BatchNormalization",
    "Flatten",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Identity",
    "Dropout",
    "Clip",
    "Pad",
    "Erf",
    "Sqrt",
    "Exp",
    "Abs",
    "Neg",
    "Split",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Constant",
    "Cast",
];

/// Ops kept in float32 because half precision hurts them (accumulations,
/// coordinates, thresholds) or kernels are missing. Their float outputs
/// stay float32.
pub const KEEP_FP32: &[&str] = &[
    "Resize",
    "Upsample",
    "Range",
    "CumSum",
    "TopK",
    "NonMaxSuppression",
    "RoiAlign",
    "ReduceMean",
    "ReduceSum",
    "LayerNormalization",
    "Pow",
    "Log",
    "Min",
    "Max",
    "RandomUniformLike",
    "RandomNormalLike",
];

/// Ops whose outputs are never float, whatever their inputs: a shape, a
/// count, an index or a truth value. YOLOv8's exported head takes the
/// `Shape` of float tensors into `Concat` and on to `Expand`'s shape input;
/// read as float, that chain became float16 and the model invalid.
const NON_FLOAT_OUTPUTS: &[&str] = &[
    "Shape",
    "Size",
    "NonZero",
    "ArgMax",
    "ArgMin",
    "Equal",
    "Greater",
    "GreaterOrEqual",
    "Less",
    "LessOrEqual",
    "Not",
    "And",
    "Or",
    "Xor",
    "IsNaN",
    "IsInf",
];

/// Ops with more than one float output.
const ALL_OUTPUTS_FLOAT: &[&str] = &["Split"];

#[derive(Debug, Clone)]
pub struct Fp16Options {
    /// Keep graph inputs and outputs float32 (Casts at the edges), so
    /// callers need not change.
    pub keep_io_types: bool,
    /// Additional op types to keep in float32.
    pub keep_fp32_ops: Vec<String>,
}

impl Default for Fp16Options {
    fn default() -> Self {
        Self {
            keep_io_types: true,
            keep_fp32_ops: vec![],
        }
    }
}

fn to_half(t: &ir::TensorProto) -> Result<ir::TensorProto, QuantizeError> {
    let Tensor::F32(v) = to_tensor(t, None)? else {
        return Ok(t.clone());
    };
    let half: ArrayD<half::f16> = v.mapv(half::f16::from_f32);
    Ok(from_tensor(t.name(), &Tensor::F16(half)))
}

fn is_tensor_float(v: &ir::ValueInfoProto) -> bool {
    matches!(
        v.type_.as_ref().and_then(|t| t.value.as_ref()),
        Some(ir::type_proto::Value::TensorType(t)) if t.elem_type() == 1
    )
}

/// Whether a node that makes a tensor from attributes makes a float32 one
/// (ONNX's default for ConstantOfShape's `value` and the Random ops' `dtype`).
fn float_by_attribute(n: &ir::NodeProto) -> bool {
    match n.op_type() {
        "ConstantOfShape" => n
            .attribute
            .iter()
            .find(|a| a.name() == "value")
            .and_then(|a| a.t.as_ref())
            .is_none_or(|t| t.data_type() == 1),
        "EyeLike" => n
            .attribute
            .iter()
            .any(|a| a.name() == "dtype" && a.i == Some(1)),
        _ => n
            .attribute
            .iter()
            .find(|a| a.name() == "dtype")
            .is_none_or(|a| a.i == Some(1)),
    }
}

fn set_elem_type(v: &mut ir::ValueInfoProto, code: i32) {
    if let Some(ir::type_proto::Value::TensorType(t)) =
        v.type_.as_mut().and_then(|t| t.value.as_mut())
    {
        t.set_elem_type(code);
    }
}

pub fn convert_fp16(
    model: &ir::ModelProto,
    opts: &Fp16Options,
) -> Result<(ir::ModelProto, Report), QuantizeError> {
    let mut out = model.clone();
    let graph = out.graph.as_mut().ok_or(QuantizeError::NoGraph)?;
    topological_sort(graph);
    let keep: HashSet<&str> = KEEP_FP32
        .iter()
        .copied()
        .chain(opts.keep_fp32_ops.iter().map(String::as_str))
        .collect();
    let mut editor = Editor::new(graph);
    let mut report = Report::default();

    // Float tensors, by the precision they now have.
    let mut half: HashSet<String> = HashSet::new();
    let mut single: HashSet<String> = HashSet::new();
    // An initializer that is also a graph input (required before IR 4, as
    // opset 7 and 8 exporters write) is a default a caller may override
    // with a float32 feed: it stays float32, behind a Cast like any input.
    let graph_inputs: HashSet<String> = editor
        .graph
        .input
        .iter()
        .map(|i| i.name().to_string())
        .collect();
    let float_inits: HashSet<String> = editor
        .graph
        .initializer
        .iter()
        .filter(|t| t.data_type() == 1 && !graph_inputs.contains(t.name()))
        .map(|t| t.name().to_string())
        .collect();
    single.extend(float_inits.iter().cloned());
    let mut new_nodes = vec![];
    // Casts created so far, so a tensor is converted once per direction.
    let mut to_half_cast: HashMap<String, String> = HashMap::new();
    let mut to_single_cast: HashMap<String, String> = HashMap::new();

    for input in editor.graph.input.clone() {
        if float_inits.contains(input.name()) || !is_tensor_float(&input) {
            continue;
        }
        if opts.keep_io_types {
            single.insert(input.name().to_string());
        } else {
            half.insert(input.name().to_string());
        }
    }
    let mut half_inits: HashSet<String> = HashSet::new();
    let readers = consumers(editor.graph);
    let is_half_node = |n: &ir::NodeProto| {
        matches!(n.domain(), "" | "ai.onnx")
            && HALF_SAFE.contains(&n.op_type())
            && !keep.contains(n.op_type())
    };
    // An initializer becomes half in place when every reader runs in half.
    for name in &float_inits {
        let all_half = readers.get(name).is_some_and(|r| {
            r.iter().all(|&i| {
                let n = &editor.graph.node[i];
                // Shape-like float inputs (Resize scales, Clip bounds in old opsets) stay.
                is_half_node(n) && n.op_type() != "Clip"
            })
        });
        if all_half {
            half_inits.insert(name.clone());
        }
    }
    for t in editor.graph.initializer.iter_mut() {
        if half_inits.contains(t.name()) {
            *t = to_half(t)?;
        }
    }
    single.retain(|n| !half_inits.contains(n));
    half.extend(half_inits.iter().cloned());

    for i in 0..editor.graph.node.len() {
        let n = editor.graph.node[i].clone();
        let half_node = is_half_node(&n);
        let mut any_float_input = false;
        for (k, input) in n.input.iter().enumerate() {
            if input.is_empty() {
                continue;
            }
            let (is_half, is_single) = (half.contains(input), single.contains(input));
            any_float_input |= is_half || is_single;
            let wanted_half = half_node && n.op_type() != "Clip";
            let replacement = if wanted_half && is_single {
                Some(
                    to_half_cast
                        .entry(input.clone())
                        .or_insert_with(|| {
                            let o = editor.fresh(input, "_fp16");
                            let mut c =
                                node("Cast", editor.fresh(input, "_CastToFp16"), &[input], &[&o]);
                            c.attribute.push(int_attr("to", 10));
                            new_nodes.push(c);
                            o
                        })
                        .clone(),
                )
            } else if !wanted_half && is_half {
                Some(
                    to_single_cast
                        .entry(input.clone())
                        .or_insert_with(|| {
                            let o = editor.fresh(input, "_fp32");
                            let mut c =
                                node("Cast", editor.fresh(input, "_CastToFp32"), &[input], &[&o]);
                            c.attribute.push(int_attr("to", 1));
                            new_nodes.push(c);
                            o
                        })
                        .clone(),
                )
            } else {
                None
            };
            if let Some(r) = replacement {
                editor.graph.node[i].input[k] = r;
            }
        }
        let float_outputs: Vec<String> = match n.op_type() {
            "Constant" => {
                let float_value = n.attribute.iter().any(|a| {
                    a.name() == "value" && a.t.as_ref().is_some_and(|t| t.data_type() == 1)
                });
                if float_value && half_node {
                    for a in editor.graph.node[i].attribute.iter_mut() {
                        if let Some(t) = a.t.as_mut() {
                            *t = to_half(t)?;
                        }
                    }
                    half.insert(n.output[0].clone());
                }
                vec![]
            }
            "Cast" => {
                let to = n
                    .attribute
                    .iter()
                    .find(|a| a.name() == "to")
                    .and_then(|a| a.i);
                if to == Some(1) && half_node {
                    for a in editor.graph.node[i].attribute.iter_mut() {
                        if a.name() == "to" {
                            a.set_i(10);
                        }
                    }
                    half.insert(n.output[0].clone());
                } else if to == Some(1) {
                    single.insert(n.output[0].clone());
                }
                vec![]
            }
            // Float by attribute, from non-float inputs (ConstantOfShape
            // takes an int64 shape): tracked as float32, so half readers
            // get a Cast.
            "ConstantOfShape" | "RandomNormal" | "RandomUniform" | "EyeLike"
                if float_by_attribute(&n) =>
            {
                single.insert(n.output[0].clone());
                vec![]
            }
            op if NON_FLOAT_OUTPUTS.contains(&op) => vec![],
            op if any_float_input && ALL_OUTPUTS_FLOAT.contains(&op) => n.output.clone(),
            _ if any_float_input => n.output.iter().take(1).cloned().collect(),
            _ => vec![],
        };
        for o in float_outputs.into_iter().filter(|o| !o.is_empty()) {
            if half_node {
                half.insert(o);
            } else {
                single.insert(o);
            }
        }
        if !half_node && any_float_input {
            report.left_in_float.push(FloatNode {
                node: if n.name().is_empty() {
                    format!("#{i} {}", n.op_type())
                } else {
                    n.name().to_string()
                },
                op_type: n.op_type().to_string(),
                reason: if keep.contains(n.op_type()) {
                    "kept in float32 for precision".into()
                } else {
                    "no float16 conversion for this op".into()
                },
            });
        } else if half_node && any_float_input {
            report.quantized_nodes.push(if n.name().is_empty() {
                format!("#{i} {}", n.op_type())
            } else {
                n.name().to_string()
            });
        }
    }

    // Graph outputs.
    let outputs = editor.graph.output.clone();
    for (k, o) in outputs.iter().enumerate() {
        if !half.contains(o.name()) {
            continue;
        }
        if opts.keep_io_types {
            // Rename the half tensor and cast back under the public name.
            let inner = editor.fresh(o.name(), "_fp16");
            for n in editor.graph.node.iter_mut().chain(new_nodes.iter_mut()) {
                for x in n.output.iter_mut().chain(n.input.iter_mut()) {
                    if x == o.name() {
                        *x = inner.clone();
                    }
                }
            }
            let mut c = node(
                "Cast",
                editor.fresh(o.name(), "_CastToFp32"),
                &[&inner],
                &[o.name()],
            );
            c.attribute.push(int_attr("to", 1));
            new_nodes.push(c);
        } else {
            set_elem_type(&mut editor.graph.output[k], 10);
        }
    }
    if !opts.keep_io_types {
        for input in editor.graph.input.iter_mut() {
            if half.contains(input.name()) {
                set_elem_type(input, 10);
            }
        }
    }
    // Declared intermediate types would now be wrong; they are optional.
    editor.graph.value_info.retain(|v| !half.contains(v.name()));
    editor.graph.node.extend(new_nodes);
    topological_sort(editor.graph);
    Ok((out, report))
}
