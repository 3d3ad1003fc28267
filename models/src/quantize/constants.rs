//! Weights held in `Constant` nodes become initializers before quantizing.
//!
//! Exporters differ: PyTorch and tf2onnx write weights as initializers,
//! PaddlePaddle (and PyTorch for some folded values) as `Constant` nodes.
//! The quantizers look for weights among the initializers, so a model with
//! no initializers quantized nothing. Hoisting is exact: a `Constant` with a
//! tensor `value` and an initializer of the same name are the same value.

use super::Report;
use crate::onnx::ir;

/// Moves every main-graph `Constant` node with a tensor `value` into an
/// initializer named after its output. Subgraphs (If/Loop bodies) are left
/// as they are. Models older than IR version 4, where every initializer must
/// also be a graph input, are returned unchanged.
pub fn hoist_constants(model: &ir::ModelProto) -> (ir::ModelProto, Report) {
    let mut out = model.clone();
    let mut report = Report::default();
    if model.ir_version() < 4 {
        report.notes.push(format!(
            "IR version {} needs initializers to be graph inputs: Constant nodes left as they are",
            model.ir_version()
        ));
        return (out, report);
    }
    let Some(graph) = out.graph.as_mut() else {
        return (out, report);
    };
    let mut kept = Vec::with_capacity(graph.node.len());
    for node in std::mem::take(&mut graph.node) {
        let tensor = (node.op_type() == "Constant"
            && matches!(node.domain(), "" | "ai.onnx")
            && node.output.len() == 1
            && node.attribute.len() == 1)
            .then(|| node.attribute.first())
            .flatten()
            .filter(|a| a.name() == "value")
            .and_then(|a| a.t.as_ref());
        match tensor {
            Some(t) => {
                let mut t = t.clone();
                t.set_name(node.output[0].clone());
                graph.initializer.push(t);
                report.quantized_nodes.push(node.output[0].clone());
            }
            None => kept.push(node),
        }
    }
    graph.node = kept;
    if !report.quantized_nodes.is_empty() {
        report.notes.push(format!(
            "{} Constant nodes became initializers",
            report.quantized_nodes.len()
        ));
    }
    (out, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::{self, from_tensor};
    use crate::tensor::Tensor;
    use ndarray::ArrayD;

    fn constant(name: &str, values: Vec<f32>) -> ir::NodeProto {
        let t = from_tensor(
            name,
            &Tensor::F32(ArrayD::from_shape_vec(vec![values.len()], values).unwrap()),
        );
        let mut a = ir::AttributeProto::new();
        a.set_name("value".into());
        a.set_type(ir::attribute_proto::AttributeType::TENSOR);
        a.t = Some(t).into();
        let mut n = ir::NodeProto::new();
        n.set_op_type("Constant".into());
        n.output.push(name.into());
        n.attribute.push(a);
        n
    }

    #[test]
    fn tensor_constants_become_initializers_and_others_stay() {
        let mut m = ir::ModelProto::new();
        m.set_ir_version(8);
        let g = m.graph.mut_or_insert_default();
        g.node.push(constant("w", vec![1.0, 2.0]));
        let mut add = ir::NodeProto::new();
        add.set_op_type("Add".into());
        add.input.extend(["x".to_string(), "w".to_string()]);
        add.output.push("y".into());
        g.node.push(add);
        let (h, report) = hoist_constants(&m);
        let g = h.graph.as_ref().unwrap();
        assert_eq!(g.node.len(), 1);
        assert_eq!(g.node[0].op_type(), "Add");
        assert_eq!(g.initializer.len(), 1);
        assert_eq!(g.initializer[0].name(), "w");
        assert_eq!(report.quantized_nodes, vec!["w".to_string()]);
        assert!(!onnx::encode(&h).unwrap().is_empty());

        let mut old = m.clone();
        old.set_ir_version(3);
        let (same, report) = hoist_constants(&old);
        assert_eq!(same, old);
        assert!(report.notes[0].contains("IR version 3"));
    }
}
