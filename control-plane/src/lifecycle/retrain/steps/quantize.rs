//! The Quantize step: the package gate on the export over the snapshot
//! (calibration rows from its training part, evaluation on its eval part),
//! the version's own artifact and each variant policy's, signed.

use super::*;

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

pub(super) async fn quantize(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
) -> Result<Output, StepError> {
    let Output::Onnx {
        digest: onnx_digest,
    } = output(p, Step::Export)?
    else {
        return Err(StepError::fatal("the export step's output is not a model"));
    };
    let data = snapshot_of(p)?;
    let Output::Job {
        id: job,
        checkpoint,
    } = output(p, Step::Train)?
    else {
        return Err(StepError::fatal("the training step's output is not a job"));
    };
    let model_bytes = read_artifact(core, *onnx_digest).await?;
    let data_digest = data;
    let snapshot = read_artifact(core, data_digest).await?;
    let version = next_version(core, &p.model)?;
    let parent = serving_version(core, &p.model)?.map(|v| v.version);
    let identity = Identity {
        name: p.model.clone(),
        version: version.clone(),
        lineage: ManifestLineage {
            job: Some(job.clone()),
            checkpoint: Some(*checkpoint),
            dataset: Some(data_digest),
            parent_version: parent,
        },
    };
    let key_path = signing_key_path(core);
    let budget = config.quantization_budget_points;
    let policies = config.variants.clone();
    let (packaged, variants) = blocking(move || {
        let model = onnx::decode(&model_bytes).map_err(|e| StepError::fatal(e.to_string()))?;
        let inputs = onnx::inspect(&model).inputs;
        let first = inputs
            .first()
            .ok_or_else(|| StepError::fatal("the model has no inputs"))?
            .name
            .clone();
        let snapshot = Npz::from_bytes(&snapshot).map_err(|e| StepError::fatal(e.to_string()))?;
        let part = |eval: bool| -> Result<Dataset, StepError> {
            let npz = dataset::part_for_model(&snapshot, &first, eval).map_err(StepError::fatal)?;
            let npz = if eval {
                npz
            } else {
                with_rows(npz, CALIBRATION_ROWS)
            };
            Dataset::from_npz(&npz, "the dataset snapshot", &inputs, eval)
                .map_err(|e| StepError::fatal(e.to_string()))
        };
        let (calibration, eval) = (part(false)?, part(true)?);
        let runtime =
            OrtRuntime::load(None).map_err(|e| StepError::fatal(format!("ONNX Runtime: {e}")))?;
        let key = package::load_or_create_key(&key_path)
            .map_err(|e| StepError::transient(format!("{e:#}")))?;
        // The pipeline's sets are labelled: top-1 accuracy, in points.
        let opts = GateOptions {
            task: Some(Task::Classification),
            budget: Some(budget),
            ..GateOptions::default()
        };
        let own = package::package(
            &runtime,
            &model,
            &calibration,
            &eval,
            &opts,
            identity.clone(),
            None,
            &key,
        )
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
            let packaged = package::package(
                &runtime,
                &model,
                &calibration,
                &eval,
                &opts,
                identity.clone(),
                None,
                &key,
            )
            .map_err(|e| {
                StepError::fatal(format!("quantization of variant {}: {e:#}", policy.name))
            })?;
            variants.push((policy, packaged));
        }
        Ok((own, variants))
    })
    .await?;
    let manifest_json = packaged
        .manifest
        .to_json_pretty()
        .map_err(|e| StepError::fatal(e.to_string()))?;
    let artifact = put_artifact(core, packaged.artifact).await?;
    let manifest = put_artifact(core, manifest_json.into_bytes()).await?;
    tracing::info!(pipeline = %p.id, chosen = %packaged.outcome.chosen, reason = %packaged.outcome.reason, "quantization gate");
    let mut built = Vec::new();
    for (policy, v) in variants {
        let json = v
            .manifest
            .to_json_pretty()
            .map_err(|e| StepError::fatal(e.to_string()))?;
        tracing::info!(pipeline = %p.id, variant = %policy.name, chosen = %v.outcome.chosen, reason = %v.outcome.reason, "quantization gate of a variant");
        built.push(QuantizedVariant {
            name: policy.name,
            digest: put_artifact(core, v.artifact).await?,
            method: v.outcome.chosen,
            manifest: put_artifact(core, json.into_bytes()).await?,
            providers: policy.providers,
        });
    }
    Ok(Output::Quantized {
        digest: artifact,
        method: packaged.outcome.chosen,
        manifest,
        version,
        variants: built,
    })
}
