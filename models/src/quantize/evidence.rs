//! The gate's evidence: what [`run_gate`](super::gate::run_gate) measured
//! and chose, as it is signed into a manifest (`quantization.evidence`) and
//! kept in the registry's lineage. One type, written by the gate and read
//! back by whoever shows or uses the numbers (the console, the retraining
//! pipeline, the demo's summary), so that a field renamed here is renamed
//! for all of them.
//!
//! Evidence is stored as JSON, so it is read back from JSON with
//! [`GateOutcome::from_evidence`], which also reads the layout the gate
//! wrote before it measured by task.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::gate::LatencyGate;
use super::task::{MetricKind, Task};
use super::Report;
use crate::onnx::ir;

/// One model's numbers: float's, or a candidate's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    pub name: String,
    /// The task metric's value ([`GateOutcome::metric`]).
    pub metric: f64,
    /// How much worse than float, in the metric's unit (0 for float).
    pub loss: f64,
    /// Numbers behind the metric (agreement, boxes matched, cosine...).
    pub details: BTreeMap<String, f64>,
    pub size_bytes: u64,
    /// Median single-call latency on the quantizing host.
    pub latency_ms: f64,
    pub quantize_ms: f64,
    /// Within the metric's budget (whatever its latency says). Evidence
    /// written before device benchmarks has none; it reads as `false`,
    /// which only means the candidate is not timed again.
    #[serde(default)]
    pub within_budget: bool,
    pub accepted: bool,
    pub verdict: String,
    pub report: Report,
}

/// The metric the gate decided by, recorded in the signed evidence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricRecord {
    pub name: MetricKind,
    /// [`MetricKind::unit`], written out for readers without this crate.
    pub unit: String,
    pub higher_is_better: bool,
    pub budget: f64,
    /// Float's value: the baseline every loss is taken against.
    pub float_value: f64,
}

impl MetricRecord {
    /// The record of metric `name` with `budget`, measured against `float_value`.
    pub fn new(name: MetricKind, budget: f64, float_value: f64) -> MetricRecord {
        MetricRecord {
            name,
            unit: name.unit().to_string(),
            higher_is_better: name.higher_is_better(),
            budget,
            float_value,
        }
    }
}

/// Where latency was measured and whether it gated.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyRecord {
    #[serde(flatten)]
    pub gate: LatencyGate,
    pub timed_on: String,
}

/// What the gate measured and chose, and the models it chose among.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GateOutcome {
    pub task: Task,
    pub metric: MetricRecord,
    pub latency: LatencyRecord,
    pub float: Measurement,
    pub candidates: Vec<Measurement>,
    /// Name of the shipped model ("float" when nothing qualified).
    pub chosen: String,
    pub reason: String,
    /// The model shipped. Not evidence: empty when read back.
    #[serde(skip)]
    pub chosen_model: ir::ModelProto,
    /// Each candidate's model, in `candidates`' order (`None` when it
    /// could not be made or run), so the choice can be made again with
    /// latencies measured elsewhere
    /// ([`judge_latency_on`](super::gate::judge_latency_on)). Not evidence:
    /// empty when read back.
    #[serde(skip)]
    pub candidate_models: Vec<Option<ir::ModelProto>>,
}

impl GateOutcome {
    /// The chosen candidate's (or float's) measurement.
    pub fn chosen_measurement(&self) -> &Measurement {
        self.measurement(&self.chosen).unwrap_or(&self.float)
    }

    /// Float's or a candidate's measurement, by name.
    pub fn measurement(&self, name: &str) -> Option<&Measurement> {
        std::iter::once(&self.float)
            .chain(&self.candidates)
            .find(|m| m.name == name)
    }

    /// The chosen model's top-1 accuracy against labels, in percent, when
    /// that is what the gate measured (not for agreement with float, nor
    /// for other tasks' metrics).
    pub fn chosen_top1_accuracy(&self) -> Option<f64> {
        if self.metric.name != MetricKind::Top1Accuracy {
            return None;
        }
        self.measurement(&self.chosen).map(|m| m.metric)
    }

    /// Evidence read back from its JSON: a manifest's
    /// `quantization.evidence`, or the `evidence` of a registry lineage's
    /// `quantization`.
    pub fn from_evidence(evidence: &Value) -> Result<GateOutcome, serde_json::Error> {
        match evidence {
            Value::Object(e) if !e.contains_key("metric") => {
                GateOutcome::deserialize(Value::Object(before_tasks(e.clone())))
            }
            e => GateOutcome::deserialize(e),
        }
    }

    /// The evidence of a quantization record (`{"method": .., "evidence":
    /// ..}`, as a lineage's `quantization` holds it), when there is evidence
    /// and it is the gate's.
    pub fn in_quantization(quantization: &Value) -> Option<GateOutcome> {
        GateOutcome::from_evidence(quantization.get("evidence")?).ok()
    }
}

/// Evidence the gate wrote before it measured by task, in today's layout.
/// That gate measured classifiers only: top-1 accuracy against labels
/// (`accuracy`, percent), agreement with float (`agreement`), its budget
/// in points (`budget_points`), and latency on the quantizing host.
fn before_tasks(mut e: Map<String, Value>) -> Map<String, Value> {
    let kind = MetricKind::Top1Accuracy;
    let float_value = e
        .get("float")
        .and_then(|f| f.get("accuracy"))
        .and_then(Value::as_f64);
    let budget = e.remove("budget_points");
    let measurement = |m: &mut Value| {
        let Some(m) = m.as_object_mut() else { return };
        let accuracy = m.remove("accuracy");
        let loss = match (float_value, accuracy.as_ref().and_then(Value::as_f64)) {
            (Some(float), Some(value)) => json!(kind.loss(float, value)),
            _ => Value::Null,
        };
        let details: Map<String, Value> = m
            .remove("agreement")
            .map(|a| ("agreement".into(), a))
            .into_iter()
            .collect();
        m.insert("metric".into(), accuracy.unwrap_or(Value::Null));
        m.insert("loss".into(), loss);
        m.insert("details".into(), Value::Object(details));
    };
    if let Some(f) = e.get_mut("float") {
        measurement(f);
    }
    if let Some(Value::Array(cs)) = e.get_mut("candidates") {
        cs.iter_mut().for_each(measurement);
    }
    e.insert("task".into(), json!({"kind": "classification"}));
    e.insert(
        "metric".into(),
        json!({
            "name": kind,
            "unit": kind.unit(),
            "higher_is_better": kind.higher_is_better(),
            "budget": budget,
            "float_value": float_value,
        }),
    );
    e.insert(
        "latency".into(),
        json!({"policy": "report", "timed_on": "the quantizing host"}),
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evidence as the gate writes it today (copied from a manifest).
    const TODAY: &str = r#"{
        "task": {"kind": "classification"},
        "metric": {"name": "top1_accuracy", "unit": "percentage points",
                   "higher_is_better": true, "budget": 1.0, "float_value": 97.5},
        "latency": {"policy": "not_slower_than_float", "tolerance": 0.1,
                    "timed_on": "device cam-01 (linux aarch64)"},
        "float": {"name": "float", "metric": 97.5, "loss": 0.0,
                  "details": {"agreement": 100.0}, "size_bytes": 4000,
                  "latency_ms": 1.5, "quantize_ms": 0.0, "within_budget": true,
                  "accepted": true, "verdict": "reference",
                  "report": {"quantized_nodes": [], "left_in_float": [], "notes": []}},
        "candidates": [
            {"name": "int8-dynamic", "metric": 97.25, "loss": 0.25,
             "details": {"agreement": 99.5}, "size_bytes": 1200,
             "latency_ms": 1.2, "quantize_ms": 12.5, "within_budget": true,
             "accepted": true,
             "verdict": "within budget (top1_accuracy loss 0.2500 percentage points)",
             "report": {"quantized_nodes": ["fc1"],
                        "left_in_float": [{"node": "sm", "op_type": "Softmax",
                                           "reason": "not quantizable"}],
                        "notes": []}}
        ],
        "chosen": "int8-dynamic",
        "reason": "int8-dynamic is the smallest candidate within the budget"
    }"#;

    #[test]
    fn todays_evidence_reads_back_and_writes_the_same_json() {
        let stored: Value = serde_json::from_str(TODAY).unwrap();
        let o = GateOutcome::from_evidence(&stored).unwrap();
        assert_eq!(o.metric.name, MetricKind::Top1Accuracy);
        assert_eq!(
            o.latency.gate,
            LatencyGate::NotSlowerThanFloat { tolerance: 0.1 }
        );
        assert_eq!(o.candidates[0].report.left_in_float[0].op_type, "Softmax");
        assert_eq!(o.chosen_top1_accuracy(), Some(97.25));
        assert_eq!(serde_json::to_value(&o).unwrap(), stored);
    }

    #[test]
    fn a_lineage_quantization_gives_its_evidence() {
        let q = json!({"method": "int8-dynamic", "evidence": serde_json::from_str::<Value>(TODAY).unwrap()});
        assert_eq!(
            GateOutcome::in_quantization(&q).unwrap().chosen,
            "int8-dynamic"
        );
        // Free-form quantization someone uploaded: not the gate's.
        assert!(GateOutcome::in_quantization(&json!({"chosen": "int8-static"})).is_none());
        assert!(GateOutcome::in_quantization(&json!({"evidence": {}})).is_none());
    }

    #[test]
    fn evidence_from_before_device_benchmarks_reads_without_within_budget() {
        let mut stored: Value = serde_json::from_str(TODAY).unwrap();
        stored["candidates"][0]
            .as_object_mut()
            .unwrap()
            .remove("within_budget");
        let o = GateOutcome::from_evidence(&stored).unwrap();
        assert!(!o.candidates[0].within_budget);
    }

    #[test]
    fn only_top1_against_labels_is_an_accuracy() {
        let mut stored: Value = serde_json::from_str(TODAY).unwrap();
        stored["metric"]["name"] = json!("top1_agreement");
        let o = GateOutcome::from_evidence(&stored).unwrap();
        assert_eq!(o.chosen_top1_accuracy(), None);
    }

    #[test]
    fn evidence_from_before_task_aware_gating_reads_as_top1_accuracy() {
        let report = json!({"quantized_nodes": [], "left_in_float": [], "notes": []});
        let old = json!({
            "float": {"name": "float", "accuracy": 96.0, "agreement": 100.0,
                      "size_bytes": 4000, "latency_ms": 1.5, "quantize_ms": 0.0,
                      "accepted": true, "verdict": "reference", "report": report},
            "candidates": [
                {"name": "int8-static-entropy", "accuracy": 94.5, "agreement": 97.0,
                 "size_bytes": 1200, "latency_ms": 1.1, "quantize_ms": 30.0,
                 "accepted": false,
                 "verdict": "accuracy drop 1.50 exceeds the budget of 1 points",
                 "report": report}
            ],
            "chosen": "float",
            "reason": "no candidate qualified, keeping float",
            "budget_points": 1.0
        });
        let o = GateOutcome::from_evidence(&old).unwrap();
        assert_eq!(o.task, Task::Classification);
        assert_eq!(o.metric.name, MetricKind::Top1Accuracy);
        assert_eq!(o.metric.budget, 1.0);
        assert_eq!(o.metric.float_value, 96.0);
        assert_eq!(o.candidates[0].metric, 94.5);
        assert_eq!(o.candidates[0].loss, 1.5);
        assert_eq!(o.candidates[0].details["agreement"], 97.0);
        assert_eq!(o.chosen_top1_accuracy(), Some(96.0));
    }

    #[test]
    fn evidence_that_is_not_the_gates_is_an_error_naming_the_field() {
        let mut stored: Value = serde_json::from_str(TODAY).unwrap();
        stored["float"]
            .as_object_mut()
            .unwrap()
            .remove("size_bytes");
        let e = GateOutcome::from_evidence(&stored).unwrap_err();
        assert!(e.to_string().contains("size_bytes"), "{e}");
    }
}
