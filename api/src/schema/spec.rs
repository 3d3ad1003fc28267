//! The job spec's rules (`crate::spec`).

use std::borrow::Cow;

use serde_json::json;
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema,
    SchemaType, Type,
};
use utoipa::openapi::{Array, Object, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::*;
use crate::spec;

/// `JobSpec.image`: not empty, no spaces or control characters.
pub fn image_reference() -> Object {
    ObjectBuilder::new()
        .schema_type(nullable(Type::String))
        .pattern(Some(format!(
            "^[^@{0}]+(@sha256:[0-9a-f]{{64}})?$",
            *SPACE_OR_CONTROL
        )))
        .description(Some(
            "Container image, for engines that run containers: no spaces or control characters; \
             a digest, when named (`name@sha256:...`), is sha256 in lowercase hex. The engine \
             pins the image at the first attempt and every attempt runs that one.",
        ))
        .build()
}

/// `JobSpec.command`: the program (not empty) and its first arguments;
/// none holds a NUL.
pub fn command() -> Array {
    ArrayBuilder::new()
        .prefix_items([string(NO_NUL_NONEMPTY).min_length(Some(1)).build()])
        .items(string(NO_NUL))
        .min_items(Some(1))
        .description(Some(
            "Program and its first arguments; never run through a shell. The program is not \
             empty; no argument holds a NUL.",
        ))
        .build()
}

/// `JobSpec.args`: no NUL in any.
pub fn process_args() -> Array {
    ArrayBuilder::new().items(string(NO_NUL)).build()
}

/// `JobSpec.env`: POSIX portable names, not the bridge's `EDGELOOP_*` nor
/// `NCCL_*` (checked under `nccl`); values without NUL.
pub fn environment() -> Object {
    let names = with_keyword(
        string("^[A-Za-z_][A-Za-z0-9_]*$").build(),
        "not",
        json!({"pattern": "^(EDGELOOP_|NCCL_)"}),
    );
    ObjectBuilder::new()
        .property_names(Some(names))
        .additional_properties(Some(string(NO_NUL)))
        .description(Some(
            "Names of letters, digits and '_', not starting with a digit; not EDGELOOP_* (set by \
             the bridge) nor NCCL_* (under `nccl`), and with a launcher none of the variables it \
             sets per process. Values hold no NUL.",
        ))
        .build()
}

/// `JobSpec.working_dir`: a non-empty path without NUL.
pub fn working_dir() -> Object {
    ObjectBuilder::new()
        .schema_type(nullable(Type::String))
        .pattern(Some(NO_NUL_NONEMPTY))
        .min_length(Some(1))
        .description(Some(
            "Relative paths are resolved against the job's directory on the node.",
        ))
        .build()
}

/// `Resources.gpu_type`: not blank.
pub fn gpu_type() -> Object {
    ObjectBuilder::new()
        .schema_type(nullable(Type::String))
        .pattern(Some(format!("[^{}]", *WHITESPACE)))
        .description(Some(
            "e.g. \"A100\" or \"H100-80GB\", matched against the cluster's GPU name; only with \
             gpus_per_node of at least 1.",
        ))
        .build()
}

/// `JobSpec.nccl`: only the variables that describe the network.
pub fn nccl() -> Object {
    let names = spec::NCCL_KEYS
        .iter()
        .map(|k| k.to_string())
        .chain([format!("{}[A-Za-z0-9_]+", spec::NCCL_IB_PREFIX)])
        .collect::<Vec<_>>()
        .join("|");
    ObjectBuilder::new()
        .property_names(Some(string(&format!("^({names})$"))))
        .additional_properties(Some(string(NO_NUL)))
        .description(Some(
            "Passed through to the training processes' environment: only NCCL_DEBUG, \
             NCCL_SOCKET_IFNAME and NCCL_IB_*, which describe the network (the rest change \
             numerics or hang jobs, and belong in the image). Values hold no NUL.",
        ))
        .build()
}

/// `JobSpec.datasets`: `scheme://location` with a known scheme (any case),
/// no spaces or control characters; an `edgeloop-artifact` URI names a
/// digest.
pub fn datasets() -> Array {
    let artifact = "edgeloop-artifact";
    let schemes = spec::DATASET_SCHEMES
        .iter()
        .filter(|s| **s != artifact)
        .map(|s| any_case(s))
        .collect::<Vec<_>>()
        .join("|");
    let pattern = format!(
        "^(({schemes})://[^{space}]+|{artifact}://(sha256:)?[0-9a-f]{{64}})$",
        space = *SPACE_OR_CONTROL,
        artifact = any_case(artifact),
    );
    ArrayBuilder::new()
        .items(string(&pattern))
        .description(Some(format!(
            "Dataset URIs, handed to the job as given: scheme://location, the scheme one of {} \
             (edgeloop-artifact://sha256:<64 hex>).",
            spec::DATASET_SCHEMES.join(", ")
        )))
        .build()
}

/// `JobSpec.hyperparameters`: any values, under non-empty names.
pub fn hyperparameters() -> Object {
    ObjectBuilder::new()
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1)),
        ))
        .additional_properties(Some(ObjectBuilder::new().schema_type(SchemaType::AnyValue)))
        .build()
}

/// `JobSpec.requirements`: `spec::Requirement::parse`'s grammar.
pub fn requirements() -> Array {
    let ws = format!("[{}]*", *WHITESPACE);
    let frameworks = ["torch", "pytorch", "tensorflow", "tensorflow-gpu", "cuda"]
        .iter()
        .map(|f| any_case(f))
        .collect::<Vec<_>>()
        .join("|");
    let part = "[0-9]{1,9}";
    let pattern = format!(
        "^{ws}({frameworks}){ws}((>=|==|<=|>|<){ws}{part}(\\.{part}){{0,3}}|~={ws}{part}(\\.{part}){{1,3}}){ws}$"
    );
    ArrayBuilder::new()
        .items(string(&pattern))
        .description(Some(
            "Framework requirements such as torch>=2.0 or cuda>=11.8 (torch, tensorflow or cuda; \
             >=, ==, <=, >, < or ~= with at least two components; up to 4 numeric components); \
             the pre-flight check holds them against the cluster.",
        ))
        .build()
}

with_rules!(
    /// [`spec::JobSpec`] and its rule between fields: with a launcher
    /// (torchrun or horovod), `env` may not set the variables the launcher
    /// sets per process.
    JobSpecSchema,
    spec::JobSpec,
    "JobSpec",
    AnyOfBuilder::new()
        .item(
            keywords().property(
                "launcher",
                keywords().property("type", keywords().enum_values(Some(["none"]))),
            ),
        )
        .item(keywords().property(
            "env",
            keywords().property_names(Some(with_keyword(
                keywords().build(),
                "not",
                json!({"enum": spec::TORCHRUN_VARS}),
            ))),
        ))
);

with_rules!(
    /// [`spec::Resources`] and its rule between fields: a GPU type only
    /// with GPUs.
    ResourcesSchema,
    spec::Resources,
    "Resources",
    AnyOfBuilder::new()
        .item(keywords().property("gpu_type", ObjectBuilder::new().schema_type(Type::Null)))
        .item(
            keywords()
                .required("gpus_per_node")
                .property("gpus_per_node", keywords().minimum(Some(1))),
        )
);

with_rules!(
    /// [`spec::CheckpointPolicy`] and its rule between fields: a present
    /// `checkpoint` says when, in steps, minutes or both.
    CheckpointPolicySchema,
    spec::CheckpointPolicy,
    "CheckpointPolicy",
    AnyOfBuilder::new()
        .item(
            keywords()
                .required("every_steps")
                .property("every_steps", ObjectBuilder::new().schema_type(Type::Integer)),
        )
        .item(
            keywords()
                .required("every_minutes")
                .property("every_minutes", ObjectBuilder::new().schema_type(Type::Integer)),
        )
);

/// [`spec::LauncherSpec`]: its derived `oneOf`, each launcher closed to
/// fields of its own, as serde's `deny_unknown_fields` has it (the derive
/// leaves an enum's variants open).
pub struct LauncherSpecSchema;

impl PartialSchema for LauncherSpecSchema {
    fn schema() -> RefOr<Schema> {
        let mut schema = <spec::LauncherSpec as PartialSchema>::schema();
        if let RefOr::T(Schema::OneOf(one_of)) = &mut schema {
            for launcher in &mut one_of.items {
                if let RefOr::T(Schema::Object(o)) = launcher {
                    o.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
                }
            }
        }
        schema
    }
}

impl ToSchema for LauncherSpecSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("LauncherSpec")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes' literal bounds are the validator's constants.
    #[test]
    fn literal_bounds_are_the_constants() {
        let maximum = |schema: RefOr<Schema>, field: &str| {
            serde_json::to_value(schema).unwrap()["properties"][field]["maximum"].clone()
        };
        let resources = || <spec::Resources as PartialSchema>::schema();
        let restarts = || <spec::RestartPolicy as PartialSchema>::schema();
        assert_eq!(maximum(resources(), "nodes"), json!(spec::MAX_NODES));
        assert_eq!(
            maximum(resources(), "gpus_per_node"),
            json!(spec::MAX_GPUS_PER_NODE)
        );
        assert_eq!(
            maximum(restarts(), "max_restarts"),
            json!(spec::MAX_RESTARTS)
        );
        assert_eq!(
            maximum(restarts(), "max_preemptions"),
            json!(spec::MAX_PREEMPTIONS)
        );
        for field in ["backoff_seconds", "backoff_max_seconds"] {
            assert_eq!(maximum(restarts(), field), json!(spec::MAX_BACKOFF_SECONDS));
        }
    }
}
