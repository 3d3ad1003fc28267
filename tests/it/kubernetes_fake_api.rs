//! The kubernetes engine against a **fake** API server
//! (`edgeloop_tests::fake_k8s`, a fake kubelet that runs each pod's command
//! as a local process): submit, status, cancel and logs through the real
//! `Engine` implementation and kube's client; node pools from the fake's
//! nodes, and GPU jobs placed on them by the fake scheduler.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgeloop_tests::eventually;
use edgeloop_tests::fake_k8s::{default_node, FakeKubernetes, FakeOptions};
use edgeloop_trainer_bridge::engines::kubernetes::{KubernetesEngine, Settings, SharedVolume};
use edgeloop_trainer_bridge::engines::{
    Engine, EngineError, EngineJobId, EngineState, Launch, Launcher, NodePool,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

const NS: &str = "ml";

fn engine(fake: &FakeKubernetes) -> KubernetesEngine {
    KubernetesEngine::with_url(
        &fake.url,
        None,
        Settings {
            namespace: NS.into(),
            volume: SharedVolume::HostPath,
            pull_policy: None,
            pull_secret: None,
        },
    )
    .unwrap()
}

fn launch(dir: &Path, job_id: &str, script: &str) -> Launch {
    let workdir = dir.join("jobs").join(job_id);
    Launch {
        job_id: job_id.into(),
        attempt: 1,
        name: "train".into(),
        image: Some("busybox:1.36".into()),
        pinned_image: None,
        command: vec![
            "sh".into(),
            "-c".into(),
            script.into(),
            "argv0".into(),
            "$(HOME) $$".into(),
        ],
        env: BTreeMap::from([
            ("EDGELOOP_JOB_ID".to_string(), job_id.to_string()),
            (
                "EDGELOOP_CHECKPOINT_DIR".to_string(),
                workdir.join("checkpoints").display().to_string(),
            ),
        ]),
        workdir: workdir.clone(),
        nodes: 1,
        min_nodes: None,
        gpus_per_node: 0,
        cpus_per_node: 1,
        memory_mb: 128,
        launcher: Launcher::None,
        log_path: workdir.join("attempt-1.log"),
        pool: None,
    }
}

async fn terminal(engine: &KubernetesEngine, id: &EngineJobId, secs: u64) -> EngineState {
    eventually(Duration::from_secs(secs), "a terminal state", || async {
        Some(engine.status(id).await.unwrap()).filter(EngineState::is_terminal)
    })
    .await
}

#[tokio::test]
async fn fake_api_a_two_node_torchrun_job_runs_to_succeeded_and_its_logs_come_back() {
    let fake = FakeKubernetes::start().await;
    let engine = engine(&fake);
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(
        dir.path(),
        "train-0000beef",
        r#"env > "out-$NODE_RANK"; printf '%s|' "$@" > "args-$NODE_RANK"; echo "hello from $NODE_RANK""#,
    );
    l.nodes = 2;
    l.launcher = Launcher::Torchrun { nproc_per_node: 1 };
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(id.0, "train-0000beef-1");
    // A retried submit of the same attempt finds it instead of failing.
    assert_eq!(engine.submit(&l).await.unwrap(), id);
    assert_eq!(fake.jobs(), [format!("{NS}/{}", id.0)]);

    assert_eq!(terminal(&engine, &id, 30).await, EngineState::Succeeded);
    for node in ["0", "1"] {
        let env = std::fs::read_to_string(l.workdir.join(format!("out-{node}"))).unwrap();
        for want in [
            format!("NODE_RANK={node}"),
            format!("RANK={node}"),
            format!("JOB_COMPLETION_INDEX={node}"),
            "WORLD_SIZE=2".to_string(),
            "NNODES=2".to_string(),
            "LOCAL_RANK=0".to_string(),
            format!("MASTER_ADDR={0}-0.{0}", id.0),
            "MASTER_PORT=29500".to_string(),
            format!(
                "EDGELOOP_CHECKPOINT_DIR={}",
                l.workdir.join("checkpoints").display()
            ),
        ] {
            assert!(
                env.lines().any(|line| line == want),
                "{want} in node {node}'s env:\n{env}"
            );
        }
        let args = std::fs::read_to_string(l.workdir.join(format!("args-{node}"))).unwrap();
        assert_eq!(args, "$(HOME) $$|", "words reach the process unexpanded");
    }
    let logs = engine.logs(&id).await.unwrap();
    assert_eq!(logs, "hello from 0\n", "the index-0 pod's log");

    let svc = fake.service(NS, &id.0).unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None");
    let job = fake.job(NS, &id.0).unwrap();
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["uid"],
        job.metadata.uid.unwrap().as_str(),
        "the Job owns its Service"
    );
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}

#[tokio::test]
async fn fake_api_a_failing_command_ends_failed_with_its_exit_code() {
    let fake = FakeKubernetes::start().await;
    let engine = engine(&fake);
    let dir = tempfile::tempdir().unwrap();
    // Node 1 fails; the failure policy ends the Job and stops node 0.
    let mut l = launch(
        dir.path(),
        "fails-00000001",
        r#"if [ "$JOB_COMPLETION_INDEX" = 1 ]; then echo boom >&2; exit 7; fi; exec sleep 60"#,
    );
    l.nodes = 2;
    let started = std::time::Instant::now();
    let id = engine.submit(&l).await.unwrap();
    match terminal(&engine, &id, 30).await {
        EngineState::Failed { exit_code, reason } => {
            assert_eq!(exit_code, Some(7), "{reason}");
            assert!(
                reason.contains("PodFailurePolicy") && reason.contains("exit code 7"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "node 0 was stopped, not waited for"
    );
    assert_eq!(fake.live_processes(), 0);
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}

#[tokio::test]
async fn fake_api_cancel_kills_the_job_and_it_disappears() {
    let fake = FakeKubernetes::start().await;
    let engine = engine(&fake);
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(dir.path(), "long-00000002", "echo started; exec sleep 120");
    l.nodes = 2;
    let id = engine.submit(&l).await.unwrap();
    eventually(Duration::from_secs(20), "running", || async {
        Some(()).filter(|_| fake.live_processes() == 2)
    })
    .await;
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Running);

    engine.cancel(&id).await.unwrap();
    assert!(fake.job(NS, &id.0).is_none());
    assert!(fake.services().is_empty(), "{:?}", fake.services());
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Cancelled);
    eventually(Duration::from_secs(10), "processes killed", || async {
        Some(()).filter(|_| fake.live_processes() == 0)
    })
    .await;
    // Already gone: still fine.
    engine.cancel(&id).await.unwrap();
    let deletes: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("DELETE"))
        .collect();
    assert_eq!(
        deletes[..2],
        [
            format!("DELETE /apis/batch/v1/namespaces/{NS}/jobs/{}", id.0),
            format!("DELETE /api/v1/namespaces/{NS}/services/{}", id.0),
        ],
        "{deletes:?}"
    );
    assert_eq!(
        fake.job_deletions()[0],
        format!("{NS}/{} Background", id.0),
        "pods go with the Job"
    );

    // A Job this engine never had is not found.
    let other = EngineJobId("never-submitted-1".into());
    assert!(matches!(
        engine.status(&other).await,
        Err(EngineError::NotFound(_))
    ));
    assert!(matches!(
        engine.logs(&other).await,
        Err(EngineError::NotFound(_))
    ));
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}

#[tokio::test]
async fn fake_api_an_unschedulable_job_is_pending_without_logs() {
    let fake = FakeKubernetes::start_with(FakeOptions {
        gpus_per_node: 1,
        ..Default::default()
    })
    .await;
    let engine = engine(&fake);
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(dir.path(), "big-00000003", "echo never");
    l.gpus_per_node = 8;
    let id = engine.submit(&l).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Pending);
    assert_eq!(engine.logs(&id).await.unwrap(), "");
    assert_eq!(fake.live_processes(), 0);
    engine.cancel(&id).await.unwrap();
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Cancelled);
    assert!(fake.pods().is_empty());
}

#[tokio::test]
async fn fake_api_refusals_and_credentials() {
    let fake = FakeKubernetes::start_with(FakeOptions {
        token: Some("sesame".into()),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        namespace: NS.into(),
        volume: SharedVolume::HostPath,
        pull_policy: None,
        pull_secret: None,
    };
    let anonymous = KubernetesEngine::with_url(&fake.url, None, settings.clone()).unwrap();
    let mut l = launch(dir.path(), "auth-00000004", "true");

    l.image = None;
    match anonymous.submit(&l).await {
        Err(EngineError::Refused(m)) => assert!(m.contains("kubernetes needs an image"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(fake.requests().is_empty(), "refused before any request");
    l.image = Some("busybox".into());

    match anonymous.submit(&l).await {
        Err(EngineError::Unavailable(m)) => assert!(m.contains("401"), "{m}"),
        other => panic!("{other:?}"),
    }
    let engine = KubernetesEngine::with_url(&fake.url, Some("sesame".into()), settings).unwrap();
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(terminal(&engine, &id, 20).await, EngineState::Succeeded);
}

#[tokio::test]
async fn fake_api_a_checkpoint_claim_is_mounted_at_the_same_paths() {
    let fake = FakeKubernetes::start().await;
    let dir = tempfile::tempdir().unwrap();
    let jobs_root: PathBuf = dir.path().join("jobs");
    fake.add_claim("edgeloop-jobs", &jobs_root);
    let engine = KubernetesEngine::with_url(
        &fake.url,
        None,
        Settings {
            namespace: NS.into(),
            volume: SharedVolume::Claim {
                name: "edgeloop-jobs".into(),
                root: jobs_root.clone(),
            },
            pull_policy: None,
            pull_secret: None,
        },
    )
    .unwrap();
    let l = launch(
        dir.path(),
        "claim-00000005",
        r#"mkdir -p "$EDGELOOP_CHECKPOINT_DIR/step-1" && echo 1 > "$EDGELOOP_CHECKPOINT_DIR/step-1/state.txt""#,
    );
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(terminal(&engine, &id, 20).await, EngineState::Succeeded);
    assert_eq!(
        std::fs::read_to_string(jobs_root.join("claim-00000005/checkpoints/step-1/state.txt"))
            .unwrap(),
        "1\n"
    );
    let pod = fake.pods().pop().unwrap();
    let mount = &pod.spec.unwrap().containers[0]
        .volume_mounts
        .clone()
        .unwrap()[0];
    assert_eq!(mount.sub_path.as_deref(), Some("claim-00000005"));
}

const A100: &str = "NVIDIA-A100-SXM4-80GB";

/// A node as NVIDIA's GPU Operator leaves it: the device plugin's
/// allocatable `nvidia.com/gpu`, GPU Feature Discovery's labels (both
/// namings of the versions), and the GPU taint.
fn a100_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": A100,
            "nvidia.com/gpu.count": "2",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/cuda.driver-version.major": "535",
            "nvidia.com/cuda.driver-version.minor": "104",
            "nvidia.com/cuda.driver-version.revision": "05",
            "nvidia.com/cuda.driver.major": "535",
            "nvidia.com/cuda.driver.minor": "104",
            "nvidia.com/cuda.driver.rev": "05",
            "nvidia.com/cuda.runtime-version.major": "12",
            "nvidia.com/cuda.runtime-version.minor": "2",
            "nvidia.com/cuda.runtime.major": "12",
            "nvidia.com/cuda.runtime.minor": "2",
        }},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"allocatable": {
            "cpu": "31500m", "memory": "257650Mi", "nvidia.com/gpu": "2", "pods": "110"
        }},
    }))
    .unwrap()
}

/// GPUs without a taint or GFD labels: where an unpinned GPU pod can go.
fn plain_gpu_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}},
    }))
    .unwrap()
}

fn scheduled_on(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().unwrap().node_name.clone()
}

#[tokio::test]
async fn fake_api_a_gfd_labelled_gpu_node_is_a_pool_and_a_gpu_job_lands_on_it() {
    // More nodes than fit one page of the engine's node list.
    let mut nodes: Vec<Node> = (0..510)
        .map(|i| {
            let mut n = default_node(0);
            n.metadata.name = Some(format!("cpu-{i}"));
            n
        })
        .collect();
    nodes.insert(3, plain_gpu_node("plain-0"));
    nodes.push(a100_node("a100-0"));
    let mut cordoned = a100_node("a100-cordoned");
    cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
    nodes.push(cordoned);
    let fake = FakeKubernetes::start_with(FakeOptions {
        nodes: Some(nodes),
        ..Default::default()
    })
    .await;
    let engine = engine(&fake);

    let pools = engine.pools().await.unwrap();
    let names: Vec<(&str, Option<u32>, u32)> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.nodes, p.gpus_per_node))
        .collect();
    assert_eq!(
        names,
        [
            ("cpu", Some(510), 0),
            ("gpu:4", Some(1), 4),
            (A100, Some(1), 2)
        ]
    );
    let a100 = pools[2].clone();
    assert_eq!(
        a100,
        NodePool {
            engine: "kubernetes".into(),
            name: A100.into(),
            nodes: Some(1),
            gpus_per_node: 2,
            gpu_type: Some(A100.into()),
            gpu_memory_bytes: Some(81920 * 1024 * 1024),
            driver_version: Some("535.104.05".into()),
            cuda_version: Some("12.2".into()),
            cpus_per_node: 31,
            memory_mb_per_node: 257650,
            source: "kubernetes GET /api/v1/nodes (GPU Feature Discovery labels)".into(),
            placement: BTreeMap::from([("nvidia.com/gpu.product".into(), A100.into())]),
            // Kubernetes pods run the job's image.
            containers: vec![edgeloop_api::images::ContainerWay::Kubernetes],
        }
    );
    assert_eq!(pools[0].source, "kubernetes GET /api/v1/nodes");
    let node_lists: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /api/v1/nodes"))
        .collect();
    assert_eq!(node_lists.len(), 2, "two pages: {node_lists:?}");
    assert!(node_lists[1].contains("continue="), "{node_lists:?}");

    // A 1-GPU job placed in the A100 pool.
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(
        dir.path(),
        "gpu-0000a100",
        r#"env > "env-$JOB_COMPLETION_INDEX"; test -d /dev/shm"#,
    );
    l.gpus_per_node = 1;
    l.pool = Some(a100.clone());
    l.env.insert("NCCL_DEBUG".into(), "INFO".into());
    l.env.insert("NCCL_SOCKET_IFNAME".into(), "lo".into());
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(terminal(&engine, &id, 30).await, EngineState::Succeeded);

    let pods = fake.pods();
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(
        scheduled_on(pod).as_deref(),
        Some("a100-0"),
        "the selector and the toleration take it past the untainted GPU node"
    );
    let v = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    assert_eq!(v["nodeSelector"], json!({"nvidia.com/gpu.product": A100}));
    assert_eq!(
        v["tolerations"],
        json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    );
    let c = &v["containers"][0];
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
    let shm = v["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|vol| vol["emptyDir"].is_object())
        .unwrap();
    assert_eq!(shm["emptyDir"], json!({"medium": "Memory"}));
    assert!(
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == shm["name"] && m["mountPath"] == "/dev/shm"),
        "{c}"
    );
    for (k, want) in [("NCCL_DEBUG", "INFO"), ("NCCL_SOCKET_IFNAME", "lo")] {
        assert!(
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == k && e["value"] == want),
            "{k} in {c}"
        );
    }
    // And the process got them.
    let env = std::fs::read_to_string(l.workdir.join("env-0")).unwrap();
    for want in ["NCCL_DEBUG=INFO", "NCCL_SOCKET_IFNAME=lo"] {
        assert!(env.lines().any(|line| line == want), "{want}:\n{env}");
    }

    // Without a pool the same job goes to the first node with GPUs.
    let mut unpinned = launch(dir.path(), "gpu-0000beef", "true");
    unpinned.gpus_per_node = 1;
    let id = engine.submit(&unpinned).await.unwrap();
    assert_eq!(terminal(&engine, &id, 30).await, EngineState::Succeeded);
    let pod = fake
        .pods()
        .into_iter()
        .find(|p| p.metadata.name.as_deref().unwrap().starts_with(&id.0))
        .unwrap();
    assert_eq!(scheduled_on(&pod).as_deref(), Some("plain-0"));

    // More GPUs than the pool's nodes have: Pending, the scheduler says why.
    let mut big = launch(dir.path(), "gpu-00000big", "true");
    big.gpus_per_node = 8;
    big.pool = Some(a100);
    let id = engine.submit(&big).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Pending);
    let pod = fake
        .pods()
        .into_iter()
        .find(|p| p.metadata.name.as_deref().unwrap().starts_with(&id.0))
        .unwrap();
    let message = pod.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert!(
        message.starts_with("0/513 nodes are available:")
            && message.contains("1 Insufficient nvidia.com/gpu")
            && message.contains("1 node(s) were unschedulable"),
        "{message}"
    );
    engine.cancel(&id).await.unwrap();
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}

#[tokio::test]
async fn fake_api_the_default_node_is_one_cpu_pool() {
    let fake = FakeKubernetes::start().await;
    let pools = engine(&fake).pools().await.unwrap();
    assert_eq!(pools.len(), 1, "{pools:?}");
    let p = &pools[0];
    assert_eq!(
        (p.name.as_str(), p.nodes, p.gpus_per_node, p.cpus_per_node),
        ("cpu", Some(1), 0, 8)
    );
    assert_eq!(p.memory_mb_per_node, 32 * 1024);
    assert!(p.placement.is_empty());
}

/// A tag the node resolves is pinned from the started pod's `imageID`
/// (the fake kubelet reports a stand-in digest of the tag), and the next
/// attempt's pods name that digest, not the tag.
#[tokio::test]
async fn fake_api_a_tag_is_pinned_to_the_digest_the_node_resolved() {
    let fake = FakeKubernetes::start().await;
    let engine = engine(&fake);
    let dir = tempfile::tempdir().unwrap();
    let mut l = launch(dir.path(), "pin-0000beef", "true");
    let reference = l.image.clone().unwrap();
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(terminal(&engine, &id, 30).await, EngineState::Succeeded);
    let pin = engine
        .resolved_image(&id, &reference)
        .await
        .unwrap()
        .expect("pinned once a pod started");
    assert_eq!(pin.kind, edgeloop_api::images::PinKind::Manifest);
    assert_eq!(
        pin.digest,
        edgeloop_models::Digest::of(reference.as_bytes())
    );
    assert_eq!(pin.reference, reference);

    l.attempt = 2;
    l.pinned_image = Some(pin.clone());
    let id2 = engine.submit(&l).await.unwrap();
    let job = fake.job(NS, &id2.0).unwrap();
    let image = job.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert_eq!(image, format!("{reference}@sha256:{}", pin.digest));
    assert_eq!(terminal(&engine, &id2, 30).await, EngineState::Succeeded);
    assert_eq!(
        engine.resolved_image(&id2, &reference).await.unwrap(),
        Some(pin)
    );
    assert!(fake.unexpected().is_empty(), "{:?}", fake.unexpected());
}
