//! Structural checks. Each error names the node or tensor at fault.

use std::collections::HashSet;
use std::path::Path;

use super::inspect::dtype_bits;
use super::ir;
use super::tensor::{element_count, external_ref, TensorError};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValidationError {
    #[error("model has no graph")]
    NoGraph,
    #[error("model declares no opset")]
    NoOpset,
    #[error("{node}: domain {domain:?} has no opset import")]
    UndeclaredDomain { node: String, domain: String },
    #[error("ir_version {0} is not supported (need 3 or later)")]
    IrVersion(i64),
    #[error("{node}: op_type is empty")]
    EmptyOpType { node: String },
    #[error("{node}: has no outputs (every operator produces at least one)")]
    NoOutputs { node: String },
    #[error("{node}: has {got} inputs, but {op} takes at least {min}")]
    TooFewInputs {
        node: String,
        op: String,
        min: usize,
        got: usize,
    },
    #[error(
        "{node}: input {input:?} is not a graph input, an initializer, or an earlier node's output"
    )]
    UndefinedInput { node: String, input: String },
    #[error("{node}: output {name:?} is already produced elsewhere (names must be assigned once)")]
    DuplicateName { node: String, name: String },
    #[error("graph output {0:?} is never produced")]
    UnproducedOutput(String),
    #[error("a {0} has no name")]
    Unnamed(&'static str),
    #[error("{value:?}: element type {code} is not an ONNX type")]
    BadElementType { value: String, code: i32 },
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// Standard operators' least number of inputs, for those this crate's
/// quantizers and inspectors read by position: a model that gives fewer is
/// refused here, naming the node, instead of failing deeper in.
const MIN_INPUTS: [(&str, usize); 16] = [
    ("Add", 2),
    ("AveragePool", 1),
    ("Cast", 1),
    ("Clip", 1),
    ("Conv", 2),
    ("ConvTranspose", 2),
    ("Div", 2),
    ("Gemm", 2),
    ("GlobalAveragePool", 1),
    ("MatMul", 2),
    ("MaxPool", 1),
    ("Mul", 2),
    ("Relu", 1),
    ("Softmax", 1),
    ("Sub", 2),
    ("Transpose", 1),
];

fn check_arity(node: &ir::NodeProto, label: impl Fn() -> String) -> Result<(), ValidationError> {
    // An empty name marks an omitted optional output; one must be there.
    if node.output.iter().all(|o| o.is_empty()) {
        return Err(ValidationError::NoOutputs { node: label() });
    }
    if canonical_domain(node.domain()).is_empty() {
        if let Some((op, min)) = MIN_INPUTS.iter().find(|(op, _)| *op == node.op_type()) {
            if node.input.len() < *min {
                return Err(ValidationError::TooFewInputs {
                    node: label(),
                    op: op.to_string(),
                    min: *min,
                    got: node.input.len(),
                });
            }
        }
    }
    Ok(())
}

/// The highest `TensorProto.DataType` code known (INT2 in ONNX 1.18+).
const MAX_ELEMENT_TYPE: i32 = 26;

struct Checker<'a> {
    model_dir: Option<&'a Path>,
    /// Declared opset domains, with "ai.onnx" spelled "".
    domains: HashSet<String>,
}

fn canonical_domain(d: &str) -> &str {
    if d == "ai.onnx" {
        ""
    } else {
        d
    }
}

fn node_label(index: usize, node: &ir::NodeProto) -> String {
    if node.name().is_empty() {
        format!("node #{index} ({})", node.op_type())
    } else {
        format!("node #{index} {:?} ({})", node.name(), node.op_type())
    }
}

fn check_elem_type(value: &str, code: i32) -> Result<(), ValidationError> {
    // 0 (undefined) is allowed in value_info: it means "not known yet".
    if (0..=MAX_ELEMENT_TYPE).contains(&code) {
        Ok(())
    } else {
        Err(ValidationError::BadElementType {
            value: value.to_string(),
            code,
        })
    }
}

fn check_value_info(v: &ir::ValueInfoProto, what: &'static str) -> Result<(), ValidationError> {
    if v.name().is_empty() {
        return Err(ValidationError::Unnamed(what));
    }
    if let Some(ir::type_proto::Value::TensorType(t)) =
        v.type_.as_ref().and_then(|t| t.value.as_ref())
    {
        check_elem_type(v.name(), t.elem_type())?;
    }
    Ok(())
}

impl Checker<'_> {
    /// Checks the initializer's data against its dims without reading or
    /// allocating it (except for external data's file size).
    fn check_initializer(&self, t: &ir::TensorProto) -> Result<(), ValidationError> {
        let name = t.name().to_string();
        if name.is_empty() {
            return Err(ValidationError::Unnamed("initializer"));
        }
        check_elem_type(&name, t.data_type())?;
        let count = element_count(&t.dims).ok_or_else(|| TensorError::BadDims {
            tensor: name.clone(),
            dims: t.dims.clone(),
        })?;
        let mismatch = |actual: u64| TensorError::DataMismatch {
            tensor: name.clone(),
            declared: count,
            actual,
        };
        let Some(bits) = dtype_bits(t.data_type()) else {
            // Strings: one entry per element.
            if t.string_data.len() as u64 != count {
                return Err(mismatch(t.string_data.len() as u64).into());
            }
            return Ok(());
        };
        let bytes_needed = count
            .checked_mul(bits)
            .map(|b| b.div_ceil(8))
            .ok_or_else(|| TensorError::BadDims {
                tensor: name.clone(),
                dims: t.dims.clone(),
            })?;
        if let Some(ext) = external_ref(t)? {
            if let Some(dir) = self.model_dir {
                let path = dir.join(&ext.location);
                let len = std::fs::metadata(&path)
                    .map_err(|e| TensorError::External {
                        tensor: name.clone(),
                        reason: format!("{}: {e}", path.display()),
                    })?
                    .len();
                let want = ext.length.unwrap_or(bytes_needed);
                if want != bytes_needed || ext.offset.checked_add(want).is_none_or(|end| end > len)
                {
                    return Err(TensorError::External {
                        tensor: name,
                        reason: format!(
                            "needs {bytes_needed} bytes at offset {} of {}, which holds {len}",
                            ext.offset,
                            path.display()
                        ),
                    }
                    .into());
                }
            }
            return Ok(());
        }
        if let Some(raw) = &t.raw_data {
            if raw.len() as u64 != bytes_needed {
                return Err(mismatch((raw.len() as u64 * 8) / bits).into());
            }
            return Ok(());
        }
        let typed = [
            t.float_data.len(),
            t.int32_data.len(),
            t.int64_data.len(),
            t.double_data.len(),
            t.uint64_data.len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0) as u64;
        // Sub-byte types pack 8/bits elements into each entry, padding the last.
        let per_entry = if bits < 8 { 8 / bits } else { 1 };
        let typed_elements = typed * per_entry;
        let ok = typed_elements >= count && typed_elements < count + per_entry;
        if !ok {
            return Err(mismatch(typed_elements).into());
        }
        Ok(())
    }

    fn check_graph(
        &self,
        graph: &ir::GraphProto,
        outer: &HashSet<String>,
    ) -> Result<(), ValidationError> {
        let mut defined: HashSet<String> = outer.clone();
        for input in &graph.input {
            check_value_info(input, "graph input")?;
            defined.insert(input.name().to_string());
        }
        for t in &graph.initializer {
            self.check_initializer(t)?;
            defined.insert(t.name().to_string());
        }
        for t in &graph.sparse_initializer {
            if let Some(v) = t.values.as_ref() {
                defined.insert(v.name().to_string());
            }
        }
        for v in &graph.value_info {
            check_value_info(v, "value_info entry")?;
        }
        let mut produced: HashSet<String> = HashSet::new();
        for (index, node) in graph.node.iter().enumerate() {
            let label = || node_label(index, node);
            if node.op_type().is_empty() {
                return Err(ValidationError::EmptyOpType { node: label() });
            }
            if !self.domains.contains(canonical_domain(node.domain())) {
                return Err(ValidationError::UndeclaredDomain {
                    node: label(),
                    domain: node.domain().to_string(),
                });
            }
            check_arity(node, label)?;
            for input in &node.input {
                // "" marks an omitted optional input.
                if !input.is_empty() && !defined.contains(input) {
                    return Err(ValidationError::UndefinedInput {
                        node: label(),
                        input: input.clone(),
                    });
                }
            }
            // Subgraphs see everything defined so far.
            for attr in &node.attribute {
                for g in attr.g.as_ref().into_iter().chain(attr.graphs.iter()) {
                    self.check_graph(g, &defined)?;
                }
                if let Some(t) = attr.t.as_ref() {
                    self.check_initializer_like(t, &label())?;
                }
            }
            for output in &node.output {
                if output.is_empty() {
                    continue;
                }
                if !produced.insert(output.clone())
                    || graph.initializer.iter().any(|t| t.name() == output)
                {
                    return Err(ValidationError::DuplicateName {
                        node: label(),
                        name: output.clone(),
                    });
                }
                defined.insert(output.clone());
            }
        }
        for output in &graph.output {
            check_value_info(output, "graph output")?;
            if !defined.contains(output.name()) {
                return Err(ValidationError::UnproducedOutput(output.name().to_string()));
            }
        }
        Ok(())
    }

    /// Tensor-valued attributes (e.g. Constant's `value`) may be unnamed.
    fn check_initializer_like(
        &self,
        t: &ir::TensorProto,
        node: &str,
    ) -> Result<(), ValidationError> {
        if t.name().is_empty() {
            let mut named = t.clone();
            named.set_name(format!("{node} attribute"));
            return self.check_initializer(&named);
        }
        self.check_initializer(t)
    }
}

/// Checks a model's structure. `model_dir` lets external data be checked
/// against the files it points at.
pub fn validate(model: &ir::ModelProto, model_dir: Option<&Path>) -> Result<(), ValidationError> {
    if model.ir_version() < 3 {
        return Err(ValidationError::IrVersion(model.ir_version()));
    }
    if model.opset_import.is_empty() {
        return Err(ValidationError::NoOpset);
    }
    let graph = model.graph.as_ref().ok_or(ValidationError::NoGraph)?;
    // Model-local functions act as ops in their own domains.
    let domains = model
        .opset_import
        .iter()
        .map(|o| canonical_domain(o.domain()).to_string())
        .chain(
            model
                .functions
                .iter()
                .map(|f| canonical_domain(f.domain()).to_string()),
        )
        .collect();
    Checker { model_dir, domains }.check_graph(graph, &HashSet::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::ir;

    fn value(name: &str) -> ir::ValueInfoProto {
        let mut v = ir::ValueInfoProto::new();
        v.set_name(name.into());
        let t = v.type_.mut_or_insert_default();
        let mut tt = ir::type_proto::Tensor::new();
        tt.set_elem_type(1);
        t.value = Some(ir::type_proto::Value::TensorType(tt));
        v
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> ir::NodeProto {
        let mut n = ir::NodeProto::new();
        n.set_op_type(op.into());
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = outputs.iter().map(|s| s.to_string()).collect();
        n
    }

    fn model(nodes: Vec<ir::NodeProto>, outputs: &[&str]) -> ir::ModelProto {
        let mut m = ir::ModelProto::new();
        m.set_ir_version(8);
        let mut o = ir::OperatorSetIdProto::new();
        o.set_version(17);
        m.opset_import.push(o);
        let g = m.graph.mut_or_insert_default();
        g.input.push(value("x"));
        g.node = nodes;
        g.output = outputs.iter().map(|n| value(n)).collect();
        let mut w = ir::TensorProto::new();
        w.set_name("w".into());
        w.set_data_type(1);
        w.dims = vec![2];
        w.set_raw_data(vec![0; 8]);
        g.initializer.push(w);
        m
    }

    #[test]
    fn a_good_model_passes() {
        let m = model(
            vec![
                node("Add", &["x", "w"], &["s"]),
                node("Relu", &["s"], &["y"]),
            ],
            &["y"],
        );
        assert_eq!(validate(&m, None), Ok(()));
    }

    #[test]
    fn each_fault_names_what_is_at_fault() {
        let undefined = model(vec![node("Relu", &["nope"], &["y"])], &["y"]);
        assert_eq!(
            validate(&undefined, None),
            Err(ValidationError::UndefinedInput {
                node: "node #0 (Relu)".into(),
                input: "nope".into()
            })
        );
        let out_of_order = model(
            vec![node("Relu", &["s"], &["y"]), node("Relu", &["x"], &["s"])],
            &["y"],
        );
        assert!(matches!(
            validate(&out_of_order, None),
            Err(ValidationError::UndefinedInput { .. })
        ));
        let twice = model(
            vec![node("Relu", &["x"], &["y"]), node("Relu", &["x"], &["y"])],
            &["y"],
        );
        assert!(
            matches!(validate(&twice, None), Err(ValidationError::DuplicateName { name, .. }) if name == "y")
        );
        let unproduced = model(vec![node("Relu", &["x"], &["y"])], &["z"]);
        assert_eq!(
            validate(&unproduced, None),
            Err(ValidationError::UnproducedOutput("z".into()))
        );
        let empty_op = model(vec![node("", &["x"], &["y"])], &["y"]);
        assert!(matches!(
            validate(&empty_op, None),
            Err(ValidationError::EmptyOpType { .. })
        ));

        let mut no_opset = model(vec![node("Relu", &["x"], &["y"])], &["y"]);
        no_opset.opset_import.clear();
        assert_eq!(validate(&no_opset, None), Err(ValidationError::NoOpset));
        let mut custom = model(vec![node("Relu", &["x"], &["y"])], &["y"]);
        custom.graph.mut_or_insert_default().node[0].set_domain("com.example".into());
        assert!(
            matches!(validate(&custom, None), Err(ValidationError::UndeclaredDomain { domain, .. }) if domain == "com.example")
        );
        let mut old = no_opset.clone();
        old.set_ir_version(2);
        assert_eq!(validate(&old, None), Err(ValidationError::IrVersion(2)));
        let mut no_graph = model(vec![], &[]);
        no_graph.graph.clear();
        assert_eq!(validate(&no_graph, None), Err(ValidationError::NoGraph));

        // A node must produce something, and a standard op gets its inputs.
        let mut silent = model(vec![node("Relu", &["x"], &["y"])], &["y"]);
        silent.graph.as_mut().unwrap().node[0].output.clear();
        assert!(
            matches!(
                validate(&silent, None),
                Err(ValidationError::NoOutputs { .. })
            ),
            "{:?}",
            validate(&silent, None)
        );
        let mut only_empty = model(vec![node("Relu", &["x"], &["y"])], &["y"]);
        only_empty.graph.as_mut().unwrap().node[0].output = vec![String::new()];
        assert!(matches!(
            validate(&only_empty, None),
            Err(ValidationError::NoOutputs { .. })
        ));
        let one_armed = model(vec![node("MatMul", &["x"], &["y"])], &["y"]);
        assert_eq!(
            validate(&one_armed, None),
            Err(ValidationError::TooFewInputs {
                node: "node #0 (MatMul)".into(),
                op: "MatMul".into(),
                min: 2,
                got: 1
            })
        );
        // Another domain's op of the same name is its own business.
        let mut custom_matmul = model(vec![node("MatMul", &["x"], &["y"])], &["y"]);
        let mut o = ir::OperatorSetIdProto::new();
        o.set_domain("com.example".into());
        o.set_version(1);
        custom_matmul.opset_import.push(o);
        custom_matmul.graph.as_mut().unwrap().node[0].set_domain("com.example".into());
        assert_eq!(validate(&custom_matmul, None), Ok(()));

        let mut short = model(vec![node("Relu", &["x"], &["y"])], &["y"]);
        short.graph.mut_or_insert_default().initializer[0].set_raw_data(vec![0; 7]);
        assert!(
            matches!(validate(&short, None), Err(ValidationError::Tensor(TensorError::DataMismatch { tensor, .. })) if tensor == "w")
        );
        let mut bomb = short.clone();
        bomb.graph.mut_or_insert_default().initializer[0].dims = vec![i64::MAX, 4];
        assert!(matches!(
            validate(&bomb, None),
            Err(ValidationError::Tensor(TensorError::BadDims { .. }))
        ));
    }

    #[test]
    fn external_data_must_stay_in_the_model_dir() {
        let mut m = model(vec![node("Relu", &["x"], &["y"])], &["y"]);
        let w = &mut m.graph.mut_or_insert_default().initializer[0];
        w.raw_data = None;
        w.set_data_location(ir::tensor_proto::DataLocation::EXTERNAL);
        let mut loc = ir::StringStringEntryProto::new();
        loc.set_key("location".into());
        loc.set_value("../../etc/shadow".into());
        w.external_data.push(loc);
        assert!(
            matches!(validate(&m, None), Err(ValidationError::Tensor(TensorError::External { tensor, .. })) if tensor == "w")
        );

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w.bin"), [0u8; 8]).unwrap();
        let w = &mut m.graph.mut_or_insert_default().initializer[0];
        w.external_data[0].set_value("w.bin".into());
        assert_eq!(validate(&m, Some(dir.path())), Ok(()));
        std::fs::write(dir.path().join("w.bin"), [0u8; 4]).unwrap();
        assert!(matches!(
            validate(&m, Some(dir.path())),
            Err(ValidationError::Tensor(TensorError::External { .. }))
        ));
    }

    #[test]
    fn subgraphs_see_the_outer_scope() {
        let mut then_g = ir::GraphProto::new();
        then_g.node.push(node("Relu", &["x"], &["t"]));
        then_g.output.push(value("t"));
        let mut if_node = node("If", &["cond"], &["y"]);
        let mut attr = ir::AttributeProto::new();
        attr.set_name("then_branch".into());
        attr.g = protobuf::MessageField::some(then_g.clone());
        if_node.attribute.push(attr);
        let mut m = model(vec![if_node], &["y"]);
        m.graph.mut_or_insert_default().input.push(value("cond"));
        assert_eq!(validate(&m, None), Ok(()));
        then_g.node[0].input[0] = "inner_only".into();
        m.graph.mut_or_insert_default().node[0].attribute[0].g =
            protobuf::MessageField::some(then_g);
        assert!(
            matches!(validate(&m, None), Err(ValidationError::UndefinedInput { input, .. }) if input == "inner_only")
        );
    }
}
