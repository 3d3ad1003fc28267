//! JSON request bodies. Every body goes through [`parse_body`], which turns
//! serde's errors into a 400 that names the field, and an over-limit body
//! into a 413.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::Core;
use edgeloop_errors::Error;

/// Parses a JSON body into `T`, naming the field at fault on error.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let syntax = |e: serde_json::Error| Error::BadRequest {
        field: None,
        message: format!("malformed JSON: {e}"),
    };
    let mut json: serde_json::Value = serde_json::from_slice(bytes).map_err(syntax)?;
    integral_numbers(&mut json);
    // Strictly: a struct is read from an object only, as the document says.
    let result: Result<T, _> = serde_path_to_error::deserialize(crate::strict_json::Strict(&json));
    let value = result.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // serde reports a missing field at its parent's path, with the
        // field's name in backticks, and so does a type that checks its
        // own fields (`field_error`); name the field itself.
        let (named, message) = match edgeloop_api::error::field_of(&message) {
            Some((name, why)) => (Some(name.to_string()), why.to_string()),
            None => {
                let missing = message
                    .strip_prefix("missing field `")
                    .and_then(|rest| rest.split('`').next())
                    .map(str::to_string);
                (missing, message)
            }
        };
        let field = match (path.as_str(), named.as_deref()) {
            (".", Some(name)) => Some(name.to_string()),
            (parent, Some(name)) => Some(format!("{parent}.{name}")),
            (".", None) => None,
            (p, None) => Some(p.to_string()),
        };
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("malformed JSON: {message}")
        } else {
            message
        };
        Error::BadRequest { field, message }
    })?;
    Ok(value)
}

/// JSON has one number type, and the document's `integer` (JSON Schema's)
/// includes `2.0`; serde's integer fields refuse it. So a number with no
/// fraction that fits an integer becomes that integer before the body is
/// read. An `f64` field reads the integer as the same value.
fn integral_numbers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0) {
                // Exactly representable range only: beyond 2^53 an f64 is
                // not one integer, so it stays a float (and is refused).
                const EXACT: f64 = 9_007_199_254_740_992.0;
                if (-EXACT..=EXACT).contains(&f) {
                    // In range, so the cast is exact.
                    *n = serde_json::Number::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// A JSON body, validated as described in the module docs.
pub struct ValidJson<T>(pub T);

/// Like [`ValidJson`], but an empty body means `T::default()`.
pub struct OptionalJson<T>(pub T);

/// Reads the whole body, refusing more than `limit` bytes without reading them all.
pub async fn body_bytes(req: Request, limit: usize) -> Result<Bytes, Error> {
    let too_large = Error::PayloadTooLarge {
        limit: limit as u64,
    };
    if let Some(len) = req.headers().get(http::header::CONTENT_LENGTH) {
        if len
            .to_str()
            .ok()
            .and_then(|l| l.parse::<u64>().ok())
            .is_some_and(|l| l > limit as u64)
        {
            return Err(too_large);
        }
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large),
        Err(e) => Err(Error::BadRequest {
            field: None,
            message: format!("reading the request body failed: {e}"),
        }),
    }
}

impl<T: DeserializeOwned> FromRequest<Arc<Core>> for ValidJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, core: &Arc<Core>) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, core.config.max_json_bytes).await?;
        Ok(ValidJson(parse_body(&bytes)?))
    }
}

impl<T: DeserializeOwned + Default> FromRequest<Arc<Core>> for OptionalJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, core: &Arc<Core>) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, core.config.max_json_bytes).await?;
        // No body and a JSON `null` both mean "nothing given": the document
        // declares the body optional and nullable. A body of only
        // whitespace is neither, and not JSON either.
        if bytes.is_empty() || bytes.trim_ascii() == b"null" {
            return Ok(OptionalJson(T::default()));
        }
        Ok(OptionalJson(parse_body(&bytes)?))
    }
}

/// Path parameters. axum's own rejection (a segment that is not valid
/// percent-encoded UTF-8, say) is a plain-text 400; this one is our
/// `{"error": ...}` body like every other 400.
pub struct ValidPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ValidPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ValidPath(value)),
            Err(e) => Err(Error::bad_field("path", e.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::members::CreateToken;
    use edgeloop_registry::models::{CreateModel, CreateModelVersion};
    use proptest::prelude::*;

    fn field_of(body: &str) -> Option<String> {
        match parse_body::<CreateToken>(body.as_bytes()) {
            Err(Error::BadRequest { field, .. }) => field,
            other => panic!("expected 400 for {body}, got {other:?}"),
        }
    }

    #[test]
    fn names_the_field() {
        assert_eq!(
            field_of(r#"{"kind":"device","colour":"red"}"#).as_deref(),
            Some("colour")
        );
        assert_eq!(field_of(r#"{"name":"x"}"#).as_deref(), Some("kind"));
        assert_eq!(field_of(r#"{"kind":"toaster"}"#).as_deref(), Some("kind"));
        assert_eq!(
            field_of(r#"{"kind":"device","ttl_seconds":"soon"}"#).as_deref(),
            Some("ttl_seconds")
        );
        assert_eq!(
            field_of(r#"{"kind":"device","labels":{"a":1}}"#).as_deref(),
            Some("labels.a")
        );
        match parse_body::<CreateToken>(br#"{"kind":"#) {
            Err(Error::BadRequest { message, .. }) => {
                assert!(message.starts_with("malformed JSON"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(field_of("42"), None);
        assert!(parse_body::<CreateToken>(br#"{"kind":"cluster"}"#).is_ok());
    }

    #[test]
    fn nested_unknown_field_is_named() {
        let body = r#"{"artifact_digest":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","lineage":{"parent":"1"}}"#;
        match parse_body::<CreateModelVersion>(body.as_bytes()) {
            Err(Error::BadRequest { field, .. }) => {
                assert_eq!(field.as_deref(), Some("lineage.parent"))
            }
            other => panic!("{other:?}"),
        }
        match parse_body::<CreateModelVersion>(br#"{"artifact_digest":"nope"}"#) {
            Err(Error::BadRequest { field, message }) => {
                assert_eq!(field.as_deref(), Some("artifact_digest"));
                assert!(message.contains("64 hex"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// serde's derive would take a struct's fields in order from an array;
    /// the document says object, and so does the parser, at any depth.
    #[test]
    fn a_struct_is_an_object_never_an_array() {
        assert_eq!(field_of(r#"["device"]"#), None);
        let body = r#"{"artifact_digest":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","lineage":[]}"#;
        match parse_body::<CreateModelVersion>(body.as_bytes()) {
            Err(Error::BadRequest { field, message }) => {
                assert_eq!(field.as_deref(), Some("lineage"));
                assert!(message.contains("invalid type: sequence"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        // Untrusted bodies: any bytes give Ok or a 400, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for r in [
                parse_body::<CreateToken>(&bytes).map(|_| ()),
                parse_body::<CreateModel>(&bytes).map(|_| ()),
                parse_body::<CreateModelVersion>(&bytes).map(|_| ()),
            ] {
                let ok = matches!(r, Ok(()) | Err(Error::BadRequest { .. }));
                prop_assert!(ok, "unexpected result");
            }
        }

        // Structured fuzzing: JSON objects with random keys and values.
        #[test]
        fn arbitrary_json_objects_never_panic(
            obj in proptest::collection::btree_map(
                "[a-z_]{1,12}",
                prop_oneof![
                    Just(serde_json::Value::Null),
                    any::<bool>().prop_map(serde_json::Value::from),
                    any::<i64>().prop_map(serde_json::Value::from),
                    any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, serde_json::Value::Number)),
                    ".{0,20}".prop_map(serde_json::Value::from),
                    Just(serde_json::json!({"nested": [1, "two", {"three": 3}]})),
                ],
                0..8,
            )
        ) {
            let bytes = serde_json::to_vec(&obj).unwrap();
            for r in [
                parse_body::<CreateToken>(&bytes).map(|_| ()),
                parse_body::<CreateModel>(&bytes).map(|_| ()),
                parse_body::<CreateModelVersion>(&bytes).map(|_| ()),
            ] {
                let ok = matches!(r, Ok(()) | Err(Error::BadRequest { .. }));
                prop_assert!(ok, "unexpected result");
            }
        }
    }
}
