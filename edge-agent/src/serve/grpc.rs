//! The Open Inference Protocol v2 gRPC service, `inference.GRPCInferenceService`
//! as KServe and Triton define it, on its own listener.
//!
//! A front end only: an infer request is routed, decoded (`grpc_tensor`)
//! and then takes the REST API's path through [`ModelHost::run_routed`]:
//! the same checks against the model, the same bounded per-version queue
//! and batcher, the same metrics and observer. Errors are
//! [`ServeError::to_status`], next to their HTTP statuses.
//!
//! Readiness answers like the REST API: the server is ready as soon as the
//! host runs, a model when a version serves; `ModelReady` for a model that
//! does not serve is `ready: false` (not an error), so clients' `is_model_ready`
//! returns false as it does over REST.

use std::sync::Arc;
use std::time::Instant;

use edgeloop_proto::inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use edgeloop_proto::inference::model_metadata_response::TensorMetadata;
use edgeloop_proto::inference::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse,
    ModelReadyRequest, ModelReadyResponse, ServerLiveRequest, ServerLiveResponse,
    ServerMetadataRequest, ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::grpc_tensor::{decode_inputs, encode_outputs};
use super::host::ModelHost;
use super::infer::new_request_id;
use super::protocol::{MetadataTensor, SERVER_NAME, SERVER_VERSION};

/// The service over a host.
#[derive(Debug, Clone)]
pub struct GrpcService {
    host: Arc<ModelHost>,
}

/// The service, ready to add to a tonic server: messages over the host's
/// `max_request_bytes` are refused before they are read (tonic answers
/// OUT_OF_RANGE, the code [`ServeError::TooLarge`] maps to).
///
/// [`ServeError::TooLarge`]: super::ServeError::TooLarge
pub fn grpc_service(host: Arc<ModelHost>) -> GrpcInferenceServiceServer<GrpcService> {
    let limit = host.config().max_request_bytes;
    GrpcInferenceServiceServer::new(GrpcService { host }).max_decoding_message_size(limit)
}

/// Serves [`grpc_service`] on `listener` until `shutdown`, then finishes the
/// requests in flight.
pub async fn serve_grpc(
    host: Arc<ModelHost>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let open = crate::config::ApiAccess {
        token_hash: None,
        tls: None,
        feedback_labels_per_minute: 1,
    };
    serve_grpc_with_access(host, listener, &open, shutdown).await
}

/// [`serve_grpc`] as `access` says: over TLS when it has a certificate,
/// and every call needing its bearer token or (mTLS) a client certificate
/// from its CAs (see [`super::access`]).
pub async fn serve_grpc_with_access(
    host: Arc<ModelHost>,
    listener: TcpListener,
    access: &crate::config::ApiAccess,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    // As on the REST listener: answers are small and written at once, and
    // Nagle's algorithm would hold them back waiting for an ACK.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &access.tls {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let mut config =
            ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
        if let Some(ca) = &tls.client_ca_pem {
            // Optional in the handshake, so that the token still works;
            // the interceptor then admits a call by one or the other.
            config = config
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(true);
        }
        server = server.tls_config(config)?;
    }
    server
        .layer(tonic::service::InterceptorLayer::new(
            super::access::GrpcAccess::new(access),
        ))
        .add_service(grpc_service(host))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}

/// The protocol's "not given" for a version: the empty string.
fn version(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

fn tensors(described: Vec<MetadataTensor>) -> Vec<TensorMetadata> {
    described
        .into_iter()
        .map(|t| TensorMetadata {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
        })
        .collect()
}

#[tonic::async_trait]
impl GrpcInferenceService for GrpcService {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: true }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let r = request.get_ref();
        let ready = self.host.resolve(&r.name, version(&r.version)).is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: SERVER_NAME.into(),
            version: SERVER_VERSION.into(),
            extensions: Vec::new(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let r = request.get_ref();
        let m = self.host.metadata(&r.name, version(&r.version))?;
        Ok(Response::new(ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform.into(),
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
        }))
    }

    /// Routed first (NOT_FOUND before anything is decoded), then decoded and
    /// run like a REST request; counted and observed whatever the outcome.
    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let target = self
            .host
            .resolve(&request.model_name, version(&request.model_version))?;
        let id = match request.id {
            id if id.is_empty() => new_request_id(),
            id => id,
        };
        let wanted = (!request.outputs.is_empty())
            .then(|| request.outputs.into_iter().map(|o| o.name).collect());
        let decoded = decode_inputs(request.inputs, request.raw_input_contents)
            .map(|inputs| (inputs, wanted));
        self.host
            .run_routed(&target, &id, decoded, started, |result| match result {
                Ok(outputs) => {
                    let (outputs, raw_output_contents) = encode_outputs(outputs);
                    Ok(Response::new(ModelInferResponse {
                        model_name: target.model.clone(),
                        model_version: target.version.clone(),
                        id: id.clone(),
                        parameters: Default::default(),
                        outputs,
                        raw_output_contents,
                    }))
                }
                Err(e) => Err(e.to_status()),
            })
            .await
    }
}
