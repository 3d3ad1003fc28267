//! The Ray engine against a real Ray head: start it first with
//!
//! ```text
//! scripts/ray-up.sh
//! cargo test -p edgeloop-trainer-bridge --test ray
//! ```
//!
//! The dashboard URL is read from the env file ray-up.sh writes
//! (`$EDGELOOP_RAY_ENV`, else `${EDGELOOP_RAY_DIR:-/tmp/edgeloop-ray}/env`).
//! Without it these tests fail; they never pass silently.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgeloop_trainer_bridge::engines::ray::{RayEngine, DASHBOARD_URL_ENV};
use edgeloop_trainer_bridge::engines::{
    Engine, EngineError, EngineJobId, EngineState, Launch, Launcher,
};

const DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(250);

fn env_file() -> PathBuf {
    if let Ok(p) = std::env::var("EDGELOOP_RAY_ENV") {
        return PathBuf::from(p);
    }
    let dir = std::env::var("EDGELOOP_RAY_DIR").unwrap_or_else(|_| "/tmp/edgeloop-ray".to_string());
    Path::new(&dir).join("env")
}

/// The engine for the head ray-up.sh started, checked to answer.
async fn engine() -> RayEngine {
    let path = env_file();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "no Ray env file at {} ({e}): run scripts/ray-up.sh first (or set EDGELOOP_RAY_ENV)",
            path.display()
        )
    });
    let url = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{DASHBOARD_URL_ENV}=")))
        .unwrap_or_else(|| {
            panic!(
                "{} has no {DASHBOARD_URL_ENV}=: rerun scripts/ray-up.sh",
                path.display()
            )
        });
    let engine = RayEngine::new(url.trim()).unwrap();
    match engine
        .status(&EngineJobId("edgeloop-probe-no-such-job".to_string()))
        .await
    {
        Err(EngineError::NotFound(_)) => engine,
        other => panic!("the Ray head at {url} does not answer ({other:?}): run scripts/ray-up.sh"),
    }
}

/// A job id no earlier run of these tests used (Ray keeps finished jobs).
fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{name}-{nanos}")
}

fn launch(name: &str, workdir: &Path, command: &[&str]) -> Launch {
    let job_id = unique(name);
    Launch {
        job_id: job_id.clone(),
        attempt: 0,
        name: name.to_string(),
        image: None,
        pinned_image: None,
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::from([
            ("EDGELOOP_JOB_ID".to_string(), job_id),
            ("EDGELOOP_RESUME_FROM".to_string(), String::new()),
            ("EDGELOOP_TEST_VALUE".to_string(), "a b 'c' $d".to_string()),
        ]),
        workdir: workdir.to_path_buf(),
        nodes: 1,
        min_nodes: None,
        gpus_per_node: 0,
        cpus_per_node: 0,
        memory_mb: 0,
        launcher: Launcher::None,
        log_path: workdir.join("job.log"),
        pool: None,
    }
}

async fn wait_for(
    engine: &RayEngine,
    id: &EngineJobId,
    done: impl Fn(&EngineState) -> bool,
) -> EngineState {
    let start = Instant::now();
    loop {
        let state = engine.status(id).await.unwrap();
        if done(&state) {
            return state;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "job {} still {state:?} after {DEADLINE:?}",
            id.0
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_terminal(engine: &RayEngine, id: &EngineJobId) -> EngineState {
    wait_for(engine, id, EngineState::is_terminal).await
}

#[tokio::test]
async fn a_gpu_job_succeeds_with_its_env_and_a_resubmit_is_the_same_job() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let workdir = dir.path().join("work dir");
    std::fs::create_dir(&workdir).unwrap();
    let tricky = "it's $HOME `id` \"q\" ;|& * \\";
    let mut l = launch(
        "env",
        &workdir,
        &[
            "sh",
            "-c",
            "env; printf 'ARG=%s\\n' \"$1\"; printf 'PWD=%s\\n' \"$(pwd)\"",
            "sh",
            tricky,
        ],
    );
    l.gpus_per_node = 1;
    l.cpus_per_node = 1;
    let started = Instant::now();
    let id = engine.submit(&l).await.unwrap();
    let again = engine.submit(&l).await.unwrap();
    assert_eq!(
        id, again,
        "a retried submit of the same attempt is the same Ray job"
    );

    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    eprintln!(
        "gpu env job: submit to Succeeded in {:?}",
        started.elapsed()
    );
    let logs = engine.logs(&id).await.unwrap();
    let cuda = logs
        .lines()
        .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| panic!("{logs}"));
    let devices = cuda.trim_start_matches("CUDA_VISIBLE_DEVICES=");
    assert!(
        devices == "0" || devices == "1",
        "one fake GPU expected, got {cuda:?}"
    );
    assert!(
        logs.contains(&format!("EDGELOOP_JOB_ID={}\n", l.job_id)),
        "{logs}"
    );
    assert!(logs.contains("EDGELOOP_TEST_VALUE=a b 'c' $d\n"), "{logs}");
    assert!(logs.contains(&format!("ARG={tricky}\n")), "{logs}");
    assert!(
        logs.contains(&format!("PWD={}\n", workdir.display())),
        "{logs}"
    );

    // After the job ended, submitting the attempt again still finds it.
    assert_eq!(engine.submit(&l).await.unwrap(), id);
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Succeeded);
    // A new attempt is a new Ray job.
    let next = engine
        .submit(&Launch {
            attempt: 1,
            ..l.clone()
        })
        .await
        .unwrap();
    assert_ne!(next, id);
    assert_eq!(wait_terminal(&engine, &next).await, EngineState::Succeeded);
}

#[tokio::test]
async fn a_failing_job_reports_its_exit_code() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let l = launch("exit3", dir.path(), &["sh", "-c", "echo failing; exit 3"]);
    let id = engine.submit(&l).await.unwrap();
    match wait_terminal(&engine, &id).await {
        EngineState::Failed { exit_code, reason } => {
            assert_eq!(exit_code, Some(3), "{reason}");
            assert!(reason.contains("exit code 3"), "{reason}");
            eprintln!("exit 3 reason: {reason}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert!(engine.logs(&id).await.unwrap().contains("failing"));
}

#[tokio::test]
async fn a_cancelled_job_ends_cancelled() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let l = launch("sleep", dir.path(), &["sleep", "300"]);
    let id = engine.submit(&l).await.unwrap();
    wait_for(&engine, &id, |s| *s == EngineState::Running).await;
    let started = Instant::now();
    engine.cancel(&id).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Cancelled);
    eprintln!("cancel to Cancelled in {:?}", started.elapsed());
    // Cancelling an ended job is not an error.
    engine.cancel(&id).await.unwrap();
}

#[tokio::test]
async fn an_unknown_job_is_not_found() {
    let engine = engine().await;
    let id = EngineJobId(unique("never-submitted"));
    assert!(matches!(
        engine.status(&id).await,
        Err(EngineError::NotFound(_))
    ));
    assert!(matches!(
        engine.logs(&id).await,
        Err(EngineError::NotFound(_))
    ));
    assert!(matches!(
        engine.cancel(&id).await,
        Err(EngineError::NotFound(_))
    ));
    // Characters that mean something in a URL are sent encoded, not interpreted.
    let odd = EngineJobId("../jobs/?x=1#y".to_string());
    assert!(matches!(
        engine.status(&odd).await,
        Err(EngineError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_multi_node_job_is_refused() {
    let engine = engine().await;
    let dir = tempfile::tempdir().unwrap();
    let l = Launch {
        nodes: 2,
        ..launch("two-nodes", dir.path(), &["true"])
    };
    match engine.submit(&l).await {
        Err(EngineError::Refused(why)) => assert!(why.contains("Ray Train"), "{why}"),
        other => panic!("expected Refused, got {other:?}"),
    }
}
