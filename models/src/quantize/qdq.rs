//! Static int8 quantization in QDQ form: per-channel symmetric int8 weights,
//! per-tensor uint8 activations with ranges from calibration, int32 biases.
//! ONNX Runtime fuses the resulting DQ -> op -> Q patterns into integer
//! kernels (QLinearConv, QGemm, ...).

use std::collections::{BTreeMap, HashMap, HashSet};

use ndarray::{ArrayD, IxDyn};

use super::graph::{
    attr_f, attr_i, consumers, default_opset, int_attr, node, topological_sort, Editor,
};
use super::params::{activation_params, quantize_per_channel, quantize_per_tensor};
use super::{FloatNode, QuantizeError, Report};
use crate::onnx::{ir, to_tensor};
use crate::tensor::Tensor;

#[derive(Debug, Clone)]
pub struct StaticOptions {
    pub per_channel: bool,
    /// Also quantize Add and Mul of two activations (residual joins), which
    /// pays off when their neighbours are quantized too.
    pub quantize_add_mul: bool,
    /// Keep graph outputs in float: the last layer's logits lose the least.
    pub float_outputs: bool,
    /// Node names never to quantize.
    pub exclude: Vec<String>,
}

impl Default for StaticOptions {
    fn default() -> Self {
        Self {
            per_channel: true,
            quantize_add_mul: false,
            float_outputs: true,
            exclude: vec![],
        }
    }
}

/// How a quantizable node's weight is laid out.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Weighted {
    /// Weight input index, and the channel axis of the weight tensor.
    Weight { index: usize, axis: usize },
    /// Only activations (Add, Mul).
    ActivationsOnly,
}

/// Ops that carry int8 values through unchanged; quantization continues
/// across them and they are not reported as "left in float".
const PASS_THROUGH: &[&str] = &[
    "Relu",
    "Clip",
    "MaxPool",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Dropout",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Pad",
    "Resize",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
];

/// Ops whose output keeps the input's quantization parameters.
const SAME_PARAMS: &[&str] = &[
    "MaxPool",
    "GlobalMaxPool",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Identity",
];

fn is_float_constant(t: Option<&ir::TensorProto>, rank: &[usize]) -> bool {
    t.is_some_and(|t| t.data_type() == 1 && rank.contains(&t.dims.len()))
}

/// Decides, per node, whether it is quantized, and why not when it is not.
fn classify(
    editor: &Editor<'_>,
    n: &ir::NodeProto,
    opts: &StaticOptions,
) -> Result<Weighted, String> {
    if !matches!(n.domain(), "" | "ai.onnx") {
        return Err(format!("custom domain {:?}", n.domain()));
    }
    if opts.exclude.iter().any(|e| e == n.name()) {
        return Err("excluded by request".into());
    }
    let weight = n.input.get(1).and_then(|w| editor.initializer(w));
    match n.op_type() {
        "Conv" if is_float_constant(weight, &[3, 4, 5]) => {
            Ok(Weighted::Weight { index: 1, axis: 0 })
        }
        "MatMul" if is_float_constant(weight, &[2]) => Ok(Weighted::Weight { index: 1, axis: 1 }),
        "Gemm" if is_float_constant(weight, &[2]) => {
            if attr_i(n, "transA").unwrap_or(0) != 0 {
                return Err("Gemm with transA is not quantized".into());
            }
            let axis = if attr_i(n, "transB").unwrap_or(0) != 0 {
                0
            } else {
                1
            };
            Ok(Weighted::Weight { index: 1, axis })
        }
        "Conv" | "MatMul" | "Gemm" => Err("weight is not a constant float tensor".into()),
        "Add" | "Mul" if opts.quantize_add_mul => {
            let both_activations = n.input.iter().all(|i| editor.initializer(i).is_none());
            if both_activations {
                Ok(Weighted::ActivationsOnly)
            } else {
                Err("one input is a constant".into())
            }
        }
        op => Err(format!("{op} has no int8 kernel here")),
    }
}

/// The tensors whose ranges calibration must measure for this plan.
pub fn calibration_targets(model: &ir::ModelProto, opts: &StaticOptions) -> Vec<String> {
    let mut model = model.clone();
    let graph = model.graph.mut_or_insert_default();
    plan(&mut Editor::new(graph), opts).activations
}

struct Plan {
    quantized: Vec<(usize, Weighted)>,
    activations: Vec<String>,
    left_in_float: Vec<FloatNode>,
}

fn node_label(i: usize, n: &ir::NodeProto) -> String {
    if n.name().is_empty() {
        format!("#{i} {}", n.op_type())
    } else {
        n.name().to_string()
    }
}

fn plan(editor: &mut Editor<'_>, opts: &StaticOptions) -> Plan {
    let graph_outputs: HashSet<String> = editor
        .graph
        .output
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    let readers = consumers(editor.graph);
    let mut quantized = vec![];
    let mut left_in_float = vec![];
    let mut activations: Vec<String> = vec![];
    let push = |name: &str, acts: &mut Vec<String>| {
        if !acts.iter().any(|a| a == name) {
            acts.push(name.to_string());
        }
    };
    for (i, n) in editor.graph.node.iter().enumerate() {
        match classify(editor, n, opts) {
            Ok(kind) => {
                let weight_index = match kind {
                    Weighted::Weight { index, .. } => Some(index),
                    Weighted::ActivationsOnly => None,
                };
                for (k, input) in n.input.iter().enumerate() {
                    let is_weight = Some(k) == weight_index;
                    let is_bias = weight_index.is_some() && k == 2;
                    if !is_weight
                        && !is_bias
                        && !input.is_empty()
                        && editor.initializer(input).is_none()
                    {
                        push(input, &mut activations);
                    }
                }
                // Quantize after a following Relu/Clip rather than between,
                // so that the runtime can fuse the activation into the op.
                let mut out = n.output[0].clone();
                if let Some(next) = readers
                    .get(&out)
                    .filter(|r| r.len() == 1)
                    .map(|r| &editor.graph.node[r[0]])
                {
                    if matches!(next.op_type(), "Relu" | "Clip") {
                        out = next.output[0].clone();
                    }
                }
                if !(opts.float_outputs && graph_outputs.contains(&out)) {
                    push(&out, &mut activations);
                }
                quantized.push((i, kind));
            }
            Err(reason) if !PASS_THROUGH.contains(&n.op_type()) => left_in_float.push(FloatNode {
                node: node_label(i, n),
                op_type: n.op_type().to_string(),
                reason,
            }),
            Err(_) => {}
        }
    }
    Plan {
        quantized,
        activations,
        left_in_float,
    }
}

fn scalar_f32(v: f32) -> Tensor {
    Tensor::F32(ArrayD::from_elem(IxDyn(&[]), v))
}

fn vector_f32(v: Vec<f32>) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[v.len()]), v).expect("1-D shape matches"))
}

/// Quantizes `model` statically with the given activation ranges
/// (tensor name -> (min, max)), from [`calibration_targets`] + calibration.
pub fn quantize_static(
    model: &ir::ModelProto,
    ranges: &HashMap<String, (f32, f32)>,
    opts: &StaticOptions,
) -> Result<(ir::ModelProto, Report), QuantizeError> {
    let opset = default_opset(model);
    if opset < 10 {
        return Err(QuantizeError::OpsetTooOld(opset));
    }
    let mut opts = opts.clone();
    let mut notes = vec![];
    if opts.per_channel && opset < 13 {
        // Per-channel DequantizeLinear (the axis attribute) arrived in opset 13.
        opts.per_channel = false;
        notes.push(format!("opset {opset} < 13: weights quantized per tensor"));
    }
    let mut out = model.clone();
    let graph = out.graph.as_mut().ok_or(QuantizeError::NoGraph)?;
    let mut editor = Editor::new(graph);
    let plan = plan(&mut editor, &opts);
    let mut act_params: BTreeMap<String, (f32, u8)> = plan
        .activations
        .iter()
        .map(|t| {
            let (lo, hi) = ranges
                .get(t)
                .copied()
                .ok_or_else(|| QuantizeError::MissingRange(t.clone()))?;
            Ok((t.clone(), activation_params(lo, hi)))
        })
        .collect::<Result<_, QuantizeError>>()?;
    // Ops that only move or select values keep their input's parameters, so
    // the runtime can drop the DQ/Q pair around them and stay in int8.
    for n in editor.graph.node.iter() {
        if SAME_PARAMS.contains(&n.op_type()) {
            if let (Some(input), Some(output)) = (n.input.first(), n.output.first()) {
                if let (Some(&p), true) = (act_params.get(input), act_params.contains_key(output)) {
                    act_params.insert(output.clone(), p);
                }
            }
        }
    }

    let mut quantized_nodes = vec![];
    let mut new_nodes = vec![];
    for &(i, kind) in &plan.quantized {
        quantized_nodes.push(node_label(i, &editor.graph.node[i]));
        let Weighted::Weight { index, axis } = kind else {
            continue;
        };
        let n = editor.graph.node[i].clone();
        let w_name = n.input[index].clone();
        let Some(Tensor::F32(w)) = editor
            .initializer(&w_name)
            .map(|t| to_tensor(t, None))
            .transpose()?
        else {
            continue;
        };
        let (q, scales) = if opts.per_channel {
            quantize_per_channel(&w, axis)
        } else {
            let (q, s) = quantize_per_tensor(&w);
            (q, vec![s])
        };
        let per_channel = scales.len() > 1 || opts.per_channel;
        let wq = editor.add_initializer(&w_name, "_quantized", &Tensor::I8(q));
        let (ws, wzp) = if per_channel {
            let zeros = Tensor::I8(ArrayD::zeros(IxDyn(&[scales.len()])));
            (
                editor.add_initializer(&w_name, "_scale", &vector_f32(scales.clone())),
                editor.add_initializer(&w_name, "_zero_point", &zeros),
            )
        } else {
            let zero = Tensor::I8(ArrayD::zeros(IxDyn(&[])));
            (
                editor.add_initializer(&w_name, "_scale", &scalar_f32(scales[0])),
                editor.add_initializer(&w_name, "_zero_point", &zero),
            )
        };
        let wdq = editor.fresh(&w_name, "_dequantized");
        let mut dq = node(
            "DequantizeLinear",
            editor.fresh(&w_name, "_DequantizeLinear"),
            &[&wq, &ws, &wzp],
            &[&wdq],
        );
        if per_channel {
            dq.attribute.push(int_attr("axis", axis as i64));
        }
        new_nodes.push(dq);
        editor.graph.node[i].input[index] = wdq;
        editor.drop_if_unused(&w_name);

        // Bias as int32 at scale x_scale * w_scale, as the integer kernels expect.
        let unit_gemm = n.op_type() != "Gemm"
            || (attr_f(&n, "alpha").unwrap_or(1.0) == 1.0
                && attr_f(&n, "beta").unwrap_or(1.0) == 1.0);
        let x_scale = act_params.get(&n.input[0]).map(|p| p.0);
        if let (Some(b_name), Some(x_scale), true) =
            (n.input.get(2).filter(|b| !b.is_empty()), x_scale, unit_gemm)
        {
            if let Some(Tensor::F32(b)) = editor
                .initializer(b_name)
                .map(|t| to_tensor(t, None))
                .transpose()?
            {
                let channels = b.len();
                if b.ndim() == 1 && (scales.len() == channels || scales.len() == 1) {
                    let b_scales: Vec<f32> = (0..channels)
                        .map(|c| x_scale * scales[if scales.len() == 1 { 0 } else { c }])
                        .collect();
                    let bq: Vec<i32> = b
                        .iter()
                        .zip(&b_scales)
                        .map(|(v, s)| {
                            (v / s).round().clamp(i32::MIN as f32, i32::MAX as f32) as i32
                        })
                        .collect();
                    let b_name = b_name.clone();
                    let bq_name = editor.add_initializer(
                        &b_name,
                        "_quantized",
                        &Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[channels]), bq).expect("1-D")),
                    );
                    // One weight scale (per tensor, as before opset 13): a
                    // scalar bias scale too, since DequantizeLinear had no
                    // `axis` before opset 13.
                    let per_axis = scales.len() > 1;
                    let (bs_name, bz_name) = if per_axis {
                        (
                            editor.add_initializer(&b_name, "_scale", &vector_f32(b_scales)),
                            editor.add_initializer(
                                &b_name,
                                "_zero_point",
                                &Tensor::I32(ArrayD::zeros(IxDyn(&[channels]))),
                            ),
                        )
                    } else {
                        (
                            editor.add_initializer(&b_name, "_scale", &scalar_f32(b_scales[0])),
                            editor.add_initializer(
                                &b_name,
                                "_zero_point",
                                &Tensor::I32(ArrayD::zeros(IxDyn(&[]))),
                            ),
                        )
                    };
                    let bdq = editor.fresh(&b_name, "_dequantized");
                    let mut dq = node(
                        "DequantizeLinear",
                        editor.fresh(&b_name, "_DequantizeLinear"),
                        &[&bq_name, &bs_name, &bz_name],
                        &[&bdq],
                    );
                    if per_axis {
                        dq.attribute.push(int_attr("axis", 0));
                    }
                    new_nodes.push(dq);
                    editor.graph.node[i].input[2] = bdq;
                    editor.drop_if_unused(&b_name);
                }
            }
        }
    }

    for (t, (scale, zp)) in &act_params {
        let s = editor.add_initializer(t, "_scale", &scalar_f32(*scale));
        let z = editor.add_initializer(
            t,
            "_zero_point",
            &Tensor::U8(ArrayD::from_elem(IxDyn(&[]), *zp)),
        );
        let q_out = editor.fresh(t, "_quantized");
        let dq_out = editor.fresh(t, "_dequantized");
        let q_name = editor.fresh(t, "_QuantizeLinear");
        let dq_name = editor.fresh(t, "_DequantizeLinear");
        editor.rewire_consumers(t, &dq_out, &[]);
        new_nodes.push(node("QuantizeLinear", q_name, &[t, &s, &z], &[&q_out]));
        new_nodes.push(node(
            "DequantizeLinear",
            dq_name,
            &[&q_out, &s, &z],
            &[&dq_out],
        ));
    }
    editor.graph.node.extend(new_nodes);
    topological_sort(editor.graph);
    Ok((
        out,
        Report {
            quantized_nodes,
            left_in_float: plan.left_in_float,
            notes,
        },
    ))
}
