//! `edgeloop-train`: see the library docs (`src/lib.rs`) and
//! docs/checkpoint-contract.md.

use std::process::ExitCode;

use clap::Parser;
use edgeloop_reference_trainer::{config, stop, train};

fn main() -> ExitCode {
    let cli = config::Cli::parse();
    if let Err(e) = stop::install() {
        eprintln!("edgeloop-train: error: installing the SIGTERM handler: {e}");
        return ExitCode::FAILURE;
    }
    let result = config::resolve(cli)
        .map_err(anyhow::Error::from)
        .and_then(train::prepare)
        .and_then(|plan| {
            // Pinned before the first candle kernel starts rayon's pool; read
            // by rayon (pool size) and candle (gemm's split). See the crate
            // docs. Still single-threaded here, so setting it is sound.
            std::env::set_var("RAYON_NUM_THREADS", plan.hyper.threads.to_string());
            train::run(&plan, &mut std::io::stdout().lock())
        });
    match result {
        Ok(outcome) if outcome.stopped => ExitCode::from(stop::EXIT_STOPPED),
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgeloop-train: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
