//! The Edgeloop trainer bridge: enrolls with the control plane as a cluster
//! (mTLS identity in its data dir, key mode 0600), heartbeats, and runs the
//! jobs it leases on its engine, uploading checkpoints as they are committed.

pub mod checkpoint;
pub mod config;
pub mod engines;
pub mod facts;
pub mod launch;
pub mod preflight;
pub mod progress;
pub mod restart;
pub mod runner;
/// The job spec lives in `edgeloop-api` (the console API submits it, the
/// bridge runs it); re-exported so the bridge's own paths stay `spec::`.
pub use edgeloop_api::spec;
pub mod tensorboard;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use edgeloop_client_core::gpu::LocalGpus;
use edgeloop_client_core::member::{create_private_dir, host_capabilities};
use edgeloop_client_core::session::{ensure_identity, SessionError};
use edgeloop_client_core::{heartbeat_loop, IdentityStore, Membership, Role};
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::common::v1::Capabilities;
use tokio_util::sync::CancellationToken;

pub use config::{BridgeConfig, BridgeSettings};

use engines::local::LocalEngine;
use engines::Engine;
use preflight::ClusterFacts;
use runner::Runner;

/// The engines this bridge can drive: `local` always; Slurm, Ray and
/// Kubernetes when their settings are in the environment (see
/// `engines::slurm`, `engines::ray`, `engines::kubernetes`).
pub fn engines(
    config: &BridgeConfig,
    gpus: &LocalGpus,
) -> anyhow::Result<BTreeMap<String, Arc<dyn Engine>>> {
    let mut engines: BTreeMap<String, Arc<dyn Engine>> = BTreeMap::new();
    let local = LocalEngine::with_gpus(&config.member.data_dir.join("engine-local"), gpus.clone())
        .context("local engine state dir")?
        .with_gpu_source(Some(Arc::new(facts::local_gpus)))
        .with_container(config.container_runtime.map(|kind| {
            engines::local::container::ContainerRuntime::new(kind)
                .with_site_mounts(config.container_mounts.clone())
        }));
    engines.insert("local".into(), Arc::new(local));
    if std::env::var_os("EDGELOOP_SLURMRESTD_URL").is_some() {
        engines.insert(
            "slurm".into(),
            Arc::new(
                engines::slurm::SlurmEngine::from_env()
                    .context("Slurm settings")?
                    .with_runtime(
                        config
                            .container_runtime
                            .map(engines::local::container::ContainerRuntime::new),
                    ),
            ),
        );
    }
    if std::env::var_os(engines::ray::DASHBOARD_URL_ENV).is_some() {
        engines.insert(
            "ray".into(),
            Arc::new(engines::ray::RayEngine::from_env().context("Ray settings")?),
        );
    }
    let k8s_set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if k8s_set(engines::kubernetes::API_URL_ENV) || k8s_set(engines::kubernetes::KUBECONFIG_ENV) {
        // Where the runner keeps job directories (`runner::job_dir`).
        let jobs_root = config.member.data_dir.join("jobs");
        engines.insert(
            "kubernetes".into(),
            Arc::new(
                engines::kubernetes::KubernetesEngine::from_env(&jobs_root)
                    .context("Kubernetes settings")?,
            ),
        );
    }
    Ok(engines)
}

/// What this bridge reports: the host with its GPUs, the engines it can
/// drive, and their node pools.
pub fn capabilities(
    config: &BridgeConfig,
    gpus: &LocalGpus,
    cluster: &ClusterFacts,
) -> Capabilities {
    Capabilities {
        engines: cluster.engines.clone(),
        pools: cluster.pools.iter().map(facts::to_proto).collect(),
        ..host_capabilities(&config.member.data_dir, env!("CARGO_PKG_VERSION"), gpus)
    }
}

/// Runs the bridge until `shutdown`: heartbeats and the job loop side by side.
pub async fn run(config: BridgeConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    edgeloop_client_core::install_crypto_provider();
    create_private_dir(&config.member.data_dir)
        .with_context(|| format!("creating data dir {}", config.member.data_dir.display()))?;
    let gpus = facts::local_gpus()?;
    let refresh = facts::refresh_period()?;
    let engines = engines(&config, &gpus)?;
    let cluster = facts::read(&engines, &ClusterFacts::default()).await;
    let caps = capabilities(&config, &gpus, &cluster);
    let (facts_tx, facts_rx) = tokio::sync::watch::channel(cluster);
    let (caps_tx, caps_rx) = tokio::sync::watch::channel(caps.clone());
    let refresher = tokio::spawn(facts::refresh_loop(
        engines.clone(),
        facts_tx,
        caps_tx,
        refresh,
        shutdown.clone(),
    ));
    let store = IdentityStore::new(&config.member.data_dir);
    let identity = match ensure_identity(
        Role::Cluster,
        &config.member.control_plane,
        config.member.bootstrap_token.as_deref(),
        &store,
        caps.clone(),
        config.member.backoff,
        &shutdown,
    )
    .await
    {
        Err(SessionError::Cancelled) => return Ok(()),
        other => other?,
    };
    // Follows certificate renewals, which the heartbeat loop makes.
    let membership = Membership::new(&config.member.control_plane, &config.member.data_dir);
    membership.set_identity(identity)?;
    let channel = membership
        .channel_now()
        .context("the membership has the identity just set")?;
    let runner = Arc::new(Runner {
        client: BridgeServiceClient::new(channel),
        engines,
        data_dir: config.member.data_dir.clone(),
        facts: facts_rx,
        poll: Duration::from_millis(500),
        running: Default::default(),
        progress: progress::ProgressHub::start(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            config.member.data_dir.join("jobs"),
            shutdown.clone(),
        )
        .await
        .context("starting the progress endpoint")?,
    });
    let jobs = tokio::spawn(runner.run(shutdown.clone()));
    let beats = heartbeat_loop(
        Role::Cluster,
        &membership,
        caps_rx,
        config.member.backoff,
        shutdown.clone(),
    )
    .await;
    // A refused heartbeat (revoked) ends the bridge; stop the job loop too.
    shutdown.cancel();
    let _ = jobs.await;
    let _ = refresher.await;
    beats?;
    tracing::info!("trainer bridge stopped");
    Ok(())
}
