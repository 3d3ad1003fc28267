//! `edgeloop.bridge.v1.BridgeService`.
//!
//! Bridges lease queued jobs (long-poll), report progress (which renews the
//! lease and carries cancellation back), watch for cancellations, and upload
//! checkpoints, which stream into the artifact store with the same digest and
//! size checks as the REST upload.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use edgeloop_models::Digest;
use edgeloop_proto::bridge::v1 as pb;
use edgeloop_proto::bridge::v1::bridge_service_server::BridgeService;
use edgeloop_proto::common::v1::{
    EnrollRequest, EnrollResponse, HeartbeatRequest, HeartbeatResponse, RenewRequest, RenewResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::caller;
use crate::fleet::members::MemberKind;
use crate::fleet::FleetEvent;
use crate::lifecycle::jobs::{self, JobState};
use crate::Core;
use edgeloop_errors::validate;
use edgeloop_errors::Error;
use edgeloop_registry::artifacts::ArtifactError;
use edgeloop_registry::checkpoints::{self, CheckpointRecord};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Longest a LeaseJob call waits for work.
const MAX_LEASE_WAIT: Duration = Duration::from_secs(30);

pub struct BridgeApi {
    core: Arc<Core>,
}

impl BridgeApi {
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    fn lease(&self) -> time::Duration {
        time::Duration::try_from(self.core.config.job_lease).unwrap_or(time::Duration::MAX)
    }
}

/// The refusal when a cluster touches a job it does not hold the lease of.
fn not_leased(job: &str, cluster: &str) -> Error {
    Error::PermissionDenied(format!("job {job:?} is not leased by cluster/{cluster}"))
}

/// Whose partial upload a checkpoint's bytes are: one bridge's one job.
fn upload_owner(cluster: &str, job: &str) -> String {
    format!("{cluster}/{job}")
}

/// This job's checkpoint with `digest`, if it uploaded one.
fn own_checkpoint(
    core: &crate::Core,
    job: &str,
    digest: Digest,
) -> Result<Option<CheckpointRecord>, Error> {
    Ok(checkpoints::list(&core.store.registry, job)?
        .into_iter()
        .find(|c| c.digest == digest))
}

fn validate_header(h: &pb::CheckpointHeader, max_bytes: u64) -> Result<Digest, Error> {
    if h.job_id.is_empty()
        || h.job_id.len() > 128
        || !h
            .job_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::bad_field(
            "header.job_id",
            "must be 1-128 of A-Z a-z 0-9 - _",
        ));
    }
    let digest = h
        .digest
        .parse()
        .map_err(|e| Error::bad_field("header.digest", format!("{e}")))?;
    if h.size > max_bytes {
        return Err(Error::PayloadTooLarge { limit: max_bytes });
    }
    if h.metadata.len() > 64 {
        return Err(Error::bad_field("header.metadata", "at most 64 entries"));
    }
    for (k, v) in &h.metadata {
        validate::text(&format!("header.metadata.{k}"), v, 1024)?;
    }
    Ok(digest)
}

#[tonic::async_trait]
impl BridgeService for BridgeApi {
    async fn enroll(
        &self,
        req: Request<EnrollRequest>,
    ) -> Result<Response<EnrollResponse>, Status> {
        Ok(Response::new(
            super::agent::enroll(&self.core, MemberKind::Cluster, req.into_inner()).await?,
        ))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        Ok(Response::new(super::agent::heartbeat(
            &self.core,
            MemberKind::Cluster,
            req,
            |r| r.capabilities,
        )?))
    }

    async fn renew(&self, req: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        Ok(Response::new(
            super::agent::renew(&self.core, MemberKind::Cluster, req).await?,
        ))
    }

    async fn lease_job(
        &self,
        req: Request<pb::LeaseJobRequest>,
    ) -> Result<Response<pb::LeaseJobResponse>, Status> {
        let cluster = caller(&self.core, &req, MemberKind::Cluster)?.id;
        let req = req.into_inner();
        let wait = Duration::from_secs(req.wait_seconds.into()).min(MAX_LEASE_WAIT);
        let running: Vec<String> = req.running_jobs.into_iter().take(10_000).collect();
        let deadline = tokio::time::Instant::now() + wait;
        // Subscribe before looking, so a job queued in between wakes us.
        let mut events = self.core.events.subscribe();
        loop {
            if let Some(job) = jobs::lease(
                &self.core.store,
                &cluster,
                &running,
                self.core.now(),
                self.lease(),
            )
            .await?
            {
                tracing::info!(job = %job.id, %cluster, attempt = job.attempt, "job leased");
                let resume =
                    checkpoints::latest(&self.core.store.registry, &job.id).map_err(Error::from)?;
                return Ok(Response::new(pb::LeaseJobResponse {
                    job: Some(pb::Job {
                        id: job.id.clone(),
                        spec_json: serde_json::to_string(&job.spec).map_err(|e| {
                            Error::Internal(anyhow::Error::new(e).context("writing the job spec"))
                        })?,
                        attempt: job.attempt,
                        resume_from_checkpoint: resume
                            .as_ref()
                            .map(|c| c.digest.to_string())
                            .unwrap_or_default(),
                        resume_from_step: resume.as_ref().map_or(0, |c| c.step),
                        pinned_image: job
                            .image
                            .as_ref()
                            .map(edgeloop_client_core::images::to_wire),
                        restarts: job.restarts,
                        preemptions: job.preemptions,
                        // Handed back for re-adoption: attach to what runs.
                        engine_job_id: job
                            .engine_job_id
                            .clone()
                            .filter(|_| job.state == JobState::Running)
                            .unwrap_or_default(),
                    }),
                    lease_expires_at: job
                        .lease_expires_at
                        .map(|t| std::time::SystemTime::from(t).into()),
                }));
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = self.core.shutdown.cancelled() => break,
                ev = events.recv() => {
                    if matches!(ev, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                        break;
                    }
                }
            }
        }
        Ok(Response::new(pb::LeaseJobResponse {
            job: None,
            lease_expires_at: None,
        }))
    }

    type WatchJobsStream = BoxStream<pb::JobEvent>;

    async fn watch_jobs(
        &self,
        req: Request<pb::WatchJobsRequest>,
    ) -> Result<Response<Self::WatchJobsStream>, Status> {
        let cluster = caller(&self.core, &req, MemberKind::Cluster)?.id;
        let core = self.core.clone();
        let mut events = core.events.subscribe();
        let (tx, rx) = mpsc::channel::<Result<pb::JobEvent, Status>>(16);
        tokio::spawn(async move {
            let revoked = super::revoked(core.clone(), MemberKind::Cluster, cluster.clone());
            tokio::pin!(revoked);
            // Cancellations already pending when the watch starts count too.
            let mut announced = std::collections::HashSet::new();
            loop {
                if let Ok(all) = core.store.lifecycle.jobs.values() {
                    for j in all.iter().filter(|j| {
                        j.cancel_requested
                            && !j.state.is_terminal()
                            && j.leased_by.as_deref() == Some(cluster.as_str())
                    }) {
                        if announced.insert(j.id.clone()) {
                            let ev = pb::JobEvent {
                                job_id: j.id.clone(),
                                event: Some(pb::job_event::Event::Cancel(pb::Cancel {
                                    reason: "cancelled by request".into(),
                                })),
                            };
                            if tx.send(Ok(ev)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                tokio::select! {
                    _ = core.shutdown.cancelled() => return,
                    _ = tx.closed() => return,
                    _ = &mut revoked => {
                        let _ = tx.send(Err(Error::PermissionDenied(format!("cluster/{cluster} has been revoked")).into())).await;
                        return;
                    }
                    ev = events.recv() => match ev {
                        Ok(FleetEvent::JobChanged { .. }) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report_progress(
        &self,
        req: Request<pb::ProgressReport>,
    ) -> Result<Response<pb::ProgressAck>, Status> {
        let cluster = caller(&self.core, &req, MemberKind::Cluster)?.id;
        let r = req.into_inner();
        let state = match pb::JobState::try_from(r.state) {
            Ok(pb::JobState::Running) | Ok(pb::JobState::Starting) => JobState::Running,
            Ok(pb::JobState::Succeeded) => JobState::Succeeded,
            Ok(pb::JobState::Failed) => JobState::Failed,
            Ok(pb::JobState::Cancelled) => JobState::Cancelled,
            _ => {
                return Err(Error::bad_field(
                    "state",
                    format!("{} is not a state a bridge reports", r.state),
                )
                .into())
            }
        };
        let image = r
            .image
            .as_ref()
            .map(edgeloop_client_core::images::from_wire)
            .transpose()
            .map_err(|(field, why)| Error::bad_field(field, why))?;
        let report = jobs::Report {
            attempt: r.attempt,
            state,
            step: r.step,
            metrics: r.metrics.into_iter().take(256).collect(),
            message: r.message,
            engine_job_id: Some(r.engine_job_id).filter(|s| !s.is_empty()),
            exit_code: (state == JobState::Failed).then_some(r.exit_code),
            image,
            restarts: r.restarts,
            preemptions: r.preemptions,
        };
        let job = jobs::report(
            &self.core.store,
            &r.job_id,
            &cluster,
            &report,
            self.core.now(),
            self.lease(),
        )
        .await?;
        if job.state.is_terminal() {
            self.core.events.publish(FleetEvent::JobChanged {
                job: job.id.clone(),
            });
        }
        Ok(Response::new(pb::ProgressAck {
            cancel_requested: job.cancel_requested,
        }))
    }

    async fn get_checkpoint_upload_offset(
        &self,
        req: Request<pb::CheckpointUploadOffsetRequest>,
    ) -> Result<Response<pb::CheckpointUploadOffset>, Status> {
        let cluster = caller(&self.core, &req, MemberKind::Cluster)?.id;
        let req = req.into_inner();
        let job = jobs::get(&self.core.store, &req.job_id)?;
        if job.leased_by.as_deref() != Some(cluster.as_str()) {
            return Err(not_leased(&job.id, &cluster).into());
        }
        let digest: Digest = req
            .digest
            .parse()
            .map_err(|e| Error::bad_field("digest", format!("{e}")))?;
        // Scoped to this job's own uploads: whether some other artifact
        // with this digest is stored, and its size, is not the caller's to
        // learn (nor a shortcut past sending the bytes).
        if let Some(own) = own_checkpoint(&self.core, &job.id, digest)? {
            return Ok(Response::new(pb::CheckpointUploadOffset {
                offset: own.size,
                complete: true,
            }));
        }
        let offset = self
            .core
            .artifacts
            .partial_len(&upload_owner(&cluster, &job.id), digest)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::CheckpointUploadOffset {
            offset,
            complete: false,
        }))
    }

    type FetchCheckpointStream = BoxStream<edgeloop_proto::common::v1::Chunk>;

    async fn fetch_checkpoint(
        &self,
        req: Request<pb::FetchCheckpointRequest>,
    ) -> Result<Response<Self::FetchCheckpointStream>, Status> {
        let cluster = caller(&self.core, &req, MemberKind::Cluster)?.id;
        let req = req.into_inner();
        let digest: Digest = req
            .digest
            .parse()
            .map_err(|e| Error::bad_field("digest", format!("{e}")))?;
        let job = jobs::get(&self.core.store, &req.job_id)?;
        // Only the bridge running the job may read its checkpoints: they are
        // the team's weights, not something every cluster should see.
        if job.leased_by.as_deref() != Some(cluster.as_str()) {
            return Err(not_leased(&job.id, &cluster).into());
        }
        // A job's own checkpoints, and the datasets its spec names in the
        // artifact store (a retraining pipeline's snapshot), and nothing else.
        let names_dataset = job.spec.datasets.iter().any(|u| {
            u.strip_prefix("edgeloop-artifact://")
                .and_then(|d| d.parse::<Digest>().ok())
                == Some(digest)
        });
        let known = names_dataset
            || checkpoints::list(&self.core.store.registry, &job.id)
                .map_err(Error::from)?
                .iter()
                .any(|c| c.digest == digest);
        if !known {
            return Err(Error::Absent(format!(
                "job {:?} has no checkpoint or dataset {digest}",
                job.id
            ))
            .into());
        }
        let chunks = super::downloads::stream_artifact(
            &self.core,
            MemberKind::Cluster.identity(&cluster),
            digest,
            req.offset,
            0,
            super::downloads::Caching::Uncached,
        )
        .await?;
        let chunks = chunks
            .map(|c| {
                c.map(|c| edgeloop_proto::common::v1::Chunk {
                    offset: c.offset,
                    // A chunk read from the store: its own allocation,
                    // taken back without a copy.
                    data: Vec::from(c.data),
                })
            })
            .boxed();
        Ok(Response::new(super::until_revoked(
            self.core.clone(),
            MemberKind::Cluster,
            cluster,
            chunks,
        )))
    }

    async fn upload_checkpoint(
        &self,
        req: Request<Streaming<pb::CheckpointUpload>>,
    ) -> Result<Response<pb::CheckpointReceipt>, Status> {
        let cluster = caller(&self.core, &req, MemberKind::Cluster)?.id;
        let mut stream = req.into_inner();
        let header = match stream.message().await? {
            Some(pb::CheckpointUpload {
                part: Some(pb::checkpoint_upload::Part::Header(h)),
            }) => h,
            _ => {
                return Err(Error::bad_field(
                    "header",
                    "the first message must be the checkpoint header",
                )
                .into())
            }
        };
        let max = self.core.config.max_artifact_bytes;
        let digest = validate_header(&header, max)?;
        let job = jobs::get(&self.core.store, &header.job_id)?;
        if job.leased_by.as_deref() != Some(cluster.as_str()) {
            return Err(not_leased(&job.id, &cluster).into());
        }
        // Chunks must arrive in order, with no gaps or overlaps.
        let mut expected_offset = header.offset;
        let body = stream.map(move |msg| {
            let msg = msg.map_err(|s| ArtifactError::Body(s.to_string()))?;
            match msg.part {
                Some(pb::checkpoint_upload::Part::Chunk(c)) if c.offset == expected_offset => {
                    expected_offset += c.data.len() as u64;
                    Ok(bytes::Bytes::from(c.data))
                }
                Some(pb::checkpoint_upload::Part::Chunk(c)) => Err(ArtifactError::Body(format!(
                    "chunk at offset {} but expected {expected_offset}",
                    c.offset
                ))),
                _ => Err(ArtifactError::Body(
                    "only chunks may follow the header".into(),
                )),
            }
        });
        // The job uploaded these bytes before (its receipt was lost, say):
        // recording them again needs no body. Anything else needs the
        // whole body from this job's own partial upload.
        let already_own = own_checkpoint(&self.core, &job.id, digest)?
            .filter(|c| header.offset == c.size && c.size == header.size);
        let size = match already_own {
            Some(own) => own.size,
            None => {
                self.core
                    .artifacts
                    .put_resumable(
                        &upload_owner(&cluster, &job.id),
                        digest,
                        Box::pin(body),
                        header.size,
                        max,
                        header.offset,
                    )
                    .await
                    .map_err(Error::from)?
                    .size
            }
        };
        let record = CheckpointRecord {
            job_id: header.job_id.clone(),
            attempt: header.attempt,
            step: header.step,
            digest,
            size,
            has_optimizer_state: header.has_optimizer_state,
            metadata: with_image(header.metadata.into_iter().collect(), job.image.as_ref()),
            cluster,
            uploaded_at: self.core.now(),
        };
        self.core
            .store
            .registry
            .checkpoints
            .insert(&checkpoints::key(&record.job_id, record.step), &record)
            .map_err(Error::from)?;
        self.core.store.flush().await.map_err(Error::from)?;
        Ok(Response::new(pb::CheckpointReceipt {
            digest: digest.to_string(),
            size,
        }))
    }
}

/// A checkpoint's metadata names the image that made it, from the job's
/// pin: the control plane writes these keys, never the trainer.
fn with_image(
    mut metadata: std::collections::BTreeMap<String, String>,
    image: Option<&edgeloop_api::images::PinnedImage>,
) -> std::collections::BTreeMap<String, String> {
    for key in [IMAGE, IMAGE_DIGEST, IMAGE_DIGEST_KIND] {
        metadata.remove(key);
    }
    if let Some(pin) = image {
        metadata.insert(IMAGE.into(), pin.reference.clone());
        metadata.insert(IMAGE_DIGEST.into(), format!("sha256:{}", pin.digest));
        metadata.insert(IMAGE_DIGEST_KIND.into(), pin.kind.as_str().into());
    }
    metadata
}

/// The checkpoint metadata keys of the image that made it.
pub const IMAGE: &str = "image";
pub const IMAGE_DIGEST: &str = "image_digest";
pub const IMAGE_DIGEST_KIND: &str = "image_digest_kind";
