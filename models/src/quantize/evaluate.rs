//! Running a model over an evaluation set and keeping every output, per
//! sample, for `task` to score. A stateful model runs its calls in order,
//! each state output fed back into its input.

use std::collections::HashMap;
use std::time::Instant;

use super::task::{StatePair, Task};
use super::QuantizeError;
use crate::dataset::{Dataset, Layout};
use crate::onnx::{self, ir};
use crate::runtime::{ModelSession, OrtRuntime, SessionOptions};
use crate::tensor::Tensor;

/// One output of one sample: a row of a batch (batch axis removed), or a
/// call's whole tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Every sample's outputs, in the model's output order (state outputs left
/// out for a stateful model).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outputs {
    pub names: Vec<String>,
    pub samples: Vec<Vec<Row>>,
}

impl Outputs {
    /// The name of the first output holding NaN or an infinity.
    pub fn first_non_finite(&self) -> Option<&str> {
        for s in &self.samples {
            for (i, r) in s.iter().enumerate() {
                if r.values.iter().any(|v| !v.is_finite()) {
                    return Some(self.names.get(i).map_or("?", String::as_str));
                }
            }
        }
        None
    }
}

pub(crate) fn single_thread() -> SessionOptions {
    // One thread: steadier timings on a shared machine, and the edge case.
    SessionOptions {
        intra_op_threads: 1,
        ..SessionOptions::default()
    }
}

/// A session for `model`: from its bytes in memory, or, for a model over
/// protobuf's 2 GiB (weights read in from external data), from a copy
/// written with external data into a temporary directory. ONNX Runtime has
/// read (or mapped) the copy once the session exists, so the directory goes
/// right away; its disk space is back when the session is dropped.
pub(crate) fn session_for(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    options: &SessionOptions,
) -> Result<ModelSession, QuantizeError> {
    match onnx::encode(model) {
        Ok(bytes) => Ok(runtime.session(&bytes, options)?),
        Err(onnx::EncodeError::TooLarge(_)) => {
            let dir = tempfile::tempdir().map_err(QuantizeError::TempDir)?;
            let path = onnx::save_with_external_data(model, dir.path(), "model.onnx")?;
            Ok(runtime.session_from_file(&path, options)?)
        }
        Err(e) => Err(e.into()),
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    match t {
        Tensor::F32(a) => a.iter().copied().collect(),
        Tensor::F64(a) => a.iter().map(|&v| v as f32).collect(),
        Tensor::F16(a) => a.iter().map(|v| v.to_f32()).collect(),
        Tensor::I8(a) => a.iter().map(|&v| f32::from(v)).collect(),
        Tensor::U8(a) => a.iter().map(|&v| f32::from(v)).collect(),
        Tensor::I32(a) => a.iter().map(|&v| v as f32).collect(),
        Tensor::I64(a) => a.iter().map(|&v| v as f32).collect(),
        Tensor::Bool(a) => a.iter().map(|&v| f32::from(u8::from(v))).collect(),
    }
}

/// Runs `model` over `data` for `task`.
pub fn collect(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    data: &Dataset,
    task: &Task,
) -> Result<Outputs, QuantizeError> {
    let mut session = session_for(runtime, model, &single_thread())?;
    let state: &[StatePair] = match task {
        Task::Stateful { state } => {
            if data.layout != Layout::PerCall {
                return Err(QuantizeError::Data(
                    "a stateful model's evaluation set must be per call (each array one axis more than its input), in call order".into(),
                ));
            }
            state
        }
        _ => &[],
    };
    let mut out = Outputs::default();
    let mut carried: HashMap<String, Tensor> = HashMap::new();
    for batch in &data.batches {
        let inputs: Vec<(&str, &Tensor)> = batch
            .iter()
            .map(|(n, t)| (n.as_str(), carried.get(n).unwrap_or(t)))
            .collect();
        let outputs = session.run(&inputs)?;
        if out.names.is_empty() {
            out.names = outputs
                .iter()
                .map(|(n, _)| n.clone())
                .filter(|n| !state.iter().any(|p| p.output == *n))
                .collect();
            if out.names.is_empty() {
                return Err(QuantizeError::Data(
                    "the model has no outputs besides its state".into(),
                ));
            }
        }
        let mut kept = vec![];
        for (name, t) in outputs {
            if let Some(p) = state.iter().find(|p| p.output == name) {
                carried.insert(p.input.clone(), t);
            } else {
                kept.push(t);
            }
        }
        if state.iter().any(|p| !carried.contains_key(&p.input)) {
            return Err(QuantizeError::Data(format!(
                "state outputs {:?} not all produced",
                state.iter().map(|p| &p.output).collect::<Vec<_>>()
            )));
        }
        match data.layout {
            Layout::PerCall => out.samples.push(
                kept.iter()
                    .map(|t| Row {
                        shape: t.shape().to_vec(),
                        values: values(t),
                    })
                    .collect(),
            ),
            Layout::Batched => {
                let rows = batch
                    .first()
                    .map_or(0, |(_, t)| t.shape().first().copied().unwrap_or(0));
                let mut per_row: Vec<Vec<Row>> = vec![vec![]; rows];
                for (name, t) in out.names.iter().zip(&kept) {
                    if t.shape().first() != Some(&rows) {
                        return Err(QuantizeError::Data(format!(
                            "output {name:?} has shape {:?}: axis 0 is not the batch of {rows}",
                            t.shape()
                        )));
                    }
                    let v = values(t);
                    let width = v.len() / rows.max(1);
                    for (i, r) in per_row.iter_mut().enumerate() {
                        r.push(Row {
                            shape: t.shape()[1..].to_vec(),
                            values: v[i * width..(i + 1) * width].to_vec(),
                        });
                    }
                }
                out.samples.extend(per_row);
            }
        }
    }
    Ok(out)
}

/// Median latency of one call (`Dataset::timing_sample`) over `runs`, after
/// warm-up, on this machine's CPU with one thread.
pub fn median_latency_ms(
    runtime: &OrtRuntime,
    model: &ir::ModelProto,
    data: &Dataset,
    runs: usize,
) -> Result<f64, QuantizeError> {
    let mut session = session_for(runtime, model, &single_thread())?;
    let sample = data
        .timing_sample()
        .ok_or_else(|| QuantizeError::Data("the dataset has no batches to time".into()))?;
    let inputs: Vec<(&str, &Tensor)> = sample.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for _ in 0..3 {
        session.run(&inputs)?;
    }
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        session.run(&inputs)?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
