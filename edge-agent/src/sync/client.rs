//! The agent RPCs sync uses, behind a trait so the download and watch
//! logic is exercised in unit tests without a network.

use std::pin::Pin;

use async_trait::async_trait;
use edgeloop_client_core::MemberChannel;
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use futures::{Stream, StreamExt};
use tonic::{Code, Status};

pub type StatusStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[async_trait]
pub trait ControlPlaneClient: Send + Sync + 'static {
    async fn watch(&self, known_generation: u64)
        -> Result<StatusStream<pb::AssignmentSet>, Status>;
    async fn fetch(
        &self,
        digest: Digest,
        offset: u64,
        max_chunk_bytes: u32,
    ) -> Result<StatusStream<pb::ArtifactChunk>, Status>;
    async fn report(&self, report: pb::AssignmentStatusReport) -> Result<(), Status>;
    /// Benchmarks queued for this device (see `benchmark`). A client that
    /// has none answers `Unimplemented`, which ends the benchmark loop.
    async fn watch_benchmarks(&self) -> Result<StatusStream<pb::BenchmarkTask>, Status> {
        Err(Status::unimplemented("benchmarks"))
    }
    async fn report_benchmark(&self, _report: pb::BenchmarkReport) -> Result<(), Status> {
        Err(Status::unimplemented("benchmarks"))
    }
}

/// Statuses that mean "no", as opposed to "not now": retrying cannot help.
pub fn is_refusal(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::OutOfRange
    )
}

/// The real client: the membership's mTLS channel, which reconnects by
/// itself after the control plane comes back and follows renewals.
#[derive(Clone)]
pub struct GrpcClient {
    client: AgentServiceClient<MemberChannel>,
}

impl GrpcClient {
    pub fn new(channel: MemberChannel) -> GrpcClient {
        GrpcClient {
            client: AgentServiceClient::new(channel),
        }
    }
}

#[async_trait]
impl ControlPlaneClient for GrpcClient {
    async fn watch(
        &self,
        known_generation: u64,
    ) -> Result<StatusStream<pb::AssignmentSet>, Status> {
        let stream = self
            .client
            .clone()
            .watch_assignments(pb::WatchAssignmentsRequest { known_generation })
            .await?
            .into_inner();
        Ok(stream.boxed())
    }

    async fn fetch(
        &self,
        digest: Digest,
        offset: u64,
        max_chunk_bytes: u32,
    ) -> Result<StatusStream<pb::ArtifactChunk>, Status> {
        let stream = self
            .client
            .clone()
            .fetch_artifact(pb::FetchArtifactRequest {
                digest: digest.to_string(),
                offset,
                max_chunk_bytes,
            })
            .await?
            .into_inner();
        Ok(stream.boxed())
    }

    async fn report(&self, report: pb::AssignmentStatusReport) -> Result<(), Status> {
        // A small unary call: if it has not come back in 10 s the connection
        // is dead (a link that went down mid-call), and the retry on a fresh
        // one should not wait for the channel's general 30 s limit.
        let mut request = tonic::Request::new(report);
        request.set_timeout(std::time::Duration::from_secs(10));
        self.client
            .clone()
            .report_assignment_status(request)
            .await
            .map(|_| ())
    }

    async fn watch_benchmarks(&self) -> Result<StatusStream<pb::BenchmarkTask>, Status> {
        let stream = self
            .client
            .clone()
            .watch_benchmarks(pb::WatchBenchmarksRequest {})
            .await?
            .into_inner();
        Ok(stream.boxed())
    }

    async fn report_benchmark(&self, report: pb::BenchmarkReport) -> Result<(), Status> {
        let mut request = tonic::Request::new(report);
        request.set_timeout(std::time::Duration::from_secs(10));
        self.client
            .clone()
            .report_benchmark(request)
            .await
            .map(|_| ())
    }
}
