//! An artifact store that fails on purpose, for crash tests only (as neon
//! keeps an unreliable storage beside its real one): it wraps another
//! [`ArtifactStore`] and, driven by a seeded RNG, delays calls, fails them
//! with the store's I/O error, and tears writes (the inner write gets a
//! body cut short that then breaks, so it fails having written part of
//! it). Whatever it does, the inner store's promise must hold: nothing
//! torn ever becomes visible.
//!
//! It is on only when the environment names it
//! ([`ENV`]`=seed=7,error=0.1,delay_ms=50,torn=0.05`); the control plane
//! then logs a warning at start. Methods it does not fault go straight to
//! the inner store, so a method added to the trait must be delegated here
//! too (a default implementation would hide the inner store's).

use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use edgeloop_models::Digest;
use futures::StreamExt;
use rand::{Rng, SeedableRng};

use super::artifacts::{
    ArtifactError, ArtifactReader, ArtifactStore, ByteStream, PutOutcome, StoredArtifact,
    UploadLimits,
};

/// The test-only switch: unset (the default) means the real store alone.
pub const ENV: &str = super::FAULT_INJECTION_ENV;

/// What to inject, parsed from `seed=7,error=0.1,delay_ms=50,torn=0.05`
/// (every field optional; rates are probabilities per call).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    pub seed: u64,
    /// A call fails with an I/O error before it reaches the inner store.
    pub error: f64,
    /// Each call first sleeps up to this long (uniformly).
    pub max_delay: Duration,
    /// A write is torn: the inner store sees part of the body, then a break.
    pub torn: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            seed: 0,
            error: 0.0,
            max_delay: Duration::ZERO,
            torn: 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ENV}: `{field}`: {reason}")]
pub struct FaultsError {
    pub field: String,
    pub reason: String,
}

fn bad(field: &str, reason: impl Into<String>) -> FaultsError {
    FaultsError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl FromStr for Faults {
    type Err = FaultsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut faults = Faults::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, value) = part
                .split_once('=')
                .ok_or_else(|| bad(part, "expected field=value"))?;
            let (field, value) = (field.trim(), value.trim());
            let rate = || -> Result<f64, FaultsError> {
                match value.parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err(bad(field, format!("{value:?} is not a rate in [0, 1]"))),
                }
            };
            match field {
                "seed" => {
                    faults.seed = value
                        .parse()
                        .map_err(|_| bad(field, format!("{value:?} is not a u64")))?
                }
                "error" => faults.error = rate()?,
                "torn" => faults.torn = rate()?,
                "delay_ms" => {
                    let ms: u64 = value
                        .parse()
                        .map_err(|_| bad(field, format!("{value:?} is not milliseconds")))?;
                    if ms > 60_000 {
                        return Err(bad(field, "at most 60000"));
                    }
                    faults.max_delay = Duration::from_millis(ms);
                }
                _ => {
                    return Err(bad(
                        field,
                        "unknown field (seed, error, delay_ms, torn are known)",
                    ))
                }
            }
        }
        Ok(faults)
    }
}

/// What was injected so far (for a test's summary and the warning).
#[derive(Debug, Default)]
pub struct Injected {
    pub errors: AtomicU64,
    pub torn: AtomicU64,
    pub delays: AtomicU64,
}

/// The wrapper. See the module docs.
pub struct UnreliableArtifactStore {
    inner: Arc<dyn ArtifactStore>,
    faults: Faults,
    rng: Mutex<rand::rngs::StdRng>,
    pub injected: Arc<Injected>,
}

/// One call's fate, drawn up front so a seed replays the same sequence of
/// outcomes for the same sequence of calls.
struct Draw {
    delay: Duration,
    error: bool,
    /// For writes: cut the body after this many bytes, then break it.
    tear_at: Option<u64>,
}

fn injected(what: &str) -> ArtifactError {
    ArtifactError::Io(io::Error::other(format!("injected fault: {what}")))
}

impl UnreliableArtifactStore {
    pub fn new(inner: Arc<dyn ArtifactStore>, faults: Faults) -> Self {
        UnreliableArtifactStore {
            inner,
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(faults.seed)),
            faults,
            injected: Arc::default(),
        }
    }

    /// `inner` as is, or wrapped when [`ENV`] asks for faults (logged
    /// loudly: a production control plane must never run this way).
    pub fn from_env(inner: Arc<dyn ArtifactStore>) -> Result<Arc<dyn ArtifactStore>, FaultsError> {
        let Some(spec) = std::env::var_os(ENV) else {
            return Ok(inner);
        };
        let faults: Faults = spec
            .to_str()
            .ok_or_else(|| bad("value", "not UTF-8"))?
            .parse()?;
        tracing::warn!(
            ?faults,
            "{ENV} is set: the artifact store injects delays, errors and torn writes; \
             this is for crash tests only, never for real data"
        );
        Ok(Arc::new(Self::new(inner, faults)))
    }

    /// `size_hint`: the body's size when known, where a tear can fall.
    async fn draw(&self, write: bool, size_hint: Option<u64>) -> Draw {
        let draw = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let delay = if self.faults.max_delay.is_zero() {
                Duration::ZERO
            } else {
                self.faults.max_delay.mul_f64(rng.random::<f64>())
            };
            let error = rng.random::<f64>() < self.faults.error;
            let torn = write && rng.random::<f64>() < self.faults.torn;
            let tear_at = torn.then(|| rng.random_range(0..size_hint.unwrap_or(64 * 1024).max(1)));
            Draw {
                delay,
                error,
                tear_at,
            }
        };
        if !draw.delay.is_zero() {
            self.injected.delays.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(draw.delay).await;
        }
        if draw.error {
            self.injected.errors.fetch_add(1, Ordering::Relaxed);
        }
        draw
    }

    /// `body`, or `body` cut after `tear_at` bytes and then broken (also
    /// when it ends first: a torn write never succeeds).
    fn tear(&self, body: ByteStream, tear_at: Option<u64>) -> ByteStream {
        let Some(cut) = tear_at else { return body };
        self.injected.torn.fetch_add(1, Ordering::Relaxed);
        let mut left = cut;
        let passed = body.map(move |chunk| {
            let chunk = chunk?;
            if left == 0 {
                return Err(injected("torn write"));
            }
            let take = (chunk.len() as u64).min(left);
            left -= take;
            Ok::<Bytes, ArtifactError>(chunk.slice(..take as usize))
        });
        // Stop at the first error (the break), and always end in one.
        let broken = futures::stream::once(async { Err(injected("torn write")) });
        Box::pin(
            passed
                .chain(broken)
                .scan(false, |done, item| {
                    let out = (!*done).then(|| {
                        *done = item.is_err();
                        item
                    });
                    futures::future::ready(out)
                })
                .filter(|item| futures::future::ready(!matches!(item, Ok(b) if b.is_empty()))),
        )
    }
}

#[async_trait]
impl ArtifactStore for UnreliableArtifactStore {
    async fn put(
        &self,
        expected: Digest,
        body: ByteStream,
        limits: UploadLimits,
    ) -> Result<PutOutcome, ArtifactError> {
        let draw = self.draw(true, limits.declared_size).await;
        if draw.error {
            return Err(injected("put"));
        }
        let body = self.tear(body, draw.tear_at);
        self.inner.put(expected, body, limits).await
    }

    async fn partial_len(&self, owner: &str, digest: Digest) -> Result<u64, ArtifactError> {
        self.inner.partial_len(owner, digest).await
    }

    async fn put_resumable(
        &self,
        owner: &str,
        expected: Digest,
        body: ByteStream,
        size: u64,
        max_bytes: u64,
        offset: u64,
    ) -> Result<PutOutcome, ArtifactError> {
        let draw = self
            .draw(true, Some(size.saturating_sub(offset).max(1)))
            .await;
        if draw.error {
            return Err(injected("put_resumable"));
        }
        let body = self.tear(body, draw.tear_at);
        self.inner
            .put_resumable(owner, expected, body, size, max_bytes, offset)
            .await
    }

    fn prune_partials(&self, max_age: Duration) -> Result<u64, ArtifactError> {
        self.inner.prune_partials(max_age)
    }

    fn list(&self) -> Result<Vec<StoredArtifact>, ArtifactError> {
        self.inner.list()
    }

    fn delete_if_older(
        &self,
        digest: Digest,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, ArtifactError> {
        self.inner.delete_if_older(digest, cutoff)
    }

    async fn head(&self, digest: Digest) -> Result<Option<u64>, ArtifactError> {
        if self.draw(false, None).await.error {
            return Err(injected("head"));
        }
        self.inner.head(digest).await
    }

    async fn open_at(
        &self,
        digest: Digest,
        offset: u64,
    ) -> Result<(u64, ArtifactReader), ArtifactError> {
        if self.draw(false, None).await.error {
            return Err(injected("open_at"));
        }
        self.inner.open_at(digest, offset).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::LocalArtifactStore;

    fn body(bytes: &[u8], chunk: usize) -> ByteStream {
        let parts: Vec<Result<Bytes, ArtifactError>> = bytes
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        Box::pin(futures::stream::iter(parts))
    }

    fn limits(size: u64) -> UploadLimits {
        UploadLimits {
            max_bytes: 1 << 20,
            declared_size: Some(size),
        }
    }

    #[test]
    fn settings_parse_and_bad_ones_name_their_field() {
        let f: Faults = "seed=7, error=0.1,delay_ms=50,torn=0.05".parse().unwrap();
        assert_eq!(
            f,
            Faults {
                seed: 7,
                error: 0.1,
                max_delay: Duration::from_millis(50),
                torn: 0.05
            }
        );
        assert_eq!("".parse::<Faults>().unwrap(), Faults::default());
        for (spec, field) in [
            ("error=1.5", "error"),
            ("torn=-0.1", "torn"),
            ("torn=x", "torn"),
            ("seed=-1", "seed"),
            ("delay_ms=99999999", "delay_ms"),
            ("delay_ms=1.5", "delay_ms"),
            ("errors=0.1", "errors"),
            ("seed", "seed"),
        ] {
            let e = spec.parse::<Faults>().unwrap_err();
            assert_eq!(e.field, field, "{spec}: {e}");
            assert!(e.to_string().contains(ENV), "{e}");
        }
    }

    /// Every write torn: each fails, and none leaves a visible artifact,
    /// whatever the chunking; a resumable one keeps only its own partial
    /// bytes (never served) and completes once the store behaves.
    #[tokio::test]
    async fn a_torn_write_fails_and_leaves_no_visible_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ArtifactStore> = Arc::new(LocalArtifactStore::open(dir.path()).unwrap());
        let always_torn = Faults {
            seed: 3,
            torn: 1.0,
            ..Faults::default()
        };
        let store = UnreliableArtifactStore::new(local.clone(), always_torn);
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let d = Digest::of(&data);
        for chunk in [1_000, 7_000, 50_000] {
            let err = store
                .put(d, body(&data, chunk), limits(data.len() as u64))
                .await
                .unwrap_err();
            assert!(err.to_string().contains("torn"), "{err}");
            assert_eq!(local.head(d).await.unwrap(), None);
            assert!(matches!(
                local.open_at(d, 0).await,
                Err(ArtifactError::NotFound(_))
            ));
        }
        // Nothing is left in the store's directories but the empty layout.
        let files = walk(dir.path());
        assert!(files.is_empty(), "{files:?}");

        let size = data.len() as u64;
        let err = store
            .put_resumable("bridge", d, body(&data, 4_000), size, 1 << 20, 0)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("torn"), "{err}");
        assert_eq!(local.head(d).await.unwrap(), None, "never served torn");
        let held = local.partial_len("bridge", d).await.unwrap();
        assert!(held < size, "held {held}");
        assert_eq!(store.injected.torn.load(Ordering::Relaxed), 4);

        // The same upload resumes on the real store and completes whole.
        let out = local
            .put_resumable(
                "bridge",
                d,
                body(&data[held as usize..], 4_000),
                size,
                1 << 20,
                held,
            )
            .await
            .unwrap();
        assert_eq!(out.size, size);
        let (_, mut r) = local.open_at(d, 0).await.unwrap();
        let mut back = vec![];
        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut back)
            .await
            .unwrap();
        assert_eq!(back, data);
    }

    /// Errors come at the configured rate, the same ones for the same
    /// seed, and never reach the inner store; what succeeds is whole.
    #[tokio::test]
    async fn errors_follow_the_seed_and_what_succeeds_is_whole() {
        async fn run(seed: u64) -> (Vec<bool>, u64) {
            let dir = tempfile::tempdir().unwrap();
            let local: Arc<dyn ArtifactStore> =
                Arc::new(LocalArtifactStore::open(dir.path()).unwrap());
            let faults = Faults {
                seed,
                error: 0.3,
                torn: 0.2,
                max_delay: Duration::from_millis(2),
            };
            let store = UnreliableArtifactStore::new(local.clone(), faults);
            let mut ok = vec![];
            for i in 0..60u32 {
                let data = format!("artifact {i}").repeat(100).into_bytes();
                let d = Digest::of(&data);
                let put = store
                    .put(d, body(&data, 300), limits(data.len() as u64))
                    .await;
                ok.push(put.is_ok());
                match put {
                    Ok(_) => {
                        let (size, mut r) = local.open_at(d, 0).await.unwrap();
                        let mut back = vec![];
                        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut back)
                            .await
                            .unwrap();
                        assert_eq!((size, back), (data.len() as u64, data));
                    }
                    Err(_) => assert_eq!(local.head(d).await.unwrap(), None),
                }
            }
            (ok, store.injected.errors.load(Ordering::Relaxed))
        }
        let (a, errors) = run(11).await;
        let (b, _) = run(11).await;
        assert_eq!(a, b, "the same seed, the same outcomes");
        let failed = a.iter().filter(|ok| !**ok).count();
        assert!((8..=40).contains(&failed), "{failed} of 60 failed");
        assert!((5..=35).contains(&errors), "{errors} injected errors");
        assert_ne!(run(12).await.0, a, "another seed, other outcomes");
    }

    /// Reads fail at the rate too, with the store's I/O error, and the
    /// methods it does not fault reach the inner store.
    #[tokio::test]
    async fn reads_fail_as_io_errors_and_the_rest_is_delegated() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ArtifactStore> = Arc::new(LocalArtifactStore::open(dir.path()).unwrap());
        let data = b"weights".to_vec();
        let d = Digest::of(&data);
        local
            .put(d, body(&data, 3), limits(data.len() as u64))
            .await
            .unwrap();
        let store = UnreliableArtifactStore::new(
            local.clone(),
            Faults {
                error: 1.0,
                ..Faults::default()
            },
        );
        assert!(matches!(store.head(d).await, Err(ArtifactError::Io(_))));
        assert!(matches!(
            store.open_at(d, 0).await,
            Err(ArtifactError::Io(_))
        ));
        assert_eq!(store.partial_len("x", d).await.unwrap(), 0);
        assert_eq!(store.prune_partials(Duration::ZERO).unwrap(), 0);
        // Garbage collection sees and deletes through it.
        let listed: Vec<Digest> = store.list().unwrap().iter().map(|a| a.digest).collect();
        assert_eq!(listed, [d]);
        let long_ago = std::time::SystemTime::UNIX_EPOCH;
        assert_eq!(store.delete_if_older(d, long_ago).unwrap(), None);
        let later = std::time::SystemTime::now() + Duration::from_secs(60);
        assert_eq!(store.delete_if_older(d, later).unwrap(), Some(7));
        local
            .put(d, body(&data, 3), limits(data.len() as u64))
            .await
            .unwrap();
        let calm = UnreliableArtifactStore::new(local, Faults::default());
        assert_eq!(calm.head(d).await.unwrap(), Some(7));
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
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
}
