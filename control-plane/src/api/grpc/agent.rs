//! `edgeloop.agent.v1.AgentService`.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use edgeloop_proto::agent::v1::agent_service_server::AgentService;
use edgeloop_proto::common::v1::{
    EnrollRequest, EnrollResponse, HeartbeatRequest, HeartbeatResponse, RenewRequest, RenewResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::auth::{caller, caller_with_cert};
use crate::fleet::members::{self, Authorized, CapabilitiesRecord, MemberKind};
use crate::fleet::renewal;
use crate::fleet::{assignments, benchmarks, telemetry};
use crate::Core;
use edgeloop_errors::Error;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

pub struct AgentApi {
    core: Arc<Core>,
}

impl AgentApi {
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

/// Enrollment, shared by both services.
pub(super) async fn enroll(
    core: &Core,
    kind: MemberKind,
    req: EnrollRequest,
) -> Result<EnrollResponse, Status> {
    let lifetime = cert_lifetime(core);
    let enrollment = members::Enrollment {
        kind,
        token: &req.bootstrap_token,
        csr_pem: &req.csr_pem,
        capabilities: req
            .capabilities
            .map(CapabilitiesRecord::from)
            .unwrap_or_default(),
    };
    let (member, cert) =
        members::enroll(&core.store, &core.pki, enrollment, lifetime, core.now()).await?;
    tracing::info!(identity = %kind.identity(&member.id), "enrolled");
    Ok(EnrollResponse {
        identity: kind.identity(&member.id),
        certificate_pem: cert.pem,
        ca_certificate_pem: core.pki.ca_pem().to_string(),
        certificate_not_after: Some(SystemTime::from(cert.not_after).into()),
        heartbeat_interval_seconds: core.config.heartbeat_interval.as_secs() as u32,
    })
}

fn cert_lifetime(core: &Core) -> time::Duration {
    time::Duration::try_from(core.config.cert_lifetime).unwrap_or(time::Duration::days(365))
}

pub(super) fn heartbeat<T>(
    core: &Core,
    kind: MemberKind,
    req: Request<T>,
    caps: impl FnOnce(T) -> Option<edgeloop_proto::common::v1::Capabilities>,
) -> Result<HeartbeatResponse, Status> {
    let started = std::time::Instant::now();
    // Ahead of a rollout's queued store calls: a member whose heartbeats
    // wait behind them looks offline.
    let answer = edgeloop_store::urgent(|| answer_heartbeat(core, kind, req, caps));
    core.heartbeat_latency.observe(started.elapsed());
    answer
}

fn answer_heartbeat<T>(
    core: &Core,
    kind: MemberKind,
    req: Request<T>,
    caps: impl FnOnce(T) -> Option<edgeloop_proto::common::v1::Capabilities>,
) -> Result<HeartbeatResponse, Status> {
    // The path enters each room once: authorisation (which asks renewal
    // whether to renew), then presence (which writes or batches).
    let caller = caller_with_cert(core, &req, kind)?;
    let capabilities = caps(req.into_inner()).map(CapabilitiesRecord::from);
    core.presence.heartbeat(
        &core.store,
        &caller.member,
        capabilities,
        core.now(),
        core.offline_after(),
    )?;
    Ok(HeartbeatResponse {
        server_time: Some(SystemTime::now().into()),
        heartbeat_interval_seconds: core.config.heartbeat_interval.as_secs() as u32,
        renew_certificate: caller.renew_certificate,
    })
}

/// Renewal, shared by both services.
pub(super) async fn renew(
    core: &Core,
    kind: MemberKind,
    req: Request<RenewRequest>,
) -> Result<RenewResponse, Status> {
    let Authorized {
        member,
        fingerprint,
        ..
    } = caller_with_cert(core, &req, kind)?;
    let cert = renewal::renew(
        &core.store,
        &core.pki,
        &member,
        fingerprint,
        &req.get_ref().csr_pem,
        cert_lifetime(core),
        core.now(),
    )
    .await?;
    Ok(RenewResponse {
        certificate_pem: cert.pem,
        certificate_not_after: Some(SystemTime::from(cert.not_after).into()),
    })
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn enroll(
        &self,
        req: Request<EnrollRequest>,
    ) -> Result<Response<EnrollResponse>, Status> {
        Ok(Response::new(
            enroll(&self.core, MemberKind::Device, req.into_inner()).await?,
        ))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        Ok(Response::new(heartbeat(
            &self.core,
            MemberKind::Device,
            req,
            |r| r.capabilities,
        )?))
    }

    async fn renew(&self, req: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        Ok(Response::new(
            renew(&self.core, MemberKind::Device, req).await?,
        ))
    }

    type WatchAssignmentsStream = BoxStream<pb::AssignmentSet>;

    async fn watch_assignments(
        &self,
        req: Request<pb::WatchAssignmentsRequest>,
    ) -> Result<Response<Self::WatchAssignmentsStream>, Status> {
        let device = caller(&self.core, &req, MemberKind::Device)?.id;
        // Subscribe before reading, so no change between the two is missed.
        let signal = self.core.events.member(MemberKind::Device, &device);
        let mut sent = None::<u64>;
        Ok(Response::new(member_stream(
            self.core.clone(),
            device,
            signal,
            move |core, device| {
                let set = assignments::current(&core.store, device)?;
                if sent == Some(set.generation) {
                    return Ok(vec![]);
                }
                sent = Some(set.generation);
                Ok(vec![set.to_proto()])
            },
        )))
    }

    type FetchArtifactStream = BoxStream<pb::ArtifactChunk>;

    async fn fetch_artifact(
        &self,
        req: Request<pb::FetchArtifactRequest>,
    ) -> Result<Response<Self::FetchArtifactStream>, Status> {
        let device = caller(&self.core, &req, MemberKind::Device)?.id;
        let req = req.into_inner();
        let digest: Digest = req
            .digest
            .parse()
            .map_err(|e| Error::bad_field("digest", format!("{e}")))?;
        let set = assignments::current(&self.core.store, &device)?;
        // A device reads what it is assigned, and what its unfinished
        // benchmarks time: nothing else in the store.
        let benchmarked = || -> Result<bool, Error> {
            Ok(
                benchmarks::unfinished_for(&self.core.store, &device, self.core.now())?
                    .iter()
                    .any(|b| b.references(digest)),
            )
        };
        if !set.references(digest) && !benchmarked()? {
            return Err(Error::PermissionDenied(format!(
                "artifact {digest} is not assigned to device/{device}"
            ))
            .into());
        }
        let chunks = super::downloads::stream_artifact(
            &self.core,
            MemberKind::Device.identity(&device),
            digest,
            req.offset,
            req.max_chunk_bytes,
            super::downloads::Caching::Cached,
        )
        .await?;
        let chunks = chunks
            .map(|c| {
                c.map(|c| pb::ArtifactChunk {
                    offset: c.offset,
                    data: c.data,
                    total_size: c.total_size,
                })
            })
            .boxed();
        Ok(Response::new(super::until_revoked(
            self.core.clone(),
            MemberKind::Device,
            device,
            chunks,
        )))
    }

    async fn report_telemetry(
        &self,
        req: Request<pb::TelemetryReport>,
    ) -> Result<Response<pb::TelemetryAck>, Status> {
        let device = caller(&self.core, &req, MemberKind::Device)?.id;
        let size = prost::Message::encoded_len(req.get_ref()) as u64;
        if !self.core.device_quotas.take_report(
            self.core.config.device_quota,
            &device,
            size,
            self.core.now(),
        ) {
            self.core
                .security
                .device_telemetry_throttled
                .fetch_add(1, Ordering::Relaxed);
            return Err(Error::ResourceExhausted(format!(
                "device/{device} sent more than {} MiB of telemetry in the last hour; retry later",
                self.core.config.device_quota.telemetry_bytes_per_hour >> 20
            ))
            .into());
        }
        let admit = telemetry::Admission {
            quota: self.core.config.device_quota,
            quotas: &self.core.device_quotas,
        };
        let (recorded, models) = telemetry::record_telemetry(
            &self.core.store,
            &admit,
            &device,
            req.into_inner(),
            self.core.now(),
        )?;
        let sec = &self.core.security;
        sec.foreign_device_data
            .fetch_add(recorded.refused_foreign, Ordering::Relaxed);
        sec.device_over_quota
            .fetch_add(recorded.refused_over_quota, Ordering::Relaxed);
        let acked = recorded.acked;
        for model in &models {
            edgeloop_drift::retention::enforce(
                &self.core.store.drift,
                model,
                self.core.config.max_samples_per_model,
            )?;
        }
        // The ack lets the agent drop its buffered copy, so persist first.
        self.core.store.flush().await.map_err(Error::from)?;
        Ok(Response::new(pb::TelemetryAck {
            acked_sequence: acked,
        }))
    }

    async fn report_assignment_status(
        &self,
        req: Request<pb::AssignmentStatusReport>,
    ) -> Result<Response<pb::AssignmentStatusAck>, Status> {
        let device = caller(&self.core, &req, MemberKind::Device)?.id;
        let recorded =
            telemetry::record_status(&self.core.store, &device, req.into_inner(), self.core.now());
        if let Err(Error::PermissionDenied(_)) = &recorded {
            self.core
                .security
                .foreign_device_data
                .fetch_add(1, Ordering::Relaxed);
        }
        recorded?;
        self.core.store.flush().await.map_err(Error::from)?;
        Ok(Response::new(pb::AssignmentStatusAck {}))
    }

    type WatchBenchmarksStream = BoxStream<pb::BenchmarkTask>;

    async fn watch_benchmarks(
        &self,
        req: Request<pb::WatchBenchmarksRequest>,
    ) -> Result<Response<Self::WatchBenchmarksStream>, Status> {
        let device = caller(&self.core, &req, MemberKind::Device)?.id;
        // Subscribe before reading, so no benchmark queued between the two
        // is missed.
        let signal = benchmarks::subscribe(&self.core.events, &device);
        // Sent on this stream; a new stream sends every unfinished one
        // again (the agent runs an id once).
        let mut sent = std::collections::HashSet::<String>::new();
        Ok(Response::new(member_stream(
            self.core.clone(),
            device,
            signal,
            move |core, device| {
                let mut out = vec![];
                for b in benchmarks::unfinished_for(&core.store, device, core.now())? {
                    if !sent.insert(b.id.clone()) {
                        continue;
                    }
                    if let Err(e) = benchmarks::delivered(&core.store, &b.id, core.now()) {
                        tracing::warn!(benchmark = %b.id, error = %e, "recording a delivered benchmark");
                    }
                    out.push(b.to_task());
                }
                Ok(out)
            },
        )))
    }

    async fn report_benchmark(
        &self,
        req: Request<pb::BenchmarkReport>,
    ) -> Result<Response<pb::BenchmarkAck>, Status> {
        let device = caller(&self.core, &req, MemberKind::Device)?.id;
        benchmarks::report(
            &self.core.store,
            &device,
            &req.into_inner(),
            self.core.now(),
        )
        .await?;
        Ok(Response::new(pb::BenchmarkAck {}))
    }
}

/// One device's long-lived stream: at the start and whenever its signal
/// changes, `poll` says what to send (nothing, or items in order). It ends
/// with PermissionDenied when the device is revoked, with the error when
/// the store fails, and quietly at shutdown or when the device hangs up.
/// The assignment and benchmark watches differ only in `poll`.
fn member_stream<T: Send + 'static>(
    core: Arc<Core>,
    device: String,
    mut signal: tokio::sync::watch::Receiver<crate::fleet::MemberSignal>,
    mut poll: impl FnMut(&Core, &str) -> Result<Vec<T>, Error> + Send + 'static,
) -> BoxStream<T> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            if signal.borrow_and_update().revoked {
                let _ = tx
                    .send(Err(Error::PermissionDenied(format!(
                        "device/{device} has been revoked"
                    ))
                    .into()))
                    .await;
                return;
            }
            match poll(&core, &device) {
                Ok(items) => {
                    for item in items {
                        if tx.send(Ok(item)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            }
            tokio::select! {
                _ = core.shutdown.cancelled() => return,
                _ = tx.closed() => return,
                changed = signal.changed() => if changed.is_err() {
                    return;
                },
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}
