//! The Slurm engine against a real Slurm 22.05 (slurmctld, slurmd,
//! slurmrestd with JWT) started by `scripts/slurm-up.sh`, which writes the
//! env file these tests read (`$EDGELOOP_SLURM_ENV`, else
//! `${EDGELOOP_SLURM_DIR:-/tmp/edgeloop-slurm}/env`). Without it they fail:
//! run `scripts/slurm-up.sh` first.
//!
//! The cluster is one node with 2 fake GPUs (GRES on /dev/null, /dev/zero);
//! the bridge and the node share this machine's filesystem.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use edgeloop_trainer_bridge::engines::slurm::SlurmEngine;
use edgeloop_trainer_bridge::engines::{
    Engine, EngineError, EngineJobId, EngineState, Launch, Launcher,
};

fn env_file() -> PathBuf {
    if let Ok(p) = std::env::var("EDGELOOP_SLURM_ENV") {
        return PathBuf::from(p);
    }
    let dir =
        std::env::var("EDGELOOP_SLURM_DIR").unwrap_or_else(|_| "/tmp/edgeloop-slurm".to_string());
    Path::new(&dir).join("env")
}

fn engine() -> SlurmEngine {
    let path = env_file();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the Slurm env file {} ({e}): run scripts/slurm-up.sh first \
             (or set EDGELOOP_SLURM_ENV to the env file it printed)",
            path.display()
        )
    });
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| {
        vars.get(k)
            .unwrap_or_else(|| panic!("{} has no {k}: rerun scripts/slurm-up.sh", path.display()))
            .to_string()
    };
    SlurmEngine::new(
        get("EDGELOOP_SLURMRESTD_URL"),
        get("EDGELOOP_SLURM_USER"),
        get("EDGELOOP_SLURM_JWT"),
        vars.get("EDGELOOP_SLURM_PARTITION").map(|s| s.to_string()),
    )
    .unwrap()
}

fn launch(dir: &Path, name: &str, command: &[&str]) -> Launch {
    Launch {
        job_id: format!("slurm-test-{name}"),
        attempt: 1,
        name: format!("edgeloop-test-{name}"),
        image: None,
        pinned_image: None,
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::from([
            ("EDGELOOP_JOB_ID".to_string(), format!("slurm-test-{name}")),
            (
                "EDGELOOP_CHECKPOINT_DIR".to_string(),
                dir.join("ckpt").display().to_string(),
            ),
            ("EDGELOOP_RESUME_FROM".to_string(), String::new()),
            (
                "EDGELOOP_ODD".to_string(),
                "it's $HOME `x` \"q\"".to_string(),
            ),
        ]),
        workdir: dir.to_path_buf(),
        nodes: 1,
        min_nodes: None,
        gpus_per_node: 0,
        cpus_per_node: 1,
        memory_mb: 100,
        launcher: Launcher::None,
        log_path: dir.join("job.log"),
        pool: None,
    }
}

/// A temp dir the job (running as root, in another process tree) can use.
fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("edgeloop-slurm-test-")
        .tempdir_in("/tmp")
        .unwrap()
}

/// Polls every 200 ms until `done` holds for the state, or the deadline.
async fn wait_for(
    engine: &SlurmEngine,
    id: &EngineJobId,
    secs: u64,
    done: impl Fn(&EngineState) -> bool,
) -> EngineState {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let state = engine.status(id).await.unwrap();
        if done(&state) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "Slurm job {} still {state:?} after {secs} s",
            id.0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn env_map(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn job_completes_with_fake_gpu_and_launch_env() {
    let engine = engine();
    let dir = tempdir();
    let mut l = launch(
        dir.path(),
        "env",
        &[
            "/bin/sh",
            "-c",
            "env > env.txt; printf '%s\\n' \"$1\"",
            "argv0",
            "it's $HOME `x` \"q\" *",
        ],
    );
    l.gpus_per_node = 1;
    let id = engine.submit(&l).await.unwrap();
    let state = wait_for(&engine, &id, 60, EngineState::is_terminal).await;
    let logs = engine.logs(&id).await.unwrap();
    assert_eq!(state, EngineState::Succeeded, "logs: {logs}");
    assert_eq!(
        logs, "it's $HOME `x` \"q\" *\n",
        "arguments reach the job verbatim"
    );

    let env = env_map(&std::fs::read_to_string(dir.path().join("env.txt")).unwrap());
    assert!(
        env.get("CUDA_VISIBLE_DEVICES")
            .is_some_and(|v| !v.is_empty()),
        "{env:?}"
    );
    assert_eq!(env["EDGELOOP_JOB_ID"], "slurm-test-env");
    assert_eq!(
        env["EDGELOOP_CHECKPOINT_DIR"],
        dir.path().join("ckpt").display().to_string()
    );
    assert_eq!(env["EDGELOOP_RESUME_FROM"], "");
    assert_eq!(env["EDGELOOP_ODD"], "it's $HOME `x` \"q\"");
    assert_eq!(env["SLURM_JOB_ID"], id.0);
    assert!(env["PATH"].contains("/bin"), "{env:?}");
    assert_eq!(env["PWD"], dir.path().display().to_string());
}

#[tokio::test]
async fn exit_3_is_failed_with_exit_code_3() {
    let engine = engine();
    let dir = tempdir();
    let id = engine
        .submit(&launch(
            dir.path(),
            "exit3",
            &["/bin/sh", "-c", "echo bye; exit 3"],
        ))
        .await
        .unwrap();
    let state = wait_for(&engine, &id, 60, EngineState::is_terminal).await;
    assert!(
        matches!(
            state,
            EngineState::Failed {
                exit_code: Some(3),
                ..
            }
        ),
        "{state:?}"
    );
    let logs = engine.logs(&id).await.unwrap();
    assert!(logs.contains("bye\n"), "{logs}");
    assert!(
        logs.contains("exit code 3"),
        "srun's report is in the log too: {logs}"
    );
}

#[tokio::test]
async fn cancel_stops_a_running_job() {
    let engine = engine();
    let dir = tempdir();
    let id = engine
        .submit(&launch(dir.path(), "cancel", &["sleep", "600"]))
        .await
        .unwrap();
    wait_for(&engine, &id, 60, |s| *s == EngineState::Running).await;
    engine.cancel(&id).await.unwrap();
    let state = wait_for(&engine, &id, 30, EngineState::is_terminal).await;
    assert_eq!(state, EngineState::Cancelled);
    // Cancelling again is harmless.
    engine.cancel(&id).await.unwrap();
}

#[tokio::test]
async fn more_gpus_than_a_node_has_is_refused() {
    let engine = engine();
    let dir = tempdir();
    let mut l = launch(dir.path(), "gpu3", &["true"]);
    l.gpus_per_node = 3;
    match engine.submit(&l).await {
        Err(EngineError::Refused(msg)) => {
            assert!(
                msg.contains("Requested node configuration is not available"),
                "{msg}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn unknown_job_is_not_found() {
    let engine = engine();
    for id in ["987654321", "not-a-job"] {
        let id = EngineJobId(id.to_string());
        assert!(
            matches!(engine.status(&id).await, Err(EngineError::NotFound(_))),
            "{id:?}"
        );
        assert!(
            matches!(engine.cancel(&id).await, Err(EngineError::NotFound(_))),
            "{id:?}"
        );
        assert!(
            matches!(engine.logs(&id).await, Err(EngineError::NotFound(_))),
            "{id:?}"
        );
    }
}

#[tokio::test]
async fn torchrun_launcher_sets_the_rendezvous_env() {
    let engine = engine();
    let dir = tempdir();
    let mut l = launch(dir.path(), "torchrun", &["/bin/sh", "-c", "env > env.txt"]);
    l.launcher = Launcher::Torchrun { nproc_per_node: 1 };
    let id = engine.submit(&l).await.unwrap();
    let state = wait_for(&engine, &id, 60, EngineState::is_terminal).await;
    assert_eq!(
        state,
        EngineState::Succeeded,
        "logs: {}",
        engine.logs(&id).await.unwrap()
    );
    let env = env_map(&std::fs::read_to_string(dir.path().join("env.txt")).unwrap());
    assert_eq!(env["RANK"], "0");
    assert_eq!(env["LOCAL_RANK"], "0");
    assert_eq!(env["NODE_RANK"], "0");
    assert_eq!(env["WORLD_SIZE"], "1");
    assert_eq!(env["NNODES"], "1");
    assert_eq!(env["NPROC_PER_NODE"], "1");
    assert!(!env["MASTER_ADDR"].is_empty(), "{env:?}");
    let port: u32 = env["MASTER_PORT"].parse().unwrap();
    let job: u32 = id.0.parse().unwrap();
    assert_eq!(port, 20000 + job % 10000);
    assert_eq!(env["EDGELOOP_JOB_ID"], "slurm-test-torchrun");
}

#[tokio::test]
async fn torchrun_launcher_starts_one_task_per_process() {
    let engine = engine();
    let dir = tempdir();
    let mut l = launch(
        dir.path(),
        "torchrun2",
        &["/bin/sh", "-c", "env > \"env-$RANK.txt\""],
    );
    l.launcher = Launcher::Torchrun { nproc_per_node: 2 };
    l.cpus_per_node = 2;
    let id = engine.submit(&l).await.unwrap();
    let state = wait_for(&engine, &id, 60, EngineState::is_terminal).await;
    assert_eq!(
        state,
        EngineState::Succeeded,
        "logs: {}",
        engine.logs(&id).await.unwrap()
    );
    for rank in ["0", "1"] {
        let env =
            env_map(&std::fs::read_to_string(dir.path().join(format!("env-{rank}.txt"))).unwrap());
        assert_eq!(env["RANK"], rank);
        assert_eq!(env["LOCAL_RANK"], rank);
        assert_eq!(env["NODE_RANK"], "0");
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["NPROC_PER_NODE"], "2");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
    }
}

/// An elastic job asking for 2 to 3 nodes on this one-node cluster runs on
/// the node there is, with the world size of what Slurm allocated (a job
/// that is not elastic would wait for nodes that never come).
#[tokio::test]
async fn an_elastic_job_runs_on_the_nodes_slurm_allocates() {
    let engine = engine();
    let dir = tempdir();
    let mut l = launch(
        dir.path(),
        "elastic",
        &["/bin/sh", "-c", "env > \"env-$RANK.txt\""],
    );
    l.launcher = Launcher::Torchrun { nproc_per_node: 2 };
    l.cpus_per_node = 2;
    l.nodes = 3;
    l.min_nodes = Some(1);
    let id = engine.submit(&l).await.unwrap();
    let state = wait_for(&engine, &id, 60, EngineState::is_terminal).await;
    assert_eq!(
        state,
        EngineState::Succeeded,
        "logs: {}",
        engine.logs(&id).await.unwrap()
    );
    for rank in ["0", "1"] {
        let env =
            env_map(&std::fs::read_to_string(dir.path().join(format!("env-{rank}.txt"))).unwrap());
        assert_eq!(env["RANK"], rank);
        assert_eq!(env["NNODES"], "1");
        assert_eq!(env["WORLD_SIZE"], "2");
    }
    assert!(!dir.path().join("env-2.txt").exists());
}

/// The test image `scripts/containers-up.sh` built, with the runtime's
/// config file in this process's environment for every `podman` it starts.
fn containers_image() -> String {
    let path = std::env::var("EDGELOOP_CONTAINERS_ENV").map_or_else(
        |_| PathBuf::from("/tmp/edgeloop-containers/env"),
        PathBuf::from,
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}): run scripts/containers-up.sh first",
            path.display()
        )
    });
    let vars = env_map(&text);
    if let Some(conf) = vars.get("CONTAINERS_CONF") {
        std::env::set_var("CONTAINERS_CONF", conf);
    }
    vars["EDGELOOP_TEST_IMAGE"].clone()
}

/// Slurm's own OCI support (oci.conf running runc, as `scripts/slurm-up.sh`
/// writes it): the step runs in the image pinned by the bridge's Podman,
/// from a bundle the bridge exported, in the job's directory, with the
/// contract's environment and the checkpoint directory at its host path.
#[tokio::test]
async fn a_job_with_an_image_runs_in_slurms_oci_container() {
    use edgeloop_api::images::{ContainerWay, PinKind};
    use edgeloop_trainer_bridge::engines::local::container::{ContainerRuntime, RuntimeKind};
    use edgeloop_trainer_bridge::engines::ConfiguredFacts;
    let image = containers_image();
    let dir = tempdir();
    let bundles = dir.path().join("bundles");
    let oci = engine()
        .with_configured_facts(ConfiguredFacts {
            containers: vec![ContainerWay::SlurmOci],
            ..ConfiguredFacts::default()
        })
        .with_runtime(Some(ContainerRuntime::new(RuntimeKind::Podman)))
        .with_oci_bundles(Some(bundles.clone()));
    // Laid out as the bridge lays out its jobs: <jobs>/<job>/.
    let job_dir = dir.path().join("jobs").join("slurm-test-oci");
    std::fs::create_dir_all(job_dir.join("ckpt")).unwrap();
    let script = "echo \"host=$(cat /proc/sys/kernel/hostname) debian=$(cat /etc/debian_version) \
                  pwd=$(pwd) job=$EDGELOOP_JOB_ID\" > out.txt; \
                  echo 5 > \"$EDGELOOP_CHECKPOINT_DIR/committed\"";
    let mut l = launch(&job_dir, "oci", &["sh", "-c", script]);
    l.log_path = job_dir.join("attempt-1.log");
    l.image = Some(image.clone());
    let pin = oci.pin_image(&image, None).await.unwrap().unwrap();
    assert_eq!(pin.kind, PinKind::ImageId);
    l.pinned_image = Some(pin.clone());
    let id = oci.submit(&l).await.unwrap();
    let state = wait_for(&oci, &id, 120, EngineState::is_terminal).await;
    let log = std::fs::read_to_string(&l.log_path).unwrap_or_default();
    assert_eq!(state, EngineState::Succeeded, "{log}");
    let out = std::fs::read_to_string(job_dir.join("out.txt")).unwrap();
    assert!(
        out.starts_with("host=edgeloop debian=12")
            && out.contains(&format!("pwd={} job=slurm-test-oci", job_dir.display())),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(job_dir.join("ckpt/committed")).unwrap(),
        "5\n"
    );
    // One bundle per pinned image, exported once.
    let bundle = bundles.join(pin.digest.to_hex());
    assert!(bundle.join("rootfs/etc/debian_version").exists());
    assert!(bundle.join("config.json").exists());

    // A cluster that offers no way refuses the image before anything runs.
    match engine().pin_image(&image, None).await {
        Err(EngineError::Refused(m)) => {
            assert!(
                m.starts_with("image:") && m.contains("EDGELOOP_SLURM_CONTAINERS"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
}
