//! Console sessions: a person logs in with an API token once; the browser
//! then holds only a random session id, in an HttpOnly, SameSite=Strict
//! cookie (never in a URL, never readable by scripts). The store keeps the
//! id's sha256, so a store dump holds no usable session, and which token
//! the session stands for: every request re-reads that token, so a session
//! ends when its token is revoked or expires, not only when it times out.
//! Each session has its own CSRF secret, sent with every state-changing
//! form and compared here.

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::{Host, Trees};
use edgeloop_auth::{tokens, Principal};
use edgeloop_errors::Result;

/// The session cookie's name.
pub const COOKIE: &str = "edgeloop_console";
/// How long a session lives from login, at most.
pub const LIFETIME: Duration = Duration::hours(8);

/// Who a session stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Caller {
    /// The data dir's bootstrap admin token.
    BootstrapAdmin,
    /// An API token, by its record's key (the secret's sha256).
    ApiToken { key: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub caller: Caller,
    /// Sent with every form that changes something.
    pub csrf: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// A live session: who, and the secret its forms carry.
#[derive(Debug, Clone)]
pub struct Session {
    pub principal: Principal,
    pub csrf: String,
}

fn key(id: &str) -> String {
    Digest::of(id.as_bytes()).to_hex()
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Starts a session for the secret presented at login; `None` when the
/// secret is no live token. Returns the new session's id (the cookie).
pub fn login(host: &dyn Host, secret: &str) -> Result<Option<String>> {
    let secret = secret.trim();
    let now = host.now();
    let caller = if host.is_admin_token(secret) {
        Caller::BootstrapAdmin
    } else if tokens::authenticate(host.tokens(), secret, now)?.is_some() {
        Caller::ApiToken {
            key: tokens::record_key(secret),
        }
    } else {
        return Ok(None);
    };
    let id = random_hex();
    let record = SessionRecord {
        caller,
        csrf: random_hex(),
        expires_at: now + LIFETIME,
    };
    host.sessions().sessions.insert(&key(&id), &record)?;
    forget_expired(host.sessions(), now)?;
    Ok(Some(id))
}

/// The session a cookie names, if it is live and its token still is.
pub fn lookup(host: &dyn Host, id: &str) -> Result<Option<Session>> {
    // Ids are 64 hex digits; anything else was never issued.
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let now = host.now();
    let Some(record) = host.sessions().sessions.get(&key(id))? else {
        return Ok(None);
    };
    if now >= record.expires_at {
        host.sessions().sessions.remove(&key(id))?;
        return Ok(None);
    }
    let principal = match &record.caller {
        Caller::BootstrapAdmin => Some(Principal::bootstrap_admin()),
        Caller::ApiToken { key } => tokens::principal_by_key(host.tokens(), key, now)?,
    };
    Ok(principal.map(|principal| Session {
        principal,
        csrf: record.csrf,
    }))
}

/// Ends a session (logout).
pub fn logout(host: &dyn Host, id: &str) -> Result<()> {
    if id.len() == 64 {
        host.sessions().sessions.remove(&key(id))?;
    }
    Ok(())
}

/// Whether a form's CSRF value is the session's. Compared as digests, so
/// the time taken says nothing about how much of it matched.
pub fn csrf_matches(session: &Session, presented: &str) -> bool {
    Digest::of(presented.as_bytes()) == Digest::of(session.csrf.as_bytes())
}

/// Drops sessions past their end, so logins that never log out do not
/// pile up. Sessions are few (people, not devices): a scan is fine.
fn forget_expired(store: &Trees, now: OffsetDateTime) -> Result<()> {
    let expired: Vec<String> = store
        .sessions
        .scan_prefix("")?
        .into_iter()
        .filter(|(_, r)| now >= r.expires_at)
        .map(|(k, _)| k)
        .collect();
    let keys: Vec<&str> = expired.iter().map(String::as_str).collect();
    store.sessions.remove_many(&keys)?;
    Ok(())
}

/// The value of the session cookie in a request's `Cookie` headers.
pub fn cookie_value(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The `Set-Cookie` value that starts a session. `Secure` when the console
/// is served over TLS (a browser drops a Secure cookie sent over plain
/// HTTP elsewhere than localhost).
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
        LIFETIME.whole_seconds(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that ends one.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others_and_nothing_else_is_taken() {
        let mut h = axum::http::HeaderMap::new();
        h.append("cookie", "a=1; edgeloop_console=abc; b=2".parse().unwrap());
        assert_eq!(cookie_value(&h).as_deref(), Some("abc"));
        let mut h = axum::http::HeaderMap::new();
        h.append("cookie", "edgeloop_console_x=1".parse().unwrap());
        h.append("cookie", "other=edgeloop_console".parse().unwrap());
        assert_eq!(cookie_value(&h), None);
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_over_tls() {
        let c = set_cookie("id", true);
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/ui"] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!set_cookie("id", false).contains("Secure"));
        assert!(clear_cookie(false).contains("Max-Age=0"));
    }
}
