//! The control planes a run measures: the real binary as child
//! processes (pinned with `taskset` when asked), stopped however the run
//! ends, and what the benchmark reads of them (RSS, the heartbeat handling
//! histogram in `/metrics`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use edgeloop_tests::{free_port, Api};

use crate::Args;

pub struct ControlPlaneProcess {
    pub child: std::process::Child,
    pub grpc_url: String,
    http_base: String,
    pub api: Api,
}

/// A number field of a process's `/proc/<pid>/status`: `VmHWM` (peak)
/// or `VmRSS` (now) in KiB, or `Threads`.
pub fn proc_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Stops the control plane however the benchmark ends (a failed run
/// included), so none is left behind.
impl Drop for ControlPlaneProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Where a run's control planes keep their records and artifacts.
pub struct Stores {
    pub store_url: Option<String>,
    pub artifact_url: Option<String>,
}

pub async fn start_control_plane(
    dir: &Path,
    args: &Args,
    stores: &Stores,
) -> anyhow::Result<ControlPlaneProcess> {
    let exe = std::env::current_exe()?
        .parent()
        .context("exe dir")?
        .join("control-plane");
    let (grpc, http) = (free_port(), free_port());
    let mut cmd = match &args.cp_cpus {
        Some(cpus) => {
            let mut c = std::process::Command::new("taskset");
            c.args(["-c", cpus]).arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    cmd.args(["serve", "--data-dir"]).arg(dir).args([
        "--grpc-listen",
        &format!("127.0.0.1:{grpc}"),
        "--http-listen",
        &format!("127.0.0.1:{http}"),
        "--heartbeat-interval-secs",
        "5",
        "--rollout-tick-ms",
        "500",
    ]);
    if let Some(url) = &stores.store_url {
        cmd.args(["--store-url", url]);
    }
    cmd.args(&args.cp_args);
    if let Some(url) = &stores.artifact_url {
        cmd.args(["--artifact-url", url]);
    }
    let child = cmd
        .envs(args.cp_env.iter().map(|(k, v)| (k, v)))
        .env("EDGELOOP_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {} (build it first)", exe.display()))?;
    let token_path = dir.join("admin.token");
    let base = format!("http://127.0.0.1:{http}");
    for _ in 0..600 {
        // A replica's token file is there before it listens (copied).
        let up = reqwest::get(format!("{base}/healthz"))
            .await
            .is_ok_and(|r| r.status().is_success());
        if let (true, Ok(t)) = (up, std::fs::read_to_string(&token_path)) {
            let api = Api::new(&base, Some(t.trim()));
            {
                return Ok(ControlPlaneProcess {
                    child,
                    grpc_url: format!("https://localhost:{grpc}"),
                    http_base: base,
                    api,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("control plane did not come up")
}

/// The heartbeat handling histogram's series in `/metrics`.
pub const HEARTBEAT_HANDLING: &str = "edgeloop_heartbeat_handling_seconds_bucket{";

/// The store-call histograms' series (PostgreSQL only): what they measure,
/// and the series' prefix in `/metrics`.
pub const STORE_SERIES: [(&str, &str); 5] = [
    (
        "store call, urgent lane (heartbeats)",
        "edgeloop_store_call_seconds_bucket{lane=\"urgent\",",
    ),
    (
        "  of it waiting for a connection",
        "edgeloop_store_wait_seconds_bucket{lane=\"urgent\",",
    ),
    (
        "  of it running on the connection",
        "edgeloop_store_run_seconds_bucket{lane=\"urgent\",",
    ),
    (
        "store call, normal lane",
        "edgeloop_store_call_seconds_bucket{lane=\"normal\",",
    ),
    (
        "  of it waiting for a connection",
        "edgeloop_store_wait_seconds_bucket{lane=\"normal\",",
    ),
];

/// A histogram's cumulative bucket counts, by bound (`f64::INFINITY` for
/// `+Inf`), summed over the replicas; `None` when `/metrics` has no such
/// series (the store histograms on sled). `series` is the bucket lines'
/// prefix up to `le`, e.g. [`HEARTBEAT_HANDLING`].
pub async fn histogram_buckets(
    cps: &[ControlPlaneProcess],
    series: &str,
) -> anyhow::Result<Option<Vec<(f64, u64)>>> {
    let mut sum: Vec<(f64, u64)> = Vec::new();
    for cp in cps {
        let text = reqwest::get(format!("{}/metrics", cp.http_base))
            .await?
            .text()
            .await?;
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix(series)?.strip_prefix("le=\""))
            .filter_map(|l| {
                let (le, rest) = l.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, rest.trim().parse().ok()?))
            })
            .collect();
        if buckets.is_empty() {
            return Ok(None);
        }
        if sum.is_empty() {
            sum = buckets;
        } else {
            for (acc, (_, n)) in sum.iter_mut().zip(buckets) {
                acc.1 += n;
            }
        }
    }
    Ok(Some(sum))
}

/// The bucket bound under which `p` of the heartbeats between the two
/// readings were answered.
pub fn handling_quantile(before: &[(f64, u64)], after: &[(f64, u64)], p: f64) -> Duration {
    let diff: Vec<(f64, u64)> = after
        .iter()
        .zip(before)
        .map(|((le, a), (_, b))| (*le, a.saturating_sub(*b)))
        .collect();
    let total = diff.last().map_or(0, |(_, n)| *n);
    let want = (total as f64 * p).ceil() as u64;
    let le = diff
        .iter()
        .find(|(_, n)| *n >= want.max(1))
        .map_or(f64::INFINITY, |(le, _)| *le);
    Duration::from_secs_f64(le.min(3600.0))
}
