//! ONNX's own operator conformance cases (onnx==1.22.0, backend/test/data/node,
//! fetched by scripts/fetch-onnx-node-tests.sh): every model decodes,
//! validates, and re-encodes to an equal model.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use edgeloop_models::onnx;

pub fn node_tests_dir() -> PathBuf {
    let dir = std::env::var_os("EDGELOOP_ONNX_NODE_TESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            edgeloop_models::deps::dir()
                .expect("HOME or EDGELOOP_DEPS is set")
                .join("onnx-1.22.0/node")
        });
    assert!(
        dir.join(".complete").exists(),
        "ONNX node tests not found at {}: run scripts/fetch-onnx-node-tests.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

pub fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(node_tests_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    cases.sort();
    cases
}

#[test]
fn every_node_test_model_round_trips_and_validates() {
    let cases = cases();
    assert!(
        cases.len() > 1700,
        "expected ~1765 cases, found {}",
        cases.len()
    );
    let mut byte_identical = 0;
    let mut invalid = vec![];
    for case in &cases {
        let bytes = std::fs::read(case.join("model.onnx")).unwrap();
        let model = onnx::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        let encoded = onnx::encode(&model);
        let again = onnx::decode(&encoded).unwrap();
        // Compared as canonical bytes, not with ==: NaN weights are equal bit for bit.
        assert!(
            onnx::encode(&again) == encoded,
            "{}: round trip changed the model",
            case.display()
        );
        if encoded == bytes {
            byte_identical += 1;
        }
        if let Err(e) = onnx::validate(&model, Some(case)) {
            invalid.push(format!(
                "{}: {e}",
                case.file_name().unwrap().to_string_lossy()
            ));
        }
        let summary = onnx::inspect(&model);
        assert!(!summary.outputs.is_empty(), "{}", case.display());
    }
    println!(
        "{} cases; {byte_identical} re-encode byte for byte",
        cases.len()
    );
    // Fields are declared in number order, as protobuf's reference encoder writes them.
    assert_eq!(
        byte_identical,
        cases.len(),
        "some models re-encode to different bytes"
    );
    assert!(
        invalid.is_empty(),
        "valid conformance models refused:\n{}",
        invalid.join("\n")
    );
}
