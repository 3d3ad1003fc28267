//! `put`: a body checked on its way into S3. Under one part it is held
//! and sent as one PUT after the check; past that it streams into a
//! multipart upload of the final key, part by part, completed only after
//! the check and aborted otherwise. Bytes already stored are hashed but
//! not sent again, and the put refreshes their time instead.

use std::collections::VecDeque;

use bytes::Bytes;
use edgeloop_models::{Digest, Sha256Writer};
use futures::StreamExt;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::{backend, S3ArtifactStore, PART_BYTES, PUT_DIR};
use crate::artifacts::{ArtifactError, ByteStream, PutOutcome, UploadLimits};

/// A `put`'s open multipart upload, recorded so a crash cannot orphan it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PendingPut {
    pub(super) digest: Digest,
    pub(super) upload_id: String,
}

/// Chunks of a body waiting to become a part; split without copying.
#[derive(Default)]
pub(super) struct PartBuffer {
    chunks: VecDeque<Bytes>,
    pub(super) len: usize,
}

impl PartBuffer {
    pub(super) fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        self.chunks.push_back(chunk);
    }

    /// The first `n` bytes (at most what is held), as a part's chunks.
    pub(super) fn take(&mut self, n: usize) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut want = n.min(self.len);
        self.len -= want;
        while want > 0 {
            let Some(mut chunk) = self.chunks.pop_front() else {
                break;
            };
            if chunk.len() > want {
                let rest = chunk.split_off(want);
                self.chunks.push_front(rest);
            }
            want -= chunk.len();
            out.push(chunk);
        }
        out
    }
}

/// A `put`'s multipart upload while it streams.
struct OpenPut {
    pub(super) upload_id: String,
    record: Path,
    parts: Vec<String>,
}

impl S3ArtifactStore {
    /// [`ArtifactStore::put`](crate::artifacts::ArtifactStore::put) on S3.
    pub(super) async fn put_verified(
        &self,
        expected: Digest,
        body: ByteStream,
        limits: UploadLimits,
    ) -> Result<PutOutcome, ArtifactError> {
        if let Some(declared) = limits.declared_size {
            if declared > limits.max_bytes {
                return Err(ArtifactError::TooLarge {
                    limit: limits.max_bytes,
                });
            }
        }
        // Already stored: the body is read and hashed all the same (the
        // caller must have these bytes), but not sent again.
        let held = self.head_meta(&self.artifact_key(expected)).await?;
        let mut upload = None;
        let mut buf = PartBuffer::default();
        let streamed = self
            .stream_put(
                expected,
                body,
                limits,
                held.is_some(),
                &mut upload,
                &mut buf,
            )
            .await;
        let checked = streamed.and_then(|(actual, size)| {
            if actual == expected {
                Ok(size)
            } else {
                Err(ArtifactError::DigestMismatch { expected, actual })
            }
        });
        let size = match checked {
            Ok(size) => size,
            Err(e) => {
                if let Some(open) = upload {
                    self.abort_quietly(expected, &open.upload_id).await;
                    self.delete_quietly(&open.record).await;
                }
                return Err(e);
            }
        };
        if held.is_some() {
            return self.refresh(expected, size).await;
        }
        let key = self.artifact_key(expected);
        let Some(mut open) = upload else {
            // Under one part: one PUT of bytes already checked.
            let payload = PutPayload::from_iter(buf.take(buf.len));
            self.s3.put(&key, payload).await.map_err(backend)?;
            return Ok(PutOutcome {
                digest: expected,
                size,
                created: true,
            });
        };
        let finished = async {
            if buf.len > 0 {
                let index = open.parts.len();
                let part = self
                    .put_part(expected, &open.upload_id, index, buf.take(buf.len))
                    .await?;
                open.parts.push(part);
            }
            self.complete(expected, &open.upload_id, &open.parts).await
        }
        .await;
        if finished.is_err() {
            self.abort_quietly(expected, &open.upload_id).await;
        }
        self.delete_quietly(&open.record).await;
        finished?;
        Ok(PutOutcome {
            digest: expected,
            size,
            created: true,
        })
    }

    /// Stored again: the artifact's grace period before collection starts
    /// over. Then checks that it is still there, so a collection that
    /// deleted it meanwhile makes this put fail rather than answer
    /// "stored" over nothing.
    async fn refresh(&self, digest: Digest, size: u64) -> Result<PutOutcome, ArtifactError> {
        self.s3
            .put(&self.marker_key(digest), PutPayload::new())
            .await
            .map_err(backend)?;
        match self.head_meta(&self.artifact_key(digest)).await? {
            Some(_) => Ok(PutOutcome {
                digest,
                size,
                created: false,
            }),
            None => Err(ArtifactError::Backend(format!(
                "artifact {digest} was garbage-collected while being stored again; upload it again"
            ))),
        }
    }

    /// `put`'s streaming: hashes everything, and (unless `skip_upload`)
    /// sends it as parts of `upload` once a part's worth is buffered.
    /// Returns the digest, the size and what is left in `buf`.
    async fn stream_put(
        &self,
        expected: Digest,
        mut body: ByteStream,
        limits: UploadLimits,
        skip_upload: bool,
        upload: &mut Option<OpenPut>,
        buf: &mut PartBuffer,
    ) -> Result<(Digest, u64), ArtifactError> {
        let cap = limits.max_bytes;
        let mut hasher = Sha256Writer::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            let total = hasher.len() + chunk.len() as u64;
            if total > cap {
                return Err(ArtifactError::TooLarge { limit: cap });
            }
            if let Some(declared) = limits.declared_size {
                if total > declared {
                    return Err(ArtifactError::SizeMismatch {
                        expected: declared,
                        actual: total,
                    });
                }
            }
            hasher.update(&chunk);
            if skip_upload {
                continue;
            }
            buf.push(chunk);
            while buf.len >= PART_BYTES {
                let open = match upload {
                    Some(open) => open,
                    None => upload.insert(self.open_put(expected).await?),
                };
                let index = open.parts.len();
                let part = self
                    .put_part(expected, &open.upload_id, index, buf.take(PART_BYTES))
                    .await?;
                open.parts.push(part);
            }
        }
        let size = hasher.len();
        if let Some(declared) = limits.declared_size {
            if size != declared {
                return Err(ArtifactError::SizeMismatch {
                    expected: declared,
                    actual: size,
                });
            }
        }
        Ok((hasher.finish(), size))
    }

    /// Opens a multipart upload of `digest`'s key, recorded first.
    async fn open_put(&self, digest: Digest) -> Result<OpenPut, ArtifactError> {
        let upload_id = self
            .s3
            .create_multipart(&self.artifact_key(digest))
            .await
            .map_err(backend)?;
        let record = self.key(&format!(
            "partials/{PUT_DIR}/{}-{:016x}",
            digest.to_hex(),
            rand::random::<u64>()
        ));
        let pending = PendingPut {
            digest,
            upload_id: upload_id.clone(),
        };
        if let Err(e) = self.put_json(&record, &pending).await {
            self.abort_quietly(digest, &upload_id).await;
            return Err(e);
        }
        Ok(OpenPut {
            upload_id,
            record,
            parts: Vec::new(),
        })
    }
}
