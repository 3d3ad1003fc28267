//! The kubernetes engine against a real cluster (kind or any cluster you may
//! create Jobs in): `#[ignore]`d, since the suite has no cluster (the fake API
//! server's tests, tests/it/kubernetes_fake_api.rs, run instead); run with
//! `--ignored` and `KUBECONFIG` set, it fails without it. The namespace is `EDGELOOP_K8S_NAMESPACE` (default `default`), the
//! image `EDGELOOP_K8S_TEST_IMAGE` (default `busybox:1.36`, which must be
//! pullable by the nodes). The pods mount directories under
//! `/tmp/edgeloop-k8s-test` as `hostPath` volumes, which a node creates.
//!
//! ```text
//! kind create cluster && KUBECONFIG=~/.kube/config \
//!   cargo test -p edgeloop-trainer-bridge --test kubernetes_cluster -- --ignored --nocapture
//! ```

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use edgeloop_trainer_bridge::engines::kubernetes::{KubernetesEngine, KUBECONFIG_ENV};
use edgeloop_trainer_bridge::engines::{Engine, EngineJobId, EngineState, Launch, Launcher};

fn launch(jobs_root: &Path, job_id: &str, script: &str) -> Launch {
    let workdir = jobs_root.join(job_id);
    Launch {
        job_id: job_id.into(),
        attempt: 1,
        name: "cluster-test".into(),
        image: Some(
            std::env::var("EDGELOOP_K8S_TEST_IMAGE").unwrap_or_else(|_| "busybox:1.36".into()),
        ),
        pinned_image: None,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::from([(
            "EDGELOOP_CHECKPOINT_DIR".to_string(),
            workdir.join("checkpoints").display().to_string(),
        )]),
        workdir: workdir.clone(),
        nodes: 1,
        min_nodes: None,
        gpus_per_node: 0,
        cpus_per_node: 0,
        memory_mb: 64,
        launcher: Launcher::Torchrun { nproc_per_node: 1 },
        log_path: workdir.join("attempt-1.log"),
        pool: None,
    }
}

async fn wait_for(
    engine: &KubernetesEngine,
    id: &EngineJobId,
    what: &str,
    done: impl Fn(&EngineState) -> bool,
) -> EngineState {
    // Generous: the first run pulls the image.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let state = engine.status(id).await.unwrap();
        if done(&state) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "{}: still {state:?}, wanted {what}",
            id.0
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
#[ignore = "needs a real Kubernetes cluster: KUBECONFIG=... cargo test -p edgeloop-trainer-bridge --test kubernetes_cluster -- --ignored"]
async fn real_cluster_runs_fails_and_cancels_jobs() {
    if std::env::var_os(KUBECONFIG_ENV).is_none_or(|v| v.is_empty()) {
        panic!("KUBECONFIG is not set: this test needs a real cluster (e.g. kind create cluster)");
    }
    let jobs_root = Path::new("/tmp/edgeloop-k8s-test/jobs");
    let engine = KubernetesEngine::from_env(jobs_root).unwrap();
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 100_000_000;

    let ok = engine
        .submit(&launch(
            jobs_root,
            &format!("ok-{run:08}"),
            "echo hello-from-$NODE_RANK-of-$WORLD_SIZE",
        ))
        .await
        .unwrap();
    let fails = engine
        .submit(&launch(jobs_root, &format!("fails-{run:08}"), "exit 3"))
        .await
        .unwrap();
    let long = engine
        .submit(&launch(
            jobs_root,
            &format!("long-{run:08}"),
            "exec sleep 600",
        ))
        .await
        .unwrap();

    let state = wait_for(&engine, &ok, "terminal", EngineState::is_terminal).await;
    assert_eq!(state, EngineState::Succeeded);
    let logs = engine.logs(&ok).await.unwrap();
    assert!(logs.contains("hello-from-0-of-1"), "{logs:?}");

    match wait_for(&engine, &fails, "terminal", EngineState::is_terminal).await {
        EngineState::Failed { exit_code, reason } => assert_eq!(exit_code, Some(3), "{reason}"),
        other => panic!("{other:?}"),
    }

    wait_for(&engine, &long, "running", |s| *s == EngineState::Running).await;
    engine.cancel(&long).await.unwrap();
    assert_eq!(engine.status(&long).await.unwrap(), EngineState::Cancelled);

    for id in [&ok, &fails] {
        engine.cancel(id).await.unwrap();
    }
}
