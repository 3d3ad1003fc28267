//! Training checkpoints uploaded by bridges. The bytes are an artifact; this
//! record says which job, attempt and step they belong to, so a failed job can
//! resume from its last one.

use std::collections::BTreeMap;

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::Trees;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub job_id: String,
    pub attempt: u32,
    pub step: u64,
    pub digest: Digest,
    pub size: u64,
    pub has_optimizer_state: bool,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The cluster that uploaded it.
    pub cluster: String,
    #[serde(with = "time::serde::rfc3339")]
    pub uploaded_at: OffsetDateTime,
}

/// Zero-padded so that key order is step order.
pub fn key(job_id: &str, step: u64) -> String {
    format!("{job_id}/{step:020}")
}

/// Every checkpoint of a job, oldest step first.
pub fn list(
    store: &Trees,
    job_id: &str,
) -> Result<Vec<CheckpointRecord>, edgeloop_store::StoreError> {
    Ok(store
        .checkpoints
        .scan_prefix(&format!("{job_id}/"))?
        .into_iter()
        .map(|(_, v)| v)
        .collect())
}

/// The newest checkpoint of a job: the one to resume from.
pub fn latest(
    store: &Trees,
    job_id: &str,
) -> Result<Option<CheckpointRecord>, edgeloop_store::StoreError> {
    Ok(store
        .checkpoints
        .last_with_prefix(&format!("{job_id}/"))?
        .map(|(_, v)| v))
}

/// What the console API shows of a checkpoint.
impl From<&CheckpointRecord> for edgeloop_api::jobs::CheckpointView {
    fn from(c: &CheckpointRecord) -> Self {
        edgeloop_api::jobs::CheckpointView {
            job_id: c.job_id.clone(),
            attempt: c.attempt,
            step: c.step,
            digest: c.digest,
            size: c.size,
            has_optimizer_state: c.has_optimizer_state,
            metadata: c.metadata.clone(),
            cluster: c.cluster.clone(),
            uploaded_at: c.uploaded_at,
        }
    }
}
