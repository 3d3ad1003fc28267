//! `edgeloop-train`: see the library docs (`src/lib.rs`) and
//! docs/checkpoint-contract.md.

use std::process::ExitCode;

use clap::Parser;
use edgeloop_reference_trainer::{config, train};

fn main() -> ExitCode {
    let cli = config::Cli::parse();
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
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgeloop-train: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
