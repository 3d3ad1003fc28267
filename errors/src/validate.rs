//! Validation of names and labels shared by every API surface. Each check
//! returns an [`Error::BadRequest`] naming the field.

use std::collections::BTreeMap;

use crate::Error;

/// DNS-label style: lowercase alphanumerics and '-', 1..=63 characters, not
/// starting or ending with '-'. Used for device, cluster and model names: they
/// appear in certificates, URLs and file names.
/// A record's project: the name rule, `default` when absent.
pub fn project(project: Option<String>) -> Result<String, Error> {
    match project {
        Some(p) => {
            name("project", &p)?;
            Ok(p)
        }
        None => Ok(edgeloop_api::access::default_project()),
    }
}

pub fn name(field: &str, value: &str) -> Result<(), Error> {
    if edgeloop_models::names::is_valid_name(value) {
        Ok(())
    } else {
        Err(Error::bad_field(
            field,
            format!(
                "{value:?} is not a valid name: {}",
                edgeloop_models::names::NAME_RULE
            ),
        ))
    }
}

/// Model versions: 1..=64 of [A-Za-z0-9._+-], starting with an alphanumeric
/// (the rule is the console API's, `edgeloop_api::registry::is_valid_version`,
/// so the CLI checks it before sending).
pub fn version(field: &str, value: &str) -> Result<(), Error> {
    if edgeloop_api::registry::is_valid_version(value) {
        Ok(())
    } else {
        Err(Error::bad_field(
            field,
            format!(
                "{value:?} is not a valid version: {}",
                edgeloop_api::registry::VERSION_RULE
            ),
        ))
    }
}

/// An alias name (`edgeloop_api::aliases::AliasName`'s rules), naming `field`.
pub fn alias(field: &str, value: &str) -> Result<edgeloop_api::aliases::AliasName, Error> {
    edgeloop_api::aliases::AliasName::new(value).map_err(|e| Error::bad_field(field, e.to_string()))
}

/// Labels follow Kubernetes' shape: keys of up to 63 characters from
/// [A-Za-z0-9._/-], values of up to 63 from [A-Za-z0-9._-]; at most 64 labels.
pub fn labels(field: &str, labels: &BTreeMap<String, String>) -> Result<(), Error> {
    if labels.len() > 64 {
        return Err(Error::bad_field(field, "at most 64 labels"));
    }
    for (k, v) in labels {
        let key_ok = (1..=63).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
        if !key_ok {
            return Err(Error::bad_field(
                format!("{field}.{k}"),
                format!("label key {k:?} is invalid"),
            ));
        }
        let value_ok = v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !value_ok {
            return Err(Error::bad_field(
                format!("{field}.{k}"),
                format!("label value {v:?} is invalid"),
            ));
        }
    }
    Ok(())
}

/// Free text with a length cap (descriptions, reasons).
pub fn text(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.len() > max {
        return Err(Error::bad_field(field, format!("at most {max} bytes")));
    }
    Ok(())
}

/// An ONNX Runtime execution provider's name, as devices report them
/// (`CUDAExecutionProvider`): 1 to 8 of them.
pub fn execution_providers(field: &str, providers: &[String]) -> Result<(), Error> {
    if providers.is_empty() || providers.len() > 8 {
        return Err(Error::bad_field(
            field,
            "must name 1 to 8 execution providers",
        ));
    }
    for (i, p) in providers.iter().enumerate() {
        let known = p.len() <= 64
            && p.strip_suffix("ExecutionProvider").is_some_and(|stem| {
                !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_alphanumeric())
            });
        if !known {
            return Err(Error::bad_field(
                format!("{field}[{i}]"),
                format!("{p:?} is not an execution provider name like CUDAExecutionProvider"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "cam-01", "x9", &"a".repeat(63)] {
            assert!(name("n", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "../x",
            &"a".repeat(64),
            "ü",
        ] {
            let err = name("n", bad).unwrap_err();
            assert!(
                matches!(err, Error::BadRequest { field: Some(ref f), .. } if f == "n"),
                "{bad}"
            );
        }
    }

    #[test]
    fn versions() {
        for good in ["1", "1.2.3", "v2-rc.1+build5"] {
            assert!(version("v", good).is_ok(), "{good}");
        }
        for bad in ["", ".1", "1/2", "a b", &"1".repeat(65)] {
            assert!(version("v", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_rules() {
        let ok: BTreeMap<_, _> = [
            ("site".to_string(), "berlin-1".to_string()),
            ("gpu".into(), "".into()),
        ]
        .into();
        assert!(labels("labels", &ok).is_ok());
        let bad: BTreeMap<_, _> = [("site".to_string(), "has space".to_string())].into();
        let err = labels("labels", &bad).unwrap_err();
        assert!(matches!(err, Error::BadRequest { field: Some(ref f), .. } if f == "labels.site"));
        let too_many: BTreeMap<_, _> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(labels("labels", &too_many).is_err());
    }
}
