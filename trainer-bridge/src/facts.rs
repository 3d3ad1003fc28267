//! What the bridge knows about its cluster, kept fresh: each engine's node
//! pools, read from the engine itself every `EDGELOOP_FACTS_REFRESH_SECS`
//! (default 60). The pre-flight check reads the latest facts, and every
//! heartbeat carries them to the control plane.
//!
//! A refresh that fails for one engine keeps that engine's last pools (a
//! slurmrestd restart should not make every GPU job look impossible) and
//! logs why; an engine that never answered has no pools, so a GPU job for
//! it is refused saying there are no facts yet.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use edgeloop_client_core::gpu::LocalGpus;
use edgeloop_proto::common::v1 as pb;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::engines::{Engine, NodePool};
use crate::preflight::ClusterFacts;

/// How often the pools are read again, in seconds.
pub const REFRESH_ENV: &str = "EDGELOOP_FACTS_REFRESH_SECS";
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(60);
/// A JSON file with this machine's GPUs, used instead of `nvidia-smi`
/// (see `edgeloop_client_core::gpu::LocalGpus::load`).
pub const GPU_FACTS_ENV: &str = "EDGELOOP_GPU_FACTS";
/// One engine's answer may take this long before the refresh moves on.
const ENGINE_DEADLINE: Duration = Duration::from_secs(30);

/// The refresh period from the environment.
pub fn refresh_period() -> anyhow::Result<Duration> {
    match std::env::var(REFRESH_ENV) {
        Err(_) => Ok(DEFAULT_REFRESH),
        Ok(v) => {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && (0.1..=86_400.0).contains(s))
                .with_context(|| format!("{REFRESH_ENV}={v:?}: must be 0.1 to 86400 seconds"))?;
            Ok(Duration::from_secs_f64(secs))
        }
    }
}

/// This machine's GPUs: the injected file when set, else `nvidia-smi`.
pub fn local_gpus() -> anyhow::Result<LocalGpus> {
    match std::env::var_os(GPU_FACTS_ENV).filter(|v| !v.is_empty()) {
        Some(path) => Ok(LocalGpus::load(&PathBuf::from(path))?),
        None => Ok(LocalGpus::detect()),
    }
}

/// Reads every engine's pools once; an engine that fails keeps its pools
/// from `last`.
pub async fn read(
    engines: &BTreeMap<String, Arc<dyn Engine>>,
    last: &ClusterFacts,
) -> ClusterFacts {
    let mut pools = Vec::new();
    for (name, engine) in engines {
        match tokio::time::timeout(ENGINE_DEADLINE, engine.pools()).await {
            Ok(Ok(mut got)) => {
                // An engine reports its own pools; never trust it to name another.
                got.retain(|p| p.engine == *name);
                pools.extend(got);
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {ENGINE_DEADLINE:?}"),
                };
                tracing::warn!(engine = %name, %why, "could not read the engine's node pools; keeping the last ones");
                pools.extend(last.pools.iter().filter(|p| p.engine == *name).cloned());
            }
        }
    }
    ClusterFacts {
        engines: engines.keys().cloned().collect(),
        pools,
    }
}

/// Re-reads the pools every `period` until `shutdown`, publishing them to
/// the runner (`facts`) and the heartbeats (`caps`).
pub async fn refresh_loop(
    engines: BTreeMap<String, Arc<dyn Engine>>,
    facts: watch::Sender<ClusterFacts>,
    caps: watch::Sender<pb::Capabilities>,
    period: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.cancelled() => return,
        }
        let last = facts.borrow().clone();
        let next = read(&engines, &last).await;
        if next != last {
            tracing::info!(pools = next.pools.len(), "node pools changed");
            caps.send_modify(|c| c.pools = next.pools.iter().map(to_proto).collect());
            facts.send_replace(next);
        }
    }
}

/// A pool as the heartbeat carries it (unknowns as empty strings and 0).
pub fn to_proto(p: &NodePool) -> pb::NodePool {
    pb::NodePool {
        engine: p.engine.clone(),
        name: p.name.clone(),
        nodes: p.nodes.unwrap_or(0),
        gpus_per_node: p.gpus_per_node,
        gpu_type: p.gpu_type.clone().unwrap_or_default(),
        gpu_memory_bytes: p.gpu_memory_bytes.unwrap_or(0),
        driver_version: p.driver_version.clone().unwrap_or_default(),
        cuda_version: p.cuda_version.clone().unwrap_or_default(),
        cpus_per_node: p.cpus_per_node,
        memory_mb_per_node: p.memory_mb_per_node,
        source: p.source.clone(),
        placement: p.placement.clone().into_iter().collect(),
        containers: p
            .containers
            .iter()
            .map(|w| w.as_str().to_string())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::engines::{EngineError, EngineJobId, EngineState, Launch};

    /// An engine whose pools answer can be switched off; nothing else is
    /// called by `read`.
    struct Flaky {
        up: AtomicBool,
        engine: &'static str,
    }

    #[async_trait]
    impl Engine for Flaky {
        fn name(&self) -> &'static str {
            self.engine
        }
        async fn submit(&self, _: &Launch) -> Result<EngineJobId, EngineError> {
            unreachable!("read only asks for pools")
        }
        async fn status(&self, _: &EngineJobId) -> Result<EngineState, EngineError> {
            unreachable!("read only asks for pools")
        }
        async fn cancel(&self, _: &EngineJobId) -> Result<(), EngineError> {
            unreachable!("read only asks for pools")
        }
        async fn logs(&self, _: &EngineJobId) -> Result<String, EngineError> {
            unreachable!("read only asks for pools")
        }
        async fn pools(&self) -> Result<Vec<NodePool>, EngineError> {
            if !self.up.load(Ordering::SeqCst) {
                return Err(EngineError::Unavailable("slurmrestd is restarting".into()));
            }
            Ok(vec![
                NodePool {
                    engine: self.engine.into(),
                    name: "gpu".into(),
                    gpus_per_node: 4,
                    source: "test".into(),
                    ..NodePool::default()
                },
                // Not this engine's to report: dropped.
                NodePool {
                    engine: "ray".into(),
                    name: "stray".into(),
                    source: "test".into(),
                    ..NodePool::default()
                },
            ])
        }
    }

    #[tokio::test]
    async fn a_failing_engine_keeps_its_last_pools() {
        let slurm = Arc::new(Flaky {
            up: AtomicBool::new(true),
            engine: "slurm",
        });
        let engines: BTreeMap<String, Arc<dyn Engine>> =
            BTreeMap::from([("slurm".to_string(), slurm.clone() as Arc<dyn Engine>)]);
        let first = read(&engines, &ClusterFacts::default()).await;
        assert_eq!(first.engines, ["slurm"]);
        assert_eq!(first.pools.len(), 1, "{first:?}");
        assert_eq!(first.pools[0].name, "gpu");
        slurm.up.store(false, Ordering::SeqCst);
        assert_eq!(read(&engines, &first).await, first);
        // Never answered: no pools, and a GPU job for it is refused.
        assert!(read(&engines, &ClusterFacts::default())
            .await
            .pools
            .is_empty());
    }

    #[tokio::test]
    async fn the_refresh_loop_publishes_new_pools_to_the_runner_and_the_heartbeats() {
        let slurm = Arc::new(Flaky {
            up: AtomicBool::new(false),
            engine: "slurm",
        });
        let engines: BTreeMap<String, Arc<dyn Engine>> =
            BTreeMap::from([("slurm".to_string(), slurm.clone() as Arc<dyn Engine>)]);
        let (facts_tx, mut facts_rx) =
            watch::channel(read(&engines, &ClusterFacts::default()).await);
        let (caps_tx, caps_rx) = watch::channel(pb::Capabilities::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(refresh_loop(
            engines,
            facts_tx,
            caps_tx,
            Duration::from_millis(10),
            stop.clone(),
        ));
        assert!(facts_rx.borrow().pools.is_empty());
        slurm.up.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), facts_rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(facts_rx.borrow().pools[0].gpus_per_node, 4);
        let beat = caps_rx.borrow().clone();
        assert_eq!(beat.pools.len(), 1);
        assert_eq!(
            (beat.pools[0].engine.as_str(), beat.pools[0].gpus_per_node),
            ("slurm", 4)
        );
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn the_refresh_period_is_checked() {
        // One test touches the variable, so nothing races on it.
        std::env::set_var(REFRESH_ENV, "0.5");
        assert_eq!(refresh_period().unwrap(), Duration::from_millis(500));
        std::env::set_var(REFRESH_ENV, "never");
        let err = refresh_period().unwrap_err().to_string();
        assert!(err.contains(REFRESH_ENV), "{err}");
        std::env::remove_var(REFRESH_ENV);
        assert_eq!(refresh_period().unwrap(), DEFAULT_REFRESH);
    }
}
