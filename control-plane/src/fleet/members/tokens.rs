//! One-time bootstrap tokens: created by an operator, spent by the
//! enrolment they name (see `enrol.rs`), shown without their secret.

use std::collections::BTreeMap;

use edgeloop_client_core::BootstrapToken;
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::{CreateToken, CreatedToken, MemberKind, TokenState, TokenView};
use crate::db::Db;
use crate::fleet::pki::Pki;
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BootstrapTokenRecord {
    pub id: String,
    pub kind: MemberKind,
    /// The id the member will get.
    pub member_id: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The project the member will belong to.
    #[serde(default = "edgeloop_api::access::default_project")]
    pub project: String,
    /// sha256 of the secret; the secret itself is never stored.
    pub secret_hash: Digest,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub used_at: Option<OffsetDateTime>,
    /// What the token was spent on: the key it enrolled and the certificate
    /// issued for it, so that the same member retrying after a lost reply
    /// gets the same answer (a bootstrap token stays single-use: no other
    /// key can use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolled: Option<EnrolledKey>,
}

/// The key a bootstrap token enrolled and the certificate it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnrolledKey {
    /// sha256 of the public key (its SubjectPublicKeyInfo DER).
    pub key: Digest,
    pub certificate_pem: String,
    pub fingerprint: Digest,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
}

pub fn token_state(t: &BootstrapTokenRecord, now: OffsetDateTime) -> TokenState {
    if t.used_at.is_some() {
        TokenState::Used
    } else if now >= t.expires_at {
        TokenState::Expired
    } else {
        TokenState::Unused
    }
}

/// A token as the console API shows it (never its secret).
pub fn token_view(t: BootstrapTokenRecord, now: OffsetDateTime) -> TokenView {
    TokenView {
        state: token_state(&t, now),
        id: t.id,
        kind: t.kind,
        member_id: t.member_id,
        labels: t.labels,
        created_at: t.created_at,
        expires_at: t.expires_at,
    }
}

pub const MIN_TOKEN_TTL: u64 = 60;
pub const MAX_TOKEN_TTL: u64 = 30 * 24 * 3600;
pub const DEFAULT_TOKEN_TTL: u64 = 24 * 3600;

pub async fn create_token(
    store: &Db,
    pki: &Pki,
    req: CreateToken,
    now: OffsetDateTime,
) -> Result<CreatedToken> {
    let member_id = match req.name {
        Some(name) => {
            validate::name("name", &name)?;
            name
        }
        None => format!(
            "{}-{:08x}",
            match req.kind {
                MemberKind::Device => "dev",
                MemberKind::Cluster => "cluster",
            },
            rand::random::<u32>()
        ),
    };
    let labels = req.labels.unwrap_or_default();
    validate::labels("labels", &labels)?;
    if req.project.is_some() && req.kind == MemberKind::Cluster {
        return Err(Error::bad_field(
            "project",
            "clusters are shared by every project; only a device belongs to one",
        ));
    }
    let project = validate::project(req.project)?;
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_TOKEN_TTL);
    if !(MIN_TOKEN_TTL..=MAX_TOKEN_TTL).contains(&ttl) {
        return Err(Error::bad_field(
            "ttl_seconds",
            format!("must be between {MIN_TOKEN_TTL} and {MAX_TOKEN_TTL}"),
        ));
    }
    if let Some(existing) = store.fleet.members(req.kind).get(&member_id)? {
        // Ids are never reused, so a revoked certificate can never come back
        // to life under a new enrollment.
        let why = if existing.revoked_at.is_some() {
            "was revoked; ids are not reused"
        } else {
            "is already enrolled"
        };
        return Err(Error::Conflict(format!(
            "{} {member_id:?} {why}",
            req.kind.as_str()
        )));
    }
    let pending = store.fleet.tokens.values()?.into_iter().any(|t| {
        t.kind == req.kind && t.member_id == member_id && token_state(&t, now) == TokenState::Unused
    });
    if pending {
        return Err(Error::Conflict(format!(
            "an unused bootstrap token for {} {member_id:?} already exists",
            req.kind.as_str()
        )));
    }
    let token = BootstrapToken::generate(pki.ca_fingerprint());
    let record = BootstrapTokenRecord {
        id: token.id.clone(),
        kind: req.kind,
        member_id: member_id.clone(),
        labels,
        project,
        secret_hash: token.secret_hash(),
        created_at: now,
        expires_at: now + Duration::seconds(ttl as i64),
        used_at: None,
        enrolled: None,
    };
    if !store.fleet.tokens.insert_new(&record.id, &record)? {
        return Err(Error::Internal(anyhow::anyhow!("token id collision")));
    }
    store.flush().await?;
    Ok(CreatedToken {
        token: token.to_string(),
        id: record.id,
        kind: record.kind,
        member_id,
        expires_at: record.expires_at,
        ca_fingerprint: pki.ca_fingerprint().to_string(),
    })
}

/// Why a token cannot enroll, or None if it can. Pure, so it is tested as a table.
pub fn token_refusal(
    record: &BootstrapTokenRecord,
    presented_secret_hash: Digest,
    kind: MemberKind,
    now: OffsetDateTime,
) -> Option<Error> {
    if record.secret_hash != presented_secret_hash {
        return Some(Error::Unauthenticated("unknown bootstrap token".into()));
    }
    if record.kind != kind {
        return Some(Error::PermissionDenied(format!(
            "this bootstrap token enrolls a {}, not a {}",
            record.kind.as_str(),
            kind.as_str()
        )));
    }
    match token_state(record, now) {
        TokenState::Used => Some(Error::Unauthenticated(
            "bootstrap token was already used".into(),
        )),
        TokenState::Expired => Some(Error::Unauthenticated("bootstrap token has expired".into())),
        TokenState::Unused => None,
    }
}
