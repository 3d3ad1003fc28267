//! What running a job in a container costs on the local engine: the same
//! trivial job (`sh -c true`) submitted and polled to its end 10 times on
//! the host and 10 times in a container of the image
//! `scripts/containers-up.sh` builds, medians and their difference printed
//! from the one run (these machines are noisy: compare within a run).
//!
//! `cargo bench -p edgeloop-trainer-bridge --bench container_start`
//! (after `scripts/containers-up.sh`; `EDGELOOP_CONTAINERS_ENV` names its
//! env file, else `/tmp/edgeloop-containers/env`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use edgeloop_trainer_bridge::engines::local::container::{ContainerRuntime, RuntimeKind};
use edgeloop_trainer_bridge::engines::local::LocalEngine;
use edgeloop_trainer_bridge::engines::{Engine, EngineState, Launch, Launcher};

const RUNS: usize = 10;

/// The test image, with the runtime's config in this process's environment.
fn image() -> String {
    let path = std::env::var("EDGELOOP_CONTAINERS_ENV").map_or_else(
        |_| PathBuf::from("/tmp/edgeloop-containers/env"),
        PathBuf::from,
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run scripts/containers-up.sh first",
            path.display()
        )
    });
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    if let Some(conf) = vars.get("CONTAINERS_CONF") {
        std::env::set_var("CONTAINERS_CONF", conf);
    }
    vars["EDGELOOP_TEST_IMAGE"].to_string()
}

fn launch(dir: &Path, job: &str, image: Option<&str>) -> Launch {
    Launch {
        job_id: job.into(),
        attempt: 1,
        name: job.into(),
        image: image.map(str::to_string),
        pinned_image: None,
        command: vec!["sh".into(), "-c".into(), "true".into()],
        env: BTreeMap::from([("EDGELOOP_JOB_ID".to_string(), job.to_string())]),
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

/// Submit to terminal state, polling every 5 ms.
async fn run_once(engine: &LocalEngine, l: &Launch) -> Duration {
    let start = Instant::now();
    let id = engine.submit(l).await.unwrap();
    loop {
        let s = engine.status(&id).await.unwrap();
        if s.is_terminal() {
            assert_eq!(s, EngineState::Succeeded, "{}", l.job_id);
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

#[tokio::main]
async fn main() {
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let engine = LocalEngine::new(&dir.path().join("state"))
        .unwrap()
        .with_container(Some(ContainerRuntime::new(RuntimeKind::Podman)));
    // Interleaved, so a slow stretch of the machine hits both alike.
    let (mut host, mut container) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        host.push(run_once(&engine, &launch(dir.path(), &format!("host-{i}"), None)).await);
        container.push(
            run_once(
                &engine,
                &launch(dir.path(), &format!("ctr-{i}"), Some(&image)),
            )
            .await,
        );
    }
    let (h, c) = (median(host), median(container));
    println!(
        "container start, median of {RUNS} (submit to succeeded, `sh -c true`): \
         host {:.1} ms, container {:.1} ms, overhead {:.1} ms ({:.1}x)",
        h.as_secs_f64() * 1e3,
        c.as_secs_f64() * 1e3,
        (c.as_secs_f64() - h.as_secs_f64()) * 1e3,
        c.as_secs_f64() / h.as_secs_f64()
    );
}
