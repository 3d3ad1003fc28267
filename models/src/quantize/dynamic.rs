//! Dynamic int8 quantization for MatMul/Gemm-heavy models: weights become
//! int8 (per output column) ahead of time; activations are quantized at run
//! time by DynamicQuantizeLinear. The pattern DynamicQuantizeLinear ->
//! MatMulInteger -> Cast -> Mul is what ONNX Runtime fuses into its dynamic
//! int8 GEMM kernel.

use ndarray::{ArrayD, IxDyn};

use super::graph::{attr_f, attr_i, default_opset, int_attr, node, topological_sort, Editor};
use super::params::{quantize_per_channel, quantize_per_tensor};
use super::{FloatNode, QuantizeError, Report};
use crate::onnx::{ir, to_tensor};
use crate::tensor::Tensor;

#[derive(Debug, Clone)]
pub struct DynamicOptions {
    /// One scale per output column instead of one per weight tensor.
    pub per_channel: bool,
    pub exclude: Vec<String>,
}

impl Default for DynamicOptions {
    fn default() -> Self {
        Self {
            per_channel: true,
            exclude: vec![],
        }
    }
}

/// A MatMul-shaped node: `y = alpha * x @ w + beta * bias`, with `w` [K, N].
struct Candidate {
    index: usize,
    x: String,
    w: ArrayD<f32>,
    w_name: String,
    alpha: f32,
    bias: Option<(String, f32)>,
    y: String,
}

fn candidate(editor: &Editor<'_>, i: usize, n: &ir::NodeProto) -> Result<Candidate, String> {
    let w_name = n.input.get(1).cloned().unwrap_or_default();
    let w = match editor.initializer(&w_name).map(|t| to_tensor(t, None)) {
        Some(Ok(Tensor::F32(w))) if w.ndim() == 2 => w,
        _ => return Err("weight is not a constant 2-D float tensor".into()),
    };
    // Validation refuses such nodes; a model that skipped it is left as is.
    let (Some(x), Some(y)) = (n.input.first(), n.output.first()) else {
        return Err("the node has no input or no output".into());
    };
    let base = Candidate {
        index: i,
        x: x.clone(),
        w,
        w_name,
        alpha: 1.0,
        bias: None,
        y: y.clone(),
    };
    match n.op_type() {
        "MatMul" => Ok(base),
        "Gemm" => {
            if attr_i(n, "transA").unwrap_or(0) != 0 {
                return Err("Gemm with transA is not quantized".into());
            }
            let w = if attr_i(n, "transB").unwrap_or(0) != 0 {
                base.w.t().to_owned()
            } else {
                base.w.clone()
            };
            let bias = n
                .input
                .get(2)
                .filter(|b| !b.is_empty())
                .map(|b| (b.clone(), attr_f(n, "beta").unwrap_or(1.0)));
            Ok(Candidate {
                w,
                alpha: attr_f(n, "alpha").unwrap_or(1.0),
                bias,
                ..base
            })
        }
        op => Err(format!("{op} is not quantized dynamically")),
    }
}

pub fn quantize_dynamic(
    model: &ir::ModelProto,
    opts: &DynamicOptions,
) -> Result<(ir::ModelProto, Report), QuantizeError> {
    let opset = default_opset(model);
    if opset < 10 {
        return Err(QuantizeError::OpsetTooOld(opset));
    }
    let mut out = model.clone();
    let graph = out.graph.as_mut().ok_or(QuantizeError::NoGraph)?;
    let mut editor = Editor::new(graph);
    let mut report = Report::default();
    let mut replaced = vec![];
    let mut new_nodes = vec![];
    let mut uses_contrib = false;
    for i in 0..editor.graph.node.len() {
        let n = editor.graph.node[i].clone();
        if n.op_type() == "LSTM" && matches!(n.domain(), "" | "ai.onnx") {
            let label = if n.name().is_empty() {
                format!("#{i} LSTM")
            } else {
                n.name().to_string()
            };
            if opts.exclude.iter().any(|e| e == n.name()) {
                report.left_in_float.push(FloatNode {
                    node: label,
                    op_type: "LSTM".into(),
                    reason: "excluded by request".into(),
                });
                continue;
            }
            match quantize_lstm(&mut editor, i) {
                Ok(()) => {
                    uses_contrib = true;
                    report.quantized_nodes.push(label);
                }
                Err(reason) => report.left_in_float.push(FloatNode {
                    node: label,
                    op_type: "LSTM".into(),
                    reason,
                }),
            }
            continue;
        }
        if !matches!(n.op_type(), "MatMul" | "Gemm") || !matches!(n.domain(), "" | "ai.onnx") {
            continue;
        }
        let label = if n.name().is_empty() {
            format!("#{i} {}", n.op_type())
        } else {
            n.name().to_string()
        };
        if opts.exclude.iter().any(|e| e == n.name()) {
            report.left_in_float.push(FloatNode {
                node: label,
                op_type: n.op_type().to_string(),
                reason: "excluded by request".into(),
            });
            continue;
        }
        let c = match candidate(&editor, i, &n) {
            Ok(c) => c,
            Err(reason) => {
                report.left_in_float.push(FloatNode {
                    node: label,
                    op_type: n.op_type().to_string(),
                    reason,
                });
                continue;
            }
        };
        // Column scales: axis 1 of w [K, N].
        let (wq, scales) = if opts.per_channel {
            quantize_per_channel(&c.w, 1)
        } else {
            let (q, s) = quantize_per_tensor(&c.w);
            (q, vec![s])
        };
        let base = c.w_name.clone();
        let wq_name = editor.add_initializer(&base, "_quantized", &Tensor::I8(wq));
        let wzp =
            editor.add_initializer(&base, "_zero_point", &Tensor::I8(ArrayD::zeros(IxDyn(&[]))));
        let scaled: Vec<f32> = scales.iter().map(|s| s * c.alpha).collect();
        let ws_name = editor.add_initializer(
            &base,
            "_scale",
            &Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[scaled.len()]), scaled).expect("1-D")),
        );

        let xq = editor.fresh(&c.x, "_quantized");
        let xs = editor.fresh(&c.x, "_scale");
        let xz = editor.fresh(&c.x, "_zero_point");
        new_nodes.push(node(
            "DynamicQuantizeLinear",
            editor.fresh(&c.x, "_DynamicQuantizeLinear"),
            &[&c.x],
            &[&xq, &xs, &xz],
        ));
        let acc = editor.fresh(&c.y, "_int32");
        new_nodes.push(node(
            "MatMulInteger",
            editor.fresh(&c.y, "_MatMulInteger"),
            &[&xq, &wq_name, &xz, &wzp],
            &[&acc],
        ));
        let accf = editor.fresh(&c.y, "_float");
        let mut cast = node("Cast", editor.fresh(&c.y, "_Cast"), &[&acc], &[&accf]);
        cast.attribute.push(int_attr("to", 1));
        new_nodes.push(cast);
        let scale = editor.fresh(&c.y, "_output_scale");
        new_nodes.push(node(
            "Mul",
            editor.fresh(&c.y, "_ScaleMul"),
            &[&xs, &ws_name],
            &[&scale],
        ));
        match c.bias {
            None => new_nodes.push(node(
                "Mul",
                editor.fresh(&c.y, "_Mul"),
                &[&accf, &scale],
                &[&c.y],
            )),
            Some((bias, beta)) => {
                let unbiased = editor.fresh(&c.y, "_unbiased");
                new_nodes.push(node(
                    "Mul",
                    editor.fresh(&c.y, "_Mul"),
                    &[&accf, &scale],
                    &[&unbiased],
                ));
                let bias_in = if beta == 1.0 {
                    bias
                } else {
                    let b = editor.add_initializer(
                        &c.y,
                        "_beta",
                        &Tensor::F32(ArrayD::from_elem(IxDyn(&[]), beta)),
                    );
                    let scaled = editor.fresh(&bias, "_scaled");
                    new_nodes.push(node(
                        "Mul",
                        editor.fresh(&bias, "_BetaMul"),
                        &[&bias, &b],
                        &[&scaled],
                    ));
                    scaled
                };
                new_nodes.push(node(
                    "Add",
                    editor.fresh(&c.y, "_Add"),
                    &[&unbiased, &bias_in],
                    &[&c.y],
                ));
            }
        }
        report.quantized_nodes.push(label);
        replaced.push((c.index, base));
    }
    // Remove replaced nodes (highest index first), then their float weights.
    replaced.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (index, _) in &replaced {
        editor.graph.node.remove(*index);
    }
    editor.graph.node.extend(new_nodes);
    for (_, w) in &replaced {
        editor.drop_if_unused(w);
    }
    topological_sort(editor.graph);
    if uses_contrib && !out.opset_import.iter().any(|o| o.domain() == MS_DOMAIN) {
        let mut o = ir::OperatorSetIdProto::new();
        o.set_domain(MS_DOMAIN.into());
        o.set_version(1);
        out.opset_import.push(o);
    }
    Ok((out, report))
}

/// ONNX Runtime's contrib domain, home of DynamicQuantizeLSTM.
const MS_DOMAIN: &str = "com.microsoft";

/// Per-direction symmetric int8 for an LSTM weight [D, 4H, K], transposed
/// to the [D, K, 4H] layout DynamicQuantizeLSTM expects.
fn lstm_weight(editor: &mut Editor<'_>, name: &str) -> Result<(String, String, String), String> {
    let w = match editor.initializer(name).map(|t| to_tensor(t, None)) {
        Some(Ok(Tensor::F32(w))) if w.ndim() == 3 => w,
        _ => return Err(format!("{name} is not a constant 3-D float tensor")),
    };
    let t = w
        .permuted_axes(vec![0, 2, 1])
        .as_standard_layout()
        .to_owned();
    let (q, scales) = quantize_per_channel(&t, 0);
    let dirs = scales.len();
    let q_name = editor.add_initializer(name, "_quantized", &Tensor::I8(q));
    let s_name = editor.add_initializer(
        name,
        "_scale",
        &Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[dirs]), scales).expect("1-D")),
    );
    let z_name = editor.add_initializer(
        name,
        "_zero_point",
        &Tensor::I8(ArrayD::zeros(IxDyn(&[dirs]))),
    );
    Ok((q_name, s_name, z_name))
}

/// Replaces LSTM node `i` with com.microsoft DynamicQuantizeLSTM: int8
/// weights, activations quantized inside the kernel at run time.
fn quantize_lstm(editor: &mut Editor<'_>, i: usize) -> Result<(), String> {
    let n = editor.graph.node[i].clone();
    if attr_i(&n, "layout").unwrap_or(0) != 0 {
        return Err("batch-major layout is not supported by DynamicQuantizeLSTM".into());
    }
    let input = |k: usize| n.input.get(k).cloned().unwrap_or_default();
    let (w, r) = (input(1), input(2));
    // Check both before adding anything, so a refusal leaves the graph as it was.
    for name in [&w, &r] {
        if !matches!(
            editor
                .initializer(name)
                .map(|t| (t.data_type(), t.dims.len())),
            Some((1, 3))
        ) {
            return Err(format!("{name} is not a constant 3-D float tensor"));
        }
    }
    let (wq, ws, wz) = lstm_weight(editor, &w)?;
    let (rq, rs, rz) = lstm_weight(editor, &r)?;
    let node = &mut editor.graph.node[i];
    node.set_op_type("DynamicQuantizeLSTM".into());
    node.set_domain(MS_DOMAIN.into());
    node.input = vec![
        input(0),
        wq,
        rq,
        input(3),
        input(4),
        input(5),
        input(6),
        input(7),
        ws,
        wz,
        rs,
        rz,
    ];
    editor.drop_if_unused(&w);
    editor.drop_if_unused(&r);
    Ok(())
}
