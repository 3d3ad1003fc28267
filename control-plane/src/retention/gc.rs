//! Artifact garbage collection, mark and sweep: every digest a stored
//! record references is live; a stored artifact that is not, and was last
//! stored longer than the grace period ago, is deleted.
//!
//! The record kinds checked (every `Digest` field of a stored record, and
//! every `edgeloop-artifact://` URI in a stored job spec), each read by a
//! function below that destructures its record without `..`, so a field
//! added to one of them does not compile until it is decided here:
//! - model versions (`model_versions`): artifact, manifest, probe inputs,
//!   the lineage's dataset and checkpoint, and each variant's artifact,
//!   manifest and probe inputs;
//! - assignments (`assignments`): artifact, manifest, probe inputs;
//! - retraining policies (`retraining`): the base dataset and the job
//!   spec's artifact URIs (every pipeline's job gets them);
//! - pipelines (`pipelines`) that have not ended (running, or awaiting a
//!   signature): every digest in every step's output (snapshot, checkpoint,
//!   exported model, unsigned or signed models, manifests and variants),
//!   and the jobs they started (`steps::job_id`, for the job retention);
//! - device benchmarks (`benchmarks`) not finished, or started by a
//!   pipeline that has not ended: the inputs, each model and manifest;
//! - checkpoints (`checkpoints`) kept by the job retention this pass;
//! - jobs (`jobs`) kept by the job retention: every `edgeloop-artifact://`
//!   URI anywhere in the spec (datasets, but also a hyperparameter naming one).
//!
//! Checked and holding no artifact: models, aliases, deployments and their
//! events, assignment status, telemetry, sketches, samples (inputs inline),
//! drift references and trigger state (version names), members, tokens
//! and API tokens (their digests are of secrets, keys and certificates),
//! the audit log. Partial (resumable) uploads are not artifacts; they have
//! their own age (`prune_partials`).
//!
//! The records are read in the order digests flow between them: pipelines
//! before the versions they register, versions before the assignments made
//! of them. A pipeline registers its version before it ends, so a digest on
//! its way is seen in one of them. A put of bytes already stored refreshes
//! their time, and the delete re-checks it under the store's lock, so what
//! a client uploads, even again, has its grace period to be registered.
//! A record that cannot be read fails the pass before anything is deleted.
//! The compactor flushes the store between [`mark`] and [`sweep`]: what the
//! live set was read from (the records the pass dropped among it) is
//! durable before an artifact goes, so a crash never brings back a record
//! naming a deleted artifact.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::Ordering::Relaxed;

use edgeloop_api::registry::{Lineage, VariantView};
use edgeloop_models::Digest;
use time::{Duration, OffsetDateTime};

use crate::db::Db;
use crate::fleet::assignments::AssignmentRecord;
use crate::fleet::benchmarks::{BenchmarkRecord, ModelEntry};
use crate::lifecycle::jobs::JobRecord;
use crate::lifecycle::pipeline::{Output, Pipeline, QuantizedVariant, Step, StepRecord};
use crate::lifecycle::retrain::RetrainingConfig;
use edgeloop_errors::Result;
use edgeloop_registry::artifact_cache::ArtifactCache;
use edgeloop_registry::artifacts::{ArtifactStore, StoredArtifact};
use edgeloop_registry::checkpoints::CheckpointRecord;
use edgeloop_registry::models::ModelVersionRecord;
use edgeloop_store::Tree;

/// What records other than jobs and checkpoints hold on to: the digests,
/// and the jobs (a version's lineage, an unfinished pipeline's training).
/// The job retention keeps what this names; the sweep adds the kept jobs'
/// and checkpoints' digests to it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pinned {
    pub digests: HashSet<Digest>,
    pub jobs: BTreeSet<String>,
}

/// Every `edgeloop-artifact://<digest>` URI among the strings of `spec`
/// (the scheme in any case, as the spec's validation takes it). Pure.
pub fn artifact_uris(spec: &serde_json::Value) -> Vec<Digest> {
    const SCHEME: &str = "edgeloop-artifact://";
    let mut out = Vec::new();
    let mut stack = vec![spec];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::String(s) => {
                let digest = s
                    .get(..SCHEME.len())
                    .filter(|p| p.eq_ignore_ascii_case(SCHEME))
                    .and_then(|_| s[SCHEME.len()..].parse::<Digest>().ok());
                out.extend(digest);
            }
            serde_json::Value::Array(a) => stack.extend(a),
            serde_json::Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    out
}

/// A version's digests: its own, its lineage's, its variants'. Pure.
pub fn version_digests(v: &ModelVersionRecord) -> Vec<Digest> {
    let ModelVersionRecord {
        artifact_digest,
        manifest_digest,
        probe_inputs_digest,
        lineage,
        variants,
        model: _,
        version: _,
        artifact_size: _,
        format: _,
        metrics: _,
        created_at: _,
    } = v;
    let Lineage {
        dataset,
        checkpoint,
        job: _,
        // A container image's digest names no artifact of this store.
        image: _,
        parent_version: _,
        trigger: _,
        quantization: _,
        hard_examples: _,
    } = lineage;
    let mut out = vec![*artifact_digest];
    out.extend(
        [
            *manifest_digest,
            *probe_inputs_digest,
            *dataset,
            *checkpoint,
        ]
        .into_iter()
        .flatten(),
    );
    for variant in variants {
        let VariantView {
            artifact_digest,
            manifest_digest,
            probe_inputs_digest,
            name: _,
            artifact_size: _,
            providers: _,
            quantization: _,
            created_at: _,
        } = variant;
        out.extend([*artifact_digest, *manifest_digest]);
        out.extend(*probe_inputs_digest);
    }
    out
}

/// An assignment's digests. Pure.
pub fn assignment_digests(a: &AssignmentRecord) -> Vec<Digest> {
    let AssignmentRecord {
        artifact_digest,
        manifest_digest,
        probe_inputs_digest,
        model_name: _,
        model_version: _,
        artifact_size: _,
        deployment_id: _,
        activation_timeout_seconds: _,
        deployment_seq: _,
        variant: _,
    } = a;
    let mut out = vec![*artifact_digest];
    out.extend(
        [*manifest_digest, *probe_inputs_digest]
            .into_iter()
            .flatten(),
    );
    out
}

/// A retraining policy's digests: its base set and what its job names. Pure.
pub fn retraining_digests(c: &RetrainingConfig) -> Vec<Digest> {
    let RetrainingConfig {
        job,
        base_dataset,
        cluster: _,
        base_window_rows: _,
        edge_window_rows: _,
        min_fresh_edge_rows: _,
        eval_fraction: _,
        min_eval_samples: _,
        quantization_budget_points: _,
        min_gain_points: _,
        compare_with: _,
        rollout: _,
        hard_example_weight: _,
        max_attempts: _,
        step_timeout_seconds: _,
        variants: _,
        latency: _,
        signing: _,
    } = c;
    let mut out = artifact_uris(job);
    out.extend(*base_dataset);
    out
}

fn quantized_variant_digests(v: &QuantizedVariant) -> [Digest; 2] {
    let QuantizedVariant {
        digest,
        manifest,
        name: _,
        method: _,
        providers: _,
    } = v;
    [*digest, *manifest]
}

/// A step output's digests. Pure.
pub fn output_digests(o: &Output) -> Vec<Digest> {
    match o {
        Output::Dataset {
            digest,
            rows: _,
            eval_rows: _,
            edge_rows: _,
            hard_examples: _,
        }
        | Output::Onnx { digest } => vec![*digest],
        Output::Job { checkpoint, id: _ } => vec![*checkpoint],
        Output::Unsigned {
            digest,
            manifest,
            variants,
            method: _,
            version: _,
        }
        | Output::Quantized {
            digest,
            manifest,
            variants,
            method: _,
            version: _,
        } => {
            let mut out = vec![*digest, *manifest];
            out.extend(variants.iter().flat_map(quantized_variant_digests));
            out
        }
        Output::Version { version: _ }
        | Output::Comparison {
            new: _,
            serving: _,
            serving_version: _,
            serving_alias: _,
        }
        | Output::Deployment { id: _ }
        | Output::Reference => vec![],
    }
}

/// What a pipeline holds on to: nothing once it has ended (what it made
/// lives on in the version it registered); until then every output's
/// digests and every training job it started. Pure.
pub fn pipeline_pins(p: &Pipeline) -> Pinned {
    let Pipeline {
        id: _,
        state,
        history,
        model: _,
        trigger: _,
        max_attempts: _,
        step_timeout_seconds: _,
        min_gain_points: _,
        coalesced: _,
        signing: _,
    } = p;
    let mut pins = Pinned::default();
    if state.is_terminal() {
        return pins;
    }
    for r in history {
        let StepRecord {
            step,
            attempt,
            output,
            started_at: _,
            ended_at: _,
            outcome: _,
        } = r;
        if *step == Step::Train {
            pins.jobs
                .insert(crate::lifecycle::retrain::steps::job_id(p, *attempt));
        }
        if let Some(o) = output {
            pins.digests.extend(output_digests(o));
            if let Output::Job { id, .. } = o {
                pins.jobs.insert(id.clone());
            }
        }
    }
    pins
}

/// A benchmark's digests while the device may still fetch them, or the
/// pipeline that asked for it (`origin`, `p-7/quantize/1`) may still read
/// its candidates; none once both are done. Pure.
pub fn benchmark_digests(
    b: &BenchmarkRecord,
    unfinished_pipelines: &BTreeSet<String>,
) -> Vec<Digest> {
    let BenchmarkRecord {
        state,
        origin,
        models,
        inputs_digest,
        results,
        id: _,
        device: _,
        selector: _,
        inputs_size: _,
        runs: _,
        timeout_seconds: _,
        created_at: _,
        started_at: _,
        finished_at: _,
        reason: _,
        timed_on: _,
    } = b;
    let by_live_pipeline = origin
        .as_deref()
        .and_then(|o| o.split('/').next())
        .is_some_and(|p| unfinished_pipelines.contains(p));
    if state.is_finished() && !by_live_pipeline {
        return vec![];
    }
    let mut out = vec![*inputs_digest];
    for m in models {
        let ModelEntry {
            artifact_digest,
            manifest_digest,
            name: _,
            artifact_size: _,
        } = m;
        out.push(*artifact_digest);
        out.extend(*manifest_digest);
    }
    out.extend(results.iter().map(|r| r.artifact_digest));
    out
}

/// A job's digests: the artifact URIs of its spec (read from its JSON, so
/// that a field added to the spec is searched too). Pure.
pub fn job_digests(j: &JobRecord) -> Result<Vec<Digest>, serde_json::Error> {
    let JobRecord {
        spec,
        id: _,
        project: _,
        cluster: _,
        state: _,
        leased_by: _,
        lease_expires_at: _,
        attempt: _,
        step: _,
        engine_job_id: _,
        image: _,
        restarts: _,
        preemptions: _,
        exit_code: _,
        cancel_requested: _,
        last_message: _,
        history: _,
        created_at: _,
        updated_at: _,
    } = j;
    Ok(artifact_uris(&serde_json::to_value(spec)?))
}

/// A checkpoint's digest (its record is kept or dropped whole). Pure.
pub fn checkpoint_digest(c: &CheckpointRecord) -> Digest {
    let CheckpointRecord {
        digest,
        job_id: _,
        attempt: _,
        step: _,
        size: _,
        has_optimizer_state: _,
        metadata: _,
        cluster: _,
        uploaded_at: _,
    } = c;
    *digest
}

/// The stored artifacts that go: not live, and last stored more than
/// `grace` before `now` (a client uploads before it registers what
/// references the bytes). Pure.
pub fn collectable<'a>(
    live: &HashSet<Digest>,
    stored: &'a [StoredArtifact],
    now: OffsetDateTime,
    grace: Duration,
) -> Vec<&'a StoredArtifact> {
    stored
        .iter()
        .filter(|a| !live.contains(&a.digest) && OffsetDateTime::from(a.modified) < now - grace)
        .collect()
}

const PAGE: usize = 512;

/// Calls `f` on every record of `tree`, a page at a time (never the whole
/// tree in memory). Blocking.
pub(super) fn each<V: serde::Serialize + serde::de::DeserializeOwned>(
    tree: &Tree<V>,
    mut f: impl FnMut(&str, V) -> Result<()>,
) -> Result<()> {
    let mut after: Option<String> = None;
    loop {
        let page = tree.page_after("", after.as_deref(), PAGE, |_, _| true)?;
        let full = page.len() == PAGE;
        for (k, v) in page {
            f(&k, v)?;
            after = Some(k);
        }
        if !full {
            return Ok(());
        }
    }
}

/// Reads what every record but jobs and checkpoints holds on to, in the
/// order digests flow (see the module's doc). Blocking.
pub fn pinned(store: &Db) -> Result<Pinned> {
    let mut pins = Pinned::default();
    let mut unfinished = BTreeSet::new();
    each(&store.lifecycle.retraining, |_, c| {
        pins.digests.extend(retraining_digests(&c));
        Ok(())
    })?;
    each(&store.lifecycle.pipelines, |_, p| {
        if !p.state.is_terminal() {
            unfinished.insert(p.id.clone());
        }
        let Pinned { digests, jobs } = pipeline_pins(&p);
        pins.digests.extend(digests);
        pins.jobs.extend(jobs);
        Ok(())
    })?;
    each(&store.fleet.benchmarks, |_, b| {
        pins.digests.extend(benchmark_digests(&b, &unfinished));
        Ok(())
    })?;
    each(&store.registry.model_versions, |_, v| {
        pins.digests.extend(version_digests(&v));
        pins.jobs.extend(v.lineage.job.clone());
        Ok(())
    })?;
    each(&store.fleet.assignments, |_, set| {
        for a in &set.assignments {
            pins.digests.extend(assignment_digests(a));
        }
        Ok(())
    })?;
    Ok(pins)
}

/// What the sweep deleted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    pub deleted: Vec<Digest>,
    pub bytes: u64,
}

/// The live set, and what the artifact store held when it was read.
#[derive(Debug, Default, Clone)]
pub struct Marked {
    pub live: HashSet<Digest>,
    pub stored: Vec<StoredArtifact>,
}

/// Reads the live set: [`pinned`], then the jobs and checkpoints the job
/// retention kept. Blocking. The caller makes what it read durable (a
/// store flush) before [`sweep`], so a crash cannot bring back a record
/// older than the sweep, naming what it deleted.
pub fn mark(store: &Db, artifacts: &dyn ArtifactStore) -> Result<Marked> {
    let stored = artifacts.list()?;
    if stored.is_empty() {
        return Ok(Marked::default());
    }
    let mut live = pinned(store)?.digests;
    each(&store.lifecycle.jobs, |_, j| {
        live.extend(job_digests(&j).map_err(|e| edgeloop_errors::Error::Internal(e.into()))?);
        Ok(())
    })?;
    each(&store.registry.checkpoints, |_, c| {
        live.insert(checkpoint_digest(&c));
        Ok(())
    })?;
    Ok(Marked { live, stored })
}

/// Deletes what [`collectable`] names; forgets each deleted artifact in
/// `cache` and counts it there. `now` is the artifact store's clock (the
/// one its times are written by), not an injected one. Blocking.
pub fn sweep(
    artifacts: &dyn ArtifactStore,
    marked: &Marked,
    cache: Option<&ArtifactCache>,
    grace: Duration,
    now: OffsetDateTime,
) -> Result<Swept> {
    let cutoff = std::time::SystemTime::from(now - grace);
    let mut swept = Swept::default();
    for a in collectable(&marked.live, &marked.stored, now, grace) {
        if let Some(bytes) = artifacts.delete_if_older(a.digest, cutoff)? {
            swept.deleted.push(a.digest);
            swept.bytes += bytes;
            if let Some(cache) = cache {
                cache.forget(a.digest);
                cache.counters.collected.fetch_add(1, Relaxed);
                cache.counters.collected_bytes.fetch_add(bytes, Relaxed);
            }
        }
    }
    Ok(swept)
}

/// [`mark`] then [`sweep`], with no flush between: for a store whose
/// writes are durable already (tests, tools). Blocking.
pub fn collect(
    store: &Db,
    artifacts: &dyn ArtifactStore,
    cache: Option<&ArtifactCache>,
    grace: Duration,
    now: OffsetDateTime,
) -> Result<Swept> {
    sweep(artifacts, &mark(store, artifacts)?, cache, grace, now)
}

#[cfg(test)]
mod tests;
