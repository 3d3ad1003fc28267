//! Pipelines and jobs: a retraining pipeline's steps on a timeline with
//! their status, duration and output; a training job's progress reports
//! as metric curves over its steps, and its checkpoints.

use std::collections::BTreeSet;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use edgeloop_api::jobs::{Job, JobState, JobView};
use edgeloop_api::pipelines::{Output, PipelineStatus, PipelineView, Step, StepOutcome};
use maud::{html, Markup};

use super::plain_id;
use crate::chart::{self, line_chart, Series, Style};
use crate::html::{badge, page, short, time};
use crate::Console;

const COLOURS: [&str; 4] = [chart::BLUE, chart::ORANGE, chart::GREEN, chart::PURPLE];

/// A step's name as the API writes it.
fn step_name(s: Step) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}"))
}

fn pipeline_badge(s: PipelineStatus) -> Markup {
    let kind = match s {
        PipelineStatus::Succeeded => "good",
        PipelineStatus::Failed => "bad",
        PipelineStatus::Stopped | PipelineStatus::Cancelled => "quiet",
        PipelineStatus::Running | PipelineStatus::AwaitingSignature => "busy",
    };
    badge(s.as_str(), kind)
}

fn job_badge(s: JobState) -> Markup {
    let kind = match s {
        JobState::Succeeded => "good",
        JobState::Failed => "bad",
        JobState::Cancelled => "quiet",
        JobState::Queued | JobState::Leased | JobState::Running => "busy",
    };
    badge(s.as_str(), kind)
}

fn unix(t: i64) -> Markup {
    match time::OffsetDateTime::from_unix_timestamp(t) {
        Ok(t) => time(t),
        Err(_) => html! { (t) },
    }
}

pub async fn pipelines(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let s = c.session(&headers, "/ui/pipelines").await?;
    let list = c
        .get::<Vec<PipelineView>>(&s, "/api/v1/pipelines?limit=100", "/ui/pipelines")
        .await?;
    let jobs = c
        .get::<Vec<Job>>(&s, "/api/v1/jobs?limit=100", "/ui/pipelines")
        .await?;
    let body = html! {
        h2 { "Retraining pipelines" }
        @if list.is_empty() { p { "No pipeline has run." } }
        @else {
            table.data {
                thead { tr { th scope="col" { "Pipeline" } th scope="col" { "Model" } th scope="col" { "Trigger" }
                             th scope="col" { "Step" } th scope="col" { "Status" } } }
                tbody {
                    @for p in &list {
                        tr {
                            th scope="row" { a href={"/ui/pipelines/" (p.id)} { (p.id) } }
                            td { (p.model) }
                            td { (p.trigger) }
                            td { (p.step.map(step_name).unwrap_or_default()) }
                            td { (pipeline_badge(p.status)) }
                        }
                    }
                }
            }
        }
        h2 { "Training jobs" }
        @if jobs.is_empty() { p { "No training job yet." } }
        @else {
            table.data {
                thead { tr { th scope="col" { "Job" } th scope="col" { "Name" } th scope="col" { "State" }
                             th scope="col" { "Step" } th scope="col" { "Cluster" } th scope="col" { "Created" } } }
                tbody {
                    @for j in &jobs {
                        tr {
                            th scope="row" { a href={"/ui/jobs/" (j.id)} { (j.id) } }
                            td { (j.spec.name.as_deref().unwrap_or("—")) }
                            td { (job_badge(j.state)) }
                            td { (j.step) }
                            td { (j.leased_by.as_deref().unwrap_or("—")) }
                            td { (time(j.created_at)) }
                        }
                    }
                }
            }
        }
    };
    Ok(page("Pipelines and jobs", "/ui/pipelines", Some(&s), body).into_response())
}

fn output(o: &Output) -> Markup {
    match o {
        Output::Job { id, checkpoint } => html! {
            "job " a href={"/ui/jobs/" (id)} { (id) } ", checkpoint " code { (checkpoint) }
        },
        other => html! {
            code.output { (serde_json::to_string(other).unwrap_or_default()) }
        },
    }
}

pub async fn pipeline(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Response> {
    let s = c.session(&headers, &format!("/ui/pipelines/{id}")).await?;
    if !plain_id(&id) {
        return Err((StatusCode::NOT_FOUND, "no such pipeline").into_response());
    }
    let p = c
        .get::<PipelineView>(&s, &format!("/api/v1/pipelines/{id}"), "/ui/pipelines")
        .await?;
    let now = c.host.now().unix_timestamp();
    // The timeline's scale: from the first step's start to the last end.
    let start = p.history.iter().map(|h| h.started_at).min().unwrap_or(now);
    let end = p
        .history
        .iter()
        .map(|h| h.ended_at.unwrap_or(now))
        .max()
        .unwrap_or(now)
        .max(start + 1);
    let pct = |t: i64| (t - start) as f64 / (end - start) as f64 * 100.0;
    let body = html! {
        p { "Model " a href={"/ui/models/" (p.model)} { (p.model) } " · trigger: " (p.trigger) " · " (pipeline_badge(p.status))
            @if let Some(r) = &p.reason { " — " (r) } }
        ol.timeline aria-label="Steps" {
            @for h in &p.history {
                @let ended = h.ended_at.unwrap_or(now);
                @let ok = matches!(h.outcome, Some(StepOutcome::Succeeded));
                li {
                    span.step { (step_name(h.step)) @if h.attempt > 1 { " (attempt " (h.attempt) ")" } }
                    // The bar's place and length are the step's share of
                    // the pipeline's time, as an SVG the CSP allows.
                    svg.bar viewBox="0 0 100 6" preserveAspectRatio="none" aria-hidden="true" {
                        rect x=(format!("{:.2}", pct(h.started_at))) y="0"
                            width=(format!("{:.2}", (pct(ended) - pct(h.started_at)).max(0.5))) height="6"
                            fill=(if ok { "#1e6b34" } else if h.outcome.is_none() { "#0b57b0" } else { "#8a1111" }) {}
                    }
                    span.when { (unix(h.started_at)) " · " (ended - h.started_at) " s · "
                        @match &h.outcome { Some(o) => { (o.as_str()) } None => { "running" } } }
                    @if let Some(o) = &h.output { div { (output(o)) } }
                }
            }
        }
    };
    Ok(page(
        &format!("Pipeline {}", p.id),
        "/ui/pipelines",
        Some(&s),
        body,
    )
    .into_response())
}

pub async fn job(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Response> {
    let s = c.session(&headers, &format!("/ui/jobs/{id}")).await?;
    if !plain_id(&id) {
        return Err((StatusCode::NOT_FOUND, "no such job").into_response());
    }
    let v = c
        .get::<JobView>(&s, &format!("/api/v1/jobs/{id}"), "/ui/pipelines")
        .await?;
    let j = &v.job;
    let metrics: BTreeSet<&String> = j.history.iter().flat_map(|e| e.metrics.keys()).collect();
    let series: Vec<Series<'_>> = metrics
        .iter()
        .enumerate()
        .map(|(i, m)| Series {
            name: m,
            points: j
                .history
                .iter()
                .filter_map(|e| e.metrics.get(*m).map(|v| (e.step as f64, Some(*v))))
                .collect(),
            style: if i % 2 == 0 {
                Style::Solid(COLOURS[i % COLOURS.len()])
            } else {
                Style::Dashed(COLOURS[i % COLOURS.len()])
            },
        })
        .collect();
    let body = html! {
        p { (job_badge(j.state)) " · attempt " (j.attempt) " · step " (j.step)
            @if let Some(b) = &j.leased_by { " · on " (b) }
            @if !j.last_message.is_empty() { " · " (j.last_message) } }
        @if let Some(i) = &j.image {
            p.image { "image " code { (i.reference) } " pinned to "
                code title=(i.digest) { (short(&i.digest)) } " (" (i.kind.as_str()) ")" } }
        @if series.is_empty() { p { "No metrics reported yet." } }
        @else {
            (line_chart("Metrics by training step", &series, &[], &[], |x| format!("step {x:.0}")))
        }
        h2 { "Checkpoints" }
        @if v.checkpoints.is_empty() { p { "None yet." } }
        @else {
            table.data {
                thead { tr { th scope="col" { "Step" } th scope="col" { "Attempt" } th scope="col" { "Digest" }
                             th scope="col" { "Size" } th scope="col" { "Optimizer state" } th scope="col" { "Uploaded" } } }
                tbody {
                    @for cp in &v.checkpoints {
                        tr {
                            th scope="row" { (cp.step) }
                            td { (cp.attempt) }
                            td { code { (cp.digest) } }
                            td { (format!("{:.1} KiB", cp.size as f64 / 1024.0)) }
                            td { @if cp.has_optimizer_state { "yes" } @else { "no" } }
                            td { (time(cp.uploaded_at)) }
                        }
                    }
                }
            }
        }
        h2 { "Progress reports" }
        ol.events {
            @for e in j.history.iter().rev().take(50) {
                li { (time(e.at)) " " (e.state.as_str()) " step " (e.step)
                    @for (k, m) in &e.metrics { " · " (k) " " (format!("{m:.4}")) }
                    @if !e.message.is_empty() { " — " (e.message) } }
            }
        }
    };
    Ok(page(&format!("Job {}", j.id), "/ui/pipelines", Some(&s), body).into_response())
}
