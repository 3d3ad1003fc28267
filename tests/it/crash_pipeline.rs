//! The control plane SIGKILLed during a retraining pipeline's steps (issue
//! #16): the real `control-plane` binary runs the pipeline (a real trainer
//! bridge process, the reference trainer), is killed at seeded points while
//! the pipeline is in its dataset step, its training step and a later one,
//! and is started again on the same data dir. After each restart:
//! - the pipeline resumes the step it was in (or the next one, if that
//!   step had ended and was saved): every step record saved before the
//!   kill is still there, unchanged;
//! - no step appears twice for the same attempt, and a second attempt
//!   follows only a failed first one;
//! - the training job of `(pipeline, attempt)` is the one it was before
//!   the kill (same id, same creation time), never a second one;
//! - at the end the pipeline is in a terminal state, with at most one
//!   deployment per deploy attempt.
//!
//! The seed is printed (`EDGELOOP_CRASH_SEED=<n>` replays the kill points)
//! with a `crash summary:` line. At least [`MIN_KILLS`] of the five planned
//! kills must land: the training job waits for a gate the test opens only
//! after its two training kills, so those never miss their step.

use std::collections::BTreeMap;
use std::time::Duration;

use edgeloop_tests::crash::{retry, seeded, CpProcess, Proc, Tally};
use edgeloop_tests::{eventually, settings, ControlPlane};
use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};

const MODEL: &str = "rain";
const WAIT: Duration = Duration::from_secs(60);
/// Of the five planned kills, the dataset one and the two training ones
/// (the job is gated) always land, and so does the compute one (export to
/// deploy: the rollout alone lasts its 4 s deadline). Only the last may
/// find the pipeline ended: when the compute kill lands in the rollout and
/// the restart (or, on two replicas, the lease's lapse, about 10 s)
/// outlasts the deadline.
const MIN_KILLS: u32 = 4;
/// The steps in the order a pipeline signed by the control plane runs them.
const ORDER: [&str; 8] = [
    "build_dataset",
    "train",
    "export",
    "quantize",
    "register",
    "compare",
    "deploy",
    "reset_reference",
];

async fn get(cp: &CpProcess, path: &str) -> Value {
    retry(path, || async {
        let r = cp.api().request(Method::GET, path).send().await.ok()?;
        (r.status() == 200).then_some(())?;
        r.json::<Value>().await.ok()
    })
    .await
}

fn records(p: &Value) -> &Vec<Value> {
    p["history"].as_array().unwrap()
}

fn key(r: &Value) -> (String, u64) {
    (
        r["step"].as_str().unwrap().to_string(),
        r["attempt"].as_u64().unwrap(),
    )
}

/// The step running now, if the pipeline runs.
fn running(p: &Value) -> Option<&str> {
    (p["status"] == "running").then(|| p["step"].as_str().unwrap())
}

fn index(step: &str) -> usize {
    ORDER.iter().position(|s| *s == step).unwrap()
}

/// No `(step, attempt)` twice, and attempt n+1 of a step only after
/// attempt n ended without success.
fn check_history(p: &Value) {
    let mut seen: BTreeMap<(String, u64), &Value> = BTreeMap::new();
    for r in records(p) {
        let (step, attempt) = key(r);
        if attempt > 1 {
            let prev = seen.get(&(step.clone(), attempt - 1)).unwrap_or_else(|| {
                panic!(
                    "{step} attempt {attempt} without attempt {}: {p}",
                    attempt - 1
                )
            });
            assert!(
                !prev["ended_at"].is_null() && prev["outcome"] != "succeeded",
                "{step} retried after a success: {p}"
            );
        }
        assert!(
            seen.insert((step.clone(), attempt), r).is_none(),
            "{step} attempt {attempt} twice in the history: {p}"
        );
    }
}

/// The pipeline's training jobs, id -> creation time.
async fn train_jobs(cp: &CpProcess, id: &str) -> BTreeMap<String, String> {
    let jobs = get(cp, "/api/v1/jobs").await;
    let prefix = format!("{id}-train-");
    jobs.as_array()
        .unwrap()
        .iter()
        .filter(|j| j["id"].as_str().unwrap().starts_with(&prefix))
        .map(|j| {
            (
                j["id"].as_str().unwrap().to_string(),
                j["created_at"].to_string(),
            )
        })
        .collect()
}

/// How the restarted control plane's pipeline relates to the one seen
/// just before the kill.
#[derive(Debug, Default)]
struct Resumed {
    /// The same step run (same attempt, same start) goes on.
    same_step: u32,
    /// That step had ended and was saved: the next one runs.
    next_step: u32,
    /// The last transition seen before the kill was not yet flushed: the
    /// step before it is polled again (each executor is idempotent).
    unflushed_redone: u32,
}

/// Everything saved before the kill is still there; the step seen running
/// goes on (or has ended), never started over as a new attempt.
fn check_resumed(before: &Value, after: &Value, r: &mut Resumed) {
    check_history(after);
    let (b, a) = (records(before), records(after));
    let m = b.len();
    // Every record but the last was saved and flushed before the last
    // transition began (the runner flushes before its next tick).
    assert!(a.len() + 1 >= m, "history shrank: {before}\n->\n{after}");
    for i in 0..m.saturating_sub(2) {
        assert_eq!(a[i], b[i], "record {i} changed: {before}\n->\n{after}");
    }
    let last = &b[m - 1];
    if a.len() < m {
        // The transition that opened `last` was lost with the kill: its
        // step is polled again.
        assert!(m >= 2, "the first step's record is saved before the 201");
        assert_eq!(key(&a[m - 2]), key(&b[m - 2]), "{before}\n->\n{after}");
        assert_eq!(a[m - 2]["started_at"], b[m - 2]["started_at"]);
        r.unflushed_redone += 1;
        return;
    }
    if m >= 2 {
        assert_eq!(key(&a[m - 2]), key(&b[m - 2]), "{before}\n->\n{after}");
        assert_eq!(a[m - 2]["started_at"], b[m - 2]["started_at"]);
    }
    assert_eq!(
        key(&a[m - 1]),
        key(last),
        "a different step or attempt after the kill: {before}\n->\n{after}"
    );
    if a[m - 1]["started_at"] != last["started_at"] {
        // Opened again after the kill: the transition was not flushed.
        r.unflushed_redone += 1;
    } else if a.len() == m && a[m - 1]["ended_at"].is_null() {
        r.same_step += 1;
    } else {
        r.next_step += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_killed_mid_pipeline_step_resumes_the_same_step() {
    killed_mid_pipeline(None).await;
}

/// The same pipeline on two replicas sharing PostgreSQL and S3 (issue
/// #17): each kill takes the replica that leads, the other takes the
/// pipeline over once the lease lapses, and the killed one comes back as
/// the follower. The same checks hold: the step goes on, no step or
/// training job is run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_pipeline_step_hands_the_same_step_to_the_other() {
    let Some(db) = edgeloop_store::TestDatabase::from_env("pipeline replicas") else {
        return;
    };
    let Some(s3) = edgeloop_tests::s3_test_url() else {
        return;
    };
    killed_mid_pipeline(Some((db.url().expose().to_string(), s3))).await;
    drop(db);
}

/// Which replica answers now: the one not killed last.
fn live(cps: &[CpProcess], down: Option<usize>) -> &CpProcess {
    &cps[match down {
        Some(0) if cps.len() > 1 => 1,
        _ => 0,
    }]
}

/// `shared`: the store and artifact URLs of two replicas; `None`: one
/// control plane on its data dir, killed and started again.
async fn killed_mid_pipeline(shared: Option<(String, String)>) {
    let (seed, mut rng) = seeded("pipeline");
    let dir = tempfile::tempdir().unwrap();
    let cp_dir = dir.path().join("cp");
    let train_gate = dir.path().join("train-gate");
    let env: Vec<(String, String)> = match &shared {
        Some((store, artifacts)) => vec![
            ("EDGELOOP_STORE_URL".into(), store.clone()),
            ("EDGELOOP_ARTIFACT_URL".into(), artifacts.clone()),
        ],
        None => Vec::new(),
    };
    // The model, its policy and the device's labelled samples, set up by
    // a control plane in this process; the binaries then take the same
    // data dir (and store) over.
    {
        let mut first = settings(&cp_dir);
        if let Some((store, artifacts)) = &shared {
            first.store_url = Some(store.clone());
            first.artifact_url = Some(artifacts.clone());
        }
        let cp = ControlPlane::start_with(first).await;
        let job = json!({
            "name": "retrain-rain",
            // The reference trainer, once the test opens the gate: it
            // trains in well under a second, and both training kills need
            // the job to be running (a fixed pause was too short for the
            // second on two replicas, whose takeover waits for the lease to
            // lapse). At most 2 minutes, should the test die first.
            "command": ["sh", "-c", format!(
                "i=0; while [ ! -e '{}' ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; exec {}",
                train_gate.display(),
                edgeloop_tests::reference_trainer().display())],
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
            "hyperparameters": {"workload": "rainfall-mlp", "steps": 60, "batch_size": 16},
            "checkpoint": {"every_steps": 10, "keep_last": 2},
            "restarts": {"max_restarts": 0, "backoff_seconds": 0, "backoff_max_seconds": 0}
        });
        // The rollout goes to edge-1, which never runs an agent: the
        // deploy step runs until its deadline fails it, a terminal state
        // reached in bounded time.
        let extra = json!({"rollout": {"selector": "site=lab", "deadline_seconds": 4}});
        edgeloop_tests::retrain::setup(&cp, dir.path(), MODEL, job, extra).await;
        cp.stop().await;
    }
    let mut cps = vec![CpProcess::start_with_env(&cp_dir, None, env.clone()).await];
    if shared.is_some() {
        let b_dir = dir.path().join("cp-b");
        cps[0].share_secrets_with(&b_dir);
        cps.push(CpProcess::start_with_env(&b_dir, None, env).await);
    }
    // The replica killed last, down or back as the follower.
    let mut down: Option<usize> = None;
    let endpoints = cps
        .iter()
        .map(|c| c.grpc_url.clone())
        .collect::<Vec<_>>()
        .join(",");
    let token = cps[0].token("cluster", "local-gpu").await;
    let bridge_dir = dir.path().join("bridge");
    std::fs::create_dir_all(&bridge_dir).unwrap();
    let mut bridge = Proc::new(
        "trainer-bridge",
        vec![
            "run".into(),
            "--data-dir".into(),
            bridge_dir.display().to_string(),
            "--control-plane".into(),
            endpoints,
            "--bootstrap-token".into(),
            token,
        ],
        vec![],
        dir.path().join("bridge.log"),
    );
    bridge.spawn();

    let started = retry("retrain", || async {
        let r = cps[0]
            .api()
            .request(Method::POST, &format!("/api/v1/models/{MODEL}/retrain"))
            .json(&json!({"reason": "crash"}))
            .send()
            .await
            .ok()?;
        (r.status() == 201).then_some(())?;
        r.json::<Value>().await.ok()
    })
    .await;
    let id = started["id"].as_str().unwrap().to_string();
    let path = format!("/api/v1/pipelines/{id}");
    let mut resumed = Resumed::default();
    let mut killed_in: BTreeMap<String, u32> = BTreeMap::new();
    let mut job_seen: Option<(String, String)> = None;
    let mut kills = 0u32;

    // Kill points: (the earliest step to wait for, the latest at which the
    // kill still counts for it, the seeded delay's bound in ms).
    let plan: [(&str, &str, u64); 5] = [
        ("build_dataset", "build_dataset", 30),
        ("train", "train", 1500),
        ("train", "train", 1500),
        // The compute steps end within a tick or two: a short delay.
        ("export", "deploy", 40),
        // The rollout waits for its 4 s deadline.
        ("deploy", "deploy", 1500),
    ];
    for (from, to, delay_ms) in plan {
        if index(from) > index("train") {
            // The training kills are done: let the job train.
            std::fs::write(&train_gate, b"").unwrap();
        }
        let before = if from == "build_dataset" {
            // Right after the 201, whose answer is the pipeline as saved:
            // the dataset step ends within a tick or two.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=delay_ms))).await;
            started.clone()
        } else {
            let seen = eventually(WAIT, &format!("the pipeline reaches {from}"), || async {
                let p = get(live(&cps, down), &path).await;
                match running(&p) {
                    Some(step) => (index(step) >= index(from)).then_some(p),
                    // Ended: there is nothing left to kill it in.
                    None => Some(p),
                }
            })
            .await;
            if running(&seen).is_none_or(|step| index(step) > index(to)) {
                eprintln!("pipeline: past {to} before the kill; not killed there");
                continue;
            }
            if from == "train" {
                // Killed while the job runs, not before the bridge leased it.
                let job = format!("{id}-train-1");
                let runs = eventually(WAIT, "the training job runs", || async {
                    let j = get(live(&cps, down), "/api/v1/jobs").await;
                    if j.as_array()?
                        .iter()
                        .any(|j| j["id"] == job.as_str() && j["state"] == "running")
                    {
                        return Some(true);
                    }
                    let p = get(live(&cps, down), &path).await;
                    (running(&p).is_none_or(|s| index(s) > index(to))).then_some(false)
                })
                .await;
                if !runs {
                    eprintln!("pipeline: past {to} before the kill; not killed there");
                    continue;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=delay_ms))).await;
            get(live(&cps, down), &path).await
        };
        let jobs_before = train_jobs(live(&cps, down), &id).await;
        bridge.assert_running("bridge");
        let step = running(&before).unwrap_or("ended").to_string();
        *killed_in.entry(step).or_default() += 1;
        kills += 1;
        if cps.len() == 1 {
            cps[0].kill().await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
            cps[0].restart().await;
        } else {
            // The leader: the one not killed last (the first at first).
            let leader = usize::from(down == Some(0));
            let other = 1 - leader;
            let took = cps[other].proc.log_count("leadership changed");
            cps[leader].kill().await;
            down = Some(leader);
            // The other takes the pipelines once the lease lapses; the
            // killed one then comes back, as the follower.
            eventually(WAIT, "the other replica takes the pipelines", || async {
                let lines = cps[other].proc.log_lines("leadership changed");
                (lines.len() > took && lines[took..].iter().any(|l| l.contains("pipelines")))
                    .then_some(())
            })
            .await;
            cps[leader].restart().await;
        }
        let after = get(live(&cps, down), &path).await;
        check_resumed(&before, &after, &mut resumed);
        let jobs_after = train_jobs(live(&cps, down), &id).await;
        for (job, created) in &jobs_before {
            assert_eq!(
                jobs_after.get(job),
                Some(created),
                "training job {job} lost or made again across the kill"
            );
        }
        if let Some((job, created)) = jobs_before.iter().next() {
            job_seen = Some((job.clone(), created.clone()));
        }
    }

    std::fs::write(&train_gate, b"").unwrap();
    assert!(
        kills >= MIN_KILLS,
        "{kills} of {} planned kills landed (at least {MIN_KILLS} must): killed in {killed_in:?}",
        plan.len()
    );

    let ended = eventually(Duration::from_secs(90), "the pipeline ends", || async {
        let p = get(live(&cps, down), &path).await;
        (p["status"] != "running").then_some(p)
    })
    .await;
    check_history(&ended);
    assert!(
        matches!(
            ended["status"].as_str(),
            Some("succeeded" | "stopped" | "failed" | "cancelled")
        ),
        "{ended}"
    );
    // Every step up to the rollout succeeded across the kills; the rollout
    // to a device that never answers ends at its deadline.
    assert_eq!(ended["step"], "deploy", "{ended}");
    // It got past training: one job, the one seen during the kills.
    let trains: Vec<&Value> = records(&ended)
        .iter()
        .filter(|r| r["step"] == "train")
        .collect();
    assert_eq!(trains.len(), 1, "{ended}");
    assert_eq!(trains[0]["outcome"], "succeeded", "{ended}");
    let job = format!("{id}-train-1");
    assert_eq!(trains[0]["output"]["id"], job.as_str(), "{ended}");
    let jobs = train_jobs(live(&cps, down), &id).await;
    assert_eq!(jobs.keys().collect::<Vec<_>>(), vec![&job], "{jobs:?}");
    if let Some((seen, created)) = &job_seen {
        assert_eq!(jobs.get(seen), Some(created));
    }
    // At most one rollout per deploy attempt.
    let deployments = get(live(&cps, down), "/api/v1/deployments").await;
    let mut seeds: BTreeMap<String, u32> = BTreeMap::new();
    for d in deployments.as_array().unwrap() {
        let s = d["seed"].as_str().or(d["deployment"]["seed"].as_str());
        *seeds.entry(s.unwrap_or_default().to_string()).or_default() += 1;
    }
    for r in records(&ended).iter().filter(|r| r["step"] == "deploy") {
        let s = format!("{id}-deploy-{}", r["attempt"]);
        assert!(seeds.get(&s).copied().unwrap_or(0) <= 1, "{seeds:?}");
    }
    let pipelines = get(live(&cps, down), "/api/v1/pipelines").await;
    assert_eq!(pipelines.as_array().unwrap().len(), 1, "{pipelines}");

    let steps_checked: Vec<String> = records(&ended)
        .iter()
        .map(|r| r["step"].as_str().unwrap().to_string())
        .collect();
    let mut tally = Tally {
        kills: cps.iter().map(|c| c.proc.kills).sum(),
        ..Tally::default()
    };
    tally.notes.push(format!(
        "killed_in={killed_in:?} resumed_same_step={} next_step={} unflushed_redone={} \
         steps_checked={} ended={}@{} deployments={}",
        resumed.same_step,
        resumed.next_step,
        resumed.unflushed_redone,
        steps_checked.join(","),
        ended["status"].as_str().unwrap(),
        ended["step"].as_str().unwrap_or("-"),
        seeds.len()
    ));
    tally.print(
        if cps.len() > 1 {
            "pipeline_replicas"
        } else {
            "pipeline"
        },
        seed,
    );
    bridge.kill().await;
    edgeloop_tests::kill_processes(|_, env| {
        env.contains(&format!("EDGELOOP_JOB_ID={job}").as_bytes())
    });
}
