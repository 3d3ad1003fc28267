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

use std::borrow::Cow;
use std::sync::LazyLock;

use serde_json::{json, Value};
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, AnyOfBuilder, ArrayBuilder, KnownFormat, ObjectBuilder,
    OneOfBuilder, Schema, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::{Array, Object, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::spec;

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

/// `JobSpec.image`: not empty, no spaces or control characters.
pub fn image_reference() -> Object {
    ObjectBuilder::new()
        .schema_type(nullable(Type::String))
        .pattern(Some(format!("^[^{}]+$", *SPACE_OR_CONTROL)))
        .description(Some(
            "Container image, for engines that run containers: no spaces or control characters.",
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

/// An integer from `lo` to `hi` (at most 99), leading zeros allowed: how
/// `u32::from_str` reads digits.
fn number_in(lo: u32, hi: u32) -> String {
    let digits = |a: u32, b: u32| {
        if a == b {
            a.to_string()
        } else {
            format!("[{a}-{b}]")
        }
    };
    // (tens digits, units digits) per alternative; runs of tens whose units
    // are all of 0-9 become one `[a-b][0-9]`.
    let mut runs: Vec<((u32, u32), (u32, u32))> = Vec::new();
    for tens in lo / 10..=hi / 10 {
        let first = if tens == lo / 10 { lo % 10 } else { 0 };
        let last = if tens == hi / 10 { hi % 10 } else { 9 };
        match runs.last_mut() {
            Some(((_, t), (0, 9))) if tens > 0 && *t > 0 && (first, last) == (0, 9) => *t = tens,
            _ => runs.push(((tens, tens), (first, last))),
        }
    }
    let alternatives: Vec<String> = runs
        .iter()
        .map(|&((t0, t1), (u0, u1))| {
            if t1 == 0 {
                digits(u0, u1)
            } else {
                format!("{}{}", digits(t0, t1), digits(u0, u1))
            }
        })
        .collect();
    format!("0*({})", alternatives.join("|"))
}

/// `TriggerSpec.cron`: five fields (`crate::triggers::CRON_FIELDS`), each
/// a list of `*`, values or ranges, each with an optional step of 1 to the
/// field's maximum. That a range's start is not after its end is the
/// parser's.
fn cron_pattern() -> String {
    let ws = &*WHITESPACE;
    let fields: Vec<String> = crate::triggers::CRON_FIELDS
        .iter()
        .map(|(_, lo, hi)| {
            let value = number_in(*lo, *hi);
            let part = format!("(\\*|{value}(-{value})?)(/{})?", number_in(1, *hi));
            format!("{part}(,{part})*")
        })
        .collect();
    format!("^[{ws}]*{}[{ws}]*$", fields.join(&format!("[{ws}]+")))
}

/// `TriggerSpec.window`: `HH:MM-HH:MM` (UTC; leading zeros optional); that
/// start and end differ is the parser's.
fn window_pattern() -> String {
    let ws = &*WHITESPACE;
    let time = format!("{}:{}", number_in(0, 23), number_in(0, 59));
    format!("^[{ws}]*{time}[{ws}]*-[{ws}]*{time}[{ws}]*$")
}

/// Up to 90 days, as `cooldown_seconds` and `min_duration_seconds` are.
pub const MAX_TRIGGER_SECONDS: i64 = 90 * 86_400;

/// [`crate::triggers::TriggerSpec`]: one object per kind (`oneOf` on
/// `kind`), each with its own fields; another kind's field may only be
/// absent or `null`. That ids are unique in the list is the validator's.
pub fn trigger_spec() -> Schema {
    let points = |nullable_: bool| {
        ObjectBuilder::new()
            .schema_type(if nullable_ {
                nullable(Type::Number)
            } else {
                Type::Number.into()
            })
            .minimum(Some(0))
            .maximum(Some(100))
    };
    let own = |field: &str| -> Schema {
        match field {
            "min_severity" => ObjectBuilder::new()
                .schema_type(nullable(Type::Number))
                .exclusive_minimum(Some(0))
                .description(Some(
                    "The severity (largest PSI) that counts (default 0.2).",
                ))
                .into(),
            "min_duration_seconds" => ObjectBuilder::new()
                .schema_type(nullable(Type::Integer))
                .format(Some(int64()))
                .minimum(Some(0))
                .maximum(Some(MAX_TRIGGER_SECONDS))
                .description(Some("For at least this long (default 0; up to 90 days)."))
                .into(),
            "min_accuracy_drop_points" => points(true)
                .description(Some(
                    "And, when labels exist, accuracy at least this many points down.",
                ))
                .into(),
            "points" => points(false)
                .description(Some("Points under the evaluated accuracy."))
                .into(),
            "min" => ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(uint64()))
                .minimum(Some(1))
                .maximum(Some(u64::MAX))
                .description(Some("Labelled samples since the last retrain."))
                .into(),
            "cron" => string(&cron_pattern())
                .description(Some(
                    "Five-field cron (minute hour day-of-month month day-of-week), UTC: `*`, \
                     values, ranges (start not after end), lists, steps of 1 to the field's \
                     maximum.",
                ))
                .into(),
            "window" => ObjectBuilder::new()
                .schema_type(nullable(Type::String))
                .pattern(Some(window_pattern()))
                .description(Some(
                    "Only inside this daily UTC window, `HH:MM-HH:MM` (start and end differ).",
                ))
                .into(),
            _ => ObjectBuilder::new().into(),
        }
    };
    let mut kinds = OneOfBuilder::new().description(Some(
        "One trigger; which fields apply depends on `kind`. Ids are unique in the list.",
    ));
    for (kind, _, _) in crate::triggers::TRIGGER_KINDS {
        let mut branch = ObjectBuilder::new()
            .required("id")
            .property(
                "id",
                string("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
                    .min_length(Some(1))
                    .max_length(Some(63)),
            )
            .required("kind")
            .property(
                "kind",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([kind])),
            )
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        for (other, required, optional) in crate::triggers::TRIGGER_KINDS {
            for field in required.iter().chain(optional) {
                branch = if other == kind {
                    if required.contains(field) {
                        branch.required(*field)
                    } else {
                        branch
                    }
                    .property(*field, own(field))
                } else {
                    branch.property(*field, ObjectBuilder::new().schema_type(Type::Null))
                };
            }
        }
        kinds = kinds.item(branch);
    }
    kinds.into()
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
        for field in ["backoff_seconds", "backoff_max_seconds"] {
            assert_eq!(maximum(restarts(), field), json!(spec::MAX_BACKOFF_SECONDS));
        }
    }

    #[test]
    fn numbers_in_a_range() {
        assert_eq!(number_in(0, 7), "0*([0-7])");
        assert_eq!(number_in(1, 31), "0*([1-9]|[1-2][0-9]|3[0-1])");
        assert_eq!(number_in(0, 23), "0*([0-9]|1[0-9]|2[0-3])");
        assert_eq!(number_in(0, 59), "0*([0-9]|[1-5][0-9])");
        assert_eq!(number_in(1, 12), "0*([1-9]|1[0-2])");
        assert_eq!(number_in(5, 5), "0*(5)");
    }
}
