//! `edgeloop model inspect | quantize | verify` (local files, no server)
//! and, through the console API, `edgeloop model list | show | versions`
//! (`model_api.rs`), `push` (`model_push.rs`), `pull` (`model_pull.rs`),
//! `sign` (`model_sign.rs`, offline signing of a pipeline's manifests)
//! and `alias set | list | delete | history` (`model_alias.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use edgeloop_models::onnx;

use super::api::ServerArgs;
use super::model_api;

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Versions, inputs and outputs, ops, parameters, external data.
    Inspect {
        model: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Quantize behind the accuracy gate and write the chosen model and its signed manifest.
    Quantize(Box<QuantizeArgs>),
    /// Check a model against its signed manifest.
    Verify {
        model: PathBuf,
        manifest: PathBuf,
        /// Trusted public key (hex); defaults to the key beside the default signing key.
        #[arg(long, env = "EDGELOOP_MANIFEST_PUBLIC_KEY")]
        public_key: Option<PathBuf>,
    },
    /// Registered models (console API).
    List {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// A registered model and its versions with their lineage (console API).
    Show {
        name: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// A registered model's versions with their lineage (console API).
    Versions {
        name: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Register a version from local files: check them, upload what the
    /// server lacks, register; idempotent by digest (console API).
    Push(Box<super::model_push::PushArgs>),
    /// Fetch a version's files (by version or alias), each checked against
    /// its digest (console API).
    Pull(Box<super::model_pull::PullArgs>),
    /// Offline signing: sign the manifests of a pipeline awaiting a
    /// signature with a key kept off the control plane (console API).
    Sign(Box<super::model_sign::SignArgs>),
    /// A model's aliases (`production`, `staging`) and their history
    /// (console API).
    Alias {
        #[command(subcommand)]
        cmd: super::model_alias::AliasCommand,
        #[command(flatten)]
        server: ServerArgs,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    Auto,
    Classification,
    Detection,
    Regression,
    Stateful,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// Try every candidate in order and let the gate choose.
    Auto,
    StaticEntropy,
    StaticPercentile,
    StaticMinmax,
    Dynamic,
    Fp16,
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    pub model: PathBuf,
    /// `.npz` with one array per model input.
    #[arg(long)]
    pub calibration: PathBuf,
    /// `.npz` with one array per model input, and for classification
    /// against labels an int64 `label` array, for detection against labels
    /// a float32 `boxes` array `[samples, max_boxes, 5]` (x1, y1, x2, y2,
    /// class; a negative class pads). Without them the gate measures
    /// agreement with float.
    #[arg(long)]
    pub eval: PathBuf,
    /// What the model does, which decides the gate's metric (auto: stateful
    /// when an output is named after an input, classification with labels
    /// or a [batch, classes] score output, else regression).
    #[arg(long, value_enum, default_value_t = TaskArg::Auto)]
    pub task: TaskArg,
    /// Stateful models: INPUT=OUTPUT, the output fed back into the input at
    /// the next call (repeatable; default: inferred from the names).
    #[arg(long = "state", value_name = "INPUT=OUTPUT")]
    pub state: Vec<String>,
    /// Detection: boxes below this class score are dropped before NMS.
    #[arg(long, default_value_t = 0.25)]
    pub score_threshold: f32,
    /// Refuse candidates slower than this many ms per call on this machine
    /// (by default latency is measured and recorded, never gated: this
    /// machine is not the device).
    #[arg(long)]
    pub latency_budget_ms: Option<f64>,
    /// Ship no health probe. By default the first sample of the evaluation
    /// set becomes the probe (OUT.probe.npz, its digest in the manifest): a
    /// device runs it before taking traffic, and a model with dynamic sizes
    /// cannot warm up without one.
    #[arg(long)]
    pub no_probe: bool,
    /// The slowest probe answer a device accepts, in milliseconds.
    #[arg(long, default_value_t = 1000.0)]
    pub probe_max_latency_ms: f64,
    /// Refuse candidates slower than float on this machine (10 % tolerance).
    #[arg(long, conflicts_with = "latency_budget_ms")]
    pub not_slower_than_float: bool,
    /// Names of a tabular input's feature columns for drift (per column:
    /// `INPUT=temp,dew_point,...`, or just the names for the first input);
    /// unnamed columns are `<input>[<j>]`.
    #[arg(long = "feature-names", value_name = "[INPUT=]NAMES")]
    pub feature_names: Vec<String>,
    /// Time float and every candidate within the accuracy budget on this
    /// enrolled device (through the control plane, over the device's own
    /// channel), and judge latency there instead of on this machine:
    /// `--latency-budget-ms`, else not slower than float by over 10 %.
    #[arg(long, conflicts_with = "benchmark_selector")]
    pub benchmark_on: Option<String>,
    /// Like `--benchmark-on`, on the representative of a hardware class: the
    /// online device matching this selector seen most recently.
    #[arg(long)]
    pub benchmark_selector: Option<String>,
    /// Timed calls per model on the device.
    #[arg(long, default_value_t = 50)]
    pub benchmark_runs: u32,
    /// How long the device has to report, in seconds.
    #[arg(long, default_value_t = 600)]
    pub benchmark_timeout_s: u32,
    /// The control plane's console API (for `--benchmark-on`).
    #[arg(long, env = "EDGELOOP_SERVER", default_value = "http://127.0.0.1:7080")]
    pub server: String,
    /// An API token; visible in `ps`, so prefer `EDGELOOP_TOKEN` or `--token-file`.
    #[arg(long)]
    pub token: Option<String>,
    #[arg(skip = super::api::env_token())]
    pub env_token: Option<String>,
    /// A file holding the token.
    #[arg(long, env = "EDGELOOP_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// For an `https://` server: trust only the CAs in this PEM file.
    #[arg(long, env = "EDGELOOP_CA_FILE", conflicts_with = "ca_fingerprint")]
    pub ca_file: Option<PathBuf>,
    /// For an `https://` server: trust only the CA with this sha256.
    #[arg(long, env = "EDGELOOP_CA_FINGERPRINT")]
    pub ca_fingerprint: Option<edgeloop_models::Digest>,
    /// Where to write the chosen model; the manifest goes beside it as OUT.manifest.json.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value_t = Method::Auto)]
    pub method: Method,
    /// Largest acceptable loss against float in the metric's own unit:
    /// points of top-1 or box F1 (default 1 and 2), or relative L2 for
    /// regression and stateful models (default 0.05).
    #[arg(long)]
    pub budget: Option<f64>,
    /// Percentile for the percentile calibration method.
    #[arg(long, default_value_t = 99.99)]
    pub percentile: f64,
    /// Model name in the manifest (default: the file stem).
    #[arg(long)]
    pub name: Option<String>,
    /// Semantic version in the manifest.
    #[arg(long, default_value = "0.1.0")]
    pub version: String,
    /// Lineage: the training job that produced the model.
    #[arg(long)]
    pub job: Option<String>,
    /// Lineage: sha256 of the checkpoint it was exported from.
    #[arg(long)]
    pub checkpoint: Option<edgeloop_models::Digest>,
    /// Lineage: sha256 of the dataset snapshot it was trained on.
    #[arg(long)]
    pub dataset: Option<edgeloop_models::Digest>,
    /// Lineage: the version this one replaces.
    #[arg(long)]
    pub parent_version: Option<String>,
    /// Anti-rollback: devices that serve this version refuse any version
    /// below this one afterwards (unless signed with --rollback).
    #[arg(long)]
    pub min_version: Option<String>,
    /// Sign this version as an explicit rollback: devices install it below
    /// their floor, whose new value is this manifest's --min-version.
    #[arg(long)]
    pub rollback: bool,
    /// ed25519 signing key (hex); created with mode 0600 if missing.
    #[arg(long, env = "EDGELOOP_MANIFEST_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
    /// ONNX Runtime library (else ORT_DYLIB_PATH, else the default install).
    #[arg(long)]
    pub ort_library: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: ModelCommand, out: &mut dyn std::io::Write) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::List { server } => model_api::list(&server, out),
        ModelCommand::Show { name, server } => model_api::show(&name, &server, out),
        ModelCommand::Versions { name, server } => model_api::versions(&name, &server, out),
        ModelCommand::Push(args) => super::model_push::push(&args, out),
        ModelCommand::Pull(args) => super::model_pull::pull(&args, out),
        ModelCommand::Sign(args) => super::model_sign::sign(&args, out),
        ModelCommand::Alias { cmd, server } => super::model_alias::run(cmd, &server, out),
        ModelCommand::Inspect { model, json } => inspect(&model, json),
        ModelCommand::Quantize(args) => super::model_quantize::quantize(*args),
        ModelCommand::Verify {
            model,
            manifest,
            public_key,
        } => super::model_quantize::verify(&model, &manifest, public_key.as_deref()),
    }
}

fn inspect(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let model = onnx::read(path).with_context(|| format!("reading {}", path.display()))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let validation = onnx::validate(&model, Some(dir));
    let summary = onnx::inspect(&model);
    if json {
        let mut value = serde_json::to_value(&summary)?;
        value["valid"] = serde_json::Value::Bool(validation.is_ok());
        if let Err(e) = &validation {
            value["validation_error"] = serde_json::Value::String(e.to_string());
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render_inspection(path, &summary));
        match &validation {
            Ok(()) => println!("valid:        yes"),
            Err(e) => println!("valid:        NO: {e}"),
        }
    }
    Ok(if validation.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn shape(s: &onnx::ValueSummary) -> String {
    match &s.shape {
        None => "?".into(),
        Some(d) => format!(
            "[{}]",
            d.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub fn render_inspection(path: &Path, s: &onnx::Inspection) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "model:        {}", path.display());
    let _ = writeln!(out, "ir_version:   {}", s.ir_version);
    let opsets: Vec<String> = s
        .opsets
        .iter()
        .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    let _ = writeln!(out, "opsets:       {}", opsets.join(", "));
    if !s.producer.is_empty() {
        let _ = writeln!(out, "producer:     {}", s.producer);
    }
    for (title, values) in [("inputs", &s.inputs), ("outputs", &s.outputs)] {
        let _ = writeln!(out, "{title}:");
        for v in values.iter() {
            let _ = writeln!(out, "  {:<24} {:<10} {}", v.name, v.dtype, shape(v));
        }
    }
    let _ = writeln!(
        out,
        "nodes:        {} ({} op types)",
        s.node_count,
        s.op_histogram.len()
    );
    for (op, n) in &s.op_histogram {
        let _ = writeln!(out, "  {op:<24} {n}");
    }
    let _ = writeln!(
        out,
        "parameters:   {} in {} initializers",
        s.parameter_count, s.initializer_count
    );
    for (dtype, bytes) in &s.bytes_by_dtype {
        let _ = writeln!(out, "  {dtype:<24} {bytes} bytes");
    }
    if !s.external_data.is_empty() {
        let _ = writeln!(out, "external data:");
        for e in &s.external_data {
            let _ = writeln!(out, "  {:<24} {} @ {}", e.tensor, e.location, e.offset);
        }
    }
    out
}
