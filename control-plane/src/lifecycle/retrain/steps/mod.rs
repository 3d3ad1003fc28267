//! The executors of a retraining pipeline's steps. Each is a poll:
//! called every tick while its step runs, it starts the step's work if it is
//! not started yet (idempotently: a job or deployment is found by a name
//! derived from `(pipeline, attempt)`, artifacts are content-addressed) and
//! returns its output once done. Compute steps (dataset, export, quantize,
//! compare) finish within one poll, on the blocking pool.

mod quantize;
mod snapshot;

use std::collections::BTreeMap;
use std::io::Read as _;

use edgeloop_models::dataset::Dataset;
use edgeloop_models::manifest::{DimSpec, Lineage as ManifestLineage, SignedManifest};
use edgeloop_models::npz::Npz;
use edgeloop_models::onnx;
use edgeloop_models::quantize::gate::{predictions, Candidate, GateOptions, GateOutcome};
use edgeloop_models::quantize::task::Task;
use edgeloop_models::runtime::OrtRuntime;
use edgeloop_models::Digest;
use time::OffsetDateTime;
use tokio::io::AsyncReadExt as _;

use super::dataset::{self, Rows};
use super::{RetrainingConfig, RetrainingPolicy};
use crate::db::Db;
use crate::fleet::deployments;
use crate::fleet::rollout::RolloutState;
use crate::lifecycle::jobs::{self, CreateJob, JobState};
use crate::lifecycle::pipeline::{Output, Pipeline, QuantizedVariant, Step};
use crate::Core;
use edgeloop_errors::Error;
use edgeloop_models::package::{self, Identity};
use edgeloop_registry::aliases::{self, AliasName};
use edgeloop_registry::checkpoints;
use edgeloop_registry::models::{
    self, CreateModelVersion, CreateVariant, Lineage, ModelVersionRecord,
};

/// Why a step did not succeed, and whether trying it again may help.
#[derive(Debug, Clone, PartialEq)]
pub struct StepError {
    pub reason: String,
    pub retryable: bool,
}

impl StepError {
    /// A failure that will fail the same way again (bad data, a failed
    /// job, a rolled-back rollout).
    pub fn fatal(reason: impl Into<String>) -> Self {
        StepError {
            reason: reason.into(),
            retryable: false,
        }
    }

    pub fn transient(reason: impl Into<String>) -> Self {
        StepError {
            reason: reason.into(),
            retryable: true,
        }
    }
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        match e {
            // The store or artifact store hiccuped: the next attempt may pass.
            Error::Internal(_) | Error::Unavailable(_) => StepError::transient(e.to_string()),
            other => StepError::fatal(other.to_string()),
        }
    }
}

impl From<edgeloop_store::StoreError> for StepError {
    fn from(e: edgeloop_store::StoreError) -> Self {
        StepError::transient(e.to_string())
    }
}

/// `Ok(None)`: still running, poll again next tick.
pub type Poll = Result<Option<Output>, StepError>;

pub async fn poll(
    core: &Core,
    p: &Pipeline,
    step: Step,
    attempt: u32,
    now: OffsetDateTime,
) -> Poll {
    let config = super::get_config(&core.store, &p.model).map_err(|_| {
        StepError::fatal(format!(
            "model {:?} has no retraining policy any more",
            p.model
        ))
    })?;
    match step {
        Step::BuildDataset => snapshot::build_dataset(core, p, &config).await,
        Step::Train => train(core, p, &config, attempt, now).await,
        Step::Export => export(core, p).await.map(Some),
        Step::Quantize => quantize::quantize(core, p, &config, attempt, now).await,
        // Never polled: the pipeline waits (`AwaitingSignature`) until the
        // signatures arrive through the API.
        Step::Sign => Ok(None),
        Step::Register => register(core, p, now).await.map(Some),
        Step::Compare => compare(core, p, &config).await.map(Some),
        Step::Deploy => deploy(core, p, &config, attempt, now).await,
        Step::ResetReference => reset_reference(core, p, now).await.map(Some),
    }
}

/// Stops what `step` started, if it is still going: its training job or
/// its rollout. Safe to repeat.
pub async fn abort(
    core: &Core,
    p: &Pipeline,
    step: Step,
    now: OffsetDateTime,
) -> Result<(), Error> {
    let attempts = p
        .history
        .iter()
        .filter(|r| r.step == step)
        .map(|r| r.attempt);
    match step {
        Step::Train => {
            for a in attempts {
                let id = job_id(p, a);
                if let Some(j) = core.store.lifecycle.jobs.get(&id)? {
                    if !j.state.is_terminal() {
                        jobs::cancel(&core.store, &id, now).await?;
                    }
                }
            }
        }
        Step::Deploy => {
            for a in attempts {
                if let Some(d) = find_deployment(core, &deploy_seed(p, a))? {
                    if !d.is_terminal() {
                        deployments::cancel(&core.store, &d.id, now).await?;
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

pub fn job_id(p: &Pipeline, attempt: u32) -> String {
    format!("{}-train-{attempt}", p.id)
}

fn deploy_seed(p: &Pipeline, attempt: u32) -> String {
    format!("{}-deploy-{attempt}", p.id)
}

fn output(p: &Pipeline, step: Step) -> Result<&Output, StepError> {
    p.output_of(step)
        .ok_or_else(|| StepError::fatal(format!("step {step:?} left no output")))
}

/// The dataset snapshot's digest (the first step's output).
fn snapshot_of(p: &Pipeline) -> Result<Digest, StepError> {
    match output(p, Step::BuildDataset)? {
        Output::Dataset { digest, .. } => Ok(*digest),
        _ => Err(StepError::fatal(
            "the dataset step's output is not a dataset",
        )),
    }
}

/// The registered version (the register step's output).
fn version_of(p: &Pipeline) -> Result<&str, StepError> {
    match output(p, Step::Register)? {
        Output::Version { version } => Ok(version),
        _ => Err(StepError::fatal(
            "the register step's output is not a version",
        )),
    }
}

async fn read_artifact(core: &Core, d: Digest) -> Result<Vec<u8>, StepError> {
    let size = core
        .artifacts
        .head(d)
        .await
        .map_err(|e| StepError::transient(e.to_string()))?
        .ok_or_else(|| StepError::fatal(format!("artifact {d} is not in the store")))?;
    if size > core.config.max_artifact_bytes {
        return Err(StepError::fatal(format!(
            "artifact {d} is {size} bytes, over the {} byte limit",
            core.config.max_artifact_bytes
        )));
    }
    let (_, mut reader) = core
        .artifacts
        .open_at(d, 0)
        .await
        .map_err(|e| StepError::transient(e.to_string()))?;
    let mut bytes = Vec::with_capacity(size as usize);
    reader
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| StepError::transient(format!("reading artifact {d}: {e}")))?;
    Ok(bytes)
}

async fn put_artifact(core: &Core, bytes: Vec<u8>) -> Result<Digest, StepError> {
    let d = Digest::of(&bytes);
    edgeloop_registry::artifacts::put_bytes(
        core.artifacts.as_ref(),
        bytes,
        core.config.max_artifact_bytes,
    )
    .await
    .map_err(|e| StepError::transient(format!("storing artifact {d}: {e}")))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StepError> + Send + 'static,
) -> Result<T, StepError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StepError::transient(format!("worker task: {e}")))?
}

/// The version the devices run now: the target of the model's newest
/// succeeded rollout, else its newest version.
pub fn serving_version(core: &Core, model: &str) -> Result<Option<ModelVersionRecord>, Error> {
    serving_in(&core.store, model)
}

fn serving_in(store: &Db, model: &str) -> Result<Option<ModelVersionRecord>, Error> {
    // Newest first, reading down only to the first match: a trigger tick
    // asks this of every model, and deployments pile up for months.
    let rolled = store
        .fleet
        .deployments
        .page_before("", None, 1, |_, d| {
            d.deployment.model == model && d.deployment.state == RolloutState::Succeeded
        })?
        .into_iter()
        .next()
        .map(|(_, d)| d);
    if let Some(d) = rolled {
        return Ok(Some(models::get_version(
            &store.registry,
            model,
            &d.deployment.target_version,
        )?));
    }
    let mut all = models::list_versions(&store.registry, model)?;
    all.sort_by_key(|v| v.created_at);
    Ok(all.pop())
}

async fn manifest_of(
    core: &Core,
    v: &ModelVersionRecord,
) -> Result<Option<SignedManifest>, StepError> {
    match v.manifest_digest {
        Some(m) => Ok(Some(
            models::read_manifest(core.artifacts.as_ref(), m, "manifest_digest").await?,
        )),
        None => Ok(None),
    }
}

async fn train(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
    attempt: u32,
    now: OffsetDateTime,
) -> Poll {
    let data = snapshot_of(p)?;
    let id = job_id(p, attempt);
    let job = match core.store.lifecycle.jobs.get(&id)? {
        Some(j) => j,
        None => {
            let mut spec = config.job.clone();
            let mut datasets = vec![serde_json::Value::String(format!(
                "edgeloop-artifact://sha256:{data}"
            ))];
            if let Some(more) = spec["datasets"].as_array() {
                datasets.extend(more.iter().cloned());
            }
            spec["datasets"] = serde_json::Value::Array(datasets);
            let (job, _) = jobs::create_with_id(
                &core.store,
                &id,
                CreateJob {
                    spec,
                    cluster: config.cluster.clone(),
                    project: Some(edgeloop_registry::models::project_of(
                        &core.store.registry,
                        &p.model,
                    )?),
                },
                now,
            )
            .await?;
            core.events
                .publish(crate::fleet::FleetEvent::JobChanged { job: id.clone() });
            job
        }
    };
    match job.state {
        JobState::Succeeded => {
            let last = checkpoints::latest(&core.store.registry, &id)?.ok_or_else(|| {
                StepError::fatal(format!(
                    "training job {id} succeeded but uploaded no checkpoint"
                ))
            })?;
            Ok(Some(Output::Job {
                id,
                checkpoint: last.digest,
            }))
        }
        JobState::Failed => Err(StepError::fatal(format!(
            "training job {id} failed: {}",
            job.last_message
        ))),
        JobState::Cancelled => Err(StepError::fatal(format!("training job {id} was cancelled"))),
        JobState::Queued | JobState::Leased | JobState::Running => Ok(None),
    }
}

/// The file a checkpoint must carry for export (the checkpoint contract's
/// final-step files; see docs/checkpoint-contract.md).
pub const CHECKPOINT_MODEL: &str = "model.onnx";

async fn export(core: &Core, p: &Pipeline) -> Result<Output, StepError> {
    let Output::Job { checkpoint, .. } = output(p, Step::Train)? else {
        return Err(StepError::fatal("the training step's output is not a job"));
    };
    let zip = read_artifact(core, *checkpoint).await?;
    let onnx_bytes = blocking(move || {
        let bytes = model_of_checkpoint(zip, onnx::MAX_MODEL_BYTES as u64)?;
        let model = onnx::decode(&bytes)
            .map_err(|e| StepError::fatal(format!("{CHECKPOINT_MODEL} is not ONNX: {e}")))?;
        onnx::validate(&model, None).map_err(|e| {
            StepError::fatal(format!("{CHECKPOINT_MODEL} is not a valid model: {e}"))
        })?;
        Ok(bytes)
    })
    .await?;
    let d = put_artifact(core, onnx_bytes).await?;
    Ok(Output::Onnx { digest: d })
}

/// The checkpoint zip's `model.onnx`, read up to `cap` bytes (one
/// protobuf holds at most 2 GiB; a larger model needs external data, which
/// a checkpoint does not carry). Capped as it is read: the zip's declared
/// size is the trainer's word, and a small archive can inflate to far
/// more than any model. Blocking.
fn model_of_checkpoint(zip: Vec<u8>, cap: u64) -> Result<Vec<u8>, StepError> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip))
        .map_err(|e| StepError::fatal(format!("the checkpoint is not a zip: {e}")))?;
    let file = archive.by_name(CHECKPOINT_MODEL).map_err(|_| {
        StepError::fatal(format!(
            "the final checkpoint has no {CHECKPOINT_MODEL}: the trainer must export the model \
             into its last checkpoint"
        ))
    })?;
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| StepError::fatal(format!("reading {CHECKPOINT_MODEL}: {e}")))?;
    if bytes.len() as u64 > cap {
        return Err(StepError::fatal(format!(
            "the checkpoint's {CHECKPOINT_MODEL} is over {cap} bytes; refusing it"
        )));
    }
    Ok(bytes)
}

fn signing_key_path(core: &Core) -> std::path::PathBuf {
    core.config
        .data_dir
        .join("keys")
        .join("manifest-signing.key")
}

/// The next free version name, as manifests need it (semantic): the next
/// major after the largest leading number among the model's versions.
fn next_version(core: &Core, model: &str) -> Result<String, Error> {
    let taken: std::collections::BTreeSet<String> =
        models::list_versions(&core.store.registry, model)?
            .into_iter()
            .map(|v| v.version)
            .collect();
    let mut n = taken
        .iter()
        .filter_map(|v| v.split('.').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
        + 1;
    while taken.contains(&format!("{n}.0.0")) {
        n += 1;
    }
    Ok(format!("{n}.0.0"))
}

async fn register(core: &Core, p: &Pipeline, now: OffsetDateTime) -> Result<Output, StepError> {
    let Some(Output::Quantized {
        digest: artifact,
        manifest,
        version,
        variants,
        ..
    }) = p.signed_models()
    else {
        return Err(StepError::fatal("no signed model to register"));
    };
    let artifact = *artifact;
    // Registered by an earlier try that crashed before recording it.
    if let Some(v) = core
        .store
        .registry
        .model_versions
        .get(&models::version_key(&p.model, version))?
    {
        if v.artifact_digest == artifact {
            add_variants(core, &p.model, &v, variants, now).await?;
            return Ok(Output::Version { version: v.version });
        }
        return Err(StepError::fatal(format!(
            "version {version} of {:?} was registered by someone else meanwhile",
            p.model
        )));
    }
    let manifest = *manifest;
    let signed = models::read_manifest(core.artifacts.as_ref(), manifest, "manifest").await?;
    let m = &signed.manifest;
    let evidence = m
        .quantization
        .as_ref()
        .map(|q| serde_json::to_value(q).unwrap_or_default());
    let mut metrics = BTreeMap::new();
    let accuracy = m
        .quantization
        .as_ref()
        .and_then(|q| GateOutcome::from_evidence(&q.evidence).ok())
        .and_then(|o| o.chosen_top1_accuracy());
    if let Some(acc) = accuracy {
        metrics.insert("eval_accuracy".to_string(), acc / 100.0);
    }
    let data = snapshot_of(p)?;
    let hard_examples = match output(p, Step::BuildDataset)? {
        Output::Dataset { hard_examples, .. } => Some(*hard_examples),
        _ => None,
    };
    let v = models::create_version(
        &core.store.registry,
        core.artifacts.as_ref(),
        &p.model,
        CreateModelVersion {
            version: Some(version.clone()),
            artifact_digest: artifact,
            format: None,
            manifest_digest: Some(manifest),
            metrics: Some(metrics),
            lineage: Some(crate::lifecycle::jobs::lineage_with_image(
                &core.store,
                Lineage {
                    trigger: Some(
                        format!("{} ({})", p.trigger, p.id)
                            .chars()
                            .take(128)
                            .collect(),
                    ),
                    dataset: Some(data),
                    quantization: evidence,
                    hard_examples,
                    ..Lineage::from_manifest(&m.lineage)
                },
            )?),
        },
        now,
    )
    .await?;
    add_variants(core, &p.model, &v, variants, now).await?;
    Ok(Output::Version { version: v.version })
}

/// Adds the Quantize step's variants to the registered version; one added
/// by an earlier try of this step (same name, same artifact) is kept.
async fn add_variants(
    core: &Core,
    model: &str,
    version: &ModelVersionRecord,
    variants: &[QuantizedVariant],
    now: OffsetDateTime,
) -> Result<(), StepError> {
    for v in variants {
        match version.variants.iter().find(|have| have.name == v.name) {
            Some(have) if have.artifact_digest == v.digest => continue,
            Some(_) => {
                return Err(StepError::fatal(format!(
                    "variant {} of version {} was added by someone else meanwhile",
                    v.name, version.version
                )))
            }
            None => {}
        }
        models::add_variant(
            &core.store.registry,
            core.artifacts.as_ref(),
            model,
            &version.version,
            CreateVariant {
                name: v.name.clone(),
                artifact_digest: v.digest,
                manifest_digest: v.manifest,
                providers: v.providers.clone(),
            },
            now,
        )
        .await?;
    }
    Ok(())
}

/// Top-1 accuracy (0..1) of an ONNX artifact on the snapshot's eval part.
fn accuracy_on(runtime: &OrtRuntime, model_bytes: &[u8], snapshot: &Npz) -> Result<f64, StepError> {
    let model = onnx::decode(model_bytes).map_err(|e| StepError::fatal(e.to_string()))?;
    let inputs = onnx::inspect(&model).inputs;
    let first = &inputs
        .first()
        .ok_or_else(|| StepError::fatal("the model has no inputs"))?
        .name;
    let npz = dataset::part_for_model(snapshot, first, true).map_err(StepError::fatal)?;
    let eval = Dataset::from_npz(&npz, "the dataset snapshot", &inputs, true)
        .map_err(|e| StepError::fatal(e.to_string()))?;
    let labels = eval.labels.clone().unwrap_or_default();
    let pred = predictions(runtime, &model, &eval).map_err(|e| StepError::fatal(e.to_string()))?;
    let hits = pred.iter().zip(&labels).filter(|(p, l)| p == l).count();
    Ok(hits as f64 / labels.len().max(1) as f64)
}

/// The version the new one must beat: the one the policy's `compare_with`
/// alias points at now, else the serving version.
fn baseline(
    store: &Db,
    model: &str,
    compare_with: Option<&AliasName>,
) -> Result<Option<ModelVersionRecord>, StepError> {
    let Some(alias) = compare_with else {
        return Ok(serving_in(store, model)?);
    };
    let version = aliases::resolve(&store.registry, model, alias)?.ok_or_else(|| {
        StepError::fatal(format!(
            "the policy compares with alias {:?}, which model {model:?} does not have",
            alias.as_str()
        ))
    })?;
    Ok(Some(models::get_version(&store.registry, model, &version)?))
}

async fn compare(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
) -> Result<Output, StepError> {
    let version = version_of(p)?;
    let data = snapshot_of(p)?;
    let new = models::get_version(&core.store.registry, &p.model, version)?;
    let serving = baseline(&core.store, &p.model, config.compare_with.as_ref())?
        .filter(|v| v.version != new.version);
    let serving_version = serving.as_ref().map(|v| v.version.clone());
    let serving_alias = serving.as_ref().and(config.compare_with.clone());
    let new_bytes = read_artifact(core, new.artifact_digest).await?;
    let serving_bytes = match &serving {
        Some(v) => Some(read_artifact(core, v.artifact_digest).await?),
        None => None,
    };
    let snapshot = read_artifact(core, data).await?;
    let (new, serving) = blocking(move || {
        let snapshot = Npz::from_bytes(&snapshot).map_err(|e| StepError::fatal(e.to_string()))?;
        let runtime =
            OrtRuntime::load(None).map_err(|e| StepError::fatal(format!("ONNX Runtime: {e}")))?;
        let new = accuracy_on(&runtime, &new_bytes, &snapshot)?;
        // Nothing serves yet: anything beats nothing.
        let serving = match serving_bytes {
            Some(b) => accuracy_on(&runtime, &b, &snapshot)?,
            None => 0.0,
        };
        Ok((new, serving))
    })
    .await?;
    Ok(Output::Comparison {
        new,
        serving,
        serving_version,
        serving_alias,
    })
}

fn find_deployment(
    core: &Core,
    seed: &str,
) -> Result<Option<deployments::DeploymentRecord>, Error> {
    Ok(deployments::list(&core.store)?
        .into_iter()
        .find(|d| d.deployment.seed == seed))
}

async fn deploy(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
    attempt: u32,
    now: OffsetDateTime,
) -> Poll {
    let version = version_of(p)?;
    let seed = deploy_seed(p, attempt);
    let Some(d) = find_deployment(core, &seed)? else {
        let mut req = config.deployment_request(&p.model, version)?;
        req.seed = Some(seed);
        let d = deployments::create(&core.store, core.artifacts.as_ref(), req, now)
            .await
            .map_err(|e| StepError::fatal(format!("creating the rollout: {e}")))?;
        tracing::info!(pipeline = %p.id, deployment = %d.id, "rollout created");
        return Ok(None);
    };
    match &d.deployment.state {
        RolloutState::Succeeded => Ok(Some(Output::Deployment { id: d.id })),
        RolloutState::RolledBack { reason, .. } => Err(StepError::fatal(format!(
            "rollout {} rolled back: {reason}",
            d.id
        ))),
        RolloutState::Failed { reason } => Err(StepError::fatal(format!(
            "rollout {} failed: {reason}",
            d.id
        ))),
        RolloutState::Cancelled { reason } => Err(StepError::fatal(format!(
            "rollout {} was cancelled ({reason:?})",
            d.id
        ))),
        RolloutState::Pending | RolloutState::Wave { .. } | RolloutState::RollingBack { .. } => {
            Ok(None)
        }
    }
}

async fn reset_reference(
    core: &Core,
    p: &Pipeline,
    now: OffsetDateTime,
) -> Result<Output, StepError> {
    let version = version_of(p)?;
    let Output::Comparison { new, .. } = output(p, Step::Compare)? else {
        return Err(StepError::fatal(
            "the compare step's output is not a comparison",
        ));
    };
    super::set_reference(
        &core.store,
        &p.model,
        super::ReferenceRecord {
            version: version.to_string(),
            since: now,
            evaluated_accuracy: Some(*new),
            pipeline: Some(p.id.clone()),
        },
    )
    .await?;
    Ok(Output::Reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeloop_registry::aliases::SetAlias;

    /// A checkpoint whose `model.onnx` is `len` zeros, deflated (a few KB
    /// per MB).
    fn zeros_checkpoint(len: usize) -> Vec<u8> {
        use std::io::Write as _;
        let mut out = std::io::Cursor::new(Vec::new());
        let mut w = zip::ZipWriter::new(&mut out);
        w.start_file(
            CHECKPOINT_MODEL,
            zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated),
        )
        .unwrap();
        let chunk = vec![0u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            w.write_all(&chunk[..n]).unwrap();
            left -= n;
        }
        w.finish().unwrap();
        out.into_inner()
    }

    #[test]
    fn a_checkpoint_model_is_read_only_up_to_the_cap() {
        let bomb = zeros_checkpoint(64 << 20);
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        let e = model_of_checkpoint(bomb, 1 << 20).unwrap_err();
        assert!(!e.retryable);
        assert!(e.reason.contains("over 1048576 bytes"), "{}", e.reason);
        let fits = model_of_checkpoint(zeros_checkpoint(1 << 20), 1 << 20).unwrap();
        assert_eq!(fits.len(), 1 << 20);
        let e = model_of_checkpoint(b"not a zip".to_vec(), 1 << 20).unwrap_err();
        assert!(e.reason.contains("not a zip"), "{}", e.reason);
    }

    use edgeloop_registry::models::{version_key, CreateModel};

    #[tokio::test]
    async fn the_baseline_is_the_alias_when_the_policy_names_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Db::open(&dir.path().join("db")).unwrap();
        let t = |s| OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap();
        models::create_model(
            &store.registry,
            CreateModel {
                name: "digits".into(),
                ..Default::default()
            },
            t(0),
        )
        .await
        .unwrap();
        for (i, v) in ["1", "2"].into_iter().enumerate() {
            let record = ModelVersionRecord {
                model: "digits".into(),
                version: v.into(),
                artifact_digest: Digest::of(v.as_bytes()),
                artifact_size: 1,
                format: edgeloop_registry::models::ArtifactFormat::Onnx,
                manifest_digest: None,
                probe_inputs_digest: None,
                metrics: Default::default(),
                lineage: Default::default(),
                created_at: t(i as i64),
                variants: Vec::new(),
            };
            store
                .registry
                .model_versions
                .insert(&version_key("digits", v), &record)
                .unwrap();
        }
        let version = |b: Option<ModelVersionRecord>| b.map(|v| v.version);
        // No alias named: the serving version (nothing rolled out: the newest).
        assert_eq!(
            version(baseline(&store, "digits", None).unwrap()),
            Some("2".into())
        );
        let production = AliasName::new("production").unwrap();
        let missing = baseline(&store, "digits", Some(&production)).unwrap_err();
        assert!(!missing.retryable);
        assert!(
            missing.reason.contains("\"production\""),
            "{}",
            missing.reason
        );
        edgeloop_registry::aliases::set(
            &store.registry,
            "digits",
            &production,
            SetAlias {
                version: "1".into(),
                reason: None,
            },
            "admin",
            t(5),
        )
        .await
        .unwrap();
        assert_eq!(
            version(baseline(&store, "digits", Some(&production)).unwrap()),
            Some("1".into())
        );
    }
}
