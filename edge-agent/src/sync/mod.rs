//! Model sync: keeps the models assigned to this device installed, verified
//! and serving.
//!
//! - [`watch`]: the assignment stream, reconnecting with backoff;
//!   [`generation`]: the pure "apply this set?" decision and the persisted
//!   applied set; [`reconcile`]: one worker per assigned model.
//! - [`worker`] drives the pure per-assignment state machine ([`machine`])
//!   through [`download`] (chunked, resumable, verified; [`space`] first),
//!   [`verify`] (signature, digests, probe inputs) and [`slots`] (A/B slots
//!   written crash-safely), reporting through [`report`].
//! - [`boot`] serves from disk before the network is up.
//! - [`benchmark`] times models the control plane asks about, in scratch
//!   space beside the slots, never touching what serves.
//!
//! Activation itself is [`crate::serving::ModelServing`]'s job.

pub mod assignment;
pub mod benchmark;
pub mod boot;
pub mod client;
pub mod download;
pub mod events;
pub mod failure;
pub mod generation;
pub mod machine;
pub mod reconcile;
pub mod report;
pub mod slots;
pub mod space;
pub mod verify;
pub mod watch;
pub mod worker;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use edgeloop_client_core::{Backoff, MemberConfig, Membership};
use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, SyncConfig};
use crate::serving::ModelServing;

pub use boot::BootOutcome;
pub use client::{ControlPlaneClient, GrpcClient};
pub use download::DownloadOptions;
pub use events::SyncEvent;
pub use failure::Failure;
pub use generation::{AppliedSet, AppliedStore};
pub use machine::ReportState;
pub use slots::{ModelDir, SlotId, SlotsState};

/// The default for assignments that set no `activation_timeout_seconds`.
pub const DEFAULT_ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The control plane refused this identity (revoked): retrying cannot help.
    #[error("control plane refused the assignment watch: {0}")]
    Refused(tonic::Status),
    #[error("model sync storage: {0}")]
    Storage(#[source] std::io::Error),
}

/// Tuning that is not user configuration (tests shrink it).
#[derive(Debug, Clone, Copy)]
pub struct SyncOptions {
    pub download: DownloadOptions,
    /// Reconnects of the watch and retries of status reports.
    pub backoff: Backoff,
    pub default_timeout: Duration,
}

impl SyncOptions {
    /// The defaults, with the member's reconnect backoff.
    pub fn for_member(member: &MemberConfig) -> SyncOptions {
        SyncOptions {
            download: DownloadOptions {
                backoff: member.backoff,
                ..DownloadOptions::default()
            },
            backoff: member.backoff,
            default_timeout: DEFAULT_ASSIGNMENT_TIMEOUT,
        }
    }
}

/// The sync half of the agent.
pub struct Syncer {
    models_dir: PathBuf,
    config: SyncConfig,
    serving: Arc<dyn ModelServing>,
    options: SyncOptions,
    events: broadcast::Sender<SyncEvent>,
}

impl Syncer {
    /// Models live under `<data_dir>/models/`.
    pub fn new(
        data_dir: &Path,
        config: SyncConfig,
        serving: Arc<dyn ModelServing>,
        options: SyncOptions,
    ) -> Syncer {
        let (events, _) = broadcast::channel(1024);
        Syncer {
            models_dir: data_dir.join("models"),
            config,
            serving,
            options,
            events,
        }
    }

    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    /// Everything sync does, as it happens.
    pub fn subscribe(&self) -> broadcast::Receiver<SyncEvent> {
        self.events.subscribe()
    }

    fn trust(&self) -> verify::Trust {
        verify::Trust {
            keys: self.config.trusted_keys.clone(),
            allow_unsigned: self.config.allow_unsigned,
        }
    }

    fn applied_store(&self) -> AppliedStore {
        AppliedStore::new(&self.models_dir)
    }

    /// Activates the last applied set's models from disk, without the
    /// network. Call it before anything else so the device serves at once.
    pub async fn boot(&self) -> Result<Vec<BootOutcome>, SyncError> {
        let Some(applied) = self.applied_store().load().map_err(SyncError::Storage)? else {
            return Ok(vec![]);
        };
        Ok(boot::boot(
            &self.models_dir,
            &applied,
            &self.trust(),
            &self.serving,
            &self.events,
        )
        .await)
    }

    /// Watches assignments and applies them until `shutdown`. Returns an
    /// error only when the control plane refuses this device or local
    /// storage fails.
    pub async fn run(
        &self,
        client: Arc<dyn ControlPlaneClient>,
        shutdown: CancellationToken,
    ) -> Result<(), SyncError> {
        std::fs::create_dir_all(&self.models_dir).map_err(SyncError::Storage)?;
        let store = self.applied_store();
        let applied = store.load().map_err(SyncError::Storage)?;
        let reporter = Arc::new(report::Reporter::default());
        let ctx = Arc::new(worker::Ctx {
            models_dir: self.models_dir.clone(),
            trust: self.trust(),
            serving: self.serving.clone(),
            downloader: download::Downloader::new(
                client.clone(),
                self.options.download,
                self.events.clone(),
            ),
            downloads: Semaphore::new(self.config.download_concurrency.max(1)),
            reporter: reporter.clone(),
            events: self.events.clone(),
            default_timeout: self.options.default_timeout,
            generation: AtomicU64::new(0),
        });
        // The reporter stops with sync, not by cancelling the caller's token.
        let stop_reporting = shutdown.child_token();
        let reporting = tokio::spawn(reporter.run(
            client.clone(),
            self.options.backoff,
            stop_reporting.clone(),
        ));
        let stop_benchmarks = shutdown.child_token();
        let scratch = self.models_dir.with_file_name("benchmarks");
        // Whatever a killed benchmark left is only scratch.
        let _ = std::fs::remove_dir_all(&scratch);
        let benchmarks = tokio::spawn(
            benchmark::Benchmarker {
                client: client.clone(),
                serving: self.serving.clone(),
                downloader: download::Downloader::new(
                    client.clone(),
                    self.options.download,
                    self.events.clone(),
                ),
                trust: self.trust(),
                dir: scratch,
                backoff: self.options.backoff,
            }
            .run(stop_benchmarks.clone()),
        );
        let mut reconciler = reconcile::Reconciler::new(ctx, store, applied);
        let watched = watch::watch(
            client.as_ref(),
            &mut reconciler,
            self.options.backoff,
            &shutdown,
        )
        .await;
        reconciler.stop_all().await;
        stop_benchmarks.cancel();
        let _ = benchmarks.await;
        stop_reporting.cancel();
        let _ = reporting.await;
        watched
    }

    /// [`run`](Self::run) over mTLS once enrollment has given `membership`
    /// an identity (it waits, so it can start beside `run_member`, which
    /// enrolls).
    pub async fn run_enrolled(
        &self,
        membership: &Membership,
        shutdown: CancellationToken,
    ) -> Result<(), SyncError> {
        let Some(channel) = membership.channel(&shutdown).await else {
            return Ok(());
        };
        self.run(Arc::new(GrpcClient::new(channel)), shutdown).await
    }
}

/// The agent's model sync, as `run` starts it beside `run_member`: serve
/// what is on disk at once, then follow the control plane once enrollment
/// has stored an identity. Returns when `shutdown` is cancelled, or with an
/// error when the control plane refuses this device or storage fails.
pub async fn run(
    config: &AgentConfig,
    membership: &Membership,
    serving: Arc<dyn ModelServing>,
    shutdown: CancellationToken,
) -> Result<(), SyncError> {
    let syncer = Syncer::new(
        &config.member.data_dir,
        config.sync.clone(),
        serving,
        SyncOptions::for_member(&config.member),
    );
    syncer.boot().await?;
    syncer.run_enrolled(membership, shutdown).await
}

/// Runs blocking file work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| std::io::Error::other(format!("blocking task failed: {e}")))?
}
