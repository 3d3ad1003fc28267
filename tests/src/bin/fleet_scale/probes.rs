//! Probe devices: the fleet's heartbeat as a device sees it, apart from
//! the simulator's own queueing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use edgeloop_client_core::tls::mtls_endpoint;
use edgeloop_client_core::{enroll, BootstrapToken, IdentityStore, Role};
use edgeloop_proto::agent::v1::agent_service_client::AgentServiceClient;
use edgeloop_proto::common::v1 as common;
use tokio::task::JoinSet;

/// Probe devices: enrolled like the others but outside the deployment's
/// selector, heartbeating every second from a runtime on a thread of
/// their own. A simulated agent's round trip also waits behind the other
/// simulated agents' decryption in this process (a real device has its
/// CPU to itself); a probe's waits for little but the control plane, so
/// it is the fleet's heartbeat as a device would see it.
pub fn start_probes(
    count: usize,
    urls: Vec<String>,
    tokens: Vec<String>,
    dir: PathBuf,
    epoch: Instant,
    done: tokio_util::sync::CancellationToken,
) -> std::thread::JoinHandle<anyhow::Result<ProbeSamples>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut set = JoinSet::new();
            for i in 0..count {
                let (url, token) = (urls[i % urls.len()].clone(), tokens[i].clone());
                let dir = dir.join(format!("probe-{i}"));
                let done = done.clone();
                set.spawn(async move {
                    let token: BootstrapToken = token.parse()?;
                    let identity = enroll(
                        Role::Device,
                        &url,
                        &token,
                        &IdentityStore::new(&dir),
                        Default::default(),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("probe enroll: {e:?}"))?;
                    let mut client =
                        AgentServiceClient::new(mtls_endpoint(&url, &identity)?.connect().await?);
                    let mut out = ProbeSamples::default();
                    tokio::time::sleep(Duration::from_millis(37 * i as u64 % 1000)).await;
                    while !done.is_cancelled() {
                        let sent = Instant::now();
                        match client.heartbeat(common::HeartbeatRequest::default()).await {
                            Ok(_) => out.ok.push((sent - epoch, sent.elapsed())),
                            Err(_) => out.failed.push(sent - epoch),
                        }
                        tokio::select! {
                            _ = done.cancelled() => {}
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                    anyhow::Ok(out)
                });
            }
            let mut all = ProbeSamples::default();
            while let Some(r) = set.join_next().await {
                let one = r??;
                all.ok.extend(one.ok);
                all.failed.extend(one.failed);
            }
            Ok(all)
        })
    })
}

/// What the probes measured.
#[derive(Debug, Default)]
pub struct ProbeSamples {
    /// Each answered heartbeat: (when it was sent, since `epoch`; its
    /// round trip).
    pub ok: Vec<(Duration, Duration)>,
    /// When each heartbeat that failed was sent: a percentile of the
    /// answered ones alone would hide them.
    pub failed: Vec<Duration>,
}

impl ProbeSamples {
    /// The heartbeats sent within `from..until` that failed.
    pub fn failed_within(&self, from: Duration, until: Duration) -> usize {
        self.failed
            .iter()
            .filter(|at| **at >= from && **at < until)
            .count()
    }
}

/// The round trips of the probe samples sent within `from..until`, sorted.
pub fn probe_window(
    samples: &[(Duration, Duration)],
    from: Duration,
    until: Duration,
) -> Vec<Duration> {
    let mut v: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| *at >= from && *at < until)
        .map(|(_, rt)| *rt)
        .collect();
    v.sort();
    v
}

pub const PROBES: usize = 20;

/// The slowest probe round trip in each second of `from..until`, with the
/// number of samples in it: where in the rollout the probes queue.
pub fn probe_timeline(
    samples: &[(Duration, Duration)],
    from: Duration,
    until: Duration,
) -> Vec<(u64, Duration, usize)> {
    let seconds = (until.saturating_sub(from)).as_secs() + 1;
    let mut out: Vec<(u64, Duration, usize)> =
        (0..seconds).map(|s| (s, Duration::ZERO, 0)).collect();
    for (at, rt) in samples {
        if *at < from || *at >= until {
            continue;
        }
        let slot = &mut out[(*at - from).as_secs() as usize];
        slot.1 = slot.1.max(*rt);
        slot.2 += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_keeps_each_seconds_slowest_round_trip() {
        let ms = Duration::from_millis;
        let samples = [
            (ms(900), ms(5)),     // before the window
            (ms(1_000), ms(7)),   // second 0
            (ms(1_500), ms(30)),  // second 0, slower
            (ms(3_200), ms(400)), // second 2
            (ms(4_000), ms(1)),   // at the end: outside
        ];
        assert_eq!(
            probe_timeline(&samples, ms(1_000), ms(4_000)),
            vec![
                (0, ms(30), 2),
                (1, Duration::ZERO, 0),
                (2, ms(400), 1),
                (3, Duration::ZERO, 0)
            ]
        );
    }
}
