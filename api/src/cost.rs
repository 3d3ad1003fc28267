//! The cost report's types: the prices it uses (configurable on the
//! server, `[cost]`), the measured traffic, and the monthly estimate of
//! serving it at the edge versus in the cloud. The server computes them
//! (`control-plane/src/fleet/cost.rs`); `docs/cost.md` explains the model.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// 365 × 24 / 12: the month cloud price sheets use.
pub const HOURS_PER_MONTH: f64 = 730.0;
pub const SECONDS_PER_MONTH: f64 = HOURS_PER_MONTH * 3600.0;

/// Prices and hardware assumptions, in US dollars. Every one is
/// configurable (`control-plane serve --cost-*`, `EDGELOOP_COST_*`, or
/// `[cost]` in the config file); `docs/cost.md` gives each default's source
/// and date.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Prices {
    /// One cloud instance, on demand (default: AWS EC2 c6i.large, 2 vCPU,
    /// Linux, us-east-1).
    pub cloud_instance_hourly_usd: f64,
    /// Requests one instance serves at once (its vCPUs).
    pub cloud_instance_concurrency: u32,
    /// The busy share instances are sized for at the peak hour, leaving
    /// headroom for bursts inside the hour.
    pub cloud_target_utilization: f64,
    /// How many times faster a request runs in the cloud than its latency
    /// measured on the devices (1: the same).
    pub cloud_speedup: f64,
    /// Serverless (default: AWS Lambda, x86, us-east-1).
    pub serverless_per_million_requests_usd: f64,
    pub serverless_gb_second_usd: f64,
    /// Memory given to the function (Lambda allots CPU in proportion).
    pub serverless_memory_gb: f64,
    /// One edge device's draw idle and fully busy (default: Raspberry Pi 5).
    pub edge_idle_watts: f64,
    pub edge_busy_watts: f64,
    pub electricity_usd_per_kwh: f64,
    /// One edge device's price, spread over its service life.
    pub edge_hardware_usd: f64,
    pub edge_amortization_months: u32,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            cloud_instance_hourly_usd: 0.085,
            cloud_instance_concurrency: 2,
            cloud_target_utilization: 0.6,
            cloud_speedup: 1.0,
            serverless_per_million_requests_usd: 0.20,
            serverless_gb_second_usd: 0.000_016_666_7,
            serverless_memory_gb: 2.0,
            edge_idle_watts: 3.0,
            edge_busy_watts: 7.0,
            electricity_usd_per_kwh: 0.13,
            edge_hardware_usd: 80.0,
            edge_amortization_months: 36,
        }
    }
}

/// A price the estimate cannot use, named by its setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cost.{field}: {message}")]
pub struct PriceError {
    pub field: &'static str,
    pub message: String,
}

impl Prices {
    /// Checked once, when the config is loaded, so `estimate` never sees a
    /// price that would make its numbers NaN, infinite or negative.
    pub fn validate(&self) -> Result<(), PriceError> {
        let bad = |field, message: &str| {
            Err(PriceError {
                field,
                message: message.into(),
            })
        };
        for (field, v) in [
            ("cloud-instance-hourly-usd", self.cloud_instance_hourly_usd),
            (
                "serverless-per-million-requests-usd",
                self.serverless_per_million_requests_usd,
            ),
            ("serverless-gb-second-usd", self.serverless_gb_second_usd),
            ("edge-idle-watts", self.edge_idle_watts),
            ("electricity-usd-per-kwh", self.electricity_usd_per_kwh),
            ("edge-hardware-usd", self.edge_hardware_usd),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, "must be a finite number >= 0");
            }
        }
        for (field, v) in [
            ("cloud-speedup", self.cloud_speedup),
            ("serverless-memory-gb", self.serverless_memory_gb),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(field, "must be a finite number > 0");
            }
        }
        if !(self.cloud_target_utilization > 0.0 && self.cloud_target_utilization <= 1.0) {
            return bad("cloud-target-utilization", "must be above 0 and at most 1");
        }
        if !(self.edge_busy_watts.is_finite() && self.edge_busy_watts >= self.edge_idle_watts) {
            return bad(
                "edge-busy-watts",
                "must be a finite number >= edge-idle-watts",
            );
        }
        if self.cloud_instance_concurrency == 0 {
            return bad("cloud-instance-concurrency", "must be at least 1");
        }
        if self.edge_amortization_months == 0 {
            return bad("edge-amortization-months", "must be at least 1");
        }
        Ok(())
    }
}

/// The measured traffic, summed over devices and windows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Traffic {
    pub requests: u64,
    pub errors: u64,
    /// Devices that served the model.
    pub devices: usize,
    /// From the first window's start to the last window's end.
    pub observed_seconds: f64,
    /// Requests per second over the whole fleet, on average...
    pub mean_rps: f64,
    /// ...and in the busiest clock hour (each device's rate in that hour,
    /// summed).
    pub peak_rps: f64,
    /// The windows' median and 99th-percentile latency, weighted by their
    /// requests. The median stands for the compute time of one request.
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EdgeCost {
    pub devices: usize,
    /// Each device's busy share at the mean rate (requests × latency).
    pub busy_share: f64,
    pub watts_per_device: f64,
    pub energy_kwh: f64,
    pub energy_usd: f64,
    pub hardware_usd: f64,
    pub total_usd: f64,
    pub usd_per_million_requests: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceCost {
    /// Sized for the peak hour, running all month.
    pub instances: u64,
    pub total_usd: f64,
    pub usd_per_million_requests: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServerlessCost {
    pub gb_seconds: f64,
    pub requests_usd: f64,
    pub compute_usd: f64,
    pub total_usd: f64,
    pub usd_per_million_requests: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Venue {
    Edge,
    CloudInstances,
    CloudServerless,
}

/// Monthly US dollars for the measured traffic, three ways.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Estimate {
    /// The mean rate kept up for a month.
    pub monthly_requests: f64,
    pub edge: EdgeCost,
    pub cloud_instances: InstanceCost,
    pub cloud_serverless: ServerlessCost,
    pub cheapest: Venue,
    /// The cheaper cloud option's cost minus the edge's: what the edge
    /// saves a month (negative when the cloud is cheaper).
    pub edge_saves_usd: f64,
}

/// `GET /api/v1/models/{name}/cost`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CostView {
    pub model: String,
    pub version: Option<String>,
    pub days: i64,
    /// The start of the measured period.
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    pub prices: Prices,
    pub traffic: Traffic,
    /// `null` when no requests were reported in the period.
    pub estimate: Option<Estimate>,
}
