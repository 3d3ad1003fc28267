//! The agent killed mid-flight.

use super::site::*;

/// Sends inference to every agent until stopped, checking each answer
/// against its version; counts requests sent per agent.
fn traffic(
    urls: Arc<Mutex<Vec<Option<String>>>>,
    answers: Arc<Vec<AtomicU64>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        while !stop.is_cancelled() {
            let now: Vec<Option<String>> = urls.lock().unwrap().clone();
            for (i, url) in now.iter().enumerate() {
                if let Some(url) = url {
                    answers[i].fetch_add(1, Ordering::Relaxed);
                    served(&http, url).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Floats of padding in the agent test's versions (4 MiB).
const PAD: usize = 1 << 20;

/// Polls `cond` every 5 ms for up to 10 s (a kill point not reached in
/// time is taken where the run is).
async fn wait_until(cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_killed_mid_download_flip_and_flush_serve_a_signed_version_and_converge() {
    const ROUNDS: u32 = 9;
    let (seed, mut rng) = seeded("agent");
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp"), None).await;
    let mut tally = Tally::default();
    create_model(&cp, MODEL).await;
    let key = ManifestKey::generate();
    // ~4 MB each: the downloads take long enough to be cut.
    for k in 1..=ROUNDS + 2 {
        register(&cp, &key, k, PAD).await;
    }
    let mut agents = start_agents(&cp, dir.path(), &key, 2).await;
    let first = deploy(&cp, 1, &[2]).await;
    assert_eq!(ended(&cp, &first).await, "succeeded");
    all_serve(&agents, 1).await;

    let urls = Arc::new(Mutex::new(
        agents.iter().map(|a| a.url()).collect::<Vec<_>>(),
    ));
    let answers = Arc::new(
        (0..agents.len())
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let stop = CancellationToken::new();
    let load = traffic(urls.clone(), answers.clone(), stop.clone());
    let http = reqwest::Client::new();
    let mut phases: BTreeMap<&str, u32> = BTreeMap::new();
    let mut deployments = vec![first];
    for round in 0..ROUNDS {
        let k = round + 2;
        deployments.push(deploy(&cp, k, &[2]).await);
        let i = rng.random_range(0..agents.len());
        let started = tokio::time::Instant::now();
        // Aimed in turn at the download, at the moment it completes (the
        // checks, the slot write and the flip follow), and anywhere (the
        // traffic's telemetry flushes every second).
        let digest = Digest::of(&version_model(k, PAD));
        match round % 3 {
            0 => {
                wait_until(|| agents[i].partial(MODEL, digest)).await;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
            }
            1 => {
                wait_until(|| agents[i].partial(MODEL, digest)).await;
                wait_until(|| !agents[i].partial(MODEL, digest)).await;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1_500))).await;
            }
        }
        let after = started.elapsed();
        // Where the kill lands, as far as the outside can tell.
        let phase = if agents[i].partial(MODEL, digest) {
            "download"
        } else {
            match served(&http, &agents[i].url().unwrap()).await {
                Some(v) if v == k => "serving_new",
                _ => "after_download",
            }
        };
        *phases.entry(phase).or_default() += 1;
        urls.lock().unwrap()[i] = None;
        agents[i].kill().await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        agents[i].restart().await;
        let url = agents[i].url().unwrap();
        urls.lock().unwrap()[i] = Some(url.clone());
        // Back from disk with a whole version, old or new, before it
        // reaches the network; `served` checks the answer.
        let back = eventually(
            WAIT,
            &format!("{} serves again", agents[i].name),
            || async { served(&http, &url).await },
        )
        .await;
        assert!(back <= k, "served {back} before it was deployed");
        eprintln!(
            "round {round}: {} killed {after:?} into the rollout of {} ({phase}); back serving {}",
            agents[i].name,
            version(k),
            version(back)
        );
        let state = ended(&cp, deployments.last().unwrap()).await;
        tally.notes.push(format!("{}={state}", version(k)));
    }
    // The fleet converges once the kills stop.
    let last = deploy(&cp, ROUNDS + 2, &[2]).await;
    assert_eq!(ended(&cp, &last).await, "succeeded");
    all_serve(&agents, ROUNDS + 2).await;
    // One telemetry interval and a bit, so the last windows are flushed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    load.await.unwrap();

    // Telemetry: every epoch's sequences from 1 without a gap (nothing an
    // agent persisted was lost or stored twice), nothing dropped, and no
    // request counted more often than it was answered.
    let mut reports = 0;
    for (i, a) in agents.iter().enumerate() {
        let stored = stored_reports(&cp, &a.name).await;
        let mut epochs: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut requests = 0;
        for ((epoch, seq), copies) in &stored {
            assert_eq!(copies.len(), 1);
            epochs.entry(*epoch).or_default().push(*seq);
            let r = &copies[0];
            assert_eq!(r["dropped_batches"], 0, "{r}");
            requests += r["models"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["requests"].as_u64().unwrap())
                .sum::<u64>();
        }
        for (epoch, seqs) in &epochs {
            let want: Vec<u64> = (1..=seqs.len() as u64).collect();
            assert_eq!(seqs, &want, "{} epoch {epoch}: a gap", a.name);
        }
        let answered = answers[i].load(Ordering::Relaxed);
        assert!(
            requests <= answered,
            "{}: {requests} counted, {answered} sent",
            a.name
        );
        reports += stored.len() as u64;
        tally.notes.push(format!(
            "{}:sent={answered},counted={requests},epochs={}",
            a.name,
            epochs.len()
        ));
    }
    tally.kills = agents.iter().map(|a| a.proc.kills).sum();
    tally.reports_checked = reports;
    tally.answers_checked = answers.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    tally.deployments_ended = deployments.len() as u64 + 1;
    tally.notes.push(format!("phases={phases:?}"));
    tally.print("agent", seed);
    for a in &mut agents {
        a.kill().await;
    }
}

/// An agent crashed exactly at each step of an install into its inactive
/// slot and of the flip (`edgeloop_edge_agent::crash_point`): started
/// again, it serves from disk the version its recorded active slot holds,
/// whole and signed (the old one until the flip is recorded, the new one
/// after), then installs what is assigned, and the rollout succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_crashed_at_each_install_and_flip_step_boots_a_signed_version_and_converges() {
    use edgeloop_edge_agent::crash_point::{ENV, POINTS};
    edgeloop_client_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp"), None).await;
    create_model(&cp, MODEL).await;
    let key = ManifestKey::generate();
    for k in 1..=POINTS.len() as u32 + 1 {
        register(&cp, &key, k, 1024).await;
    }
    let mut agents = start_agents(&cp, dir.path(), &key, 1).await;
    let agent = &mut agents[0];
    let first = deploy(&cp, 1, &[1]).await;
    assert_eq!(ended(&cp, &first).await, "succeeded");
    all_serve(std::slice::from_ref(agent), 1).await;
    let http = reqwest::Client::new();
    let mut tally = Tally::default();
    for (i, point) in POINTS.iter().enumerate() {
        let k = i as u32 + 2;
        agent.kill().await;
        agent.proc.set_env(ENV, Some(point));
        agent.restart().await;
        all_serve(std::slice::from_ref(agent), k - 1).await;
        let id = deploy(&cp, k, &[1]).await;
        let status = agent
            .proc
            .exited(WAIT)
            .await
            .unwrap_or_else(|| panic!("{point}: the agent never reached it"));
        assert!(!status.success(), "{point}: {status}");
        assert_eq!(
            agent
                .proc
                .log_count(&format!("crash point {point} reached")),
            1,
            "{point}"
        );
        agent.proc.set_env(ENV, None);
        let boots_before = agent.proc.log_count("serving from disk");
        agent.restart().await;
        // What the recorded active slot holds serves first, from disk.
        let want = if *point == "slot_flipped" { k } else { k - 1 };
        let url = agent.url().unwrap();
        let back = eventually(WAIT, &format!("{point}: serves again"), || async {
            served(&http, &url).await
        })
        .await;
        assert!(back == want || back == k, "{point}: served {back}");
        assert_eq!(
            agent.proc.log_count("serving from disk"),
            boots_before + 1,
            "{point}: booted from a slot"
        );
        let boot = agent
            .proc
            .log_lines("serving from disk")
            .pop()
            .unwrap_or_default();
        assert!(
            boot.contains(&version(want)),
            "{point}: booted {boot}, want {}",
            version(want)
        );
        assert_eq!(ended(&cp, &id).await, "succeeded", "{point}");
        all_serve(std::slice::from_ref(agent), k).await;
        tally
            .notes
            .push(format!("{point}:booted={}", version(want)));
    }
    tally.kills = POINTS.len() as u32;
    tally.deployments_ended = POINTS.len() as u64 + 1;
    tally.print("agent_crash_points", 0);
    agent.kill().await;
}
