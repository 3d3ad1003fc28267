//! What a run is told: command-line flags, the checkpoint contract's
//! environment (clap reads each `EDGELOOP_*` variable as its flag's
//! default), and the `EDGELOOP_HYPERPARAMETERS` object. The contract's
//! variables may be set and empty (`EDGELOOP_RESUME_FROM` is empty on a first
//! run), and empty counts as not given: hence `num_args = 0..=1`, which lets
//! clap take an empty value, and the `nonempty` filter.
//!
//! Precedence for a training setting: flag, then hyperparameter, then (on
//! resume) the checkpoint's value, then the workload's default. A resumed run
//! takes every setting it is not given from the checkpoint's `state.json`,
//! and refuses one given with another value: changing the batch size or the
//! schedule mid-run would silently break "continues exactly where it left
//! off".

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::optim::AdamConfig;
use crate::Workload;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "edgeloop-train",
    version,
    about = "Edgeloop's CPU reference trainer: a small CNN on MNIST or an MLP on the NOAA \
             rainfall table, following the checkpoint contract (docs/checkpoint-contract.md)"
)]
pub struct Cli {
    /// The model and data set (else the `workload` hyperparameter, else the
    /// checkpoint's when resuming).
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Where step-<N>/ checkpoints go.
    #[arg(long, env = "EDGELOOP_CHECKPOINT_DIR", num_args = 0..=1, default_missing_value = "")]
    pub checkpoint_dir: Option<String>,
    /// A committed step-<N>/ to continue from; empty means a first run.
    /// (Strings, not paths: clap refuses an empty path, and the contract
    /// spells "no checkpoint" as an empty value.)
    #[arg(long, env = "EDGELOOP_RESUME_FROM", num_args = 0..=1, default_missing_value = "")]
    pub resume_from: Option<String>,
    /// Where to POST progress (plain http://).
    #[arg(long, env = "EDGELOOP_REPORT_URL", num_args = 0..=1, default_missing_value = "")]
    pub report_url: Option<String>,
    #[arg(long, env = "EDGELOOP_CHECKPOINT_EVERY_STEPS", num_args = 0..=1, default_missing_value = "")]
    pub checkpoint_every_steps: Option<String>,
    #[arg(long, env = "EDGELOOP_CHECKPOINT_EVERY_MINUTES", num_args = 0..=1, default_missing_value = "")]
    pub checkpoint_every_minutes: Option<String>,
    /// A JSON object; see the `HYPERPARAMETERS` keys.
    #[arg(long, env = "EDGELOOP_HYPERPARAMETERS", num_args = 0..=1, default_missing_value = "")]
    pub hyperparameters: Option<String>,
    /// A JSON array of dataset URIs; the first `file://` one (or plain path)
    /// is the data.
    #[arg(long, env = "EDGELOOP_DATASETS", num_args = 0..=1, default_missing_value = "")]
    pub datasets: Option<String>,
    /// Only fp32 is implemented; another hint is noted and ignored.
    #[arg(long, env = "EDGELOOP_PRECISION", num_args = 0..=1, default_missing_value = "")]
    pub precision: Option<String>,
    /// The data: MNIST's digits directory or the rainfall csv (default: where
    /// scripts/fetch-mnist.sh or scripts/fetch-rainfall.sh put it).
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[arg(long)]
    pub steps: Option<u64>,
    #[arg(long)]
    pub batch_size: Option<usize>,
    #[arg(long)]
    pub learning_rate: Option<f64>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// CPU threads for candle's kernels (pinned: see the crate docs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Report progress every this many steps.
    #[arg(long)]
    pub report_every: Option<u64>,
    /// Exit (successfully) right after committing this step's checkpoint,
    /// as if the process had been stopped there.
    #[arg(long)]
    pub stop_after_step: Option<u64>,
}

/// The keys `EDGELOOP_HYPERPARAMETERS` may hold.
pub const HYPERPARAMETERS: &[&str] = &[
    "workload",
    "steps",
    "batch_size",
    "learning_rate",
    "seed",
    "shift",
    "threads",
    "beta1",
    "beta2",
    "eps",
    "report_every",
    "checkpoint_every_steps",
    "checkpoint_every_minutes",
];

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// Everything that decides the trained weights. Saved in `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hyper {
    pub workload: Workload,
    /// Total optimizer steps; the learning rate decays to zero over them.
    pub steps: u64,
    pub batch_size: usize,
    /// Peak learning rate of the cosine schedule.
    pub learning_rate: f64,
    pub seed: u64,
    /// MNIST only: random shifts of up to this many pixels (0: none).
    pub shift: usize,
    /// CPU threads of candle's kernels.
    pub threads: usize,
    pub adam: AdamConfig,
}

impl Hyper {
    /// tools/train_mnist.py's settings for the CNN (12 epochs of 125
    /// batches); the MLP's were tuned to converge in a similar time.
    pub fn defaults(workload: Workload) -> Hyper {
        let (steps, learning_rate, shift) = match workload {
            Workload::MnistCnn => (1500, 2e-3, 2),
            Workload::RainfallMlp => (1500, 1e-3, 0),
        };
        Hyper {
            workload,
            steps,
            batch_size: 64,
            learning_rate,
            seed: 2024,
            shift,
            threads: 1,
            adam: AdamConfig::default(),
        }
    }

    /// The learning rate of step `index` (0-based): a cosine decay from the
    /// peak to zero over all steps, tools/train_mnist.py's schedule.
    pub fn lr_at(&self, index: u64) -> f64 {
        let progress = index as f64 / self.steps as f64;
        self.learning_rate * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.steps == 0 {
            return err("steps must be at least 1");
        }
        if self.batch_size == 0 {
            return err("batch_size must be at least 1");
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return err(format!(
                "learning_rate {} must be positive",
                self.learning_rate
            ));
        }
        if !(1..=256).contains(&self.threads) {
            return err(format!("threads {} must be in 1..=256", self.threads));
        }
        if self.shift > 8 {
            return err(format!("shift {} must be at most 8 pixels", self.shift));
        }
        let AdamConfig { beta1, beta2, eps } = self.adam;
        if !((0.0..1.0).contains(&beta1) && (0.0..1.0).contains(&beta2)) {
            return err("beta1 and beta2 must be in [0, 1)");
        }
        if !(eps.is_finite() && eps > 0.0) {
            return err("eps must be positive");
        }
        Ok(())
    }
}

/// Training settings given explicitly (flag or hyperparameter).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub workload: Option<Workload>,
    pub steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub learning_rate: Option<f64>,
    pub seed: Option<u64>,
    pub shift: Option<usize>,
    pub threads: Option<usize>,
    pub beta1: Option<f64>,
    pub beta2: Option<f64>,
    pub eps: Option<f64>,
}

impl Overrides {
    /// `base` with every given setting applied.
    pub fn apply(&self, base: &Hyper) -> Hyper {
        Hyper {
            workload: self.workload.unwrap_or(base.workload),
            steps: self.steps.unwrap_or(base.steps),
            batch_size: self.batch_size.unwrap_or(base.batch_size),
            learning_rate: self.learning_rate.unwrap_or(base.learning_rate),
            seed: self.seed.unwrap_or(base.seed),
            shift: self.shift.unwrap_or(base.shift),
            threads: self.threads.unwrap_or(base.threads),
            adam: AdamConfig {
                beta1: self.beta1.unwrap_or(base.adam.beta1),
                beta2: self.beta2.unwrap_or(base.adam.beta2),
                eps: self.eps.unwrap_or(base.adam.eps),
            },
        }
    }

    /// A fresh run's settings: the workload's defaults, overridden.
    pub fn fresh(&self) -> Result<Hyper, ConfigError> {
        let workload = self.workload.ok_or_else(|| {
            ConfigError(
                "no workload: pass --workload mnist-cnn|rainfall-mlp or set the `workload` \
                 hyperparameter"
                    .into(),
            )
        })?;
        let h = self.apply(&Hyper::defaults(workload));
        h.check()?;
        Ok(h)
    }

    /// A resumed run's settings: the checkpoint's, or an error naming every
    /// explicit setting that disagrees with them.
    pub fn resumed(&self, saved: &Hyper) -> Result<Hyper, ConfigError> {
        let wanted = self.apply(saved);
        if wanted == *saved {
            return Ok(wanted);
        }
        let a = serde_json::to_value(saved).unwrap_or_default();
        let b = serde_json::to_value(&wanted).unwrap_or_default();
        let mut diffs = Vec::new();
        diff_values("", &a, &b, &mut diffs);
        err(format!(
            "the checkpoint was trained with other settings ({}); a resumed run must use the \
             checkpoint's (give none, or the same)",
            diffs.join(", ")
        ))
    }
}

fn diff_values(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let vb = b.get(k).unwrap_or(&Value::Null);
                diff_values(&format!("{prefix}{k}."), va, vb, out);
            }
        }
        _ if a != b => out.push(format!(
            "{}: checkpoint {a}, now {b}",
            prefix.trim_end_matches('.')
        )),
        _ => {}
    }
}

/// When to checkpoint and report; no effect on the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Cadence {
    pub checkpoint_every_steps: Option<u64>,
    pub checkpoint_every_minutes: Option<f64>,
    pub report_every: u64,
}

/// With neither cadence given, a checkpoint every this many steps.
pub const DEFAULT_CHECKPOINT_EVERY_STEPS: u64 = 100;
pub const DEFAULT_REPORT_EVERY: u64 = 10;

/// A run's inputs, resolved from the command line and environment; the
/// training settings are final once the checkpoint (if any) is read.
#[derive(Debug, Clone)]
pub struct Settings {
    pub overrides: Overrides,
    pub cadence: Cadence,
    pub checkpoint_dir: PathBuf,
    pub resume_from: Option<PathBuf>,
    pub report_url: Option<String>,
    /// Given explicitly; else the workload's default location.
    pub data: Option<PathBuf>,
    pub stop_after_step: Option<u64>,
}

fn hp_number(key: &str, v: &Value) -> Result<f64, ConfigError> {
    let n = match v {
        Value::Number(n) => n.as_f64(),
        // The spec's hyperparameters are free-form JSON; "0.001" is common.
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    match n {
        Some(n) if n.is_finite() => Ok(n),
        _ => err(format!("hyperparameter {key}: {v} is not a number")),
    }
}

fn hp_count(key: &str, v: &Value) -> Result<u64, ConfigError> {
    let n = hp_number(key, v)?;
    if n < 0.0 || n.fract() != 0.0 || n > u64::MAX as f64 {
        return err(format!("hyperparameter {key}: {v} is not a whole number"));
    }
    Ok(n as u64)
}

fn env_count(name: &str, text: &str) -> Result<u64, ConfigError> {
    text.trim()
        .parse()
        .ok()
        .filter(|&n: &u64| n > 0)
        .ok_or_else(|| ConfigError(format!("{name}={text:?} is not a positive whole number")))
}

fn env_minutes(name: &str, text: &str) -> Result<f64, ConfigError> {
    text.trim()
        .parse()
        .ok()
        .filter(|&m: &f64| m.is_finite() && m > 0.0)
        .ok_or_else(|| {
            ConfigError(format!(
                "{name}={text:?} is not a positive number of minutes"
            ))
        })
}

/// The data path from `EDGELOOP_DATASETS`: the first entry, a `file://` URI
/// or a plain path.
fn dataset_path(json: &str) -> Result<Option<PathBuf>, ConfigError> {
    let list: Vec<String> = serde_json::from_str(json).map_err(|e| {
        ConfigError(format!(
            "EDGELOOP_DATASETS is not a JSON array of strings: {e}"
        ))
    })?;
    let Some(first) = list.first() else {
        return Ok(None);
    };
    if let Some(path) = first.strip_prefix("file://") {
        return Ok(Some(PathBuf::from(path)));
    }
    if first.contains("://") {
        return err(format!(
            "dataset {first:?}: the reference trainer reads local files only (file:// or a path)"
        ));
    }
    Ok(Some(PathBuf::from(first)))
}

pub fn resolve(cli: Cli) -> Result<Settings, ConfigError> {
    let nonempty = |s: Option<String>| s.filter(|s| !s.trim().is_empty());
    let hp: BTreeMap<String, Value> = match nonempty(cli.hyperparameters) {
        None => BTreeMap::new(),
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            ConfigError(format!(
                "EDGELOOP_HYPERPARAMETERS is not a JSON object: {e}"
            ))
        })?,
    };
    if let Some(unknown) = hp.keys().find(|k| !HYPERPARAMETERS.contains(&k.as_str())) {
        return err(format!(
            "unknown hyperparameter {unknown:?}; this trainer knows {}",
            HYPERPARAMETERS.join(", ")
        ));
    }
    let count = |key: &str| hp.get(key).map(|v| hp_count(key, v)).transpose();
    let number = |key: &str| hp.get(key).map(|v| hp_number(key, v)).transpose();
    let workload = match (cli.workload, hp.get("workload")) {
        (Some(w), _) => Some(w),
        (None, None) => None,
        (None, Some(v)) => Some(
            v.as_str()
                .and_then(|s| Workload::from_str(s, true).ok())
                .ok_or_else(|| {
                    ConfigError(format!(
                        "hyperparameter workload: {v} is not mnist-cnn or rainfall-mlp"
                    ))
                })?,
        ),
    };
    let to_usize = |n: Option<u64>| n.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let overrides = Overrides {
        workload,
        steps: cli.steps.or(count("steps")?),
        batch_size: cli.batch_size.or(to_usize(count("batch_size")?)),
        learning_rate: cli.learning_rate.or(number("learning_rate")?),
        seed: cli.seed.or(count("seed")?),
        shift: to_usize(count("shift")?),
        threads: cli.threads.or(to_usize(count("threads")?)),
        beta1: number("beta1")?,
        beta2: number("beta2")?,
        eps: number("eps")?,
    };

    let every_steps = match nonempty(cli.checkpoint_every_steps) {
        Some(t) => Some(env_count("EDGELOOP_CHECKPOINT_EVERY_STEPS", &t)?),
        None => count("checkpoint_every_steps")?,
    };
    let every_minutes = match nonempty(cli.checkpoint_every_minutes) {
        Some(t) => Some(env_minutes("EDGELOOP_CHECKPOINT_EVERY_MINUTES", &t)?),
        None => number("checkpoint_every_minutes")?,
    };
    if every_steps == Some(0) || every_minutes.is_some_and(|m| m <= 0.0) {
        return err("checkpoint cadence must be positive");
    }
    let report_every = cli
        .report_every
        .or(count("report_every")?)
        .unwrap_or(DEFAULT_REPORT_EVERY);
    if report_every == 0 {
        return err("report_every must be at least 1");
    }
    let cadence = Cadence {
        checkpoint_every_steps: match (every_steps, every_minutes) {
            (None, None) => Some(DEFAULT_CHECKPOINT_EVERY_STEPS),
            (steps, _) => steps,
        },
        checkpoint_every_minutes: every_minutes,
        report_every,
    };

    let checkpoint_dir = nonempty(cli.checkpoint_dir)
        .map(PathBuf::from)
        .ok_or_else(|| {
            ConfigError(
                "no checkpoint directory: set EDGELOOP_CHECKPOINT_DIR or --checkpoint-dir".into(),
            )
        })?;
    let data = match cli.data {
        Some(p) => Some(p),
        None => match nonempty(cli.datasets) {
            Some(json) => dataset_path(&json)?,
            None => None,
        },
    };
    if let Some(p) = nonempty(cli.precision) {
        if p != "fp32" {
            eprintln!("edgeloop-train: precision {p:?} requested; this trainer computes in fp32");
        }
    }
    Ok(Settings {
        overrides,
        cadence,
        checkpoint_dir,
        resume_from: nonempty(cli.resume_from).map(PathBuf::from),
        report_url: nonempty(cli.report_url),
        data,
        stop_after_step: cli.stop_after_step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["edgeloop-train", "--checkpoint-dir", "/tmp/ck"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap()
    }

    #[test]
    fn flags_beat_hyperparameters_beat_defaults() {
        let s = resolve(cli(&[
            "--hyperparameters",
            r#"{"workload": "rainfall-mlp", "steps": 40, "learning_rate": "0.01", "batch_size": 8}"#,
            "--batch-size",
            "16",
        ]))
        .unwrap();
        let h = s.overrides.fresh().unwrap();
        assert_eq!(h.workload, Workload::RainfallMlp);
        assert_eq!((h.steps, h.batch_size, h.learning_rate), (40, 16, 0.01));
        assert_eq!(h.seed, 2024);
        assert_eq!(
            s.cadence.checkpoint_every_steps,
            Some(DEFAULT_CHECKPOINT_EVERY_STEPS)
        );
        assert_eq!(s.cadence.report_every, DEFAULT_REPORT_EVERY);
        assert_eq!(s.resume_from, None);
    }

    #[test]
    fn contract_values_and_errors() {
        let s = resolve(cli(&[
            "--workload",
            "mnist-cnn",
            "--resume-from",
            "",
            "--checkpoint-every-minutes",
            "30",
            "--datasets",
            r#"["file:///data/digits", "s3://b/x"]"#,
        ]))
        .unwrap();
        assert_eq!(s.resume_from, None, "empty means a first run");
        assert_eq!(s.cadence.checkpoint_every_steps, None);
        assert_eq!(s.cadence.checkpoint_every_minutes, Some(30.0));
        assert_eq!(s.data, Some(PathBuf::from("/data/digits")));

        for (args, needle) in [
            (
                vec!["--hyperparameters", r#"{"lr": 1}"#],
                "unknown hyperparameter \"lr\"",
            ),
            (vec!["--hyperparameters", "[1]"], "not a JSON object"),
            (
                vec!["--hyperparameters", r#"{"steps": 1.5}"#],
                "not a whole number",
            ),
            (
                vec!["--checkpoint-every-steps", "0"],
                "EDGELOOP_CHECKPOINT_EVERY_STEPS",
            ),
            (vec!["--datasets", r#"["s3://b/x"]"#], "local files only"),
        ] {
            let e = resolve(cli(&args)).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        let e = resolve(cli(&[])).unwrap().overrides.fresh().unwrap_err();
        assert!(e.to_string().contains("no workload"), "{e}");
        let e = resolve(Cli::try_parse_from(["edgeloop-train"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("EDGELOOP_CHECKPOINT_DIR"), "{e}");
    }

    #[test]
    fn resume_takes_the_checkpoints_settings_and_refuses_conflicts() {
        let saved = Overrides {
            steps: Some(40),
            ..Default::default()
        }
        .apply(&Hyper::defaults(Workload::MnistCnn));
        assert_eq!(Overrides::default().resumed(&saved).unwrap(), saved);
        let same = Overrides {
            workload: Some(Workload::MnistCnn),
            steps: Some(40),
            ..Default::default()
        };
        assert_eq!(same.resumed(&saved).unwrap(), saved);
        let other = Overrides {
            steps: Some(50),
            beta1: Some(0.8),
            ..Default::default()
        };
        let e = other.resumed(&saved).unwrap_err().to_string();
        assert!(e.contains("steps: checkpoint 40, now 50"), "{e}");
        assert!(e.contains("adam.beta1: checkpoint 0.9, now 0.8"), "{e}");
    }

    #[test]
    fn cosine_schedule() {
        let h = Hyper {
            steps: 100,
            ..Hyper::defaults(Workload::MnistCnn)
        };
        assert_eq!(h.lr_at(0), 2e-3);
        assert!((h.lr_at(50) - 1e-3).abs() < 1e-12);
        assert!(h.lr_at(99) > 0.0 && h.lr_at(99) < 1e-5);
    }
}
