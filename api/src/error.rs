//! The JSON body of every console-API error response.

use std::fmt;

use serde::{de, Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `bad_request`.
    pub code: String,
    pub message: String,
    /// The request field at fault, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// `field: message`, or the message alone: what a person reads.
impl fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{field}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// A deserializer's refusal of one field of the object it reads, for a
/// check serde cannot place on the field itself (one that depends on a
/// sibling, such as a trigger's `kind`). Its message is `` field `name`:
/// why ``: the server's body parser reads the name back ([`field_of`]) to
/// name the field in its 400, as it does for serde's `` missing field
/// `name` ``.
pub fn field_error<E: de::Error>(field: &str, why: impl fmt::Display) -> E {
    E::custom(format_args!("field `{field}`: {why}"))
}

/// The field and the reason of a [`field_error`]'s message.
pub fn field_of(message: &str) -> Option<(&str, &str)> {
    message.strip_prefix("field `")?.split_once("`: ")
}
