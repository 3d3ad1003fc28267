//! The launch, pool and settings every builder test starts from, and the
//! helpers that read a built Job the way the API server would: shared by
//! the tests of `builders`, `process` and `volumes`, which pin one object
//! from different sides.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde_json::Value;

use super::{build_job, Settings, SharedVolume, PRODUCT_LABEL};
use crate::engines::{Launch, Launcher, NodePool};
use crate::launch::CHECKPOINT_DIR;

pub(super) const JOB_ID: &str = "train-1a2b3c4d";
pub(super) const CKPT: &str = "/data/jobs/train-1a2b3c4d/checkpoints";

pub(super) fn launch() -> Launch {
    Launch {
        job_id: JOB_ID.into(),
        attempt: 2,
        name: "train".into(),
        image: Some("pytorch/pytorch:2.3.0-cuda12.1".into()),
        pinned_image: None,
        command: vec![
            "python".into(),
            "train.py".into(),
            "--lr".into(),
            "$(HOME) $$ $".into(),
        ],
        env: BTreeMap::from([
            ("EDGELOOP_JOB_ID".to_string(), JOB_ID.to_string()),
            (CHECKPOINT_DIR.to_string(), CKPT.to_string()),
            ("MASTER_PORT".to_string(), "29511".to_string()),
            ("PRICE".to_string(), "$(NODE_RANK)$5".to_string()),
        ]),
        workdir: PathBuf::from("/data/jobs/train-1a2b3c4d"),
        nodes: 2,
        min_nodes: None,
        gpus_per_node: 4,
        cpus_per_node: 16,
        memory_mb: 64000,
        launcher: Launcher::Torchrun { nproc_per_node: 1 },
        log_path: PathBuf::from("/data/jobs/train-1a2b3c4d/attempt-2.log"),
        pool: None,
    }
}

/// One process per pod, no GPUs: no `/dev/shm` volume.
pub(super) fn cpu_launch() -> Launch {
    let mut l = launch();
    l.gpus_per_node = 0;
    l
}

pub(super) fn a100_pool() -> NodePool {
    NodePool {
        engine: "kubernetes".into(),
        name: "NVIDIA-A100-SXM4-80GB".into(),
        nodes: Some(4),
        gpus_per_node: 8,
        gpu_type: Some("NVIDIA-A100-SXM4-80GB".into()),
        source: "kubernetes GET /api/v1/nodes (GPU Feature Discovery labels)".into(),
        placement: BTreeMap::from([(
            PRODUCT_LABEL.to_string(),
            "NVIDIA-A100-SXM4-80GB".to_string(),
        )]),
        ..NodePool::default()
    }
}

pub(super) fn pod_spec(job: &Job) -> &PodSpec {
    job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

pub(super) fn settings() -> Settings {
    Settings {
        namespace: "ml".into(),
        volume: SharedVolume::HostPath,
        pull_policy: None,
        pull_secret: None,
    }
}

/// The object as the API server receives it, and read back typed.
pub(super) fn wire<T: serde::Serialize + serde::de::DeserializeOwned>(obj: &T) -> (Value, T) {
    let v = serde_json::to_value(obj).unwrap();
    let back = serde_json::from_value(v.clone()).unwrap();
    (v, back)
}

pub(super) fn job_of(l: &Launch) -> (Value, Job) {
    wire(&build_job(l, &settings()).unwrap())
}

pub(super) fn container(job: &Job) -> &Container {
    &job.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
}

/// Plain values and downward-API paths of the container's env.
pub(super) fn env_of(job: &Job) -> BTreeMap<String, String> {
    container(job)
        .env
        .iter()
        .flatten()
        .map(|e| {
            let v = match (&e.value, &e.value_from) {
                (Some(v), None) => v.clone(),
                (None, Some(src)) => {
                    format!("field:{}", src.field_ref.as_ref().unwrap().field_path)
                }
                other => panic!("{}: {other:?}", e.name),
            };
            (e.name.clone(), v)
        })
        .collect()
}
