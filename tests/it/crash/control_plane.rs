//! The control plane killed mid-flight.

use super::site::*;

/// A console write that was answered 2xx.
#[derive(Debug, Clone)]
enum Acked {
    Model(String),
    Artifact(Digest, usize),
    Token(String),
}

/// Writes models, artifacts and tokens until stopped; records each that
/// was acknowledged. Failures (the control plane is down, a fault) are
/// not acknowledged and not recorded.
fn console_writer(
    cp_http: String,
    admin: String,
    ledger: Arc<Mutex<Vec<Acked>>>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let api = edgeloop_tests::Api::new(&cp_http, Some(&admin));
        let mut attempts = 0u64;
        let mut n = 0u32;
        while !stop.is_cancelled() {
            if paused.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            n += 1;
            attempts += 1;
            let (req, acked) = match n % 3 {
                0 => {
                    let data = format!("ledger artifact {n} ").repeat(200).into_bytes();
                    let d = Digest::of(&data);
                    let len = data.len();
                    (
                        api.request(Method::PUT, &format!("/api/v1/artifacts/{d}"))
                            .body(data),
                        Acked::Artifact(d, len),
                    )
                }
                1 => {
                    let name = format!("ledger-{n}");
                    (
                        api.request(Method::POST, "/api/v1/models")
                            .json(&json!({"name": name})),
                        Acked::Model(name),
                    )
                }
                _ => {
                    let name = format!("ledger-dev-{n}");
                    (
                        api.request(Method::POST, "/api/v1/tokens")
                            .json(&json!({"kind": "device", "name": name})),
                        Acked::Token(name),
                    )
                }
            };
            match req.timeout(Duration::from_secs(5)).send().await {
                Ok(r) if r.status().is_success() => ledger.lock().unwrap().push(acked),
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            // A console's pace, not a flood: the checks read every write back.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        attempts
    })
}

/// A listing the console answers with a JSON array, retried through faults.
async fn list(cp: &CpProcess, path: &str) -> Vec<Value> {
    retry(path, || async {
        let r = cp.api().request(Method::GET, path).send().await.ok()?;
        (r.status() == 200).then_some(())?;
        r.json::<Vec<Value>>().await.ok()
    })
    .await
}

/// Reads every acknowledged write back (artifacts byte for byte); panics
/// naming the first lost one.
async fn check_ledger(cp: &CpProcess, ledger: &[Acked]) {
    let names = |items: Vec<Value>, field: &str| -> BTreeSet<String> {
        items
            .iter()
            .filter_map(|t| t[field].as_str().map(str::to_string))
            .collect()
    };
    let tokens = names(list(cp, "/api/v1/tokens").await, "member_id");
    let models = names(list(cp, "/api/v1/models").await, "name");
    let mut artifacts = vec![];
    for w in ledger {
        match w {
            Acked::Token(name) => assert!(tokens.contains(name), "acked token {name} lost"),
            Acked::Model(name) => assert!(models.contains(name), "acked model {name} lost"),
            Acked::Artifact(d, len) => artifacts.push((*d, *len)),
        }
    }
    let api = &cp.api();
    futures::stream::iter(artifacts)
        .for_each_concurrent(8, |(d, len)| async move {
            // Read errors are the unreliable store's; a 404 is a loss.
            let bytes = acked_artifact(api, d, &format!("acked artifact {d} lost")).await;
            assert_eq!((bytes.len(), Digest::of(&bytes)), (len, d));
        })
        .await;
}

/// A device that sends telemetry as an agent does: one report at a time,
/// each resent until acknowledged. `acked` is the highest acknowledged
/// sequence.
fn telemetry_sender(
    grpc_url: String,
    identity: edgeloop_client_core::Identity,
    epoch: u64,
    acked: Arc<AtomicU64>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let channel = edgeloop_client_core::tls::mtls_endpoint(&grpc_url, &identity)
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect_lazy();
        let mut client = AgentServiceClient::new(channel);
        let mut sequence = 1;
        loop {
            let report = TelemetryReport {
                sequence,
                epoch,
                events: vec![Event {
                    kind: "crash-test".into(),
                    message: format!("report {sequence}"),
                    ..Default::default()
                }],
                ..Default::default()
            };
            match client.report_telemetry(report).await {
                Ok(ack) if ack.get_ref().acked_sequence >= sequence => {
                    acked.store(sequence, Ordering::SeqCst);
                    sequence += 1;
                    if stop.is_cancelled() {
                        return;
                    }
                    // A busy device's pace (an agent flushes every few seconds).
                    tokio::time::sleep(Duration::from_millis(25)).await;
                    while paused.load(Ordering::SeqCst) && !stop.is_cancelled() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                Ok(ack) => panic!("sequence {sequence} answered with ack {ack:?}"),
                // Down or restarting: the report stays pending, as in the
                // agent's buffer, and goes again.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

/// Each acknowledged sequence stored exactly once, with its own content,
/// and (once the sender has stopped) nothing more. Returns how many.
async fn check_telemetry(cp: &CpProcess, device: &str, epoch: u64, acked: u64, exact: bool) -> u64 {
    let stored = stored_reports(cp, device).await;
    for seq in 1..=acked {
        let copies = stored.get(&(epoch, seq)).map_or(0, Vec::len);
        assert_eq!(
            copies, 1,
            "report {seq} (acked up to {acked}) stored {copies} times"
        );
        let r = &stored[&(epoch, seq)][0];
        assert_eq!(r["events"][0]["message"], format!("report {seq}"), "{r}");
    }
    if exact {
        let extra: Vec<_> = stored.keys().filter(|(_, s)| *s > acked).collect();
        assert!(extra.is_empty(), "stored beyond the last ack: {extra:?}");
    }
    acked
}

edgeloop_tests::on_each_store!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    the_control_plane_killed_mid_writes_telemetry_and_rollouts_loses_nothing
);

/// On sled and on PostgreSQL: on PostgreSQL a kill also drops the
/// connections mid-statement, and the store outlives the process.
async fn the_control_plane_killed_mid_writes_telemetry_and_rollouts_loses_nothing(
    store: edgeloop_tests::TestStore,
) {
    const ROUNDS: u32 = 8;
    let (seed, mut rng) = seeded("control plane");
    let dir = tempfile::tempdir().unwrap();
    let faults = format!("seed={seed},error=0.05,delay_ms=20,torn=0.05");
    let env = store
        .url()
        .map(|url| vec![("EDGELOOP_STORE_URL".to_string(), url)])
        .unwrap_or_default();
    let backend = if env.is_empty() { "sled" } else { "postgres" };
    let mut cp = CpProcess::start_with_env(&dir.path().join("cp"), Some(&faults), env).await;
    let mut tally = Tally::default();

    create_model(&cp, MODEL).await;
    let key = ManifestKey::generate();
    for k in 1..=ROUNDS + 2 {
        register(&cp, &key, k, 1_000).await;
    }
    let agents = start_agents(&cp, dir.path(), &key, 2).await;
    let first = deploy(&cp, 1, &[2]).await;
    assert_eq!(ended(&cp, &first).await, "succeeded");
    all_serve(&agents, 1).await;

    // The telemetry device, enrolled as an agent would be.
    let token: BootstrapToken = cp.token("device", "sim-1").await.parse().unwrap();
    let identity = enroll(
        Role::Device,
        &cp.grpc_url,
        &token,
        &IdentityStore::new(&dir.path().join("sim-1")),
        Default::default(),
    )
    .await
    .unwrap();
    let epoch = rng.random_range(1..u64::MAX);
    let acked = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    // The load pauses while a round reads everything back, so the checks
    // run on a quiet control plane and each round adds a similar amount.
    let paused = Arc::new(AtomicBool::new(false));
    let sender = telemetry_sender(
        cp.grpc_url.clone(),
        identity,
        epoch,
        acked.clone(),
        paused.clone(),
        stop.clone(),
    );
    let ledger = Arc::new(Mutex::new(Vec::new()));
    let writer = console_writer(
        cp.http_base.clone(),
        cp.admin_token.clone(),
        ledger.clone(),
        paused.clone(),
        stop.clone(),
    );

    // Each round starts a rollout (two waves) and kills the control plane
    // at a random point of it, amid the writes and the telemetry.
    let mut deployments = vec![first];
    let mut interrupted = vec![];
    for round in 0..ROUNDS {
        deployments.push(deploy(&cp, round + 2, &[1, 2]).await);
        let after = Duration::from_millis(rng.random_range(200..1_500));
        tokio::time::sleep(after).await;
        let state = deployment_state(&cp, deployments.last().unwrap()).await;
        interrupted.push(state.unwrap_or_else(|| "?".into()));
        cp.kill().await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
        cp.restart().await;

        // The writes the load had in flight when the control plane came
        // back go through, then the load pauses.
        tokio::time::sleep(Duration::from_millis(300)).await;
        paused.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let checking = std::time::Instant::now();
        let snapshot = ledger.lock().unwrap().clone();
        check_ledger(&cp, &snapshot).await;
        check_telemetry(&cp, "sim-1", epoch, acked.load(Ordering::SeqCst), false).await;
        paused.store(false, Ordering::SeqCst);
        eprintln!(
            "round {round}: killed {after:?} into the rollout ({}); {} acked writes and {} reports intact (checked in {:?})",
            interrupted.last().unwrap(),
            snapshot.len(),
            acked.load(Ordering::SeqCst),
            checking.elapsed()
        );
    }
    stop.cancel();
    let attempts = writer.await.unwrap();
    tokio::time::timeout(WAIT, sender).await.unwrap().unwrap();

    // Nothing acknowledged was lost, and telemetry is exactly once.
    let ledger = ledger.lock().unwrap().clone();
    check_ledger(&cp, &ledger).await;
    let reports = check_telemetry(&cp, "sim-1", epoch, acked.load(Ordering::SeqCst), true).await;
    // Every deployment ended, and a last one after the kills converges the fleet.
    for id in &deployments {
        ended(&cp, id).await;
    }
    let last = deploy(&cp, ROUNDS + 2, &[1, 2]).await;
    assert_eq!(ended(&cp, &last).await, "succeeded");
    all_serve(&agents, ROUNDS + 2).await;

    tally.kills = cp.proc.kills;
    tally.acked_writes_checked = ledger.len() as u64;
    tally.reports_checked = reports;
    tally.answers_checked = agents.len() as u64;
    tally.deployments_ended = deployments.len() as u64 + 1;
    tally.notes.push(format!(
        "write_attempts={attempts} injected_faults_logged={} interrupted={interrupted:?}",
        cp.proc.log_count("injected fault")
    ));
    assert!(
        ledger.len() >= 20,
        "too few writes to mean anything: {}",
        ledger.len()
    );
    assert!(reports >= 20, "too few reports to mean anything: {reports}");
    tally.print(&format!("control_plane/{backend}"), seed);
}
