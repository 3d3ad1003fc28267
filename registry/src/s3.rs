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

mod gc;
mod location;
mod put;
mod resumable;
mod sha;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use edgeloop_models::Digest;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    ClientConfigKey, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMode, PutPayload, UpdateVersion,
};
use serde::Serialize;

pub use location::{S3Location, S3UrlError};

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

fn backend(e: object_store::Error) -> ArtifactError {
    ArtifactError::Backend(e.to_string())
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
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
        Ok(self.get_json_versioned(key).await?.map(|(v, _)| v))
    }

    /// The object and its version (ETag), for a write that must replace
    /// exactly what was read ([`S3ArtifactStore::put_json_if`]).
    async fn get_json_versioned<T: serde::de::DeserializeOwned>(
        &self,
        key: &Path,
    ) -> Result<Option<(T, UpdateVersion)>, ArtifactError> {
        let got = match self.s3.get(key).await {
            Ok(r) => r,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(backend(e)),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got.bytes().await.map_err(backend)?;
        serde_json::from_slice(&bytes)
            .map(|v| Some((v, version)))
            .map_err(|e| ArtifactError::Backend(format!("{key}: {e}")))
    }

    async fn put_json<T: Serialize>(&self, key: &Path, value: &T) -> Result<(), ArtifactError> {
        self.put_json_if(key, value, PutMode::Overwrite).await?;
        Ok(())
    }

    /// Writes `value` only as `mode` allows (`Create`: if absent;
    /// `Update`: if it still holds that version), with S3's conditional
    /// PUT (`If-None-Match: *`, `If-Match`); the version written. A lost
    /// condition is [`ArtifactError::Superseded`]: another writer got
    /// there first.
    async fn put_json_if<T: Serialize>(
        &self,
        key: &Path,
        value: &T,
        mode: PutMode,
    ) -> Result<UpdateVersion, ArtifactError> {
        let json = serde_json::to_vec(value).map_err(|e| ArtifactError::Backend(e.to_string()))?;
        match self
            .s3
            .put_opts(key, PutPayload::from(json), mode.into())
            .await
        {
            Ok(put) => Ok(UpdateVersion {
                e_tag: put.e_tag,
                version: put.version,
            }),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Err(ArtifactError::Superseded),
            // An `If-Match` on an object deleted meanwhile (the other
            // writer finished) is answered 404 by some servers.
            Err(e) if is_not_found(&e) => Err(ArtifactError::Superseded),
            Err(e) => Err(backend(e)),
        }
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

#[async_trait]
impl ArtifactStore for S3ArtifactStore {
    async fn put(
        &self,
        expected: Digest,
        body: ByteStream,
        limits: UploadLimits,
    ) -> Result<PutOutcome, ArtifactError> {
        self.put_verified(expected, body, limits).await
    }

    /// Parts are flushed at [`PART_BYTES`]; what arrived after the last
    /// flushed part is not held, so a body that breaks is continued from
    /// the last part (`partial_len`, and `Incomplete`'s `received`).
    async fn put_resumable(
        &self,
        owner: &str,
        expected: Digest,
        body: ByteStream,
        size: u64,
        max_bytes: u64,
        offset: u64,
    ) -> Result<PutOutcome, ArtifactError> {
        self.put_resumable_parts(owner, expected, body, size, max_bytes, offset)
            .await
    }

    async fn partial_len(&self, owner: &str, digest: Digest) -> Result<u64, ArtifactError> {
        Ok(self
            .load_partial(owner, digest)
            .await?
            .map_or(0, |s| s.held()))
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
            edgeloop_store::skip_or_fail!(
                "opening S3: EDGELOOP_TEST_S3_URL is unset (run scripts/s3-up.sh and export its \
                 env file, as scripts/test.sh does)"
            );
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
