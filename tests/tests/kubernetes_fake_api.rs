//! The kubernetes engine against a **fake** API server
//! (`edgeloop_tests::fake_k8s`, a fake kubelet that runs each pod's command
//! as a local process): submit, status, cancel and logs through the real
//! `Engine` implementation and kube's client.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgeloop_tests::eventually;
use edgeloop_tests::fake_k8s::{FakeKubernetes, FakeOptions};
use edgeloop_trainer_bridge::engines::kubernetes::{KubernetesEngine, Settings, SharedVolume};
use edgeloop_trainer_bridge::engines::{
    Engine, EngineError, EngineJobId, EngineState, Launch, Launcher,
};

const NS: &str = "ml";

fn engine(fake: &FakeKubernetes) -> KubernetesEngine {
    KubernetesEngine::with_url(
        &fake.url,
        None,
        Settings {
            namespace: NS.into(),
            volume: SharedVolume::HostPath,
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
