//! Reading a spec from JSON or YAML text ([`JobSpec::from_json`],
//! [`JobSpec::from_yaml`]), naming the field at fault as a path
//! (`resources.gpus_per_node`, `requirements[1]`) although serde_json
//! gives only a position; and the serde helpers the spec's fields use.

use std::fmt;

use serde::Deserialize;

use super::{JobSpec, Requirement, SpecError};

impl JobSpec {
    /// Parses and validates a JSON spec.
    pub fn from_json(bytes: &[u8]) -> Result<JobSpec, SpecError> {
        let spec = parse_json(bytes, "JSON")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates a YAML spec.
    ///
    /// The YAML is first read as a plain JSON value, then typed from its JSON
    /// form, so both formats go through one deserializer and one
    /// field-naming path (see [`parse_json`]).
    pub fn from_yaml(text: &str) -> Result<JobSpec, SpecError> {
        let value: serde_json::Value =
            serde_yaml::from_str(text).map_err(|e| SpecError::Malformed {
                format: "YAML",
                message: e.to_string(),
            })?;
        let json = serde_json::to_vec_pretty(&value).map_err(|e| SpecError::Malformed {
            format: "YAML",
            message: e.to_string(),
        })?;
        let spec = parse_json(&json, "YAML")?;
        spec.validate()?;
        Ok(spec)
    }
}

/// Deserializes from JSON text; on error, names the field by finding where in
/// the text serde stopped (see [`path_at`]). The crate has no
/// serde_path_to_error, and serde_json's line/column is exact enough: it is
/// just past the offending key or value, or just past the object missing a
/// field.
fn parse_json(bytes: &[u8], format: &'static str) -> Result<JobSpec, SpecError> {
    // serde's derived structs also accept a sequence of field values in
    // order; a spec is always a map.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(SpecError::Malformed {
            format,
            message: "the job spec must be a mapping of fields".into(),
        });
    }
    let err = match serde_json::from_slice::<JobSpec>(bytes) {
        Ok(spec) => return Ok(spec),
        Err(e) => e,
    };
    let full = err.to_string();
    // For YAML the position is in our generated JSON, meaningless to the
    // author; the path replaces it.
    let message = full
        .strip_suffix(&format!(" at line {} column {}", err.line(), err.column()))
        .unwrap_or(&full)
        .to_string();
    if err.is_syntax() || err.is_eof() || err.is_io() {
        let message = if format == "JSON" { full } else { message };
        return Err(SpecError::Malformed { format, message });
    }
    let offset = offset_of(bytes, err.line(), err.column());
    let mut path = path_at(bytes, offset);
    if let Some((index, rest)) = split_index_prefix(&message) {
        // The position may be past the element (or the next comma): the
        // marker, not the position, says which element.
        if path.ends_with(']') {
            if let Some(open) = path.rfind('[') {
                path.truncate(open);
            }
        }
        return Err(SpecError::Invalid {
            field: format!("{path}{index}"),
            message: rest.to_string(),
        });
    }
    // serde names a missing or unknown field in backticks; make it part of
    // the path unless the position already ends on it.
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|p| message.strip_prefix(p))
        .and_then(|rest| rest.split('`').next());
    if let Some(name) = named {
        let ends_on_it = path.rsplit('.').next() == Some(name);
        if !ends_on_it {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
        }
    }
    if path.is_empty() {
        Err(SpecError::Malformed { format, message })
    } else {
        Err(SpecError::Invalid {
            field: path,
            message,
        })
    }
}

/// Byte offset of serde_json's (1-based line, column = bytes consumed on that
/// line) position.
fn offset_of(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    let mut current = 1;
    while current < line {
        match bytes[start..].iter().position(|&b| b == b'\n') {
            Some(i) => start += i + 1,
            None => break,
        }
        current += 1;
    }
    (start + column).min(bytes.len())
}

enum Frame {
    Object {
        key: Option<String>,
        expect_key: bool,
    },
    Array {
        index: usize,
    },
}

/// The path (`a.b[2].c`) of the innermost key or element open at `offset` in
/// well-formed JSON text. A closed object leaves its parent's key in place, so
/// an error raised just after `}` names the object that closed.
fn path_at(bytes: &[u8], offset: usize) -> String {
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    let end = offset.min(bytes.len());
    while i < end {
        match bytes[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < end && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let stop = (i + 1).min(bytes.len());
                if let Some(Frame::Object { key, expect_key }) = stack.last_mut() {
                    if *expect_key {
                        *key = serde_json::from_slice::<String>(&bytes[start..stop]).ok();
                        *expect_key = false;
                    }
                }
            }
            b'{' => stack.push(Frame::Object {
                key: None,
                expect_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Object { key: Some(key), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

/// Parses each entry inside the list's visitor so that an error carries the
/// entry's index: serde_json positions a custom error at the end of the
/// enclosing list (or just past the next comma), which names the list but not
/// reliably the element. The `[i]: ` prefix is moved into the path by
/// [`parse_json`].
pub(super) fn deserialize_requirements<'de, D>(
    deserializer: D,
) -> Result<Vec<Requirement>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Entries;
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = Vec<Requirement>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of requirements such as \"torch>=2.0\"")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut entries = Vec::new();
            while let Some(text) = seq.next_element::<String>()? {
                let requirement = Requirement::parse(&text).map_err(|m| {
                    <A::Error as serde::de::Error>::custom(format!("[{}]: {m}", entries.len()))
                })?;
                entries.push(requirement);
            }
            Ok(entries)
        }
    }
    deserializer.deserialize_seq(Entries)
}

/// A section left out when written: what reading leaves out gets the
/// default, so a spec is written as it is usually submitted (the job
/// records store it so, and the API shows it so).
pub(super) fn is_default<T: Default + PartialEq>(section: &T) -> bool {
    *section == T::default()
}

/// Reads a struct from a mapping only: serde's derived structs also take a
/// sequence of their fields' values (`resources: [2, 8]`), which no author
/// means and the OpenAPI document does not allow.
pub(super) fn mapping<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Mapping<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Mapping<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping of fields")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(Mapping(std::marker::PhantomData))
}

/// Splits a leading `[i]: ` element marker off a message.
fn split_index_prefix(message: &str) -> Option<(&str, &str)> {
    let rest = message.strip_prefix('[')?;
    let close = rest.find("]: ")?;
    let index = &rest[..close];
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((&message[..close + 2], &rest[close + 3..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_at_names_keys_and_indices() {
        let text = br#"{"a": {"b": [1, {"c": 2}]}, "d": 3}"#;
        let at = |needle: &str| {
            let pos = std::str::from_utf8(text).unwrap().find(needle).unwrap() + needle.len();
            path_at(text, pos)
        };
        assert_eq!(at(r#""b""#), "a.b");
        assert_eq!(at("[1"), "a.b[0]");
        assert_eq!(at(r#""c": 2"#), "a.b[1].c");
        assert_eq!(at(r#"2}"#), "a.b[1]");
        assert_eq!(at(r#""d": 3"#), "d");
    }

    #[test]
    fn a_section_is_a_mapping_never_a_sequence() {
        for (section, value) in [
            ("resources", "[]"),
            ("resources", "[2, 8]"),
            ("checkpoint", "[5]"),
            ("restarts", "[]"),
        ] {
            let text = format!(r#"{{"name": "j", "command": ["x"], "{section}": {value}}}"#);
            let err = JobSpec::from_json(text.as_bytes()).unwrap_err();
            assert_eq!(err.field(), Some(section), "{text}: {err}");
            assert!(err.to_string().contains("expected a mapping"), "{err}");
        }
        let text = r#"{"name": "j", "command": ["x"], "resources": {"nodes": 2}}"#;
        assert_eq!(
            JobSpec::from_json(text.as_bytes()).unwrap().resources.nodes,
            2
        );
    }
}
