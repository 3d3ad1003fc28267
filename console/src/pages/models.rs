//! Models: the list; one model's versions with their lineage (dataset
//! snapshot → image → job → checkpoint → artifacts → deployments → devices) and
//! the quantization gate's evidence per version; and its drift over time.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use edgeloop_api::aliases::AliasView;
use edgeloop_api::cost::{CostView, Venue};
use edgeloop_api::deployments::{DeploymentState, DeploymentView};
use edgeloop_api::drift::DriftView;
use edgeloop_api::pipelines::PipelineView;
use edgeloop_api::registry::{ModelVersionView, ModelView};
use edgeloop_models::quantize::evidence::GateOutcome;
use maud::{html, Markup};
use serde::Deserialize;

use super::deployments::state_badge;
use super::{plain_id, with_query};
use crate::chart::{self, line_chart, Mark, Series, Style, Threshold};
use crate::html::{badge, page, short, time};
use crate::session::Session;
use crate::Console;

pub async fn list(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let s = c.session(&headers, "/ui/models").await?;
    let models = c
        .get::<Vec<ModelView>>(&s, "/api/v1/models", "/ui/models")
        .await?;
    let body = html! {
        @if models.is_empty() { p { "No models yet." } }
        @else {
            table.data {
                caption { "Models" }
                thead { tr {
                    th scope="col" { "Model" } th scope="col" { "Project" }
                    th scope="col" { "Task" } th scope="col" { "Created" } th scope="col" { "Drift" }
                } }
                tbody {
                    @for m in &models {
                        tr {
                            th scope="row" { a href={"/ui/models/" (m.name)} { (m.name) } }
                            td { (m.project) }
                            td { (m.task.as_deref().unwrap_or("—")) }
                            td { (time(m.created_at)) }
                            td { a href={"/ui/models/" (m.name) "/drift"} { "drift" } }
                        }
                    }
                }
            }
        }
    };
    Ok(page("Models", "/ui/models", Some(&s), body).into_response())
}

fn evidence_of(v: &ModelVersionView) -> Option<GateOutcome> {
    GateOutcome::in_quantization(v.lineage.quantization.as_ref()?)
}

fn gate_table(e: &GateOutcome) -> Markup {
    let rows = std::iter::once(&e.float).chain(&e.candidates);
    let metric = &e.metric;
    html! {
        table.data.gate {
            caption {
                "Gate: " (metric.name.name()) @if !metric.unit.is_empty() { " (" (metric.unit) ")" }
                ", budget " (format!("{}", metric.budget))
                ". Chose " strong { (e.chosen) } ": " (e.reason)
            }
            thead { tr {
                th scope="col" { "Candidate" } th scope="col" { "Metric" } th scope="col" { "Loss" }
                th scope="col" { "Size" } th scope="col" { "Latency" } th scope="col" { "Verdict" }
            } }
            tbody {
                @for m in rows {
                    tr.chosen[m.name == e.chosen] {
                        th scope="row" { (m.name) @if m.name == e.chosen { " ✔" } }
                        td { (format!("{:.2}", m.metric)) }
                        td { (format!("{:.2}", m.loss)) }
                        td { (format!("{:.1} KiB", m.size_bytes as f64 / 1024.0)) }
                        td { (format!("{:.3} ms", m.latency_ms)) }
                        td { @if m.accepted { "accepted" } @else { "refused" } ": " (m.verdict) }
                    }
                }
            }
        }
    }
}

fn lineage(v: &ModelVersionView, deployments: &[&DeploymentView]) -> Markup {
    let l = &v.lineage;
    let serving: usize = deployments
        .iter()
        .filter(|d| d.state == DeploymentState::Succeeded)
        .map(|d| d.deployment.moved.len())
        .sum();
    html! {
        ol.lineage aria-label={"Lineage of " (v.version)} {
            li { span.kind { "dataset snapshot" }
                @match &l.dataset { Some(d) => { code title=(d) { (short(d)) } } None => { "—" } } }
            li { span.kind { "image" }
                @match &l.image {
                    Some(i) => { code { (i.reference) } " " code title=(i.digest) { (short(&i.digest)) } }
                    None => { "—" } } }
            li { span.kind { "training job" }
                @match &l.job { Some(j) => { a href={"/ui/jobs/" (j)} { (j) } } None => { "—" } } }
            li { span.kind { "checkpoint" }
                @match &l.checkpoint { Some(d) => { code title=(d) { (short(d)) } } None => { "—" } } }
            li { span.kind { "artifacts" }
                code title=(v.artifact_digest) { (short(&v.artifact_digest)) } " (" (v.format) ")"
                @for var in &v.variants { br; code title=(var.artifact_digest) { (short(&var.artifact_digest)) } " (" (var.name) ")" } }
            li { span.kind { "deployments" }
                @if deployments.is_empty() { "—" }
                @for d in deployments { a href={"/ui/deployments/" (d.id)} { (d.id) } " " (state_badge(d.state)) br; } }
            li { span.kind { "devices" } (serving) " moved by succeeded rollouts" }
        }
    }
}

pub async fn show(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, Response> {
    let here = format!("/ui/models/{name}");
    let s = c.session(&headers, &here).await?;
    if !plain_id(&name) {
        return Err((StatusCode::NOT_FOUND, "no such model").into_response());
    }
    let versions = c
        .get::<Vec<ModelVersionView>>(&s, &format!("/api/v1/models/{name}/versions"), "/ui/models")
        .await?;
    let mut by_version: BTreeMap<String, Vec<DeploymentView>> = BTreeMap::new();
    for d in model_deployments(&c, &s, &name).await {
        by_version
            .entry(d.deployment.target_version.clone())
            .or_default()
            .push(d);
    }
    let aliases = c
        .api
        .get::<Vec<AliasView>>(&s.principal, &format!("/api/v1/models/{name}/aliases"))
        .await
        .map(|a| a.body)
        .unwrap_or_default();
    let cost = c
        .api
        .get::<CostView>(&s.principal, &format!("/api/v1/models/{name}/cost"))
        .await
        .ok()
        .map(|a| a.body);
    let body = html! {
        p { a href={"/ui/models/" (name) "/drift"} { "Drift over time" } " · "
            a href={"/ui/models/" (name) "/labelling"} { "Label hard examples" } " · "
            a href={"/ui/models/" (name) "#cost"} { "Cost" } }
        @if !aliases.is_empty() {
            table.data {
                caption { "Aliases" }
                thead { tr { th scope="col" { "Alias" } th scope="col" { "Version" } th scope="col" { "Moved" } } }
                tbody {
                    @for a in &aliases {
                        tr {
                            th scope="row" { (a.alias) }
                            td { a href={"#v-" (a.version)} { (a.version) } }
                            td { (time(a.updated_at)) " by " (a.updated_by) }
                        }
                    }
                }
            }
        }
        @if versions.is_empty() { p { "No versions yet." } }
        @for v in versions.iter().rev() {
            @let deps: Vec<&DeploymentView> = by_version.get(&v.version).map(|d| d.iter().collect()).unwrap_or_default();
            section.card aria-labelledby={"v-" (v.version)} {
                h2 #{"v-" (v.version)} { "Version " (v.version)
                    @for a in aliases.iter().filter(|a| a.version == v.version) { " " (badge(a.alias.as_str(), "busy")) } }
                p {
                    (time(v.created_at))
                    @if let Some(t) = &v.lineage.trigger { " · trigger: " (t) }
                    @if let Some(p) = &v.lineage.parent_version { " · from " (p) }
                    @if let Some(h) = v.lineage.hard_examples { " · " (h) " labelled hard examples" }
                    @for (k, m) in &v.metrics { " · " (k) " " (format!("{m:.4}")) }
                }
                (lineage(v, &deps))
                @match evidence_of(v) {
                    Some(e) => { (gate_table(&e)) }
                    None => { p.hint { "No quantization evidence (an uploaded version)." } }
                }
            }
        }
        @if let Some(cost) = &cost { (cost_section(cost)) }
    };
    Ok(page(&format!("Model {name}"), "/ui/models", Some(&s), body).into_response())
}

/// The model's deployments, newest first, from the first page of a
/// thousand (the API filters deployments by nothing but their page).
async fn model_deployments(c: &Console, s: &Session, name: &str) -> Vec<DeploymentView> {
    match c
        .api
        .get::<Vec<DeploymentView>>(&s.principal, "/api/v1/deployments?limit=1000")
        .await
    {
        Ok(a) => a
            .body
            .into_iter()
            .filter(|d| d.deployment.model == name)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The loop's decisions on the drift charts' time axis: each retrain's
/// start (with its trigger), and each rollout: when it began, or when it
/// succeeded (the version serving). Drift flagged is marked per series,
/// from its own windows. Pure.
pub fn loop_marks(pipelines: &[PipelineView], deployments: &[DeploymentView]) -> Vec<Mark> {
    let mut marks: Vec<Mark> = pipelines
        .iter()
        .filter_map(|p| {
            let started = p.history.first()?.started_at;
            let trigger = p.trigger.split([':', ' ']).next().unwrap_or("manual");
            Some(Mark {
                x: started as f64,
                label: format!("retrain ({trigger})"),
            })
        })
        .collect();
    for d in deployments {
        let v = &d.deployment.target_version;
        marks.push(if d.state == DeploymentState::Succeeded {
            Mark {
                x: d.updated_at.unix_timestamp() as f64,
                label: format!("v{v} serving"),
            }
        } else {
            Mark {
                x: d.created_at.unix_timestamp() as f64,
                label: format!("v{v} rollout"),
            }
        });
    }
    marks.sort_by(|a, b| a.x.total_cmp(&b.x));
    marks
}

/// The marks a series' chart shows: those within its windows' span, and
/// the first one after it (what ended this version's windows, usually the
/// next version starting to serve), but none later, which would squash
/// the chart. Pure.
pub fn marks_in_span(marks: &[Mark], span: Option<(f64, f64)>) -> Vec<&Mark> {
    let Some((lo, hi)) = span else {
        return Vec::new();
    };
    let mut shown: Vec<&Mark> = marks.iter().filter(|m| m.x >= lo && m.x <= hi).collect();
    shown.extend(
        marks
            .iter()
            .filter(|m| m.x > hi)
            .min_by(|a, b| a.x.total_cmp(&b.x)),
    );
    shown
}

/// Where drift was first flagged in a series' windows, as a mark.
fn drift_flagged(windows: &[edgeloop_api::drift::WindowDrift]) -> Option<Mark> {
    windows.iter().find(|w| w.drifting).map(|w| Mark {
        x: w.start as f64,
        label: "drift flagged".into(),
    })
}

/// The model's cost report: its measured traffic a month at the edge,
/// against cloud instances and serverless (`GET .../cost`).
fn cost_section(c: &CostView) -> Markup {
    let usd = |x: f64| format!("${x:.2}");
    html! {
        section.card #cost aria-labelledby="cost-h" {
            h2 #cost-h { "Cost" }
            p { "Traffic of the last " (c.days) " days (since " (time(c.since)) "): "
                (c.traffic.requests) " requests from " (c.traffic.devices) " devices, mean "
                (format!("{:.2}", c.traffic.mean_rps)) " and peak " (format!("{:.2}", c.traffic.peak_rps)) " requests/s." }
            @match &c.estimate {
                None => { p { "No requests were reported in the period, so there is nothing to price." } }
                Some(e) => {
                    table.data {
                        caption { "A month of this traffic (" (format!("{:.0}", e.monthly_requests)) " requests)" }
                        thead { tr { th scope="col" { "Where" } th scope="col" { "Per month" } th scope="col" { "Per million requests" } th scope="col" { "How" } } }
                        tbody {
                            tr { th scope="row" { "Edge (these devices)" } td { (usd(e.edge.total_usd)) } td { (usd(e.edge.usd_per_million_requests)) }
                                 td { (format!("{:.1} kWh", e.edge.energy_kwh)) " for " (usd(e.edge.energy_usd)) ", hardware " (usd(e.edge.hardware_usd)) } }
                            tr { th scope="row" { "Cloud instances" } td { (usd(e.cloud_instances.total_usd)) } td { (usd(e.cloud_instances.usd_per_million_requests)) }
                                 td { (e.cloud_instances.instances) " instances" } }
                            tr { th scope="row" { "Cloud serverless" } td { (usd(e.cloud_serverless.total_usd)) } td { (usd(e.cloud_serverless.usd_per_million_requests)) }
                                 td { (format!("{:.0}", e.cloud_serverless.gb_seconds)) " GB-s" } }
                        }
                    }
                    p { "Cheapest: " strong { (match e.cheapest { Venue::Edge => "the edge", Venue::CloudInstances => "cloud instances", Venue::CloudServerless => "cloud serverless" }) }
                        @if e.edge_saves_usd >= 0.0 { "; the edge saves " (usd(e.edge_saves_usd)) " a month." }
                        @else { "; the cloud would save " (usd(-e.edge_saves_usd)) " a month." } }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub struct DriftQuery {
    #[serde(default)]
    version: String,
    #[serde(default)]
    group_by: String,
}

pub async fn drift(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<DriftQuery>,
) -> Result<Response, Response> {
    let here = with_query(
        &format!("/ui/models/{name}/drift"),
        &[("version", &q.version), ("group_by", &q.group_by)],
    );
    let s = c.session(&headers, &here).await?;
    if !plain_id(&name) {
        return Err((StatusCode::NOT_FOUND, "no such model").into_response());
    }
    let path = with_query(
        &format!("/api/v1/models/{name}/drift"),
        &[("version", &q.version), ("group_by", &q.group_by)],
    );
    let view = c.get::<DriftView>(&s, &path, "/ui/models").await?;
    let pipelines = c
        .api
        .get::<Vec<PipelineView>>(&s.principal, &format!("/api/v1/pipelines?model={name}"))
        .await
        .map(|a| a.body)
        .unwrap_or_default();
    let marks = loop_marks(&pipelines, &model_deployments(&c, &s, &name).await);
    // Online accuracy is drawn against the version's evaluated accuracy.
    let evaluated = c
        .api
        .get::<ModelVersionView>(
            &s.principal,
            &format!("/api/v1/models/{name}/versions/{}", view.version),
        )
        .await
        .ok()
        .and_then(|a| a.body.metrics.get("eval_accuracy").copied());
    let cfg = view.config;
    let flagged: BTreeMap<String, Mark> = view
        .series
        .iter()
        .filter_map(|s| Some((s.group.clone(), drift_flagged(&s.windows)?)))
        .collect();
    let accuracy_thresholds: Vec<Threshold<'_>> = evaluated
        .map(|y| Threshold {
            name: "evaluated accuracy",
            y,
        })
        .into_iter()
        .collect();
    let body = html! {
        form.filter method="get" action={"/ui/models/" (name) "/drift"} {
            label for="group_by" { "Group by device label" }
            input #group_by type="text" name="group_by" value=(q.group_by) placeholder="site";
            input type="hidden" name="version" value=(q.version);
            button type="submit" { "Show" }
        }
        p { "Version " (view.version) ", windows of " (cfg.window_seconds) " s. PSI watch "
            (cfg.psi_watch) ", act " (cfg.psi_act) "; JS act " (cfg.js_act) "." }
        @for series in &view.series {
            @let span: Vec<&Mark> = {
                let (lo, hi) = (series.windows.first().map(|w| w.start), series.windows.last().map(|w| w.start));
                let mut span = marks_in_span(&marks, lo.zip(hi).map(|(lo, hi)| (lo as f64, (hi + cfg.window_seconds) as f64)));
                span.extend(flagged.get(&series.group));
                span.sort_by(|a, b| a.x.total_cmp(&b.x));
                span
            };
            section.card {
                h2 { "Group " (series.group) }
                @if series.windows.is_empty() { p { "No windows yet." } }
                @else {
                    @let feature_names: Vec<String> = series.windows.iter()
                        .flat_map(|w| w.features.iter().map(|f| f.name.clone()))
                        .collect::<std::collections::BTreeSet<_>>().into_iter().collect();
                    @for f in &feature_names {
                        @let pick = |get: &dyn Fn(&edgeloop_api::drift::FeatureDrift) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
                            series.windows.iter().map(|w| (w.start as f64,
                                w.features.iter().find(|x| &x.name == f).and_then(get))).collect()
                        };
                        (line_chart(
                            &format!("Feature {f}"),
                            &[
                                Series { name: "PSI", points: pick(&|x| x.psi), style: Style::Solid(chart::BLUE) },
                                Series { name: "KS statistic", points: pick(&|x| x.ks_statistic), style: Style::Dashed(chart::ORANGE) },
                                Series { name: "JS distance", points: pick(&|x| x.js_distance), style: Style::Dashed(chart::PURPLE) },
                            ],
                            &[Threshold { name: "PSI watch", y: cfg.psi_watch }, Threshold { name: "PSI act", y: cfg.psi_act }],
                            &span.iter().map(|m| Mark { x: m.x, label: m.label.clone() }).collect::<Vec<_>>(),
                            axis_time,
                        ))
                    }
                    (line_chart(
                        "Online accuracy",
                        &[Series {
                            name: "accuracy of labelled predictions",
                            points: series.windows.iter().map(|w| (w.start as f64, w.accuracy)).collect(),
                            style: Style::Solid(chart::GREEN),
                        }],
                        &accuracy_thresholds,
                        &span.iter().map(|m| Mark { x: m.x, label: m.label.clone() }).collect::<Vec<_>>(),
                        axis_time,
                    ))
                    table.data {
                        caption { "Windows where drift was flagged" }
                        thead { tr { th scope="col" { "Window" } th scope="col" { "Requests" } th scope="col" { "Severity (max PSI)" } th scope="col" { "Drifting" } } }
                        tbody {
                            @for w in series.windows.iter().filter(|w| w.drifting || w.over == Some(true)) {
                                tr {
                                    th scope="row" { (axis_time(w.start as f64)) }
                                    td { (w.requests) }
                                    td { (format!("{:.3}", w.severity)) }
                                    td { @if w.drifting { "yes" } @else { "over, not yet set" } }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&format!("Drift of {name}"), "/ui/models", Some(&s), body).into_response())
}

/// A chart's time label: UTC, to the minute.
fn axis_time(x: f64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(x as i64) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute()
        ),
        Err(_) => format!("{x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(x: f64, label: &str) -> Mark {
        Mark {
            x,
            label: label.into(),
        }
    }

    #[test]
    fn a_chart_shows_the_marks_in_its_span_and_the_first_after_it() {
        let marks = [
            mark(5.0, "before"),
            mark(10.0, "start"),
            mark(20.0, "retrain (drift)"),
            mark(35.0, "v2 serving"),
            mark(90.0, "v3 serving"),
        ];
        let labels = |span| -> Vec<String> {
            marks_in_span(&marks, span)
                .iter()
                .map(|m| m.label.clone())
                .collect()
        };
        assert_eq!(
            labels(Some((10.0, 30.0))),
            ["start", "retrain (drift)", "v2 serving"]
        );
        assert_eq!(labels(Some((0.0, 100.0))).len(), 5);
        assert_eq!(labels(Some((95.0, 99.0))), Vec::<String>::new());
        assert_eq!(labels(None), Vec::<String>::new(), "no windows: no marks");
    }
}
