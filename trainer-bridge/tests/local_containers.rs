//! The local engine's jobs with an image, in real Podman containers (on runc)
//! of the image `scripts/containers-up.sh` builds from Debian's packages. The
//! script writes the env file these tests read (`$EDGELOOP_CONTAINERS_ENV`,
//! else `${EDGELOOP_CONTAINERS_DIR:-/tmp/edgeloop-containers}/env`); without
//! it they fail: run `scripts/containers-up.sh` first.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use edgeloop_trainer_bridge::engines::local::container::{
    ContainerRuntime, GpuMode, RuntimeKind, RUNTIME_ENV,
};
use edgeloop_trainer_bridge::engines::local::LocalEngine;
use edgeloop_trainer_bridge::engines::{
    Engine, EngineError, EngineJobId, EngineState, Launch, Launcher,
};

/// The test image, once the env file's settings (the runtime's config
/// file, which every `podman` the engine starts reads) are in this
/// process's environment.
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let path = std::env::var("EDGELOOP_CONTAINERS_ENV").map_or_else(
            |_| {
                let dir = std::env::var("EDGELOOP_CONTAINERS_DIR")
                    .unwrap_or_else(|_| "/tmp/edgeloop-containers".into());
                PathBuf::from(dir).join("env")
            },
            PathBuf::from,
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read the containers env file {} ({e}): run scripts/containers-up.sh first",
                path.display()
            )
        });
        let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        for key in [
            "CONTAINERS_CONF",
            "EDGELOOP_TEST_FAKE_CDI",
            "EDGELOOP_TEST_FAKE_GPUS",
        ] {
            if let Some(value) = vars.get(key) {
                std::env::set_var(key, value);
            }
        }
        vars.get("EDGELOOP_TEST_IMAGE")
            .unwrap_or_else(|| panic!("{} has no EDGELOOP_TEST_IMAGE", path.display()))
            .to_string()
    })
}

fn podman() -> ContainerRuntime {
    ContainerRuntime {
        kind: RuntimeKind::Podman,
        gpus: GpuMode::detect(),
        site_mounts: vec![],
    }
}

fn engine(dir: &Path) -> LocalEngine {
    LocalEngine::new(&dir.join("state"))
        .unwrap()
        .with_container(Some(podman()))
}

fn launch(dir: &Path, job: &str, image: &str, script: &str) -> Launch {
    Launch {
        job_id: job.into(),
        attempt: 1,
        name: job.into(),
        image: Some(image.into()),
        pinned_image: None,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::from([
            ("EDGELOOP_JOB_ID".to_string(), job.to_string()),
            (
                "EDGELOOP_CHECKPOINT_DIR".to_string(),
                dir.join("checkpoints").to_string_lossy().into_owned(),
            ),
        ]),
        workdir: dir.join("work"),
        nodes: 1,
        min_nodes: None,
        gpus_per_node: 0,
        cpus_per_node: 1,
        memory_mb: 256,
        launcher: Launcher::None,
        log_path: dir.join("logs").join(format!("{job}.log")),
        pool: None,
    }
}

async fn wait_terminal(engine: &LocalEngine, id: &EngineJobId) -> EngineState {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = engine.status(id).await.unwrap();
        if s.is_terminal() {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn podman_out(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("podman")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// Whether the container `name` is gone, within 20 s.
async fn gone(name: &str) -> bool {
    for _ in 0..200 {
        if !podman_out(&["container", "exists", name]).0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn a_job_with_an_image_runs_in_a_container_with_its_directories_env_and_exit_code() {
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let script = "test -f /run/.containerenv || exit 9; \
                  echo \"job=$EDGELOOP_JOB_ID debian=$(cat /etc/debian_version) pwd=$(pwd)\" > out.txt; \
                  echo step-1 > \"$EDGELOOP_CHECKPOINT_DIR/committed\"; \
                  echo to-the-log";
    let l = launch(dir.path(), "ctr-ok", image, script);
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    let out = std::fs::read_to_string(dir.path().join("work/out.txt")).unwrap();
    let work = dir.path().join("work");
    assert!(
        out.starts_with("job=ctr-ok debian=12") && out.contains(&format!("pwd={}", work.display())),
        "{out}"
    );
    // The checkpoint directory is the host's, at the same path.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("checkpoints/committed")).unwrap(),
        "step-1\n"
    );
    assert!(engine.logs(&id).await.unwrap().contains("to-the-log"));
    // The attempt ran the image's ID, pinned at submission.
    let (_, want) = podman_out(&["image", "inspect", "--format", "{{.Id}}", image]);
    let pinned = std::fs::read_to_string(dir.path().join("state/ctr-ok-a1/image")).unwrap();
    assert_eq!(pinned, format!("sha256:{want}"));
    assert!(gone("edgeloop-ctr-ok-a1-0").await, "--rm removes it");

    let l = launch(dir.path(), "ctr-fail", image, "exit 7");
    let id = engine.submit(&l).await.unwrap();
    assert!(matches!(
        wait_terminal(&engine, &id).await,
        EngineState::Failed {
            exit_code: Some(7),
            ..
        }
    ));
}

#[tokio::test]
async fn cancel_and_a_killed_wrapper_leave_no_container_behind() {
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());

    let l = launch(dir.path(), "ctr-cancel", image, "sleep 300");
    let id = engine.submit(&l).await.unwrap();
    let name = "edgeloop-ctr-cancel-a1-0";
    for _ in 0..100 {
        if podman_out(&["container", "exists", name]).0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(podman_out(&["container", "exists", name]).0, "it started");
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Running);
    engine.cancel(&id).await.unwrap();
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Cancelled);
    assert!(gone(name).await, "the cancelled job's container is removed");

    // The wrapper killed outright (a bridge machine's kill -9): the
    // container is not left running.
    let l = launch(dir.path(), "ctr-orphan", image, "sleep 300");
    let id = engine.submit(&l).await.unwrap();
    let name = "edgeloop-ctr-orphan-a1-0";
    for _ in 0..100 {
        if podman_out(&["container", "exists", name]).0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pgid: i32 = std::fs::read_to_string(dir.path().join("state/ctr-orphan-a1/pgid-0"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(matches!(
        wait_terminal(&engine, &id).await,
        EngineState::Failed {
            exit_code: None,
            ..
        }
    ));
    assert!(gone(name).await, "the orphaned container is removed");
}

#[tokio::test]
async fn an_image_is_refused_before_anything_runs_naming_the_field() {
    let image = image();
    let dir = tempfile::tempdir().unwrap();

    let l = launch(
        dir.path(),
        "ctr-missing",
        "localhost/edgeloop-no-such:1",
        "true",
    );
    match engine(dir.path()).submit(&l).await {
        Err(EngineError::Refused(m)) => {
            assert!(
                m.starts_with("image:") && m.contains("edgeloop-no-such"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(!dir.path().join("work/out.txt").exists());

    // An engine with no runtime configured runs no image on the host instead.
    let bare = LocalEngine::new(&dir.path().join("bare")).unwrap();
    let l = launch(dir.path(), "ctr-bare", image, "echo ran > out.txt");
    match bare.submit(&l).await {
        Err(EngineError::Refused(m)) => {
            assert!(m.starts_with("image:") && m.contains(RUNTIME_ENV), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!dir.path().join("work/out.txt").exists());
}

/// Builds a one-label image on the test image, so its ID differs; returns it.
fn build_labelled(dir: &Path, tag: &str, label: &str) -> String {
    let ctx = dir.join(format!("ctx-{label}"));
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {}\nLABEL edgeloop.test={label}\n", image()),
    )
    .unwrap();
    let (ok, _) = podman_out(&[
        "build",
        "--pull=never",
        "--quiet",
        "-t",
        tag,
        ctx.to_str().unwrap(),
    ]);
    assert!(ok, "podman build {tag}");
    podman_out(&["image", "inspect", "--format", "{{.Id}}", tag]).1
}

#[tokio::test]
async fn an_image_is_pinned_once_and_every_attempt_runs_the_pin() {
    use edgeloop_api::images::PinKind;
    image();
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let tag = "localhost/edgeloop-pin-test:moving";
    let first = build_labelled(dir.path(), tag, "first");

    // A tag pins to the ID it names now.
    let pin = engine.pin_image(tag, None).await.unwrap().unwrap();
    assert_eq!(
        (pin.kind, pin.digest.to_hex(), pin.reference.as_str()),
        (PinKind::ImageId, first.clone(), tag)
    );

    // The tag moves; the pin stands, and an attempt given it runs the first
    // image (its label), not the tag's new one.
    let second = build_labelled(dir.path(), tag, "second");
    assert_ne!(first, second);
    assert_eq!(
        engine.pin_image(tag, Some(&pin)).await.unwrap(),
        Some(pin.clone())
    );
    let mut l = launch(dir.path(), "ctr-pinned", tag, "echo ran > out.txt");
    l.pinned_image = Some(pin.clone());
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    let state =
        std::fs::read_to_string(dir.path().join("state").join(&id.0).join("image")).unwrap();
    assert_eq!(state, format!("sha256:{first}"));

    // A reference naming a manifest digest pins to that digest; one whose
    // digest no local image has is refused before anything runs.
    let (_, digest) = podman_out(&["image", "inspect", "--format", "{{.Digest}}", tag]);
    let by_digest = format!("localhost/edgeloop-pin-test@{digest}");
    let manifest = engine.pin_image(&by_digest, None).await.unwrap().unwrap();
    assert_eq!(manifest.kind, PinKind::Manifest);
    assert_eq!(format!("sha256:{}", manifest.digest), digest);
    let wrong = format!("localhost/edgeloop-pin-test@sha256:{}", "0".repeat(64));
    match engine.pin_image(&wrong, None).await {
        Err(EngineError::Refused(m)) => {
            assert!(
                m.starts_with("image:") && m.contains(&"0".repeat(64)),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }

    // The pinned image removed from this machine: a retry is refused, not
    // run with what the tag names now.
    let (removed, _) = podman_out(&["rmi", "--force", &first]);
    assert!(removed, "rmi {first}");
    match engine.pin_image(tag, Some(&pin)).await {
        Err(EngineError::Refused(m)) => {
            assert!(m.starts_with("image:") && m.contains("pinned"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    podman_out(&["rmi", "--force", tag]);
}

/// The fake GPUs' CDI spec `scripts/containers-up.sh` wrote (empty on a
/// machine with real NVIDIA devices, whose own spec is used instead), and
/// how many devices it names.
fn fake_cdi() -> Option<u32> {
    image();
    let path = std::env::var("EDGELOOP_TEST_FAKE_CDI").unwrap_or_default();
    if path.is_empty() {
        return None;
    }
    assert!(
        Path::new(&path).exists(),
        "{path} is gone: run scripts/containers-up.sh"
    );
    Some(
        std::env::var("EDGELOOP_TEST_FAKE_GPUS")
            .unwrap()
            .parse()
            .unwrap(),
    )
}

#[tokio::test]
async fn allocated_gpus_go_into_the_container_through_cdi_numbered_from_zero() {
    use edgeloop_client_core::gpu::{LocalGpu, LocalGpus};
    let fake = fake_cdi();
    let gpus = match fake {
        Some(n) => LocalGpus {
            gpus: (0..n)
                .map(|index| LocalGpu {
                    index,
                    name: "Fake GPU (CDI, /dev/null)".into(),
                    memory_bytes: 1 << 30,
                })
                .collect(),
            source: "test".into(),
            ..Default::default()
        },
        None => LocalGpus::detect(),
    };
    assert!(
        gpus.gpus.len() >= 3,
        "neither the fake GPUs' CDI spec (EDGELOOP_TEST_FAKE_CDI is empty: run \
         scripts/containers-up.sh) nor three real GPUs: {gpus:?}"
    );
    // A spec naming `nvidia.com/gpu` devices is found: CDI, not --gpus.
    assert_eq!(GpuMode::detect(), GpuMode::Cdi);
    let dir = tempfile::tempdir().unwrap();
    let engine = LocalEngine::with_gpus(&dir.path().join("state"), gpus.clone())
        .unwrap()
        .with_container(Some(podman()));

    // One job holds the first GPU, so the next gets the two after it.
    let mut holder = launch(dir.path(), "gpu-holder", image(), "sleep 30");
    holder.gpus_per_node = 1;
    let held = engine.submit(&holder).await.unwrap();
    let script = "ls /dev | grep '^nvidia' | tr '\\n' ' ' > out.txt; \
                  echo \"visible=$CUDA_VISIBLE_DEVICES\" >> out.txt; \
                  env | grep '^EDGELOOP_FAKE' | sort | tr '\\n' ' ' >> out.txt";
    let mut l = launch(dir.path(), "gpu-two", image(), script);
    l.gpus_per_node = 2;
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    engine.cancel(&held).await.unwrap();
    let out = std::fs::read_to_string(dir.path().join("work/out.txt")).unwrap();
    let (a, b) = (gpus.gpus[1].index, gpus.gpus[2].index);
    // The devices CDI injected, and only those; CUDA numbers them from 0.
    assert!(out.starts_with(&format!("nvidia{a} nvidia{b} ")), "{out}");
    assert!(out.contains("visible=0,1"), "{out}");
    if fake.is_some() {
        assert!(
            out.contains(&format!(
                "EDGELOOP_FAKE_CDI=1 EDGELOOP_FAKE_GPU_{a}=injected EDGELOOP_FAKE_GPU_{b}=injected "
            )),
            "{out}"
        );
    }
    assert!(gone("edgeloop-gpu-holder-a1-0").await);
}
