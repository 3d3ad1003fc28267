//! The Kubernetes objects of one attempt, built from its [`Launch`] by pure
//! functions ([`build`], [`build_job`], [`build_service`]) so the tests pin
//! every field the API server receives. Kept apart from the engine, which
//! only sends them: what a Job looks like is decided here and nowhere else
//! (the container's words and environment come from `process`, its volumes
//! from `volumes`, its name from `names`).
//!
//! - A Job named by [`object_name`] (`<job id>-<attempt>`, shortened with a
//!   hash to stay a DNS label), `completionMode: Indexed`, `completions =
//!   parallelism = nodes`: one pod per node, each knowing its index.
//!   `restartPolicy: Never`, `backoffLimit: 0` and a `podFailurePolicy` whose
//!   every rule is `FailJob`: Kubernetes never restarts or replaces a pod of
//!   ours. A pod that Kubernetes started again would run with the attempt's
//!   `EDGELOOP_RESUME_FROM` and `EDGELOOP_ATTEMPT`, resuming from a stale
//!   checkpoint under a reused attempt number; the bridge instead restarts
//!   the whole attempt, with backoff, from the newest committed checkpoint.
//!   `ttlSecondsAfterFinished` lets Kubernetes remove finished Jobs (and, by
//!   owner reference, their Service).
//! - A headless Service (`clusterIP: None`, `publishNotReadyAddresses`) of
//!   the same name selecting the Job's pods; the pod template's `subdomain`
//!   names it, so pod `i` resolves as `<name>-<i>.<name>` in the namespace.
//!
//! GPU jobs (`gpus_per_node > 0`) get:
//! - `nvidia.com/gpu` limits of `gpus_per_node` (an extended resource is
//!   requested at its limit);
//! - a `nodeSelector` of the placement of `Launch::pool`, the pool the
//!   pre-flight check held the job against ([`node_selector`]); a job
//!   without GPUs is not pinned to the pool it was placed in;
//! - a toleration of the usual GPU taint (`nvidia.com/gpu`, `Exists`,
//!   `NoSchedule`);
//! - a memory-backed `emptyDir` at `/dev/shm` for NCCL, also for any job
//!   with several processes per pod ([`needs_shm`]).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Container, LocalObjectReference, PodSpec, PodTemplateSpec, ResourceRequirements, Service,
    ServiceSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names::{label_value, object_name};
use super::nodes::{GPU_RESOURCE, GPU_TAINT};
use super::process::process;
use super::volumes::{needs_shm, shm, utf8, volumes};
use super::Settings;
use crate::engines::{EngineError, Launch, PinnedImage};

/// The job id, as a label value ([`label_value`]).
pub const LABEL_JOB_ID: &str = "edgeloop.io/job-id";
pub const LABEL_ATTEMPT: &str = "edgeloop.io/attempt";
/// Carried by the pods of one Job: what the Service and `logs` select on.
pub const LABEL_OBJECT: &str = "edgeloop.io/k8s-job";
/// The job id exactly (labels cannot hold every id).
pub const ANNOTATION_JOB_ID: &str = "edgeloop.io/job-id";
pub const CONTAINER_NAME: &str = "trainer";
/// Long enough to read a finished Job's status and logs after a bridge
/// restart; Kubernetes then removes the Job, its pods and its Service.
pub const TTL_SECONDS_AFTER_FINISHED: i32 = 24 * 3600;

/// The objects of one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Objects {
    pub job: Job,
    pub service: Service,
}

fn resources(launch: &Launch) -> ResourceRequirements {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if launch.cpus_per_node > 0 {
        let q = Quantity(launch.cpus_per_node.to_string());
        requests.insert("cpu".to_string(), q.clone());
        limits.insert("cpu".to_string(), q);
    }
    if launch.memory_mb > 0 {
        let q = Quantity(format!("{}Mi", launch.memory_mb));
        requests.insert("memory".to_string(), q.clone());
        limits.insert("memory".to_string(), q);
    }
    if launch.gpus_per_node > 0 {
        // Extended resources are limits only; the request defaults to it.
        limits.insert(
            GPU_RESOURCE.to_string(),
            Quantity(launch.gpus_per_node.to_string()),
        );
    }
    ResourceRequirements {
        requests: Some(requests).filter(|m| !m.is_empty()),
        limits: Some(limits).filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// The node labels a GPU job's pods must match: the placement this engine
/// wrote into the pool the pre-flight check chose (the GPU product, and the
/// driver labels where pools share a product). A job without GPUs is not
/// pinned even when it was placed in a GPU pool (the first pool it fits):
/// it would take GPU nodes' CPUs and memory, and need their taint.
pub fn node_selector(launch: &Launch) -> Option<BTreeMap<String, String>> {
    let pool = launch.pool.as_ref().filter(|p| p.engine == "kubernetes")?;
    Some(pool.placement.clone()).filter(|p| launch.gpus_per_node > 0 && !p.is_empty())
}

/// GPU nodes are commonly tainted `nvidia.com/gpu:NoSchedule` (GPU
/// Operator, cloud GPU node pools) so that only pods that need GPUs land
/// there: GPU jobs tolerate that taint, whatever its value.
fn tolerations(launch: &Launch) -> Option<Vec<Toleration>> {
    (launch.gpus_per_node > 0).then(|| {
        vec![Toleration {
            key: Some(GPU_TAINT.to_string()),
            operator: Some("Exists".to_string()),
            effect: Some("NoSchedule".to_string()),
            ..Default::default()
        }]
    })
}

fn labels(launch: &Launch) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JOB_ID.to_string(), label_value(&launch.job_id)),
        (LABEL_ATTEMPT.to_string(), launch.attempt.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "edgeloop-trainer-bridge".to_string(),
        ),
    ])
}

fn metadata(launch: &Launch, name: &str, settings: &Settings) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(settings.namespace.clone()),
        labels: Some(labels(launch)),
        annotations: Some(BTreeMap::from([(
            ANNOTATION_JOB_ID.to_string(),
            launch.job_id.clone(),
        )])),
        ..Default::default()
    }
}

/// The failure policy. `backoffLimit: 0` alone already ends the Job at the
/// first failed pod; these rules make that explicit for the two causes, and
/// give the `Failed` condition a message that names them (a preemption, or
/// the container and its exit code) instead of "BackoffLimitExceeded".
/// Disruptions are *not* `Ignore`d: an ignored disruption makes Kubernetes
/// start the pod again by itself, with the attempt's stale resume point (see
/// the module docs). A preemption therefore costs one of the job's restarts.
fn pod_failure_policy() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "FailJob".to_string(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".to_string(),
                    status: "True".to_string(),
                }]),
                on_exit_codes: None,
            },
            PodFailurePolicyRule {
                action: "FailJob".to_string(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(CONTAINER_NAME.to_string()),
                    operator: "NotIn".to_string(),
                    values: vec![0],
                }),
                on_pod_conditions: None,
            },
        ],
    }
}

/// The Job of one attempt (see the module docs).
pub fn build_job(launch: &Launch, settings: &Settings) -> Result<Job, EngineError> {
    let pinned = launch.pinned_image.as_ref().map(PinnedImage::runnable);
    let image = pinned
        .as_deref()
        .or(launch.image.as_deref())
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| {
            EngineError::Refused(
                "kubernetes needs an image: set `image` in the job spec (the container the \
                 command runs in)"
                    .to_string(),
            )
        })?;
    let name = object_name(&launch.job_id, launch.attempt);
    let nodes = i32::try_from(launch.nodes.max(1))
        .map_err(|_| EngineError::Refused(format!("{} nodes", launch.nodes)))?;
    let (words, env) = process(launch, &name)?;
    let (mut volumes, mut mounts) = volumes(launch, settings)?;
    if needs_shm(launch) {
        let (volume, mount) = shm();
        volumes.push(volume);
        mounts.push(mount);
    }
    let mut pod_labels = labels(launch);
    pod_labels.insert(LABEL_OBJECT.to_string(), name.clone());
    let container = Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(image.to_string()),
        command: Some(words[..1].to_vec()),
        args: Some(words[1..].to_vec()).filter(|a| !a.is_empty()),
        env: Some(env).filter(|e| !e.is_empty()),
        working_dir: Some(utf8("working directory", &launch.workdir)?),
        resources: Some(resources(launch)),
        volume_mounts: Some(mounts).filter(|m| !m.is_empty()),
        image_pull_policy: settings.pull_policy.map(|p| p.as_str().to_string()),
        ..Default::default()
    };
    Ok(Job {
        metadata: metadata(launch, &name, settings),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".to_string()),
            completions: Some(nodes),
            parallelism: Some(nodes),
            backoff_limit: Some(0),
            pod_failure_policy: Some(pod_failure_policy()),
            ttl_seconds_after_finished: Some(TTL_SECONDS_AFTER_FINISHED),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        ANNOTATION_JOB_ID.to_string(),
                        launch.job_id.clone(),
                    )])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_string()),
                    subdomain: Some(name.clone()),
                    // Service links would add variables for every Service in
                    // the namespace to the trainer's environment.
                    enable_service_links: Some(false),
                    containers: vec![container],
                    volumes: Some(volumes).filter(|v| !v.is_empty()),
                    node_selector: node_selector(launch),
                    tolerations: tolerations(launch),
                    image_pull_secrets: settings
                        .pull_secret
                        .as_ref()
                        .map(|name| vec![LocalObjectReference { name: name.clone() }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// The headless Service that gives the Job's pods their DNS names.
pub fn build_service(launch: &Launch, settings: &Settings) -> Service {
    let name = object_name(&launch.job_id, launch.attempt);
    Service {
        metadata: metadata(launch, &name, settings),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(BTreeMap::from([(LABEL_OBJECT.to_string(), name.clone())])),
            // Rank 0 must resolve while the other pods are still starting.
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    }
}

/// Both objects of an attempt.
pub fn build(launch: &Launch, settings: &Settings) -> Result<Objects, EngineError> {
    Ok(Objects {
        job: build_job(launch, settings)?,
        service: build_service(launch, settings),
    })
}

/// Is this object one of `launch`'s (same job id and attempt)?
pub(super) fn is_from(meta: &ObjectMeta, launch: &Launch) -> bool {
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_JOB_ID));
    let attempt = meta.labels.as_ref().and_then(|l| l.get(LABEL_ATTEMPT));
    annotation == Some(&launch.job_id) && attempt == Some(&launch.attempt.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::PathBuf;

    use serde_json::json;

    use super::*;
    use crate::engines::kubernetes::nodes::PRODUCT_LABEL;
    use crate::engines::kubernetes::test_fixtures::{
        a100_pool, container, cpu_launch, job_of, launch, pod_spec, settings, wire, JOB_ID,
    };
    use crate::engines::kubernetes::volumes::SHM_VOLUME;
    use crate::engines::{Launcher, NodePool};

    #[test]
    fn the_job_is_indexed_one_pod_per_node_and_kubernetes_never_restarts_a_pod() {
        let (v, job) = job_of(&launch());
        let name = "train-1a2b3c4d-2";
        assert_eq!(job.metadata.name.as_deref(), Some(name));
        assert_eq!(job.metadata.namespace.as_deref(), Some("ml"));
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((spec.completions, spec.parallelism), (Some(2), Some(2)));
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(
            spec.ttl_seconds_after_finished,
            Some(TTL_SECONDS_AFTER_FINISHED)
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.subdomain.as_deref(), Some(name));
        assert_eq!(pod.enable_service_links, Some(false));
        // The wire names the API server reads.
        assert_eq!(v["spec"]["completionMode"], "Indexed");
        assert_eq!(v["spec"]["template"]["spec"]["restartPolicy"], "Never");
        assert_eq!(v["apiVersion"], "batch/v1");
        assert_eq!(v["kind"], "Job");

        let rules = &spec.pod_failure_policy.as_ref().unwrap().rules;
        assert_eq!(rules.len(), 2);
        assert!(rules.iter().all(|r| r.action == "FailJob"), "{rules:?}");
        let cond = &rules[0].on_pod_conditions.as_ref().unwrap()[0];
        assert_eq!(
            (cond.type_.as_str(), cond.status.as_str()),
            ("DisruptionTarget", "True")
        );
        let codes = rules[1].on_exit_codes.as_ref().unwrap();
        assert_eq!(codes.container_name.as_deref(), Some(CONTAINER_NAME));
        assert_eq!(
            (codes.operator.as_str(), codes.values.as_slice()),
            ("NotIn", &[0][..])
        );

        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_JOB_ID], JOB_ID);
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(
            job.metadata.annotations.as_ref().unwrap()[ANNOTATION_JOB_ID],
            JOB_ID
        );
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(pod_labels[LABEL_OBJECT], name);
        assert_eq!(pod_labels[LABEL_JOB_ID], JOB_ID);
        assert_eq!(pod_labels[LABEL_ATTEMPT], "2");

        let c = container(&job);
        assert_eq!(c.name, CONTAINER_NAME);
        assert_eq!(c.image.as_deref(), Some("pytorch/pytorch:2.3.0-cuda12.1"));
        assert_eq!(c.working_dir.as_deref(), Some("/data/jobs/train-1a2b3c4d"));
    }

    #[test]
    fn resources_table() {
        let q = |s: &str| Quantity(s.to_string());
        // (gpus, cpus, memory_mb) -> (requests, limits)
        type Map = Option<BTreeMap<String, Quantity>>;
        let cases: Vec<((u32, u32, u64), Map, Map)> = vec![
            (
                (4, 16, 64000),
                Some(BTreeMap::from([
                    ("cpu".into(), q("16")),
                    ("memory".into(), q("64000Mi")),
                ])),
                Some(BTreeMap::from([
                    ("cpu".into(), q("16")),
                    ("memory".into(), q("64000Mi")),
                    ("nvidia.com/gpu".into(), q("4")),
                ])),
            ),
            (
                (1, 0, 0),
                None,
                Some(BTreeMap::from([("nvidia.com/gpu".into(), q("1"))])),
            ),
            (
                (0, 2, 0),
                Some(BTreeMap::from([("cpu".into(), q("2"))])),
                Some(BTreeMap::from([("cpu".into(), q("2"))])),
            ),
            ((0, 0, 0), None, None),
        ];
        for ((gpus, cpus, mem), requests, limits) in cases {
            let mut l = launch();
            (l.gpus_per_node, l.cpus_per_node, l.memory_mb) = (gpus, cpus, mem);
            let (_, job) = job_of(&l);
            let r = container(&job).resources.clone().unwrap();
            assert_eq!(r.requests, requests, "{gpus} {cpus} {mem}");
            assert_eq!(r.limits, limits, "{gpus} {cpus} {mem}");
        }
    }

    #[test]
    fn the_service_is_headless_and_names_the_pods_subdomain() {
        let (v, svc) = wire(&build_service(&launch(), &settings()));
        let (_, job) = job_of(&launch());
        let spec = svc.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(v["spec"]["clusterIP"], "None");
        assert_eq!(v["kind"], "Service");
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(svc.metadata.name, job.metadata.name);
        let template = &job.spec.as_ref().unwrap().template;
        assert_eq!(
            template.spec.as_ref().unwrap().subdomain,
            svc.metadata.name,
            "pods resolve as <job>-<i>.<service>"
        );
        let pod_labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (k, val) in spec.selector.as_ref().unwrap() {
            assert_eq!(pod_labels.get(k), Some(val), "the selector picks the pods");
        }
        assert!(is_from(&svc.metadata, &launch()));
        let mut other = launch();
        other.attempt = 3;
        assert!(!is_from(&svc.metadata, &other));
    }

    #[test]
    fn the_pods_run_the_pinned_image_with_the_pull_policy_and_secret() {
        use edgeloop_api::images::PinKind;
        let plain = build_job(&launch(), &settings()).unwrap();
        let c = container(&plain);
        assert_eq!(c.image_pull_policy, None);
        let pod = plain.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.image_pull_secrets, None);

        let digest = edgeloop_models::Digest::of(b"manifest");
        let mut l = launch();
        l.pinned_image = Some(PinnedImage {
            reference: "ghcr.io/acme/train:1".into(),
            digest,
            kind: PinKind::Manifest,
        });
        let s = Settings {
            pull_policy: Some(super::super::PullPolicy::IfNotPresent),
            pull_secret: Some("acme-registry".into()),
            ..settings()
        };
        let job = build_job(&l, &s).unwrap();
        let c = container(&job);
        assert_eq!(
            c.image.as_deref(),
            Some(format!("ghcr.io/acme/train:1@sha256:{digest}").as_str())
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(
            pod.image_pull_secrets,
            Some(vec![LocalObjectReference {
                name: "acme-registry".into()
            }])
        );
    }

    #[test]
    fn refusals() {
        let refused = |l: &Launch, needle: &str| match build(l, &settings()) {
            Err(EngineError::Refused(m)) => assert!(m.contains(needle), "{needle}: {m}"),
            other => panic!("{needle}: {other:?}"),
        };
        let mut l = launch();
        l.image = None;
        refused(&l, "kubernetes needs an image");
        l.image = Some("  ".into());
        refused(&l, "kubernetes needs an image");
        let mut l = launch();
        l.command.clear();
        refused(&l, "no command");
        let mut l = launch();
        l.command.push("a\0b".into());
        refused(&l, "NUL");
        let mut l = launch();
        l.env.insert("A=B".into(), "x".into());
        refused(&l, "not a valid environment variable name");
        let mut l = launch();
        l.env.insert("X".into(), "a\0".into());
        refused(&l, "NUL");
        let mut l = launch();
        l.launcher = Launcher::Torchrun { nproc_per_node: 0 };
        refused(&l, "nproc_per_node = 0");
        let mut l = launch();
        l.workdir = PathBuf::from("rel/dir");
        refused(&l, "must be absolute");
        let mut l = launch();
        l.launcher = Launcher::Horovod { slots_per_node: 0 };
        l.nodes = 1;
        refused(&l, "slots_per_node");
    }

    #[test]
    fn gpu_jobs_land_in_their_pool_tolerate_the_gpu_taint_and_get_shared_memory() {
        let nccl = [
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_IB_DISABLE", "1"),
        ];
        for launcher in [
            Launcher::None,
            Launcher::Torchrun { nproc_per_node: 1 },
            Launcher::Torchrun { nproc_per_node: 2 },
        ] {
            let mut l = launch();
            l.gpus_per_node = 2;
            l.launcher = launcher.clone();
            l.pool = Some(a100_pool());
            l.env
                .extend(nccl.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            let (v, job) = job_of(&l);
            let pod = pod_spec(&job);
            let limits = container(&job).resources.clone().unwrap().limits.unwrap();
            assert_eq!(limits[GPU_RESOURCE], Quantity("2".into()), "{launcher:?}");
            let wire_pod = &v["spec"]["template"]["spec"];
            assert_eq!(
                wire_pod["nodeSelector"],
                json!({PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}),
                "{launcher:?}"
            );
            assert_eq!(
                wire_pod["tolerations"],
                json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
                "{launcher:?}"
            );
            let shm = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == SHM_VOLUME)
                .unwrap();
            assert_eq!(
                shm.empty_dir.as_ref().unwrap().medium.as_deref(),
                Some("Memory")
            );
            assert_eq!(
                wire_pod["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == SHM_VOLUME)
                    .unwrap()["emptyDir"],
                json!({"medium": "Memory"})
            );
            // Every container of the template, so every pod of the Job, and
            // the torchrun workers that inherit its environment.
            assert!(!pod.containers.is_empty());
            for c in &pod.containers {
                let mounts = c.volume_mounts.as_ref().unwrap();
                assert!(
                    mounts
                        .iter()
                        .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm"),
                    "{mounts:?}"
                );
                let env: BTreeMap<&str, Option<&str>> = c
                    .env
                    .iter()
                    .flatten()
                    .map(|e| (e.name.as_str(), e.value.as_deref()))
                    .collect();
                for (k, want) in nccl {
                    assert_eq!(env.get(k), Some(&Some(want)), "{k} with {launcher:?}");
                }
            }
        }
    }

    #[test]
    fn jobs_without_gpus_are_not_pinned_and_get_no_gpu_extras() {
        // Placed in a GPU pool, the first one it fits: not pinned there.
        let mut l = cpu_launch();
        l.pool = Some(a100_pool());
        let (v, job) = job_of(&l);
        let pod = pod_spec(&job);
        assert_eq!(pod.node_selector, None);
        assert_eq!(pod.tolerations, None);
        assert!(v["spec"]["template"]["spec"]["nodeSelector"].is_null());
        assert!(!pod.volumes.iter().flatten().any(|v| v.name == SHM_VOLUME));
        let limits = container(&job).resources.clone().unwrap().limits.unwrap();
        assert!(!limits.contains_key(GPU_RESOURCE));

        // Several processes in one pod share memory: /dev/shm, no GPU taint.
        l.launcher = Launcher::Torchrun { nproc_per_node: 4 };
        let (_, job) = job_of(&l);
        let pod = pod_spec(&job);
        assert!(pod.volumes.iter().flatten().any(|v| v.name == SHM_VOLUME));
        assert_eq!(pod.tolerations, None);

        // A GPU job with no pool, or another engine's pool: no selector.
        let mut l = launch();
        assert_eq!(node_selector(&l), None);
        l.pool = Some(NodePool {
            engine: "slurm".into(),
            ..a100_pool()
        });
        assert_eq!(node_selector(&l), None);
        l.pool = Some(NodePool {
            placement: BTreeMap::new(),
            ..a100_pool()
        });
        assert_eq!(node_selector(&l), None, "a pool without a product label");
        let (_, job) = job_of(&l);
        assert_eq!(pod_spec(&job).tolerations.as_ref().unwrap().len(), 1);
    }
}
