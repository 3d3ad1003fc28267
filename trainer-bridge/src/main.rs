//! `trainer-bridge run ...`: parse config once, set up tracing, call `run`.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use edgeloop_client_core::member::settings_file;
use edgeloop_trainer_bridge::{BridgeConfig, BridgeSettings};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "trainer-bridge", version, about = "Edgeloop trainer bridge")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Enroll (first start), then stay connected.
    Run {
        /// Optional TOML file with the same settings (kebab-case keys).
        #[arg(long, env = "EDGELOOP_CONFIG")]
        config: Option<std::path::PathBuf>,
        #[command(flatten)]
        settings: BridgeSettings,
    },
}

fn main() -> anyhow::Result<()> {
    let Command::Run { config, settings } = Cli::parse().command;
    edgeloop_client_core::init_tracing();
    let config = BridgeConfig::from_settings(settings.or(settings_file(config.as_deref())?))?;
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(edgeloop_client_core::shutdown_on_signals(shutdown.clone()));
        edgeloop_trainer_bridge::run(config, shutdown).await
    })
}
