//! Trigger specs (`crate::triggers`).

use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};

use super::*;

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
    fn numbers_in_a_range() {
        assert_eq!(number_in(0, 7), "0*([0-7])");
        assert_eq!(number_in(1, 31), "0*([1-9]|[1-2][0-9]|3[0-1])");
        assert_eq!(number_in(0, 23), "0*([0-9]|1[0-9]|2[0-3])");
        assert_eq!(number_in(0, 59), "0*([0-9]|[1-5][0-9])");
        assert_eq!(number_in(1, 12), "0*([1-9]|1[0-2])");
        assert_eq!(number_in(5, 5), "0*(5)");
    }
}
