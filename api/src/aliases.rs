//! Model aliases as the console API shows them
//! (`/api/v1/models/{model}/aliases/...`): a name such as `production` or
//! `staging` that points at one version of a model, and moves. Every move
//! is kept in the alias's history. The store's record is in
//! `registry/src/aliases.rs`.
//!
//! An alias and a version can be named in the same places (a deployment, a
//! pull), so they must never be confused:
//! - an alias starts with a lowercase letter and has only `a-z`, `0-9` and
//!   `-`, so the registry's numbered versions (`1`, `2`, `1.2.0`) are never
//!   aliases, and `v` followed by a digit (`v2`, `v1-rc`) is refused as
//!   looking like a version;
//! - within a model, no alias has the name of a version and no version the
//!   name of an alias (the server refuses either with 409);
//! - where either may be given, a name resolves as a version first.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// The alias rule in words, for error messages.
pub const ALIAS_RULE: &str = "use 1-63 lowercase letters, digits and '-', starting with a letter \
     and not ending with '-'; 'v' followed by a digit looks like a version and is refused";

/// The alias rule as a pattern, for the OpenAPI document. Without
/// lookahead (OpenAPI tooling's regex engines rarely support it): a
/// lowercase letter other than `v` first, or `v` not followed by a digit.
pub const ALIAS_PATTERN: &str =
    "^([a-uw-z]([a-z0-9-]{0,61}[a-z0-9])?|v([a-z]|[a-z-][a-z0-9-]{0,60}[a-z0-9])?)$";

/// Why a string is not an alias name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid alias: {reason}")]
pub struct InvalidAlias {
    pub value: String,
    pub reason: &'static str,
}

/// A validated alias name (see the module's rules). Serialized as the bare
/// string; deserializing checks it, so a view or request holding one is
/// always valid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(value_type = String, pattern = "^([a-uw-z]([a-z0-9-]{0,61}[a-z0-9])?|v([a-z]|[a-z-][a-z0-9-]{0,60}[a-z0-9])?)$", example = "production")
)]
#[serde(try_from = "String", into = "String")]
pub struct AliasName(String);

impl AliasName {
    pub fn new(value: impl Into<String>) -> Result<AliasName, InvalidAlias> {
        let value = value.into();
        match alias_problem(&value) {
            None => Ok(AliasName(value)),
            Some(reason) => Err(InvalidAlias { value, reason }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What is wrong with `value` as an alias, if anything. Pure.
fn alias_problem(value: &str) -> Option<&'static str> {
    let bytes = value.as_bytes();
    let Some(&first) = bytes.first() else {
        return Some("it is empty");
    };
    if value.len() > 63 {
        return Some("longer than 63 characters");
    }
    if !bytes
        .iter()
        .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
    {
        return Some("only lowercase letters, digits and '-' are allowed");
    }
    if !first.is_ascii_lowercase() {
        return Some("it must start with a lowercase letter (a version may start with a digit)");
    }
    if value.ends_with('-') {
        return Some("it must not end with '-'");
    }
    if first == b'v' && bytes.get(1).is_some_and(u8::is_ascii_digit) {
        return Some("'v' followed by a digit looks like a version");
    }
    None
}

impl TryFrom<String> for AliasName {
    type Error = InvalidAlias;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        AliasName::new(value)
    }
}

impl From<AliasName> for String {
    fn from(a: AliasName) -> String {
        a.0
    }
}

impl FromStr for AliasName {
    type Err = InvalidAlias;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AliasName::new(s)
    }
}

impl fmt::Display for AliasName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for AliasName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `PUT /api/v1/models/{model}/aliases/{alias}`: point the alias at a
/// version (creating it, or moving it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetAlias {
    /// An existing version of the model (not another alias).
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
            min_length = 1,
            max_length = 64,
            example = "1.2.0"
        )
    )]
    pub version: String,
    /// Why it moved, for the history (at most 512 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 512, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")
    )]
    pub reason: Option<String>,
}

/// An alias and the version it points at (each entry of `GET
/// /api/v1/models/{model}/aliases`, and the answer of a `PUT`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasView {
    pub model: String,
    pub alias: AliasName,
    pub version: String,
    /// When it last moved, and who moved it.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    pub updated_by: String,
}

/// One move of an alias: created (`from` absent), moved, or deleted (`to`
/// absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasChange {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The principal that moved it: the console API's admin (`admin`) today.
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /api/v1/models/{model}/aliases/{alias}/history`: every move, oldest
/// first; `version` is where it points now (absent once deleted: a deleted
/// alias keeps its history).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AliasHistoryView {
    pub model: String,
    pub alias: AliasName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub history: Vec<AliasChange>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_names() {
        for good in [
            "production",
            "staging",
            "a",
            "canary-2",
            "x9",
            "va",
            &"a".repeat(63),
        ] {
            assert!(AliasName::new(good).is_ok(), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("Production", "lowercase"),
            ("1", "start with a lowercase letter"),
            ("2.0.0", "lowercase letters"),
            ("v2", "looks like a version"),
            ("v1-rc", "looks like a version"),
            ("-a", "start with"),
            ("a-", "end with"),
            ("a_b", "lowercase letters"),
            ("a.b", "lowercase letters"),
            ("a/b", "lowercase letters"),
            ("prod uction", "lowercase letters"),
            ("ü", "lowercase letters"),
        ] {
            let e = AliasName::new(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        assert!(AliasName::new("a".repeat(64))
            .unwrap_err()
            .to_string()
            .contains("63"));
    }

    #[test]
    fn a_numbered_or_semantic_version_is_never_an_alias() {
        for v in ["1", "12", "1.2.3", "0.1.0-rc.1", "v1", "v2.0.0", "V1"] {
            assert!(crate::registry::is_valid_version(v), "{v}");
            assert!(AliasName::new(v).is_err(), "{v}");
        }
    }

    #[test]
    fn names_are_checked_when_read() {
        let ok: AliasName = serde_json::from_value(serde_json::json!("staging")).unwrap();
        assert_eq!(ok.as_str(), "staging");
        assert_eq!(serde_json::to_value(&ok).unwrap(), "staging");
        let e = serde_json::from_value::<AliasName>(serde_json::json!("Staging")).unwrap_err();
        assert!(e.to_string().contains("not a valid alias"), "{e}");
    }
}
