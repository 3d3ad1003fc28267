//! Graph-editing helpers shared by the quantizers: unique names, initializer
//! lookup, consumer rewiring, and small node and tensor builders.

use std::collections::{HashMap, HashSet};

use crate::onnx::{from_tensor, ir};
use crate::tensor::Tensor;

/// A graph being rewritten, with a name registry so that every tensor and
/// node this crate adds has a name nobody else uses.
pub(crate) struct Editor<'g> {
    pub graph: &'g mut ir::GraphProto,
    used: HashSet<String>,
}

impl<'g> Editor<'g> {
    pub fn new(graph: &'g mut ir::GraphProto) -> Self {
        let mut used = HashSet::new();
        for v in graph
            .input
            .iter()
            .chain(&graph.output)
            .chain(&graph.value_info)
        {
            used.insert(v.name().to_string());
        }
        for t in &graph.initializer {
            used.insert(t.name().to_string());
        }
        for n in &graph.node {
            used.insert(n.name().to_string());
            used.extend(n.input.iter().cloned());
            used.extend(n.output.iter().cloned());
        }
        Self { graph, used }
    }

    /// `base` with a suffix, made unique.
    pub fn fresh(&mut self, base: &str, suffix: &str) -> String {
        let mut name = format!("{base}{suffix}");
        let mut i = 1;
        while self.used.contains(&name) {
            name = format!("{base}{suffix}_{i}");
            i += 1;
        }
        self.used.insert(name.clone());
        name
    }

    pub fn initializer(&self, name: &str) -> Option<&ir::TensorProto> {
        self.graph.initializer.iter().find(|t| t.name() == name)
    }

    pub fn add_initializer(&mut self, base: &str, suffix: &str, t: &Tensor) -> String {
        let name = self.fresh(base, suffix);
        self.graph.initializer.push(from_tensor(&name, t));
        name
    }

    /// Removes an initializer if no node reads it any more.
    pub fn drop_if_unused(&mut self, name: &str) {
        let used = self
            .graph
            .node
            .iter()
            .any(|n| n.input.iter().any(|i| i == name))
            || self.graph.output.iter().any(|o| o.name() == name);
        if !used {
            self.graph.initializer.retain(|t| t.name() != name);
            // Pre-IR-4 models also list initializers as inputs.
            self.graph.input.retain(|i| i.name() != name);
        }
    }

    /// Makes every reader of `from` (other than nodes named in `except`)
    /// read `to` instead. Graph outputs keep their names.
    pub fn rewire_consumers(&mut self, from: &str, to: &str, except: &[&str]) {
        for node in &mut self.graph.node {
            if except.contains(&node.name()) {
                continue;
            }
            for input in &mut node.input {
                if input == from {
                    *input = to.to_string();
                }
            }
        }
    }
}

pub(crate) fn node(op: &str, name: String, inputs: &[&str], outputs: &[&str]) -> ir::NodeProto {
    let mut n = ir::NodeProto::new();
    n.set_op_type(op.to_string());
    n.set_name(name);
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = outputs.iter().map(|s| s.to_string()).collect();
    n
}

pub(crate) fn int_attr(name: &str, value: i64) -> ir::AttributeProto {
    let mut a = ir::AttributeProto::new();
    a.set_name(name.to_string());
    a.set_i(value);
    a.set_type(ir::attribute_proto::AttributeType::INT);
    a
}

pub(crate) fn attr_i(node: &ir::NodeProto, name: &str) -> Option<i64> {
    node.attribute
        .iter()
        .find(|a| a.name() == name)
        .and_then(|a| a.i)
}

pub(crate) fn attr_f(node: &ir::NodeProto, name: &str) -> Option<f32> {
    node.attribute
        .iter()
        .find(|a| a.name() == name)
        .and_then(|a| a.f)
}

/// Which nodes read each tensor.
pub(crate) fn consumers(graph: &ir::GraphProto) -> HashMap<String, Vec<usize>> {
    let mut map: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for input in &n.input {
            if !input.is_empty() {
                map.entry(input.clone()).or_default().push(i);
            }
        }
    }
    map
}

/// Sorts nodes so that each comes after the producers of its inputs (the
/// ONNX rule). Inserted Q/DQ nodes are appended, so a final sort is needed.
/// Stable: nodes already in order keep their relative order.
pub(crate) fn topological_sort(graph: &mut ir::GraphProto) {
    let produced: HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .collect();
    let mut available: HashSet<String> = HashSet::new();
    let mut pending: Vec<ir::NodeProto> = std::mem::take(&mut graph.node);
    let mut sorted = Vec::with_capacity(pending.len());
    loop {
        let before = pending.len();
        let mut rest = Vec::new();
        for n in pending {
            // Inputs nobody here produces (graph inputs, initializers, outer
            // scope) are always available.
            let ready = n
                .input
                .iter()
                .all(|i| i.is_empty() || !produced.contains(i) || available.contains(i));
            if ready {
                available.extend(n.output.iter().cloned());
                sorted.push(n);
            } else {
                rest.push(n);
            }
        }
        pending = rest;
        if pending.is_empty() || pending.len() == before {
            // A cycle would be a bug upstream; keep the leftovers in order
            // and let validation report it.
            sorted.extend(pending);
            break;
        }
    }
    graph.node = sorted;
}

/// The opset of the default domain.
pub(crate) fn default_opset(model: &ir::ModelProto) -> i64 {
    crate::onnx::default_opset(model).unwrap_or(0)
}
