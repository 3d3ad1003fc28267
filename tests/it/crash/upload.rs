//! The bridge or the control plane killed mid-upload.

use super::site::*;

/// A trainer that follows the checkpoint contract (as
/// `fixtures/contract_trainer.sh`) with `CKPT_BYTES` of incompressible
/// weights in each checkpoint, so each upload takes a while.
const BIG_CHECKPOINT_TRAINER: &str = r#"#!/bin/sh
set -eu
total=${TOTAL:-30}
every=${EVERY:-5}
step=0
if [ -n "${EDGELOOP_RESUME_FROM:-}" ]; then
  step=$(cat "$EDGELOOP_RESUME_FROM/state.txt")
  echo "attempt ${EDGELOOP_ATTEMPT:-?} resumed from $step" >> "$EDGELOOP_CHECKPOINT_DIR/../trainer.log"
fi
while [ "$step" -lt "$total" ]; do
  step=$((step + 1))
  sleep "${STEP_SECONDS:-0.1}"
  if [ $((step % every)) -eq 0 ]; then
    d="$EDGELOOP_CHECKPOINT_DIR/step-$step"
    mkdir -p "$d"
    echo "$step" > "$d/state.txt"
    head -c "${CKPT_BYTES:-4000000}" /dev/urandom > "$d/weights.bin"
    h=$(sha256sum "$d/state.txt" | cut -d' ' -f1)
    w=$(sha256sum "$d/weights.bin" | cut -d' ' -f1)
    printf '{"step": %d, "wall_time": 0.1, "metrics": {"loss": 0.%d}, "optimizer_state": true, "files": [{"path": "state.txt", "sha256": "%s"}, {"path": "weights.bin", "sha256": "%s"}]}\n' \
      "$step" "$step" "$h" "$w" > "$d/manifest.json.tmp"
    mv "$d/manifest.json.tmp" "$d/manifest.json"
  fi
done
echo "finished at $step" >> "$EDGELOOP_CHECKPOINT_DIR/../trainer.log"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_or_control_plane_killed_mid_upload_resumes_and_the_job_completes() {
    const KILLS: u32 = 6;
    const TOTAL: u64 = 60;
    let (seed, mut rng) = seeded("bridge");
    let dir = tempfile::tempdir().unwrap();
    // Torn and failed checkpoint writes on top of the kills.
    let faults = format!("seed={seed},error=0.03,torn=0.3,delay_ms=10");
    let mut cp = CpProcess::start(&dir.path().join("cp"), Some(&faults)).await;
    let trainer = dir.path().join("trainer.sh");
    std::fs::write(&trainer, BIG_CHECKPOINT_TRAINER).unwrap();
    let token = cp.token("cluster", "crash-cluster").await;
    let bridge_dir = dir.path().join("bridge");
    std::fs::create_dir_all(&bridge_dir).unwrap();
    let mut bridge = edgeloop_tests::crash::Proc::new(
        "trainer-bridge",
        vec![
            "run".into(),
            "--data-dir".into(),
            bridge_dir.display().to_string(),
            "--control-plane".into(),
            cp.grpc_url.clone(),
            "--bootstrap-token".into(),
            token,
        ],
        vec![],
        dir.path().join("bridge.log"),
    );
    bridge.spawn();
    let spec = json!({
        "name": "crashy-job",
        "command": ["sh", trainer.display().to_string()],
        "env": {"TOTAL": TOTAL.to_string(), "EVERY": "5", "STEP_SECONDS": "0.15",
                "CKPT_BYTES": "4000000"},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        // Above the 12 checkpoints the job makes: the control plane's
        // compactor, which runs at each start, trims a job's checkpoints to
        // its newest `keep_last`, and trimmed ones would read as uploads
        // that never arrived (a flake seen once with 2). That the bridge
        // prunes only what it has uploaded is
        // `only_uploaded_checkpoints_are_pruned`'s.
        "checkpoint": {"every_steps": 5, "keep_last": 20},
        "restarts": {"max_restarts": 3, "backoff_seconds": 1, "backoff_max_seconds": 2}
    });
    let body = json!({ "spec": spec });
    let job = retry("submit", || created(&cp, "/api/v1/jobs", &body)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let job_view = |cp: &CpProcess| {
        let (api, id) = (cp.api(), id.clone());
        async move {
            let r = api
                .request(Method::GET, &format!("/api/v1/jobs/{id}"))
                .send()
                .await
                .ok()?;
            r.json::<Value>().await.ok()
        }
    };
    // Each kill lands while a checkpoint upload is under way: the control
    // plane holds part of it (`artifacts/partial/`). After the restart that
    // upload resumes: its partial grows past where it was, or completes.
    let partials = cp.data_dir.join("artifacts").join("partial");
    let mut at_kill = vec![];
    for round in 0..KILLS {
        let (path, _) = eventually(WAIT, "a checkpoint upload under way", || async {
            edgeloop_tests::files_under(&partials)
                .into_iter()
                .filter_map(|p| Some((p.clone(), std::fs::metadata(&p).ok()?.len())))
                .find(|(_, len)| *len > 0)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..30))).await;
        bridge.assert_running("bridge");
        // The bridge, then the control plane, in turn: either end of the
        // upload may die.
        let pause = Duration::from_millis(rng.random_range(0..500));
        let held = if round % 2 == 0 {
            bridge.kill().await;
            let held = std::fs::metadata(&path).map_or(0, |m| m.len());
            tokio::time::sleep(pause).await;
            bridge.spawn();
            held
        } else {
            cp.kill().await;
            let held = std::fs::metadata(&path).map_or(0, |m| m.len());
            tokio::time::sleep(pause).await;
            cp.restart().await;
            held
        };
        at_kill.push(held);
        eventually(WAIT, "the cut upload resumes", || async {
            let now = std::fs::metadata(&path).map_or(u64::MAX, |m| m.len());
            (now > held).then_some(())
        })
        .await;
    }
    let done = eventually(Duration::from_secs(120), "the job ends", || async {
        job_view(&cp).await.filter(|j| {
            matches!(
                j["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
        })
    })
    .await;
    assert_eq!(
        done["state"],
        "succeeded",
        "{done}\nbridge log:\n{}",
        bridge.log_tail()
    );
    assert_eq!(done["step"], TOTAL, "{done}");
    // Every checkpoint the control plane lists is whole; the last is there.
    let checkpoints = done["checkpoints"].as_array().unwrap();
    let steps: Vec<u64> = checkpoints
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps.last(), Some(&TOTAL), "{steps:?}");
    let expected: Vec<u64> = (1..=TOTAL / 5).map(|i| i * 5).collect();
    assert_eq!(
        steps, expected,
        "every committed checkpoint reached the control plane"
    );
    for c in checkpoints {
        let d: Digest = c["digest"].as_str().unwrap().parse().unwrap();
        let bytes = acked_artifact(
            &cp.api(),
            d,
            &format!("checkpoint {d} listed but not stored"),
        )
        .await;
        assert_eq!(
            (Digest::of(&bytes), bytes.len() as u64),
            (d, c["size"].as_u64().unwrap())
        );
    }
    let mut tally = Tally {
        kills: bridge.kills + cp.proc.kills,
        ..Tally::default()
    };
    tally.notes.push(format!(
        "checkpoints={} bytes_held_at_each_kill={at_kill:?} attempt={} injected_faults_logged={}",
        steps.len(),
        done["attempt"],
        cp.proc.log_count("injected fault")
    ));
    tally.print("bridge", seed);
    bridge.kill().await;
    edgeloop_tests::kill_processes(|_, env| {
        env.contains(&format!("EDGELOOP_JOB_ID={id}").as_bytes())
    });
}
