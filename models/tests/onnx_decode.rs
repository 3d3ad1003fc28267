//! The ONNX decoder faces untrusted bytes: whatever it is given, decode,
//! validate and inspect return, and never panic.

#![allow(clippy::unwrap_used)]

use edgeloop_models::onnx::{self, ir};
use proptest::prelude::*;

fn seed_model() -> Vec<u8> {
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut o = ir::OperatorSetIdProto::new();
    o.set_version(17);
    m.opset_import.push(o);
    let g = m.graph.mut_or_insert_default();
    let mut n = ir::NodeProto::new();
    n.set_op_type("MatMul".into());
    n.input = vec!["x".into(), "w".into()];
    n.output = vec!["y".into()];
    g.node.push(n);
    let w = onnx::from_tensor(
        "w",
        &edgeloop_models::Tensor::F32(ndarray::ArrayD::zeros(vec![4, 4])),
    );
    g.initializer.push(w);
    onnx::encode(&m).unwrap()
}

fn exercise(bytes: &[u8]) {
    if let Ok(m) = onnx::decode(bytes) {
        let _ = onnx::validate(&m, None);
        let _ = onnx::inspect(&m);
        if let Some(g) = m.graph.as_ref() {
            for t in &g.initializer {
                let _ = onnx::to_tensor(t, None);
            }
        }
        // Whatever decoded re-encodes and decodes to the same message.
        let encoded = onnx::encode(&m).unwrap();
        let again = onnx::decode(&encoded).expect("re-encoded model decodes");
        // Lengths, not bytes: unknown fields of different numbers may be
        // written in another order (rust-protobuf keeps them in a hash map).
        assert_eq!(
            onnx::encode(&again).unwrap().len(),
            encoded.len(),
            "re-encoding is stable"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        exercise(&bytes);
    }

    #[test]
    fn mutated_valid_models(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in any::<prop::sample::Index>()) {
        let mut bytes = seed_model();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        exercise(&bytes);
        let keep = cut.index(bytes.len());
        exercise(&bytes[..keep]);
    }
}
