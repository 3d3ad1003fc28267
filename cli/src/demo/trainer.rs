//! Which trainer the demo's jobs run, v1's and the retrains' alike:
//! `reference` (`edgeloop-train`, Rust, the default) or `pytorch`
//! (`workloads/pytorch/train_ddp.py`, DDP over two processes with gloo,
//! in the interpreter `scripts/torch-env.sh` installs). Both follow the
//! checkpoint contract, so the retraining policy differs only in its job.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::ValueEnum;
use edgeloop_models::npz::Npz;
use serde_json::{json, Value};

use super::data::{self, Stream};

/// v1 trains on days `0..V1_TRAIN_END` and evaluates on
/// `V1_TRAIN_END..SHIFT_ROW`: the reference trainer's fixed split.
pub const V1_TRAIN_END: usize = 10_000;

/// The PyTorch trainer and the contract helper it imports, carried in the
/// binary so the demo runs them wherever it is installed.
const TRAIN_DDP_PY: &str = include_str!("../../../workloads/pytorch/train_ddp.py");
const CONTRACT_PY: &str = include_str!("../../../workloads/pytorch/contract.py");

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TrainerKind {
    /// `edgeloop-train`, the Rust reference trainer.
    Reference,
    /// `workloads/pytorch/train_ddp.py`: PyTorch DDP, 2 processes (gloo).
    Pytorch,
}

impl TrainerKind {
    pub fn name(self) -> &'static str {
        match self {
            TrainerKind::Reference => "reference",
            TrainerKind::Pytorch => "pytorch",
        }
    }
}

/// A trainer ready to be named in job specs.
pub enum Trainer {
    Reference {
        bin: PathBuf,
        /// The rainfall table: the reference trainer splits it itself.
        table: PathBuf,
    },
    Pytorch {
        python: PathBuf,
        script: PathBuf,
        /// v1's data as a snapshot of the same split.
        v1_snapshot: PathBuf,
    },
}

/// The interpreter with torch: `--torch-python`, else
/// `EDGELOOP_TORCH_PYTHON`, else where scripts/torch-env.sh installs it.
pub fn torch_python(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let python = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("EDGELOOP_TORCH_PYTHON").map(PathBuf::from))
        .or_else(|| edgeloop_models::deps::dir().map(|d| d.join("torch-venv/bin/python")))
        .context("no Python with torch: run scripts/torch-env.sh or pass --torch-python")?;
    anyhow::ensure!(
        python.is_file(),
        "--trainer pytorch needs a Python with torch; {} does not exist: run scripts/torch-env.sh \
         (it installs one into the deps dir) or pass --torch-python",
        python.display()
    );
    Ok(python)
}

impl Trainer {
    /// Readies `kind` in `work`: for PyTorch, writes the scripts and v1's
    /// snapshot (days 0..10 000 train, 10 000..12 000 evaluate).
    pub fn prepare(
        kind: TrainerKind,
        reference_bin: PathBuf,
        table: &Path,
        python: Option<&Path>,
        stream: &Stream,
        work: &Path,
    ) -> anyhow::Result<Trainer> {
        Ok(match kind {
            TrainerKind::Reference => Trainer::Reference {
                bin: reference_bin,
                table: table.to_path_buf(),
            },
            TrainerKind::Pytorch => {
                let python = torch_python(python)?;
                let dir = work.join("pytorch");
                std::fs::create_dir_all(&dir)?;
                std::fs::write(dir.join("train_ddp.py"), TRAIN_DDP_PY)?;
                std::fs::write(dir.join("contract.py"), CONTRACT_PY)?;
                let v1_snapshot = dir.join("v1-snapshot.npz");
                v1_split(stream)?
                    .write(&v1_snapshot)
                    .with_context(|| format!("writing {}", v1_snapshot.display()))?;
                Trainer::Pytorch {
                    python,
                    script: dir.join("train_ddp.py"),
                    v1_snapshot,
                }
            }
        })
    }

    pub fn kind(&self) -> TrainerKind {
        match self {
            Trainer::Reference { .. } => TrainerKind::Reference,
            Trainer::Pytorch { .. } => TrainerKind::Pytorch,
        }
    }

    /// The job v1 (`first: true`) or a retrain runs; a retrain's data is
    /// the snapshot its pipeline puts first in `datasets`.
    pub fn job_spec(&self, name: &str, steps: u64, first: bool) -> Value {
        let checkpoint = json!({"every_steps": (steps / 3).max(1), "keep_last": 2});
        let restarts = json!({"max_restarts": 1, "backoff_seconds": 1, "backoff_max_seconds": 2});
        let (mut spec, data) = match self {
            Trainer::Reference { bin, table } => (
                json!({
                    "name": name,
                    "command": [bin.display().to_string()],
                    "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
                    "hyperparameters": {"workload": "rainfall-mlp", "steps": steps, "batch_size": 64},
                }),
                table,
            ),
            Trainer::Pytorch {
                python,
                script,
                v1_snapshot,
            } => (
                json!({
                    "name": name,
                    "command": [python.display().to_string(), script.display().to_string()],
                    "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 2},
                    "launcher": {"type": "torchrun", "nproc_per_node": 2},
                    // 32 per process: the reference trainer's 64 per step.
                    "hyperparameters": {"steps": steps, "batch_size": 32, "lr": 0.001,
                                        "log_every": 20},
                    "env": {"OMP_NUM_THREADS": "1"},
                }),
                v1_snapshot,
            ),
        };
        spec["checkpoint"] = checkpoint;
        spec["restarts"] = restarts;
        if first {
            spec["datasets"] = json!([format!("file://{}", data.display())]);
        }
        spec
    }
}

/// v1's split of the stream as a snapshot (`input`, `label`, `eval_input`,
/// `eval_label`: docs/checkpoint-contract.md).
fn v1_split(stream: &Stream) -> anyhow::Result<Npz> {
    let part = |rows: std::ops::Range<usize>| -> anyhow::Result<_> {
        let x: Vec<f32> = stream.x[rows.clone()].iter().flatten().copied().collect();
        let y: Vec<i64> = stream.y[rows.clone()].to_vec();
        Ok((
            edgeloop_models::Tensor::F32(ndarray::ArrayD::from_shape_vec(
                ndarray::IxDyn(&[rows.len(), data::FEATURES]),
                x,
            )?),
            edgeloop_models::Tensor::I64(ndarray::ArrayD::from_shape_vec(
                ndarray::IxDyn(&[rows.len()]),
                y,
            )?),
        ))
    };
    let (x, y) = part(0..V1_TRAIN_END)?;
    let (ex, ey) = part(V1_TRAIN_END..data::SHIFT_ROW)?;
    let mut npz = Npz::new();
    npz.insert("input", x);
    npz.insert("label", y);
    npz.insert("eval_input", ex);
    npz.insert("eval_label", ey);
    Ok(npz)
}
