//! Schemas for the OpenAPI document that the derive cannot say by itself:
//! the rules the control plane enforces on label maps, on the job spec's
//! strings (each pattern is the validator's rule, built from the same
//! constants), on trigger configs, and the rules between fields that JSON
//! Schema can state (`anyOf`, `not`). Field-level rules, patterns and
//! lengths, are `#[schema(...)]` attributes on the fields; a field whose
//! rule is built here names the function with `schema_with`, and a type
//! whose fields constrain each other is referenced through a `*Schema`
//! wrapper (its derived schema, `allOf` the rules between its fields).
//!
//! The derive writes `u32` as `int32` and `u64` as `int64`, formats that
//! end at `i32::MAX` and `i64::MAX`, where the server takes values up to
//! the unsigned type's maximum; so in a request body such a field says
//! `uint32` or `uint64` (the OpenAPI format registry's names) and states
//! its type's maximum.
//!
//! What JSON Schema cannot state (one field compared with another, names
//! unique in a list, the state a value refers to, bytes of UTF-8) is left
//! to the validators, and the conformance test names each such rule per
//! operation.
//!
//! The schemas of one area's types are in that area's module here
//! (`spec`, `deployments`, `triggers`, `access`); this module holds the
//! helpers they share and the rules several areas use (labels, execution
//! providers, quantization candidates).

use std::sync::LazyLock;

use serde_json::Value;
use utoipa::openapi::schema::{
    ArrayBuilder, KnownFormat, ObjectBuilder, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::{Array, Object};

/// Builds a `*Schema` wrapper: `T`'s derived schema (its fields and their
/// rules) `allOf` the rules between its fields, under `T`'s name.
macro_rules! with_rules {
    ($(#[$doc:meta])* $wrapper:ident, $ty:ty, $name:literal, $rules:expr) => {
        $(#[$doc])*
        pub struct $wrapper;

        impl PartialSchema for $wrapper {
            fn schema() -> RefOr<Schema> {
                AllOfBuilder::new()
                    .item(<$ty as PartialSchema>::schema())
                    .item($rules)
                    .into()
            }
        }

        impl ToSchema for $wrapper {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }

            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                <$ty as ToSchema>::schemas(schemas);
            }
        }
    };
}

pub mod access;
pub mod deployments;
pub mod spec;
pub mod triggers;

/// The control plane's label rule (`validate::labels`): at most 64 labels;
/// keys of 1 to 63 of `A-Za-z0-9._/-`, values of up to 63 of `A-Za-z0-9._-`.
pub fn labels() -> Object {
    labels_of(Type::Object)
}

/// [`labels`], where the field may be absent or `null`.
pub fn optional_labels() -> Object {
    labels_of(nullable(Type::Object))
}

fn labels_of(ty: impl Into<SchemaType>) -> Object {
    ObjectBuilder::new()
        .schema_type(ty)
        .description(Some(
            "at most 64 labels; keys of 1-63 of A-Za-z0-9._/-, values of 0-63 of A-Za-z0-9._-",
        ))
        .max_properties(Some(64))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[A-Za-z0-9._/-]{1,63}$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[A-Za-z0-9._-]{0,63}$")),
        ))
        .build()
}

/// `validate::execution_providers`: 1 to 8 ONNX Runtime execution provider
/// names such as `CUDAExecutionProvider`, each at most 64 bytes.
pub fn execution_providers() -> Array {
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[A-Za-z0-9]+ExecutionProvider$"))
                .max_length(Some(64))
                .examples(["CUDAExecutionProvider"]),
        )
        .min_items(Some(1))
        .max_items(Some(8))
        .build()
}

/// What the derive writes for `i64` fields.
fn int64() -> SchemaFormat {
    SchemaFormat::KnownFormat(KnownFormat::Int64)
}

/// A `u64` field's format (see the module's note on unsigned integers).
fn uint64() -> SchemaFormat {
    SchemaFormat::Custom("uint64".into())
}

fn nullable(ty: Type) -> SchemaType {
    SchemaType::from_iter([ty, Type::Null])
}

fn string(pattern: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
}

/// A schema of bare keywords (no `type`): the parts of `anyOf` rules.
fn keywords() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::AnyValue)
}

/// `o` with a JSON Schema keyword utoipa's builders lack (`not`): written
/// among the extensions, which are serialized flattened into the schema.
fn with_keyword(mut o: Object, keyword: &str, value: Value) -> Object {
    o.extensions
        .get_or_insert_with(Default::default)
        .insert(keyword.to_string(), value);
    o
}

/// A regex character class body (for `[...]` or `[^...]`) of exactly the
/// characters `pred` holds for, so a pattern says what the Rust check does.
/// Every such set used here is in the Basic Multilingual Plane, written
/// `\uXXXX`, which ECMA-262, Python and Rust regexes all read.
fn class_of(pred: fn(char) -> bool) -> String {
    let escape = |c: char| match c {
        'a'..='z' | 'A'..='Z' | '0'..='9' => c.to_string(),
        _ => format!("\\u{:04x}", u32::from(c)),
    };
    let mut out = String::new();
    let mut chars = (0..=0xFFFF_u32).filter_map(char::from_u32).peekable();
    while let Some(start) = chars.next() {
        if !pred(start) {
            continue;
        }
        let mut end = start;
        while let Some(&next) = chars.peek() {
            if pred(next) && u32::from(next) == u32::from(end) + 1 {
                end = next;
                chars.next();
            } else {
                break;
            }
        }
        out.push_str(&escape(start));
        if end != start {
            out.push('-');
            out.push_str(&escape(end));
        }
    }
    out
}

/// Rust's `char::is_whitespace` (Unicode White_Space), what `trim` drops.
static WHITESPACE: LazyLock<String> = LazyLock::new(|| class_of(char::is_whitespace));
/// `char::is_whitespace` or `char::is_control`: what an image reference or
/// a dataset URI may not hold.
static SPACE_OR_CONTROL: LazyLock<String> =
    LazyLock::new(|| class_of(|c| c.is_whitespace() || c.is_control()));

/// No NUL: no process argument, environment value or path can hold one.
const NO_NUL: &str = "^[^\\u0000]*$";
const NO_NUL_NONEMPTY: &str = "^[^\\u0000]+$";

/// Each ASCII letter as `[Xx]`: a case-insensitive word without the `i`
/// flag, which JSON Schema's patterns do not have.
fn any_case(word: &str) -> String {
    word.chars()
        .map(|c| {
            if c.is_ascii_alphabetic() {
                format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase())
            } else {
                // The words here are letters, digits and '-', which is
                // literal outside a class (and `\-` is not valid with
                // ECMA-262's `u` flag).
                c.to_string()
            }
        })
        .collect()
}

/// `VariantPolicy.candidates`: at least one of the gate's labels.
pub fn quantization_candidates() -> Array {
    let labels: Vec<String> = edgeloop_models::quantize::gate::Candidate::default_order()
        .iter()
        .map(|c| c.label())
        .collect();
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(labels)),
        )
        .min_items(Some(1))
        .description(Some(
            "The quantizations its gate may choose from, in the gate's labels; float ships if \
             none is within the budget.",
        ))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_hold_exactly_the_predicates_characters() {
        assert_eq!(class_of(|c| c == 'a' || c == 'b' || c == '-'), "\\u002da-b");
        assert_eq!(
            *WHITESPACE,
            "\\u0009-\\u000d\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028-\\u2029\\u202f\\u205f\\u3000"
        );
        // Every character these predicates hold for is in the BMP.
        assert!((0x10000..=0x10FFFF_u32)
            .filter_map(char::from_u32)
            .all(|c| !c.is_whitespace() && !c.is_control()));
    }
}
