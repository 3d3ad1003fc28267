//! The monthly cost of serving a model's measured traffic on its edge
//! devices versus in the cloud (dedicated instances, or serverless). A pure
//! function of the devices' telemetry and the prices: `traffic` sums the
//! reports, `estimate` prices them. The handler (`api/rest/cost.rs`) reads
//! the store; the prices come from the config (`[cost]`). The defaults,
//! their sources and what the model leaves out are in `docs/cost.md`.

use std::collections::{BTreeMap, BTreeSet};

use time::OffsetDateTime;

use edgeloop_errors::device_counts::Adder;

pub use edgeloop_api::cost::{
    EdgeCost, Estimate, InstanceCost, PriceError, Prices, ServerlessCost, Traffic, Venue,
    HOURS_PER_MONTH, SECONDS_PER_MONTH,
};

/// What one device reported for the model over one telemetry window.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub device: String,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub requests: u64,
    pub errors: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

/// Sums the observations. Spans shorter than a second count as a second,
/// so a lone burst cannot divide by zero. The counts are the devices':
/// their sums hold at `u64::MAX` (see [`edgeloop_errors::device_counts`]).
pub fn traffic(observations: &[Observation]) -> Traffic {
    let served: Vec<&Observation> = observations.iter().filter(|o| o.requests > 0).collect();
    let (Some(first), Some(last)) = (
        served.iter().map(|o| o.start.min(o.end)).min(),
        served.iter().map(|o| o.end).max(),
    ) else {
        return Traffic::default();
    };
    let mut add = Adder::default();
    let requests = add.sum(served.iter().map(|o| o.requests));
    let errors = add.sum(served.iter().map(|o| o.errors));
    let devices: BTreeSet<&str> = served.iter().map(|o| o.device.as_str()).collect();
    let observed_seconds = (last - first).as_seconds_f64().max(1.0);
    let mean_rps = requests as f64 / observed_seconds;
    // Per clock hour and device: requests, and the span they came in.
    let mut hours: BTreeMap<(i64, &str), (u64, OffsetDateTime, OffsetDateTime)> = BTreeMap::new();
    for o in &served {
        let hour = o.end.unix_timestamp().div_euclid(3600);
        let start = o.start.min(o.end);
        let e = hours
            .entry((hour, o.device.as_str()))
            .or_insert((0, start, o.end));
        add.add(&mut e.0, o.requests);
        e.1 = e.1.min(start);
        e.2 = e.2.max(o.end);
    }
    let mut per_hour: BTreeMap<i64, f64> = BTreeMap::new();
    for ((hour, _), (n, start, end)) in hours {
        *per_hour.entry(hour).or_default() += n as f64 / (end - start).as_seconds_f64().max(1.0);
    }
    let peak_rps = per_hour.values().copied().fold(mean_rps, f64::max);
    let weighted = |f: fn(&Observation) -> f64| {
        served.iter().map(|o| f(o) * o.requests as f64).sum::<f64>() / requests as f64
    };
    Traffic {
        requests,
        errors,
        devices: devices.len(),
        observed_seconds,
        mean_rps,
        peak_rps,
        latency_p50_ms: weighted(|o| o.latency_p50_ms),
        latency_p99_ms: weighted(|o| o.latency_p99_ms),
    }
}

/// Prices the traffic; `None` without any requests, since a rate of zero
/// would price nothing but idle hardware. `prices` must have passed
/// [`Prices::validate`].
pub fn estimate(t: &Traffic, p: &Prices) -> Option<Estimate> {
    if t.requests == 0 || t.devices == 0 {
        return None;
    }
    let monthly_requests = t.mean_rps * SECONDS_PER_MONTH;
    let per_million = |total: f64| total / monthly_requests * 1e6;
    let service_s = t.latency_p50_ms / 1000.0;

    // Edge: the devices exist anyway, idle most of the time; their draw
    // rises with the share of time they spend on requests.
    let devices = t.devices as f64;
    let busy_share = (t.mean_rps / devices * service_s).clamp(0.0, 1.0);
    let watts = p.edge_idle_watts + (p.edge_busy_watts - p.edge_idle_watts) * busy_share;
    let energy_kwh = devices * watts * HOURS_PER_MONTH / 1000.0;
    let energy_usd = energy_kwh * p.electricity_usd_per_kwh;
    let hardware_usd = devices * p.edge_hardware_usd / f64::from(p.edge_amortization_months);
    let edge_total = energy_usd + hardware_usd;

    // Dedicated instances: enough for the peak hour at the target busy
    // share, at least one, all month.
    let cloud_s = service_s / p.cloud_speedup;
    let capacity = f64::from(p.cloud_instance_concurrency) * p.cloud_target_utilization;
    let needed = (t.peak_rps * cloud_s / capacity).ceil();
    let instances = if needed.is_finite() && needed >= 1.0 {
        needed as u64
    } else {
        1
    };
    let instances_total = instances as f64 * p.cloud_instance_hourly_usd * HOURS_PER_MONTH;

    // Serverless: per request, plus memory × duration billed by the
    // started millisecond (at least one).
    let billed_s = (cloud_s * 1000.0).ceil().max(1.0) / 1000.0;
    let gb_seconds = monthly_requests * billed_s * p.serverless_memory_gb;
    let requests_usd = monthly_requests / 1e6 * p.serverless_per_million_requests_usd;
    let compute_usd = gb_seconds * p.serverless_gb_second_usd;
    let serverless_total = requests_usd + compute_usd;

    let cheapest_cloud = instances_total.min(serverless_total);
    let cheapest = if edge_total <= cheapest_cloud {
        Venue::Edge
    } else if instances_total <= serverless_total {
        Venue::CloudInstances
    } else {
        Venue::CloudServerless
    };
    Some(Estimate {
        monthly_requests,
        edge: EdgeCost {
            devices: t.devices,
            busy_share,
            watts_per_device: watts,
            energy_kwh,
            energy_usd,
            hardware_usd,
            total_usd: edge_total,
            usd_per_million_requests: per_million(edge_total),
        },
        cloud_instances: InstanceCost {
            instances,
            total_usd: instances_total,
            usd_per_million_requests: per_million(instances_total),
        },
        cloud_serverless: ServerlessCost {
            gb_seconds,
            requests_usd,
            compute_usd,
            total_usd: serverless_total,
            usd_per_million_requests: per_million(serverless_total),
        },
        cheapest,
        edge_saves_usd: cheapest_cloud - edge_total,
    })
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;
    use time::Duration;

    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    fn obs(device: &str, start: OffsetDateTime, secs: i64, requests: u64, p50: f64) -> Observation {
        Observation {
            device: device.into(),
            start,
            end: start + Duration::seconds(secs),
            requests,
            errors: 0,
            latency_p50_ms: p50,
            latency_p99_ms: p50 * 2.0,
        }
    }

    const T0: OffsetDateTime = datetime!(2026-03-01 00:00 UTC);

    #[test]
    fn traffic_sums_devices_and_windows() {
        let minute = |i: i64| T0 + Duration::minutes(i);
        // Two devices for an hour of one-minute windows: 60 and 120
        // requests a minute, at 10 ms and 40 ms.
        let mut all = vec![];
        for i in 0..60 {
            all.push(obs("a", minute(i), 60, 60, 10.0));
            all.push(obs("b", minute(i), 60, 120, 40.0));
        }
        let t = traffic(&all);
        assert_eq!((t.requests, t.devices), (10_800, 2));
        assert!(close(t.observed_seconds, 3600.0));
        assert!(close(t.mean_rps, 3.0), "{t:?}");
        assert!(close(t.peak_rps, 3.0), "{t:?}");
        // Weighted by requests: (60·10 + 120·40) / 180.
        assert!(close(t.latency_p50_ms, 30.0), "{t:?}");
        assert!(close(t.latency_p99_ms, 60.0), "{t:?}");
    }

    #[test]
    fn the_peak_is_the_busiest_hour_summed_over_devices() {
        let hour = |h: i64| T0 + Duration::hours(h);
        let all = [
            // Device a: 1 rps for three hours.
            obs("a", hour(0), 3600, 3600, 5.0),
            obs("a", hour(1), 3600, 3600, 5.0),
            obs("a", hour(2), 3600, 3600, 5.0),
            // Device b: one busy minute in hour 1 (10 rps), silent otherwise
            // (idle windows send no report).
            obs("b", hour(1) + Duration::minutes(30), 60, 600, 5.0),
        ];
        let t = traffic(&all);
        assert!(close(t.observed_seconds, 3.0 * 3600.0));
        assert!(close(t.mean_rps, 11_400.0 / 10_800.0), "{t:?}");
        assert!(close(t.peak_rps, 11.0), "{t:?}");
    }

    #[test]
    fn traffic_without_requests_is_empty_and_a_lone_burst_spans_a_second() {
        assert_eq!(traffic(&[]), Traffic::default());
        assert_eq!(traffic(&[obs("a", T0, 60, 0, 1.0)]), Traffic::default());
        let t = traffic(&[obs("a", T0, 0, 5, 1.0)]);
        assert!(
            close(t.observed_seconds, 1.0) && close(t.mean_rps, 5.0),
            "{t:?}"
        );
        // A window whose start is after its end (a clock step) counts
        // from its end.
        let mut skewed = obs("a", T0, 10, 5, 1.0);
        skewed.start = skewed.end + Duration::seconds(5);
        assert!(close(traffic(&[skewed]).observed_seconds, 1.0));
    }

    fn measured(devices: usize, mean_rps: f64, peak_rps: f64, p50: f64) -> Traffic {
        Traffic {
            requests: 1000,
            errors: 0,
            devices,
            observed_seconds: 3600.0,
            mean_rps,
            peak_rps,
            latency_p50_ms: p50,
            latency_p99_ms: p50 * 3.0,
        }
    }

    struct Case {
        name: &'static str,
        traffic: Traffic,
        prices: Prices,
        edge: f64,
        busy: f64,
        instances: u64,
        instances_usd: f64,
        serverless: f64,
        cheapest: Venue,
    }

    #[test]
    fn estimates_by_hand() {
        let d = Prices::default();
        let cases = [
            // 10 devices, 1 rps in all, 50 ms: hardware dominates the edge;
            // serverless at 2.628 M requests a month is cheapest.
            Case {
                name: "light traffic on many devices",
                traffic: measured(10, 1.0, 2.0, 50.0),
                prices: d,
                busy: 0.005,
                // 10 × (3 + 4 × 0.005) W × 730 h = 22.046 kWh × 0.13, + 10 × 80 / 36.
                edge: 22.046 * 0.13 + 800.0 / 36.0,
                instances: 1,
                instances_usd: 0.085 * 730.0,
                // 2.628 M × (0.20 / M) + 2.628 M × 0.05 s × 2 GB × 0.0000166667.
                serverless: 2.628 * 0.2 + 262_800.0 * 0.000_016_666_7,
                cheapest: Venue::CloudServerless,
            },
            // 2 devices, 50 rps, peak 100, 20 ms: the edge is half busy and
            // far cheaper; the peak needs two instances.
            Case {
                name: "heavy traffic on few devices",
                traffic: measured(2, 50.0, 100.0, 20.0),
                prices: d,
                busy: 0.5,
                edge: 2.0 * 5.0 * 730.0 / 1000.0 * 0.13 + 160.0 / 36.0,
                instances: 2,
                instances_usd: 2.0 * 0.085 * 730.0,
                serverless: 131.4 * 0.2 + 131_400_000.0 * 0.02 * 2.0 * 0.000_016_666_7,
                cheapest: Venue::Edge,
            },
            // A saturated device draws its busy watts, never more.
            Case {
                name: "saturated device",
                traffic: measured(1, 100.0, 100.0, 50.0),
                prices: d,
                busy: 1.0,
                edge: 7.0 * 730.0 / 1000.0 * 0.13 + 80.0 / 36.0,
                // ceil(100 rps × 0.05 s / (2 × 0.6)) = ceil(4.17).
                instances: 5,
                instances_usd: 5.0 * 0.085 * 730.0,
                serverless: 262.8 * 0.2 + 262_800_000.0 * 0.05 * 2.0 * 0.000_016_666_7,
                cheapest: Venue::Edge,
            },
            // Sub-millisecond requests are billed a whole millisecond; a
            // faster cloud halves the instance count.
            Case {
                name: "sub-millisecond, faster cloud",
                traffic: measured(1, 10.0, 10.0, 0.3),
                prices: Prices {
                    cloud_speedup: 2.0,
                    ..d
                },
                busy: 0.003,
                edge: (3.0 + 4.0 * 0.003) * 730.0 / 1000.0 * 0.13 + 80.0 / 36.0,
                instances: 1,
                instances_usd: 0.085 * 730.0,
                serverless: 26.28 * 0.2 + 26_280_000.0 * 0.001 * 2.0 * 0.000_016_666_7,
                cheapest: Venue::Edge,
            },
        ];
        for c in cases {
            let e = estimate(&c.traffic, &c.prices).unwrap();
            assert!(close(e.edge.busy_share, c.busy), "{}: {e:?}", c.name);
            assert!(close(e.edge.total_usd, c.edge), "{}: {e:?}", c.name);
            assert_eq!(e.cheapest, c.cheapest, "{}: {e:?}", c.name);
            assert_eq!(
                e.cloud_instances.instances, c.instances,
                "{}: {e:?}",
                c.name
            );
            assert!(
                close(e.cloud_instances.total_usd, c.instances_usd),
                "{}: {e:?}",
                c.name
            );
            assert!(
                close(e.cloud_serverless.total_usd, c.serverless),
                "{}: {e:?}",
                c.name
            );
            let cloud = c.instances_usd.min(c.serverless);
            assert!(close(e.edge_saves_usd, cloud - c.edge), "{}: {e:?}", c.name);
            assert!(
                close(
                    e.edge.usd_per_million_requests,
                    c.edge / e.monthly_requests * 1e6
                ),
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn no_traffic_has_no_estimate() {
        let t = Traffic::default();
        assert_eq!(estimate(&t, &Prices::default()), None);
    }

    #[test]
    fn bad_prices_are_named() {
        let d = Prices::default();
        assert_eq!(d.validate(), Ok(()));
        let cases = [
            (
                Prices {
                    cloud_instance_hourly_usd: -1.0,
                    ..d
                },
                "cloud-instance-hourly-usd",
            ),
            (
                Prices {
                    electricity_usd_per_kwh: f64::NAN,
                    ..d
                },
                "electricity-usd-per-kwh",
            ),
            (
                Prices {
                    cloud_speedup: 0.0,
                    ..d
                },
                "cloud-speedup",
            ),
            (
                Prices {
                    serverless_memory_gb: f64::INFINITY,
                    ..d
                },
                "serverless-memory-gb",
            ),
            (
                Prices {
                    cloud_target_utilization: 1.5,
                    ..d
                },
                "cloud-target-utilization",
            ),
            (
                Prices {
                    edge_busy_watts: 2.0,
                    ..d
                },
                "edge-busy-watts",
            ),
            (
                Prices {
                    cloud_instance_concurrency: 0,
                    ..d
                },
                "cloud-instance-concurrency",
            ),
            (
                Prices {
                    edge_amortization_months: 0,
                    ..d
                },
                "edge-amortization-months",
            ),
        ];
        for (p, field) in cases {
            assert_eq!(p.validate().map_err(|e| e.field), Err(field));
        }
    }

    #[test]
    fn validated_prices_never_give_nan() {
        // Free everything, zero latency: still numbers.
        let p = Prices {
            cloud_instance_hourly_usd: 0.0,
            serverless_per_million_requests_usd: 0.0,
            serverless_gb_second_usd: 0.0,
            edge_idle_watts: 0.0,
            edge_busy_watts: 0.0,
            electricity_usd_per_kwh: 0.0,
            edge_hardware_usd: 0.0,
            ..Prices::default()
        };
        p.validate().unwrap();
        let e = estimate(&measured(1, 1.0, 1.0, 0.0), &p).unwrap();
        let json = serde_json::to_value(&e).unwrap();
        assert!(!json.to_string().contains("null"), "{json}");
        assert_eq!(e.cloud_instances.instances, 1);
    }

    #[test]
    fn huge_counts_hold_at_the_maximum_instead_of_wrapping() {
        let before = edgeloop_errors::device_counts::saturated_total();
        let mut a = obs("a", T0, 60, u64::MAX, 10.0);
        a.errors = u64::MAX;
        let b = obs("b", T0, 60, 5, 10.0);
        let t = traffic(&[a, b]);
        assert_eq!(t.requests, u64::MAX, "not wrapped to 4");
        assert_eq!(t.errors, u64::MAX);
        assert!(t.mean_rps.is_finite() && t.peak_rps >= t.mean_rps);
        assert!(edgeloop_errors::device_counts::saturated_total() > before);
    }

    proptest::proptest! {
        /// Whatever the devices reported: no panic, and adding an
        /// observation never makes the totals go down.
        #[test]
        fn arbitrary_counts_never_panic_and_totals_never_go_down(
            counts in proptest::collection::vec(
                (proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()),
                1..16,
            ),
        ) {
            let mut seen = vec![];
            let mut last = Traffic::default();
            for (i, (requests, errors)) in counts.into_iter().enumerate() {
                let mut o = obs(if i % 2 == 0 { "a" } else { "b" }, T0 + Duration::minutes(i as i64), 60, requests, 5.0);
                o.errors = errors;
                seen.push(o);
                let t = traffic(&seen);
                proptest::prop_assert!(t.requests >= last.requests);
                proptest::prop_assert!(t.errors >= last.errors);
                last = t;
            }
        }
    }
}
