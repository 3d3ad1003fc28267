//! A generated model over protobuf's 2 GiB, its weights in external data
//! (`model.onnx` + `model.onnx.data`), for the big-model tests: this
//! crate's (`big_model.rs`: the library path, gate to served answer) and
//! the integration test of the whole registry path
//! (`tests/it/big_model_loop.rs` includes this file by path, so both
//! test the very same model).

use std::io::Write;
use std::path::Path;

use edgeloop_models::onnx::{self, ir};
use edgeloop_models::Tensor;

pub const IN: usize = 1024;
/// 1024 × 525 000 float32 = 2.15 GB: just over 2 GiB on its own.
pub const HIDDEN: usize = 525_000;
pub const OUT: usize = 8;

fn value(name: &str, dims: &[Option<i64>]) -> ir::ValueInfoProto {
    let mut v = ir::ValueInfoProto::new();
    v.set_name(name.into());
    let mut t = ir::type_proto::Tensor::new();
    t.set_elem_type(1);
    let shape = t.shape.mut_or_insert_default();
    for d in dims {
        let mut dim = ir::tensor_shape_proto::Dimension::new();
        match d {
            Some(n) => dim.set_dim_value(*n),
            None => dim.set_dim_param("batch".into()),
        }
        shape.dim.push(dim);
    }
    v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(t));
    v
}

/// Writes `rows × cols` pseudo-random float32 values in [-scale, scale)
/// straight to `out` in chunks (never the whole tensor in memory), and
/// returns the initializer that points at them.
fn external_weight(
    out: &mut impl Write,
    offset: &mut u64,
    name: &str,
    rows: usize,
    cols: usize,
    scale: f32,
    seed: u64,
) -> ir::TensorProto {
    let mut state = seed;
    let mut chunk = Vec::with_capacity(1 << 22);
    let total = rows * cols;
    let mut written = 0;
    while written < total {
        chunk.clear();
        let n = (total - written).min(1 << 20);
        for _ in 0..n {
            // xorshift64: cheap enough unoptimized, and deterministic.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
            chunk.extend_from_slice(&v.to_le_bytes());
        }
        out.write_all(&chunk).unwrap();
        written += n;
    }
    let length = (total * 4) as u64;
    let mut t = ir::TensorProto::new();
    t.set_name(name.into());
    t.set_data_type(1);
    t.dims = vec![rows as i64, cols as i64];
    t.set_data_location(ir::tensor_proto::DataLocation::EXTERNAL);
    for (k, v) in [
        ("location", "model.onnx.data".to_string()),
        ("offset", offset.to_string()),
        ("length", length.to_string()),
    ] {
        let mut kv = ir::StringStringEntryProto::new();
        kv.set_key(k.into());
        kv.set_value(v);
        t.external_data.push(kv);
    }
    *offset += length;
    t
}

/// x [batch, 1024] → MatMul W1 [1024, 525000] → MatMul W2 [525000, 8] → y.
pub fn write_big_model(dir: &Path) -> std::path::PathBuf {
    let data = std::fs::File::create(dir.join("model.onnx.data")).unwrap();
    let mut out = std::io::BufWriter::with_capacity(1 << 22, data);
    let mut offset = 0;
    let w1 = external_weight(&mut out, &mut offset, "w1", IN, HIDDEN, 1.0, 0x9e37_79b9);
    // Scaled so y stays near 1: each y sums 525 000 terms.
    let w2 = external_weight(&mut out, &mut offset, "w2", HIDDEN, OUT, 0.002, 0x85eb_ca6b);
    out.flush().unwrap();
    drop(out);
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut opset = ir::OperatorSetIdProto::new();
    opset.set_version(13);
    m.opset_import.push(opset);
    let g = m.graph.mut_or_insert_default();
    g.set_name("big".into());
    g.input.push(value("x", &[None, Some(IN as i64)]));
    g.output.push(value("y", &[None, Some(OUT as i64)]));
    g.initializer = vec![w1, w2];
    for (i, (a, b, y)) in [("x", "w1", "h"), ("h", "w2", "y")].into_iter().enumerate() {
        let mut n = ir::NodeProto::new();
        n.set_name(format!("matmul{i}"));
        n.set_op_type("MatMul".into());
        n.input = vec![a.into(), b.into()];
        n.output = vec![y.into()];
        g.node.push(n);
    }
    let path = dir.join("model.onnx");
    std::fs::write(&path, onnx::encode(&m).unwrap()).unwrap();
    path
}

/// A float32 tensor's values.
pub fn f32s(t: &Tensor) -> Vec<f32> {
    match t {
        Tensor::F32(a) => a.iter().copied().collect(),
        other => panic!("not float32: {other:?}"),
    }
}

/// ‖other − reference‖₂ / ‖reference‖₂.
pub fn relative_l2(reference: &[f32], other: &[f32]) -> f64 {
    let diff: f64 = reference
        .iter()
        .zip(other)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = reference.iter().map(|a| f64::from(*a).powi(2)).sum();
    (diff / norm).sqrt()
}
