//! A **fake** Kubernetes API server for tests: no cluster, no containers.
//!
//! It serves, on `127.0.0.1:0`, only what the trainer bridge's kubernetes
//! engine calls: create/get/delete of `batch/v1` Jobs, create/get/patch/
//! delete of Services, pod lists by label selector, pod logs, and the node
//! list (`GET /api/v1/nodes`, paged with `limit`/`continue`) of the fake
//! nodes in [`FakeOptions::nodes`]. Anything else is answered 404 and
//! recorded in [`FakeKubernetes::unexpected`].
//!
//! It is also a fake kubelet: creating an Indexed Job starts one local
//! process per completion index, running the container's `command` + `args`
//! (the image is ignored) in its `workingDir`, with the container's `env`
//! (`$(VAR)` expansion and the downward API's completion index resolved as
//! the kubelet does) plus `JOB_COMPLETION_INDEX`. A started container's
//! `imageID` is the digest its reference names, or a stand-in digest of
//! the reference for a tag ([`resolved_image_id`]). Pod and Job status come
//! from the real exit codes: the pod failure policy's `FailJob` rules and
//! `backoffLimit`, the `FailureTarget` then `Failed` conditions once every
//! pod has stopped, `SuccessCriteriaMet` and `Complete`. Deleting a Job with
//! `propagationPolicy` `Background` or `Foreground` kills its processes and
//! garbage-collects the Services it owns; without one (the API's default for
//! Jobs) the pods are orphaned and keep running, as on a real cluster.
//!
//! What it refuses rather than pretends: `hostPath` volumes not mounted at
//! their own path and claims not registered with
//! [`FakeKubernetes::add_claim`] at a matching path (processes see the host's
//! filesystem), `backoffLimit` other than 0 and failure policy actions other
//! than `FailJob`/`Count` (it never replaces a pod). The only `emptyDir` it
//! mounts is a memory-backed one at `/dev/shm` (the processes get the
//! host's, which is memory too).
//!
//! A fake scheduler: a pod stays Pending (unschedulable) unless some fake
//! node is not cordoned, carries every label of the pod's `nodeSelector`,
//! has only `NoSchedule`/`NoExecute` taints the pod tolerates, and offers
//! at least the pod's `nvidia.com/gpu` limit; the first such node is the
//! pod's `spec.nodeName`. Every node counts as empty: what other pods use
//! is not subtracted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Node, Pod, PodCondition, PodSpec, PodStatus, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// Options of a fake cluster.
#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// When set, every request must carry `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// `nvidia.com/gpu` the default fake node offers (when `nodes` is
    /// `None`); pods asking for more stay Pending.
    pub gpus_per_node: u32,
    /// The cluster's nodes, as `GET /api/v1/nodes` lists them and the fake
    /// scheduler places pods on. `None`: one node, `fake-node`, with 8 CPUs,
    /// 32Gi of memory, `gpus_per_node` GPUs and no GPU Feature Discovery
    /// labels.
    pub nodes: Option<Vec<Node>>,
}

/// The node of a cluster left at its default (see [`FakeOptions::nodes`]).
pub fn default_node(gpus: u32) -> Node {
    let mut allocatable = json!({"cpu": "8", "memory": "32Gi", "pods": "110"});
    if gpus > 0 {
        allocatable["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "fake-node", "labels": {"kubernetes.io/hostname": "fake-node"}},
        "spec": {},
        "status": {"capacity": allocatable.clone(), "allocatable": allocatable},
    }))
    .unwrap()
}

/// The fake API server (see the module docs).
pub struct FakeKubernetes {
    pub url: String,
    state: Arc<Mutex<State>>,
    shutdown: CancellationToken,
    _logs: tempfile::TempDir,
}

struct FakePod {
    pod: Pod,
    job: String,
    pgid: Option<i32>,
    log: PathBuf,
    /// Deleted with its Job: the record goes when the process has exited.
    deleting: bool,
}

#[derive(Default)]
struct State {
    options: FakeOptions,
    nodes: Vec<Node>,
    claims: BTreeMap<String, PathBuf>,
    jobs: BTreeMap<(String, String), Job>,
    services: BTreeMap<(String, String), Value>,
    pods: BTreeMap<(String, String), FakePod>,
    serial: u64,
    log_dir: PathBuf,
    requests: Vec<String>,
    unexpected: Vec<String>,
    job_deletions: Vec<String>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn status_body(code: StatusCode, reason: &str, message: &str) -> Response {
    (
        code,
        axum::Json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
        })),
    )
        .into_response()
}

fn not_found(kind: &str, name: &str) -> Response {
    status_body(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{kind} \"{name}\" not found"),
    )
}

fn invalid(kind: &str, name: &str, why: &str) -> Response {
    status_body(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{kind} \"{name}\" is invalid: {why}"),
    )
}

fn success() -> Response {
    (
        StatusCode::OK,
        axum::Json(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        ),
    )
        .into_response()
}

fn json_response<T: serde::Serialize>(code: StatusCode, value: &T) -> Response {
    (code, axum::Json(serde_json::to_value(value).unwrap())).into_response()
}

fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A JSON merge patch (RFC 7386).
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn selector_matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap_or((term, ""));
        labels.get(k.trim()).map(String::as_str) == Some(v.trim())
    })
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            url_decode_pairs(q)
                .into_iter()
                .collect::<BTreeMap<String, String>>()
        })
        .unwrap_or_default()
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(v) => {
                            out.push(v);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

impl FakeKubernetes {
    pub async fn start() -> FakeKubernetes {
        Self::start_with(FakeOptions::default()).await
    }

    pub async fn start_with(options: FakeOptions) -> FakeKubernetes {
        let logs = tempfile::tempdir().unwrap();
        let nodes = options
            .nodes
            .clone()
            .unwrap_or_else(|| vec![default_node(options.gpus_per_node)]);
        let state = Arc::new(Mutex::new(State {
            nodes,
            options,
            log_dir: logs.path().to_path_buf(),
            ..Default::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = shared.clone();
                async move { handle(state, method, uri, headers, body).await }
            },
        );
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .unwrap();
        });
        FakeKubernetes {
            url,
            state,
            shutdown,
            _logs: logs,
        }
    }

    /// Registers a PersistentVolumeClaim whose contents are `dir` on this
    /// machine.
    pub fn add_claim(&self, name: &str, dir: &Path) {
        lock(&self.state)
            .claims
            .insert(name.to_string(), dir.to_path_buf());
    }

    pub fn job(&self, namespace: &str, name: &str) -> Option<Job> {
        lock(&self.state)
            .jobs
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// `namespace/name` of every Job.
    pub fn jobs(&self) -> Vec<String> {
        lock(&self.state)
            .jobs
            .keys()
            .map(|(ns, n)| format!("{ns}/{n}"))
            .collect()
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.state)
            .services
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// `namespace/name` of every Service.
    pub fn services(&self) -> Vec<String> {
        lock(&self.state)
            .services
            .keys()
            .map(|(ns, n)| format!("{ns}/{n}"))
            .collect()
    }

    pub fn pods(&self) -> Vec<Pod> {
        lock(&self.state)
            .pods
            .values()
            .map(|p| p.pod.clone())
            .collect()
    }

    /// How many pods' process groups are still alive.
    pub fn live_processes(&self) -> usize {
        lock(&self.state)
            .pods
            .values()
            .filter_map(|p| p.pgid)
            .filter(|pgid| killpg(Pid::from_raw(*pgid), None).is_ok())
            .count()
    }

    /// Every request, as `METHOD /path?query`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }

    /// Every Job deletion, as `namespace/name propagationPolicy`.
    pub fn job_deletions(&self) -> Vec<String> {
        lock(&self.state).job_deletions.clone()
    }

    /// Requests the fake does not implement.
    pub fn unexpected(&self) -> Vec<String> {
        lock(&self.state).unexpected.clone()
    }

    /// Stops serving and kills every process it started.
    pub fn stop(&self) {
        self.shutdown.cancel();
        for p in lock(&self.state).pods.values() {
            if let Some(pgid) = p.pgid {
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            }
        }
    }
}

impl Drop for FakeKubernetes {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let line = match uri.query().filter(|q| !q.is_empty()) {
        Some(q) => format!("{method} {}?{q}", uri.path()),
        None => format!("{method} {}", uri.path()),
    };
    {
        let mut s = lock(&state);
        s.requests.push(line.clone());
        if let Some(token) = s.options.token.clone() {
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if auth != format!("Bearer {token}") {
                return status_body(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
            }
        }
    }
    let segs: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let q = query(&uri);
    match (method.clone(), segs.as_slice()) {
        (Method::POST, ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => {
            create_job(&state, ns, &body)
        }
        (Method::GET, ["apis", "batch", "v1", "namespaces", ns, "jobs", name]) => {
            match lock(&state).jobs.get(&(ns.to_string(), name.to_string())) {
                Some(job) => json_response(StatusCode::OK, job),
                None => not_found("jobs.batch", name),
            }
        }
        (Method::DELETE, ["apis", "batch", "v1", "namespaces", ns, "jobs", name]) => {
            delete_job(&state, ns, name, &q, &body)
        }
        (Method::POST, ["api", "v1", "namespaces", ns, "services"]) => {
            create_service(&state, ns, &body)
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "services", name]) => {
            match lock(&state)
                .services
                .get(&(ns.to_string(), name.to_string()))
            {
                Some(svc) => json_response(StatusCode::OK, svc),
                None => not_found("services", name),
            }
        }
        (Method::PATCH, ["api", "v1", "namespaces", ns, "services", name]) => {
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if ct != "application/merge-patch+json" {
                return status_body(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    &format!("the fake applies merge patches only, not {ct:?}"),
                );
            }
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status_body(StatusCode::BAD_REQUEST, "BadRequest", "patch is not JSON");
            };
            let mut s = lock(&state);
            match s.services.get_mut(&(ns.to_string(), name.to_string())) {
                Some(svc) => {
                    merge_patch(svc, &patch);
                    json_response(StatusCode::OK, svc)
                }
                None => not_found("services", name),
            }
        }
        (Method::DELETE, ["api", "v1", "namespaces", ns, "services", name]) => {
            match lock(&state)
                .services
                .remove(&(ns.to_string(), name.to_string()))
            {
                Some(_) => success(),
                None => not_found("services", name),
            }
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "pods"]) => {
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            let s = lock(&state);
            let items: Vec<&Pod> = s
                .pods
                .iter()
                .filter(|((pns, _), _)| pns == ns)
                .map(|(_, p)| &p.pod)
                .filter(|p| {
                    selector_matches(
                        &selector,
                        p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                    )
                })
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": s.serial.to_string()}, "items": items}),
            )
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "pods", name, "log"]) => {
            pod_log(&state, ns, name, &q)
        }
        (Method::GET, ["api", "v1", "nodes"]) => list_nodes(&state, &q),
        _ => {
            lock(&state).unexpected.push(line.clone());
            status_body(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("the fake Kubernetes API does not implement {line}"),
            )
        }
    }
}

/// A page of nodes: `continue` is the index of the next one.
fn list_nodes(state: &Arc<Mutex<State>>, q: &BTreeMap<String, String>) -> Response {
    let s = lock(state);
    let from: usize = match q.get("continue").map(|c| c.parse()) {
        None => 0,
        Some(Ok(i)) => i,
        Some(Err(_)) => {
            return status_body(
                StatusCode::GONE,
                "Expired",
                "the continue token is not ours",
            )
        }
    };
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let items: Vec<&Node> = s.nodes.iter().skip(from).take(limit).collect();
    let next = from.saturating_add(items.len());
    let mut metadata = json!({"resourceVersion": s.serial.to_string()});
    if next < s.nodes.len() {
        metadata["continue"] = json!(next.to_string());
    }
    json_response(
        StatusCode::OK,
        &json!({"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": items}),
    )
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            t.key.as_deref() == Some(taint.key.as_str())
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    };
    effect && key
}

/// Why `node` cannot take a pod of `spec` asking for `gpus`.
fn refuses(node: &Node, spec: &PodSpec, gpus: u32) -> Option<&'static str> {
    let node_spec = node.spec.clone().unwrap_or_default();
    if node_spec.unschedulable == Some(true) {
        return Some("node(s) were unschedulable");
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if spec
        .node_selector
        .iter()
        .flatten()
        .any(|(k, v)| labels.get(k) != Some(v))
    {
        return Some("node(s) didn't match Pod's node affinity/selector");
    }
    let untolerated = node_spec
        .taints
        .iter()
        .flatten()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .any(|taint| {
            !spec
                .tolerations
                .iter()
                .flatten()
                .any(|t| tolerates(t, taint))
        });
    if untolerated {
        return Some("node(s) had untolerated taint");
    }
    let have: u32 = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("nvidia.com/gpu"))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0);
    (gpus > have).then_some("Insufficient nvidia.com/gpu")
}

/// The first node that can take the pod; else the scheduler's message.
fn schedule(nodes: &[Node], pod: &Pod) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let gpus: u32 = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("nvidia.com/gpu"))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0);
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for node in nodes {
        match refuses(node, spec, gpus) {
            None => return Ok(node.metadata.name.clone().unwrap_or_default()),
            Some(why) => *reasons.entry(why).or_default() += 1,
        }
    }
    let reasons: Vec<String> = reasons
        .iter()
        .map(|(why, n)| format!("{n} {why}"))
        .collect();
    Err(format!(
        "0/{} nodes are available: {}.",
        nodes.len(),
        reasons.join(", ")
    ))
}

fn next_serial(s: &mut State) -> u64 {
    s.serial += 1;
    s.serial
}

fn create_service(state: &Arc<Mutex<State>>, ns: &str, body: &[u8]) -> Response {
    let Ok(mut svc) = serde_json::from_slice::<Value>(body) else {
        return status_body(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
    };
    let name = svc["metadata"]["name"].as_str().unwrap_or("").to_string();
    // Service names are DNS-1035 labels: a letter first.
    if !is_dns_label(&name) || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return invalid("Service", &name, "metadata.name must be a DNS-1035 label");
    }
    if svc["spec"]["clusterIP"] != "None"
        && svc["spec"]["ports"].as_array().is_none_or(Vec::is_empty)
    {
        return invalid("Service", &name, "spec.ports: Required value");
    }
    let mut s = lock(state);
    let key = (ns.to_string(), name.clone());
    if s.services.contains_key(&key) {
        return status_body(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("services \"{name}\" already exists"),
        );
    }
    let serial = next_serial(&mut s);
    svc["metadata"]["namespace"] = json!(ns);
    svc["metadata"]["uid"] = json!(format!("svc-uid-{serial}"));
    svc["metadata"]["resourceVersion"] = json!(serial.to_string());
    s.services.insert(key, svc.clone());
    json_response(StatusCode::CREATED, &svc)
}

/// What the real API server would refuse, and what this fake cannot run.
fn check_job(s: &State, job: &Job) -> Result<(), String> {
    let spec = job.spec.as_ref().ok_or("spec: Required value")?;
    let pod = spec
        .template
        .spec
        .as_ref()
        .ok_or("spec.template.spec: Required value")?;
    if pod.restart_policy.as_deref() != Some("Never")
        && pod.restart_policy.as_deref() != Some("OnFailure")
    {
        return Err("spec.template.spec.restartPolicy: Unsupported value".into());
    }
    if spec.pod_failure_policy.is_some() && pod.restart_policy.as_deref() != Some("Never") {
        return Err("spec.podFailurePolicy: requires restartPolicy Never".into());
    }
    if spec.completion_mode.as_deref() != Some("Indexed") {
        return Err("the fake runs Indexed Jobs only".into());
    }
    let completions = spec
        .completions
        .ok_or("spec.completions: Required value for Indexed")?;
    if completions < 1 || spec.parallelism.unwrap_or(1) != completions {
        return Err("the fake runs completions = parallelism >= 1 only".into());
    }
    if spec.backoff_limit != Some(0) {
        return Err("the fake never replaces a pod: backoffLimit must be 0".into());
    }
    for rule in spec
        .pod_failure_policy
        .as_ref()
        .map(|p| p.rules.as_slice())
        .unwrap_or(&[])
    {
        if rule.action != "FailJob" && rule.action != "Count" {
            return Err(format!(
                "the fake does not implement action {}",
                rule.action
            ));
        }
    }
    let name = job.metadata.name.as_deref().unwrap_or("");
    // Pod hostnames are `<job>-<index>` and must be DNS labels.
    if !is_dns_label(&format!("{name}-{}", completions - 1)) {
        return Err("metadata.name: too long for the pods' hostnames".into());
    }
    if pod.containers.len() != 1 {
        return Err("the fake runs one container per pod".into());
    }
    let c = &pod.containers[0];
    if c.image.as_deref().unwrap_or("").is_empty() {
        return Err("spec.template.spec.containers[0].image: Required value".into());
    }
    if c.command.as_ref().is_none_or(Vec::is_empty) {
        return Err("the fake needs a command (it has no image entrypoint)".into());
    }
    let volumes = pod.volumes.clone().unwrap_or_default();
    for m in c.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(|| format!("volumeMounts {}: no such volume", m.name))?;
        if let Some(dir) = &v.empty_dir {
            if dir.medium.as_deref() == Some("Memory") && m.mount_path == "/dev/shm" {
                continue;
            }
            return Err(format!(
                "volume {}: the fake mounts a memory-backed emptyDir at /dev/shm only",
                v.name
            ));
        }
        let seen_at = if let Some(hp) = &v.host_path {
            PathBuf::from(&hp.path)
        } else if let Some(pvc) = &v.persistent_volume_claim {
            let dir = s
                .claims
                .get(&pvc.claim_name)
                .ok_or_else(|| format!("claim {} is not known to the fake", pvc.claim_name))?;
            dir.join(m.sub_path.as_deref().unwrap_or(""))
        } else {
            return Err(format!(
                "volume {}: the fake mounts hostPath and claims only",
                v.name
            ));
        };
        if seen_at != Path::new(&m.mount_path) {
            return Err(format!(
                "the fake runs processes on the host: {} would be {} in the pod",
                seen_at.display(),
                m.mount_path
            ));
        }
    }
    Ok(())
}

fn create_job(state: &Arc<Mutex<State>>, ns: &str, body: &[u8]) -> Response {
    let mut job: Job = match serde_json::from_slice(body) {
        Ok(j) => j,
        Err(e) => return status_body(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let name = job.metadata.name.clone().unwrap_or_default();
    if !is_dns_label(&name) {
        return invalid("Job.batch", &name, "metadata.name must be a DNS-1123 label");
    }
    let starts = {
        let mut s = lock(state);
        if let Err(why) = check_job(&s, &job) {
            return invalid("Job.batch", &name, &why);
        }
        let key = (ns.to_string(), name.clone());
        if s.jobs.contains_key(&key) {
            return status_body(
                StatusCode::CONFLICT,
                "AlreadyExists",
                &format!("jobs.batch \"{name}\" already exists"),
            );
        }
        let serial = next_serial(&mut s);
        job.metadata.namespace = Some(ns.to_string());
        job.metadata.uid = Some(format!("job-uid-{serial}"));
        job.metadata.resource_version = Some(serial.to_string());
        job.metadata.creation_timestamp = Some(now());
        let spec = job.spec.clone().unwrap();
        let completions = spec.completions.unwrap_or(1);
        job.status = Some(JobStatus {
            active: Some(completions),
            ready: Some(0),
            start_time: Some(now()),
            ..Default::default()
        });
        let mut starts = Vec::new();
        for index in 0..completions {
            let pod_name = format!("{name}-{index}-{:05x}", serial * 7919 + index as u64);
            let mut pod = new_pod(&job, ns, &pod_name, index);
            let log = s.log_dir.join(format!("{pod_name}.log"));
            let refused = match schedule(&s.nodes, &pod) {
                Ok(node) => {
                    pod.spec.as_mut().unwrap().node_name = Some(node);
                    None
                }
                Err(message) => Some(message),
            };
            let schedulable = refused.is_none();
            s.pods.insert(
                (ns.to_string(), pod_name.clone()),
                FakePod {
                    pod: pending(pod, refused),
                    job: name.clone(),
                    pgid: None,
                    log: log.clone(),
                    deleting: false,
                },
            );
            if schedulable {
                starts.push(pod_name);
            }
        }
        s.jobs.insert(key, job.clone());
        starts
    };
    for pod in starts {
        start_pod(state.clone(), ns.to_string(), pod);
    }
    json_response(
        StatusCode::CREATED,
        &lock(state).jobs[&(ns.to_string(), name)],
    )
}

fn new_pod(job: &Job, ns: &str, pod_name: &str, index: i32) -> Pod {
    let template = job.spec.as_ref().unwrap().template.clone();
    let job_name = job.metadata.name.clone().unwrap();
    let mut meta = template.metadata.unwrap_or_default();
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert("batch.kubernetes.io/job-name".into(), job_name.clone());
    labels.insert(INDEX_ANNOTATION.into(), index.to_string());
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(INDEX_ANNOTATION.into(), index.to_string());
    meta.name = Some(pod_name.to_string());
    meta.namespace = Some(ns.to_string());
    meta.uid = Some(format!("pod-uid-{pod_name}"));
    meta.creation_timestamp = Some(now());
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job_name.clone(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        ..Default::default()
    }]);
    let mut spec = template.spec.unwrap();
    spec.hostname = Some(format!("{job_name}-{index}"));
    Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    }
}

fn container_status(pod: &Pod, state: ContainerState, ready: bool) -> ContainerStatus {
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let image = c.image.clone().unwrap_or_default();
    // A kubelet reports the image's manifest once the container started.
    let started = state.running.is_some() || state.terminated.is_some();
    ContainerStatus {
        name: c.name.clone(),
        image_id: if started {
            resolved_image_id(&image)
        } else {
            String::new()
        },
        image,
        ready,
        restart_count: 0,
        state: Some(state),
        ..Default::default()
    }
}

/// The `imageID` a kubelet would report for `image`: the digest a
/// reference names, else a stand-in for the registry's answer for a tag
/// (the sha256 of the reference; the fake has no registry), after the name
/// without its tag, as containerd writes it.
pub fn resolved_image_id(image: &str) -> String {
    match image.split_once('@') {
        Some(_) => image.to_string(),
        None => {
            let name = match image.rsplit_once(':') {
                Some((name, tag)) if !tag.contains('/') => name,
                _ => image,
            };
            format!(
                "{name}@sha256:{}",
                edgeloop_models::Digest::of(image.as_bytes())
            )
        }
    }
}

/// A new pod, waiting to start or, with the scheduler's message, to be
/// scheduled.
fn pending(mut pod: Pod, unschedulable: Option<String>) -> Pod {
    let schedulable = unschedulable.is_none();
    let (reason, message) = match unschedulable {
        None => ("ContainerCreating", String::new()),
        Some(message) => ("Unschedulable", message),
    };
    let waiting = ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    };
    let cs = container_status(&pod, waiting, false);
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: if schedulable { "True" } else { "False" }.into(),
            reason: Some(reason.into()).filter(|_| !schedulable),
            ..Default::default()
        }]),
        container_statuses: Some(vec![cs]),
        ..Default::default()
    });
    pod
}

/// The resolved environment of the pod's container, in order, as the
/// kubelet builds it.
fn pod_env(pod: &Pod) -> Result<Vec<(String, String)>, String> {
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let mut env: Vec<(String, String)> = Vec::new();
    let mut defined: BTreeMap<String, String> = BTreeMap::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(src)) => {
                let field = src
                    .field_ref
                    .as_ref()
                    .ok_or_else(|| format!("{}: the fake resolves fieldRef only", e.name))?;
                let meta = &pod.metadata;
                match field.field_path.as_str() {
                    "metadata.name" => meta.name.clone().unwrap_or_default(),
                    "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
                    path => {
                        let key = path
                            .strip_prefix("metadata.annotations['")
                            .and_then(|k| k.strip_suffix("']"))
                            .ok_or_else(|| format!("{}: unsupported fieldPath {path}", e.name))?;
                        meta.annotations
                            .as_ref()
                            .and_then(|a| a.get(key))
                            .cloned()
                            .unwrap_or_default()
                    }
                }
            }
            (Some(v), None) => {
                edgeloop_trainer_bridge::engines::kubernetes::expand_like_kubernetes(v, &defined)
            }
            (None, None) => String::new(),
        };
        defined.insert(e.name.clone(), value.clone());
        env.push((e.name.clone(), value));
    }
    // The Job controller adds this one, after the template's.
    let index = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INDEX_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    env.push(("JOB_COMPLETION_INDEX".into(), index));
    Ok(env)
}

fn start_pod(state: Arc<Mutex<State>>, ns: String, pod_name: String) {
    let key = (ns.clone(), pod_name.clone());
    let spawned = {
        let mut s = lock(&state);
        let Some(fp) = s.pods.get_mut(&key) else {
            return;
        };
        let pod = fp.pod.clone();
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        let result = pod_env(&pod).and_then(|env| {
            let defined: BTreeMap<String, String> = env.iter().cloned().collect();
            let mut words: Vec<String> = c.command.clone().unwrap_or_default();
            words.extend(c.args.clone().unwrap_or_default());
            let words: Vec<String> = words
                .iter()
                .map(|w| {
                    edgeloop_trainer_bridge::engines::kubernetes::expand_like_kubernetes(
                        w, &defined,
                    )
                })
                .collect();
            // Container runtimes create a missing working directory.
            let workdir = PathBuf::from(c.working_dir.clone().unwrap_or_else(|| "/".into()));
            std::fs::create_dir_all(&workdir).map_err(|e| e.to_string())?;
            let log = std::fs::File::create(&fp.log).map_err(|e| e.to_string())?;
            let mut cmd = tokio::process::Command::new(&words[0]);
            cmd.args(&words[1..])
                .current_dir(&workdir)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", std::env::var("HOME").unwrap_or_default())
                .env(
                    "HOSTNAME",
                    pod.spec
                        .as_ref()
                        .unwrap()
                        .hostname
                        .clone()
                        .unwrap_or_default(),
                )
                .envs(env)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(false);
            cmd.spawn().map_err(|e| format!("{}: {e}", words[0]))
        });
        match result {
            Ok(child) => {
                fp.pgid = child.id().map(|p| p as i32);
                let running = ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(now()),
                    }),
                    ..Default::default()
                };
                let cs = container_status(&fp.pod, running, true);
                fp.pod.status = Some(PodStatus {
                    phase: Some("Running".into()),
                    start_time: Some(now()),
                    conditions: Some(vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]),
                    container_statuses: Some(vec![cs]),
                    ..Default::default()
                });
                Some(child)
            }
            Err(why) => {
                // As a container that cannot start: exit code 128.
                std::fs::write(&fp.log, format!("fake kubelet: {why}\n")).ok();
                finish_pod(fp, 128, Some("StartError"));
                None
            }
        }
    };
    reconcile(&state, &ns);
    if let Some(mut child) = spawned {
        tokio::spawn(async move {
            let status = child.wait().await;
            let code = match status {
                Ok(st) => {
                    use std::os::unix::process::ExitStatusExt;
                    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
                }
                Err(_) => 128,
            };
            {
                let mut s = lock(&state);
                let remove = match s.pods.get_mut(&key) {
                    Some(fp) => {
                        finish_pod(fp, code, None);
                        fp.deleting
                    }
                    None => false,
                };
                if remove {
                    s.pods.remove(&key);
                }
            }
            reconcile(&state, &ns);
        });
    }
}

fn finish_pod(fp: &mut FakePod, code: i32, reason: Option<&str>) {
    let reason = reason.unwrap_or(if code == 0 { "Completed" } else { "Error" });
    let started = fp.pod.status.as_ref().and_then(|s| s.start_time.clone());
    let terminated = ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            reason: Some(reason.into()),
            started_at: started,
            finished_at: Some(now()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let cs = container_status(&fp.pod, terminated, false);
    let status = fp.pod.status.get_or_insert_with(Default::default);
    status.phase = Some(if code == 0 { "Succeeded" } else { "Failed" }.into());
    status.conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: "False".into(),
        reason: Some("PodCompleted".into()),
        ..Default::default()
    }]);
    status.container_statuses = Some(vec![cs]);
    fp.pgid = None;
}

fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

fn terminate(pgid: i32) {
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    });
}

fn set_condition(status: &mut JobStatus, kind: &str, reason: &str, message: &str) {
    let conds = status.conditions.get_or_insert_with(Vec::new);
    if conds.iter().any(|c| c.type_ == kind) {
        return;
    }
    conds.push(JobCondition {
        type_: kind.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(now()),
        ..Default::default()
    });
}

/// The Job controller: counts pods, applies the failure policy, sets
/// conditions.
fn reconcile(state: &Arc<Mutex<State>>, ns: &str) {
    let mut s = lock(state);
    let names: Vec<String> = s
        .jobs
        .keys()
        .filter(|(jns, _)| jns == ns)
        .map(|(_, n)| n.clone())
        .collect();
    for name in names {
        let pods: Vec<(String, Pod, Option<i32>)> = s
            .pods
            .iter()
            .filter(|((pns, _), p)| pns == ns && p.job == name && !p.deleting)
            .map(|((_, pn), p)| (pn.clone(), p.pod.clone(), p.pgid))
            .collect();
        let key = (ns.to_string(), name.clone());
        let job = s.jobs.get_mut(&key).unwrap();
        let spec = job.spec.clone().unwrap();
        let status = job.status.get_or_insert_with(Default::default);
        let finished = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Complete" || c.type_ == "Failed");
        if finished {
            continue;
        }
        let phase = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default()
        };
        let succeeded = pods
            .iter()
            .filter(|(_, p, _)| phase(p) == "Succeeded")
            .count() as i32;
        let failed: Vec<&(String, Pod, Option<i32>)> = pods
            .iter()
            .filter(|(_, p, _)| phase(p) == "Failed")
            .collect();
        let running = pods
            .iter()
            .filter(|(_, p, _)| phase(p) == "Running")
            .count() as i32;
        let pending = pods
            .iter()
            .filter(|(_, p, _)| phase(p) == "Pending")
            .count() as i32;
        status.succeeded = Some(succeeded);
        status.failed = Some(failed.len() as i32);
        status.ready = Some(running);
        status.active = Some(running + pending);

        let has_target = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "FailureTarget");
        let mut to_kill = Vec::new();
        if !failed.is_empty() && !has_target {
            let (pod_name, pod, _) = failed[0];
            let code = exit_code(pod).unwrap_or(128);
            let container = &pod.spec.as_ref().unwrap().containers[0].name;
            let mut verdict: Option<(String, String)> = None;
            for (i, rule) in spec
                .pod_failure_policy
                .as_ref()
                .map(|p| p.rules.clone())
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let matched = rule.on_exit_codes.as_ref().is_some_and(|req| {
                    req.container_name.as_ref().is_none_or(|c| c == container)
                        && match req.operator.as_str() {
                            "In" => req.values.contains(&code),
                            "NotIn" => !req.values.contains(&code),
                            _ => false,
                        }
                });
                if matched {
                    if rule.action == "FailJob" {
                        verdict = Some((
                            "PodFailurePolicy".into(),
                            format!(
                                "Container {container} for pod {ns}/{pod_name} failed with exit code {code} matching FailJob rule at index {i}"
                            ),
                        ));
                    }
                    break;
                }
            }
            if verdict.is_none() && failed.len() as i32 > spec.backoff_limit.unwrap_or(6) {
                verdict = Some((
                    "BackoffLimitExceeded".into(),
                    "Job has reached the specified backoff limit".into(),
                ));
            }
            if let Some((reason, message)) = verdict {
                set_condition(status, "FailureTarget", &reason, &message);
                to_kill = pods.iter().filter_map(|(_, _, pgid)| *pgid).collect();
            }
        }
        let target = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "FailureTarget")
            .cloned();
        match target {
            // Failed only once every pod has stopped, as since Kubernetes 1.31.
            Some(t) if running == 0 => {
                // Unscheduled pods are removed by the controller.
                set_condition(
                    status,
                    "Failed",
                    t.reason.as_deref().unwrap_or(""),
                    t.message.as_deref().unwrap_or(""),
                );
                status.active = Some(0);
            }
            Some(_) => {}
            None if failed.is_empty() && succeeded == spec.completions.unwrap_or(1) => {
                set_condition(
                    status,
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                );
                set_condition(
                    status,
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                );
                status.completion_time = Some(now());
            }
            None => {}
        }
        for pgid in to_kill {
            terminate(pgid);
        }
    }
}

fn delete_job(
    state: &Arc<Mutex<State>>,
    ns: &str,
    name: &str,
    q: &BTreeMap<String, String>,
    body: &[u8],
) -> Response {
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let policy = options["propagationPolicy"]
        .as_str()
        .map(str::to_string)
        .or_else(|| q.get("propagationPolicy").cloned())
        // batch/v1 Jobs default to orphaning their pods.
        .unwrap_or_else(|| "Orphan".to_string());
    let mut s = lock(state);
    s.job_deletions.push(format!("{ns}/{name} {policy}"));
    let Some(job) = s.jobs.remove(&(ns.to_string(), name.to_string())) else {
        return not_found("jobs.batch", name);
    };
    if policy == "Orphan" {
        return success();
    }
    let uid = job.metadata.uid.clone().unwrap_or_default();
    s.services.retain(|_, svc| {
        !svc["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid.as_str()))
    });
    let mut gone = Vec::new();
    for (key, fp) in s.pods.iter_mut() {
        if key.0 == ns && fp.job == name {
            fp.deleting = true;
            match fp.pgid {
                Some(pgid) => terminate(pgid),
                None => gone.push(key.clone()),
            }
        }
    }
    for key in gone {
        s.pods.remove(&key);
    }
    success()
}

fn pod_log(
    state: &Arc<Mutex<State>>,
    ns: &str,
    name: &str,
    q: &BTreeMap<String, String>,
) -> Response {
    let (pod, log) = {
        let s = lock(state);
        match s.pods.get(&(ns.to_string(), name.to_string())) {
            Some(fp) => (fp.pod.clone(), fp.log.clone()),
            None => return not_found("pods", name),
        }
    };
    let container = pod.spec.as_ref().unwrap().containers[0].name.clone();
    if let Some(c) = q.get("container") {
        if *c != container {
            return status_body(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("container {c} is not valid for pod {name}"),
            );
        }
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if phase == "Pending" {
        return status_body(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"),
        );
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut text = match q.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => {
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            lines[lines.len().saturating_sub(n)..].concat()
        }
        None => text,
    };
    if let Some(limit) = q.get("limitBytes").and_then(|n| n.parse::<usize>().ok()) {
        let mut cut = limit.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    (StatusCode::OK, [("content-type", "text/plain")], text).into_response()
}
