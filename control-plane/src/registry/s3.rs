//! S3 (or any S3-compatible server) behind [`ArtifactStore`], through the
//! `object_store` crate (`--artifact-url s3://bucket/prefix`; endpoint,
//! region and credentials from the usual `AWS_*` environment).
//!
//! Keys under the prefix:
//! - `sha256/<hex>`: the artifacts. A key appears only when a single PUT
//!   or a multipart upload's completion makes it appear, and both happen
//!   only after the bytes hashed to `<hex>` and had the declared size:
//!   bigger bodies stream into a multipart upload of the final key, part
//!   by part (one part in memory), which is aborted on any mismatch.
//! - `refreshed/<hex>`: an empty marker written when bytes already held
//!   are put again; garbage collection reads an artifact's time as the
//!   later of the object's and its marker's.
//! - `partials/<sha256(owner) 32 hex>/<hex>`: the JSON state of an
//!   owner's resumable upload (multipart upload id, part ETags, bytes held,
//!   the SHA-256 state at that point), so any control-plane replica can
//!   continue it. `partials/_put/<random>`: a `put` with a multipart
//!   upload open, so one that died mid-way is aborted by `prune_partials`.
//!
//! What S3 cannot do, and what stands in for it:
//! - No conditional delete. `delete_if_older` reads the artifact's and its
//!   marker's times right before the DELETE, so only a put landing between
//!   that read and the DELETE (milliseconds, against a grace period of
//!   hours) can be lost; such a put was of bytes already held, its client
//!   registers what it uploaded after, and the record then names a missing
//!   artifact. A resumable upload of bytes already held completes its
//!   multipart upload anyway, which rewrites the object: it cannot lose.
//! - No listing of multipart uploads through `object_store`: every upload
//!   we open is recorded under `partials/` before a part is sent, so a
//!   crash leaves a record that `prune_partials` finds. Uploads opened by
//!   something else are the bucket's lifecycle rule's to abort.
//! - Times are the S3 server's (Last-Modified, to the second), while
//!   retention's cutoff is the control plane's clock: a skew between the
//!   two moves the grace period by as much, which against hours is noise.
//! - One owner's partial upload is continued by one caller at a time (a
//!   bridge uploads a job's checkpoint sequentially); two at once would
//!   race on the state object, and the loser's parts would be dropped.

mod location;
mod sha;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use edgeloop_models::{Digest, Sha256Writer};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    ClientConfigKey, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutPayload,
};
use serde::{Deserialize, Serialize};

pub use location::{S3Location, S3UrlError};
use sha::{ResumableSha256, SavedSha256};

use super::artifacts::{
    ArtifactError, ArtifactReader, ArtifactStore, ByteStream, PutOutcome, StoredArtifact,
    UploadLimits,
};

/// Size of every multipart part but the last: at least S3's 5 MiB, and a
/// whole number of SHA-256 blocks, so the hash state saved with a
/// resumable upload's parts needs no pending bytes. One part at a time is
/// held in memory per upload.
pub const PART_BYTES: usize = 8 << 20;

/// A reader that stops sending for this long fails its GET (which
/// `object_store` retries from where it stopped). There is no deadline on
/// a whole request: a multi-GiB artifact takes as long as it takes.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The marker of a `put` in progress (not a resumable upload).
const PUT_DIR: &str = "_put";

/// Artifacts in an S3 bucket under a prefix. Cheap to clone.
#[derive(Debug, Clone)]
pub struct S3ArtifactStore {
    s3: Arc<AmazonS3>,
    location: S3Location,
    /// The runtime the S3 client's connections live on; the blocking trait
    /// methods run their requests on it.
    runtime: tokio::runtime::Handle,
}

/// An owner's resumable upload, as stored at `partials/<owner>/<digest>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartialState {
    digest: Digest,
    size: u64,
    upload_id: String,
    /// ETags of parts 1..=n, each [`PART_BYTES`].
    parts: Vec<String>,
    /// The hash of the bytes in `parts`.
    sha256: SavedSha256,
}

impl PartialState {
    /// Bytes held in parts; the offset the owner continues from.
    fn held(&self) -> u64 {
        self.parts.len() as u64 * PART_BYTES as u64
    }

    /// A state object is ours to trust only if it adds up.
    fn consistent(&self, digest: Digest) -> bool {
        self.digest == digest && self.sha256.len == self.held() && self.held() < self.size.max(1)
    }
}

/// A `put`'s open multipart upload, recorded so a crash cannot orphan it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PendingPut {
    digest: Digest,
    upload_id: String,
}

fn backend(e: object_store::Error) -> ArtifactError {
    ArtifactError::Backend(e.to_string())
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

/// Chunks of a body waiting to become a part; split without copying.
#[derive(Default)]
struct PartBuffer {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl PartBuffer {
    fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        self.chunks.push_back(chunk);
    }

    /// The first `n` bytes (at most what is held), as a part's chunks.
    fn take(&mut self, n: usize) -> Vec<Bytes> {
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

impl S3ArtifactStore {
    /// Connects with the `AWS_*` environment (AWS_ENDPOINT_URL,
    /// AWS_REGION or AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ALLOW_HTTP for a plain
    /// HTTP endpoint, ...) and lists the prefix once, so a wrong endpoint,
    /// credentials or bucket fails the start, not the first upload.
    pub async fn open(location: S3Location) -> Result<Self, ArtifactError> {
        Self::open_with(location, AmazonS3Builder::from_env()).await
    }

    async fn open_with(
        location: S3Location,
        builder: AmazonS3Builder,
    ) -> Result<Self, ArtifactError> {
        // reqwest is built without a provider of its own (no aws-lc): it
        // uses the process default, ring.
        edgeloop_client_core::install_crypto_provider();
        let mut client = ClientOptions::new()
            .with_timeout_disabled()
            .with_read_timeout(READ_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT);
        // The one client setting `from_env` reads, which the client
        // options set here would otherwise replace.
        if let Ok(allow) = std::env::var("AWS_ALLOW_HTTP") {
            client = client.with_config(ClientConfigKey::AllowHttp, allow);
        }
        let s3 = builder
            .with_client_options(client)
            .with_bucket_name(&location.bucket)
            .build()
            .map_err(|e| ArtifactError::Backend(format!("{location}: {e}")))?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ArtifactError::Backend("the S3 artifact store needs a Tokio runtime".into())
        })?;
        let store = S3ArtifactStore {
            s3: Arc::new(s3),
            location,
            runtime,
        };
        store
            .s3
            .list_with_delimiter(Some(&store.key("")))
            .await
            .map_err(|e| ArtifactError::Backend(format!("{}: {e}", store.location)))?;
        Ok(store)
    }

    pub fn location(&self) -> &S3Location {
        &self.location
    }

    /// `<prefix>/<rest>`.
    fn key(&self, rest: &str) -> Path {
        match (self.location.prefix.as_str(), rest) {
            ("", rest) => Path::from(rest),
            (prefix, "") => Path::from(prefix),
            (prefix, rest) => Path::from(format!("{prefix}/{rest}")),
        }
    }

    fn artifact_key(&self, digest: Digest) -> Path {
        self.key(&format!("sha256/{}", digest.to_hex()))
    }

    fn marker_key(&self, digest: Digest) -> Path {
        self.key(&format!("refreshed/{}", digest.to_hex()))
    }

    /// A key whatever the owner's characters, and the same on every replica.
    fn partial_key(&self, owner: &str, digest: Digest) -> Path {
        let owner = Digest::of(owner.as_bytes()).to_hex();
        self.key(&format!("partials/{}/{}", &owner[..32], digest.to_hex()))
    }

    /// Runs `fut` on the store's runtime and waits for it: for the trait's
    /// blocking methods, which retention calls from `spawn_blocking`. A
    /// thread of its own, so that a caller on a multi-threaded runtime's
    /// worker blocks (as the trait says) instead of panicking; on a
    /// current-thread runtime, call it from `spawn_blocking`, or nothing
    /// drives the runtime's I/O while its one thread waits here.
    fn blocking<T: Send>(
        &self,
        fut: impl Future<Output = Result<T, ArtifactError>> + Send,
    ) -> Result<T, ArtifactError> {
        let runtime = &self.runtime;
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("s3-artifacts".into())
                .spawn_scoped(s, move || runtime.block_on(fut))?
                .join()
                .unwrap_or_else(|_| Err(ArtifactError::Backend("an S3 call panicked".into())))
        })
    }

    async fn head_meta(&self, key: &Path) -> Result<Option<ObjectMeta>, ArtifactError> {
        match self.s3.head(key).await {
            Ok(meta) => Ok(Some(meta)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &Path,
    ) -> Result<Option<T>, ArtifactError> {
        let bytes = match self.s3.get(key).await {
            Ok(r) => r.bytes().await.map_err(backend)?,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(backend(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ArtifactError::Backend(format!("{key}: {e}")))
    }

    async fn put_json<T: Serialize>(&self, key: &Path, value: &T) -> Result<(), ArtifactError> {
        let json = serde_json::to_vec(value).map_err(|e| ArtifactError::Backend(e.to_string()))?;
        self.s3
            .put(key, PutPayload::from(json))
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn delete_quietly(&self, key: &Path) {
        if let Err(e) = self.s3.delete(key).await {
            tracing::warn!(%key, error = %e, "could not delete; prune_partials retries");
        }
    }

    /// Best effort: an upload that will not abort is the bucket's
    /// lifecycle rule's (or it was completed or aborted already).
    async fn abort_quietly(&self, digest: Digest, upload_id: &str) {
        if let Err(e) = self
            .s3
            .abort_multipart(&self.artifact_key(digest), &upload_id.to_string())
            .await
        {
            tracing::debug!(%digest, error = %e, "abort of a multipart upload failed");
        }
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

    async fn put_part(
        &self,
        digest: Digest,
        upload_id: &str,
        index: usize,
        chunks: Vec<Bytes>,
    ) -> Result<String, ArtifactError> {
        let part = self
            .s3
            .put_part(
                &self.artifact_key(digest),
                &upload_id.to_string(),
                index,
                PutPayload::from_iter(chunks),
            )
            .await
            .map_err(backend)?;
        Ok(part.content_id)
    }

    async fn complete(
        &self,
        digest: Digest,
        upload_id: &str,
        parts: &[String],
    ) -> Result<(), ArtifactError> {
        let parts = parts
            .iter()
            .map(|p| PartId {
                content_id: p.clone(),
            })
            .collect();
        self.s3
            .complete_multipart(&self.artifact_key(digest), &upload_id.to_string(), parts)
            .await
            .map_err(backend)?;
        Ok(())
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

    async fn load_partial(
        &self,
        owner: &str,
        digest: Digest,
    ) -> Result<Option<PartialState>, ArtifactError> {
        let key = self.partial_key(owner, digest);
        match self.get_json::<PartialState>(&key).await? {
            Some(state) if state.consistent(digest) => Ok(Some(state)),
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

    async fn prune(&self, max_age: Duration) -> Result<u64, ArtifactError> {
        let now = SystemTime::now();
        let stale: Vec<ObjectMeta> = self
            .s3
            .list(Some(&self.key("partials")))
            .try_filter(|meta| {
                let modified = SystemTime::from(meta.last_modified);
                let idle = now.duration_since(modified).unwrap_or_default();
                futures::future::ready(idle > max_age)
            })
            .try_collect()
            .await
            .map_err(backend)?;
        let mut dropped = 0;
        for meta in stale {
            let in_puts = meta.location.parts().any(|p| p.as_ref() == PUT_DIR);
            // Whatever the record says (or if it no longer parses), the
            // record itself goes: nobody resumes what it describes.
            let upload = if in_puts {
                self.get_json::<PendingPut>(&meta.location)
                    .await
                    .ok()
                    .flatten()
                    .map(|p| (p.digest, p.upload_id))
            } else {
                self.get_json::<PartialState>(&meta.location)
                    .await
                    .ok()
                    .flatten()
                    .map(|p| (p.digest, p.upload_id))
            };
            if let Some((digest, upload_id)) = upload {
                self.abort_quietly(digest, &upload_id).await;
            }
            match self.s3.delete(&meta.location).await {
                Ok(()) => dropped += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(backend(e)),
            }
        }
        Ok(dropped)
    }

    async fn list_all(&self) -> Result<Vec<StoredArtifact>, ArtifactError> {
        let mut refreshed: HashMap<Digest, SystemTime> = HashMap::new();
        let mut markers = self.s3.list(Some(&self.key("refreshed")));
        while let Some(meta) = markers.next().await {
            let meta = meta.map_err(backend)?;
            if let Some(d) = meta.location.filename().and_then(|n| n.parse().ok()) {
                refreshed.insert(d, meta.last_modified.into());
            }
        }
        let mut out = Vec::new();
        let mut objects = self.s3.list(Some(&self.key("sha256")));
        while let Some(meta) = objects.next().await {
            let meta = meta.map_err(backend)?;
            // Only objects named by their digest, where the store puts
            // them, are artifacts; anything else here is not ours to delete.
            let Some(digest) = meta
                .location
                .filename()
                .and_then(|n| n.parse::<Digest>().ok())
                .filter(|d| self.artifact_key(*d) == meta.location)
            else {
                continue;
            };
            let own: SystemTime = meta.last_modified.into();
            let modified = refreshed.get(&digest).map_or(own, |m| own.max(*m));
            out.push(StoredArtifact {
                digest,
                size: meta.size,
                modified,
            });
        }
        Ok(out)
    }

    async fn delete_older(
        &self,
        digest: Digest,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, ArtifactError> {
        let marker = self.marker_key(digest);
        let Some(meta) = self.head_meta(&self.artifact_key(digest)).await? else {
            self.delete_quietly(&marker).await;
            return Ok(None);
        };
        // Read right before the DELETE: see the module's note on the race.
        let refreshed = self.head_meta(&marker).await?;
        let own: SystemTime = meta.last_modified.into();
        let modified = refreshed.map_or(own, |m| own.max(m.last_modified.into()));
        if modified > cutoff {
            return Ok(None);
        }
        // One DELETE: the key is there with all its bytes or gone.
        self.s3
            .delete(&self.artifact_key(digest))
            .await
            .map_err(backend)?;
        self.delete_quietly(&marker).await;
        Ok(Some(meta.size))
    }

    /// Every key under the prefix (tests: what a failure left behind).
    #[cfg(test)]
    pub(crate) async fn test_keys(&self) -> Result<Vec<String>, ArtifactError> {
        let prefix = self.key("");
        let strip = format!("{prefix}/");
        self.s3
            .list(Some(&prefix))
            .map_ok(|m| {
                let key = m.location.to_string();
                key.strip_prefix(&strip).unwrap_or(&key).to_string()
            })
            .try_collect()
            .await
            .map_err(backend)
    }

    #[cfg(test)]
    pub(crate) async fn test_put_raw(
        &self,
        rest: &str,
        bytes: &'static [u8],
    ) -> Result<(), ArtifactError> {
        self.s3
            .put(&self.key(rest), PutPayload::from_static(bytes))
            .await
            .map_err(backend)?;
        Ok(())
    }
}

/// A `put`'s multipart upload while it streams.
struct OpenPut {
    upload_id: String,
    record: Path,
    parts: Vec<String>,
}

#[async_trait]
impl ArtifactStore for S3ArtifactStore {
    async fn put(
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

    async fn partial_len(&self, owner: &str, digest: Digest) -> Result<u64, ArtifactError> {
        Ok(self
            .load_partial(owner, digest)
            .await?
            .map_or(0, |s| s.held()))
    }

    /// Parts are flushed at [`PART_BYTES`]; what arrived after the last
    /// flushed part is not held, so a body that breaks is continued from
    /// the last part (`partial_len`, and `Incomplete`'s `received`).
    async fn put_resumable(
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
        let existing = match self.load_partial(owner, expected).await {
            Ok(s) => s,
            // Starting over needs nothing of a state that does not add up.
            Err(_) if offset == 0 => None,
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
        let (mut state, mut hasher) = match existing {
            Some(state) if offset != 0 => {
                let hasher = ResumableSha256::resume(state.sha256).ok_or_else(|| {
                    ArtifactError::Backend(format!("{state_key}: hash state off a block"))
                })?;
                (state, hasher)
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
                if let Err(e) = self.put_json(&state_key, &state).await {
                    self.abort_quietly(expected, &state.upload_id).await;
                    return Err(e);
                }
                (state, hasher)
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
                self.put_json(&state_key, &saved).await?;
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

    fn prune_partials(&self, max_age: Duration) -> Result<u64, ArtifactError> {
        self.blocking(self.prune(max_age))
    }

    fn list(&self) -> Result<Vec<StoredArtifact>, ArtifactError> {
        self.blocking(self.list_all())
    }

    fn delete_if_older(
        &self,
        digest: Digest,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, ArtifactError> {
        self.blocking(self.delete_older(digest, cutoff))
    }

    async fn head(&self, digest: Digest) -> Result<Option<u64>, ArtifactError> {
        Ok(self
            .head_meta(&self.artifact_key(digest))
            .await?
            .map(|m| m.size))
    }

    async fn open_at(
        &self,
        digest: Digest,
        offset: u64,
    ) -> Result<(u64, ArtifactReader), ArtifactError> {
        let key = self.artifact_key(digest);
        let options = GetOptions {
            range: (offset > 0).then_some(GetRange::Offset(offset)),
            ..Default::default()
        };
        let got = match self.s3.get_opts(&key, options).await {
            Ok(got) => got,
            Err(e) if is_not_found(&e) => return Err(ArtifactError::NotFound(digest)),
            // A range past the end is refused by S3; the local store reads
            // nothing there, and so does this one.
            Err(e) => match self.head_meta(&key).await? {
                Some(meta) if offset >= meta.size => {
                    return Ok((meta.size, Box::pin(tokio::io::empty())))
                }
                Some(_) => return Err(backend(e)),
                None => return Err(ArtifactError::NotFound(digest)),
            },
        };
        let size = got.meta.size;
        let stream = got.into_stream().map_err(std::io::Error::other);
        Ok((size, Box::pin(tokio_util::io::StreamReader::new(stream))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wrong secret or a bucket that is not there fails the start,
    /// naming the store, instead of the first upload.
    #[tokio::test]
    async fn a_wrong_secret_or_bucket_fails_at_open() {
        let Ok(url) = std::env::var("EDGELOOP_TEST_S3_URL") else {
            eprintln!("skipped: EDGELOOP_TEST_S3_URL is unset (scripts/s3-up.sh)");
            return;
        };
        let loc: S3Location = url.parse().unwrap();
        S3ArtifactStore::open(loc.clone()).await.unwrap();
        let wrong = AmazonS3Builder::from_env().with_secret_access_key("not-the-secret");
        let err = S3ArtifactStore::open_with(loc.clone(), wrong)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&loc.to_string()) && err.contains("403"),
            "{err}"
        );
        let missing = S3Location {
            bucket: "no-such-bucket-here".into(),
            prefix: String::new(),
        };
        let err = S3ArtifactStore::open(missing)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("s3://no-such-bucket-here"), "{err}");
    }
}
