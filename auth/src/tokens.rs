//! API tokens: a bearer secret with a role and optional projects. Only the
//! secret's sha256 is stored, as the record's key, so a request costs one
//! keyed read and a store dump reveals no usable secret.

use std::collections::BTreeSet;

use edgeloop_api::access::{
    ApiTokenState, ApiTokenView, CreateApiToken, CreatedApiToken, Role, MAX_TOKEN_LIFETIME_SECONDS,
    MAX_TOKEN_PROJECTS,
};
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::Principal;
use crate::Trees;
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

/// What distinguishes an API token from the bootstrap admin token (`ela1_`)
/// and enrollment tokens when one turns up in a log.
const SECRET_PREFIX: &str = "elk1_";
pub const MIN_LIFETIME_SECONDS: u64 = 60;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiTokenRecord {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// `None`: every project.
    pub projects: Option<BTreeSet<String>>,
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
}

pub fn state(r: &ApiTokenRecord, now: OffsetDateTime) -> ApiTokenState {
    if r.revoked_at.is_some() {
        ApiTokenState::Revoked
    } else if r.expires_at.is_some_and(|e| now >= e) {
        ApiTokenState::Expired
    } else {
        ApiTokenState::Active
    }
}

pub fn view(r: &ApiTokenRecord, now: OffsetDateTime) -> ApiTokenView {
    ApiTokenView {
        id: r.id.clone(),
        name: r.name.clone(),
        role: r.role,
        projects: r.projects.as_ref().map(|p| p.iter().cloned().collect()),
        created_by: r.created_by.clone(),
        created_at: r.created_at,
        expires_at: r.expires_at,
        revoked_at: r.revoked_at,
        state: state(r, now),
    }
}

fn key(secret: &str) -> String {
    Digest::of(secret.as_bytes()).to_hex()
}

/// The store key of a secret's record (its sha256): what a console session
/// keeps to find its token again without keeping the secret.
pub fn record_key(secret: &str) -> String {
    key(secret)
}

/// The principal a presented secret stands for, if it is a live API token.
pub fn authenticate(store: &Trees, secret: &str, now: OffsetDateTime) -> Result<Option<Principal>> {
    if !secret.starts_with(SECRET_PREFIX) {
        return Ok(None);
    }
    principal_by_key(store, &key(secret), now)
}

/// The principal of the token stored under `key`, if it is still live.
pub fn principal_by_key(
    store: &Trees,
    key: &str,
    now: OffsetDateTime,
) -> Result<Option<Principal>> {
    let Some(record) = store.api_tokens.get(key)? else {
        return Ok(None);
    };
    Ok(match state(&record, now) {
        ApiTokenState::Active => Some(Principal {
            token_id: record.id,
            token_name: record.name,
            role: record.role,
            projects: record.projects,
        }),
        ApiTokenState::Expired | ApiTokenState::Revoked => None,
    })
}

/// Checks a creation request. Pure, so its table test needs no store.
fn check(req: &CreateApiToken) -> Result<Option<BTreeSet<String>>> {
    validate::name("name", &req.name)?;
    if let Some(s) = req.expires_in_seconds {
        if !(MIN_LIFETIME_SECONDS..=MAX_TOKEN_LIFETIME_SECONDS).contains(&s) {
            return Err(Error::bad_field(
                "expires_in_seconds",
                format!("must be between {MIN_LIFETIME_SECONDS} and {MAX_TOKEN_LIFETIME_SECONDS}"),
            ));
        }
    }
    let Some(projects) = &req.projects else {
        return Ok(None);
    };
    if req.role == Role::Admin {
        // An admin creates tokens, so a scoped admin could mint itself an
        // unscoped one: the scope would be a false promise.
        return Err(Error::bad_field(
            "projects",
            "an admin token is never scoped to projects; give it no projects, or another role",
        ));
    }
    if projects.is_empty() || projects.len() > MAX_TOKEN_PROJECTS {
        return Err(Error::bad_field(
            "projects",
            format!("must name 1 to {MAX_TOKEN_PROJECTS} projects (absent: every project)"),
        ));
    }
    let mut set = BTreeSet::new();
    for (i, p) in projects.iter().enumerate() {
        validate::name(&format!("projects[{i}]"), p)?;
        if !set.insert(p.clone()) {
            return Err(Error::bad_field(
                format!("projects[{i}]"),
                format!("{p:?} is listed twice"),
            ));
        }
    }
    Ok(Some(set))
}

pub async fn create(
    store: &Trees,
    by: &Principal,
    req: CreateApiToken,
    ca_fingerprint: Digest,
    now: OffsetDateTime,
) -> Result<CreatedApiToken> {
    let projects = check(&req)?;
    let secret = format!("{SECRET_PREFIX}{}", hex::encode(rand::random::<[u8; 32]>()));
    let record = ApiTokenRecord {
        id: format!("k-{}", store.next_id()?),
        name: req.name,
        role: req.role,
        projects,
        created_by: by.token_id.clone(),
        created_at: now,
        expires_at: req
            .expires_in_seconds
            .map(|s| now + Duration::seconds(s as i64)),
        revoked_at: None,
    };
    if !store.api_tokens.insert_new(&key(&secret), &record)? {
        // 256 random bits collided: not in this universe, but never overwrite.
        return Err(Error::Conflict("token secret collision; retry".into()));
    }
    store.flush().await?;
    Ok(CreatedApiToken {
        token: secret,
        ca_fingerprint: ca_fingerprint.to_hex(),
        view: view(&record, now),
    })
}

pub fn list(store: &Trees, now: OffsetDateTime) -> Result<Vec<ApiTokenView>> {
    let mut all: Vec<_> = store.api_tokens.values()?;
    // Ids are `k-<seq>`: order by the number, i.e. by creation.
    all.sort_by_key(|r| id_number(&r.id));
    Ok(all.iter().map(|r| view(r, now)).collect())
}

fn id_number(id: &str) -> u64 {
    id.strip_prefix("k-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Revokes at once: the next request with the token is refused. Revoking a
/// revoked token answers its view again (idempotent).
pub async fn revoke(store: &Trees, id: &str, now: OffsetDateTime) -> Result<ApiTokenView> {
    let found = store
        .api_tokens
        .scan_prefix("")?
        .into_iter()
        .find(|(_, r)| r.id == id);
    let Some((key, _)) = found else {
        return Err(Error::not_found("api token", id));
    };
    let r = store.api_tokens.update(&key, |r| -> Result<_> {
        let mut r = r.ok_or_else(|| Error::not_found("api token", id))?;
        r.revoked_at.get_or_insert(now);
        Ok(r)
    })??;
    store.flush().await?;
    Ok(view(&r, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn req(role: Role, projects: Option<&[&str]>, expires: Option<u64>) -> CreateApiToken {
        CreateApiToken {
            name: "ci".into(),
            role,
            projects: projects.map(|p| p.iter().map(|s| s.to_string()).collect()),
            expires_in_seconds: expires,
        }
    }

    #[test]
    fn creation_requests_are_checked() {
        let cases: &[(CreateApiToken, Option<&str>)] = &[
            (req(Role::Viewer, None, None), None),
            (
                req(Role::Trainer, Some(&["vision", "audio"]), Some(3600)),
                None,
            ),
            (req(Role::Admin, Some(&["vision"]), None), Some("projects")),
            (req(Role::Viewer, Some(&[]), None), Some("projects")),
            (
                req(Role::Viewer, Some(&["a", "a"]), None),
                Some("projects[1]"),
            ),
            (
                req(Role::Viewer, Some(&["Bad Name"]), None),
                Some("projects[0]"),
            ),
            (
                req(Role::Viewer, None, Some(59)),
                Some("expires_in_seconds"),
            ),
            (
                req(Role::Viewer, None, Some(MAX_TOKEN_LIFETIME_SECONDS + 1)),
                Some("expires_in_seconds"),
            ),
            (
                CreateApiToken {
                    name: "-x".into(),
                    ..req(Role::Viewer, None, None)
                },
                Some("name"),
            ),
        ];
        for (r, field) in cases {
            match (check(r), field) {
                (Ok(_), None) => {}
                (Err(Error::BadRequest { field: Some(f), .. }), Some(want)) => {
                    assert_eq!(f, *want, "{r:?}")
                }
                (got, want) => panic!("{r:?}: {got:?}, wanted error on {want:?}"),
            }
        }
    }

    #[test]
    fn state_follows_expiry_and_revocation() {
        let t0 = datetime!(2026-01-01 0:00 UTC);
        let mut r = ApiTokenRecord {
            id: "k-1".into(),
            name: "ci".into(),
            role: Role::Viewer,
            projects: None,
            created_by: "admin".into(),
            created_at: t0,
            expires_at: Some(t0 + Duration::hours(1)),
            revoked_at: None,
        };
        let table = [
            (t0, ApiTokenState::Active),
            (t0 + Duration::minutes(59), ApiTokenState::Active),
            (t0 + Duration::hours(1), ApiTokenState::Expired),
        ];
        for (now, want) in table {
            assert_eq!(state(&r, now), want, "{now}");
        }
        r.revoked_at = Some(t0);
        assert_eq!(state(&r, t0), ApiTokenState::Revoked);
    }

    #[tokio::test]
    async fn a_revoked_or_expired_token_no_longer_authenticates() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Trees::open(&edgeloop_store::Store::open(&dir.path().join("db")).unwrap()).unwrap();
        let t0 = datetime!(2026-01-01 0:00 UTC);
        let admin = Principal::bootstrap_admin();
        let a = create(
            &store,
            &admin,
            req(Role::Viewer, None, Some(60)),
            Digest::of(b"ca"),
            t0,
        )
        .await
        .unwrap();
        let b = create(
            &store,
            &admin,
            req(Role::Trainer, Some(&["vision"]), None),
            Digest::of(b"ca"),
            t0,
        )
        .await
        .unwrap();
        let who = authenticate(&store, &a.token, t0).unwrap().unwrap();
        assert_eq!(
            (who.role, who.token_id.as_str()),
            (Role::Viewer, a.view.id.as_str())
        );
        assert!(authenticate(&store, &a.token, t0 + Duration::seconds(60))
            .unwrap()
            .is_none());
        let scoped = authenticate(&store, &b.token, t0).unwrap().unwrap();
        assert!(scoped.sees("vision") && !scoped.sees("audio"));
        revoke(&store, &b.view.id, t0).await.unwrap();
        assert!(authenticate(&store, &b.token, t0).unwrap().is_none());
        assert!(authenticate(&store, "elk1_0000", t0).unwrap().is_none());
        let listed = list(&store, t0).unwrap();
        assert_eq!(
            listed.iter().map(|v| v.state).collect::<Vec<_>>(),
            [ApiTokenState::Active, ApiTokenState::Revoked]
        );
        assert!(matches!(
            revoke(&store, "k-999", t0).await,
            Err(Error::NotFound { .. })
        ));
    }
}
