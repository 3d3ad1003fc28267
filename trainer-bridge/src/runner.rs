//! The bridge's job loop: lease a job, check it against the cluster, run it
//! on the engine, upload its committed checkpoints, report progress, follow
//! cancellation, and restart a failed attempt from the last checkpoint with
//! backoff until `max_restarts`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgeloop_client_core::Backoff;
use edgeloop_client_core::MemberChannel;
use edgeloop_proto::bridge::v1 as pb;
use edgeloop_proto::bridge::v1::bridge_service_client::BridgeServiceClient;
use edgeloop_proto::common::v1::Chunk;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{self, Committed};
use crate::engines::{Engine, EngineState, PinnedImage};
use crate::launch::{build_launch, contract_env, AttemptPlan};
use crate::preflight::{self, ClusterFacts};
use crate::restart::{decide_after_preemption, decide_restart, FailedAttempt, RestartDecision};
use crate::spec::JobSpec;

/// One progress report, as the job loop sees it.
struct Progress<'a> {
    job: &'a str,
    attempt: u32,
    state: pb::JobState,
    step: u64,
    message: String,
    engine_id: &'a str,
    exit_code: Option<i32>,
    metrics: &'a std::collections::BTreeMap<String, f64>,
    /// The image the job runs, once pinned.
    image: Option<&'a PinnedImage>,
    /// The job's restarts after failures and after preemptions so far.
    counts: Counts,
}

/// How often a job was restarted, by cause: the lease hands the control
/// plane's counts to the bridge that runs the job next, and every report
/// carries them back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    restarts: u32,
    preemptions: u32,
}

pub struct Runner {
    pub client: BridgeServiceClient<MemberChannel>,
    /// The engines this bridge drives, by name; a job picks one with its
    /// spec's `engine`, else `local`.
    pub engines: std::collections::BTreeMap<String, Arc<dyn Engine>>,
    pub data_dir: PathBuf,
    /// The latest facts (see `crate::facts`).
    pub facts: tokio::sync::watch::Receiver<ClusterFacts>,
    /// How often a running job is polled, scanned for checkpoints and reported.
    pub poll: Duration,
    /// Jobs this process is running, sent with every lease request so the
    /// control plane can tell a restart (orphaned jobs) from a busy bridge.
    pub running: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Where trainers report progress (`EDGELOOP_REPORT_URL`).
    pub progress: Arc<crate::progress::ProgressHub>,
}

const CHUNK: usize = 1 << 20;

/// How long an engine may be unreachable before its job counts as lost.
const ENGINE_OUTAGE_GRACE: Duration = Duration::from_secs(120);

fn state_of(s: &EngineState) -> pb::JobState {
    match s {
        EngineState::Pending => pb::JobState::Starting,
        EngineState::Running => pb::JobState::Running,
        EngineState::Succeeded => pb::JobState::Succeeded,
        EngineState::Failed { .. } | EngineState::Preempted { .. } => pb::JobState::Failed,
        EngineState::Cancelled => pb::JobState::Cancelled,
    }
}

impl Runner {
    fn lock_running(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn running_jobs(&self) -> Vec<String> {
        self.lock_running().iter().cloned().collect()
    }

    /// Leases and runs jobs until `shutdown`. Jobs run concurrently.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tasks = tokio::task::JoinSet::new();
        let mut attempt = 0u32;
        while !shutdown.is_cancelled() {
            let req = pb::LeaseJobRequest {
                wait_seconds: 20,
                engines: self.engines.keys().cloned().collect(),
                running_jobs: self.running_jobs(),
            };
            let mut client = self.client.clone();
            let leased = tokio::select! {
                r = client.lease_job(req) => r,
                _ = shutdown.cancelled() => break,
            };
            match leased {
                Ok(resp) => {
                    attempt = 0;
                    if let Some(job) = resp.into_inner().job {
                        self.lock_running().insert(job.id.clone());
                        let me = self.clone();
                        let stop = shutdown.clone();
                        tasks.spawn(async move {
                            let id = job.id.clone();
                            me.run_job(job, stop).await;
                            me.lock_running().remove(&id);
                            me.progress.forget(&id);
                        });
                    }
                }
                Err(status) => {
                    let delay = Backoff::default().next(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(%status, ?delay, "lease failed");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
            while tasks.try_join_next().is_some() {}
        }
        // Jobs keep running on the engine; a restarted bridge re-adopts them.
        tasks.abort_all();
    }

    /// Ends the job as failed before anything ran (bad spec, refused by the
    /// pre-flight check or the engine).
    async fn fail(&self, job: &str, attempt: u32, message: String) {
        let no_metrics = Default::default();
        self.report(Progress {
            job,
            attempt,
            state: pb::JobState::Failed,
            step: 0,
            message,
            engine_id: "",
            exit_code: None,
            metrics: &no_metrics,
            image: None,
            counts: Counts::default(),
        })
        .await;
    }

    async fn report(&self, p: Progress<'_>) -> bool {
        let Progress {
            job,
            attempt,
            state,
            step,
            message,
            engine_id,
            exit_code,
            metrics,
            image,
            counts,
        } = p;
        let mut client = self.client.clone();
        let r = pb::ProgressReport {
            job_id: job.to_string(),
            attempt,
            state: state as i32,
            step,
            metrics: metrics.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            message,
            engine_job_id: engine_id.to_string(),
            exit_code: exit_code.unwrap_or(0),
            at: Some(std::time::SystemTime::now().into()),
            image: image.map(edgeloop_client_core::images::to_wire),
            restarts: counts.restarts,
            preemptions: counts.preemptions,
        };
        match client.report_progress(r).await {
            Ok(ack) => ack.into_inner().cancel_requested,
            Err(status) => {
                tracing::warn!(%status, job, "progress report failed");
                false
            }
        }
    }

    async fn upload(&self, job: &str, attempt: u32, c: &Committed) -> Result<(), String> {
        let bytes = checkpoint::pack(c).map_err(|e| e.to_string())?;
        let digest = edgeloop_models::Digest::of(&bytes);
        // Resume an upload a broken connection interrupted.
        let mut client = self.client.clone();
        let held = client
            .get_checkpoint_upload_offset(pb::CheckpointUploadOffsetRequest {
                job_id: job.to_string(),
                digest: digest.to_string(),
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| s.to_string())?;
        let offset = if held.complete {
            bytes.len() as u64
        } else {
            held.offset.min(bytes.len() as u64)
        };
        let header = pb::CheckpointHeader {
            offset,
            job_id: job.to_string(),
            attempt,
            step: c.step,
            digest: digest.to_string(),
            size: bytes.len() as u64,
            has_optimizer_state: c.manifest.optimizer_state,
            metadata: c
                .manifest
                .metrics
                .iter()
                .map(|(k, v)| (format!("metric.{k}"), v.to_string()))
                .collect(),
        };
        let mut msgs = vec![pb::CheckpointUpload {
            part: Some(pb::checkpoint_upload::Part::Header(header)),
        }];
        for (i, part) in bytes[offset as usize..].chunks(CHUNK).enumerate() {
            msgs.push(pb::CheckpointUpload {
                part: Some(pb::checkpoint_upload::Part::Chunk(Chunk {
                    offset: offset + (i * CHUNK) as u64,
                    data: part.to_vec(),
                })),
            });
        }
        client
            .upload_checkpoint(futures::stream::iter(msgs))
            .await
            .map_err(|s| s.to_string())?;
        Ok(())
    }

    /// Downloads checkpoint `digest` (step `step`) of `job` from the control
    /// plane into `ckpt_dir`: the job ran on another bridge that went away,
    /// and this one resumes it. The download resumes from a partial file
    /// after a broken connection or a bridge restart, and the result must
    /// match the digest and verify as a committed checkpoint.
    async fn fetch_checkpoint(
        &self,
        job: &str,
        digest: &str,
        step: u64,
        job_dir: &Path,
        ckpt_dir: &Path,
    ) -> Result<Committed, String> {
        let want: edgeloop_models::Digest = digest
            .parse()
            .map_err(|e| format!("the control plane sent a bad digest {digest:?}: {e}"))?;
        let scratch = job_dir.join(".fetch");
        tokio::fs::create_dir_all(&scratch)
            .await
            .map_err(|e| format!("creating {}: {e}", scratch.display()))?;
        let partial = scratch.join(format!("{want}.zip.partial"));
        self.download(job, want, &partial).await?;
        let (zip, root, scratch_dir) = (partial.clone(), ckpt_dir.to_path_buf(), scratch.clone());
        tokio::task::spawn_blocking(move || {
            verify_download(&zip, want, "checkpoint")?;
            let c = checkpoint::unpack(&zip, &root, &scratch_dir, step)?;
            let _ = std::fs::remove_file(&zip);
            Ok(c)
        })
        .await
        .map_err(|e| format!("unpacking: {e}"))?
    }

    /// Appends artifact `want` of `job` to `partial` from where it ends (the
    /// control plane serves a job's checkpoints and the datasets its spec
    /// names as `edgeloop-artifact://`), so a broken transfer resumes.
    async fn download(
        &self,
        job: &str,
        want: edgeloop_models::Digest,
        partial: &Path,
    ) -> Result<(), String> {
        use tokio::io::AsyncWriteExt as _;
        let mut offset = tokio::fs::metadata(&partial).await.map_or(0, |m| m.len());
        let mut client = self.client.clone();
        let mut stream = client
            .fetch_checkpoint(pb::FetchCheckpointRequest {
                job_id: job.to_string(),
                digest: want.to_string(),
                offset,
            })
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&partial)
            .await
            .map_err(|e| format!("{}: {e}", partial.display()))?;
        while let Some(chunk) = stream.message().await.map_err(|s| s.to_string())? {
            if chunk.offset != offset {
                return Err(format!(
                    "chunk at offset {} but expected {offset}",
                    chunk.offset
                ));
            }
            file.write_all(&chunk.data)
                .await
                .map_err(|e| format!("{}: {e}", partial.display()))?;
            offset += chunk.data.len() as u64;
        }
        file.sync_all()
            .await
            .map_err(|e| format!("{}: {e}", partial.display()))
    }

    /// Replaces each `edgeloop-artifact://sha256:<hex>` dataset of the spec
    /// by a `file://` path in the job's directory, downloading it once (a
    /// retraining pipeline's dataset snapshot lives in the control plane's
    /// artifact store, and a job on any engine reads plain files).
    async fn fetch_datasets(
        &self,
        job: &str,
        spec: &mut JobSpec,
        job_dir: &Path,
    ) -> Result<(), String> {
        const SCHEME: &str = "edgeloop-artifact://";
        let dir = job_dir.join("datasets");
        for uri in spec.datasets.iter_mut() {
            let Some(rest) = uri.strip_prefix(SCHEME) else {
                continue;
            };
            let want: edgeloop_models::Digest =
                rest.parse().map_err(|e| format!("dataset {uri:?}: {e}"))?;
            let path = dir.join(want.to_hex());
            if !path.exists() {
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                let partial = dir.join(format!("{}.partial", want.to_hex()));
                let mut tries = 0u32;
                loop {
                    match self.download(job, want, &partial).await {
                        Ok(()) => break,
                        Err(e) if tries < 3 => {
                            tracing::warn!(job, error = %e, "fetching a dataset failed; retrying");
                            tokio::time::sleep(Backoff::default().next(tries)).await;
                            tries += 1;
                        }
                        Err(e) => return Err(format!("fetching dataset {want}: {e}")),
                    }
                }
                let (from, to) = (partial.clone(), path.clone());
                tokio::task::spawn_blocking(move || {
                    verify_download(&from, want, "dataset")?;
                    std::fs::rename(&from, &to)
                        .map_err(|e| format!("moving into {}: {e}", to.display()))
                })
                .await
                .map_err(|e| format!("verifying dataset {want}: {e}"))??;
            }
            *uri = format!("file://{}", path.display());
        }
        Ok(())
    }

    /// Pins the spec's image on `engine` before anything runs: to the pin
    /// the lease carries (an earlier attempt's), else to what the reference
    /// resolves to now. The error names the field.
    async fn pin_image(
        &self,
        job: &pb::Job,
        spec: &JobSpec,
        engine: &dyn Engine,
    ) -> Result<Option<PinnedImage>, String> {
        let Some(reference) = &spec.image else {
            return Ok(None);
        };
        let earlier = job
            .pinned_image
            .as_ref()
            .map(edgeloop_client_core::images::from_wire)
            .transpose()
            .map_err(|(field, why)| format!("the lease's pinned {field}: {why}"))?;
        engine
            .pin_image(reference, earlier.as_ref())
            .await
            .map_err(|e| format!("{} did not take the job: {e}", engine.name()))
    }

    async fn run_job(&self, job: pb::Job, shutdown: CancellationToken) {
        let id = job.id.clone();
        let mut attempt = job.attempt;
        let mut spec = match JobSpec::from_json(job.spec_json.as_bytes()) {
            Ok(s) => s,
            Err(e) => {
                self.fail(&id, attempt, format!("invalid spec: {e}")).await;
                return;
            }
        };
        let facts = self.facts.borrow().clone();
        let pool = match preflight::check(&spec, &facts) {
            Ok(pool) => pool,
            Err(refusals) => {
                let why = refusals
                    .iter()
                    .map(|r| format!("{}: {}", r.field, r.reason))
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::warn!(job = %id, %why, "pre-flight check refused the job");
                self.fail(&id, attempt, format!("pre-flight check refused: {why}"))
                    .await;
                return;
            }
        };
        let wanted = spec.engine.map_or("local", |e| e.as_str());
        let Some(engine) = self.engines.get(wanted).cloned() else {
            let have = self.engines.keys().cloned().collect::<Vec<_>>().join(", ");
            self.fail(
                &id,
                attempt,
                format!("engine {wanted:?} is not configured on this bridge (it has: {have})"),
            )
            .await;
            return;
        };
        let job_dir = self.data_dir.join("jobs").join(&id);
        let ckpt_dir = job_dir.join("checkpoints");
        if let Err(e) = std::fs::create_dir_all(&ckpt_dir) {
            self.fail(
                &id,
                attempt,
                format!("creating {}: {e}", ckpt_dir.display()),
            )
            .await;
            return;
        }
        if let Err(e) = self.fetch_datasets(&id, &mut spec, &job_dir).await {
            self.fail(&id, attempt, e).await;
            return;
        }
        let mut pinned_image = match self.pin_image(&job, &spec, engine.as_ref()).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "the job's image cannot run here");
                self.fail(&id, attempt, e).await;
                return;
            }
        };
        let mut restarts = job.restarts;
        let mut preemptions = job.preemptions;
        let mut failures: Vec<FailedAttempt> = Vec::new();
        let mut uploaded: Option<u64> = None;
        let mut scanner = checkpoint::Scanner::default();
        // Handed back after a bridge restart: attach to the running attempt.
        let mut adopt = Some(job.engine_job_id.clone())
            .filter(|e| !e.is_empty())
            .map(crate::engines::EngineJobId);
        if let Some(e) = &adopt {
            tracing::info!(job = %id, attempt, engine_id = %e.0, "re-adopting a running job");
        }
        // The job ran elsewhere before (its bridge went away): bring its last
        // checkpoint here unless this disk already has it or a newer one.
        let local_newest = scanner.scan(&ckpt_dir).last().map(|c| c.step);
        if adopt.is_none()
            && !job.resume_from_checkpoint.is_empty()
            && local_newest.is_none_or(|s| s < job.resume_from_step)
        {
            // A few tries: starting over from an older checkpoint throws
            // away GPU hours, so a passing network fault should not cause it.
            for tries in 0..4u32 {
                match self
                    .fetch_checkpoint(
                        &id,
                        &job.resume_from_checkpoint,
                        job.resume_from_step,
                        &job_dir,
                        &ckpt_dir,
                    )
                    .await
                {
                    Ok(c) => {
                        tracing::info!(job = %id, step = c.step, "fetched the last checkpoint from the control plane");
                        uploaded = Some(c.step);
                        break;
                    }
                    Err(e) if tries < 3 => {
                        tracing::warn!(job = %id, error = %e, "fetching the last checkpoint failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Backoff::default().next(tries)) => {}
                            _ = shutdown.cancelled() => return,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(job = %id, error = %e, "could not fetch the last checkpoint; resuming from what this disk has")
                    }
                }
            }
        }
        loop {
            let resume: Option<Committed> = scanner.scan(&ckpt_dir).pop();
            let contract = match contract_env(
                &id,
                attempt,
                &ckpt_dir,
                resume.as_ref().map(|c| c.dir.as_path()),
                &self.progress.url_for(&id),
            ) {
                Ok(c) => c,
                Err(e) => {
                    self.fail(&id, attempt, e.to_string()).await;
                    return;
                }
            };
            let log = job_dir.join(format!("attempt-{attempt}.log"));
            let launch = build_launch(
                &spec,
                &AttemptPlan {
                    job_id: &id,
                    attempt,
                    job_dir: &job_dir,
                    log_path: &log,
                    contract: &contract,
                    pool: pool.as_ref(),
                    pinned_image: pinned_image.as_ref(),
                },
            );
            let submitted = match adopt.take() {
                Some(e) => Ok(e),
                None => submit_with_retry(engine.as_ref(), &launch, &shutdown).await,
            };
            let engine_id = match submitted {
                Ok(e) => e,
                Err(e) => {
                    self.fail(
                        &id,
                        attempt,
                        format!("{} did not take the job: {e}", engine.name()),
                    )
                    .await;
                    return;
                }
            };
            tracing::info!(job = %id, attempt, engine = engine.name(), engine_id = %engine_id.0, resume = ?resume.as_ref().map(|c| c.step), "attempt started");
            let started_from = resume.as_ref().map(|c| c.step);
            let mut stdout_reports = crate::progress::StdoutReports::default();
            let mut polls = 0u64;
            let mut unreachable_since: Option<tokio::time::Instant> = None;
            let mut last_state = EngineState::Pending;
            let mut final_upload_tries = 0u32;
            let final_state = loop {
                polls += 1;
                // Progress printed as JSON lines: from the output file the
                // engine writes, else (Ray) from its log API every few polls.
                let lines = if log.exists() {
                    stdout_reports.poll_file(&log)
                } else if polls % 10 == 1 {
                    match engine.logs(&engine_id).await {
                        Ok(text) => stdout_reports.poll_text(text.as_bytes()),
                        Err(_) => vec![],
                    }
                } else {
                    vec![]
                };
                for r in lines {
                    if let Err(e) = self.progress.record(&id, r) {
                        tracing::warn!(job = %id, error = %e, "recording progress");
                    }
                }
                let state = match engine.status(&engine_id).await {
                    Ok(s) => {
                        unreachable_since = None;
                        s
                    }
                    // A restarting slurmrestd, Ray head or API server is not a
                    // failed job: failing it would start a second copy while
                    // the first still runs. Keep polling for a while.
                    Err(
                        e @ (crate::engines::EngineError::Unavailable(_)
                        | crate::engines::EngineError::Io(_)),
                    ) if unreachable_since
                        .get_or_insert_with(tokio::time::Instant::now)
                        .elapsed()
                        < ENGINE_OUTAGE_GRACE =>
                    {
                        tracing::warn!(job = %id, engine = engine.name(), error = %e, "engine unreachable; still polling");
                        last_state.clone()
                    }
                    Err(e) => EngineState::Failed {
                        exit_code: None,
                        reason: e.to_string(),
                    },
                };
                last_state = state.clone();
                if let (None, Some(reference)) = (&pinned_image, &spec.image) {
                    // A tag the node resolved as the attempt started: pinned
                    // now, reported below, and run by every later attempt.
                    if let Ok(Some(pin)) = engine.resolved_image(&engine_id, reference).await {
                        tracing::info!(job = %id, image = %pin, "pinned the image the engine resolved");
                        pinned_image = Some(pin);
                    }
                }
                let committed = scanner.scan(&ckpt_dir);
                let pending: Vec<&Committed> = committed
                    .iter()
                    .filter(|c| uploaded.is_none_or(|u| c.step > u))
                    .collect();
                for c in pending {
                    match self.upload(&id, attempt, c).await {
                        Ok(()) => {
                            uploaded = Some(c.step);
                            tracing::info!(job = %id, step = c.step, "checkpoint uploaded");
                        }
                        // Retried on the next poll; the digest makes it
                        // idempotent. The later ones wait for it: uploading
                        // past it would move `uploaded` beyond a checkpoint
                        // the control plane never got, and it would never
                        // be tried again.
                        Err(e) => {
                            tracing::warn!(job = %id, step = c.step, error = %e, "checkpoint upload failed");
                            break;
                        }
                    }
                }
                if let Some(u) = uploaded {
                    // Only what the control plane has may be pruned; a
                    // checkpoint still to upload stays, whatever keep_last says.
                    let _ = checkpoint::prune_committed(
                        &ckpt_dir,
                        checkpoint::up_to(&committed, u),
                        spec.checkpoint.keep_last as usize,
                    );
                }
                let latest = committed.last();
                let reported = self.progress.latest(&id);
                // The trainer's own reports are fresher than its checkpoints.
                let step = latest
                    .map_or(0, |c| c.step)
                    .max(reported.as_ref().map_or(0, |r| r.step));
                let metrics = match reported {
                    Some(r) if !r.metrics.is_empty() => r.metrics,
                    _ => latest
                        .map(|c| c.manifest.metrics.clone())
                        .unwrap_or_default(),
                };
                if state.is_terminal() {
                    // A finished job's last checkpoint is its result (a
                    // pipeline exports the model from it): an upload that
                    // failed is retried before the end is reported, for a
                    // bounded number of polls.
                    let behind = committed
                        .last()
                        .is_some_and(|c| uploaded.is_none_or(|u| u < c.step));
                    if state == EngineState::Succeeded
                        && behind
                        && final_upload_tries < FINAL_UPLOAD_TRIES
                    {
                        final_upload_tries += 1;
                        tracing::warn!(job = %id, tries = final_upload_tries, "the job ended with checkpoints not yet uploaded; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(self.poll) => {}
                            _ = shutdown.cancelled() => return,
                        }
                        continue;
                    }
                    break (state, step, metrics);
                }
                let cancel = self
                    .report(Progress {
                        job: &id,
                        attempt,
                        state: state_of(&state),
                        step,
                        message: String::new(),
                        engine_id: &engine_id.0,
                        exit_code: None,
                        metrics: &metrics,
                        image: pinned_image.as_ref(),
                        counts: Counts {
                            restarts,
                            preemptions,
                        },
                    })
                    .await;
                if cancel {
                    tracing::info!(job = %id, "cancel requested");
                    let _ = engine.cancel(&engine_id).await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.poll) => {}
                    // The job keeps running on the engine; a restarted bridge re-adopts it.
                    _ = shutdown.cancelled() => return,
                }
            };
            let (state, step, metrics) = final_state;
            // A failed or preempted attempt: the whole group restarts
            // together from the last checkpoint, so no rank of this attempt
            // outlives it; each cause has its own count and limit.
            let (decision, what, count, exit_code) = match &state {
                EngineState::Failed { exit_code, reason } => {
                    let newest = scanner.scan(&ckpt_dir).last().map(|c| c.step);
                    failures.push(FailedAttempt {
                        exit_code: *exit_code,
                        progressed: newest > started_from,
                    });
                    let decision = decide_restart(&spec, restarts, &failures);
                    if matches!(decision, RestartDecision::Restart(_)) {
                        restarts += 1;
                    }
                    let count = format!(
                        "restart {restarts} of at most {}",
                        spec.restarts.max_restarts
                    );
                    let what = format!("attempt {attempt} failed ({reason})");
                    (decision, what, count, *exit_code)
                }
                EngineState::Preempted { reason } => {
                    preemptions += 1;
                    let count = format!(
                        "preemption {preemptions} of at most {}",
                        spec.restarts.max_preemptions
                    );
                    let what = format!("attempt {attempt} preempted ({reason})");
                    (
                        decide_after_preemption(&spec, preemptions),
                        what,
                        count,
                        None,
                    )
                }
                other => {
                    self.report(Progress {
                        job: &id,
                        attempt,
                        state: state_of(other),
                        step,
                        message: String::new(),
                        engine_id: &engine_id.0,
                        exit_code: None,
                        metrics: &metrics,
                        image: pinned_image.as_ref(),
                        counts: Counts {
                            restarts,
                            preemptions,
                        },
                    })
                    .await;
                    return;
                }
            };
            if let Err(e) = engine.stop_remains(&engine_id).await {
                tracing::debug!(job = %id, error = %e, "stopping what is left of the attempt");
            }
            let (reported, message) = match &decision {
                RestartDecision::Restart(delay) => {
                    tracing::warn!(job = %id, attempt, %what, %count, ?delay, "restarting from the last checkpoint");
                    (
                        pb::JobState::Running,
                        format!("{what}; {count}, restarting in {delay:?}"),
                    )
                }
                RestartDecision::GiveUp(why) => {
                    tracing::warn!(job = %id, attempt, %what, %why, "job failed");
                    (pb::JobState::Failed, format!("{why}: {what}"))
                }
            };
            self.report(Progress {
                job: &id,
                attempt,
                state: reported,
                step,
                message,
                engine_id: &engine_id.0,
                exit_code,
                metrics: &metrics,
                image: pinned_image.as_ref(),
                counts: Counts {
                    restarts,
                    preemptions,
                },
            })
            .await;
            let RestartDecision::Restart(delay) = decision else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => return,
            }
            attempt += 1;
        }
    }
}

/// Polls a succeeded job may spend retrying its last checkpoints' uploads
/// before it reports the end anyway (a control plane that keeps refusing
/// them must not hold the job forever).
const FINAL_UPLOAD_TRIES: u32 = 30;

/// Submits, retrying with backoff while the engine is unreachable (a
/// restarting slurmrestd or Ray head); a refusal is final at once.
async fn submit_with_retry(
    engine: &dyn Engine,
    launch: &crate::engines::Launch,
    shutdown: &CancellationToken,
) -> Result<crate::engines::EngineJobId, crate::engines::EngineError> {
    const ATTEMPTS: u32 = 6;
    let backoff = Backoff {
        base: Duration::from_millis(500),
        max: Duration::from_secs(10),
    };
    let mut tries = 0;
    loop {
        match engine.submit(launch).await {
            Err(crate::engines::EngineError::Unavailable(why))
                if tries + 1 < ATTEMPTS && !shutdown.is_cancelled() =>
            {
                let delay = backoff.next(tries);
                tracing::warn!(engine = engine.name(), %why, ?delay, "engine unavailable; retrying the submission");
                tries += 1;
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// Where a bridge keeps a job's files: `<data_dir>/jobs/<id>/`.
/// Checks a finished download against its digest; a mismatch removes the
/// file, so the next try starts over rather than resuming garbage.
fn verify_download(path: &Path, want: edgeloop_models::Digest, what: &str) -> Result<(), String> {
    let got = checkpoint::hash_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if got != want {
        let _ = std::fs::remove_file(path);
        return Err(format!(
            "downloaded {what} has sha256 {got}, expected {want}"
        ));
    }
    Ok(())
}

pub fn job_dir(data_dir: &Path, job: &str) -> PathBuf {
    data_dir.join("jobs").join(job)
}
