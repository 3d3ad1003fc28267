//! The Edgeloop edge agent: enrolls with the control plane (mTLS identity
//! kept in the device's data dir, key mode 0600) and heartbeats with
//! reconnect backoff; syncs its assigned models into A/B slots; serves them
//! over the Open Inference Protocol v2; records drift sketches and
//! buffers telemetry while offline.

pub mod config;
pub mod observe;
pub mod serve;
pub mod serving;
pub mod sync;
pub mod telemetry;

use edgeloop_client_core::member::host_capabilities;
use edgeloop_client_core::{run_member, Role};
use edgeloop_proto::common::v1::Capabilities;
use tokio_util::sync::CancellationToken;

pub use config::{AgentConfig, AgentSettings};

/// What this device reports at enrollment and in heartbeats.
pub fn capabilities(config: &AgentConfig) -> Capabilities {
    host_capabilities(&config.member.data_dir, env!("CARGO_PKG_VERSION"))
}

/// Runs the agent until `shutdown`.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_member(
        Role::Device,
        &config.member,
        capabilities(&config),
        shutdown,
    )
    .await?;
    tracing::info!("edge agent stopped");
    Ok(())
}
