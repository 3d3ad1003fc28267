//! Chunked, resumable downloads over FetchArtifact.
//!
//! Bytes go to `downloads/<digest>.partial`; every `persist_every` bytes, and
//! whenever the stream breaks, the file is fsynced and then the offset is
//! written to `<digest>.progress`. A resume (after a network break or an
//! agent restart) trusts only that recorded offset, truncates the file to it
//! (after a power cut the bytes past it may be garbage), re-hashes the prefix
//! and asks the control plane for the rest. The whole file is checked against
//! its digest before it is renamed to `downloads/<digest>`.
//!
//! Transient errors are retried with jittered backoff for as long as the
//! caller lets the future run: the assignment's deadline is the caller's.

use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use edgeloop_client_core::Backoff;
use edgeloop_models::fs::{sync_dir, write_atomic};
use edgeloop_models::{Digest, Sha256Writer};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast;

use super::blocking;
use super::client::{is_refusal, ControlPlaneClient};
use super::events::SyncEvent;
use super::failure::Failure;
use super::space::ensure_space;
use super::verify::check_file;

#[derive(Debug, Clone, Copy)]
pub struct DownloadOptions {
    /// Requested chunk size (the server caps it).
    pub chunk_bytes: u32,
    /// Bytes between durable progress records.
    pub persist_every: u64,
    pub backoff: Backoff,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            chunk_bytes: 1 << 20,
            persist_every: 8 << 20,
            backoff: Backoff::default(),
        }
    }
}

/// One file to download.
#[derive(Debug, Clone, Copy)]
pub struct Want {
    pub what: &'static str,
    pub digest: Digest,
    /// Known up front for the model artifact; learned from the first chunk
    /// for manifests and probe inputs.
    pub size: Option<u64>,
    /// Refuse anything larger (a manifest is small; a lying server is not
    /// allowed to fill the disk).
    pub max_size: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Progress {
    offset: u64,
    /// The whole size once the server said it: a manifest's or probe's is
    /// not known before. Kept so that a download killed after its last
    /// bytes and before its rename resumes as complete. Absent in progress
    /// files from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
}

pub struct Downloader {
    client: Arc<dyn ControlPlaneClient>,
    options: DownloadOptions,
    events: broadcast::Sender<SyncEvent>,
}

struct Paths {
    done: PathBuf,
    partial: PathBuf,
    progress: PathBuf,
}

impl Paths {
    fn new(dir: &Path, digest: Digest) -> Paths {
        Paths {
            done: dir.join(digest.to_hex()),
            partial: dir.join(format!("{digest}.partial")),
            progress: dir.join(format!("{digest}.progress")),
        }
    }
}

/// Where a download stands.
struct Partial {
    file: tokio::fs::File,
    offset: u64,
    hasher: Sha256Writer,
    unpersisted: u64,
    /// The size the server said (or the progress file recorded).
    total: Option<u64>,
}

/// Why one FetchArtifact stream ended without the whole file.
enum Interrupted {
    Transient(String),
    Final(Failure),
}

impl Downloader {
    pub fn new(
        client: Arc<dyn ControlPlaneClient>,
        options: DownloadOptions,
        events: broadcast::Sender<SyncEvent>,
    ) -> Downloader {
        Downloader {
            client,
            options,
            events,
        }
    }

    /// Downloads `want` into `dir` and returns the verified file's path.
    pub async fn fetch(&self, dir: &Path, want: Want) -> Result<PathBuf, Failure> {
        let storage = |e: io::Error| Failure::storage(want.what, e);
        tokio::fs::create_dir_all(dir).await.map_err(storage)?;
        let paths = Paths::new(dir, want.digest);
        // Complete from an earlier run (e.g. killed before the slot flip).
        if tokio::fs::try_exists(&paths.done).await.unwrap_or(false) {
            let (done, w) = (paths.done.clone(), want);
            let checked = blocking(move || Ok(check_file(&done, w.what, w.digest, w.size))).await;
            match checked.map_err(storage)? {
                Ok(()) => return Ok(paths.done),
                Err(e) => {
                    tracing::warn!(error = %e, "discarding a corrupt finished download");
                    let _ = tokio::fs::remove_file(&paths.done).await;
                }
            }
        }
        let mut p = self.resume(&paths, want).await.map_err(storage)?;
        let mut total = want.size.or(p.total);
        if let Some(size) = total {
            check_size(want, size)?;
            ensure_space(dir, size.saturating_sub(p.offset))?;
        }
        let mut attempt: u32 = 0;
        while total != Some(p.offset) {
            let _ = self.events.send(SyncEvent::FetchStarted {
                digest: want.digest,
                offset: p.offset,
            });
            tracing::info!(what = want.what, digest = %want.digest, offset = p.offset, "fetching");
            let before = p.offset;
            let interrupted = self
                .stream_into(dir, &paths, want, &mut p, &mut total)
                .await;
            self.persist(&paths, &mut p).await.map_err(storage)?;
            match interrupted {
                None => {}
                Some(Interrupted::Final(f)) => return Err(f),
                Some(Interrupted::Transient(why)) => {
                    if p.offset > before {
                        attempt = 0;
                    }
                    let delay = self.options.backoff.next(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(what = want.what, offset = p.offset, error = %why, ?delay, "download interrupted; will resume");
                    tokio::time::sleep(delay).await;
                }
            }
        }
        self.finish(&paths, want, p).await
    }

    /// Reopens a partial download at its last durable offset.
    async fn resume(&self, paths: &Paths, want: Want) -> io::Result<Partial> {
        let (partial, progress) = (paths.partial.clone(), paths.progress.clone());
        let (std_file, offset, hasher, total) = blocking(move || {
            let recorded = std::fs::read(&progress)
                .ok()
                .and_then(|b| serde_json::from_slice::<Progress>(&b).ok())
                .unwrap_or(Progress {
                    offset: 0,
                    total: None,
                });
            // A recorded total below the offset is no total at all.
            let recorded_total = recorded.total.filter(|t| *t >= recorded.offset);
            let recorded = recorded.offset;
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&partial)?;
            let len = file.metadata()?.len();
            let mut offset = recorded.min(len);
            if want.size.is_some_and(|s| offset > s) {
                offset = 0;
            }
            file.set_len(offset)?;
            let mut hasher = Sha256Writer::new();
            let mut buf = vec![0u8; 256 * 1024];
            file.seek(io::SeekFrom::Start(0))?;
            let mut prefix = (&mut file).take(offset);
            loop {
                match prefix.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => hasher.update(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if hasher.len() != offset {
                return Err(io::Error::other("partial download shrank while resuming"));
            }
            file.seek(io::SeekFrom::Start(offset))?;
            Ok((file, offset, hasher, recorded_total))
        })
        .await?;
        Ok(Partial {
            file: tokio::fs::File::from_std(std_file),
            offset,
            hasher,
            unpersisted: 0,
            total,
        })
    }

    /// Runs one FetchArtifact stream; `None` when it delivered everything.
    async fn stream_into(
        &self,
        dir: &Path,
        paths: &Paths,
        want: Want,
        p: &mut Partial,
        total: &mut Option<u64>,
    ) -> Option<Interrupted> {
        let classify = |status: tonic::Status| {
            if is_refusal(status.code()) {
                Interrupted::Final(Failure::Refused(format!(
                    "{} {}: {}",
                    want.what,
                    want.digest,
                    status.message()
                )))
            } else {
                Interrupted::Transient(status.to_string())
            }
        };
        let mut stream = match self
            .client
            .fetch(want.digest, p.offset, self.options.chunk_bytes)
            .await
        {
            Ok(s) => s,
            Err(status) => return Some(classify(status)),
        };
        let mut chunks: u64 = 0;
        while let Some(item) = stream.next().await {
            chunks += 1;
            let chunk = match item {
                Ok(c) => c,
                Err(status) => return Some(classify(status)),
            };
            if chunk.offset != p.offset {
                return Some(Interrupted::Transient(format!(
                    "the server sent offset {}, expected {}",
                    chunk.offset, p.offset
                )));
            }
            match *total {
                None => {
                    if let Err(f) = check_size(want, chunk.total_size)
                        .and_then(|()| ensure_space(dir, chunk.total_size - p.offset))
                    {
                        return Some(Interrupted::Final(f));
                    }
                    *total = Some(chunk.total_size);
                    p.total = *total;
                }
                Some(t) if t != chunk.total_size => {
                    return Some(Interrupted::Final(Failure::BadSize {
                        what: want.what,
                        digest: want.digest,
                        expected: t,
                        actual: chunk.total_size,
                    }))
                }
                Some(_) => {}
            }
            let end = p.offset.saturating_add(chunk.data.len() as u64);
            if total.is_some_and(|t| end > t) {
                return Some(Interrupted::Final(Failure::BadSize {
                    what: want.what,
                    digest: want.digest,
                    expected: total.unwrap_or_default(),
                    actual: end,
                }));
            }
            if let Err(e) = p.file.write_all(&chunk.data).await {
                return Some(Interrupted::Final(Failure::storage(want.what, e)));
            }
            p.hasher.update(&chunk.data);
            p.offset = end;
            p.unpersisted += chunk.data.len() as u64;
            if p.unpersisted >= self.options.persist_every {
                if let Err(e) = self.persist(paths, p).await {
                    return Some(Interrupted::Final(Failure::storage(want.what, e)));
                }
            }
        }
        match *total {
            Some(t) if t == p.offset => None,
            // An empty artifact sends no chunk at all; nor does one asked
            // for at its end, which a download killed between its last
            // bytes and its rename resumes at (a progress file from before
            // totals were kept). Either way it is complete if its hash says
            // so, which finish() checks.
            None if chunks == 0 => {
                *total = Some(p.offset);
                None
            }
            _ => Some(Interrupted::Transient(format!(
                "the stream ended at offset {}",
                p.offset
            ))),
        }
    }

    /// The data first, then the offset that vouches for it.
    async fn persist(&self, paths: &Paths, p: &mut Partial) -> io::Result<()> {
        p.file.flush().await?;
        p.file.sync_data().await?;
        let bytes = serde_json::to_vec(&Progress {
            offset: p.offset,
            total: p.total,
        })
        .map_err(io::Error::other)?;
        let progress = paths.progress.clone();
        blocking(move || write_atomic(&progress, &bytes, 0o600)).await?;
        p.unpersisted = 0;
        Ok(())
    }

    async fn finish(&self, paths: &Paths, want: Want, mut p: Partial) -> Result<PathBuf, Failure> {
        let storage = |e: io::Error| Failure::storage(want.what, e);
        p.file.flush().await.map_err(storage)?;
        p.file.sync_all().await.map_err(storage)?;
        drop(p.file);
        let actual = p.hasher.finish();
        if actual != want.digest {
            // Start over next time: resuming corrupt bytes cannot succeed.
            let _ = tokio::fs::remove_file(&paths.partial).await;
            let _ = tokio::fs::remove_file(&paths.progress).await;
            return Err(Failure::BadDigest {
                what: want.what,
                expected: want.digest,
                actual,
            });
        }
        tokio::fs::rename(&paths.partial, &paths.done)
            .await
            .map_err(storage)?;
        let _ = tokio::fs::remove_file(&paths.progress).await;
        let dir = paths.done.parent().unwrap_or(Path::new(".")).to_path_buf();
        blocking(move || sync_dir(&dir)).await.map_err(storage)?;
        let _ = self.events.send(SyncEvent::Downloaded {
            digest: want.digest,
        });
        Ok(paths.done.clone())
    }
}

fn check_size(want: Want, size: u64) -> Result<(), Failure> {
    if size > want.max_size {
        return Err(Failure::BadSize {
            what: want.what,
            digest: want.digest,
            expected: want.max_size,
            actual: size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::client::StatusStream;
    use async_trait::async_trait;
    use edgeloop_proto::agent::v1 as pb;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Serves one blob; each stream breaks after `break_after` bytes while
    /// `breaks` lasts. Records the offsets asked for.
    struct FakeServer {
        blob: Vec<u8>,
        chunk: usize,
        break_after: usize,
        breaks: Mutex<u32>,
        offsets: Mutex<Vec<u64>>,
    }

    #[async_trait]
    impl ControlPlaneClient for FakeServer {
        async fn watch(&self, _: u64) -> Result<StatusStream<pb::AssignmentSet>, tonic::Status> {
            Err(tonic::Status::unimplemented("watch"))
        }

        async fn fetch(
            &self,
            _digest: Digest,
            offset: u64,
            _max: u32,
        ) -> Result<StatusStream<pb::ArtifactChunk>, tonic::Status> {
            self.offsets.lock().unwrap().push(offset);
            let breaking = {
                let mut b = self.breaks.lock().unwrap();
                let breaking = *b > 0;
                *b = b.saturating_sub(1);
                breaking
            };
            let mut items = vec![];
            let mut at = offset as usize;
            let mut sent = 0;
            while at < self.blob.len() {
                if breaking && sent >= self.break_after {
                    items.push(Err(tonic::Status::unavailable("connection reset")));
                    break;
                }
                let end = (at + self.chunk).min(self.blob.len());
                items.push(Ok(pb::ArtifactChunk {
                    offset: at as u64,
                    data: self.blob[at..end].to_vec().into(),
                    total_size: self.blob.len() as u64,
                }));
                sent += end - at;
                at = end;
            }
            Ok(Box::pin(futures::stream::iter(items)))
        }

        async fn report(&self, _: pb::AssignmentStatusReport) -> Result<(), tonic::Status> {
            Ok(())
        }
    }

    fn options() -> DownloadOptions {
        DownloadOptions {
            chunk_bytes: 1000,
            persist_every: 3000,
            backoff: Backoff {
                base: Duration::from_millis(1),
                max: Duration::from_millis(2),
            },
        }
    }

    fn server(blob: Vec<u8>, break_after: usize, breaks: u32) -> Arc<FakeServer> {
        Arc::new(FakeServer {
            blob,
            chunk: 1000,
            break_after,
            breaks: Mutex::new(breaks),
            offsets: Mutex::new(vec![]),
        })
    }

    fn blob(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn want(data: &[u8]) -> Want {
        Want {
            what: "artifact",
            digest: Digest::of(data),
            size: Some(data.len() as u64),
            max_size: data.len() as u64,
        }
    }

    #[tokio::test]
    async fn resumes_after_breaks_from_the_recorded_offset() {
        let dir = tempfile::tempdir().unwrap();
        let data = blob(10_500);
        let fake = server(data.clone(), 4000, 2);
        let (events, _) = broadcast::channel(16);
        let d = Downloader::new(fake.clone(), options(), events);
        let path = d.fetch(dir.path(), want(&data)).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(*fake.offsets.lock().unwrap(), vec![0, 4000, 8000]);
        // Nothing partial is left.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[tokio::test]
    async fn a_new_downloader_resumes_what_a_killed_one_left() {
        let dir = tempfile::tempdir().unwrap();
        let data = blob(10_000);
        let w = want(&data);
        // A "killed" agent: 6 000 bytes on disk but progress durable at 3 000
        // (the last persist), and garbage past the end after a power cut.
        let paths = Paths::new(dir.path(), w.digest);
        let mut on_disk = data[..6000].to_vec();
        on_disk.extend_from_slice(&[0u8; 500]);
        std::fs::write(&paths.partial, &on_disk).unwrap();
        std::fs::write(&paths.progress, br#"{"offset":3000}"#).unwrap();
        let fake = server(data.clone(), 0, 0);
        let (events, mut rx) = broadcast::channel(16);
        let d = Downloader::new(fake.clone(), options(), events);
        let path = d.fetch(dir.path(), w).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(*fake.offsets.lock().unwrap(), vec![3000]);
        assert_eq!(
            rx.recv().await.unwrap(),
            SyncEvent::FetchStarted {
                digest: w.digest,
                offset: 3000
            }
        );
    }

    /// A manifest's size is not known before it is fetched. Killed after
    /// its last bytes were made durable and before the rename, it resumes
    /// at its end and completes there, with the total kept in the progress
    /// file or (from an older one) from the empty stream the server sends at
    /// the end; it used to retry that empty stream forever.
    #[tokio::test]
    async fn a_download_of_unknown_size_killed_before_its_rename_completes_on_resume() {
        let data = blob(2500);
        let unknown = Want {
            size: None,
            max_size: 10_000,
            ..want(&data)
        };
        for progress in [
            r#"{"offset":2500,"total":2500}"#.to_string(),
            r#"{"offset":2500}"#.to_string(),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let paths = Paths::new(dir.path(), unknown.digest);
            std::fs::write(&paths.partial, &data).unwrap();
            std::fs::write(&paths.progress, &progress).unwrap();
            let fake = server(data.clone(), 0, 0);
            let (events, _) = broadcast::channel(16);
            let d = Downloader::new(fake.clone(), options(), events);
            let path = tokio::time::timeout(Duration::from_secs(10), d.fetch(dir.path(), unknown))
                .await
                .expect("it finishes")
                .unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), data, "{progress}");
            assert!(!paths.partial.exists() && !paths.progress.exists());
            let asked = fake.offsets.lock().unwrap().clone();
            if progress.contains("total") {
                assert!(asked.is_empty(), "nothing left to fetch: {asked:?}");
            } else {
                assert_eq!(asked, vec![2500]);
            }
        }
        // A full-length partial with the wrong bytes fails the digest at its
        // end and is dropped, so the next try fetches it all.
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path(), unknown.digest);
        let mut wrong = data.clone();
        wrong[0] ^= 1;
        std::fs::write(&paths.partial, &wrong).unwrap();
        std::fs::write(&paths.progress, r#"{"offset":2500}"#).unwrap();
        let (events, _) = broadcast::channel(16);
        let d = Downloader::new(server(data.clone(), 0, 0), options(), events);
        let err = d.fetch(dir.path(), unknown).await.unwrap_err();
        assert!(matches!(err, Failure::BadDigest { .. }), "{err}");
        let path = d.fetch(dir.path(), unknown).await.unwrap();
        assert_eq!(std::fs::read(path).unwrap(), data);
    }

    #[tokio::test]
    async fn a_tampered_partial_fails_the_digest_and_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let data = blob(5000);
        let w = want(&data);
        let paths = Paths::new(dir.path(), w.digest);
        let mut tampered = data[..2000].to_vec();
        tampered[10] ^= 0xff;
        std::fs::write(&paths.partial, &tampered).unwrap();
        std::fs::write(&paths.progress, br#"{"offset":2000}"#).unwrap();
        let (events, _) = broadcast::channel(16);
        let d = Downloader::new(server(data.clone(), 0, 0), options(), events);
        let err = d.fetch(dir.path(), w).await.unwrap_err();
        assert!(matches!(err, Failure::BadDigest { .. }), "{err}");
        assert!(!paths.partial.exists() && !paths.progress.exists());
        // The next try starts from zero and succeeds.
        let path = d.fetch(dir.path(), w).await.unwrap();
        assert_eq!(std::fs::read(path).unwrap(), data);
    }

    #[tokio::test]
    async fn sizes_are_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let data = blob(5000);
        let (events, _) = broadcast::channel(16);
        let d = Downloader::new(server(data.clone(), 0, 0), options(), events);
        // Learned from the stream, over the cap (a manifest that is not one).
        let capped = Want {
            size: None,
            max_size: 100,
            ..want(&data)
        };
        assert!(matches!(
            d.fetch(dir.path(), capped).await.unwrap_err(),
            Failure::BadSize { .. }
        ));
        // The server's total disagrees with the assignment's size.
        let wrong = Want {
            size: Some(4000),
            max_size: 4000,
            ..want(&data)
        };
        assert!(matches!(
            d.fetch(dir.path(), wrong).await.unwrap_err(),
            Failure::BadSize { .. }
        ));
        // Larger than the disk: refused before any fetch.
        let huge = Want {
            size: Some(u64::MAX / 2),
            max_size: u64::MAX,
            ..want(&data)
        };
        assert!(matches!(
            d.fetch(dir.path(), huge).await.unwrap_err(),
            Failure::NoSpace { .. }
        ));
    }
}
