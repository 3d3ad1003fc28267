//! Schemas for the OpenAPI document that the derive cannot say by itself:
//! the rules the control plane enforces on label maps. (Field-level rules,
//! patterns and lengths, are `#[schema(...)]` attributes on the fields.)

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
use utoipa::openapi::{Array, Object};

/// The control plane's label rule (`validate::labels`): at most 64 labels;
/// keys of 1 to 63 of `A-Za-z0-9._/-`, values of up to 63 of `A-Za-z0-9._-`.
pub fn labels() -> Object {
    labels_of(Type::Object)
}

/// [`labels`], where the field may be absent or `null`.
pub fn optional_labels() -> Object {
    labels_of(utoipa::openapi::schema::SchemaType::from_iter([
        Type::Object,
        Type::Null,
    ]))
}

fn labels_of(ty: impl Into<utoipa::openapi::schema::SchemaType>) -> Object {
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
