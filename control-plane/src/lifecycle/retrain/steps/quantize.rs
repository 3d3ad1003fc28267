//! The Quantize step: the package gate on the export over the snapshot
//! (calibration rows from its training part, evaluation on its eval part),
//! the version's own artifact and each variant policy's, signed.
//!
//! With a latency policy the step takes several polls: the first runs the
//! gate and queues a benchmark of float and each candidate within budget
//! on the hardware class's representative device (found again by its
//! origin, `<pipeline>/quantize/<attempt>`); the last, once the device has
//! reported, runs the gate again, checks that it made the very models the
//! device timed (quantization is deterministic; the digests must match),
//! judges latency with the device's timings and signs. Running the gate
//! twice costs a second pass over the evaluation set, and keeps nothing
//! between polls but the benchmark record, so a restart resumes cleanly.

use edgeloop_api::benchmarks::{BenchmarkModel, BenchmarkState, BenchmarkView, CreateBenchmark};
use edgeloop_api::pipelines::LatencyPolicy;
use edgeloop_models::quantize::gate::{
    judge_latency_on, run_gate, to_time_on_device, GateOutcome, LatencyGate,
};

use edgeloop_models::dataset::feature_names_of;

use super::*;
use crate::fleet::benchmarks;

/// Calibration rows for static quantization: the newest training rows are
/// the closest to what the devices see now.
const CALIBRATION_ROWS: usize = 512;

fn with_rows(npz: Npz, keep_last: usize) -> Npz {
    let mut out = Npz::new();
    for (name, t) in npz.iter() {
        let n = t.shape().first().copied().unwrap_or(0);
        out.insert(
            name,
            edgeloop_models::dataset::slice_rows(t, n.saturating_sub(keep_last), n),
        );
    }
    out
}

/// What the gate runs on, read from the pipeline's earlier outputs.
struct Inputs {
    model_bytes: Vec<u8>,
    snapshot: Vec<u8>,
    identity: Identity,
}

async fn inputs(core: &Core, p: &Pipeline) -> Result<Inputs, StepError> {
    let Output::Onnx {
        digest: onnx_digest,
    } = output(p, Step::Export)?
    else {
        return Err(StepError::fatal("the export step's output is not a model"));
    };
    let data_digest = snapshot_of(p)?;
    let Output::Job {
        id: job,
        checkpoint,
    } = output(p, Step::Train)?
    else {
        return Err(StepError::fatal("the training step's output is not a job"));
    };
    let model_bytes = read_artifact(core, *onnx_digest).await?;
    let snapshot = read_artifact(core, data_digest).await?;
    let version = next_version(core, &p.model)?;
    let serving = serving_version(core, &p.model)?;
    // The serving version's feature names, so drift keeps naming the same
    // columns the same way across versions.
    let feature_names = match &serving {
        Some(v) => manifest_of(core, v)
            .await?
            .and_then(|m| m.manifest.reference_stats.as_ref().map(feature_names_of))
            .unwrap_or_default(),
        None => Default::default(),
    };
    let parent = serving.map(|v| v.version);
    Ok(Inputs {
        model_bytes,
        snapshot,
        identity: Identity {
            name: p.model.clone(),
            feature_names,
            version,
            lineage: ManifestLineage {
                job: Some(job.clone()),
                checkpoint: Some(*checkpoint),
                dataset: Some(data_digest),
                parent_version: parent,
            },
            // A pipeline sets no floor: an operator does, deliberately.
            min_version: None,
            rollback: false,
        },
    })
}

/// The decoded model and its calibration and evaluation sets. Blocking.
fn prepare(inputs: &Inputs) -> Result<(onnx::ir::ModelProto, Dataset, Dataset), StepError> {
    let model = onnx::decode(&inputs.model_bytes).map_err(|e| StepError::fatal(e.to_string()))?;
    let io = onnx::inspect(&model).inputs;
    let first = io
        .first()
        .ok_or_else(|| StepError::fatal("the model has no inputs"))?
        .name
        .clone();
    let snapshot =
        Npz::from_bytes(&inputs.snapshot).map_err(|e| StepError::fatal(e.to_string()))?;
    let part = |eval: bool| -> Result<Dataset, StepError> {
        let npz = dataset::part_for_model(&snapshot, &first, eval).map_err(StepError::fatal)?;
        let npz = if eval {
            npz
        } else {
            with_rows(npz, CALIBRATION_ROWS)
        };
        Dataset::from_npz(&npz, "the dataset snapshot", &io, eval)
            .map_err(|e| StepError::fatal(e.to_string()))
    };
    Ok((model, part(false)?, part(true)?))
}

fn runtime() -> Result<OrtRuntime, StepError> {
    OrtRuntime::load(None).map_err(|e| StepError::fatal(format!("ONNX Runtime: {e}")))
}

/// The pipeline's sets are labelled: top-1 accuracy, in points.
fn gate_options(config: &RetrainingConfig) -> GateOptions {
    GateOptions {
        task: Some(Task::Classification),
        budget: Some(config.quantization_budget_points),
        ..GateOptions::default()
    }
}

pub(super) async fn quantize(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
    attempt: u32,
    now: OffsetDateTime,
) -> Poll {
    let Some(latency) = &config.latency else {
        return finish(core, p, config, inputs(core, p).await?, None)
            .await
            .map(Some);
    };
    // The policy refuses both at once; this pipeline started under another.
    if !p.signing.is_control_plane() {
        return Err(StepError::fatal(
            "the policy now has a latency gate, whose device benchmark runs models the control \
             plane signs, but this pipeline signs offline",
        ));
    }
    let origin = format!("{}/quantize/{attempt}", p.id);
    // The artifacts are read only when the gate runs, not on every poll
    // while the device works.
    match benchmarks::find_by_origin(&core.store, &origin, now)? {
        None => {
            start_benchmark(core, config, latency, inputs(core, p).await?, origin).await?;
            Ok(None)
        }
        Some(b) if !b.state.is_finished() => Ok(None),
        Some(b) if b.state == BenchmarkState::Failed => Err(StepError::transient(format!(
            "benchmark {} on device {} failed: {}",
            b.id,
            b.device,
            b.reason.as_deref().unwrap_or("no reason given")
        ))),
        Some(b) => finish(
            core,
            p,
            config,
            inputs(core, p).await?,
            Some((b.view(), latency)),
        )
        .await
        .map(Some),
    }
}

/// Runs the gate and queues the benchmark of what it made: float and each
/// candidate within budget, with one call's inputs (the first eval sample).
async fn start_benchmark(
    core: &Core,
    config: &RetrainingConfig,
    latency: &LatencyPolicy,
    inputs: Inputs,
    origin: String,
) -> Result<(), StepError> {
    let opts = gate_options(config);
    let key_path = signing_key_path(core);
    let model_name = inputs.identity.name.clone();
    let (models, probe) = blocking(move || {
        let (model, calibration, eval) = prepare(&inputs)?;
        let outcome = run_gate(&runtime()?, &model, &calibration, &eval, &opts)
            .map_err(|e| StepError::fatal(format!("quantization: {e:#}")))?;
        // Signed, so a device that runs only signed models times them.
        let key = package::load_or_create_key(&key_path)
            .map_err(|e| StepError::transient(format!("{e:#}")))?;
        let mut models = Vec::new();
        for (name, bytes, m) in encode_to_time(&outcome, &model)? {
            let manifest =
                package::sign_for_benchmark(&bytes, m, inputs.identity.clone(), &name, &key)
                    .and_then(|s| Ok(s.to_json_pretty()?))
                    .map_err(|e| {
                        StepError::fatal(format!("signing {name} for the benchmark: {e}"))
                    })?;
            models.push((name, bytes, manifest.into_bytes()));
        }
        let probe = package::ProbeInputs::first_call(&eval, 1000.0)
            .map_err(|e| StepError::fatal(e.to_string()))?;
        Ok((models, probe.npz))
    })
    .await?;
    let mut entries = Vec::with_capacity(models.len());
    for (name, bytes, manifest) in models {
        entries.push(BenchmarkModel {
            name,
            artifact_digest: put_artifact(core, bytes).await?,
            manifest_digest: Some(put_artifact(core, manifest).await?),
        });
    }
    let request = CreateBenchmark {
        device: None,
        selector: Some(latency.benchmark_selector.clone()),
        models: entries,
        inputs_digest: put_artifact(core, probe).await?,
        runs: latency.runs,
        timeout_seconds: latency.timeout_seconds,
    };
    // On the model's own project's devices only.
    let project = [edgeloop_registry::models::project_of(
        &core.store.registry,
        &model_name,
    )?]
    .into();
    let queued = benchmarks::create(core, request, Some(origin), Some(&project))
        .await
        .map_err(|e| match e {
            // No online device of the class now: one may be back by the
            // next attempt.
            Error::Conflict(m) => StepError::transient(m),
            other => other.into(),
        })?;
    tracing::info!(benchmark = %queued.id, device = %queued.device, models = queued.models.len(), "quantization: timing candidates on a device");
    Ok(())
}

/// A model to time: its name, its bytes and the model itself.
type Encoded<'a> = (String, Vec<u8>, &'a onnx::ir::ModelProto);

/// Float and each candidate within budget, encoded. Blocking.
fn encode_to_time<'a>(
    outcome: &'a GateOutcome,
    float: &'a onnx::ir::ModelProto,
) -> Result<Vec<Encoded<'a>>, StepError> {
    to_time_on_device(outcome, float)
        .into_iter()
        .map(|(name, m)| {
            let bytes = onnx::encode(m).map_err(|e| StepError::fatal(format!("{name}: {e}")))?;
            Ok((name, bytes, m))
        })
        .collect()
}

/// The gate (judged on the device when `timed` holds its benchmark), the
/// version and its variants: signed with the control plane's key, or left
/// unsigned for a key kept elsewhere (offline signing), per the pipeline.
async fn finish(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
    inputs: Inputs,
    timed: Option<(BenchmarkView, &LatencyPolicy)>,
) -> Result<Output, StepError> {
    // Offline, the control plane neither reads nor creates a signing key.
    let key_path = p.signing.is_control_plane().then(|| signing_key_path(core));
    let opts = gate_options(config);
    let budget = config.quantization_budget_points;
    let policies = config.variants.clone();
    let timed = timed.map(|(view, policy)| {
        let rule = match policy.max_latency_ms {
            Some(max_ms) => LatencyGate::Budget { max_ms },
            None => LatencyGate::NotSlowerThanFloat { tolerance: 0.10 },
        };
        (view, rule)
    });
    let (own, variants) = blocking(move || {
        let (model, calibration, eval) = prepare(&inputs)?;
        let runtime = runtime()?;
        let key = key_path
            .map(|path| package::load_or_create_key(&path))
            .transpose()
            .map_err(|e| StepError::transient(format!("{e:#}")))?;
        let mut outcome = run_gate(&runtime, &model, &calibration, &eval, &opts)
            .map_err(|e| StepError::fatal(format!("quantization: {e:#}")))?;
        if let Some((view, rule)) = &timed {
            check_timed_models(&outcome, &model, view)?;
            judge_latency_on(
                &mut outcome,
                &model,
                &view.timings(),
                *rule,
                view.timed_on(),
            )
            .map_err(|e| StepError::transient(format!("latency on the device: {e}")))?;
        }
        let own =
            package::describe_outcome(&runtime, outcome, &eval, inputs.identity.clone(), None)
                .and_then(|u| Built::new(u, key.as_ref()))
                .map_err(|e| StepError::fatal(format!("quantization: {e:#}")))?;
        let mut variants = Vec::new();
        for policy in policies {
            // Its own gate, over its own candidates. Speed is never gated
            // here (GateOptions' default): it runs on other providers.
            let opts = GateOptions {
                task: Some(Task::Classification),
                budget: Some(budget),
                candidates: policy
                    .candidates
                    .iter()
                    .filter_map(|c| Candidate::from_label(c))
                    .collect(),
                ..GateOptions::default()
            };
            let built = run_gate(&runtime, &model, &calibration, &eval, &opts)
                .map_err(package::PackageError::from)
                .and_then(|outcome| {
                    package::describe_outcome(
                        &runtime,
                        outcome,
                        &eval,
                        inputs.identity.clone(),
                        None,
                    )
                })
                .and_then(|u| Built::new(u, key.as_ref()))
                .map_err(|e| {
                    StepError::fatal(format!("quantization of variant {}: {e:#}", policy.name))
                })?;
            variants.push((policy, built));
        }
        Ok((own, variants))
    })
    .await?;
    let artifact = put_artifact(core, own.artifact).await?;
    let manifest = put_artifact(core, own.manifest).await?;
    tracing::info!(pipeline = %p.id, chosen = %own.chosen, reason = %own.reason, signed = own.signed, "quantization gate");
    let mut built = Vec::new();
    for (policy, v) in variants {
        tracing::info!(pipeline = %p.id, variant = %policy.name, chosen = %v.chosen, reason = %v.reason, "quantization gate of a variant");
        built.push(QuantizedVariant {
            name: policy.name,
            digest: put_artifact(core, v.artifact).await?,
            method: v.chosen,
            manifest: put_artifact(core, v.manifest).await?,
            providers: policy.providers,
        });
    }
    Ok(if own.signed {
        Output::Quantized {
            digest: artifact,
            method: own.chosen,
            manifest,
            version: own.version,
            variants: built,
        }
    } else {
        Output::Unsigned {
            digest: artifact,
            method: own.chosen,
            manifest,
            version: own.version,
            variants: built,
        }
    })
}

/// A model the gate chose, with its manifest's JSON: signed when a key
/// was given, else the manifest itself for a signer elsewhere.
struct Built {
    artifact: Vec<u8>,
    manifest: Vec<u8>,
    signed: bool,
    chosen: String,
    reason: String,
    version: String,
}

impl Built {
    fn new(
        u: package::Unsigned,
        key: Option<&edgeloop_models::manifest::ManifestKey>,
    ) -> Result<Built, package::PackageError> {
        let (chosen, reason) = (u.outcome.chosen.clone(), u.outcome.reason.clone());
        let version = u.manifest.version.clone();
        let (artifact, manifest) = match key {
            Some(key) => {
                let p = u.sign(key)?;
                (p.artifact, p.manifest.to_json_pretty()?.into_bytes())
            }
            None => (
                u.artifact,
                serde_json::to_vec_pretty(&u.manifest).map_err(|e| {
                    edgeloop_models::manifest::ManifestError::Invalid {
                        field: "manifest".into(),
                        reason: e.to_string(),
                    }
                })?,
            ),
        };
        Ok(Built {
            artifact,
            manifest,
            signed: key.is_some(),
            chosen,
            reason,
            version,
        })
    }
}

/// The gate made again exactly the models the device timed: the same
/// names and digests. A difference (another ONNX Runtime since, say) means
/// the timings are of other models; the attempt fails, retryably, and the
/// next one benchmarks afresh.
fn check_timed_models(
    outcome: &GateOutcome,
    float: &onnx::ir::ModelProto,
    view: &BenchmarkView,
) -> Result<(), StepError> {
    let made: BTreeMap<String, Digest> = encode_to_time(outcome, float)?
        .into_iter()
        .map(|(name, bytes, _)| (name, Digest::of(&bytes)))
        .collect();
    let timed: BTreeMap<String, Digest> = view
        .models
        .iter()
        .map(|m| (m.name.clone(), m.artifact_digest))
        .collect();
    if made != timed {
        return Err(StepError::transient(format!(
            "the gate made other models than benchmark {} timed ({:?} vs {:?})",
            view.id,
            made.keys().collect::<Vec<_>>(),
            timed.keys().collect::<Vec<_>>()
        )));
    }
    Ok(())
}
