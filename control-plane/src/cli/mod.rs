//! The `edgeloop` CLI for ML teams: model tooling that runs locally
//! (inspect, quantize behind the accuracy gate, verify a signed manifest),
//! and commands against the console API (`api.rs`: client, exit codes).

pub mod api;
pub mod deployment;
mod model;
mod model_quantize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "edgeloop",
    version,
    about = "Edgeloop: train, quantize, ship and watch models at the edge"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with ONNX models locally.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Staged rollouts of a model version to a device group.
    Deployment {
        #[command(subcommand)]
        cmd: deployment::DeploymentCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Model(cmd) => model::run(cmd),
        Command::Deployment { cmd, server } => deployment::run(cmd, &server),
    }
}
