//! `edgeloop cost <model>`: the monthly cost of the model's measured
//! traffic at the edge versus in the cloud
//! (`GET /api/v1/models/{name}/cost`, `docs/cost.md`).

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::api::{block_on, segment, Client, Reply, ServerArgs};
use super::drift::opt;
use super::table::{fields, num, text, when, Table};

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
        let view = Client::new(&args.server)?
            .get_query(
                &format!("/api/v1/models/{model}/cost"),
                &[("version", opt(&args.version)), ("days", opt(&args.days))],
            )
            .await?;
        Ok(Reply::show(&view, args.server.json, render))
    })
}

fn usd(v: &Value) -> String {
    num(v, 2)
}

/// Seconds in the unit a person would say.
fn duration(v: &Value) -> String {
    let s = v.as_f64().unwrap_or(0.0);
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.1} min", s / 60.0),
        s if s < 2.0 * 86_400.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
}

pub fn render(view: &Value) -> String {
    let t = &view["traffic"];
    let version = match view["version"].as_str() {
        Some(v) => v.to_string(),
        None => "all versions".into(),
    };
    let e = &view["estimate"];
    let mut pairs = vec![
        ("model", format!("{} ({version})", text(&view["model"]))),
        (
            "measured",
            format!(
                "{} requests ({} errors) from {} devices over {}, since {}",
                text(&t["requests"]),
                text(&t["errors"]),
                text(&t["devices"]),
                duration(&t["observed_seconds"]),
                when(&view["since"])
            ),
        ),
        (
            "rate",
            format!(
                "{} req/s mean, {} req/s in the busiest hour",
                num(&t["mean_rps"], 3),
                num(&t["peak_rps"], 3)
            ),
        ),
        (
            "latency",
            format!(
                "p50 {} ms, p99 {} ms (on the devices)",
                num(&t["latency_p50_ms"], 2),
                num(&t["latency_p99_ms"], 2)
            ),
        ),
    ];
    if !e.is_null() {
        pairs.push((
            "month",
            format!(
                "{} requests at the mean rate",
                num(&e["monthly_requests"], 0)
            ),
        ));
    }
    let mut out = fields(&pairs);
    if e.is_null() {
        out.push_str(&format!(
            "\nno requests reported in the last {} days: nothing to estimate\n",
            text(&view["days"])
        ));
        return out;
    }
    let p = &view["prices"];
    let (edge, inst, sls) = (&e["edge"], &e["cloud_instances"], &e["cloud_serverless"]);
    let busy = edge["busy_share"]
        .as_f64()
        .map_or("-".into(), |b| format!("{:.1}", b * 100.0));
    let mut table = Table::new(&["OPTION", "USD/MONTH", "USD/1M REQUESTS", "BASIS"]);
    table.row(vec![
        "edge".into(),
        usd(&edge["total_usd"]),
        usd(&edge["usd_per_million_requests"]),
        format!(
            "{} devices at {} W ({}% busy): {} kWh = {}; hardware {}",
            text(&edge["devices"]),
            num(&edge["watts_per_device"], 2),
            busy,
            num(&edge["energy_kwh"], 1),
            usd(&edge["energy_usd"]),
            usd(&edge["hardware_usd"])
        ),
    ]);
    table.row(vec![
        "cloud instances".into(),
        usd(&inst["total_usd"]),
        usd(&inst["usd_per_million_requests"]),
        format!(
            "{} × {}/h, sized for the busiest hour",
            text(&inst["instances"]),
            text(&p["cloud_instance_hourly_usd"])
        ),
    ]);
    table.row(vec![
        "cloud serverless".into(),
        usd(&sls["total_usd"]),
        usd(&sls["usd_per_million_requests"]),
        format!(
            "requests {} + {} GB-s = {}",
            usd(&sls["requests_usd"]),
            num(&sls["gb_seconds"], 0),
            usd(&sls["compute_usd"])
        ),
    ]);
    out.push('\n');
    out.push_str(&table.render());
    let saves = e["edge_saves_usd"].as_f64().unwrap_or(0.0);
    let verdict = if saves >= 0.0 {
        format!("the edge saves {saves:.2} USD a month")
    } else {
        format!("the edge costs {:.2} USD a month more", -saves)
    };
    out.push('\n');
    out.push_str(&fields(&[(
        "cheapest",
        format!("{} ({verdict})", text(&e["cheapest"]).replace('_', " ")),
    )]));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry::cost::{estimate, Prices, Traffic};

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
        let e = estimate(&traffic, &Prices::default()).unwrap();
        let view = json!({"model": "rain", "version": null, "days": 30, "since": "t",
            "prices": Prices::default(), "traffic": traffic, "estimate": e});
        let out = render(&view);
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
        assert!(out.contains("cheapest:"), "{out}");

        let none = json!({"model": "rain", "version": "1.0.0", "days": 7, "since": "t",
            "prices": Prices::default(), "traffic": Traffic::default(), "estimate": null});
        let out = render(&none);
        assert!(out.contains("rain (1.0.0)"), "{out}");
        assert!(
            out.contains("no requests reported in the last 7 days"),
            "{out}"
        );
    }
}
