//! `GET /api/v1/models/{name}/drift`: the drift series of a model version
//! against its manifest's reference statistics, per window and, on
//! request, per device group, for charts and for people deciding.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use edgeloop_api::drift::DriftView;
use serde::Deserialize;

use super::json::ValidPath;
use crate::fleet::members::MemberKind;
use crate::Core;
use edgeloop_drift::aggregates::{labelled, windows};
use edgeloop_drift::analysis::{self, DriftConfig};
use edgeloop_errors::{Error, ErrorBody};
use edgeloop_registry::models;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DriftQuery {
    /// Default: the newest version.
    pub version: Option<String>,
    /// A device label to group by, e.g. `site`.
    pub group_by: Option<String>,
    #[param(minimum = 1, maximum = 2592000)]
    pub window_seconds: Option<i64>,
    /// Only windows from the one holding this time (RFC 3339) on. An
    /// answer over a range costs what the range holds, not the history.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[param(value_type = Option<String>, format = DateTime)]
    pub from: Option<time::OffsetDateTime>,
    /// Only windows that start before this time (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<time::OffsetDateTime>,
    /// Not above `psi_act` (the query's or the model's).
    #[param(exclusive_minimum = 0)]
    pub psi_watch: Option<f64>,
    #[param(exclusive_minimum = 0)]
    pub psi_act: Option<f64>,
    #[param(exclusive_minimum = 0)]
    pub js_act: Option<f64>,
    #[param(exclusive_minimum = 0)]
    pub ks_alpha: Option<f64>,
    pub min_requests: Option<u64>,
    #[param(minimum = 1)]
    pub set_after: Option<u32>,
    #[param(minimum = 1)]
    pub clear_after: Option<u32>,
}

/// The query's thresholds over `d` (the model's, else the defaults).
fn config(q: &DriftQuery, d: DriftConfig) -> Result<DriftConfig, Error> {
    let c = DriftConfig {
        window_seconds: q.window_seconds.unwrap_or(d.window_seconds),
        psi_watch: q.psi_watch.unwrap_or(d.psi_watch),
        psi_act: q.psi_act.unwrap_or(d.psi_act),
        js_act: q.js_act.unwrap_or(d.js_act),
        ks_alpha: q.ks_alpha.unwrap_or(d.ks_alpha),
        min_requests: q.min_requests.unwrap_or(d.min_requests),
        set_after: q.set_after.unwrap_or(d.set_after),
        clear_after: q.clear_after.unwrap_or(d.clear_after),
    };
    analysis::validate(&c, "")?;
    Ok(c)
}

/// Drift per window (and group) against the version's reference statistics.
#[utoipa::path(get, path = "/api/v1/models/{name}/drift", tag = "loop",
    params(("name" = String, Path), DriftQuery),
    responses((status = 200, body = DriftView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn model_drift(
    State(core): State<Arc<Core>>,
    ValidPath(name): ValidPath<String>,
    q: Result<Query<DriftQuery>, QueryRejection>,
) -> Result<Json<DriftView>, Error> {
    let Query(q) = q.map_err(|e| Error::bad_field("query", e.body_text()))?;
    models::get_model(&core.store.registry, &name)?;
    let model_config = core
        .store
        .lifecycle
        .triggers
        .get(&name)?
        .and_then(|t| t.drift)
        .unwrap_or_default();
    let config = config(&q, model_config)?;
    if let (Some(from), Some(until)) = (q.from, q.until) {
        if until <= from {
            return Err(Error::bad_field("until", "must be after `from`"));
        }
    }
    let range = windows::Range {
        from: q.from.map(|t| t.unix_timestamp()),
        until: q.until.map(|t| t.unix_timestamp()),
    };
    let version = match &q.version {
        Some(v) => models::get_version(&core.store.registry, &name, v)?,
        None => models::list_versions(&core.store.registry, &name)?
            .into_iter()
            .max_by_key(|v| v.created_at)
            .ok_or_else(|| Error::not_found("model version", format!("{name} (none yet)")))?,
    };
    let no_reference = || {
        Error::bad_field(
            "version",
            format!(
                "version {} of {name} has no reference statistics in a signed manifest",
                version.version
            ),
        )
    };
    let manifest = version.manifest_digest.ok_or_else(no_reference)?;
    let signed = models::read_manifest(core.artifacts.as_ref(), manifest, "version").await?;
    let reference = signed.manifest.reference_stats.ok_or_else(no_reference)?;
    let store = core.store.clone();
    let (model, v, group_by) = (name.clone(), version.version.clone(), q.group_by.clone());
    // The model's own window has sums kept as sketches arrive (O(windows));
    // another window is a scan of the version's sketches, as before.
    let kept = config.window_seconds == model_config.window_seconds;
    let read = move || -> Result<_, Error> {
        let groups: Option<BTreeMap<String, String>> = match &group_by {
            Some(key) => Some(
                store
                    .fleet
                    .members(MemberKind::Device)
                    .values()?
                    .into_iter()
                    .filter_map(|m| m.labels.get(key).map(|v| (m.id.clone(), v.clone())))
                    .collect(),
            ),
            None => None,
        };
        let group_of = |device: &str| {
            groups.as_ref().map(|g| {
                g.get(device)
                    .cloned()
                    .unwrap_or_else(|| "(unlabelled)".into())
            })
        };
        let mut series = if kept && groups.is_none() {
            let id = manifest.to_string();
            windows::series_in(&store.drift, &reference, &id, &model, &v, &config, range)?
        } else if kept {
            // Each group's hysteresis is folded from its first window.
            let mut s = windows::series(
                &store.drift,
                &reference,
                &model,
                &v,
                &config,
                Some(&group_of),
            )?;
            range.keep(&mut s, config.window_seconds);
            s
        } else {
            let sketches: Vec<_> = store
                .drift
                .sketches
                .scan_prefix(&format!("{model}/{v}/"))?
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            let mut s = analysis::analyze(&reference, &sketches, &group_of, &config);
            range.keep(&mut s, config.window_seconds);
            s
        };
        // Rolling accuracy per window, where devices sent labels for this
        // version's predictions (once per device and request).
        // Only rows from the first window on can land in one.
        let from = series
            .iter()
            .filter_map(|s| s.windows.first())
            .map(|w| w.start)
            .min();
        let rows = match from {
            Some(from) => labelled::rows(&store.drift, &model, &v, Some(from))?,
            None => Vec::new(),
        };
        analysis::add_accuracy(&mut series, &rows, &group_of, config.window_seconds);
        Ok(series)
    };
    let series = tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| Error::Internal(anyhow::Error::new(e).context("reading drift")))??;
    Ok(Json(DriftView {
        model: name,
        version: version.version,
        config,
        series,
    }))
}
