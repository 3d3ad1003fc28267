//! Resumable uploads as S3 multipart uploads. The upload's state (its
//! id, the parts' ETags, the SHA-256 state after them) is a JSON object
//! under `partials/`, written after every part, so any replica continues
//! it. Parts are [`PART_BYTES`] (whole hash blocks); bytes after the last
//! full part are not held, so a broken body continues from that part.
//!
//! Every write of the state is conditional on the version the call read
//! or wrote last (S3's `If-Match`, `If-None-Match: *`), and each call
//! writes it first thing: so the newest call for an upload (a client's
//! retry beside a stalled try, on this replica or another) holds it, and
//! an older one stops at its next write with
//! [`ArtifactError::Superseded`] instead of saving a state that forgets
//! the newer one's parts. (A part it sends meanwhile cannot corrupt the
//! artifact: completion names each part's ETag, which S3 checks.)

use edgeloop_models::Digest;
use futures::StreamExt;
use object_store::multipart::MultipartStore;
use object_store::{ObjectStoreExt, PutMode, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::put::PartBuffer;
use super::sha::{ResumableSha256, SavedSha256};
use super::{backend, S3ArtifactStore, PART_BYTES};
use crate::artifacts::{ArtifactError, ByteStream, PutOutcome};

/// An owner's resumable upload, as stored at `partials/<owner>/<digest>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PartialState {
    pub(super) digest: Digest,
    pub(super) size: u64,
    pub(super) upload_id: String,
    /// ETags of parts 1..=n, each [`PART_BYTES`].
    pub(super) parts: Vec<String>,
    /// The hash of the bytes in `parts`.
    pub(super) sha256: SavedSha256,
}

impl PartialState {
    /// Bytes held in parts; the offset the owner continues from.
    pub(super) fn held(&self) -> u64 {
        self.parts.len() as u64 * PART_BYTES as u64
    }

    /// A state object is ours to trust only if it adds up.
    fn consistent(&self, digest: Digest) -> bool {
        self.digest == digest && self.sha256.len == self.held() && self.held() < self.size.max(1)
    }
}

impl S3ArtifactStore {
    pub(super) async fn load_partial(
        &self,
        owner: &str,
        digest: Digest,
    ) -> Result<Option<PartialState>, ArtifactError> {
        Ok(self
            .load_partial_versioned(owner, digest)
            .await?
            .map(|(state, _)| state))
    }

    /// The state and the version of its object, for the next conditional
    /// write.
    async fn load_partial_versioned(
        &self,
        owner: &str,
        digest: Digest,
    ) -> Result<Option<(PartialState, UpdateVersion)>, ArtifactError> {
        let key = self.partial_key(owner, digest);
        match self.get_json_versioned::<PartialState>(&key).await? {
            Some((state, v)) if state.consistent(digest) => Ok(Some((state, v))),
            Some(_) => Err(ArtifactError::Backend(format!(
                "{key}: the partial upload's state does not add up"
            ))),
            None => Ok(None),
        }
    }

    /// Drops `owner`'s partial upload of `state.digest`: its parts, then
    /// its state.
    async fn drop_partial(&self, owner: &str, state: &PartialState) {
        self.abort_quietly(state.digest, &state.upload_id).await;
        self.delete_quietly(&self.partial_key(owner, state.digest))
            .await;
    }

    /// [`ArtifactStore::put_resumable`](crate::artifacts::ArtifactStore::put_resumable)
    /// on S3.
    pub(super) async fn put_resumable_parts(
        &self,
        owner: &str,
        expected: Digest,
        mut body: ByteStream,
        size: u64,
        max_bytes: u64,
        offset: u64,
    ) -> Result<PutOutcome, ArtifactError> {
        if size > max_bytes {
            return Err(ArtifactError::TooLarge { limit: max_bytes });
        }
        let state_key = self.partial_key(owner, expected);
        // How the first write of the state is conditioned: on the version
        // read here, or on there being none.
        let mut mode = PutMode::Create;
        let existing = match self.load_partial_versioned(owner, expected).await {
            Ok(Some((state, version))) => {
                mode = PutMode::Update(version);
                Some(state)
            }
            Ok(None) => None,
            // Starting over needs nothing of a state that does not add up,
            // and it is nobody's to keep.
            Err(_) if offset == 0 => {
                mode = PutMode::Overwrite;
                None
            }
            Err(e) => return Err(e),
        };
        let held = existing.as_ref().map_or(0, PartialState::held);
        if offset != 0 && offset != held {
            return Err(ArtifactError::Offset {
                requested: offset,
                held,
            });
        }
        if let Some(state) = existing.as_ref().filter(|s| s.size != size) {
            // The same digest cannot have two sizes: one claim is wrong.
            if offset != 0 {
                return Err(ArtifactError::SizeMismatch {
                    expected: state.size,
                    actual: size,
                });
            }
        }
        let (mut state, mut hasher, mut version) = match existing {
            Some(state) if offset != 0 => {
                let hasher = ResumableSha256::resume(state.sha256).ok_or_else(|| {
                    ArtifactError::Backend(format!("{state_key}: hash state off a block"))
                })?;
                // Rewritten as it is: from now on this call holds it.
                let version = self.put_json_if(&state_key, &state, mode).await?;
                (state, hasher, version)
            }
            old => {
                if let Some(old) = old {
                    self.abort_quietly(old.digest, &old.upload_id).await;
                }
                let upload_id = self
                    .s3
                    .create_multipart(&self.artifact_key(expected))
                    .await
                    .map_err(backend)?;
                let hasher = ResumableSha256::default();
                let state = PartialState {
                    digest: expected,
                    size,
                    upload_id,
                    parts: Vec::new(),
                    sha256: hasher.save().unwrap_or(SavedSha256 {
                        words: [0; 8],
                        len: 0,
                    }),
                };
                // Recorded before any part, so prune_partials can find it.
                let version = match self.put_json_if(&state_key, &state, mode).await {
                    Ok(v) => v,
                    Err(e) => {
                        self.abort_quietly(expected, &state.upload_id).await;
                        return Err(e);
                    }
                };
                (state, hasher, version)
            }
        };
        let mut buf = PartBuffer::default();
        let mut broken = None;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    broken = Some(e);
                    break;
                }
            };
            let received = state.held() + buf.len as u64 + chunk.len() as u64;
            if received > size {
                self.drop_partial(owner, &state).await;
                return Err(ArtifactError::SizeMismatch {
                    expected: size,
                    actual: received,
                });
            }
            buf.push(chunk);
            // A full part that is not the body's last: flush it, and save
            // the state that lets anyone continue after it. The last part
            // (possibly full) waits for the digest check.
            while buf.len >= PART_BYTES && state.held() + (PART_BYTES as u64) < size {
                let part = buf.take(PART_BYTES);
                let mut next = hasher.clone();
                for c in &part {
                    next.update(c);
                }
                let index = state.parts.len();
                let etag = self
                    .put_part(expected, &state.upload_id, index, part)
                    .await?;
                let mut saved = state.clone();
                saved.parts.push(etag);
                saved.sha256 = next.save().ok_or_else(|| {
                    ArtifactError::Backend("a part ended off a hash block".into())
                })?;
                version = self
                    .put_json_if(&state_key, &saved, PutMode::Update(version))
                    .await?;
                (state, hasher) = (saved, next);
            }
        }
        if let Some(e) = broken {
            return Err(e);
        }
        let received = state.held() + buf.len as u64;
        if received < size {
            return Err(ArtifactError::Incomplete {
                received: state.held(),
                expected: size,
            });
        }
        let last = buf.take(buf.len);
        for c in &last {
            hasher.update(c);
        }
        let actual = hasher.finish();
        if actual != expected {
            self.drop_partial(owner, &state).await;
            return Err(ArtifactError::DigestMismatch { expected, actual });
        }
        // Still this call's upload (a newer call has not taken it over)
        // before anything of it is completed or dropped.
        self.put_json_if(&state_key, &state, PutMode::Update(version))
            .await?;
        let key = self.artifact_key(expected);
        let created = self.head_meta(&key).await?.is_none();
        if size == 0 {
            // S3 has no empty part to complete an upload with.
            self.abort_quietly(expected, &state.upload_id).await;
            self.s3
                .put(&key, PutPayload::new())
                .await
                .map_err(backend)?;
        } else {
            if !last.is_empty() {
                let index = state.parts.len();
                let etag = self
                    .put_part(expected, &state.upload_id, index, last)
                    .await?;
                state.parts.push(etag);
            }
            // Completed even when the digest is stored already: that
            // rewrites the same bytes (and their time), so a collection
            // racing this upload cannot leave it answered over nothing.
            self.complete(expected, &state.upload_id, &state.parts)
                .await?;
        }
        self.delete_quietly(&state_key).await;
        Ok(PutOutcome {
            digest: expected,
            size,
            created,
        })
    }
}
