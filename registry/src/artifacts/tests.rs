//! What [`ArtifactStore`] promises, run against every backend: each case
//! is one `async fn(Backing)`, and [`both!`] makes a `local` and an `s3`
//! test of it. The S3 ones run against `$EDGELOOP_TEST_S3_URL` (with the
//! `AWS_*` environment `scripts/s3-up.sh` writes), each under a prefix of
//! its own; when it is unset they skip or fail through
//! [`skip_or_fail!`](edgeloop_store::skip_or_fail).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::AsyncReadExt;

use super::*;
use crate::s3::{S3ArtifactStore, S3Location, PART_BYTES};

/// Where the store under test keeps its bytes.
enum Backing {
    Local(tempfile::TempDir),
    S3(S3Location),
}

impl Backing {
    fn local() -> Option<Backing> {
        Some(Backing::Local(tempfile::tempdir().unwrap()))
    }

    /// A fresh prefix under `$EDGELOOP_TEST_S3_URL`, or None (through
    /// [`skip_or_fail!`](edgeloop_store::skip_or_fail)).
    fn s3(test: &str) -> Option<Backing> {
        let Ok(url) = std::env::var("EDGELOOP_TEST_S3_URL") else {
            edgeloop_store::skip_or_fail!(
                "{test} on S3: EDGELOOP_TEST_S3_URL is unset (run scripts/s3-up.sh \
                 and export its env file, as scripts/test.sh does)"
            );
            return None;
        };
        let mut loc: S3Location = url.parse().unwrap();
        // Short: s3s-fs names a file after the base64 of bucket and key,
        // so its keys must stay under about 120 bytes (S3's own limit is
        // 1024).
        let unique = format!("t{:08x}", rand::random::<u32>());
        eprintln!("{test} on s3://{}/{}/{unique}", loc.bucket, loc.prefix);
        loc.prefix = if loc.prefix.is_empty() {
            unique
        } else {
            format!("{}/{unique}", loc.prefix)
        };
        Some(Backing::S3(loc))
    }

    /// A new store instance over the same bytes: what another control
    /// plane replica (or this one after a restart) sees.
    async fn open(&self) -> Arc<dyn ArtifactStore> {
        match self {
            Backing::Local(dir) => Arc::new(LocalArtifactStore::open(dir.path()).unwrap()),
            Backing::S3(loc) => Arc::new(self.s3_store(loc).await),
        }
    }

    async fn s3_store(&self, loc: &S3Location) -> S3ArtifactStore {
        S3ArtifactStore::open(loc.clone()).await.unwrap()
    }

    /// Everything held: files under the root, or keys under the prefix.
    async fn held(&self) -> Vec<String> {
        match self {
            Backing::Local(dir) => walk(dir.path())
                .into_iter()
                .map(|p| p.display().to_string())
                .collect(),
            Backing::S3(loc) => self.s3_store(loc).await.test_keys().await.unwrap(),
        }
    }

    /// Something beside the artifacts that is not one (a file or object
    /// whose name is no digest, or a digest not where the store puts it).
    async fn plant_strays(&self, beside: Digest) {
        match self {
            Backing::Local(dir) => {
                let hex = beside.to_hex();
                let shard = dir.path().join("sha256").join(&hex[..2]);
                std::fs::write(shard.join("notes.txt"), b"x").unwrap();
                std::fs::write(
                    dir.path()
                        .join("sha256")
                        .join(Digest::of(b"stray").to_hex()),
                    b"x",
                )
                .unwrap();
            }
            Backing::S3(loc) => {
                let s3 = self.s3_store(loc).await;
                s3.test_put_raw("sha256/notes.txt", b"x").await.unwrap();
                s3.test_put_raw(&format!("sha256/x/{}", Digest::of(b"stray")), b"x")
                    .await
                    .unwrap();
            }
        }
    }

    async fn strays_kept(&self) -> usize {
        self.held()
            .await
            .iter()
            .filter(|k| k.contains("notes.txt") || k.contains(&Digest::of(b"stray").to_hex()))
            .count()
    }
}

/// One case, as a test per backend (`<case>::local`, `<case>::s3`).
macro_rules! both {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                if let Some(b) = super::Backing::local() {
                    super::$case(b).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn s3() {
                edgeloop_client_core::install_crypto_provider();
                if let Some(b) = super::Backing::s3(stringify!($case)) {
                    super::$case(b).await;
                }
            }
        }
    )*};
}

both!(
    put_verify_read_range,
    mismatch_limit_and_abort_store_nothing,
    an_interrupted_upload_continues_from_partial_len_on_another_instance,
    a_resumable_upload_that_does_not_match_leaves_nothing,
    idle_partial_uploads_are_pruned_and_recent_ones_resume,
    gc_lists_whole_artifacts_deletes_old_ones_and_a_put_again_refreshes,
    a_put_racing_a_collection_never_answers_stored_over_nothing,
    a_stale_try_beside_a_newer_one_stops_without_spoiling_it,
);

fn body(parts: &[&'static [u8]]) -> ByteStream {
    let parts: Vec<Result<Bytes, ArtifactError>> =
        parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
    Box::pin(futures::stream::iter(parts))
}

/// `data` in chunks of 1 MiB (and odd sizes: chunk edges never fall on
/// part edges), then `then` if given (a break).
fn chunked(data: &[u8], then: Option<ArtifactError>) -> ByteStream {
    let mut parts: Vec<Result<Bytes, ArtifactError>> = data
        .chunks((1 << 20) + 7)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    parts.extend(then.map(Err));
    Box::pin(futures::stream::iter(parts))
}

/// Enough bytes for three multipart parts, the last one short.
fn big(seed: u8) -> Vec<u8> {
    (0..2 * PART_BYTES + 1_000_003)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8)
        .collect()
}

fn no_limit() -> UploadLimits {
    UploadLimits {
        max_bytes: 1 << 30,
        declared_size: None,
    }
}

fn broken() -> ArtifactError {
    ArtifactError::Body("connection reset".into())
}

async fn read_from(store: &dyn ArtifactStore, d: Digest, offset: u64) -> (u64, Vec<u8>) {
    let (size, mut r) = store.open_at(d, offset).await.unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    (size, out)
}

/// The trait's blocking methods, off the async threads (as retention
/// calls them).
async fn blocking<T: Send + 'static>(
    store: &Arc<dyn ArtifactStore>,
    f: impl FnOnce(&dyn ArtifactStore) -> T + Send + 'static,
) -> T {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(store.as_ref()))
        .await
        .unwrap()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Small and multipart-sized artifacts: stored once, idempotent, and read
/// whole or from any offset (past the end: nothing).
async fn put_verify_read_range(b: Backing) {
    let store = b.open().await;
    let d = Digest::of(b"hello world");
    let out = store
        .put(d, body(&[b"hello ", b"world"]), no_limit())
        .await
        .unwrap();
    assert_eq!((out.size, out.created), (11, true));
    let again = store
        .put(d, body(&[b"hello world"]), no_limit())
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(store.head(d).await.unwrap(), Some(11));
    assert_eq!(
        read_from(store.as_ref(), d, 6).await,
        (11, b"world".to_vec())
    );

    let data = big(1);
    let size = data.len() as u64;
    let d = Digest::of(&data);
    let limits = UploadLimits {
        max_bytes: 1 << 30,
        declared_size: Some(size),
    };
    let out = store.put(d, chunked(&data, None), limits).await.unwrap();
    assert_eq!((out.size, out.created), (size, true));
    assert_eq!(store.head(d).await.unwrap(), Some(size));
    let (total, whole) = read_from(store.as_ref(), d, 0).await;
    assert_eq!(total, size);
    assert!(whole == data, "the bytes read back differ");
    for offset in [1, PART_BYTES as u64 + 3, size - 1, size, size + 10] {
        let (total, tail) = read_from(store.as_ref(), d, offset).await;
        assert_eq!(total, size);
        let from = (offset as usize).min(data.len());
        assert!(tail == data[from..], "from {offset}");
    }
    let again = store.put(d, chunked(&data, None), limits).await.unwrap();
    assert!(!again.created);
    // Another instance over the same bytes reads them.
    let other = b.open().await;
    assert_eq!(other.head(d).await.unwrap(), Some(size));
}

/// No failed upload leaves anything behind: not an artifact, not a part,
/// not a record of one.
async fn mismatch_limit_and_abort_store_nothing(b: Backing) {
    let store = b.open().await;
    let d = Digest::of(b"expected");
    let err = store
        .put(d, body(&[b"other"]), no_limit())
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::DigestMismatch { .. }), "{err}");

    let small = UploadLimits {
        max_bytes: 4,
        declared_size: None,
    };
    let err = store
        .put(Digest::of(b"12345"), body(&[b"12", b"345"]), small)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::TooLarge { limit: 4 }), "{err}");
    let declared_too_big = UploadLimits {
        max_bytes: 4,
        declared_size: Some(5),
    };
    let err = store
        .put(Digest::of(b"12345"), body(&[b"12345"]), declared_too_big)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::TooLarge { limit: 4 }), "{err}");

    for (parts, declared) in [(&[&b"1234"[..]][..], 3), (&[&b"12"[..]][..], 3)] {
        let limits = UploadLimits {
            max_bytes: 100,
            declared_size: Some(declared),
        };
        let err = store
            .put(Digest::of(b"1234"), body(parts), limits)
            .await
            .unwrap_err();
        assert!(matches!(err, ArtifactError::SizeMismatch { .. }), "{err}");
    }

    let torn: ByteStream = Box::pin(futures::stream::iter(vec![
        Ok(Bytes::from_static(b"part")),
        Err(broken()),
    ]));
    assert!(store
        .put(Digest::of(b"part"), torn, no_limit())
        .await
        .is_err());

    // The same, past one multipart part: a wrong digest found only at the
    // end, a break after two parts were sent, a body over its declared size.
    let data = big(2);
    let d_big = Digest::of(&data);
    let err = store
        .put(d, chunked(&data, None), no_limit())
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::DigestMismatch { .. }), "{err}");
    let err = store
        .put(d_big, chunked(&data, Some(broken())), no_limit())
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::Body(_)), "{err}");
    let short = UploadLimits {
        max_bytes: 1 << 30,
        declared_size: Some(data.len() as u64 - 1),
    };
    let err = store
        .put(d_big, chunked(&data, None), short)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::SizeMismatch { .. }), "{err}");

    assert_eq!(b.held().await, Vec::<String>::new());
    for d in [d, d_big] {
        assert_eq!(store.head(d).await.unwrap(), None);
        assert!(matches!(
            store.open_at(d, 0).await,
            Err(ArtifactError::NotFound(_))
        ));
    }
    assert!(blocking(&store, |s| s.list()).await.unwrap().is_empty());
}

/// A checkpoint upload that breaks is continued from `partial_len` by
/// another instance (another replica), only by its owner, only at that
/// offset; the whole body is hashed even when the digest is stored.
async fn an_interrupted_upload_continues_from_partial_len_on_another_instance(b: Backing) {
    let data = big(3);
    let (d, size) = (Digest::of(&data), data.len() as u64);
    let max = 1 << 30;
    let first = b.open().await;
    let sent = PART_BYTES + (5 << 20);
    let err = first
        .put_resumable(
            "job-a",
            d,
            chunked(&data[..sent], Some(broken())),
            size,
            max,
            0,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::Body(_)), "{err}");
    let held = first.partial_len("job-a", d).await.unwrap();
    // The local store keeps every byte; S3 the whole parts sent.
    assert!(held > 0 && held <= sent as u64, "held {held} of {sent}");
    assert_eq!(first.head(d).await.unwrap(), None, "nothing visible yet");

    // Another owner learns nothing of it and cannot continue it.
    let second = b.open().await;
    assert_eq!(second.partial_len("job-b", d).await.unwrap(), 0);
    let err = second
        .put_resumable(
            "job-b",
            d,
            chunked(&data[held as usize..], None),
            size,
            max,
            held,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ArtifactError::Offset { held: 0, .. }),
        "{err}"
    );
    // The owner, at any offset but the one held: refused, nothing lost.
    assert_eq!(second.partial_len("job-a", d).await.unwrap(), held);
    let err = second
        .put_resumable(
            "job-a",
            d,
            chunked(&data[held as usize + 1..], None),
            size,
            max,
            held + 1,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ArtifactError::Offset { requested, held: h } if requested == held + 1 && h == held),
        "{err}"
    );
    // Continued on the second instance, ending early without an error.
    let upto = 2 * PART_BYTES + 500_000;
    let err = second
        .put_resumable(
            "job-a",
            d,
            chunked(&data[held as usize..upto], None),
            size,
            max,
            held,
        )
        .await
        .unwrap_err();
    let now_held = second.partial_len("job-a", d).await.unwrap();
    assert!(
        matches!(err, ArtifactError::Incomplete { received, expected } if received == now_held && expected == size),
        "{err}"
    );
    assert!(now_held > held && now_held <= upto as u64, "{now_held}");

    // Finished on a third.
    let third = b.open().await;
    let out = third
        .put_resumable(
            "job-a",
            d,
            chunked(&data[now_held as usize..], None),
            size,
            max,
            now_held,
        )
        .await
        .unwrap();
    assert_eq!((out.size, out.created), (size, true));
    assert_eq!(third.partial_len("job-a", d).await.unwrap(), 0);
    let (total, read) = read_from(first.as_ref(), d, 0).await;
    assert!(total == size && read == data, "the bytes read back differ");

    // Stored already: a body of the right size but other bytes is still
    // refused, and the right bytes are accepted as not new.
    let mut wrong = data.clone();
    wrong[size as usize - 1] ^= 1;
    let err = third
        .put_resumable("job-c", d, chunked(&wrong, None), size, max, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::DigestMismatch { .. }), "{err}");
    let again = third
        .put_resumable("job-c", d, chunked(&data, None), size, max, 0)
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(third.partial_len("job-c", d).await.unwrap(), 0);
    let listed: Vec<Digest> = blocking(&third, |s| s.list())
        .await
        .unwrap()
        .iter()
        .map(|a| a.digest)
        .collect();
    assert_eq!(listed, vec![d]);
}

/// A resumable upload over its size, or hashing to another digest, is
/// dropped whole: nothing visible, nothing held to continue.
async fn a_resumable_upload_that_does_not_match_leaves_nothing(b: Backing) {
    let store = b.open().await;
    let data = big(4);
    let (d, size) = (Digest::of(&data), data.len() as u64);
    let max = 1 << 30;
    let err = store
        .put_resumable("o", d, chunked(&data, None), size - 1, max, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::SizeMismatch { .. }), "{err}");
    let err = store
        .put_resumable("o", d, chunked(&data, None), size, size - 1, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::TooLarge { .. }), "{err}");
    let other = Digest::of(b"other");
    let err = store
        .put_resumable("o", other, chunked(&data, None), size, max, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::DigestMismatch { .. }), "{err}");
    // Small, all in one part.
    let err = store
        .put_resumable("o", other, body(&[b"not other"]), 9, max, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::DigestMismatch { .. }), "{err}");
    for d in [d, other] {
        assert_eq!(store.partial_len("o", d).await.unwrap(), 0);
        assert_eq!(store.head(d).await.unwrap(), None);
    }
    assert_eq!(b.held().await, Vec::<String>::new());
    // The empty artifact is an artifact like any other.
    let empty = Digest::of(b"");
    let out = store
        .put_resumable("o", empty, body(&[]), 0, max, 0)
        .await
        .unwrap();
    assert_eq!((out.size, out.created), (0, true));
    assert_eq!(read_from(store.as_ref(), empty, 0).await, (0, vec![]));
}

/// An upload left unwritten past the age goes (with its parts); one
/// written to since stays and resumes.
async fn idle_partial_uploads_are_pruned_and_recent_ones_resume(b: Backing) {
    let store = b.open().await;
    let data = big(5);
    let (digest, size) = (Digest::of(&data), data.len() as u64);
    let cut = |owner: &'static str| {
        let store = store.clone();
        let part = data[..PART_BYTES + 100].to_vec();
        async move {
            let err = store
                .put_resumable(owner, digest, chunked(&part, None), size, 1 << 30, 0)
                .await
                .unwrap_err();
            assert!(matches!(err, ArtifactError::Incomplete { .. }), "{err}");
            store.partial_len(owner, digest).await.unwrap()
        }
    };
    let idle_held = cut("idle").await;
    assert!(idle_held > 0);
    // S3 keeps times to the second: the idle one is then at least 2 s
    // older than the fresh one, whose age stays under 2 s.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let fresh_held = cut("fresh").await;
    let age = Duration::from_secs(2);
    assert_eq!(
        blocking(&store, move |s| s.prune_partials(age))
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.partial_len("idle", digest).await.unwrap(), 0);
    assert_eq!(
        store.partial_len("fresh", digest).await.unwrap(),
        fresh_held
    );
    // The fresh one resumes where it was, on another instance.
    let other = b.open().await;
    other
        .put_resumable(
            "fresh",
            digest,
            chunked(&data[fresh_held as usize..], None),
            size,
            1 << 30,
            fresh_held,
        )
        .await
        .unwrap();
    assert_eq!(other.head(digest).await.unwrap(), Some(size));
    let none = Duration::ZERO;
    assert_eq!(
        blocking(&store, move |s| s.prune_partials(none))
            .await
            .unwrap(),
        0
    );
    // What is left is the artifact alone.
    let held = b.held().await;
    assert_eq!(held.len(), 1, "{held:?}");
}

/// What garbage collection sees and does: `list` names the whole
/// artifacts (not partial uploads, not foreign objects), a delete takes
/// only what was stored at or before its cutoff, and a put of bytes
/// already held moves their time past any cutoff taken before.
async fn gc_lists_whole_artifacts_deletes_old_ones_and_a_put_again_refreshes(b: Backing) {
    let store = b.open().await;
    let old = put_bytes(store.as_ref(), b"old".to_vec(), 100)
        .await
        .unwrap();
    let again = put_bytes(store.as_ref(), b"again".to_vec(), 100)
        .await
        .unwrap();
    let whole: &'static [u8] = b"partial bytes";
    let cut = store
        .put_resumable("o", Digest::of(whole), body(&[&whole[..4]]), 13, 100, 0)
        .await;
    assert!(cut.is_err());
    let partial = store.partial_len("o", Digest::of(whole)).await.unwrap();
    b.plant_strays(old).await;

    // Object stores keep times to the second.
    let second = Duration::from_millis(1100);
    tokio::time::sleep(second).await;
    let cutoff = SystemTime::now();
    tokio::time::sleep(second).await;

    let mut listed: Vec<(Digest, u64)> = blocking(&store, |s| s.list())
        .await
        .unwrap()
        .iter()
        .map(|a| (a.digest, a.size))
        .collect();
    listed.sort();
    let mut want = vec![(old, 3), (again, 5)];
    want.sort();
    assert_eq!(listed, want);
    assert!(blocking(&store, |s| s.list())
        .await
        .unwrap()
        .iter()
        .all(|a| a.modified <= cutoff));

    // Stored again after the cutoff was taken: kept, on any instance.
    put_bytes(store.as_ref(), b"again".to_vec(), 100)
        .await
        .unwrap();
    let other = b.open().await;
    let refreshed = blocking(&other, |s| s.list()).await.unwrap();
    assert!(refreshed
        .iter()
        .any(|a| a.digest == again && a.modified > cutoff));
    assert_eq!(
        blocking(&other, move |s| s.delete_if_older(again, cutoff))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.head(again).await.unwrap(), Some(5));
    assert_eq!(
        blocking(&other, move |s| s.delete_if_older(old, cutoff))
            .await
            .unwrap(),
        Some(3)
    );
    assert_eq!(store.head(old).await.unwrap(), None);
    assert!(matches!(
        store.open_at(old, 0).await,
        Err(ArtifactError::NotFound(_))
    ));
    // Already gone: nothing to free.
    assert_eq!(
        blocking(&store, move |s| s.delete_if_older(old, cutoff))
            .await
            .unwrap(),
        None
    );
    assert_eq!(b.strays_kept().await, 2);
    assert_eq!(
        store.partial_len("o", Digest::of(whole)).await.unwrap(),
        partial
    );
    // Deleted bytes can be stored again.
    put_bytes(store.as_ref(), b"old".to_vec(), 100)
        .await
        .unwrap();
    assert_eq!(store.head(old).await.unwrap(), Some(3));
}

/// Bytes already held are put again while a collection deletes them (on
/// another instance) mid-upload: the put either stores them again or
/// fails, but never answers "stored" with nothing there.
async fn a_put_racing_a_collection_never_answers_stored_over_nothing(b: Backing) {
    let store = b.open().await;
    let collector = b.open().await;
    let data = b"stored, collected, stored again".to_vec();
    let d = put_bytes(store.as_ref(), data.clone(), 100).await.unwrap();
    let (first, rest) = data.split_at(10);
    let (first, rest) = (Bytes::copy_from_slice(first), Bytes::copy_from_slice(rest));
    let racing: ByteStream = Box::pin(futures::stream::iter([Ok(first)]).chain(
        futures::stream::once(async move {
            let far = SystemTime::now() + Duration::from_secs(3600);
            let freed = blocking(&collector, move |s| s.delete_if_older(d, far))
                .await
                .unwrap();
            assert_eq!(freed, Some(rest.len() as u64 + 10), "collected mid-upload");
            Ok(rest)
        }),
    ));
    let limits = UploadLimits {
        max_bytes: 100,
        declared_size: Some(data.len() as u64),
    };
    match store.put(d, racing, limits).await {
        Ok(out) => {
            assert_eq!(store.head(d).await.unwrap(), Some(out.size));
            assert_eq!(read_from(store.as_ref(), d, 0).await.1, data);
        }
        // Refused: the caller uploads again, and that stores it.
        Err(e) => {
            assert!(matches!(e, ArtifactError::Backend(_)), "{e}");
            let out = put_bytes(store.as_ref(), data.clone(), 100).await.unwrap();
            assert_eq!(out, d);
            assert_eq!(store.head(d).await.unwrap(), Some(data.len() as u64));
        }
    }
}

/// `owner`'s held bytes once they stop growing and reach `at_least`.
async fn settled_partial(store: &dyn ArtifactStore, owner: &str, d: Digest, at_least: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut last = u64::MAX;
    loop {
        let held = store.partial_len(owner, d).await.unwrap();
        if held >= at_least && held == last {
            return held;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "held {held}, want {at_least}"
        );
        last = held;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A client retries while its first try still streams (stalled): the
/// newer call takes the upload over, and the older one stops at its next
/// write instead of appending to the same file (local) or saving a state
/// that forgets the newer one's parts (S3). Either would spoil the upload:
/// locally, a file of two interleaved streams committed under a digest
/// only one of them matched.
async fn a_stale_try_beside_a_newer_one_stops_without_spoiling_it(b: Backing) {
    // Room for a part from each try and a short last one.
    let mut data = big(9);
    data.extend(big(10));
    data.truncate(3 * PART_BYTES + 1_000_003);
    let (d, size) = (Digest::of(&data), data.len() as u64);
    let max = 1 << 30;
    let store = b.open().await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, ArtifactError>>();
    let send = |from: usize, to: usize| {
        for c in data[from..to].chunks((1 << 20) + 7) {
            // Unsent once the stale try has stopped reading: that is the point.
            let _ = tx.unbounded_send(Ok(Bytes::copy_from_slice(c)));
        }
    };
    let sent = PART_BYTES + (2 << 20);
    send(0, sent);
    let stale = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .put_resumable("job-r", d, Box::pin(rx), size, max, 0)
                .await
        })
    };
    // The first try has a part held, then stalls.
    let held = settled_partial(store.as_ref(), "job-r", d, PART_BYTES as u64).await as usize;
    // The retry continues from there and adds a part, then breaks.
    let upto = held + PART_BYTES + (1 << 20);
    let err = store
        .put_resumable(
            "job-r",
            d,
            chunked(&data[held..upto], Some(broken())),
            size,
            max,
            held as u64,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::Body(_)), "{err}");
    let retried = store.partial_len("job-r", d).await.unwrap();
    assert!(
        retried > held as u64,
        "the retry's bytes are held: {retried}"
    );
    // The stalled try wakes with enough for one more part: refused.
    send(sent, sent + PART_BYTES);
    drop(tx);
    let err = tokio::time::timeout(std::time::Duration::from_secs(60), stale)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, ArtifactError::Superseded), "{err}");
    assert_eq!(
        store.partial_len("job-r", d).await.unwrap(),
        retried,
        "what the retry saved stands"
    );
    // The next try finishes from there, and the artifact is exactly `data`.
    let put = store
        .put_resumable(
            "job-r",
            d,
            chunked(&data[retried as usize..], None),
            size,
            max,
            retried,
        )
        .await
        .unwrap();
    assert!(put.created);
    assert_eq!(read_from(store.as_ref(), d, 0).await, (size, data.clone()));
    assert_eq!(store.partial_len("job-r", d).await.unwrap(), 0);
}
