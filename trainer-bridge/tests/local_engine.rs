//! The embedded local engine: runs, fails with exit codes, cancels, survives
//! a kill -9, and is re-adopted by a new engine over the same state dir.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use edgeloop_trainer_bridge::engines::local::LocalEngine;
use edgeloop_trainer_bridge::engines::{Engine, EngineJobId, EngineState, Launch, Launcher};

fn launch(
    dir: &std::path::Path,
    job: &str,
    script: &str,
    nodes: u32,
    launcher: Launcher,
) -> Launch {
    Launch {
        job_id: job.into(),
        attempt: 1,
        name: job.into(),
        image: None,
        pinned_image: None,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::from([("EDGELOOP_JOB_ID".to_string(), job.to_string())]),
        workdir: dir.join("work"),
        nodes,
        min_nodes: None,
        gpus_per_node: 0,
        cpus_per_node: 1,
        memory_mb: 256,
        launcher,
        log_path: dir.join("logs").join(format!("{job}.log")),
        pool: None,
    }
}

async fn wait_terminal(engine: &LocalEngine, id: &EngineJobId) -> EngineState {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = engine.status(id).await.unwrap();
        if s.is_terminal() {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn runs_multi_node_with_rank_env_and_reports_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = LocalEngine::new(&dir.path().join("state")).unwrap();
    let l = launch(
        dir.path(),
        "ok",
        "echo rank=$RANK world=$WORLD_SIZE job=$EDGELOOP_JOB_ID >> out.txt",
        2,
        Launcher::Torchrun { nproc_per_node: 1 },
    );
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    let out = std::fs::read_to_string(dir.path().join("work/out.txt")).unwrap();
    assert!(
        out.contains("rank=0 world=2 job=ok") && out.contains("rank=1 world=2 job=ok"),
        "{out}"
    );
    // Submitting the same attempt again adopts it instead of starting twice.
    assert_eq!(engine.submit(&l).await.unwrap(), id);

    // torchrun semantics: nproc_per_node processes on each node, one per rank.
    let l = launch(
        dir.path(),
        "ranks",
        "echo rank=$RANK local=$LOCAL_RANK node=$NODE_RANK world=$WORLD_SIZE >> ranks.txt",
        2,
        Launcher::Torchrun { nproc_per_node: 2 },
    );
    let id = engine.submit(&l).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    let mut lines: Vec<String> = std::fs::read_to_string(dir.path().join("work/ranks.txt"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            "rank=0 local=0 node=0 world=4",
            "rank=1 local=1 node=0 world=4",
            "rank=2 local=0 node=1 world=4",
            "rank=3 local=1 node=1 world=4",
        ]
    );

    let bad = launch(dir.path(), "bad", "echo oops; exit 3", 1, Launcher::None);
    let id = engine.submit(&bad).await.unwrap();
    match wait_terminal(&engine, &id).await {
        EngineState::Failed { exit_code, .. } => assert_eq!(exit_code, Some(3)),
        other => panic!("{other:?}"),
    }
    assert!(engine.logs(&id).await.unwrap().contains("oops"));
    assert!(engine.status(&EngineJobId("../etc".into())).await.is_err());
}

#[tokio::test]
async fn cancel_kill_and_readoption() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let engine = LocalEngine::new(&state).unwrap();
    let id = engine
        .submit(&launch(dir.path(), "long", "sleep 600", 1, Launcher::None))
        .await
        .unwrap();
    assert_eq!(engine.status(&id).await.unwrap(), EngineState::Running);
    // A new engine over the same state (a restarted bridge) sees it running.
    let again = LocalEngine::new(&state).unwrap();
    assert_eq!(again.status(&id).await.unwrap(), EngineState::Running);
    again.cancel(&id).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Cancelled);

    // kill -9 of the whole process group: no exit code, reported as failed.
    let id = engine
        .submit(&launch(
            dir.path(),
            "victim",
            "sleep 600",
            1,
            Launcher::None,
        ))
        .await
        .unwrap();
    let pgid: i32 = std::fs::read_to_string(state.join(&id.0).join("pgid-0"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    match wait_terminal(&engine, &id).await {
        EngineState::Failed {
            exit_code: None,
            reason,
        } => assert!(reason.contains("killed"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// One rank fails while the other waits (as a surviving DDP rank waits in
/// a collective): the attempt is failed, and stop_remains ends the waiting
/// rank, which a failed attempt would otherwise leave running.
#[tokio::test]
async fn a_failed_rank_fails_the_attempt_and_stop_remains_ends_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let engine = LocalEngine::new(&dir.path().join("state")).unwrap();
    let l = launch(
        dir.path(),
        "half-dead",
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; echo $$ > waiting.pid; exec sleep 600",
        1,
        Launcher::Torchrun { nproc_per_node: 2 },
    );
    let id = engine.submit(&l).await.unwrap();
    assert!(
        matches!(
            wait_terminal(&engine, &id).await,
            EngineState::Failed {
                exit_code: Some(3),
                ..
            }
        ),
        "rank 1's exit fails the attempt"
    );
    let pid_file = l.workdir.join("waiting.pid");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pid_file.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rank 0 never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    assert!(alive(), "rank 0 still waits");
    engine.stop_remains(&id).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The wrapper reaps it (or records its exit); a zombie is gone too.
    while alive()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rank 0 outlived stop_remains"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Still failed, not cancelled: the engine says what happened.
    assert!(matches!(
        engine.status(&id).await.unwrap(),
        EngineState::Failed { .. }
    ));
}

/// A SIGTERM the bridge did not send (a machine shutting down, a spot node
/// reclaimed) ends the attempt as preempted, after the trainer had its
/// chance to checkpoint: sent to the whole group, or to the trainer alone.
#[tokio::test]
async fn a_sigterm_from_outside_is_a_preemption_after_the_trainer_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let engine = LocalEngine::new(&state).unwrap();
    let pgid = |id: &EngineJobId| -> i32 {
        std::fs::read_to_string(state.join(&id.0).join("pgid-0"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // The trainer checkpoints on SIGTERM, then exits 143 as the contract asks.
    let trainer = "trap 'echo saved > saved.txt; exit 143' TERM; \
                   echo started > started.txt; \
                   while :; do sleep 0.05 & wait $!; done";
    let id = engine
        .submit(&launch(dir.path(), "spot", trainer, 1, Launcher::None))
        .await
        .unwrap();
    let started = dir.path().join("work/started.txt");
    for _ in 0..200 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid(&id)),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    match wait_terminal(&engine, &id).await {
        EngineState::Preempted { reason } => {
            assert!(reason.contains("SIGTERM"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(dir.path().join("work/saved.txt").exists());

    // A trainer with no handler, its process alone signalled: exit 143.
    let id = engine
        .submit(&launch(dir.path(), "plain", "sleep 600", 1, Launcher::None))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = std::process::Command::new("pkill")
        .args(["-TERM", "-P", &pgid(&id).to_string()])
        .status()
        .unwrap();
    assert!(out.success(), "pkill found the trainer");
    assert!(matches!(
        wait_terminal(&engine, &id).await,
        EngineState::Preempted { .. }
    ));

    // A cancel sends SIGTERM too, and stays a cancel.
    let id = engine
        .submit(&launch(dir.path(), "cancelled", trainer, 1, Launcher::None))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    engine.cancel(&id).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Cancelled);
}

/// An elastic job (`min_nodes`) runs on as many nodes as this machine's
/// free GPUs hold now: the GPUs are read again at each submission, so one
/// that is gone is no longer handed out, and the next attempt runs at the
/// smaller world size; it is back at full size once the GPU is. A job that
/// is not elastic waits for its GPUs instead.
#[tokio::test]
async fn an_elastic_job_runs_on_the_gpus_there_are_now() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use edgeloop_client_core::gpu::{LocalGpu, LocalGpus};

    let dir = tempfile::tempdir().unwrap();
    let present = Arc::new(AtomicU32::new(2));
    let seen = present.clone();
    let engine = LocalEngine::with_gpus(&dir.path().join("state"), LocalGpus::default())
        .unwrap()
        .with_gpu_source(Some(Arc::new(move || {
            Ok(LocalGpus {
                gpus: (0..seen.load(Ordering::SeqCst))
                    .map(|index| LocalGpu {
                        index,
                        name: "Test GPU".into(),
                        memory_bytes: 1 << 30,
                    })
                    .collect(),
                source: "test".into(),
                ..Default::default()
            })
        })));
    let script = "echo \"world=$WORLD_SIZE rank=$RANK gpu=$CUDA_VISIBLE_DEVICES\" >> out-$EDGELOOP_ATTEMPT.txt";
    let attempt = |n: u32, min_nodes: Option<u32>| {
        let mut l = launch(
            dir.path(),
            "elastic",
            script,
            2,
            Launcher::Torchrun { nproc_per_node: 1 },
        );
        l.attempt = n;
        l.env.insert("EDGELOOP_ATTEMPT".into(), n.to_string());
        l.gpus_per_node = 1;
        l.min_nodes = min_nodes;
        l
    };
    let lines = |n: u32| {
        let text = std::fs::read_to_string(dir.path().join(format!("work/out-{n}.txt"))).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };

    let id = engine.submit(&attempt(1, Some(1))).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    assert_eq!(lines(1), ["world=2 rank=0 gpu=0", "world=2 rank=1 gpu=1"]);
    let pools = engine.pools().await.unwrap();
    assert_eq!(pools[0].gpus_per_node, 2);

    // A GPU is lost: the next attempt runs on the one node there is.
    present.store(1, Ordering::SeqCst);
    let id = engine.submit(&attempt(2, Some(1))).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    assert_eq!(lines(2), ["world=1 rank=0 gpu=0"]);
    assert_eq!(engine.pools().await.unwrap()[0].gpus_per_node, 1);
    // Without min_nodes the job needs both.
    match engine.submit(&attempt(3, None)).await {
        Err(edgeloop_trainer_bridge::engines::EngineError::Unavailable(why)) => {
            assert!(why.contains("needs 2 free GPUs"), "{why}");
        }
        other => panic!("{other:?}"),
    }

    // It is back: so is the full size.
    present.store(2, Ordering::SeqCst);
    let id = engine.submit(&attempt(4, Some(1))).await.unwrap();
    assert_eq!(wait_terminal(&engine, &id).await, EngineState::Succeeded);
    assert_eq!(lines(4), ["world=2 rank=0 gpu=0", "world=2 rank=1 gpu=1"]);
}
