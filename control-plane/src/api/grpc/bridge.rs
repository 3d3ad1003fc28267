//! `edgeloop.bridge.v1.BridgeService`.
//!
//! The job queue itself arrives with the trainer-bridge wing; until then no
//! job can be queued, so LeaseJob long-polls and answers "nothing to run", and
//! ReportProgress names the unknown job. Checkpoint upload is complete: it
//! streams into the artifact store with the same digest and size checks as
//! the REST upload, and records which job and step the checkpoint belongs to.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use edgeloop_models::Digest;
use edgeloop_proto::bridge::v1 as pb;
use edgeloop_proto::bridge::v1::bridge_service_server::BridgeService;
use edgeloop_proto::common::v1::{
    EnrollRequest, EnrollResponse, HeartbeatRequest, HeartbeatResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::caller;
use crate::error::Error;
use crate::fleet::members::MemberKind;
use crate::registry::artifacts::{ArtifactError, UploadLimits};
use crate::registry::checkpoints::{self, CheckpointRecord};
use crate::{validate, Core};

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

    async fn lease_job(
        &self,
        req: Request<pb::LeaseJobRequest>,
    ) -> Result<Response<pb::LeaseJobResponse>, Status> {
        caller(&self.core, &req, MemberKind::Cluster)?;
        let wait = Duration::from_secs(req.into_inner().wait_seconds.into()).min(MAX_LEASE_WAIT);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.core.shutdown.cancelled() => {}
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
        let events = core.events.subscribe();
        let (tx, rx) = mpsc::channel::<Result<pb::JobEvent, Status>>(4);
        tokio::spawn(async move {
            tokio::select! {
                _ = core.shutdown.cancelled() => {}
                _ = tx.closed() => {}
                _ = super::revoked(events, MemberKind::Cluster, &cluster) => {
                    let _ = tx.send(Err(Status::permission_denied(format!("cluster/{cluster} has been revoked")))).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report_progress(
        &self,
        req: Request<pb::ProgressReport>,
    ) -> Result<Response<pb::ProgressAck>, Status> {
        caller(&self.core, &req, MemberKind::Cluster)?;
        let job = req.into_inner().job_id;
        Err(Error::not_found("job", job).into())
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
                return Err(Status::invalid_argument(
                    "header: the first message must be the checkpoint header",
                ))
            }
        };
        let max = self.core.config.max_artifact_bytes;
        let digest = validate_header(&header, max)?;
        // Chunks must arrive in order, with no gaps or overlaps.
        let mut expected_offset = 0u64;
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
        let outcome = self
            .core
            .artifacts
            .put(
                digest,
                Box::pin(body),
                UploadLimits {
                    max_bytes: max,
                    declared_size: Some(header.size),
                },
            )
            .await
            .map_err(Error::from)?;
        let record = CheckpointRecord {
            job_id: header.job_id.clone(),
            attempt: header.attempt,
            step: header.step,
            digest,
            size: outcome.size,
            has_optimizer_state: header.has_optimizer_state,
            metadata: header.metadata.into_iter().collect(),
            cluster,
            uploaded_at: self.core.now(),
        };
        self.core
            .store
            .checkpoints
            .insert(&checkpoints::key(&record.job_id, record.step), &record)
            .map_err(Error::from)?;
        self.core.store.flush().await.map_err(Error::from)?;
        Ok(Response::new(pb::CheckpointReceipt {
            digest: digest.to_string(),
            size: outcome.size,
        }))
    }
}
