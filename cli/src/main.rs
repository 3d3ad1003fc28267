//! `edgeloop`, the ML teams' CLI: parse once, set up tracing, run.

use clap::Parser;
use edgeloop_cli::Cli;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EDGELOOP_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // reqwest is built without a provider of its own (rustls-no-provider):
    // ring, as everywhere in the workspace.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match edgeloop_cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
