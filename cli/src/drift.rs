//! `edgeloop drift <model>`: the latest drift window per device group and
//! feature (PSI, KS), and whether the model is drifting
//! (`GET /api/v1/models/{name}/drift`, `docs/drift.md`).

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use edgeloop_api::drift::DriftView;
use edgeloop_api::UnixSeconds;

use super::api::{block_on, client, segment, Reply, ServerArgs};
use super::table::{fields, fixed, text, Table};

#[derive(Debug, Args)]
pub struct DriftArgs {
    pub model: String,
    /// Default: the newest version.
    #[arg(long)]
    pub version: Option<String>,
    /// A device label to group by, e.g. `site`.
    #[arg(long)]
    pub group_by: Option<String>,
    /// Window length in seconds (default 3600).
    #[arg(long)]
    pub window_seconds: Option<i64>,
    #[arg(long)]
    pub psi_watch: Option<f64>,
    #[arg(long)]
    pub psi_act: Option<f64>,
    #[arg(long)]
    pub js_act: Option<f64>,
    #[arg(long)]
    pub ks_alpha: Option<f64>,
    #[arg(long)]
    pub min_requests: Option<u64>,
    /// Consecutive windows over a threshold that set the drift state.
    #[arg(long)]
    pub set_after: Option<u32>,
    /// Consecutive windows under every threshold that clear it.
    #[arg(long)]
    pub clear_after: Option<u32>,
    #[command(flatten)]
    pub server: ServerArgs,
}

impl DriftArgs {
    /// The query: only what was given, so the server's defaults apply (and
    /// the server alone validates, naming the field).
    pub fn params(&self) -> Vec<(&'static str, Option<String>)> {
        vec![
            ("version", opt(&self.version)),
            ("group_by", opt(&self.group_by)),
            ("window_seconds", opt(&self.window_seconds)),
            ("psi_watch", opt(&self.psi_watch)),
            ("psi_act", opt(&self.psi_act)),
            ("js_act", opt(&self.js_act)),
            ("ks_alpha", opt(&self.ks_alpha)),
            ("min_requests", opt(&self.min_requests)),
            ("set_after", opt(&self.set_after)),
            ("clear_after", opt(&self.clear_after)),
        ]
    }
}

pub fn opt<T: ToString>(v: &Option<T>) -> Option<String> {
    v.as_ref().map(T::to_string)
}

pub fn run(args: &DriftArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let model = segment("model name", &args.model)?;
        let view: DriftView = client(&args.server)?
            .get_query(&format!("/api/v1/models/{model}/drift"), &args.params())
            .await?;
        Reply::typed(&view, args.server.json, render)
    })
}

/// Unix seconds as RFC 3339 (UTC), as the rest of the API writes times.
pub fn at(s: impl Into<Option<UnixSeconds>>) -> String {
    use time::format_description::well_known::Rfc3339;
    s.into()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "-".into())
}

/// Small p-values are what matter; fixed decimals would show them all as 0.
fn p_value(v: Option<f64>) -> String {
    match v {
        Some(p) if p >= 0.001 => format!("{p:.3}"),
        Some(p) => format!("{p:.1e}"),
        None => "-".into(),
    }
}

pub fn render(view: &DriftView) -> String {
    let c = &view.config;
    let mut out = fields(&[
        (
            "model",
            format!("{} {}", text(&view.model), text(&view.version)),
        ),
        (
            "thresholds",
            format!(
                "PSI watch {} act {}, prediction JS {}, KS alpha {}, min requests {}",
                text(&c.psi_watch),
                text(&c.psi_act),
                text(&c.js_act),
                text(&c.ks_alpha),
                text(&c.min_requests)
            ),
        ),
        (
            "windows",
            format!(
                "{} s; drifting after {} over, cleared after {} under",
                text(&c.window_seconds),
                text(&c.set_after),
                text(&c.clear_after)
            ),
        ),
    ]);
    if view.series.iter().all(|s| s.windows.is_empty()) {
        out.push_str("\nno sketches reported for this version yet\n");
        return out;
    }
    let mut groups = Table::new(&[
        "GROUP",
        "LATEST WINDOW",
        "REQUESTS",
        "DEVICES",
        "SEVERITY",
        "PRED JS",
        "LOW CONF",
        "ACCURACY",
        "OVER",
        "DRIFTING WINDOWS",
        "STATE",
    ]);
    let mut features = Table::new(&["GROUP", "FEATURE", "PSI", "KS", "P-VALUE", "JS", "LEVEL"]);
    for s in &view.series {
        let windows = &s.windows;
        let Some(w) = windows.last() else { continue };
        let drifting = windows.iter().filter(|w| w.drifting).count();
        groups.row(vec![
            text(&s.group),
            at(w.start),
            text(&w.requests),
            text(&w.devices),
            fixed(w.severity, 3),
            fixed(w.prediction_js, 3),
            fixed(w.low_confidence_share, 3),
            // Share right among the window's labelled predictions.
            match w.accuracy {
                Some(a) => format!("{:.1} % of {}", a * 100.0, w.labelled),
                None => "-".into(),
            },
            match w.over {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                // Too few requests to judge.
                None => "-".into(),
            },
            format!("{drifting} of {}", windows.len()),
            if w.drifting { "DRIFTING" } else { "ok" }.into(),
        ]);
        for f in &w.features {
            features.row(vec![
                text(&s.group),
                text(&f.name),
                fixed(f.psi, 3),
                fixed(f.ks_statistic, 3),
                p_value(f.ks_p_value),
                fixed(f.js_distance, 3),
                f.level.as_str().into(),
            ]);
        }
    }
    out.push('\n');
    out.push_str(&groups.render());
    if !features.is_empty() {
        out.push('\n');
        out.push_str(&features.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use edgeloop_api::drift::DriftConfig;
    use serde_json::json;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn only_given_parameters_are_sent() {
        let Command::Drift(a) = Cli::parse_from([
            "edgeloop",
            "drift",
            "rain",
            "--group-by",
            "site",
            "--set-after",
            "2",
        ])
        .command
        else {
            panic!("not drift")
        };
        let given: Vec<(&str, String)> = a
            .params()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        assert_eq!(
            given,
            [("group_by", "site".to_string()), ("set_after", "2".into())]
        );
    }

    #[test]
    fn the_latest_window_per_group_and_feature() {
        let view = json!({"model": "rain", "version": "1.0.0",
            "config": {"window_seconds": 3600, "psi_watch": 0.1, "psi_act": 0.2, "js_act": 0.1,
                       "ks_alpha": 0.01, "min_requests": 100, "set_after": 2, "clear_after": 2},
            "series": [{"group": "berlin", "windows": [
                {"start": 0, "requests": 500, "devices": 1, "features": [], "severity": 0.0,
                 "prediction_js": null, "low_confidence_share": null, "over": false, "drifting": false},
                {"start": 1796094000i64, "requests": 500, "devices": 1,
                 "features": [{"name": "temp", "psi": 1.23456, "ks_statistic": 0.5,
                               "ks_p_value": 1.0e-30, "level": "act"}],
                 "severity": 1.23456, "prediction_js": 0.4, "low_confidence_share": null,
                 "over": true, "drifting": true}]}]});
        let out = render(&serde_json::from_value(view).unwrap());
        let row = out.lines().find(|l| l.starts_with("berlin  2026")).unwrap();
        for want in [
            "2026-12-01T03:00:00Z",
            "500",
            "1.235",
            "0.400",
            "yes",
            "1 of 2",
            "DRIFTING",
        ] {
            assert!(row.contains(want), "{want}: {out}");
        }
        let feature = out.lines().find(|l| l.contains("temp")).unwrap();
        assert!(
            feature.contains("1.235") && feature.contains("1.0e-30") && feature.ends_with("act"),
            "{out}"
        );
        let empty = render(&DriftView {
            model: "rain".into(),
            version: "1".into(),
            config: DriftConfig::default(),
            series: vec![],
        });
        assert!(empty.contains("no sketches"), "{empty}");
    }
}
