//! The bytes a manifest signature covers: [`SIGNING_CONTEXT`] followed by
//! [`Manifest::canonical_bytes`], with free-form JSON written with its object
//! keys sorted.

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::{invalid, Manifest, ManifestError, SIGNING_CONTEXT};

impl Manifest {
    /// The JSON the signature covers (after [`SIGNING_CONTEXT`]).
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, ManifestError> {
        serde_json::to_vec(self).map_err(|e| invalid("manifest", e.to_string()))
    }
}

/// What is signed and verified: [`SIGNING_CONTEXT`], then the canonical bytes.
pub(super) fn signed_message(manifest: &Manifest) -> Result<Vec<u8>, ManifestError> {
    let mut message = SIGNING_CONTEXT.to_vec();
    message.extend_from_slice(&manifest.canonical_bytes()?);
    Ok(message)
}

/// Writes `Value` objects with their keys sorted, so the signed bytes do not
/// depend on whether `serde_json`'s `preserve_order` feature is on somewhere
/// in the build.
pub(super) fn serialize_sorted<S: Serializer>(value: &Value, s: S) -> Result<S::Ok, S::Error> {
    Sorted(value).serialize(s)
}

struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut out = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    out.serialize_entry(k, &Sorted(v))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    out.serialize_element(&Sorted(v))?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::manifest::QuantizationRecord;

    #[test]
    fn evidence_keys_are_written_sorted() {
        let mut inner = serde_json::Map::new();
        inner.insert("zeta".into(), Value::from(1));
        inner.insert("alpha".into(), Value::from(2));
        let mut outer = serde_json::Map::new();
        outer.insert("b".into(), Value::Array(vec![Value::Object(inner)]));
        outer.insert("a".into(), Value::from(0.25));
        let record = QuantizationRecord {
            method: "m".into(),
            evidence: Value::Object(outer),
        };
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            r#"{"method":"m","evidence":{"a":0.25,"b":[{"alpha":2,"zeta":1}]}}"#
        );
    }
}
