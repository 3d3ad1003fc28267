//! The ONNX IR: decode and encode without loss, inspect, validate, and convert
//! tensors. Decoding never trusts declared sizes: element counts are computed
//! with checked arithmetic and compared with the bytes actually present
//! before anything is allocated from them.

mod external;
mod inspect;
mod tensor;
mod validate;

#[allow(clippy::all, clippy::unwrap_used, missing_docs, unused_qualifications)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/onnx_ir/mod.rs"));
}

use std::path::Path;

pub use external::{save_with_external_data, SaveError, EXTERNAL_THRESHOLD};
pub use generated::onnx_ir as ir;
pub use inspect::{inspect, Dim, Inspection, ValueSummary};
pub use tensor::{from_tensor, internalize_external_data, to_tensor, TensorError};
pub use validate::{validate, ValidationError};

use protobuf::Message;

/// Protobuf's hard limit; ONNX files larger than this use external data.
pub const MAX_MODEL_BYTES: usize = 2 << 30;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("model is {0} bytes, over the 2 GiB protobuf limit (use external data)")]
    TooLarge(usize),
    #[error("not a valid ONNX ModelProto: {0}")]
    Protobuf(String),
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Decodes a `ModelProto`. Fields this crate does not know are kept, so
/// [`encode`] writes them back unchanged.
pub fn decode(bytes: &[u8]) -> Result<ir::ModelProto, DecodeError> {
    if bytes.len() > MAX_MODEL_BYTES {
        return Err(DecodeError::TooLarge(bytes.len()));
    }
    ir::ModelProto::parse_from_bytes(bytes).map_err(|e| DecodeError::Protobuf(e.to_string()))
}

pub fn read(path: &Path) -> Result<ir::ModelProto, DecodeError> {
    let bytes = std::fs::read(path).map_err(|source| DecodeError::Io {
        path: path.display().to_string(),
        source,
    })?;
    decode(&bytes)
}

/// Why a model could not be encoded into one protobuf.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("model is {0} bytes, over the 2 GiB protobuf limit (it needs external data)")]
    TooLarge(u64),
    #[error("encoding the ModelProto: {0}")]
    Protobuf(String),
}

/// Encodes a `ModelProto` into one protobuf. A model over 2 GiB (weights
/// read in from external data, say) is an error, never empty or truncated
/// bytes: such a model is written with [`save_with_external_data`] and
/// loaded from its file.
pub fn encode(model: &ir::ModelProto) -> Result<Vec<u8>, EncodeError> {
    // compute_size is a u64 sum, exact even past 4 GiB; checked before any
    // allocation so a big model costs nothing to refuse.
    let size = model.compute_size();
    if size > MAX_MODEL_BYTES as u64 {
        return Err(EncodeError::TooLarge(size));
    }
    model
        .write_to_bytes()
        .map_err(|e| EncodeError::Protobuf(e.to_string()))
}

/// The bytes `model` takes on disk: its protobuf (whatever is held inline)
/// plus the declared length of every external-data initializer. Computed
/// without encoding, so it is right for models over 2 GiB too. An external
/// tensor without a length counts its element bytes.
pub fn serialized_size(model: &ir::ModelProto) -> u64 {
    let external: u64 = model
        .graph
        .as_ref()
        .map(|g| {
            g.initializer
                .iter()
                .filter_map(|t| {
                    let ext = tensor::external_ref(t).ok()??;
                    ext.length.or_else(|| tensor::declared_bytes(t))
                })
                .sum()
        })
        .unwrap_or(0);
    model.compute_size().saturating_add(external)
}

/// The opset version of the default (`ai.onnx`) domain, if declared.
pub fn default_opset(model: &ir::ModelProto) -> Option<i64> {
    model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain(), "" | "ai.onnx"))
        .map(|o| o.version())
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::UnknownValueRef;

    fn tiny_model() -> ir::ModelProto {
        let mut m = ir::ModelProto::new();
        m.set_ir_version(8);
        let mut opset = ir::OperatorSetIdProto::new();
        opset.set_version(17);
        m.opset_import.push(opset);
        let mut kv = ir::StringStringEntryProto::new();
        kv.set_key("author".into());
        kv.set_value("edgeloop".into());
        m.metadata_props.push(kv);
        let g = m.graph.mut_or_insert_default();
        g.set_name("g".into());
        let mut node = ir::NodeProto::new();
        node.set_op_type("Relu".into());
        node.input.push("x".into());
        node.output.push("y".into());
        g.node.push(node);
        m
    }

    #[test]
    fn unknown_fields_and_metadata_survive_a_round_trip() {
        let mut m = tiny_model();
        // Field 999 on the model and field 777 on a node: from a future ONNX.
        m.special_fields.mut_unknown_fields().add_varint(999, 42);
        m.graph.mut_or_insert_default().node[0]
            .special_fields
            .mut_unknown_fields()
            .add_length_delimited(777, b"future".to_vec());
        let bytes = encode(&m).unwrap();
        let back = decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(encode(&back).unwrap(), bytes, "byte-identical re-encode");
        assert_eq!(serialized_size(&m), bytes.len() as u64);
        assert_eq!(back.metadata_props[0].value(), "edgeloop");
        assert_eq!(
            back.special_fields.unknown_fields().get(999),
            Some(UnknownValueRef::Varint(42))
        );
        let node = &back.graph.node[0];
        assert_eq!(
            node.special_fields.unknown_fields().get(777),
            Some(UnknownValueRef::LengthDelimited(b"future"))
        );
        assert_eq!(default_opset(&back), Some(17));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            b"\xff\xff\xff\xff",
            b"\x0a\xff\xff\xff\xff\x0f",
            b"hello world",
        ] {
            let _ = decode(bytes);
        }
        assert!(decode(b"\x3a\x05ab").is_err(), "truncated graph field");
    }
}
