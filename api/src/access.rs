//! Who may call the console API: API tokens with a role and optional
//! projects (`/api/v1/api-tokens`), and the audit log of every
//! state-changing call (`/api/v1/audit`). The control plane's records and
//! its route → permission table are in `auth/src/`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// What a token may do. Roles are fixed, not configurable: four are enough
/// to separate the people who ship models from the people who train them,
/// and a fixed set keeps the route table reviewable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, including tokens, enrollment, revocation and the audit log.
    Admin,
    /// Models, versions, aliases, deployments, benchmarks and devices' labels.
    Deployer,
    /// Jobs, retraining policies and triggers, pipelines, sample labels.
    Trainer,
    /// Read only.
    Viewer,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Deployer, Role::Trainer, Role::Viewer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Deployer => "deployer",
            Role::Trainer => "trainer",
            Role::Viewer => "viewer",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?} (admin, deployer, trainer or viewer)"))
    }
}

/// The project every record belongs to unless it names another.
pub const DEFAULT_PROJECT: &str = "default";

/// For serde: records written before projects existed are in the default one.
pub fn default_project() -> String {
    DEFAULT_PROJECT.to_string()
}

/// At most this many projects on one token.
pub const MAX_TOKEN_PROJECTS: usize = 64;

/// `POST /api/v1/api-tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateApiToken {
    /// A name for people (who or what holds the token): 1 to 63 of
    /// `a-z0-9-`, unique among live tokens.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            min_length = 1,
            max_length = 63
        )
    )]
    pub name: String,
    pub role: Role,
    /// The projects the token sees and changes; every project when absent.
    /// An admin token is never scoped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::access::token_projects))]
    pub projects: Option<Vec<String>>,
    /// Lifetime in seconds (60 to 63 072 000, two years); no expiry when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 60, maximum = 63072000))]
    pub expires_in_seconds: Option<u64>,
}

/// Longest lifetime a token may be given.
pub const MAX_TOKEN_LIFETIME_SECONDS: u64 = 2 * 365 * 24 * 3600;

/// An API token as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiTokenView {
    /// `k-<n>`: what the audit log names and `DELETE` takes.
    pub id: String,
    pub name: String,
    pub role: Role,
    /// Absent: every project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projects: Option<Vec<String>>,
    /// The token id that created this one (`admin` for the bootstrap token).
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<OffsetDateTime>,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub revoked_at: Option<OffsetDateTime>,
    pub state: ApiTokenState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ApiTokenState {
    Active,
    Expired,
    Revoked,
}

/// The answer to `POST /api/v1/api-tokens`: the only time the secret is shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedApiToken {
    /// The bearer secret. Only its sha256 is stored.
    pub token: String,
    /// sha256 of the control plane's CA certificate: what a client of a
    /// console served with `--http-tls` pins (`--ca-fingerprint`).
    pub ca_fingerprint: String,
    #[serde(flatten)]
    pub view: ApiTokenView,
}

/// One state-changing console call, as the audit log recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// Increasing: the order calls finished in.
    pub seq: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The token id (`admin` for the bootstrap token; `-` when none was
    /// valid).
    pub token_id: String,
    /// The token's name, as it was at the call.
    pub token_name: String,
    pub method: String,
    /// The route, as the permission table names it (`/api/v1/models/{name}`).
    pub route: String,
    /// The path called: the target (`/api/v1/models/digits`).
    pub target: String,
    /// The HTTP status answered.
    pub status: u16,
    /// `ok` (2xx), `refused` (401, 403) or `failed` (anything else).
    pub result: AuditResult,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AuditResult {
    Ok,
    Refused,
    Failed,
}

impl AuditResult {
    pub fn of_status(status: u16) -> AuditResult {
        match status {
            200..=299 => AuditResult::Ok,
            401 | 403 => AuditResult::Refused,
            _ => AuditResult::Failed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuditResult::Ok => "ok",
            AuditResult::Refused => "refused",
            AuditResult::Failed => "failed",
        }
    }
}
