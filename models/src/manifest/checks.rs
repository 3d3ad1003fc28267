//! Checks on single field values that the schema's validation shares: names,
//! identifiers, free text, semantic versions and RFC 3339 timestamps. Each
//! error names the field it was given.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{invalid, ManifestError};

/// The longest version string accepted, whatever semver itself allows.
const MAX_SEMVER_BYTES: usize = 128;

/// The longest timestamp accepted.
const MAX_RFC3339_BYTES: usize = 64;

/// The registry's model-name rule (a DNS label), so every signed manifest
/// names a model the control plane can hold.
pub(super) fn check_name(field: &str, value: &str) -> Result<(), ManifestError> {
    if crate::names::is_valid_name(value) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{value:?} is not a valid name: {}", crate::names::NAME_RULE),
        ))
    }
}

/// Short identifiers (formats, quantization methods): `[a-z0-9][a-z0-9._-]*`,
/// at most 64 bytes.
pub(super) fn check_token(field: &str, value: &str) -> Result<(), ManifestError> {
    let ok = (1..=64).contains(&value.len())
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{value:?} is not a valid identifier: use 1-64 of a-z 0-9 . _ -, starting with a letter or digit"),
        ))
    }
}

/// Non-empty, bounded, and free of control characters, because these strings
/// end up in logs and terminals.
pub(super) fn check_text(field: &str, value: &str, max: usize) -> Result<(), ManifestError> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(invalid(field, format!("at most {max} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

pub(super) fn check_semver(field: &str, value: &str) -> Result<(), ManifestError> {
    match semver_problem(value) {
        None => Ok(()),
        Some(reason) => Err(invalid(
            field,
            format!(
                "{value:?} is not a semantic version (MAJOR.MINOR.PATCH[-pre][+build]): {reason}"
            ),
        )),
    }
}

/// Semantic Versioning 2.0.0, strictly, as the `semver` crate parses it:
/// numeric parts without leading zeros, identifiers from `[0-9A-Za-z-]`, none
/// empty.
fn semver_problem(s: &str) -> Option<String> {
    if s.len() > MAX_SEMVER_BYTES {
        return Some(format!("longer than {MAX_SEMVER_BYTES} bytes"));
    }
    semver::Version::parse(s).err().map(|e| e.to_string())
}

pub(super) fn check_rfc3339(field: &str, value: &str) -> Result<(), ManifestError> {
    match rfc3339_problem(value) {
        None => Ok(()),
        Some(reason) => Err(invalid(
            field,
            format!("{value:?} is not an RFC 3339 timestamp: {reason}"),
        )),
    }
}

/// RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, with the
/// calendar checked (no February 30th), as the `time` crate parses it.
fn rfc3339_problem(s: &str) -> Option<String> {
    if s.len() > MAX_RFC3339_BYTES {
        return Some("too long".into());
    }
    if let Err(e) = OffsetDateTime::parse(s, &Rfc3339) {
        return Some(e.to_string());
    }
    // `time` takes any byte between the date and the time (RFC 3339 lets
    // applications choose a space); a manifest takes only the grammar's `T`.
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't')) {
        return Some("expected a 'T' between the date and the time".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semver_table() {
        for good in [
            "0.0.0",
            "1.2.3",
            "10.20.30",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-0.3.7",
            "1.0.0-x.7.z.92",
            "1.0.0-alpha-1",
            "1.0.0+20130313144700",
            "1.0.0-beta+exp.sha.5114f85",
            "1.0.0+21AF26D3----117B344092BD",
            "1.0.0+001",
        ] {
            assert_eq!(semver_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.02.3",
            "1.2.03",
            "v1.2.3",
            "1.2.3-",
            "1.2.3+",
            "1.2.3-alpha..1",
            "1.2.3-01",
            "1.2.3-a_b",
            "1.2.3+a+b",
            "1.2.3 ",
            "-1.2.3",
            "1.2.-3",
            "99999999999999999999.0.0",
            "1.2.3-ü",
        ] {
            assert!(semver_problem(bad).is_some(), "{bad}");
        }
        assert!(semver_problem(&format!("1.2.3-{}", "a".repeat(130))).is_some());
    }

    #[test]
    fn rfc3339_table() {
        for good in [
            "2024-01-31T12:00:00Z",
            "2024-02-29T23:59:60Z",
            "2024-06-01T08:30:00.123456789+02:00",
            "2024-06-01t08:30:00-05:30",
            "2000-02-29T00:00:00z",
        ] {
            assert_eq!(rfc3339_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "2024-01-31",
            "2024-01-31 12:00:00Z",
            "2024-01-31T12:00:00",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2024-04-31T00:00:00Z",
            "2024-01-00T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:61Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+24:00",
            "2024-01-01T00:00:00+0100",
            "2024-01-01T00:00:00Zjunk",
            "２０２４-01-01T00:00:00Z",
        ] {
            assert!(rfc3339_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        for (err, field, value) in [
            (
                check_semver("lineage.parent_version", "1.2"),
                "lineage.parent_version",
                "1.2",
            ),
            (
                check_rfc3339("created_at", "yesterday"),
                "created_at",
                "yesterday",
            ),
        ] {
            match err {
                Err(ManifestError::Invalid { field: f, reason }) => {
                    assert_eq!(f, field);
                    assert!(reason.contains(&format!("{value:?}")), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
