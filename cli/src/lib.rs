//! The `edgeloop` CLI for ML teams: model tooling that runs locally
//! (inspect, quantize behind the accuracy gate, verify a signed manifest),
//! and commands against the console API: the registry, jobs, deployments,
//! devices, drift, cost, retraining policies, triggers and pipelines (`api.rs`:
//! client, exit codes, waiting; `table.rs`: the human tables they share).
//! Server commands return their output, so `run_with` can send it
//! anywhere (tests read it).

mod access;
pub mod api;
mod cluster;
mod cost;
mod demo;
pub mod deployment;
mod device;
mod drift;
mod job;
mod model;
mod model_alias;
mod model_api;
mod model_benchmark;
mod model_pull;
mod model_push;
mod model_quantize;
mod model_sign;
pub mod pipeline;
mod retraining;
mod sample;
pub mod table;
mod transfer;
pub mod trigger;

use std::io::Write;
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
    /// Models: ONNX files locally (inspect, quantize, verify) and the
    /// registry (list, show, versions, push, pull, alias).
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Staged rollouts of a model version to a device group.
    Deployment {
        #[command(subcommand)]
        cmd: deployment::DeploymentCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// Training jobs run by trainer bridges.
    Job {
        #[command(subcommand)]
        cmd: job::JobCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// Enrolled trainer bridges and their engines' node pools (GPUs per
    /// node, type, driver, CUDA).
    Cluster {
        #[command(subcommand)]
        cmd: cluster::ClusterCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// Enrolled edge devices.
    Device {
        #[command(subcommand)]
        cmd: device::DeviceCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// Whether a model's inputs and predictions drifted from its reference
    /// statistics: the latest window per device group and feature.
    Drift(drift::DriftArgs),
    /// The monthly cost of a model's measured traffic at the edge versus
    /// in the cloud.
    Cost(cost::CostArgs),
    /// The whole loop on the NOAA rainfall stream, as real processes on
    /// loopback: train, gate, roll out, replay, notice drift, retrain, ship v2.
    Demo(demo::DemoArgs),
    /// How a model is retrained: its policy (training job template, data,
    /// gates, rollout).
    Retraining {
        #[command(subcommand)]
        cmd: retraining::RetrainingCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// Retrain a model now (a manual trigger); coalesced into its running
    /// pipeline if there is one.
    Retrain(retraining::RetrainArgs),
    /// What starts a model's retrains (drift that hurts, an accuracy
    /// drop, new labels, a schedule), and what the trigger task last saw
    /// and decided.
    Trigger {
        #[command(subcommand)]
        cmd: trigger::TriggerCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// The labelling queue: the samples devices sent (hard examples,
    /// feedback), their labels, and export/import for labelling tools.
    Sample {
        #[command(subcommand)]
        cmd: sample::SampleCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// API tokens for the console: create (with a role and projects),
    /// list, revoke. Admin only.
    ApiToken {
        #[command(subcommand)]
        cmd: access::ApiTokenCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
    /// The audit log: every state-changing console call, newest first.
    /// Admin only.
    Audit(access::AuditArgs),
    /// Retraining pipelines: every step's status, timing and output.
    Pipeline {
        #[command(subcommand)]
        cmd: pipeline::PipelineCommand,
        #[command(flatten)]
        server: api::ServerArgs,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    run_with(cli, &mut std::io::stdout().lock())
}

/// Runs a command with the server commands' output going to `out`.
pub fn run_with(cli: Cli, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Model(cmd) => model::run(cmd, out),
        Command::Deployment { cmd, server } => deployment::run(cmd, &server, out),
        Command::Job { cmd, server } => job::run(cmd, &server, out),
        Command::Cluster { cmd, server } => cluster::run(cmd, &server, out),
        Command::Device { cmd, server } => device::run(cmd, &server, out),
        Command::Drift(args) => drift::run(&args, out),
        Command::Cost(args) => cost::run(&args, out),
        Command::Demo(args) => demo::run(args),
        Command::Retraining { cmd, server } => retraining::run(cmd, &server, out),
        Command::Retrain(args) => retraining::retrain(&args, out),
        Command::Trigger { cmd, server } => trigger::run(cmd, &server, out),
        Command::Pipeline { cmd, server } => pipeline::run(cmd, &server, out),
        Command::Sample { cmd, server } => sample::run(cmd, &server, out),
        Command::ApiToken { cmd, server } => access::run_tokens(cmd, &server, out),
        Command::Audit(args) => access::run_audit(&args, out),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// clap checks the whole tree (flag clashes between a command's own
    /// flags and the flattened server flags, for one) only when asked.
    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn local_model_commands_need_no_server_flags() {
        let cli =
            Cli::try_parse_from(["edgeloop", "model", "inspect", "m.onnx", "--json"]).unwrap();
        assert!(matches!(cli.command, Command::Model(_)));
        assert!(
            Cli::try_parse_from(["edgeloop", "model", "inspect", "m.onnx", "--server", "x"])
                .is_err()
        );
        let cli = Cli::try_parse_from([
            "edgeloop",
            "model",
            "list",
            "--server",
            "http://h:1",
            "--json",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Model(_)));
    }

    /// `model quantize --benchmark-on` reaches a console over TLS with the
    /// same trust flags as the server commands.
    #[test]
    fn quantize_takes_the_console_trust_flags() {
        let quantize = |extra: &[&str]| {
            let mut args = vec![
                "edgeloop",
                "model",
                "quantize",
                "m.onnx",
                "--calibration",
                "c.npz",
                "--eval",
                "e.npz",
                "--out",
                "o.onnx",
                "--benchmark-on",
                "edge-1",
            ];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        let pin = "ab".repeat(32);
        let Command::Model(model::ModelCommand::Quantize(q)) =
            quantize(&["--ca-fingerprint", &pin]).unwrap().command
        else {
            panic!("not a quantize");
        };
        assert_eq!(q.ca_fingerprint.map(|d| d.to_hex()), Some(pin.clone()));
        assert!(quantize(&["--ca-file", "ca.pem"]).is_ok());
        assert!(quantize(&["--ca-file", "ca.pem", "--ca-fingerprint", &pin]).is_err());
    }
}
