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
    bound_malloc_arenas();
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

/// glibc gives threads up to eight malloc arenas per core, and a replica on
/// PostgreSQL has hundreds of short-lived threads during a rollout (each
/// store wait runs in `block_in_place`, which hands the runtime's worker to
/// a new thread). Its heap then spreads over all of them: one arena per
/// core measured 50 MiB (20 %) less at rest at 3 000 agents
/// (docs/fleet-scale.md). An operator's own `MALLOC_ARENA_MAX` wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // The second unsafe block (ARCHITECTURE.md).
fn bound_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
    // SAFETY: `mallopt` only sets an allocator parameter; it is called
    // before any other thread exists, and a refusal (0) leaves glibc's
    // default in place, which is harmless.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn bound_malloc_arenas() {}
