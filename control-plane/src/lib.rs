//! The Edgeloop control plane: console REST API for ML teams, mTLS gRPC for
//! edge agents and trainer bridges, and the state behind them.
//!
//! Wings: [`api`] (REST, gRPC), [`fleet`] (devices, clusters, PKI,
//! assignments), [`registry`] (artifacts, models, checkpoints). `main.rs` and
//! the tests both go through [`run`] / [`Server`].

pub mod api;
pub mod config;
pub mod datadir;
pub mod db;
pub mod fleet;
pub mod leader;
pub mod lifecycle;
pub mod retention;
pub mod strict_json;
pub(crate) mod supervisor;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use edgeloop_models::Digest;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{Config, ServeSettings};

use datadir::DataDir;
use db::Db;
use edgeloop_registry::artifacts::{ArtifactStore, LocalArtifactStore};
use fleet::pki::Pki;
use fleet::Events;

/// Everything a request handler needs. Shared by the REST and gRPC servers.
pub struct Core {
    pub config: Config,
    pub store: Db,
    pub artifacts: Arc<dyn ArtifactStore>,
    /// Whole artifacts in memory for device downloads (see `artifact_cache`).
    pub artifact_cache: edgeloop_registry::artifact_cache::ArtifactCache,
    /// Artifact streams: permits to send, per-member caps, the deadline.
    pub downloads: api::grpc::downloads::Downloads,
    pub pki: Pki,
    pub events: Events,
    /// A rollout's woken devices, woken at the pace downloads start.
    pub wakeups: fleet::wakeups::Wakeups,
    admin_token_hash: Digest,
    /// Refusals, for `/metrics`.
    pub security: edgeloop_auth::SecurityCounters,
    /// How long device and bridge heartbeats took to answer, for `/metrics`.
    pub heartbeat_latency: edgeloop_store::latency::Latency,
    /// Heartbeats' `last_seen` refreshes waiting for their batched write.
    pub presence: Arc<fleet::presence::Presence>,
    /// What each device has left of its per-model telemetry quota.
    pub device_quotas: fleet::admission::Quotas,
    /// Cancelled at shutdown so long-lived streams end and the servers can drain.
    pub shutdown: CancellationToken,
    /// What [`Core::now`] reads.
    pub clock: Clock,
    /// Which background tasks this replica runs now (`leader`).
    pub leader: leader::Leadership,
    /// Background tasks restarted by their supervisor, for `/metrics`.
    pub(crate) task_restarts: Arc<supervisor::Restarts>,
}

/// The control plane's clock: the system's, or one a test sets (to send a
/// day of telemetry in a second, windowed as it would be over a day).
#[derive(Debug, Clone, Default)]
pub struct Clock(Option<Arc<std::sync::Mutex<time::OffsetDateTime>>>);

impl Clock {
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock that stands at `start` until [`Clock::set`] moves it.
    pub fn manual(start: time::OffsetDateTime) -> Clock {
        Clock(Some(Arc::new(std::sync::Mutex::new(start))))
    }

    /// Moves a manual clock; the system clock cannot be moved.
    pub fn set(&self, t: time::OffsetDateTime) {
        if let Some(m) = &self.0 {
            *m.lock().unwrap_or_else(|p| p.into_inner()) = t;
        }
    }

    pub fn now(&self) -> time::OffsetDateTime {
        match &self.0 {
            None => time::OffsetDateTime::now_utc(),
            Some(m) => *m.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

impl Core {
    /// Compares hashes, so the comparison's timing says nothing useful about
    /// the token itself.
    pub fn is_admin_token(&self, presented: &str) -> bool {
        Digest::of(presented.as_bytes()) == self.admin_token_hash
    }

    pub fn now(&self) -> time::OffsetDateTime {
        self.clock.now()
    }

    /// How long a member may go unheard before it counts as offline.
    pub fn offline_after(&self) -> time::Duration {
        time::Duration::try_from(self.config.offline_after()).unwrap_or(time::Duration::MAX)
    }
}

/// The server as the web console's host: its clock, the bootstrap admin
/// token, the sessions and tokens, and whether it is served over TLS.
impl edgeloop_console::Host for Core {
    fn now(&self) -> time::OffsetDateTime {
        Core::now(self)
    }

    fn is_admin_token(&self, presented: &str) -> bool {
        Core::is_admin_token(self, presented)
    }

    fn sessions(&self) -> &edgeloop_console::Trees {
        &self.store.console
    }

    fn tokens(&self) -> &edgeloop_auth::Trees {
        &self.store.auth
    }

    fn over_tls(&self) -> bool {
        self.config.http_tls != config::HttpTls::Off
    }

    fn count_unauthenticated(&self) {
        self.security
            .unauthenticated
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A control plane with its data dir open and its sockets bound, not yet serving.
pub struct Server {
    core: Arc<Core>,
    grpc: TcpListener,
    http: TcpListener,
    new_admin_token: Option<String>,
    admin_token_path: PathBuf,
    /// This replica's place in the other replicas' event log, taken before
    /// it serves anything (see `serve`); `None` on one replica.
    relay_tail: Option<fleet::relay::Tail>,
}

impl Server {
    /// Opens (or on first start, initialises) the data dir and binds both listeners.
    pub async fn start(config: Config) -> anyhow::Result<Server> {
        Self::start_with_clock(config, Clock::system()).await
    }

    /// [`Server::start`] with the clock `Core::now` reads (tests).
    pub async fn start_with_clock(config: Config, clock: Clock) -> anyhow::Result<Server> {
        edgeloop_client_core::install_crypto_provider();
        let dir = DataDir::create(&config.data_dir)?;
        let store = match &config.store_url {
            Some(url) => Db::open_postgres(url)
                .with_context(|| format!("opening the PostgreSQL store {url}"))?,
            None => Db::open(&dir.db())
                .with_context(|| format!("opening store {}", dir.db().display()))?,
        };
        let artifacts: Arc<dyn ArtifactStore> = match &config.artifact_url {
            None => Arc::new(LocalArtifactStore::open(&dir.artifacts()).with_context(|| {
                format!("opening artifact store {}", dir.artifacts().display())
            })?),
            Some(url) => Arc::new(
                edgeloop_registry::s3::S3ArtifactStore::open(url.clone())
                    .await
                    .with_context(|| format!("opening artifact store {url}"))?,
            ),
        };
        // Faults only when a crash test's environment asks for them.
        #[cfg(feature = "testing")]
        let artifacts =
            edgeloop_registry::unreliable::UnreliableArtifactStore::from_env(artifacts)?;
        #[cfg(not(feature = "testing"))]
        if std::env::var_os(edgeloop_registry::FAULT_INJECTION_ENV).is_some() {
            anyhow::bail!(
                "{} is set, but this control plane was built without fault injection \
                 (the `testing` feature, which `cargo build --workspace` turns on for the tests); \
                 unset it, or build with --features testing",
                edgeloop_registry::FAULT_INJECTION_ENV
            );
        }
        let artifact_cache =
            edgeloop_registry::artifact_cache::ArtifactCache::new(config.artifact_cache_bytes);
        let downloads = api::grpc::downloads::Downloads::new(
            config.max_concurrent_downloads,
            config.max_downloads_per_member,
            config.download_send_timeout,
            config.max_download_bytes_per_sec,
        );
        let backfilled =
            fleet::admission::backfill(&store).context("backfilling assignment history")?;
        if backfilled > 0 {
            tracing::info!(
                pairs = backfilled,
                "assignment history backfilled from current assignments"
            );
        }
        let pki = Pki::load_or_init(&dir.pki(), &config.server_names).context("loading PKI")?;
        let (admin_token_hash, new_admin_token) = dir.load_or_create_admin_token()?;
        if config.store_url.is_some() {
            leader::check_shared_ca(&store, pki.ca_fingerprint())?;
        }
        let replica = leader::replica_id(&config.data_dir)?;
        // A shared store may have other replicas: they hear this one's
        // fleet events, and it theirs.
        let (events, relay_tail) = if config.store_url.is_some() {
            // Where this replica starts hearing the others: now, before it
            // serves. Taken later, a stream opened in between would miss
            // what was logged meanwhile, for good.
            let tail = fleet::relay::Tail::new(&store, &replica)
                .context("reading the fleet event log's end")?;
            (
                Events::relayed(fleet::relay::Relay::new(store.clone(), &replica)),
                Some(tail),
            )
        } else {
            (Events::default(), None)
        };
        let leader = leader::Leadership::new(replica);
        let grpc = TcpListener::bind(config.grpc_listen)
            .await
            .with_context(|| format!("binding gRPC listener {}", config.grpc_listen))?;
        let http = TcpListener::bind(config.http_listen)
            .await
            .with_context(|| format!("binding HTTP listener {}", config.http_listen))?;
        Ok(Server {
            core: Arc::new(Core {
                config,
                store,
                artifacts,
                artifact_cache,
                downloads,
                pki,
                events,
                wakeups: Default::default(),
                admin_token_hash,
                security: Default::default(),
                heartbeat_latency: Default::default(),
                presence: Default::default(),
                device_quotas: Default::default(),
                clock,
                shutdown: CancellationToken::new(),
                leader,
                task_restarts: Default::default(),
            }),
            grpc,
            http,
            new_admin_token,
            admin_token_path: dir.admin_token(),
            relay_tail,
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
            .local_addr()
            .expect("bound listener has an address")
    }

    /// The admin token, only on the start that created it.
    pub fn new_admin_token(&self) -> Option<&str> {
        self.new_admin_token.as_deref()
    }

    pub fn admin_token_path(&self) -> &std::path::Path {
        &self.admin_token_path
    }

    pub fn core(&self) -> Arc<Core> {
        self.core.clone()
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets
    /// in-flight requests finish (up to the drain timeout) and flushes the store.
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let core = self.core;
        tracing::info!(grpc = %self.grpc.local_addr()?, http = %self.http.local_addr()?, "control plane serving");
        let grpc = tokio::spawn(api::grpc::serve(
            core.clone(),
            self.grpc,
            core.shutdown.clone(),
        ));
        let http = match &core.config.http_tls {
            config::HttpTls::Off => tokio::spawn(api::rest::serve(
                core.clone(),
                self.http,
                core.shutdown.clone(),
            )),
            tls => {
                let config = Arc::new(http_tls_config(&core, tls)?);
                tokio::spawn(edgeloop_client_core::https::serve(
                    api::rest::router(core.clone()),
                    self.http,
                    config,
                    core.shutdown.clone(),
                ))
            }
        };
        // Lead what this replica can before the tasks' first ticks.
        let c = core.clone();
        let led = tokio::task::spawn_blocking(move || c.leader.round(&c.store, c.now()))
            .await
            .context("taking leases")?
            .context("taking leases")?;
        tracing::info!(replica = core.leader.replica(), leads = ?led, "background leases");
        // Every background task runs under the supervisor: a panic or an
        // early return is logged, counted and restarted with backoff.
        let tasks = supervisor::Supervisor::new(
            core.task_restarts.clone(),
            core.shutdown.clone(),
            supervisor::Backoff::default(),
        );
        let leases = tasks.spawn_thread("leases", {
            let core = core.clone();
            move || leader::renew_until(&core, &core.shutdown)
        });
        // Other replicas' fleet events, where there are other replicas.
        let relay = self.relay_tail.map(|tail| {
            // The place in the log outlives a run: a restart reads on from it.
            let tail = std::sync::Mutex::new(tail);
            let core = core.clone();
            tasks.spawn_thread("fleet-relay", move || {
                fleet::relay::tail_until(&core, &tail, &core.shutdown)
            })
        });
        let tick = core.config.rollout_tick;
        let rollouts = tasks.spawn("rollouts", {
            let core = core.clone();
            move || fleet::rollout::runner::run(core.clone(), tick, core.shutdown.clone())
        });
        let wakeups = tasks.spawn("wakeups", with_core(&core, fleet::wakeups::run));
        let pipelines = tasks.spawn("pipelines", {
            let core = core.clone();
            move || lifecycle::retrain::runner::run(core.clone(), tick, core.shutdown.clone())
        });
        let triggers = tasks.spawn("triggers", {
            let core = core.clone();
            move || lifecycle::triggers::runner::run(core.clone(), tick, core.shutdown.clone())
        });
        let audit = tasks.spawn(
            "audit-retention",
            with_core(&core, retention::audit::run_retention),
        );
        let compactor = tasks.spawn("retention", with_core(&core, retention::run));
        let presence = tasks.spawn("presence", {
            let core = core.clone();
            move || {
                fleet::presence::run(
                    core.store.clone(),
                    core.presence.clone(),
                    core.shutdown.clone(),
                )
            }
        });
        let reissue = tasks.spawn(
            "server-certificate",
            with_core(&core, fleet::pki::run_reissue),
        );
        let mut grpc = std::pin::pin!(grpc);
        let mut http = std::pin::pin!(http);
        // A server that dies on its own is an error; otherwise wait for the signal.
        tokio::select! {
            _ = shutdown.cancelled() => {}
            r = &mut grpc => { core.shutdown.cancel(); return r.context("gRPC server task")?.context("gRPC server"); }
            r = &mut http => { core.shutdown.cancel(); return r.context("HTTP server task")?.context("HTTP server"); }
        }
        tracing::info!("shutting down: draining in-flight requests");
        core.shutdown.cancel();
        let drained = tokio::time::timeout(core.config.drain_timeout, async {
            let (g, h) = tokio::join!(&mut grpc, &mut http);
            g.context("gRPC server task")?.context("gRPC server")?;
            h.context("HTTP server task")?.context("HTTP server")?;
            anyhow::Ok(())
        })
        .await;
        match drained {
            Ok(result) => result?,
            Err(_) => {
                tracing::warn!(timeout = ?core.config.drain_timeout, "drain timed out; closing remaining connections");
                grpc.abort();
                http.abort();
            }
        }
        // A tick in progress finishes its writes before the store is flushed.
        rollouts.join().await;
        // A pipeline step may be mid-way through minutes of quantization;
        // steps are idempotent, so one cut short simply runs again on start.
        reissue.join().await;
        wakeups.join().await;
        compactor.join().await;
        // After the servers drained: no heartbeat notes a refresh anymore.
        presence.join().await;
        audit.join().await;
        triggers.join().await;
        leases.join().await;
        if let Some(relay) = relay {
            relay.join().await;
        }
        if !pipelines.join_within(core.config.drain_timeout).await {
            tracing::warn!("a pipeline step outlasted the drain timeout; it reruns on start");
        }
        // Every leased task has stopped: another replica may take over now.
        let c = core.clone();
        if let Err(e) =
            tokio::task::spawn_blocking(move || c.leader.release(&c.store, c.now())).await
        {
            tracing::warn!(error = %e, "releasing leases");
        }
        core.store.flush().await?;
        tracing::info!("control plane stopped");
        Ok(())
    }
}

/// A supervised task's start: `run` with the core and its shutdown.
fn with_core<Fut: 'static>(
    core: &Arc<Core>,
    run: fn(Arc<Core>, CancellationToken) -> Fut,
) -> impl FnMut() -> Fut + Send + 'static {
    let core = core.clone();
    move || run(core.clone(), core.shutdown.clone())
}

/// The console's TLS identity: the PKI's server certificate (with the CA
/// in its chain, so a client can pin the CA by fingerprint), or the files
/// the operator named.
fn http_tls_config(core: &Core, tls: &config::HttpTls) -> anyhow::Result<rustls::ServerConfig> {
    match tls {
        config::HttpTls::Off => anyhow::bail!("the console API is not configured for TLS"),
        // Follows the server certificate's reissue, as gRPC does.
        config::HttpTls::ServerCertificate => {
            edgeloop_client_core::https::server_config_with_resolver(
                core.pki.server_resolver(),
                None,
            )
        }
        config::HttpTls::Files { cert, key } => {
            let read = |p: &std::path::Path| {
                std::fs::read(p).with_context(|| format!("reading {}", p.display()))
            };
            edgeloop_client_core::https::server_config(&read(cert)?, &read(key)?, None)
                .with_context(|| format!("--http-tls-cert {}", cert.display()))
        }
    }
}

/// Starts the control plane and serves until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let server = Server::start(config).await?;
    if let Some(token) = server.new_admin_token() {
        use std::io::IsTerminal as _;
        // Printed once, on the start that created it, and only to a person
        // at a terminal: under systemd or in a container stdout is a log
        // others read. The file keeps it either way.
        if std::io::stdout().is_terminal() {
            println!("admin token: {token}");
        }
        println!(
            "admin token created: {} (mode 0600)",
            server.admin_token_path().display()
        );
    }
    server.serve(shutdown).await
}
