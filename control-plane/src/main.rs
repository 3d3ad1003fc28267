//! `control-plane serve ...`: parse config once, set up tracing, call `run`.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use edgeloop_control_plane::{Config, ServeSettings};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "control-plane", version, about = "Edgeloop control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the console API and the agent/bridge gRPC API.
    Serve {
        /// Optional TOML file with the same settings (kebab-case keys).
        #[arg(long, env = "EDGELOOP_CONFIG")]
        config: Option<std::path::PathBuf>,
        #[command(flatten)]
        settings: ServeSettings,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    edgeloop_client_core::init_tracing();
    match cli.command {
        Command::Serve { config, settings } => {
            let file = match config {
                Some(path) => ServeSettings::from_toml_file(&path)?,
                None => ServeSettings::default(),
            };
            let config = Config::from_settings(settings.or(file))?;
            let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(edgeloop_client_core::shutdown_on_signals(shutdown.clone()));
                edgeloop_control_plane::run(config, shutdown).await
            })
        }
    }
}
