//! Retraining: each model's retraining policy (training template, data,
//! quantization budget, rollout), and the pipelines that carry it out: one
//! at a time per model, persisted after every step, driven by
//! [`runner`] through the pure state machine in [`crate::lifecycle::pipeline`].

pub mod dataset;
pub mod runner;
pub mod signing;
pub mod steps;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use crate::db::Db;
use crate::fleet::deployments::CreateDeployment;
use crate::lifecycle::pipeline::{self, Pipeline, PipelineState};
use edgeloop_errors::validate;
use edgeloop_errors::{Error, Result};

/// How a model is retrained: the console API's request body, stored as is.
pub use edgeloop_api::pipelines::RetrainingConfig;

/// The checks and templates of a [`RetrainingConfig`] (a console API type,
/// so its server-side behaviour is a trait here).
pub trait RetrainingPolicy {
    /// Checks every field the pipeline relies on, naming the one at fault.
    fn validate(&self) -> Result<()>;
    /// The rollout template as a deployment request for `model` `version`.
    fn deployment_request(&self, model: &str, version: &str) -> Result<CreateDeployment>;
}

impl RetrainingPolicy for RetrainingConfig {
    fn validate(&self) -> Result<()> {
        if !self.job.is_object() {
            return Err(Error::bad_field("job", "must be a job spec object"));
        }
        crate::lifecycle::jobs::validate_spec(&self.job).map_err(|e| match e {
            Error::BadRequest { field, message } => Error::BadRequest {
                field: Some(match field {
                    Some(f) => f.replacen("spec", "job", 1),
                    None => "job".into(),
                }),
                message,
            },
            other => other,
        })?;
        if let Some(c) = &self.cluster {
            validate::name("cluster", c)?;
        }
        if self.base_window_rows == Some(0) {
            return Err(Error::bad_field("base_window_rows", "must be at least 1"));
        }
        if self.edge_window_rows == Some(0) {
            return Err(Error::bad_field("edge_window_rows", "must be at least 1"));
        }
        if !(self.eval_fraction > 0.0 && self.eval_fraction < 1.0) {
            return Err(Error::bad_field(
                "eval_fraction",
                "must be between 0 and 1 (exclusive)",
            ));
        }
        if self.min_eval_samples == 0 {
            return Err(Error::bad_field("min_eval_samples", "must be at least 1"));
        }
        if !(self.quantization_budget_points.is_finite()
            && (0.0..=100.0).contains(&self.quantization_budget_points))
        {
            return Err(Error::bad_field(
                "quantization_budget_points",
                "must be between 0 and 100",
            ));
        }
        if !(self.min_gain_points.is_finite() && (0.0..=100.0).contains(&self.min_gain_points)) {
            return Err(Error::bad_field(
                "min_gain_points",
                "must be between 0 and 100",
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        if self.variants.len() > 4 {
            return Err(Error::bad_field("variants", "at most 4 variants"));
        }
        for (i, v) in self.variants.iter().enumerate() {
            let at = |f: &str| format!("variants[{i}].{f}");
            validate::name(&at("name"), &v.name)?;
            if !names.insert(v.name.as_str()) {
                return Err(Error::bad_field(
                    at("name"),
                    format!("{:?} is named twice", v.name),
                ));
            }
            if v.candidates.is_empty() {
                return Err(Error::bad_field(
                    at("candidates"),
                    "name at least one quantization",
                ));
            }
            for (j, c) in v.candidates.iter().enumerate() {
                if edgeloop_models::quantize::gate::Candidate::from_label(c).is_none() {
                    return Err(Error::bad_field(
                        format!("variants[{i}].candidates[{j}]"),
                        format!(
                            "unknown quantization {c:?}; expected fp16, int8-dynamic, \
                             int8-static-entropy, int8-static-percentile or int8-static-minmax"
                        ),
                    ));
                }
            }
            validate::execution_providers(&at("providers"), &v.providers)?;
        }
        if let Some(l) = &self.latency {
            crate::fleet::deployments::parse_selector(
                "latency.benchmark_selector",
                &l.benchmark_selector,
            )?;
            if let Some(ms) = l.max_latency_ms {
                if !(ms.is_finite() && ms > 0.0 && ms <= 3_600_000.0) {
                    return Err(Error::bad_field(
                        "latency.max_latency_ms",
                        "must be above 0 and at most 3600000 ms",
                    ));
                }
            }
            // The same bounds as a benchmark request's.
            crate::fleet::benchmarks::check_runs("latency.runs", l.runs)?;
            crate::fleet::benchmarks::check_timeout("latency.timeout_seconds", l.timeout_seconds)?;
        }
        signing::validate_policy(&self.signing, self.latency.is_some())?;
        if let Some(n) = self.min_fresh_edge_rows {
            if !(1..=1_000_000).contains(&n) {
                return Err(Error::bad_field(
                    "min_fresh_edge_rows",
                    "must be 1 to 1000000",
                ));
            }
            if self.edge_window_rows.is_some_and(|w| n > w) {
                return Err(Error::bad_field(
                    "min_fresh_edge_rows",
                    "must be at most edge_window_rows: the window would leave the fresh rows out",
                ));
            }
        }
        if !(1..=10).contains(&self.hard_example_weight) {
            return Err(Error::bad_field("hard_example_weight", "must be 1 to 10"));
        }
        if !(1..=20).contains(&self.max_attempts) {
            return Err(Error::bad_field("max_attempts", "must be 1 to 20"));
        }
        if !(60..=7 * 86_400).contains(&self.step_timeout_seconds) {
            return Err(Error::bad_field(
                "step_timeout_seconds",
                "must be 60 s to 7 days",
            ));
        }
        // The template is held to every check that needs no fleet now, so
        // that a bad one is refused here rather than hours later, when the
        // Deploy step runs it.
        let template = self.deployment_request("m", "1")?;
        crate::fleet::deployments::check_request(&template).map_err(|e| match e {
            Error::BadRequest { field, message } => Error::BadRequest {
                field: Some(match field {
                    Some(f) => format!("rollout.{f}"),
                    None => "rollout".into(),
                }),
                message,
            },
            other => other,
        })?;
        Ok(())
    }

    fn deployment_request(&self, model: &str, version: &str) -> Result<CreateDeployment> {
        let serde_json::Value::Object(mut fields) = self.rollout.clone() else {
            return Err(Error::bad_field("rollout", "must be an object"));
        };
        for k in ["model", "version", "alias"] {
            if fields.contains_key(k) {
                return Err(Error::bad_field(
                    format!("rollout.{k}"),
                    "is set by the pipeline, not the template",
                ));
            }
        }
        fields.insert("model".into(), model.into());
        fields.insert("version".into(), version.into());
        let template = serde_json::Value::Object(fields);
        let req: CreateDeployment = crate::strict_json::from_value(&template)
            .map_err(|e| Error::bad_field("rollout", e.to_string()))?;
        crate::fleet::deployments::parse_selector("rollout.selector", &req.selector)?;
        Ok(req)
    }
}

/// Sets `model`'s retraining policy.
pub async fn put_config(store: &Db, model: &str, config: RetrainingConfig) -> Result<()> {
    edgeloop_registry::models::get_model(&store.registry, model)?;
    config.validate()?;
    store.lifecycle.retraining.insert(model, &config)?;
    store.flush().await?;
    Ok(())
}

pub fn get_config(store: &Db, model: &str) -> Result<RetrainingConfig> {
    store
        .lifecycle
        .retraining
        .get(model)?
        .ok_or_else(|| Error::not_found("retraining policy of model", model))
}

/// What starting a retrain did.
#[derive(Debug)]
pub enum Started {
    Started(Pipeline),
    /// One is already running for the model: the trigger was recorded on
    /// it (coalesced) instead.
    Coalesced(Pipeline),
}

/// Starts a retrain of `model` because of `trigger`, unless one is already
/// running: never two at once (the per-model `pipeline_active` key is taken
/// atomically).
pub async fn start(store: &Db, model: &str, trigger: &str, now: OffsetDateTime) -> Result<Started> {
    let config = get_config(store, model).map_err(|_| {
        Error::Conflict(format!(
            "model {model:?} has no retraining policy; PUT /api/v1/models/{model}/retraining first"
        ))
    })?;
    validate::text("trigger", trigger, 512)?;
    let id = format!("p-{:08}", store.next_id()?);
    loop {
        if store.lifecycle.pipeline_active.insert_new(model, &id)? {
            break;
        }
        let Some(running) = store.lifecycle.pipeline_active.get(model)? else {
            continue;
        };
        match store.lifecycle.pipelines.get(&running)? {
            Some(p) if !p.state.is_terminal() => {
                let p = coalesce(store, &running, trigger, now)?;
                store.flush().await?;
                return Ok(Started::Coalesced(p));
            }
            // The runner ended it but had not released the key yet (or
            // crashed in between): take it over.
            _ => {
                let _ = store
                    .lifecycle
                    .pipeline_active
                    .update(model, |cur| match cur {
                        Some(c) if c == running => Ok(id.clone()),
                        _ => Err(()),
                    })?;
                if store.lifecycle.pipeline_active.get(model)?.as_deref() == Some(id.as_str()) {
                    break;
                }
            }
        }
    }
    let (mut p, _) = Pipeline::new(
        id.clone(),
        model.to_string(),
        trigger.to_string(),
        now.unix_timestamp(),
    );
    p.max_attempts = config.max_attempts;
    p.step_timeout_seconds = config.step_timeout_seconds;
    p.min_gain_points = config.min_gain_points;
    p.signing = config.signing.clone();
    store.lifecycle.pipelines.insert(&id, &p)?;
    store.flush().await?;
    Ok(Started::Started(p))
}

fn coalesce(store: &Db, id: &str, trigger: &str, now: OffsetDateTime) -> Result<Pipeline> {
    store.lifecycle.pipelines.update(id, |cur| {
        let mut p = cur.ok_or_else(|| Error::not_found("pipeline", id))?;
        p.coalesced.push(pipeline::Coalesced {
            trigger: trigger.to_string(),
            at: now.unix_timestamp(),
        });
        // Bounded: a trigger that keeps firing must not grow the record.
        if p.coalesced.len() > 100 {
            p.coalesced.remove(0);
        }
        Ok(p)
    })?
}

pub fn get(store: &Db, id: &str) -> Result<Pipeline> {
    store
        .lifecycle
        .pipelines
        .get(id)?
        .ok_or_else(|| Error::not_found("pipeline", id))
}

/// Newest first; only `model`'s when given.
pub fn list(store: &Db, model: Option<&str>) -> Result<Vec<Pipeline>> {
    let mut all: Vec<Pipeline> = store
        .lifecycle
        .pipelines
        .values()?
        .into_iter()
        .filter(|p| model.is_none_or(|m| p.model == m))
        .collect();
    all.sort_by(|a, b| b.id.cmp(&a.id));
    Ok(all)
}

/// Cancels a running pipeline; the runner aborts what its step started.
pub async fn cancel(store: &Db, id: &str, now: OffsetDateTime) -> Result<Pipeline> {
    let p = store.lifecycle.pipelines.update(id, |cur| {
        let p = cur.ok_or_else(|| Error::not_found("pipeline", id))?;
        if p.state.is_terminal() {
            return Err(Error::Conflict(format!(
                "pipeline {id:?} has already ended ({})",
                state_name(&p.state)
            )));
        }
        Ok(pipeline::advance(&p, pipeline::Event::Cancel, now.unix_timestamp()).0)
    })??;
    store.flush().await?;
    Ok(p)
}

/// What the drift analysis and the triggers compare a model against: the
/// version a pipeline last shipped and its accuracy on recent data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReferenceRecord {
    pub version: String,
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    /// 0..1, on the eval set of the pipeline that shipped it.
    pub evaluated_accuracy: Option<f64>,
    pub pipeline: Option<String>,
}

pub async fn set_reference(store: &Db, model: &str, r: ReferenceRecord) -> Result<()> {
    store.lifecycle.drift_reference.insert(model, &r)?;
    store.flush().await?;
    Ok(())
}

pub fn reference(store: &Db, model: &str) -> Result<Option<ReferenceRecord>> {
    Ok(store.lifecycle.drift_reference.get(model)?)
}

pub fn state_name(s: &PipelineState) -> &'static str {
    match s {
        PipelineState::Running { .. } => "running",
        PipelineState::Succeeded => "succeeded",
        PipelineState::Stopped { .. } => "stopped",
        PipelineState::Failed { .. } => "failed",
        PipelineState::Cancelled { .. } => "cancelled",
        PipelineState::AwaitingSignature { .. } => "awaiting_signature",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(patch: serde_json::Value) -> serde_json::Value {
        let mut p = serde_json::json!({
            "job": {"name": "retrain", "command": ["train"]},
            "rollout": {"selector": "site=lab"}
        });
        for (k, v) in patch.as_object().into_iter().flatten() {
            p[k] = v.clone();
        }
        p
    }

    #[test]
    fn defaults_and_field_named_refusals() {
        let c: RetrainingConfig = serde_json::from_value(policy(serde_json::json!({}))).unwrap();
        c.validate().unwrap();
        assert_eq!(c.signing, edgeloop_api::pipelines::Signing::ControlPlane);
        let key = edgeloop_models::manifest::ManifestKey::from_bytes(&[7; 32])
            .public()
            .to_hex();
        let offline: RetrainingConfig = serde_json::from_value(policy(serde_json::json!(
            {"signing": {"mode": "offline", "public_keys": [key]}}
        )))
        .unwrap();
        offline.validate().unwrap();
        assert_eq!((c.eval_fraction, c.max_attempts), (0.3, 3));
        let cases = [
            (serde_json::json!({"eval_fraction": 0.0}), "eval_fraction"),
            (
                serde_json::json!({"min_eval_samples": 0}),
                "min_eval_samples",
            ),
            (
                serde_json::json!({"edge_window_rows": 0}),
                "edge_window_rows",
            ),
            (
                serde_json::json!({"quantization_budget_points": -1}),
                "quantization_budget_points",
            ),
            (
                serde_json::json!({"min_gain_points": 101}),
                "min_gain_points",
            ),
            (
                serde_json::json!({"step_timeout_seconds": 5}),
                "step_timeout_seconds",
            ),
            (serde_json::json!({"job": {"name": "x"}}), "job.command"),
            (
                serde_json::json!({"rollout": {"selector": "a=b", "model": "m"}}),
                "rollout.model",
            ),
            (
                serde_json::json!({"rollout": {"selector": "a=b", "waves": 1}}),
                "rollout",
            ),
            (serde_json::json!({"cluster": "Not A Name"}), "cluster"),
            (
                serde_json::json!({"signing": {"mode": "offline", "public_keys": []}}),
                "signing.public_keys",
            ),
            (
                serde_json::json!({"signing": {"mode": "offline", "public_keys": ["abc"]}}),
                "signing.public_keys[0]",
            ),
            (
                serde_json::json!({"signing": {"mode": "offline", "public_keys": [key, key]}}),
                "signing.public_keys[1]",
            ),
            (
                serde_json::json!({"signing": {"mode": "offline", "public_keys": [key]},
                                   "latency": {"benchmark_selector": "site=lab"}}),
                "signing",
            ),
            (
                serde_json::json!({"rollout": {"selector": "a=b", "alias": "production"}}),
                "rollout.alias",
            ),
            // The template's own rules hold when the policy is set.
            (
                serde_json::json!({"rollout": {"selector": "a=b", "offline_tolerance": 2}}),
                "rollout.offline_tolerance",
            ),
            (
                serde_json::json!({"rollout": {"selector": "a=b", "strategy":
                    {"waves": {"percent": [50, 100]}, "min_soak_seconds": 60, "wave_timeout_seconds": 60}}}),
                "rollout.strategy.wave_timeout_seconds",
            ),
        ];
        // The default deadline (waves × wave timeout) saturates; no overflow.
        let huge: RetrainingConfig = serde_json::from_value(policy(serde_json::json!({
            "rollout": {"selector": "a=b", "strategy":
                {"waves": {"count": [1, 2]}, "wave_timeout_seconds": i64::MAX}}
        })))
        .unwrap();
        huge.validate().unwrap();
        let named: RetrainingConfig =
            serde_json::from_value(policy(serde_json::json!({"compare_with": "production"})))
                .unwrap();
        named.validate().unwrap();
        assert_eq!(
            named.compare_with.as_ref().map(|a| a.as_str()),
            Some("production")
        );
        let e = serde_json::from_value::<RetrainingConfig>(policy(
            serde_json::json!({"compare_with": "v2"}),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("looks like a version"), "{e}");
        // The mode is a name, and its fields are its own.
        for signing in [
            serde_json::json!({"mode": 0}),
            serde_json::json!({"mode": 1, "public_keys": [key]}),
            serde_json::json!({"mode": "control_plane", "public_keys": [key]}),
            serde_json::json!({"mode": "offline"}),
            serde_json::json!({"mode": "offline", "public_keys": [key], "x": 1}),
        ] {
            let body = policy(serde_json::json!({ "signing": signing }));
            assert!(
                serde_json::from_value::<RetrainingConfig>(body).is_err(),
                "{signing}"
            );
        }
        for (patch, want) in cases {
            let c: RetrainingConfig = serde_json::from_value(policy(patch.clone())).unwrap();
            match c.validate() {
                Err(Error::BadRequest { field: Some(f), .. }) => assert_eq!(f, want, "{patch}"),
                other => panic!("{patch}: {other:?}"),
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_numbers_are_accepted_or_refused_with_a_field(
            eval in proptest::prelude::any::<f64>(),
            budget in proptest::prelude::any::<f64>(),
            gain in proptest::prelude::any::<f64>(),
            attempts in proptest::prelude::any::<u32>(),
            timeout in proptest::prelude::any::<i64>(),
            window in proptest::prelude::any::<u64>(),
        ) {
            let body = policy(serde_json::json!({
                "eval_fraction": eval, "quantization_budget_points": budget,
                "min_gain_points": gain, "max_attempts": attempts,
                "step_timeout_seconds": timeout, "edge_window_rows": window,
            }));
            if let Ok(c) = serde_json::from_value::<RetrainingConfig>(body) {
                match c.validate() {
                    Ok(()) | Err(Error::BadRequest { field: Some(_), .. }) => {}
                    Err(other) => proptest::prop_assert!(false, "{other}"),
                }
            }
        }
    }
}
