//! The Edgeloop edge agent. Today: enrolls with the control plane (mTLS
//! identity kept in the device's data dir, key mode 0600) and heartbeats with
//! reconnect backoff. Model sync and inference build on this.

use edgeloop_client_core::member::host_capabilities;
use edgeloop_client_core::{run_member, Role};
use edgeloop_proto::common::v1::Capabilities;
use tokio_util::sync::CancellationToken;

pub use edgeloop_client_core::{MemberConfig as Config, MemberSettings as AgentSettings};

/// What this device reports at enrollment and in heartbeats.
pub fn capabilities(config: &Config) -> Capabilities {
    host_capabilities(&config.data_dir, env!("CARGO_PKG_VERSION"))
}

/// Runs the agent until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_member(Role::Device, &config, capabilities(&config), shutdown).await?;
    tracing::info!("edge agent stopped");
    Ok(())
}
