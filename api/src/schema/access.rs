//! An API token's projects.

use utoipa::openapi::schema::{ArrayBuilder, Type};
use utoipa::openapi::Array;

use super::*;

/// An API token's projects: 1 to 64 distinct names (the name rule).
pub fn token_projects() -> Array {
    ArrayBuilder::new()
        .schema_type(nullable(Type::Array))
        .items(
            string("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
                .min_length(Some(1))
                .max_length(Some(63)),
        )
        .min_items(Some(1))
        .max_items(Some(crate::access::MAX_TOKEN_PROJECTS))
        .unique_items(true)
        .build()
}
