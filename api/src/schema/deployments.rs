//! A deployment request's rules (`crate::deployments`).

use std::borrow::Cow;

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::openapi::{Object, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::*;

/// `StrategyRequest.waves`: `{"percent": [...]}` of 1 to 100, or
/// `{"count": [...]}` of at least 1; that they increase (and percentages
/// end at 100) is the validator's.
pub fn waves() -> Schema {
    let waves = |key: &str, item: ObjectBuilder| {
        ObjectBuilder::new()
            .required(key)
            .property(
                key,
                ArrayBuilder::new().items(item).min_items(Some(1)).build(),
            )
            .additional_properties(Some(AdditionalProperties::FreeForm(false)))
            .build()
    };
    OneOfBuilder::new()
        .item(waves(
            "percent",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(100)),
        ))
        .item(waves(
            "count",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(uint64()))
                .minimum(Some(1))
                .maximum(Some(u64::MAX)),
        ))
        .description(Some(
            "`{\"percent\": [1, 10, 50, 100]}` (cumulative, increasing, ending at 100) or \
             `{\"count\": [1, 5, 20]}` (cumulative, increasing; the last wave takes the rest).",
        ))
        .into()
}

/// `CreateDeployment.selector`: not blank, at most 4096 bytes; the grammar
/// (`GET /api/v1/devices?selector=`) is described in words.
pub fn selector() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(format!("[^{}]", *WHITESPACE)))
        .max_length(Some(4096))
        .description(Some(
            "The device group, as a label selector (`GET /api/v1/devices?selector=`): \
             requirements separated by ',' (`key=value`, `key!=value`, `key in (a,b)`, \
             `key notin (a,b)`, `key`, `!key`); at most 4096 bytes.",
        ))
        .build()
}

/// `RetrainingConfig.rollout`: a deployment request without what the
/// pipeline sets (`model`, `version`, `alias`).
pub struct RolloutTemplateSchema;

impl PartialSchema for RolloutTemplateSchema {
    fn schema() -> RefOr<Schema> {
        let mut schema = <crate::deployments::CreateDeployment as PartialSchema>::schema();
        if let RefOr::T(Schema::Object(o)) = &mut schema {
            for set_by_pipeline in ["model", "version", "alias"] {
                o.properties.remove(set_by_pipeline);
                o.required.retain(|r| r != set_by_pipeline);
            }
            o.description = Some(
                "A deployment request without `model`, `version` and `alias`, which the \
                 pipeline sets."
                    .into(),
            );
        }
        schema
    }
}

impl ToSchema for RolloutTemplateSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RolloutTemplate")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <crate::deployments::CreateDeployment as ToSchema>::schemas(schemas);
    }
}
