//! Artifact streams for devices' model downloads and bridges' checkpoint
//! and dataset downloads, and the limits that keep one member from holding
//! them for everyone: at most `max_concurrent_downloads` streams send at
//! once (a permit each), at most `max_downloads_per_member` are open per
//! member, and a stream whose reader takes no chunk for
//! `download_send_timeout` gives its permit and its member slot back and
//! ends. Without the deadline, a device that opens streams and never reads
//! them keeps their permits for as long as its connection lives. With
//! `max_download_bytes_per_sec`, the sending streams share that byte rate
//! (`egress`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use edgeloop_models::Digest;
use futures::Stream;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::egress::Egress;
use crate::Core;
use edgeloop_errors::Error;
use edgeloop_registry::artifacts::ArtifactError;

pub const DEFAULT_CHUNK: usize = 256 * 1024;
pub const MAX_CHUNK: usize = 4 << 20;

/// The download limits and who holds what.
#[derive(Debug)]
pub struct Downloads {
    permits: Arc<Semaphore>,
    /// The permits there are, free or held.
    capacity: usize,
    /// Streams opened that wait for a permit.
    waiting: Arc<AtomicUsize>,
    per_member: usize,
    send_timeout: Duration,
    open: Arc<Mutex<HashMap<String, usize>>>,
    egress: Arc<Egress>,
}

impl Downloads {
    pub fn new(
        sending: usize,
        per_member: usize,
        send_timeout: Duration,
        bytes_per_sec: Option<u64>,
    ) -> Downloads {
        Downloads {
            permits: Arc::new(Semaphore::new(sending)),
            capacity: sending,
            waiting: Arc::default(),
            per_member,
            send_timeout,
            open: Arc::default(),
            egress: Arc::new(Egress::new(bytes_per_sec)),
        }
    }

    /// A slot for one more open stream of `member`, or
    /// [`Error::ResourceExhausted`].
    fn open_slot(&self, member: &str) -> Result<MemberSlot, Error> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(member.to_string()).or_default();
        if *n >= self.per_member {
            return Err(Error::ResourceExhausted(format!(
                "{member} has {} downloads open, the most one member may; finish or drop one first",
                self.per_member
            )));
        }
        *n += 1;
        Ok(MemberSlot {
            open: self.open.clone(),
            member: member.to_string(),
        })
    }

    /// Permits free now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// The permits there are: how many streams may send at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Streams opened that wait for a permit now (the paced wake-ups read
    /// it, and `/metrics`).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// Counts a stream among the waiting until dropped.
struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    fn new(count: &Arc<AtomicUsize>) -> Waiting {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One open stream of a member; counted down when dropped.
#[derive(Debug)]
struct MemberSlot {
    open: Arc<Mutex<HashMap<String, usize>>>,
    member: String,
}

impl Drop for MemberSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.member) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.member);
            }
        }
    }
}

/// One piece of an artifact read from an offset.
pub(super) struct ArtifactPiece {
    pub offset: u64,
    /// A slice of the cached artifact, or a chunk read from the store.
    pub data: bytes::Bytes,
    pub total_size: u64,
}

/// Whether a download may be served from the artifact cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caching {
    /// Device models: the same bytes go to many devices.
    Cached,
    /// Checkpoints: one reader, possibly large; caching would only evict models.
    Uncached,
}

/// Where the chunks come from.
enum Source {
    Bytes(bytes::Bytes),
    Reader(Box<dyn tokio::io::AsyncRead + Send + Unpin>),
}

/// Streams an artifact from `offset` in chunks of at most `max_chunk_bytes`
/// (0: the default), for `member` (`device/<id>` or `cluster/<id>`).
/// Authorisation is the caller's job. The response starts at once, and its
/// chunks wait for a permit. Without the bound, a fleet-wide rollout holds
/// every device's chunks in memory and starves heartbeats.
pub(super) async fn stream_artifact(
    core: &Core,
    member: String,
    digest: Digest,
    offset: u64,
    max_chunk_bytes: u32,
    caching: Caching,
) -> Result<PermitStream, Status> {
    let chunk = match max_chunk_bytes as usize {
        0 => DEFAULT_CHUNK,
        n => n.min(MAX_CHUNK),
    };
    let slot = core.downloads.open_slot(&member)?;
    if caching == Caching::Cached {
        let cache = &core.artifact_cache;
        if let Some(bytes) = cache.cached(digest) {
            check_offset(offset, bytes.len() as u64)?;
            let size = bytes.len() as u64;
            return Ok(spawn(core, slot, Source::Bytes(bytes), offset, size, chunk));
        }
        let size = core
            .artifacts
            .head(digest)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::from(ArtifactError::NotFound(digest)))?;
        check_offset(offset, size)?;
        if cache.admits(size) {
            let bytes = cache
                .get(core.artifacts.as_ref(), digest)
                .await
                .map_err(Error::from)?;
            return Ok(spawn(core, slot, Source::Bytes(bytes), offset, size, chunk));
        }
    }
    let (size, reader) = core
        .artifacts
        .open_at(digest, offset)
        .await
        .map_err(Error::from)?;
    check_offset(offset, size)?;
    core.artifact_cache.counters.store_read_bytes.fetch_add(
        size.saturating_sub(offset),
        std::sync::atomic::Ordering::Relaxed,
    );
    Ok(spawn(
        core,
        slot,
        Source::Reader(Box::new(reader)),
        offset,
        size,
        chunk,
    ))
}

fn check_offset(offset: u64, size: u64) -> Result<(), Error> {
    if offset > size {
        return Err(Error::RangeNotSatisfiable { offset, size });
    }
    Ok(())
}

/// The producer: waits for a permit, then sends chunk after chunk, each
/// within the send deadline. On the deadline it gives the permit and the
/// member slot back and ends the stream with DEADLINE_EXCEEDED.
fn spawn(
    core: &Core,
    slot: MemberSlot,
    source: Source,
    offset: u64,
    total_size: u64,
    chunk: usize,
) -> PermitStream {
    let (tx, rx) = mpsc::channel(2);
    let (hold, stream) = PermitStream::new(rx);
    let permits = core.downloads.permits.clone();
    let deadline = core.downloads.send_timeout;
    let egress = core.downloads.egress.clone();
    let waiting = Waiting::new(&core.downloads.waiting);
    tokio::spawn(async move {
        let Ok(permit) = permits.acquire_owned().await else {
            return;
        };
        drop(waiting);
        hold.give(permit, slot);
        let mut at = offset;
        let mut source = source;
        loop {
            let data = match &mut source {
                Source::Bytes(bytes) => {
                    let start = usize::try_from(at).unwrap_or(usize::MAX).min(bytes.len());
                    if start >= bytes.len() {
                        return;
                    }
                    let end = (start + chunk).min(bytes.len());
                    // Shares the cached bytes: a sending stream's queued
                    // chunks cost no copies of their own.
                    bytes.slice(start..end)
                }
                // Each chunk is read into its own buffer and handed on as
                // it is: no copy, and no buffer for a cached artifact.
                Source::Reader(reader) => {
                    let mut buf = bytes::BytesMut::with_capacity(chunk);
                    match reader.read_buf(&mut buf).await {
                        Ok(0) => return,
                        Ok(_) => buf.freeze(),
                        Err(e) => {
                            let _ = tx
                                .send(Err(Error::ArtifactRead(e.to_string()).into()))
                                .await;
                            return;
                        }
                    }
                }
            };
            let (data, last) = split_last(data, at, total_size);
            for data in std::iter::once(data).chain(last) {
                let n = data.len() as u64;
                egress.pace(n).await;
                let piece = ArtifactPiece {
                    offset: at,
                    data,
                    total_size,
                };
                match tokio::time::timeout(deadline, tx.send(Ok(piece))).await {
                    Ok(Ok(())) => at += n,
                    // The reader went away.
                    Ok(Err(_)) => return,
                    Err(_) => {
                        // A reader that takes nothing for this long holds a
                        // permit others wait for: give it back, and end.
                        hold.release();
                        let _ = tx.try_send(Err(Error::DeadlineExceeded(format!(
                            "the download took no chunk for {}s; resume from offset {at}",
                            deadline.as_secs()
                        ))
                        .into()));
                        return;
                    }
                }
            }
        }
    });
    stream
}

/// The most bytes the last message of a download carries.
const LAST_PIECE_BYTES: usize = 4 * 1024;

/// `data` (the bytes at `at`), with its last [`LAST_PIECE_BYTES`] split
/// off as a message of their own when it ends the artifact.
///
/// A stream's permit goes back once HTTP/2 has taken its last message, and
/// HTTP/2 takes a message only when the one before has gone to the
/// connection (see `MAX_SEND_BUFFER_BYTES` in the module above): so what a
/// finished download leaves outside the permits is its last message. A
/// small one leaves a few KiB behind a slow reader, not a whole chunk.
/// A chunk may always be shorter than the device asked for.
fn split_last(
    data: bytes::Bytes,
    at: u64,
    total_size: u64,
) -> (bytes::Bytes, Option<bytes::Bytes>) {
    let n = data.len();
    if at.saturating_add(n as u64) != total_size || n <= LAST_PIECE_BYTES {
        return (data, None);
    }
    let mut head = data;
    let last = head.split_off(n - LAST_PIECE_BYTES);
    (head, Some(last))
}

/// What a sending stream holds: a permit, and its member's slot.
type Held = Option<(OwnedSemaphorePermit, MemberSlot)>;

/// A download's response stream, holding its permit until the stream is
/// dropped (after the member has taken the last chunk, not when the
/// producer has queued it, so the permits bound the bytes buffered for slow
/// readers too) or until the send deadline gives it back. Its member slot
/// is held from the start: a queued stream counts as open.
pub(super) struct PermitStream {
    inner: ReceiverStream<Result<ArtifactPiece, Status>>,
    /// Released when the stream is dropped.
    _held: Arc<Mutex<Held>>,
}

/// The producer's handle on the stream's slot.
struct PermitHold(Arc<Mutex<Held>>);

impl PermitHold {
    fn give(&self, permit: OwnedSemaphorePermit, slot: MemberSlot) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((permit, slot));
    }

    fn release(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

impl PermitStream {
    fn new(rx: mpsc::Receiver<Result<ArtifactPiece, Status>>) -> (PermitHold, PermitStream) {
        let held = Arc::new(Mutex::new(None));
        (
            PermitHold(held.clone()),
            PermitStream {
                inner: ReceiverStream::new(rx),
                _held: held,
            },
        )
    }
}

impl Stream for PermitStream {
    type Item = Result<ArtifactPiece, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_end_of_the_artifact_goes_as_a_small_last_message() {
        let chunk = bytes::Bytes::from(vec![7u8; 10_000]);
        // (at, total size) -> the lengths sent
        let cases: [(u64, u64, &[usize]); 5] = [
            // A middle chunk goes whole.
            (0, 50_000, &[10_000]),
            // The chunk that ends the artifact: its last 4 KiB apart.
            (
                40_000,
                50_000,
                &[10_000 - LAST_PIECE_BYTES, LAST_PIECE_BYTES],
            ),
            // Resumed at an offset, same.
            (
                5_000,
                15_000,
                &[10_000 - LAST_PIECE_BYTES, LAST_PIECE_BYTES],
            ),
            // A last chunk of 4 KiB or less is small already.
            (0, 4_096, &[4_096]),
            (0, 100, &[100]),
        ];
        for (at, total, want) in cases {
            let len = usize::try_from(total - at).unwrap().min(chunk.len());
            let data = chunk.slice(..len);
            let (head, last) = split_last(data.clone(), at, total);
            let got: Vec<usize> = std::iter::once(head.len())
                .chain(last.as_ref().map(bytes::Bytes::len))
                .collect();
            assert_eq!(got, want, "at {at} of {total}");
            let mut joined = head.to_vec();
            joined.extend_from_slice(last.as_deref().unwrap_or_default());
            assert_eq!(
                joined,
                data.to_vec(),
                "at {at} of {total}: the bytes, in order"
            );
        }
    }
}
