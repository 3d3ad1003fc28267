//! What is in a model: versions, signature, ops, parameters.

use std::collections::BTreeMap;

use serde::Serialize;

use super::ir;
use super::tensor::{element_count, external_ref};

/// A dimension of a declared shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Dim {
    Fixed(i64),
    /// A named dimension such as `batch`.
    Symbolic(String),
    Unknown,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Symbolic(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValueSummary {
    pub name: String,
    /// `float32`, `int64`, ... or `sequence`, `map`, `unknown`.
    pub dtype: String,
    /// None when the shape is not declared at all.
    pub shape: Option<Vec<Dim>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExternalData {
    pub tensor: String,
    pub location: String,
    pub offset: u64,
    pub length: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    pub ir_version: i64,
    /// Domain ("" = ai.onnx) to version.
    pub opsets: BTreeMap<String, i64>,
    pub producer: String,
    pub graph_name: String,
    pub inputs: Vec<ValueSummary>,
    pub outputs: Vec<ValueSummary>,
    /// Op type to count, subgraphs included.
    pub op_histogram: BTreeMap<String, usize>,
    pub node_count: usize,
    pub initializer_count: usize,
    /// Elements in all initializers.
    pub parameter_count: u64,
    /// Initializer bytes by element type.
    pub bytes_by_dtype: BTreeMap<String, u64>,
    pub external_data: Vec<ExternalData>,
    pub metadata: BTreeMap<String, String>,
}

/// The ONNX element type's name, NumPy-style where there is one.
pub fn dtype_name(code: i32) -> String {
    let name = match code {
        1 => "float32",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "float64",
        12 => "uint32",
        13 => "uint64",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17 => "float8e4m3fn",
        18 => "float8e4m3fnuz",
        19 => "float8e5m2",
        20 => "float8e5m2fnuz",
        21 => "uint4",
        22 => "int4",
        23 => "float4e2m1",
        24 => "float8e8m0",
        25 => "uint2",
        26 => "int2",
        other => return format!("unknown({other})"),
    };
    name.to_string()
}

/// Bytes per element as bits, for fixed-size types (strings have none).
pub(crate) fn dtype_bits(code: i32) -> Option<u64> {
    Some(match code {
        1 | 6 | 12 => 32,
        2 | 3 | 9 | 17..=20 | 24 => 8,
        4 | 5 | 10 | 16 => 16,
        7 | 11 | 13 | 14 => 64,
        15 => 128,
        21..=23 => 4,
        25 | 26 => 2,
        _ => return None,
    })
}

pub(crate) fn summarize(v: &ir::ValueInfoProto) -> ValueSummary {
    use ir::type_proto::Value;
    let (dtype, shape) = match v.type_.as_ref().and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(t)) => (dtype_name(t.elem_type()), shape_of(t.shape.as_ref())),
        Some(Value::SparseTensorType(t)) => (
            format!("sparse {}", dtype_name(t.elem_type())),
            shape_of(t.shape.as_ref()),
        ),
        Some(Value::SequenceType(_)) => ("sequence".to_string(), None),
        Some(Value::MapType(_)) => ("map".to_string(), None),
        Some(Value::OptionalType(_)) => ("optional".to_string(), None),
        None => ("unknown".to_string(), None),
    };
    ValueSummary {
        name: v.name().to_string(),
        dtype,
        shape,
    }
}

fn shape_of(shape: Option<&ir::TensorShapeProto>) -> Option<Vec<Dim>> {
    use ir::tensor_shape_proto::dimension::Value;
    shape.map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(Value::DimValue(n)) => Dim::Fixed(*n),
                Some(Value::DimParam(p)) => Dim::Symbolic(p.clone()),
                None => Dim::Unknown,
            })
            .collect()
    })
}

fn count_ops(graph: &ir::GraphProto, histogram: &mut BTreeMap<String, usize>, nodes: &mut usize) {
    for node in &graph.node {
        *nodes += 1;
        let key = match node.domain() {
            "" | "ai.onnx" => node.op_type().to_string(),
            domain => format!("{domain}.{}", node.op_type()),
        };
        *histogram.entry(key).or_default() += 1;
        for attr in &node.attribute {
            for g in attr.g.as_ref().into_iter().chain(attr.graphs.iter()) {
                count_ops(g, histogram, nodes);
            }
        }
    }
}

pub fn inspect(model: &ir::ModelProto) -> Inspection {
    let graph = model.graph.as_ref().cloned().unwrap_or_default();
    let initializer_names: std::collections::HashSet<&str> =
        graph.initializer.iter().map(|t| t.name()).collect();
    let mut op_histogram = BTreeMap::new();
    let mut node_count = 0;
    count_ops(&graph, &mut op_histogram, &mut node_count);
    let mut parameter_count = 0u64;
    let mut bytes_by_dtype: BTreeMap<String, u64> = BTreeMap::new();
    let mut external_data = vec![];
    for t in &graph.initializer {
        let count = element_count(&t.dims).unwrap_or(0);
        parameter_count = parameter_count.saturating_add(count);
        let bytes = match dtype_bits(t.data_type()) {
            Some(bits) => count.saturating_mul(bits).div_ceil(8),
            None => t.string_data.iter().map(|s| s.len() as u64).sum(),
        };
        *bytes_by_dtype.entry(dtype_name(t.data_type())).or_default() += bytes;
        if let Ok(Some(ext)) = external_ref(t) {
            external_data.push(ExternalData {
                tensor: t.name().to_string(),
                location: ext.location.display().to_string(),
                offset: ext.offset,
                length: ext.length,
            });
        }
    }
    Inspection {
        ir_version: model.ir_version(),
        opsets: model
            .opset_import
            .iter()
            .map(|o| (o.domain().to_string(), o.version()))
            .collect(),
        producer: format!("{} {}", model.producer_name(), model.producer_version())
            .trim()
            .to_string(),
        graph_name: graph.name().to_string(),
        // Before IR 4, initializers were also listed as inputs; they are not
        // inputs a caller feeds.
        inputs: graph
            .input
            .iter()
            .filter(|i| !initializer_names.contains(i.name()))
            .map(summarize)
            .collect(),
        outputs: graph.output.iter().map(summarize).collect(),
        op_histogram,
        node_count,
        initializer_count: graph.initializer.len(),
        parameter_count,
        bytes_by_dtype,
        external_data,
        metadata: model
            .metadata_props
            .iter()
            .map(|kv| (kv.key().to_string(), kv.value().to_string()))
            .collect(),
    }
}
