//! Devices and cluster bridges ("members"), the one-time bootstrap tokens that
//! enroll them, and the decisions about them: is a token usable, is a member
//! online, may this certificate call. The decisions are pure functions of the
//! record and `now`; the functions that touch the store are thin.

use std::collections::BTreeMap;

use edgeloop_api::fleet::NodePool;
use edgeloop_client_core::BootstrapToken;
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::error::{Error, Result};
use crate::fleet::pki::{Pki, SignedCert};
use crate::fleet::renewal::{self, Admission, PendingCert, PreviousCert, Refusal};
use crate::fleet::{Events, FleetEvent};
use crate::store::Store;
use crate::validate;

/// The member kinds, states and request bodies are the console API's types.
pub use edgeloop_api::fleet::{
    CreateToken, CreatedToken, MemberKind, MemberStatus, MemberView, TokenState, TokenView,
};

/// What a member reported about itself (from the gRPC `Capabilities`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapabilitiesRecord {
    #[serde(default)]
    pub agent_version: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub arch: String,
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub execution_providers: Vec<String>,
    #[serde(default)]
    pub gpus: Vec<GpuRecord>,
    #[serde(default)]
    pub free_disk_bytes: u64,
    #[serde(default)]
    pub engines: Vec<String>,
    #[serde(default)]
    pub driver_version: String,
    #[serde(default)]
    pub cuda_version: String,
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
    /// Cluster bridges' node pools. Stored in the view's shape: they are
    /// reported facts, shown as they came (capped, see `From` below).
    #[serde(default)]
    pub pools: Vec<NodePool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub model: String,
    pub memory_bytes: u64,
    pub count: u32,
}

impl From<edgeloop_proto::common::v1::Capabilities> for CapabilitiesRecord {
    fn from(c: edgeloop_proto::common::v1::Capabilities) -> Self {
        // Reported strings are untrusted: cap their sizes before storing.
        fn cap(s: String) -> String {
            s.chars().take(256).collect()
        }
        Self {
            agent_version: cap(c.agent_version),
            os: cap(c.os),
            arch: cap(c.arch),
            hostname: cap(c.hostname),
            execution_providers: c
                .execution_providers
                .into_iter()
                .take(16)
                .map(cap)
                .collect(),
            gpus: c
                .gpus
                .into_iter()
                .take(64)
                .map(|g| GpuRecord {
                    model: cap(g.model),
                    memory_bytes: g.memory_bytes,
                    count: g.count,
                })
                .collect(),
            free_disk_bytes: c.free_disk_bytes,
            engines: c.engines.into_iter().take(16).map(cap).collect(),
            driver_version: cap(c.driver_version),
            cuda_version: cap(c.cuda_version),
            extra: c
                .extra
                .into_iter()
                .take(64)
                .map(|(k, v)| (cap(k), cap(v)))
                .collect(),
            pools: c.pools.into_iter().take(64).map(pool).collect(),
        }
    }
}

/// A reported pool, its strings capped; empty strings and zeros are the
/// protocol's "unknown".
fn pool(p: edgeloop_proto::common::v1::NodePool) -> NodePool {
    fn cap(s: String) -> String {
        s.chars().take(256).collect()
    }
    let known = |s: String| Some(cap(s)).filter(|s| !s.is_empty());
    NodePool {
        engine: cap(p.engine),
        name: cap(p.name),
        nodes: Some(p.nodes).filter(|&n| n > 0),
        gpus_per_node: p.gpus_per_node,
        gpu_type: known(p.gpu_type),
        gpu_memory_bytes: Some(p.gpu_memory_bytes).filter(|&b| b > 0),
        driver_version: known(p.driver_version),
        cuda_version: known(p.cuda_version),
        cpus_per_node: p.cpus_per_node,
        memory_mb_per_node: p.memory_mb_per_node,
        source: cap(p.source),
        placement: p
            .placement
            .into_iter()
            .take(16)
            .map(|(k, v)| (cap(k), cap(v)))
            .collect(),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Member {
    pub id: String,
    pub kind: MemberKind,
    #[serde(default = "edgeloop_api::access::default_project")]
    pub project: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub capabilities: CapabilitiesRecord,
    /// Only the certificate with this sha256 may act as this member.
    pub cert_fingerprint: Digest,
    #[serde(with = "time::serde::rfc3339")]
    pub cert_not_after: OffsetDateTime,
    /// When the current certificate started, for renewal at two thirds of
    /// its life; `None` in records from before renewal (then `enrolled_at`).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub cert_not_before: Option<OffsetDateTime>,
    /// A renewed certificate not used yet (see [`super::renewal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_cert: Option<PendingCert>,
    /// The certificate the last renewal replaced, while it drains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_cert: Option<PreviousCert>,
    #[serde(with = "time::serde::rfc3339")]
    pub enrolled_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_seen: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
    #[serde(default)]
    pub revoked_reason: Option<String>,
    pub token_id: String,
}

impl Member {
    /// A member enrolled `now` with the certificate `fingerprint` (valid
    /// until `cert_not_after`), seen `now`, in the default project, with
    /// no labels or capabilities yet and no token named.
    pub fn enrolled(
        id: &str,
        kind: MemberKind,
        fingerprint: Digest,
        cert_not_after: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Member {
        Member {
            id: id.to_string(),
            kind,
            project: edgeloop_api::access::default_project(),
            labels: BTreeMap::new(),
            capabilities: CapabilitiesRecord::default(),
            cert_fingerprint: fingerprint,
            cert_not_after,
            cert_not_before: Some(now),
            pending_cert: None,
            previous_cert: None,
            enrolled_at: now,
            last_seen: Some(now),
            revoked_at: None,
            revoked_reason: None,
            token_id: String::new(),
        }
    }
}

/// Online means a heartbeat arrived within `offline_after`.
pub fn member_status(
    member: &Member,
    now: OffsetDateTime,
    offline_after: Duration,
) -> MemberStatus {
    if member.revoked_at.is_some() {
        return MemberStatus::Revoked;
    }
    match member.last_seen {
        Some(seen) if now - seen <= offline_after => MemberStatus::Online,
        _ => MemberStatus::Offline,
    }
}

impl From<GpuRecord> for edgeloop_api::fleet::Gpu {
    fn from(g: GpuRecord) -> Self {
        edgeloop_api::fleet::Gpu {
            model: g.model,
            memory_bytes: g.memory_bytes,
            count: g.count,
        }
    }
}

impl From<CapabilitiesRecord> for edgeloop_api::fleet::Capabilities {
    fn from(c: CapabilitiesRecord) -> Self {
        edgeloop_api::fleet::Capabilities {
            agent_version: c.agent_version,
            os: c.os,
            arch: c.arch,
            hostname: c.hostname,
            execution_providers: c.execution_providers,
            gpus: c.gpus.into_iter().map(Into::into).collect(),
            free_disk_bytes: c.free_disk_bytes,
            engines: c.engines,
            driver_version: c.driver_version,
            cuda_version: c.cuda_version,
            extra: c.extra,
            pools: c.pools,
        }
    }
}

/// A member as the console API shows it.
pub fn member_view(m: Member, now: OffsetDateTime, offline_after: Duration) -> MemberView {
    MemberView {
        project: m.project.clone(),
        status: member_status(&m, now, offline_after),
        id: m.id,
        kind: m.kind,
        labels: m.labels,
        capabilities: m.capabilities.into(),
        last_seen: m.last_seen,
        enrolled_at: m.enrolled_at,
        revoked_at: m.revoked_at,
        revoked_reason: m.revoked_reason,
        cert_not_after: m.cert_not_after,
        serving: None,
        telemetry: None,
    }
}

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
    store: &Store,
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
    if let Some(existing) = store.members(req.kind).get(&member_id)? {
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
    let pending = store.tokens.values()?.into_iter().any(|t| {
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
    if !store.tokens.insert_new(&record.id, &record)? {
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

/// What an Enroll call presents.
pub struct Enrollment<'a> {
    pub kind: MemberKind,
    pub token: &'a str,
    pub csr_pem: &'a str,
    pub capabilities: CapabilitiesRecord,
}

/// Consumes a bootstrap token and signs the caller's CSR. The token is spent
/// only after the CSR is known to be good, so a malformed request can be retried.
pub async fn enroll(
    store: &Store,
    pki: &Pki,
    req: Enrollment<'_>,
    cert_lifetime: Duration,
    now: OffsetDateTime,
) -> Result<(Member, SignedCert)> {
    let Enrollment {
        kind,
        token,
        csr_pem,
        capabilities,
    } = req;
    let token: BootstrapToken = token
        .parse()
        .map_err(|e| Error::Unauthenticated(format!("malformed bootstrap token: {e}")))?;
    let record = store
        .tokens
        .get(&token.id)?
        .ok_or_else(|| Error::Unauthenticated("unknown bootstrap token".into()))?;
    let identity = kind.identity(&record.member_id);
    let key = super::pki::csr_key(csr_pem)?;
    if let Some(again) = retried(&record, token.secret_hash(), kind, key) {
        return finish_retry(store, &record, again, capabilities, now).await;
    }
    if let Some(refusal) = token_refusal(&record, token.secret_hash(), kind, now) {
        return Err(refusal);
    }
    let signed = pki.sign_client(csr_pem, &identity, now + cert_lifetime)?;
    let enrolled = EnrolledKey {
        key,
        certificate_pem: signed.pem.clone(),
        fingerprint: signed.fingerprint,
        not_after: signed.not_after,
    };
    // The compare-and-swap makes "works once" hold under concurrent
    // enrollments; the key and certificate go with it, so a retry of this
    // one (its reply lost) is told apart from another key.
    let spent = store.tokens.update(&token.id, |current| match current {
        Some(t) if t.used_at.is_none() => Ok(BootstrapTokenRecord {
            used_at: Some(now),
            enrolled: Some(enrolled.clone()),
            ..t
        }),
        _ => Err(Error::Unauthenticated(
            "bootstrap token was already used".into(),
        )),
    })?;
    spent?;
    let member = new_member(&record, kind, capabilities, &enrolled, now);
    if !store.members(kind).insert_new(&member.id, &member)? {
        return Err(Error::Conflict(format!("{identity} is already enrolled")));
    }
    store.flush().await?;
    Ok((member, signed))
}

fn new_member(
    record: &BootstrapTokenRecord,
    kind: MemberKind,
    capabilities: CapabilitiesRecord,
    enrolled: &EnrolledKey,
    now: OffsetDateTime,
) -> Member {
    Member {
        project: record.project.clone(),
        labels: record.labels.clone(),
        capabilities,
        token_id: record.id.clone(),
        ..Member::enrolled(
            &record.member_id,
            kind,
            enrolled.fingerprint,
            enrolled.not_after,
            now,
        )
    }
}

/// The first answer, when an Enroll is a retry of the one that spent this
/// token: the same secret, kind and key. Pure. A retry is answered
/// whatever the token's expiry: the secret and the private key together
/// are the member itself.
pub fn retried(
    record: &BootstrapTokenRecord,
    presented_secret_hash: Digest,
    kind: MemberKind,
    key: Digest,
) -> Option<EnrolledKey> {
    let enrolled = record.enrolled.as_ref()?;
    (record.used_at.is_some()
        && record.secret_hash == presented_secret_hash
        && record.kind == kind
        && enrolled.key == key)
        .then(|| enrolled.clone())
}

/// Answers a retried enrollment with the certificate issued the first
/// time, completing the member record if the first call stopped before
/// it. A member revoked since is refused.
async fn finish_retry(
    store: &Store,
    record: &BootstrapTokenRecord,
    enrolled: EnrolledKey,
    capabilities: CapabilitiesRecord,
    now: OffsetDateTime,
) -> Result<(Member, SignedCert)> {
    let kind = record.kind;
    let identity = kind.identity(&record.member_id);
    let member = match store.members(kind).get(&record.member_id)? {
        Some(m) if m.revoked_at.is_some() => {
            return Err(Error::PermissionDenied(format!(
                "{identity} has been revoked"
            )))
        }
        Some(m) if m.cert_fingerprint == enrolled.fingerprint => m,
        // Renewed or re-issued since: the old certificate is not handed out.
        Some(_) => {
            return Err(Error::Unauthenticated(
                "bootstrap token was already used".into(),
            ))
        }
        None => {
            let m = new_member(record, kind, capabilities, &enrolled, now);
            if !store.members(kind).insert_new(&m.id, &m)? {
                return Err(Error::Conflict(format!("{identity} is already enrolled")));
            }
            store.flush().await?;
            m
        }
    };
    tracing::info!(%identity, "enrollment retried with the same key: answered with the same certificate");
    Ok((
        member,
        SignedCert {
            pem: enrolled.certificate_pem,
            fingerprint: enrolled.fingerprint,
            not_after: enrolled.not_after,
        },
    ))
}

/// Decides whether a verified client certificate may act as a member at
/// `now` (see [`renewal::admit`]); a renewed certificate's first use makes
/// it the member's current one.
pub fn authorize(
    store: &Store,
    kind: MemberKind,
    cert_identity: Option<&str>,
    cert_fingerprint: Digest,
    now: OffsetDateTime,
) -> Result<Member> {
    let identity = cert_identity
        .ok_or_else(|| Error::Unauthenticated("client certificate has no identity".into()))?;
    let (cert_kind, id) = MemberKind::parse_identity(identity)
        .ok_or_else(|| Error::Unauthenticated(format!("unrecognised identity {identity:?}")))?;
    if cert_kind != kind {
        return Err(Error::PermissionDenied(format!(
            "{identity} may not call the {} service",
            kind.as_str()
        )));
    }
    let member = store
        .members(kind)
        .get(id)?
        .ok_or_else(|| Error::Unauthenticated(format!("{identity} is not enrolled")))?;
    if member.revoked_at.is_some() {
        return Err(Error::PermissionDenied(format!(
            "{identity} has been revoked"
        )));
    }
    match renewal::admit(&member, cert_fingerprint, now) {
        Admission::Current | Admission::Draining => Ok(member),
        Admission::FirstUseOfRenewed => {
            let member = renewal::promote_in_store(store, kind, id, cert_fingerprint, now)?;
            tracing::info!(%identity, "renewed certificate in use; the old one drains");
            Ok(member)
        }
        Admission::Refused(Refusal::Expired) => Err(Error::Unauthenticated(format!(
            "this certificate for {identity} has expired"
        ))),
        Admission::Refused(Refusal::Superseded) => Err(Error::Unauthenticated(format!(
            "this certificate is no longer valid for {identity}"
        ))),
    }
}

/// Whether a heartbeat must write the member record: when its
/// capabilities changed, or its `last_seen` is half of `offline_after`
/// old (an interval and a half, at three intervals to offline). Pure.
/// The others write nothing, which halves the writes of a fleet
/// heartbeating every interval (each one a round trip on PostgreSQL),
/// while a live member's `last_seen` stays under 2.5 intervals old, inside
/// the window that [`member_status`] allows before it says offline.
pub fn heartbeat_write_due(
    stored: &Member,
    capabilities: Option<&CapabilitiesRecord>,
    now: OffsetDateTime,
    offline_after: Duration,
) -> bool {
    let stale = match stored.last_seen {
        None => true,
        Some(seen) => now - seen >= offline_after / 2,
    };
    stale || capabilities.is_some_and(|c| *c != stored.capabilities)
}

/// Records a heartbeat of `member`, as the caller has just read it: when
/// [`heartbeat_write_due`] says so, `last_seen` and the capabilities are
/// written, still refused for a member revoked meanwhile.
pub fn heartbeat(
    store: &Store,
    member: &Member,
    capabilities: Option<CapabilitiesRecord>,
    now: OffsetDateTime,
    offline_after: Duration,
) -> Result<()> {
    if !heartbeat_write_due(member, capabilities.as_ref(), now, offline_after) {
        return Ok(());
    }
    let (kind, id) = (member.kind, member.id.as_str());
    store.members(kind).update_from(id, member, |m| match m {
        Some(m) if m.revoked_at.is_none() => Ok(Member {
            last_seen: Some(now),
            capabilities: capabilities.clone().unwrap_or(m.capabilities.clone()),
            ..m
        }),
        Some(_) => Err(Error::PermissionDenied(format!(
            "{} has been revoked",
            kind.identity(id)
        ))),
        None => Err(Error::not_found(kind.as_str(), id)),
    })??;
    Ok(())
}

pub fn get(store: &Store, kind: MemberKind, id: &str) -> Result<Member> {
    store
        .members(kind)
        .get(id)?
        .ok_or_else(|| Error::not_found(kind.as_str(), id))
}

pub async fn revoke(
    store: &Store,
    events: &Events,
    kind: MemberKind,
    id: &str,
    reason: Option<String>,
    now: OffsetDateTime,
) -> Result<Member> {
    if let Some(r) = &reason {
        validate::text("reason", r, 1024)?;
    }
    let member = store.members(kind).update(id, |m| match m {
        // Revoking twice keeps the first time and reason.
        Some(m) if m.revoked_at.is_some() => Ok(m),
        Some(m) => Ok(Member {
            revoked_at: Some(now),
            revoked_reason: reason.clone(),
            ..m
        }),
        None => Err(Error::not_found(kind.as_str(), id)),
    })??;
    store.flush().await?;
    events.publish(FleetEvent::Revoked {
        kind,
        id: id.to_string(),
    });
    Ok(member)
}

pub async fn set_labels(
    store: &Store,
    kind: MemberKind,
    id: &str,
    labels: BTreeMap<String, String>,
) -> Result<Member> {
    validate::labels("labels", &labels)?;
    let member = store.members(kind).update(id, |m| match m {
        Some(m) => Ok(Member {
            labels: labels.clone(),
            ..m
        }),
        None => Err(Error::not_found(kind.as_str(), id)),
    })??;
    store.flush().await?;
    Ok(member)
}

#[cfg(test)]
pub(crate) mod tests;
