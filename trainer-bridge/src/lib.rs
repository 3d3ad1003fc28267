//! The Edgeloop trainer bridge. Today: enrolls with the control plane as a
//! cluster (mTLS identity in its data dir, key mode 0600) and heartbeats with
//! reconnect backoff. Job leasing and the engines build on this.

pub mod engines;
pub mod launch;
pub mod preflight;
pub mod spec;

use edgeloop_client_core::member::host_capabilities;
use edgeloop_client_core::{run_member, Role};
use edgeloop_proto::common::v1::Capabilities;
use tokio_util::sync::CancellationToken;

pub use edgeloop_client_core::{MemberConfig as Config, MemberSettings as BridgeSettings};

/// What this bridge reports: the host, and the engines it can drive.
pub fn capabilities(config: &Config) -> Capabilities {
    Capabilities {
        engines: vec!["local".to_string()],
        ..host_capabilities(&config.data_dir, env!("CARGO_PKG_VERSION"))
    }
}

/// Runs the bridge until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_member(Role::Cluster, &config, capabilities(&config), shutdown).await?;
    tracing::info!("trainer bridge stopped");
    Ok(())
}
