//! What the demo found: one typed summary, printed as a table or (with
//! `--json`) as one JSON object.

use std::collections::BTreeMap;

use edgeloop_api::pipelines::{PipelineStatus, Step};
use edgeloop_api::registry::{Lineage, ModelVersionView};
use edgeloop_api::triggers::FeatureMove;
use edgeloop_models::quantize::evidence::GateOutcome;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub baseline_accuracy: Option<f64>,
    pub drift_v1_accuracy: Option<f64>,
    pub recovered_accuracy: Option<f64>,
    /// v1 run on the very days v2 served: the counterfactual.
    pub v1_accuracy_on_v2_days: Option<f64>,
    pub shift_row: usize,
    pub drift_flagged_row: Option<usize>,
    pub feature_drift_row: Option<usize>,
    /// The features that moved most when drift was first seen, and when
    /// the retrain started (the drift that hurt), PSI largest first.
    pub features_moved_first: Vec<FeatureMove>,
    pub features_moved_at_retrain: Vec<FeatureMove>,
    pub v2_serving_row: Option<usize>,
    pub retrains: usize,
    pub pipelines: Vec<PipelineSummary>,
    pub model_bytes: ModelBytes,
    pub edge_latency_ms: Latency,
    pub rows_replayed: usize,
    pub from_row: usize,
    pub to_row: usize,
    pub control: bool,
    pub versions: Vec<VersionSummary>,
    pub failures: Vec<String>,
    pub workdir: String,
    /// The trainer of v1 and the retrains: `reference` or `pytorch`.
    pub trainer: &'static str,
    /// The run against issue #14's goals (docs/demo.md).
    pub goals: Goals,
}

/// The figures the rainfall goals are stated in, each with its target;
/// `None` where the run has no such figure (the control, or no v2).
#[derive(Debug, Serialize, PartialEq)]
pub struct Goals {
    /// Days from the documented shift to the retrain's trigger (goal: at
    /// most 300).
    pub retrain_days_after_shift: Option<i64>,
    /// v2's accuracy once serving over v1's before the shift (goal: at
    /// least 0.95).
    pub v2_over_v1_before_shift: Option<f64>,
    /// v2's accuracy minus v1's on the very days v2 served, in points
    /// (goal: at least 10).
    pub v2_gain_over_counterfactual_points: Option<f64>,
    /// Which of the three goals this run met, in that order.
    pub met: [Option<bool>; 3],
}

pub const GOAL_RETRAIN_DAYS: i64 = 300;
pub const GOAL_V2_OVER_V1: f64 = 0.95;
pub const GOAL_GAIN_POINTS: f64 = 10.0;

impl Goals {
    pub fn of(
        shift_row: usize,
        retrain_row: Option<usize>,
        baseline: Option<f64>,
        recovered: Option<f64>,
        counterfactual: Option<f64>,
    ) -> Goals {
        let days = retrain_row.map(|r| r as i64 - shift_row as i64);
        let ratio = recovered
            .zip(baseline)
            .filter(|(_, b)| *b > 0.0)
            .map(|(r, b)| r / b);
        let gain = recovered.zip(counterfactual).map(|(r, c)| (r - c) * 100.0);
        Goals {
            retrain_days_after_shift: days,
            v2_over_v1_before_shift: ratio,
            v2_gain_over_counterfactual_points: gain,
            met: [
                days.map(|d| (0..=GOAL_RETRAIN_DAYS).contains(&d)),
                ratio.map(|r| r >= GOAL_V2_OVER_V1),
                gain.map(|g| g >= GOAL_GAIN_POINTS),
            ],
        }
    }
}

/// A pipeline as the summary keeps it: its outcome and why.
#[derive(Debug, Serialize)]
pub struct PipelineSummary {
    pub id: String,
    pub status: PipelineStatus,
    pub step: Option<Step>,
    pub reason: Option<String>,
    pub trigger: String,
}

#[derive(Debug, Serialize)]
pub struct ModelBytes {
    pub fp32: usize,
    /// The smallest int8 candidate the gate built, shipped or not.
    pub int8: Option<u64>,
    pub shipped: usize,
    pub shipped_method: String,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// A registered version: its size, metrics and lineage (the gate's
/// evidence cut to its verdict).
#[derive(Debug, Serialize)]
pub struct VersionSummary {
    pub version: String,
    pub artifact_size: u64,
    pub metrics: BTreeMap<String, f64>,
    pub lineage: Lineage,
    /// The version's variants by name, with the method each one's gate
    /// chose.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, String>,
}

impl VersionSummary {
    pub fn new(v: ModelVersionView) -> VersionSummary {
        let mut lineage = v.lineage;
        // The evidence is long; the summary keeps its verdict: what was
        // chosen, and where its latency was judged (on a device, for a
        // version the retraining policy benchmarked).
        if let Some(q) = &mut lineage.quantization {
            let (chosen, timed_on) = match GateOutcome::in_quantization(q) {
                Some(o) => (Value::from(o.chosen), Value::from(o.latency.timed_on)),
                None => (Value::Null, Value::Null),
            };
            *q = serde_json::json!({ "chosen": chosen, "latency_timed_on": timed_on });
        }
        let variants = v
            .variants
            .iter()
            .map(|variant| {
                let method = variant.quantization_method().unwrap_or("-");
                (variant.name.clone(), method.to_string())
            })
            .collect();
        VersionSummary {
            version: v.version,
            artifact_size: v.artifact_size,
            metrics: v.metrics,
            lineage,
            variants,
        }
    }
}

impl Summary {
    /// `--json`: one object, keys sorted as the demo always wrote them.
    pub fn json(&self) -> String {
        serde_json::to_value(self)
            .map_or_else(|e| format!("{{\"error\": \"{e}\"}}"), |v| format!("{v:#}"))
    }

    pub fn table(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.1} %", v * 100.0));
        let row = |v: Option<usize>| v.map_or("-".into(), |v| v.to_string());
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k:<34} {v}\n"));
        line(
            "days replayed",
            format!("{}..{}", self.from_row, self.to_row),
        );
        line("trainer", self.trainer.to_string());
        line("v1 accuracy before the shift", pct(self.baseline_accuracy));
        line("v1 accuracy after the shift", pct(self.drift_v1_accuracy));
        line("v2 accuracy once serving", pct(self.recovered_accuracy));
        line(
            "v1 on those days (counterfactual)",
            pct(self.v1_accuracy_on_v2_days),
        );
        line("documented shift (day)", row(Some(self.shift_row)));
        line(
            "feature drift first seen (day)",
            row(self.feature_drift_row),
        );
        let named = |f: &[FeatureMove]| {
            if f.is_empty() {
                return "-".to_string();
            }
            f.iter()
                .map(|m| format!("{} (PSI {:.2})", m.name, m.psi))
                .collect::<Vec<_>>()
                .join(", ")
        };
        line("  moved first", named(&self.features_moved_first));
        line("retrain triggered (day)", row(self.drift_flagged_row));
        line("  moved then", named(&self.features_moved_at_retrain));
        line("v2 serving from (day)", row(self.v2_serving_row));
        line("retrains", row(Some(self.retrains)));
        let g = &self.goals;
        let met = |m: Option<bool>| match m {
            Some(true) => "met",
            Some(false) => "not met",
            None => "-",
        };
        line(
            "goal: retrain within 300 days",
            format!(
                "{} ({})",
                g.retrain_days_after_shift
                    .map_or("-".into(), |d| d.to_string()),
                met(g.met[0])
            ),
        );
        line(
            "goal: v2 at 95 % of v1 before",
            format!(
                "{} ({})",
                g.v2_over_v1_before_shift
                    .map_or("-".into(), |r| format!("{:.1} %", r * 100.0)),
                met(g.met[1])
            ),
        );
        line(
            "goal: v2 +10 points on v1",
            format!(
                "{} ({})",
                g.v2_gain_over_counterfactual_points
                    .map_or("-".into(), |p| format!("{p:+.1} points")),
                met(g.met[2])
            ),
        );
        let b = &self.model_bytes;
        line(
            "model bytes (fp32, int8, shipped)",
            format!(
                "{}, {}, {} ({})",
                b.fp32,
                // As the JSON writes it: an absent int8 candidate is `null`.
                b.int8.map_or("null".into(), |n| n.to_string()),
                b.shipped,
                b.shipped_method
            ),
        );
        line(
            "edge latency p50 / p99",
            format!(
                "{:.2} / {:.2} ms",
                self.edge_latency_ms.p50.unwrap_or(f64::NAN),
                self.edge_latency_ms.p99.unwrap_or(f64::NAN)
            ),
        );
        for v in &self.versions {
            // As JSON with its keys sorted, as the table always showed it.
            let lineage = serde_json::to_value(&v.lineage).unwrap_or_default();
            line(&format!("version {}", v.version), lineage.to_string());
        }
        for f in &self.failures {
            line("FAILED", f.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_are_judged_against_their_targets() {
        let g = Goals::of(12_000, Some(12_300), Some(0.8), Some(0.76), Some(0.66));
        assert_eq!(g.retrain_days_after_shift, Some(300));
        assert!((g.v2_over_v1_before_shift.unwrap() - 0.95).abs() < 1e-12);
        assert!((g.v2_gain_over_counterfactual_points.unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(g.met[0], Some(true));
        let late = Goals::of(12_000, Some(12_854), Some(0.815), Some(0.729), Some(0.631));
        assert_eq!(late.met, [Some(false), Some(false), Some(false)]);
        // The control retrains nothing: no figure, no verdict.
        let none = Goals::of(12_000, None, Some(0.8), None, None);
        assert_eq!(none.met, [None, None, None]);
        assert_eq!(none.retrain_days_after_shift, None);
    }
}
