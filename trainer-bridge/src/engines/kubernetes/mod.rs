//! The Kubernetes engine: one job attempt is one Indexed `batch/v1` Job plus a
//! headless Service, created through the API server with `kube`. This file
//! is the engine itself ([`KubernetesEngine`]: its settings, the kube client
//! and the calls it makes); what it sends and how it reads the answers are
//! pure functions in the modules beside it, each tested without a cluster:
//!
//! - `builders`: the Job and the Service of an attempt ([`build`]);
//! - `process`: the container's words and environment per launcher, and the
//!   `$(VAR)` escaping;
//! - `volumes`: the directories shared with the bridge, and `/dev/shm`;
//! - `names`: object names and label values;
//! - `status`: a Job (and its pods) as an [`EngineState`] ([`map_status`]);
//! - [`nodes`]: the node pools, from the cluster's nodes.
//!
//! The public paths are those of the single file this engine was before
//! (everything is re-exported here), so callers name
//! `engines::kubernetes::X` whichever module `X` lives in.
//!
//! Pools ([`Engine::pools`], [`nodes::pools`]): the nodes of
//! `GET /api/v1/nodes` (paged), grouped by GPU product, GPU count, driver
//! and CUDA version; GPUs are the allocatable `nvidia.com/gpu`, the rest
//! comes from NVIDIA GPU Feature Discovery's labels (`nvidia.com/gpu.product`,
//! `nvidia.com/gpu.memory`, `nvidia.com/cuda.*`). Nodes without GPUs form
//! the `cpu` pool; cordoned nodes, and nodes tainted against every pod of
//! ours, are left out. A pool's `placement` is the node labels that select
//! it: `nvidia.com/gpu.product`, plus the driver labels where several pools
//! share a product. Nodes are cluster-scoped: the bridge's credentials need
//! `list` on `nodes` (a ClusterRole), or the bridge reports no pools.
//!
//! Status ([`Engine::status`]): the Job's conditions, mapped by `status`; a
//! Job this engine deleted reads as cancelled.
//!
//! Cancel deletes the Job with `propagationPolicy: Background` (the API's
//! default for Jobs orphans their pods) and the Service. The engine then
//! reports the missing Job as cancelled; a Job deleted by someone else is
//! [`EngineError::NotFound`], a failure the bridge restarts from.
//!
//! Settings ([`KubernetesEngine::from_env`]): `EDGELOOP_K8S_API_URL` (a plain
//! URL, with an optional bearer token in `EDGELOOP_K8S_TOKEN`; used against
//! the tests' fake API server) or else `KUBECONFIG` (kube's own loading:
//! contexts, client certificates, exec plugins); `EDGELOOP_K8S_NAMESPACE`
//! (default `default`); `EDGELOOP_K8S_CHECKPOINT_PVC` (see `volumes`).
//! `Launch::log_path` is not written: [`Engine::logs`] reads the logs of
//! the index-0 pod from the API.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};

use super::{Engine, EngineError, EngineJobId, EngineState, Launch, NodePool, PinnedImage};

mod builders;
mod names;
pub mod nodes;
mod process;
mod status;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod test_fixtures;
mod volumes;

pub use builders::{
    build, build_job, build_service, node_selector, Objects, ANNOTATION_JOB_ID, CONTAINER_NAME,
    LABEL_ATTEMPT, LABEL_JOB_ID, LABEL_OBJECT, TTL_SECONDS_AFTER_FINISHED,
};
pub use names::{is_dns_label, is_dns_subdomain, label_value, object_name, MAX_NAME_LEN};
pub use nodes::{GPU_RESOURCE, GPU_TAINT, PRODUCT_LABEL};
pub use process::{escape_expansion, expand_like_kubernetes, INDEX_ANNOTATION};
pub use status::{failure_exit_code, map_status};
pub use volumes::{absolutize, needs_shm, SHM_PATH, SHM_VOLUME};

use builders::is_from;
use status::condition;

/// A plain API server URL (`http://127.0.0.1:8001`, `https://...`); takes
/// precedence over `KUBECONFIG`.
pub const API_URL_ENV: &str = "EDGELOOP_K8S_API_URL";
/// Bearer token sent with [`API_URL_ENV`] (optional).
pub const TOKEN_ENV: &str = "EDGELOOP_K8S_TOKEN";
/// kube's usual kubeconfig variable.
pub const KUBECONFIG_ENV: &str = "KUBECONFIG";
pub const NAMESPACE_ENV: &str = "EDGELOOP_K8S_NAMESPACE";
/// A PersistentVolumeClaim holding the bridge's `<data dir>/jobs`.
pub const CHECKPOINT_PVC_ENV: &str = "EDGELOOP_K8S_CHECKPOINT_PVC";
/// `Always`, `IfNotPresent` or `Never`; unset: Kubernetes' default.
pub const IMAGE_PULL_POLICY_ENV: &str = "EDGELOOP_K8S_IMAGE_PULL_POLICY";
/// The Secret (of type `kubernetes.io/dockerconfigjson`, in the namespace)
/// the pods pull a private registry's image with.
pub const IMAGE_PULL_SECRET_ENV: &str = "EDGELOOP_K8S_IMAGE_PULL_SECRET";

/// At most this much of a pod's log is returned by `logs`.
pub const MAX_LOG_BYTES: i64 = 1 << 20;
const LOG_TAIL_LINES: i64 = 20_000;
/// Nodes per `GET /api/v1/nodes` page, and at most this many pages (a
/// server that keeps answering with a continue token is not trusted).
const NODE_PAGE: u32 = 500;
const MAX_NODE_PAGES: usize = 200;

/// Where the pods get the shared directories from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedVolume {
    /// `hostPath` volumes at the same paths (single-node clusters, kind).
    HostPath,
    /// A PersistentVolumeClaim whose root is `root` on the bridge.
    Claim { name: String, root: PathBuf },
}

/// What the builders need besides the launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub namespace: String,
    pub volume: SharedVolume,
    /// The pods' `imagePullPolicy`; `None`: Kubernetes' default.
    pub pull_policy: Option<PullPolicy>,
    /// The pods' `imagePullSecrets` entry.
    pub pull_secret: Option<String>,
}

/// When a node pulls a pod's image. A pinned image (`name@sha256:...`)
/// never changes, so `IfNotPresent` costs nothing in correctness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn parse(value: &str) -> Result<PullPolicy, String> {
        match value.trim() {
            "Always" => Ok(PullPolicy::Always),
            "IfNotPresent" => Ok(PullPolicy::IfNotPresent),
            "Never" => Ok(PullPolicy::Never),
            other => Err(format!(
                "{IMAGE_PULL_POLICY_ENV}: {other:?} is not an image pull policy (Always, \
                 IfNotPresent or Never)"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// How the engine reaches the API server.
#[derive(Clone)]
enum Source {
    Config(Box<kube::Config>),
    Kubeconfig(Box<kube::config::Kubeconfig>),
}

/// A Kubernetes cluster reached through its API server.
pub struct KubernetesEngine {
    source: Source,
    settings: Settings,
    /// Built on first use: kube's client needs a Tokio runtime, and loading a
    /// kubeconfig may run an exec plugin.
    client: tokio::sync::OnceCell<kube::Client>,
    /// Jobs this engine deleted: their absence means cancelled, not lost.
    cancelled: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for KubernetesEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Config(c) => format!("url {}", c.cluster_url),
            Source::Kubeconfig(_) => "kubeconfig".to_string(),
        };
        f.debug_struct("KubernetesEngine")
            .field("source", &source)
            .field("settings", &self.settings)
            .finish()
    }
}

const READ_TIMEOUT: Duration = Duration::from_secs(60);

fn unavailable(e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(e.to_string())
}

/// A kube error as an engine error.
fn api_error(what: &str, e: kube::Error) -> EngineError {
    match e {
        kube::Error::Api(s) => {
            let text = format!("{what}: HTTP {} {}: {}", s.code, s.reason, s.message);
            match s.code {
                404 => EngineError::NotFound(text),
                // The API server refused the object (invalid, forbidden,
                // over quota): submitting it again would not help.
                400 | 403 | 422 => EngineError::Refused(text),
                401 => EngineError::Unavailable(format!(
                    "{text} (are the credentials in {TOKEN_ENV} or the kubeconfig valid?)"
                )),
                429 | 500..=599 => EngineError::Unavailable(text),
                _ => EngineError::Protocol(text),
            }
        }
        kube::Error::SerdeError(e) => EngineError::Protocol(format!("{what}: {e}")),
        other => EngineError::Unavailable(format!("{what}: {other}")),
    }
}

fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl KubernetesEngine {
    /// An engine for the API server at `url` (`http://` or `https://`, with
    /// the system's roots), sending `token` as a bearer token.
    pub fn with_url(
        url: &str,
        token: Option<String>,
        settings: Settings,
    ) -> Result<Self, EngineError> {
        let url = url.trim().trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(EngineError::Unavailable(format!(
                "{API_URL_ENV} must start with http:// or https://, got {url:?}"
            )));
        }
        let uri = url
            .parse()
            .map_err(|e| EngineError::Unavailable(format!("{API_URL_ENV} {url:?}: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = settings.namespace.clone();
        config.read_timeout = Some(READ_TIMEOUT);
        if let Some(token) = token.filter(|t| !t.is_empty()) {
            config.auth_info.token = Some(token.into());
        }
        Self::new(Source::Config(Box::new(config)), settings)
    }

    /// An engine for the cluster of a kubeconfig (its current context).
    pub fn with_kubeconfig(
        kubeconfig: kube::config::Kubeconfig,
        settings: Settings,
    ) -> Result<Self, EngineError> {
        Self::new(Source::Kubeconfig(Box::new(kubeconfig)), settings)
    }

    fn new(source: Source, settings: Settings) -> Result<Self, EngineError> {
        if !is_dns_label(&settings.namespace) {
            return Err(EngineError::Unavailable(format!(
                "{NAMESPACE_ENV}: {:?} is not a namespace name",
                settings.namespace
            )));
        }
        Ok(Self {
            source,
            settings,
            client: tokio::sync::OnceCell::new(),
            cancelled: Mutex::new(HashSet::new()),
        })
    }

    /// From the environment (see the module docs). `jobs_root` is the
    /// bridge's `<data dir>/jobs`, what a checkpoint claim holds.
    pub fn from_env(jobs_root: &Path) -> Result<Self, EngineError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let settings = Settings {
            namespace: var(NAMESPACE_ENV).unwrap_or_else(|| "default".to_string()),
            volume: match var(CHECKPOINT_PVC_ENV) {
                Some(name) if is_dns_label(name.trim()) => SharedVolume::Claim {
                    name: name.trim().to_string(),
                    root: jobs_root.to_path_buf(),
                },
                Some(name) => {
                    return Err(EngineError::Unavailable(format!(
                        "{CHECKPOINT_PVC_ENV}: {name:?} is not a claim name"
                    )))
                }
                None => SharedVolume::HostPath,
            },
            pull_policy: var(IMAGE_PULL_POLICY_ENV)
                .map(|p| PullPolicy::parse(&p))
                .transpose()
                .map_err(EngineError::Unavailable)?,
            pull_secret: match var(IMAGE_PULL_SECRET_ENV) {
                Some(name) if is_dns_subdomain(name.trim()) => Some(name.trim().to_string()),
                Some(name) => {
                    return Err(EngineError::Unavailable(format!(
                        "{IMAGE_PULL_SECRET_ENV}: {name:?} is not a Secret name"
                    )))
                }
                None => None,
            },
        };
        if let Some(url) = var(API_URL_ENV) {
            return Self::with_url(&url, var(TOKEN_ENV), settings);
        }
        if var(KUBECONFIG_ENV).is_some() {
            // Read now so a broken file is reported at start, not at the
            // first job.
            let kubeconfig = kube::config::Kubeconfig::read()
                .map_err(|e| EngineError::Unavailable(format!("{KUBECONFIG_ENV}: {e}")))?;
            return Self::with_kubeconfig(kubeconfig, settings);
        }
        Err(EngineError::Unavailable(format!(
            "neither {API_URL_ENV} nor {KUBECONFIG_ENV} is set"
        )))
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    async fn client(&self) -> Result<kube::Client, EngineError> {
        self.client
            .get_or_try_init(|| async {
                edgeloop_client_core::install_crypto_provider();
                let config = match &self.source {
                    Source::Config(c) => (**c).clone(),
                    Source::Kubeconfig(k) => {
                        let mut c = kube::Config::from_custom_kubeconfig(
                            (**k).clone(),
                            &kube::config::KubeConfigOptions::default(),
                        )
                        .await
                        .map_err(|e| unavailable(format!("loading the kubeconfig: {e}")))?;
                        c.read_timeout = Some(READ_TIMEOUT);
                        c
                    }
                };
                kube::Client::try_from(config)
                    .map_err(|e| unavailable(format!("building the Kubernetes client: {e}")))
            })
            .await
            .cloned()
    }

    async fn jobs(&self) -> Result<Api<Job>, EngineError> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.settings.namespace,
        ))
    }

    async fn services(&self) -> Result<Api<Service>, EngineError> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.settings.namespace,
        ))
    }

    async fn pods(&self) -> Result<Api<Pod>, EngineError> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.settings.namespace,
        ))
    }

    /// Every node, a page at a time.
    async fn nodes(&self) -> Result<Vec<Node>, EngineError> {
        let api: Api<Node> = Api::all(self.client().await?);
        let mut lp = ListParams::default().limit(NODE_PAGE);
        let mut items = Vec::new();
        for _ in 0..MAX_NODE_PAGES {
            let page = api.list(&lp).await.map_err(|e| match e {
                // Nodes are cluster-scoped: a namespace's Role cannot grant them.
                kube::Error::Api(s) if s.code == 403 => EngineError::Unavailable(format!(
                    "listing nodes: HTTP 403 {}: {} (the bridge's credentials need `list` on \
                     `nodes`, granted by a ClusterRole)",
                    s.reason, s.message
                )),
                e => api_error("listing nodes", e),
            })?;
            items.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => return Ok(items),
            }
        }
        Err(EngineError::Protocol(format!(
            "listing nodes: still more after {MAX_NODE_PAGES} pages of {NODE_PAGE}"
        )))
    }

    async fn pods_of(&self, name: &str) -> Result<Vec<Pod>, EngineError> {
        let list = self
            .pods()
            .await?
            .list(&ListParams::default().labels(&format!("{LABEL_OBJECT}={name}")))
            .await
            .map_err(|e| api_error("listing pods", e))?;
        Ok(list.items)
    }

    fn was_cancelled(&self, name: &str) -> bool {
        self.cancelled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(name)
    }

    /// Ties the Service's lifetime to the Job, so the Job's TTL removes both.
    async fn adopt_service(&self, name: &str, job: &Job) {
        let Some(uid) = job.metadata.uid.clone() else {
            return;
        };
        let owner = OwnerReference {
            api_version: "batch/v1".to_string(),
            kind: "Job".to_string(),
            name: name.to_string(),
            uid,
            ..Default::default()
        };
        let patch = serde_json::json!({"metadata": {"ownerReferences": [owner]}});
        let result = match self.services().await {
            Ok(api) => api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| api_error("patching the Service", e)),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            // Not fatal: cancel deletes the Service; only the TTL misses it.
            tracing::warn!(service = name, error = %e, "could not make the Job own its Service");
        }
    }
}

/// A name that can be one of ours; anything else never reaches a URL.
fn checked_name(id: &EngineJobId) -> Result<&str, EngineError> {
    if is_dns_label(&id.0) {
        Ok(&id.0)
    } else {
        Err(EngineError::NotFound(id.0.clone()))
    }
}

#[async_trait]
impl Engine for KubernetesEngine {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    /// A reference with a digest is pinned to it; a tag is run as given
    /// and the node resolves it (the Job's pods carry the reference).
    async fn pin_image(
        &self,
        reference: &str,
        earlier: Option<&PinnedImage>,
    ) -> Result<Option<PinnedImage>, EngineError> {
        super::registry_pin(reference, earlier)
    }

    async fn submit(&self, launch: &Launch) -> Result<EngineJobId, EngineError> {
        let launch = absolutize(launch, &std::env::current_dir()?);
        let Objects { job, service } = build(&launch, &self.settings)?;
        let name = object_name(&launch.job_id, launch.attempt);
        let pp = PostParams::default();
        // The Service first, so `<name>-0.<name>` resolves when pods start.
        let services = self.services().await?;
        match services.create(&pp, &service).await {
            Ok(_) => {}
            Err(e) if is_already_exists(&e) => {
                let existing = services
                    .get(&name)
                    .await
                    .map_err(|e| api_error("reading the Service", e))?;
                if !is_from(&existing.metadata, &launch) {
                    return Err(EngineError::Refused(format!(
                        "a Service named {name} exists and is not job {}'s attempt {}",
                        launch.job_id, launch.attempt
                    )));
                }
            }
            Err(e) => return Err(api_error("creating the Service", e)),
        }
        let jobs = self.jobs().await?;
        let created = match jobs.create(&pp, &job).await {
            Ok(j) => j,
            Err(e) if is_already_exists(&e) => {
                // A retried submit of this attempt: the first one went through.
                let existing = jobs
                    .get(&name)
                    .await
                    .map_err(|e| api_error("reading the Job", e))?;
                if !is_from(&existing.metadata, &launch) {
                    return Err(EngineError::Refused(format!(
                        "a Job named {name} exists and is not job {}'s attempt {}",
                        launch.job_id, launch.attempt
                    )));
                }
                tracing::info!(job = %launch.job_id, attempt = launch.attempt, k8s_job = %name, "kubernetes: job already submitted");
                existing
            }
            Err(e) => return Err(api_error("creating the Job", e)),
        };
        self.adopt_service(&name, &created).await;
        tracing::info!(job = %launch.job_id, attempt = launch.attempt, k8s_job = %name, namespace = %self.settings.namespace, "submitted to Kubernetes");
        Ok(EngineJobId(name))
    }

    async fn status(&self, id: &EngineJobId) -> Result<EngineState, EngineError> {
        let name = checked_name(id)?;
        let job = match self.jobs().await?.get_opt(name).await {
            Ok(Some(job)) => job,
            Ok(None) if self.was_cancelled(name) => return Ok(EngineState::Cancelled),
            Ok(None) => return Err(EngineError::NotFound(id.0.clone())),
            Err(e) => return Err(api_error("reading the Job", e)),
        };
        if job.metadata.deletion_timestamp.is_some() {
            if self.was_cancelled(name) {
                return Ok(EngineState::Cancelled);
            }
            return Ok(EngineState::Failed {
                exit_code: None,
                reason: format!("the Kubernetes Job {name} was deleted (not by this bridge)"),
            });
        }
        let pods = if condition(&job, "Failed").is_some() {
            // Without the pods the failure is still reported, without a code.
            self.pods_of(name).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(map_status(&job, &pods))
    }

    async fn resolved_image(
        &self,
        id: &EngineJobId,
        reference: &str,
    ) -> Result<Option<PinnedImage>, EngineError> {
        let name = checked_name(id)?;
        Ok(status::resolved_image(
            reference,
            &self.pods_of(name).await?,
        ))
    }

    async fn cancel(&self, id: &EngineJobId) -> Result<(), EngineError> {
        let name = checked_name(id)?;
        self.cancelled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_string());
        // Background: the Job goes now and its pods right after; the API's
        // default for Jobs would leave the pods running.
        let dp = DeleteParams::background();
        match self.jobs().await?.delete(name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error("deleting the Job", e)),
        }
        match self.services().await?.delete(name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error("deleting the Service", e)),
        }
        tracing::info!(k8s_job = name, "kubernetes: job deleted");
        Ok(())
    }

    async fn pools(&self) -> Result<Vec<NodePool>, EngineError> {
        Ok(nodes::pools(&self.nodes().await?))
    }

    async fn logs(&self, id: &EngineJobId) -> Result<String, EngineError> {
        let name = checked_name(id)?;
        let pods = self.pods_of(name).await?;
        let index = |p: &Pod| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INDEX_ANNOTATION))
                .cloned()
        };
        let first = pods
            .iter()
            .filter(|p| index(p).as_deref() == Some("0"))
            .max_by(|a, b| {
                a.metadata
                    .creation_timestamp
                    .cmp(&b.metadata.creation_timestamp)
            });
        let Some(pod) = first.and_then(|p| p.metadata.name.clone()) else {
            // No pod yet, or no more: an unknown Job is an error.
            return match self.jobs().await?.get_opt(name).await {
                Ok(Some(_)) => Ok(String::new()),
                Ok(None) if self.was_cancelled(name) => Ok(String::new()),
                Ok(None) => Err(EngineError::NotFound(id.0.clone())),
                Err(e) => Err(api_error("reading the Job", e)),
            };
        };
        let lp = LogParams {
            container: Some(CONTAINER_NAME.to_string()),
            tail_lines: Some(LOG_TAIL_LINES),
            limit_bytes: Some(MAX_LOG_BYTES),
            ..Default::default()
        };
        match self.pods().await?.logs(&pod, &lp).await {
            Ok(text) => Ok(text),
            // The container has not started yet (or the pod just went).
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 404 => Ok(String::new()),
            Err(e) => Err(api_error("reading the pod's log", e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::test_fixtures::settings;
    use super::*;

    #[test]
    fn settings_are_checked() {
        let bad_ns = Settings {
            namespace: "Not_A_Namespace".into(),
            ..settings()
        };
        for (given, want) in [
            ("Always", Ok(PullPolicy::Always)),
            (" IfNotPresent", Ok(PullPolicy::IfNotPresent)),
            ("Never", Ok(PullPolicy::Never)),
        ] {
            assert_eq!(PullPolicy::parse(given), want);
        }
        let e = PullPolicy::parse("always").unwrap_err();
        assert!(
            e.contains(IMAGE_PULL_POLICY_ENV) && e.contains("IfNotPresent"),
            "{e}"
        );
        assert!(matches!(
            KubernetesEngine::with_url("http://127.0.0.1:1", None, bad_ns),
            Err(EngineError::Unavailable(_))
        ));
        assert!(matches!(
            KubernetesEngine::with_url("127.0.0.1:6443", None, settings()),
            Err(EngineError::Unavailable(_))
        ));
        let e = KubernetesEngine::with_url(
            "https://k8s.example:6443/",
            Some("secret-token".into()),
            settings(),
        )
        .unwrap();
        assert_eq!(e.name(), "kubernetes");
        let debug = format!("{e:?}");
        assert!(!debug.contains("secret-token"), "{debug}");
        assert!(debug.contains("k8s.example"), "{debug}");
        for bad in ["", "UPPER", "a/b", "../x", &"a".repeat(64)] {
            assert!(
                matches!(
                    checked_name(&EngineJobId(bad.into())),
                    Err(EngineError::NotFound(_))
                ),
                "{bad}"
            );
        }
    }
}
