//! `edgeloop cost <model>`: the monthly cost of the model's measured
//! traffic at the edge versus in the cloud
//! (`GET /api/v1/models/{name}/cost`, `docs/cost.md`).

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use edgeloop_api::cost::{CostView, Venue};

use super::api::{block_on, client, segment, Reply, ServerArgs};
use super::drift::opt;
use super::table::{fields, fixed, text, when, Table};

#[derive(Debug, Args)]
pub struct CostArgs {
    pub model: String,
    /// Only this version's traffic (default: every version's).
    #[arg(long)]
    pub version: Option<String>,
    /// Days of telemetry to measure, back from now (default 30).
    #[arg(long)]
    pub days: Option<i64>,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub fn run(args: &CostArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let model = segment("model name", &args.model)?;
        let view: CostView = client(&args.server)?
            .get_query(
                &format!("/api/v1/models/{model}/cost"),
                &[("version", opt(&args.version)), ("days", opt(&args.days))],
            )
            .await?;
        Reply::typed(&view, args.server.json, render)
    })
}

fn usd(v: f64) -> String {
    fixed(v, 2)
}

/// Seconds in the unit a person would say.
fn duration(s: f64) -> String {
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.1} min", s / 60.0),
        s if s < 2.0 * 86_400.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
}

pub fn render(view: &CostView) -> String {
    let t = &view.traffic;
    let version = match &view.version {
        Some(v) => v.clone(),
        None => "all versions".into(),
    };
    let mut pairs = vec![
        ("model", format!("{} ({version})", text(&view.model))),
        (
            "measured",
            format!(
                "{} requests ({} errors) from {} devices over {}, since {}",
                text(&t.requests),
                text(&t.errors),
                text(&t.devices),
                duration(t.observed_seconds),
                when(&view.since)
            ),
        ),
        (
            "rate",
            format!(
                "{} req/s mean, {} req/s in the busiest hour",
                fixed(t.mean_rps, 3),
                fixed(t.peak_rps, 3)
            ),
        ),
        (
            "latency",
            format!(
                "p50 {} ms, p99 {} ms (on the devices)",
                fixed(t.latency_p50_ms, 2),
                fixed(t.latency_p99_ms, 2)
            ),
        ),
    ];
    let Some(e) = &view.estimate else {
        let mut out = fields(&pairs);
        out.push_str(&format!(
            "\nno requests reported in the last {} days: nothing to estimate\n",
            text(&view.days)
        ));
        return out;
    };
    pairs.push((
        "month",
        format!("{} requests at the mean rate", fixed(e.monthly_requests, 0)),
    ));
    let mut out = fields(&pairs);
    let p = &view.prices;
    let (edge, inst, sls) = (&e.edge, &e.cloud_instances, &e.cloud_serverless);
    let busy = format!("{:.1}", edge.busy_share * 100.0);
    let mut table = Table::new(&["OPTION", "USD/MONTH", "USD/1M REQUESTS", "BASIS"]);
    table.row(vec![
        "edge".into(),
        usd(edge.total_usd),
        usd(edge.usd_per_million_requests),
        format!(
            "{} devices at {} W ({}% busy): {} kWh = {}; hardware {}",
            text(&edge.devices),
            fixed(edge.watts_per_device, 2),
            busy,
            fixed(edge.energy_kwh, 1),
            usd(edge.energy_usd),
            usd(edge.hardware_usd)
        ),
    ]);
    table.row(vec![
        "cloud instances".into(),
        usd(inst.total_usd),
        usd(inst.usd_per_million_requests),
        format!(
            "{} × {}/h, sized for the busiest hour",
            text(&inst.instances),
            text(&p.cloud_instance_hourly_usd)
        ),
    ]);
    table.row(vec![
        "cloud serverless".into(),
        usd(sls.total_usd),
        usd(sls.usd_per_million_requests),
        format!(
            "requests {} + {} GB-s = {}",
            usd(sls.requests_usd),
            fixed(sls.gb_seconds, 0),
            usd(sls.compute_usd)
        ),
    ]);
    out.push('\n');
    out.push_str(&table.render());
    let saves = e.edge_saves_usd;
    let verdict = if saves >= 0.0 {
        format!("the edge saves {saves:.2} USD a month")
    } else {
        format!("the edge costs {:.2} USD a month more", -saves)
    };
    out.push('\n');
    out.push_str(&fields(&[(
        "cheapest",
        format!("{} ({verdict})", venue(e.cheapest)),
    )]));
    out
}

fn venue(v: Venue) -> &'static str {
    match v {
        Venue::Edge => "edge",
        Venue::CloudInstances => "cloud instances",
        Venue::CloudServerless => "cloud serverless",
    }
}

#[cfg(test)]
mod tests {
    use edgeloop_api::cost::{EdgeCost, Estimate, InstanceCost, Prices, ServerlessCost, Traffic};

    use super::*;

    fn view(estimate: Option<Estimate>, traffic: Traffic, version: Option<&str>) -> CostView {
        CostView {
            model: "rain".into(),
            version: version.map(str::to_string),
            days: if estimate.is_some() { 30 } else { 7 },
            since: time::OffsetDateTime::UNIX_EPOCH,
            prices: Prices::default(),
            traffic,
            estimate,
        }
    }

    #[test]
    fn the_report_shows_each_option_and_the_verdict() {
        let traffic = Traffic {
            requests: 3600,
            errors: 2,
            devices: 2,
            observed_seconds: 3600.0,
            mean_rps: 1.0,
            peak_rps: 2.0,
            latency_p50_ms: 50.0,
            latency_p99_ms: 90.0,
        };
        // What the server's estimate gives for this traffic at the default
        // prices (control-plane/src/fleet/cost.rs has the arithmetic's tests).
        let e = Estimate {
            monthly_requests: 2_628_000.0,
            edge: EdgeCost {
                devices: 2,
                busy_share: 0.025,
                watts_per_device: 3.1,
                energy_kwh: 4.526,
                energy_usd: 0.59,
                hardware_usd: 4.44,
                total_usd: 5.03,
                usd_per_million_requests: 1.91,
            },
            cloud_instances: InstanceCost {
                instances: 1,
                total_usd: 62.05,
                usd_per_million_requests: 23.61,
            },
            cloud_serverless: ServerlessCost {
                gb_seconds: 262_800.0,
                requests_usd: 0.53,
                compute_usd: 4.38,
                total_usd: 4.91,
                usd_per_million_requests: 1.87,
            },
            cheapest: Venue::CloudServerless,
            edge_saves_usd: -0.12,
        };
        let out = render(&view(Some(e.clone()), traffic, None));
        assert!(
            out.contains("3600 requests (2 errors) from 2 devices over 60.0 min"),
            "{out}"
        );
        assert!(out.contains("p50 50.00 ms"), "{out}");
        let edge = out.lines().find(|l| l.starts_with("edge ")).unwrap();
        assert!(edge.contains(&format!("{:.2}", e.edge.total_usd)), "{out}");
        assert!(edge.contains("(2.5% busy)"), "{out}");
        let inst = out
            .lines()
            .find(|l| l.starts_with("cloud instances"))
            .unwrap();
        assert!(inst.contains("62.05"), "{out}");
        assert!(
            out.contains("cheapest:  cloud serverless (the edge costs 0.12 USD a month more)"),
            "{out}"
        );

        let out = render(&view(None, Traffic::default(), Some("1.0.0")));
        assert!(out.contains("rain (1.0.0)"), "{out}");
        assert!(
            out.contains("no requests reported in the last 7 days"),
            "{out}"
        );
    }
}
