//! Content-addressed artifact storage. Every blob is named by its sha256; an
//! upload declares the digest up front and is stored only if the bytes match.
//!
//! [`ArtifactStore`] is the seam between backends: [`LocalArtifactStore`]
//! is the embedded default, `super::s3::S3ArtifactStore` the object store.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use edgeloop_models::fs::sync_dir;
use edgeloop_models::{Digest, Sha256Writer};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncSeekExt, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("content digest is {actual}, but the upload declared {expected}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("upload is {actual} bytes, but declared {expected}")]
    SizeMismatch { expected: u64, actual: u64 },
    #[error("artifact exceeds the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("artifact {0} not found")]
    NotFound(Digest),
    #[error("upload stream failed: {0}")]
    Body(String),
    #[error(
        "upload incomplete: received {received} of {expected} bytes; resume from offset {received}"
    )]
    Incomplete { received: u64, expected: u64 },
    #[error("cannot resume at offset {requested}: {held} bytes are held")]
    Offset { requested: u64, held: u64 },
    /// A newer call for the same owner's upload of the same artifact took
    /// it over (a retry beside a stalled try); this one wrote nothing more.
    #[error(
        "a newer upload of this artifact by the same uploader took over; ask where it stands and resume from there"
    )]
    Superseded,
    #[error("artifact store I/O: {0}")]
    Io(#[from] io::Error),
    /// The object store (S3) failed or could not be reached; a retry may
    /// succeed.
    #[error("artifact store backend: {0}")]
    Backend(String),
}

/// What each artifact error is to a caller; `edgeloop_errors` maps that
/// to a status.
impl From<ArtifactError> for edgeloop_errors::Error {
    fn from(e: ArtifactError) -> Self {
        match e {
            ArtifactError::DigestMismatch { .. } | ArtifactError::SizeMismatch { .. } => {
                edgeloop_errors::Error::bad_field("digest", e.to_string())
            }
            ArtifactError::TooLarge { limit } => edgeloop_errors::Error::PayloadTooLarge { limit },
            ArtifactError::NotFound(d) => {
                edgeloop_errors::Error::not_found("artifact", d.to_string())
            }
            ArtifactError::Body(m) => edgeloop_errors::Error::BadRequest {
                field: None,
                message: format!("reading the upload failed: {m}"),
            },
            ArtifactError::Incomplete { .. } => edgeloop_errors::Error::Unavailable(e.to_string()),
            ArtifactError::Offset { .. } => {
                edgeloop_errors::Error::bad_field("offset", e.to_string())
            }
            ArtifactError::Superseded => edgeloop_errors::Error::Conflict(e.to_string()),
            ArtifactError::Io(_) => edgeloop_errors::Error::Internal(e.into()),
            ArtifactError::Backend(_) => edgeloop_errors::Error::Unavailable(e.to_string()),
        }
    }
}

pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ArtifactError>> + Send>>;
pub type ArtifactReader = Pin<Box<dyn AsyncRead + Send>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    pub digest: Digest,
    pub size: u64,
    /// False when the artifact was already stored (uploads are idempotent).
    pub created: bool,
}

/// A stored artifact as garbage collection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredArtifact {
    pub digest: Digest,
    pub size: u64,
    /// When it was last stored: a put of bytes already held refreshes it,
    /// so the grace period counts from the newest upload.
    pub modified: std::time::SystemTime,
}

#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    /// Hard cap on any artifact.
    pub max_bytes: u64,
    /// The size the client declared, if any; checked exactly.
    pub declared_size: Option<u64>,
}

#[async_trait]
pub trait ArtifactStore: Send + Sync + 'static {
    /// Streams `body` into the store. Nothing becomes visible unless the whole
    /// body arrived, fits the limits, and hashes to `expected`.
    async fn put(
        &self,
        expected: Digest,
        body: ByteStream,
        limits: UploadLimits,
    ) -> Result<PutOutcome, ArtifactError>;

    /// Bytes already held of `owner`'s interrupted resumable upload of
    /// `digest` (0 if none).
    async fn partial_len(&self, _owner: &str, _digest: Digest) -> Result<u64, ArtifactError> {
        Ok(0)
    }

    /// Like [`ArtifactStore::put`], for a body of exactly `size` bytes that
    /// may arrive over several calls: what arrives is kept when the body
    /// ends early or breaks, and `owner`'s next call continues at `offset`.
    /// Partial bytes are `owner`'s alone (a bridge's job): one uploader
    /// never continues, or learns about, another's. The whole body is
    /// always read and hashed, even when the digest is already stored, so
    /// an upload proves its caller has the bytes. Stores that cannot resume
    /// accept only offset 0.
    async fn put_resumable(
        &self,
        _owner: &str,
        expected: Digest,
        body: ByteStream,
        size: u64,
        max_bytes: u64,
        offset: u64,
    ) -> Result<PutOutcome, ArtifactError> {
        if offset != 0 {
            return Err(ArtifactError::Offset {
                requested: offset,
                held: 0,
            });
        }
        self.put(
            expected,
            body,
            UploadLimits {
                max_bytes,
                declared_size: Some(size),
            },
        )
        .await
    }

    /// Drops interrupted resumable uploads nobody has written to for
    /// `max_age` (an uploader back after that starts over); returns how
    /// many went. Blocking. Stores that keep no partials have none.
    fn prune_partials(&self, _max_age: std::time::Duration) -> Result<u64, ArtifactError> {
        Ok(0)
    }

    /// Every stored artifact (whole ones; partial uploads are not
    /// artifacts), for garbage collection. Blocking. A store that cannot
    /// list returns none, and then nothing of it is ever collected.
    fn list(&self) -> Result<Vec<StoredArtifact>, ArtifactError> {
        Ok(Vec::new())
    }

    /// Deletes `digest` if it is still stored and was last stored (put,
    /// or put again) at or before `cutoff`; returns the bytes freed, or
    /// None when it was kept or absent. The check and the delete are one
    /// step against a concurrent put of the same digest, so an upload that
    /// refreshed it since the caller listed it is never lost. Never leaves
    /// something that `head` or `open_at` would serve in part. Blocking.
    /// Default: deletes nothing.
    fn delete_if_older(
        &self,
        _digest: Digest,
        _cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, ArtifactError> {
        Ok(None)
    }

    /// Size of a stored artifact, or None.
    async fn head(&self, digest: Digest) -> Result<Option<u64>, ArtifactError>;

    /// Reads from `offset` to the end; returns the total size too.
    async fn open_at(
        &self,
        digest: Digest,
        offset: u64,
    ) -> Result<(u64, ArtifactReader), ArtifactError>;
}

/// Stores `bytes` the control plane made itself (a snapshot, a model, a
/// manifest) under their digest, within `max_bytes`.
pub async fn put_bytes(
    store: &dyn ArtifactStore,
    bytes: Vec<u8>,
    max_bytes: u64,
) -> Result<Digest, ArtifactError> {
    let d = Digest::of(&bytes);
    let size = bytes.len() as u64;
    let body = futures::stream::once(async move { Ok(bytes::Bytes::from(bytes)) });
    store
        .put(
            d,
            Box::pin(body),
            UploadLimits {
                max_bytes,
                declared_size: Some(size),
            },
        )
        .await?;
    Ok(d)
}

/// `<root>/sha256/<first two hex>/<digest>`; uploads in progress live in
/// `<root>/tmp/` and are swept at start.
#[derive(Debug, Clone)]
pub struct LocalArtifactStore {
    root: PathBuf,
    /// Orders a commit against a garbage-collection delete of the same
    /// path: a commit that finds the artifact there refreshes its time
    /// under it, and a delete re-checks that time under it, so a put
    /// answered "stored" is never followed by its artifact's deletion.
    /// Held only for a few syscalls, never across an await.
    gate: std::sync::Arc<std::sync::Mutex<()>>,
    /// Which call writes each partial file (see [`claims`]).
    claims: std::sync::Arc<claims::Claims>,
}

impl LocalArtifactStore {
    pub fn open(root: &Path) -> io::Result<Self> {
        let store = Self {
            root: root.to_path_buf(),
            gate: Default::default(),
            claims: Default::default(),
        };
        std::fs::create_dir_all(store.root.join("sha256"))?;
        let tmp = store.root.join("tmp");
        // Leftovers are uploads that a crash interrupted; they were never
        // acknowledged, so dropping them loses nothing.
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        // Partial resumable uploads survive restarts: resuming them is the point.
        std::fs::create_dir_all(store.root.join("partial"))?;
        // The directories just made are durable before anything is put in.
        sync_dir(&store.root)?;
        Ok(store)
    }

    /// `partial/<sha256(owner)>-<digest>`: a file name whatever the owner's
    /// characters.
    fn partial_path(&self, owner: &str, digest: Digest) -> PathBuf {
        let owner = Digest::of(owner.as_bytes()).to_hex();
        self.root
            .join("partial")
            .join(format!("{}-{}", &owner[..32], digest.to_hex()))
    }

    /// Moves a verified file into the store (or drops it if already there).
    async fn commit(
        &self,
        file: &Path,
        digest: Digest,
        size: u64,
    ) -> Result<PutOutcome, ArtifactError> {
        let dest = self.path_of(digest);
        let dir = dest
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.root.clone());
        let (gate, from, to, shard) = (self.gate.clone(), file.to_path_buf(), dest, dir.clone());
        let created = tokio::task::spawn_blocking(move || -> io::Result<bool> {
            let _turn = gate
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if to.exists() {
                // Stored again: its grace period before collection starts
                // over, durably, as for a new upload (a client registers
                // what it uploaded after the upload, however old the bytes).
                let held = std::fs::File::options().write(true).open(&to)?;
                held.set_modified(std::time::SystemTime::now())?;
                held.sync_all()?;
                std::fs::remove_file(&from)?;
                return Ok(false);
            }
            std::fs::create_dir_all(&shard)?;
            std::fs::rename(&from, &to)?;
            Ok(true)
        })
        .await
        .map_err(io::Error::other)??;
        if !created {
            return Ok(PutOutcome {
                digest,
                size,
                created: false,
            });
        }
        // The rename is durable only once the directory entry is, and a
        // shard directory made for it only once its parent's entry is. The
        // parent is synced every time, not only by the call that made the
        // shard: a concurrent commit into the same new shard must not answer
        // before that entry is durable either.
        let parent = dir.parent().map(Path::to_path_buf);
        tokio::task::spawn_blocking(move || {
            sync_dir(&dir)?;
            parent.as_deref().map_or(Ok(()), sync_dir)
        })
        .await
        .map_err(io::Error::other)??;
        Ok(PutOutcome {
            digest,
            size,
            created: true,
        })
    }

    fn path_of(&self, digest: Digest) -> PathBuf {
        let hex = digest.to_hex();
        self.root.join("sha256").join(&hex[..2]).join(hex)
    }

    async fn write_temp(
        &self,
        tmp: &Path,
        mut body: ByteStream,
        limits: UploadLimits,
    ) -> Result<(Digest, u64), ArtifactError> {
        let cap = limits.max_bytes;
        if let Some(declared) = limits.declared_size {
            if declared > cap {
                return Err(ArtifactError::TooLarge { limit: cap });
            }
        }
        let mut file = tokio::fs::File::create(tmp).await?;
        let mut hasher = Sha256Writer::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            if hasher.len() + chunk.len() as u64 > cap {
                return Err(ArtifactError::TooLarge { limit: cap });
            }
            if let Some(declared) = limits.declared_size {
                if hasher.len() + chunk.len() as u64 > declared {
                    return Err(ArtifactError::SizeMismatch {
                        expected: declared,
                        actual: hasher.len() + chunk.len() as u64,
                    });
                }
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await?;
        }
        file.sync_all().await?;
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
}

#[async_trait]
impl ArtifactStore for LocalArtifactStore {
    async fn put(
        &self,
        expected: Digest,
        body: ByteStream,
        limits: UploadLimits,
    ) -> Result<PutOutcome, ArtifactError> {
        let tmp =
            self.root
                .join("tmp")
                .join(format!("{}-{:016x}", expected, rand::random::<u64>()));
        let written = self.write_temp(&tmp, body, limits).await;
        let (actual, size) = match written {
            Ok(v) => v,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        if actual != expected {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(ArtifactError::DigestMismatch { expected, actual });
        }
        self.commit(&tmp, expected, size).await
    }

    fn prune_partials(&self, max_age: std::time::Duration) -> Result<u64, ArtifactError> {
        let now = std::time::SystemTime::now();
        let mut dropped = 0;
        for entry in std::fs::read_dir(self.root.join("partial"))?.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let idle = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            if meta.is_file() && idle > max_age && std::fs::remove_file(entry.path()).is_ok() {
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    fn list(&self) -> Result<Vec<StoredArtifact>, ArtifactError> {
        let mut out = Vec::new();
        for shard in std::fs::read_dir(self.root.join("sha256"))? {
            let shard = shard?;
            if !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in std::fs::read_dir(shard.path())? {
                let entry = entry?;
                // Only files named by their digest, in their own shard,
                // are artifacts; anything else here is not ours to delete.
                let Some(digest) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<Digest>().ok())
                    .filter(|d| self.path_of(*d) == entry.path())
                else {
                    continue;
                };
                let meta = match entry.metadata() {
                    Ok(m) => m,
                    // Deleted since the directory was read.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                };
                if meta.is_file() {
                    out.push(StoredArtifact {
                        digest,
                        size: meta.len(),
                        modified: meta.modified()?,
                    });
                }
            }
        }
        Ok(out)
    }

    fn delete_if_older(
        &self,
        digest: Digest,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, ArtifactError> {
        let path = self.path_of(digest);
        let size = {
            let _turn = self
                .gate
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            if meta.modified()? > cutoff {
                return Ok(None);
            }
            // One unlink: the name is there with all its bytes or gone;
            // a reader that opened it before keeps reading whole bytes.
            std::fs::remove_file(&path)?;
            meta.len()
        };
        // The deletion is durable once the shard's entry is. A crash
        // before brings the whole file back, which the next pass collects.
        if let Some(shard) = path.parent() {
            sync_dir(shard)?;
        }
        Ok(Some(size))
    }

    async fn partial_len(&self, owner: &str, digest: Digest) -> Result<u64, ArtifactError> {
        match tokio::fs::metadata(self.partial_path(owner, digest)).await {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

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
        // No shortcut when `expected` is already stored: the body is read
        // and hashed all the same (and `commit` then drops the copy), or a
        // caller could name any stored digest as its own upload.
        let partial = self.partial_path(owner, expected);
        // Taken before the file is looked at: from here on, no earlier call
        // for this upload writes to it.
        let (claim, turn) = self.claims.take(&partial).await;
        let held = self.partial_len(owner, expected).await?;
        // Continue exactly where the held bytes end, or start over at 0.
        if offset != 0 && offset != held {
            return Err(ArtifactError::Offset {
                requested: offset,
                held,
            });
        }
        let mut hasher = Sha256Writer::new();
        let mut file = if offset == 0 {
            tokio::fs::File::create(&partial).await?
        } else {
            // Re-hash what is held so the digest covers the whole artifact.
            let mut existing = tokio::fs::File::open(&partial).await?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = tokio::io::AsyncReadExt::read(&mut existing, &mut buf).await?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
            tokio::fs::OpenOptions::new()
                .append(true)
                .open(&partial)
                .await?
        };
        drop(turn);
        let mut broken = None;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    broken = Some(e);
                    break;
                }
            };
            let _turn = claim.write_turn().await?;
            if hasher.len() + chunk.len() as u64 > size {
                let actual = hasher.len() + chunk.len() as u64;
                drop(file);
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(ArtifactError::SizeMismatch {
                    expected: size,
                    actual,
                });
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await?;
        }
        // Held to the end: a newer call must not append to the file while
        // it is synced, checked and moved into the store.
        let _turn = claim.write_turn().await?;
        file.sync_all().await?;
        drop(file);
        if let Some(e) = broken {
            return Err(e);
        }
        if hasher.len() < size {
            return Err(ArtifactError::Incomplete {
                received: hasher.len(),
                expected: size,
            });
        }
        let actual = hasher.finish();
        if actual != expected {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(ArtifactError::DigestMismatch { expected, actual });
        }
        self.commit(&partial, expected, size).await
    }

    async fn head(&self, digest: Digest) -> Result<Option<u64>, ArtifactError> {
        match tokio::fs::metadata(self.path_of(digest)).await {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn open_at(
        &self,
        digest: Digest,
        offset: u64,
    ) -> Result<(u64, ArtifactReader), ArtifactError> {
        let mut file = match tokio::fs::File::open(self.path_of(digest)).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ArtifactError::NotFound(digest))
            }
            Err(e) => return Err(e.into()),
        };
        let size = file.metadata().await?.len();
        file.seek(io::SeekFrom::Start(offset.min(size))).await?;
        Ok((size, Box::pin(file)))
    }
}

/// The behaviour every backend promises, run against each (`tests.rs`).
mod claims;
#[cfg(test)]
mod tests;
