//! The member record: what a device or cluster bridge is, what it
//! reported about itself, whether it is online, and how the console shows
//! it. Reads and label edits; enrolment, authorisation and revocation have
//! their own rooms.

use std::collections::BTreeMap;

use edgeloop_api::fleet::NodePool;
use edgeloop_api::images::ContainerWay;
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::{MemberKind, MemberStatus, MemberView};
use crate::db::Db;
use crate::fleet::renewal::{PendingCert, PreviousCert};
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

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
        // A way this control plane does not know (a newer bridge's) is
        // left out: it cannot be shown or checked here.
        containers: {
            let mut ways: Vec<ContainerWay> = p
                .containers
                .iter()
                .take(16)
                .filter_map(|w| ContainerWay::parse(w))
                .collect();
            ways.sort();
            ways.dedup();
            ways
        },
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

pub fn get(store: &Db, kind: MemberKind, id: &str) -> Result<Member> {
    store
        .fleet
        .members(kind)
        .get(id)?
        .ok_or_else(|| Error::not_found(kind.as_str(), id))
}

pub async fn set_labels(
    store: &Db,
    kind: MemberKind,
    id: &str,
    labels: BTreeMap<String, String>,
) -> Result<Member> {
    validate::labels("labels", &labels)?;
    let member = store.fleet.members(kind).update(id, |m| match m {
        Some(m) => Ok(Member {
            labels: labels.clone(),
            ..m
        }),
        None => Err(Error::not_found(kind.as_str(), id)),
    })??;
    store.flush().await?;
    Ok(member)
}
