//! `edgeloop`, the ML teams' CLI: parse once, set up tracing, run.

use clap::Parser;
use edgeloop_control_plane::cli::Cli;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    edgeloop_client_core::init_tracing();
    edgeloop_client_core::install_crypto_provider();
    match edgeloop_control_plane::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
