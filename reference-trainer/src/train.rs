//! The training loop: resume or start, step, report, checkpoint, and at the
//! last step evaluate and export.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, Checkpoint};
use crate::config::{Hyper, Settings};
use crate::data::{self, Batcher, Data, Samples, CALIB_SAMPLES};
use crate::model::{self, Model};
use crate::optim::Adam;
use crate::stop;
use crate::{export, report, Workload};

pub const WEIGHTS: &str = "weights.safetensors";
pub const OPTIMIZER: &str = "optimizer.safetensors";
pub const STATE: &str = "state.json";
pub const MODEL_ONNX: &str = "model.onnx";
pub const EVAL_NPZ: &str = "eval.npz";
pub const CALIB_NPZ: &str = "calib.npz";
pub const METRICS: &str = "metrics.json";

pub const STATE_FORMAT: u32 = 1;
/// How the data position is derived, for whoever reads `state.json`.
const DATA_ORDER: &str = "epoch e = step / steps_per_epoch is a Fisher-Yates permutation of the \
    train split from SplitMix64 stream (seed, order, e); step s takes slice s % steps_per_epoch; \
    MNIST shifts of step s come from stream (seed, augment, s)";

/// `state.json`: where the run stands. Everything here is a pure function of
/// the settings and the step, so an uninterrupted and a resumed run write
/// the same bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    pub format: u32,
    pub workload: Workload,
    /// Optimizer steps taken.
    pub step: u64,
    /// The data position of the next step: its epoch and batch within it.
    pub epoch: u64,
    pub batch_in_epoch: u64,
    pub steps_per_epoch: u64,
    pub seed: u64,
    pub data_order: String,
    pub hyperparameters: Hyper,
    pub train_samples: usize,
    pub eval_samples: usize,
}

/// A run whose settings are final: the checkpoint (if any) read and
/// verified, nothing computed yet.
#[derive(Debug)]
pub struct Plan {
    pub settings: Settings,
    pub hyper: Hyper,
    pub resume: Option<(Checkpoint, TrainState)>,
    pub data_path: PathBuf,
}

/// Reads the checkpoint to resume from, if any (refusing a torn one), and
/// settles the training settings.
pub fn prepare(settings: Settings) -> anyhow::Result<Plan> {
    let resume = match &settings.resume_from {
        None => None,
        Some(dir) => {
            let ckpt = checkpoint::read(dir)?;
            let state: TrainState = serde_json::from_slice(ckpt.file(STATE)?)
                .with_context(|| format!("{}: {STATE}", dir.display()))?;
            if state.format != STATE_FORMAT {
                bail!(
                    "{}: {STATE} has format {}, this trainer reads {STATE_FORMAT}",
                    dir.display(),
                    state.format
                );
            }
            if state.step != ckpt.manifest.step {
                bail!(
                    "{}: {STATE} says step {}, the manifest {}",
                    dir.display(),
                    state.step,
                    ckpt.manifest.step
                );
            }
            Some((ckpt, state))
        }
    };
    let hyper = match &resume {
        None => settings.overrides.fresh()?,
        Some((ckpt, state)) => settings
            .overrides
            .resumed(&state.hyperparameters)
            .with_context(|| format!("resuming from {}", ckpt.dir.display()))?,
    };
    let data_path = match &settings.data {
        Some(p) => p.clone(),
        None => data::default_path(hyper.workload).context(
            "no data path: pass --data or EDGELOOP_DATASETS, or set EDGELOOP_DEPS or HOME",
        )?,
    };
    Ok(Plan {
        settings,
        hyper,
        resume,
        data_path,
    })
}

/// Eval loss and accuracy over a whole split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eval {
    pub loss: f64,
    pub accuracy: f64,
}

pub fn evaluate(model: &Model, samples: &Samples) -> anyhow::Result<Eval> {
    let classes = model.workload.classes();
    let logits = model.logits(&samples.x, &samples.sample_shape)?;
    let mut loss = 0.0f64;
    for (row, &label) in logits.chunks(classes).zip(&samples.y) {
        // Log-sum-exp in f64: the reported number, not a training signal.
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let lse = max
            + row
                .iter()
                .map(|&v| (f64::from(v) - max).exp())
                .sum::<f64>()
                .ln();
        loss += lse - f64::from(row[label as usize]);
    }
    let hits = model::argmax_rows(&logits, classes)
        .iter()
        .zip(&samples.y)
        .filter(|(p, y)| **p == **y as usize)
        .count();
    let n = samples.len().max(1) as f64;
    Ok(Eval {
        loss: loss / n,
        accuracy: hits as f64 / n,
    })
}

#[derive(Debug)]
pub struct Outcome {
    /// The last step taken (or found already taken).
    pub step: u64,
    /// The final checkpoint, when the run finished.
    pub finished: Option<PathBuf>,
    pub eval: Option<Eval>,
    /// Seconds of training in this process.
    pub seconds: f64,
    /// Stopped by SIGTERM after committing `step` (see `stop`).
    pub stopped: bool,
}

fn state_at(hyper: &Hyper, step: u64, data: &Data) -> TrainState {
    let spe = data::steps_per_epoch(data.train.len(), hyper.batch_size);
    TrainState {
        format: STATE_FORMAT,
        workload: hyper.workload,
        step,
        epoch: step / spe,
        batch_in_epoch: step % spe,
        steps_per_epoch: spe,
        seed: hyper.seed,
        data_order: DATA_ORDER.to_string(),
        hyperparameters: hyper.clone(),
        train_samples: data.train.len(),
        eval_samples: data.eval.len(),
    }
}

fn json_bytes<T: Serialize>(value: &T) -> anyhow::Result<Vec<u8>> {
    let mut v = serde_json::to_vec_pretty(value)?;
    v.push(b'\n');
    Ok(v)
}

/// Runs the plan to the end (or to `stop_after_step`), writing report lines
/// to `out`.
pub fn run(plan: &Plan, out: &mut dyn Write) -> anyhow::Result<Outcome> {
    let t0 = Instant::now();
    let hyper = &plan.hyper;
    let settings = &plan.settings;
    let workload = hyper.workload;
    let data = data::load(workload, &plan.data_path)?;
    if hyper.batch_size > data.train.len() {
        bail!(
            "batch_size {} is larger than the {} training samples",
            hyper.batch_size,
            data.train.len()
        );
    }

    let (model, mut adam, start, prior_wall) = match &plan.resume {
        None => {
            let model = Model::init(workload, hyper.seed)?;
            let adam = Adam::new(hyper.adam, &model.params)?;
            (model, adam, 0, 0.0)
        }
        Some((ckpt, state)) => {
            if (state.train_samples, state.eval_samples) != (data.train.len(), data.eval.len()) {
                bail!(
                    "the data changed since {}: it had {} train / {} eval samples, {} has {} / {}",
                    ckpt.dir.display(),
                    state.train_samples,
                    state.eval_samples,
                    plan.data_path.display(),
                    data.train.len(),
                    data.eval.len()
                );
            }
            let model = Model::from_safetensors(workload, ckpt.file(WEIGHTS)?)
                .with_context(|| format!("{}: {WEIGHTS}", ckpt.dir.display()))?;
            let adam = Adam::from_safetensors(hyper.adam, &model.params, ckpt.file(OPTIMIZER)?)
                .with_context(|| format!("{}: {OPTIMIZER}", ckpt.dir.display()))?;
            if adam.t != state.step {
                bail!(
                    "{}: the optimizer has taken {} steps, {STATE} says {}",
                    ckpt.dir.display(),
                    adam.t,
                    state.step
                );
            }
            (model, adam, state.step, ckpt.manifest.wall_time)
        }
    };
    let names: Vec<&str> = model.params.iter().map(|(n, _)| *n).collect();
    eprintln!(
        "edgeloop-train: {workload}: {} train / {} eval samples from {}; {}",
        data.train.len(),
        data.eval.len(),
        plan.data_path.display(),
        match &plan.resume {
            Some((c, _)) => format!("resumed at step {start} from {}", c.dir.display()),
            None => "starting at step 0".to_string(),
        }
    );
    if start >= hyper.steps {
        eprintln!("edgeloop-train: the checkpoint is the last step ({start}); nothing to do");
        return Ok(Outcome {
            step: start,
            finished: None,
            eval: None,
            seconds: 0.0,
            stopped: false,
        });
    }

    let dev = Device::Cpu;
    let mut batcher = Batcher::new(hyper.seed, data.train.len(), hyper.batch_size);
    let mut last_checkpoint = Instant::now();
    let cadence = &settings.cadence;
    let url = settings.report_url.as_deref();
    let wall = |t0: &Instant| prior_wall + t0.elapsed().as_secs_f64();

    for step in start + 1..=hyper.steps {
        let index = step - 1;
        let mut batch = data.train.select(batcher.indices(index));
        if workload == Workload::MnistCnn {
            data::shift_images(&mut batch.x, hyper.seed, index, hyper.shift);
        }
        let mut shape = vec![batch.len()];
        shape.extend_from_slice(&batch.sample_shape);
        let x = Tensor::from_vec(batch.x, shape, &dev)?;
        let y = Tensor::from_vec(batch.y, hyper.batch_size, &dev)?;
        let (loss, hits) = model::loss_and_hits(&model.forward(&x)?, &y)?;
        let grads = loss.backward()?;
        let lr = hyper.lr_at(index);
        adam.step(&model.params, &grads, lr)?;
        let loss = loss.to_scalar::<f32>()?;
        if !loss.is_finite() {
            bail!("the loss is {loss} at step {step}: training diverged (lower learning_rate)");
        }
        // f32 -> f64 is exact, so the reported loss is the computed one.
        let mut metrics = BTreeMap::from([
            ("loss".to_string(), f64::from(loss)),
            (
                "accuracy".to_string(),
                hits as f64 / hyper.batch_size as f64,
            ),
            ("learning_rate".to_string(), lr),
        ]);
        let last = step == hyper.steps;
        if step % cadence.report_every == 0 || last {
            report::report(out, url, step, &metrics)?;
        }
        let due = cadence
            .checkpoint_every_steps
            .is_some_and(|n| step % n == 0)
            || cadence
                .checkpoint_every_minutes
                .is_some_and(|m| last_checkpoint.elapsed().as_secs_f64() >= m * 60.0)
            || settings.stop_after_step == Some(step)
            || stop::requested();
        if !(due || last) {
            continue;
        }
        let weights = model.to_safetensors()?;
        let optimizer = adam
            .to_safetensors(&names)
            .map_err(|e| anyhow::anyhow!("{OPTIMIZER}: {e}"))?;
        let state = json_bytes(&state_at(hyper, step, &data))?;
        let mut files: Vec<(&str, Vec<u8>)> =
            vec![(WEIGHTS, weights), (OPTIMIZER, optimizer), (STATE, state)];
        let mut eval = None;
        if last {
            let e = evaluate(&model, &data.eval)?;
            metrics.insert("eval_loss".into(), e.loss);
            metrics.insert("eval_accuracy".into(), e.accuracy);
            files.extend(export_files(&model, &data, e)?);
            eval = Some(e);
        }
        let borrowed: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let dir = checkpoint::write(
            &settings.checkpoint_dir,
            step,
            &borrowed,
            metrics.clone(),
            wall(&t0),
        )?;
        last_checkpoint = Instant::now();
        if let Some(e) = eval {
            let final_metrics = BTreeMap::from([
                ("eval_loss".to_string(), e.loss),
                ("eval_accuracy".to_string(), e.accuracy),
            ]);
            report::report(out, url, step, &final_metrics)?;
            eprintln!(
                "edgeloop-train: {workload}: {step} steps in {:.1}s; eval accuracy {:.4}, loss {:.4}; exported {}",
                t0.elapsed().as_secs_f64(),
                e.accuracy,
                e.loss,
                dir.join(MODEL_ONNX).display()
            );
            return Ok(Outcome {
                step,
                finished: Some(dir),
                eval,
                seconds: t0.elapsed().as_secs_f64(),
                stopped: false,
            });
        }
        if settings.stop_after_step == Some(step) {
            eprintln!(
                "edgeloop-train: stopping after step {step} as asked ({})",
                dir.display()
            );
            return Ok(Outcome {
                step,
                finished: None,
                eval: None,
                seconds: t0.elapsed().as_secs_f64(),
                stopped: false,
            });
        }
        if stop::requested() {
            eprintln!(
                "edgeloop-train: SIGTERM: committed step {step} ({}); exiting with {}",
                dir.display(),
                stop::EXIT_STOPPED
            );
            return Ok(Outcome {
                step,
                finished: None,
                eval: None,
                seconds: t0.elapsed().as_secs_f64(),
                stopped: true,
            });
        }
    }
    // The loop returns at its last step; reaching here means no steps ran.
    bail!("no steps to run from step {start} to {}", hyper.steps)
}

/// The files the last checkpoint carries besides the training state.
fn export_files(
    model: &Model,
    data: &Data,
    eval: Eval,
) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    let onnx = edgeloop_models::onnx::encode(&export::to_onnx(model)?)?;
    let eval_npz = export::to_npz(&data.eval, true)?.to_bytes()?;
    let calib = data.train.head(CALIB_SAMPLES);
    let calib_npz = export::to_npz(&calib, false)?.to_bytes()?;
    // No timings: the same weights give the same file.
    let metrics = serde_json::json!({
        "workload": model.workload,
        "eval_accuracy": eval.accuracy,
        "eval_loss": eval.loss,
        "eval_samples": data.eval.len(),
        "train_samples": data.train.len(),
        "calibration_samples": calib.len(),
        "onnx": {
            "file": MODEL_ONNX,
            "input": export::INPUT,
            "output": export::OUTPUT,
            "opset": export::OPSET,
        },
    });
    Ok(vec![
        (MODEL_ONNX, onnx),
        (EVAL_NPZ, eval_npz),
        (CALIB_NPZ, calib_npz),
        (METRICS, json_bytes(&metrics)?),
    ])
}
