//! Two replicas on PostgreSQL and S3, one killed mid-rollout.

use super::site::*;

/// Each device's assignment generation in deployment `id`.
async fn generations(cp: &CpProcess, id: &str) -> BTreeMap<String, u64> {
    let (status, body) = cp.api().get(&format!("/api/v1/deployments/{id}")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body["assigned_generation"].clone()).unwrap()
}

/// Two control-plane replicas share one PostgreSQL database and one S3
/// prefix (and the CA, signing key and admin token: `share_secrets_with`);
/// the agents take both endpoints. Replica A, up first, leads the
/// background work; it is SIGKILLed while a two-wave rollout that replica
/// B accepted is under way. B takes the leases once A's lapse, finishes
/// the rollout, and the agents, whose streams were on A, fail over to B.
/// Nothing is done twice: each device's assignment generation in the
/// rollout is its previous one plus one (a stale leader's second write
/// would add another). Everything acknowledged reads back on B, and a
/// rollout started after the kill reaches every device through B alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_rollout_hands_its_work_to_the_other() {
    edgeloop_client_core::install_crypto_provider();
    let Some(db) = edgeloop_store::TestDatabase::from_env("two replicas") else {
        return;
    };
    let Some(s3) = edgeloop_tests::s3_test_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        (
            "EDGELOOP_STORE_URL".to_string(),
            db.url().expose().to_string(),
        ),
        ("EDGELOOP_ARTIFACT_URL".to_string(), s3),
    ];
    let mut a = CpProcess::start_with_env(&dir.path().join("a"), None, env.clone()).await;
    a.share_secrets_with(&dir.path().join("b"));
    let b = CpProcess::start_with_env(&dir.path().join("b"), None, env.clone()).await;
    // A replica that made a CA of its own is refused at start: members
    // that fail over to it could not connect.
    let stray_dir = dir.path().join("stray");
    let mut stray = edgeloop_tests::crash::Proc::new(
        "control-plane",
        ["serve", "--data-dir", &stray_dir.display().to_string()]
            .into_iter()
            .chain([
                "--grpc-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .map(String::from)
            .collect(),
        env,
        dir.path().join("stray.log"),
    );
    stray.spawn();
    let status = stray.exited(WAIT).await.expect("the stray replica stops");
    assert!(!status.success(), "{status}");
    assert_eq!(
        stray.log_count("replicas share one CA"),
        1,
        "{}",
        stray.log_tail()
    );
    // Each says what it leads once it has tried (after it answers HTTP).
    let leads = |cp: &CpProcess| cp.proc.log_lines("background leases").pop();
    let (la, lb) = (
        eventually(WAIT, "A's leases", || async { leads(&a) }).await,
        eventually(WAIT, "B's leases", || async { leads(&b) }).await,
    );
    assert!(la.contains("Rollouts"), "A leads: {la}");
    assert!(lb.contains("leads=[]"), "B waits: {lb}");

    create_model(&a, MODEL).await;
    let key = ManifestKey::generate();
    for k in 1..=3 {
        register(&a, &key, k, 1024).await;
    }
    let endpoints = format!("{},{}", a.grpc_url, b.grpc_url);
    let mut agents = vec![];
    for i in 0..4 {
        let name = format!("edge-{i}");
        let token = labelled_token(&b, "device", &name).await;
        let at = dir.path().join(&name);
        agents.push(AgentProcess::start_at(&endpoints, &name, &at, &token, &key.public()).await);
    }
    online(&b, 4).await;
    let first = deploy(&a, 1, &[4]).await;
    assert_eq!(ended(&b, &first).await, "succeeded");
    all_serve(&agents, 1).await;

    // A rollout accepted by B, run by A, until its first wave has moved.
    let second = deploy(&b, 2, &[2, 4]).await;
    let http = reqwest::Client::new();
    let urls: Vec<String> = agents.iter().map(|g| g.url().unwrap()).collect();
    eventually(WAIT, "the first wave moves", || async {
        for u in &urls {
            if served(&http, u).await == Some(2) {
                return Some(());
            }
        }
        None
    })
    .await;
    let at_kill = deployment_state(&b, &second).await;
    a.kill().await;
    let killed = tokio::time::Instant::now();
    assert!(
        at_kill.as_deref().is_some_and(|s| !TERMINAL.contains(&s)),
        "killed mid-rollout: {at_kill:?}"
    );
    assert_eq!(ended(&b, &second).await, "succeeded");
    let took = killed.elapsed();
    all_serve(&agents, 2).await;
    let changed = b.proc.log_lines("leadership changed");
    assert!(
        changed
            .iter()
            .any(|l| l.contains("task=\"rollouts\"") || l.contains("task=rollouts")),
        "B took the rollouts: {changed:?}"
    );
    let (g1, g2) = (
        generations(&b, &first).await,
        generations(&b, &second).await,
    );
    assert_eq!(g2.len(), 4, "{g2:?}");
    for (device, g) in &g2 {
        assert_eq!(*g, g1[device] + 1, "{device}: one write per deployment");
    }
    // Acknowledged writes read back on B.
    let (status, versions) = b
        .api()
        .get(&format!("/api/v1/models/{MODEL}/versions"))
        .await;
    assert_eq!(status, 200, "{versions}");
    assert_eq!(versions.as_array().unwrap().len(), 3, "{versions}");
    // And B alone rolls out what comes next.
    let third = deploy(&b, 3, &[4]).await;
    assert_eq!(ended(&b, &third).await, "succeeded");
    all_serve(&agents, 3).await;
    let tally = Tally {
        kills: 1,
        deployments_ended: 3,
        notes: vec![format!(
            "state_at_kill={} rollout_finished_after_kill={took:?}",
            at_kill.unwrap_or_default()
        )],
        ..Tally::default()
    };
    tally.print("replicas", 0);
    for g in &mut agents {
        g.kill().await;
    }
}
