//! Deployments: the list, and one rollout wave by wave, live while it runs
//! (the page's live part reloads itself until the rollout ends), with the
//! gates' readings against their thresholds, the event log, and Cancel
//! for the roles that may.

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use edgeloop_api::deployments::{
    CancelReason, DeploymentState, DeploymentView, Event, Evidence, RolloutState, Waves,
};
use maud::{html, Markup};

use super::{plain_id, query};
use crate::html::{badge, csrf_field, failure, may, page, time};
use crate::session::Session;
use crate::{redirect, Console, CsrfForm};

const PAGE: usize = 50;
const CANCEL_ROUTE: &str = "/api/v1/deployments/{id}/cancel";

pub fn state_badge(s: DeploymentState) -> Markup {
    let kind = match s {
        DeploymentState::Succeeded => "good",
        DeploymentState::Failed | DeploymentState::RolledBack => "bad",
        DeploymentState::Cancelled => "quiet",
        DeploymentState::Pending | DeploymentState::Wave | DeploymentState::RollingBack => "busy",
    };
    badge(s.as_str(), kind)
}

#[derive(serde::Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    after: String,
}

pub async fn list(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Response, Response> {
    let s = c.session(&headers, "/ui/deployments").await?;
    let limit = PAGE.to_string();
    let path = format!(
        "/api/v1/deployments?{}",
        query(&[("limit", &limit), ("after", &q.after)])
    );
    let answer = match c.api.get::<Vec<DeploymentView>>(&s.principal, &path).await {
        Ok(a) => a,
        Err(f) => return Err(failure(Some(&s), "/ui/deployments", &f)),
    };
    let body = html! {
        @if answer.body.is_empty() {
            p { "No deployments yet." }
        } @else {
            table.data {
                caption { "Newest first" }
                thead { tr {
                    th scope="col" { "Deployment" }
                    th scope="col" { "Model" }
                    th scope="col" { "Version" }
                    th scope="col" { "Devices" }
                    th scope="col" { "State" }
                    th scope="col" { "Created" }
                } }
                tbody {
                    @for d in &answer.body {
                        tr {
                            th scope="row" { a href={"/ui/deployments/" (d.id)} { (d.id) } }
                            td { (d.deployment.model) }
                            td { (d.deployment.target_version) }
                            td { code { (d.deployment.group) } }
                            td { (state_badge(d.state)) }
                            td { (time(d.created_at)) }
                        }
                    }
                }
            }
        }
        nav.pages aria-label="Pages" {
            @if let Some(next) = &answer.next {
                a rel="next" href={"/ui/deployments?" (query(&[("after", next)]))} { "Older" }
            }
        }
    };
    Ok(page("Deployments", "/ui/deployments", Some(&s), body).into_response())
}

/// The session and the deployment a page of it is about.
async fn session_and_deployment(
    c: &Console,
    headers: &HeaderMap,
    id: &str,
) -> Result<(Session, DeploymentView), Response> {
    let s = c.session(headers, &format!("/ui/deployments/{id}")).await?;
    if !plain_id(id) {
        return Err((StatusCode::NOT_FOUND, "no such deployment").into_response());
    }
    let d = c
        .api
        .get::<DeploymentView>(&s.principal, &format!("/api/v1/deployments/{id}"))
        .await
        .map_err(|f| failure(Some(&s), "/ui/deployments", &f))?
        .body;
    Ok((s, d))
}

pub async fn show(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Response> {
    let (s, d) = session_and_deployment(&c, &headers, &id).await?;
    let dep = &d.deployment;
    let body = html! {
        dl.facts {
            dt { "Model" } dd { (dep.model) " " (dep.target_version)
                @if let Some(a) = &d.alias { " (alias " (a.as_str()) ")" } }
            dt { "Devices" } dd { code { (dep.group) } }
            dt { "Waves" } dd { (waves_text(&dep.strategy.waves)) }
            dt { "Soak" } dd { (dep.strategy.min_soak_seconds) " s per wave" }
            dt { "Created" } dd { (time(d.created_at)) }
        }
        div #live data-live={"/ui/deployments/" (d.id) "/live"} aria-live="polite" {
            (live_part(&s, &d))
        }
    };
    Ok(page(
        &format!("Deployment {}", d.id),
        "/ui/deployments",
        Some(&s),
        body,
    )
    .into_response())
}

/// The live part alone, for the page's script to swap in.
pub async fn live(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Response> {
    let (s, d) = session_and_deployment(&c, &headers, &id).await?;
    Ok(live_part(&s, &d).into_response())
}

fn waves_text(w: &Waves) -> String {
    match w {
        Waves::Percent(p) => p
            .iter()
            .map(|p| format!("{p} %"))
            .collect::<Vec<_>>()
            .join(" → "),
        Waves::Count(c) => c
            .iter()
            .map(|c| format!("{c} devices"))
            .collect::<Vec<_>>()
            .join(" → "),
    }
}

/// What one wave is doing.
#[derive(Debug, PartialEq, Eq)]
enum WaveState {
    Waiting,
    Moving,
    Soaking,
    Healthy,
    /// The rollout ended during or before this wave.
    Stopped,
}

/// The state of wave `i` from the rollout's state and its healthy waves.
fn wave_state(state: &RolloutState, i: usize, healthy: &[usize]) -> WaveState {
    if healthy.contains(&i) {
        return WaveState::Healthy;
    }
    match state {
        RolloutState::Pending => WaveState::Waiting,
        RolloutState::Wave {
            index, soak_until, ..
        } => match i.cmp(index) {
            std::cmp::Ordering::Less => WaveState::Healthy,
            std::cmp::Ordering::Equal if soak_until.is_some() => WaveState::Soaking,
            std::cmp::Ordering::Equal => WaveState::Moving,
            std::cmp::Ordering::Greater => WaveState::Waiting,
        },
        RolloutState::Succeeded => WaveState::Healthy,
        _ => WaveState::Stopped,
    }
}

fn live_part(s: &Session, d: &DeploymentView) -> Markup {
    let dep = &d.deployment;
    let healthy: Vec<usize> = d
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::WaveHealthy { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    // The newest evidence the gates read: a healthy wave's, or a rollback's.
    let evidence: Option<&Evidence> = d.events.iter().rev().find_map(|e| match &e.event {
        Event::WaveHealthy { evidence, .. } => Some(evidence),
        _ => None,
    });
    let evidence = match &dep.state {
        RolloutState::RolledBack { evidence, .. } => Some(&**evidence),
        _ => evidence,
    };
    let terminal = d.state.is_terminal();
    html! {
        div data-final[terminal] {
            p.state {
                "State: " (state_badge(d.state))
                @if let Some(r) = dep.state.reason() { " — " (r) }
                @if let RolloutState::Cancelled { reason } = &dep.state {
                    @match reason {
                        CancelReason::Requested => { " — on request" }
                        CancelReason::Superseded { by } => {
                            " — superseded by " a href={"/ui/deployments/" (by)} { (by) }
                        }
                    }
                }
            }
            @if !terminal && may(s, Method::POST, CANCEL_ROUTE) {
                form.inline method="post" action={"/ui/deployments/" (d.id) "/cancel"} {
                    (csrf_field(s))
                    button.danger type="submit" { "Cancel deployment" }
                }
            }
            table.data {
                caption { "Waves" }
                thead { tr {
                    th scope="col" { "Wave" }
                    th scope="col" { "Devices moved" }
                    th scope="col" { "State" }
                } }
                tbody {
                    @for i in 0..dep.strategy.waves.len() {
                        @let moved = dep.moved.values().filter(|m| m.wave == i).count();
                        tr {
                            th scope="row" { (i + 1) }
                            td { (moved) }
                            td {
                                @match wave_state(&dep.state, i, &healthy) {
                                    WaveState::Waiting => { (badge("waiting", "quiet")) }
                                    WaveState::Moving => { (badge("moving", "busy")) }
                                    WaveState::Soaking => { (badge("soaking", "busy")) }
                                    WaveState::Healthy => { (badge("healthy", "good")) }
                                    WaveState::Stopped if moved == 0 => { (badge("not started", "quiet")) }
                                    WaveState::Stopped => { (badge("stopped", "bad")) }
                                }
                            }
                        }
                    }
                }
            }
            @if !dep.skipped.is_empty() {
                details {
                    summary { (dep.skipped.len()) " devices skipped by the compatibility check" }
                    ul { @for (dev, why) in &dep.skipped { li { (dev) ": " (why) } } }
                }
            }
            (gates(d, evidence))
            h2 { "Events" }
            ol.events {
                @for e in &d.events {
                    li { (time(e.at)) " " (e.event.summary()) }
                }
            }
        }
    }
}

fn gates(d: &DeploymentView, evidence: Option<&Evidence>) -> Markup {
    let g = &d.deployment.gates;
    let pct = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{:.2} %", v * 100.0));
    let ratio = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.2}×"));
    html! {
        table.data {
            caption { "Gates"
                @if let Some(e) = evidence { " (wave " (e.wave + 1) ", " (e.requests) " requests)" }
                @else { " (no reading yet)" } }
            thead { tr {
                th scope="col" { "Gate" }
                th scope="col" { "Reading" }
                th scope="col" { "Threshold" }
            } }
            tbody {
                tr { th scope="row" { "Error rate" }
                     td { (pct(evidence.and_then(|e| e.error_rate))) }
                     td { "≤ " (pct(Some(g.max_error_rate))) } }
                tr { th scope="row" { "p99 latency vs previous" }
                     td { (ratio(evidence.and_then(|e| e.p99_latency_ratio))) }
                     td { "≤ " (ratio(Some(g.max_p99_latency_ratio))) } }
                tr { th scope="row" { "Activation failures" }
                     td { (evidence.map_or("—".to_string(), |e| e.activation_failures.len().to_string())) }
                     td { "≤ " (g.max_activation_failures) } }
                @if let Some(min) = g.min_online_accuracy {
                    tr { th scope="row" { "Online accuracy" }
                         td { (pct(evidence.and_then(|e| e.online_accuracy))) }
                         td { "≥ " (pct(Some(min))) } }
                }
            }
        }
    }
}

pub async fn cancel(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Result<Response, Response> {
    let here = format!("/ui/deployments/{id}");
    let s = c.acting_session(&headers, &here, &f.csrf).await?;
    if !plain_id(&id) {
        return Err((StatusCode::NOT_FOUND, "no such deployment").into_response());
    }
    match c
        .api
        .post::<DeploymentView>(
            &s.principal,
            &format!("/api/v1/deployments/{id}/cancel"),
            None,
        )
        .await
    {
        Ok(_) => Ok(redirect(&here)),
        Err(f) => Err(failure(Some(&s), "/ui/deployments", &f)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waves_state_follows_the_rollout() {
        let wave = |index, soaking: bool| RolloutState::Wave {
            index,
            started_at: 0,
            soak_until: soaking.then_some(10),
        };
        // (state, wave, healthy waves, want)
        let cases = [
            (RolloutState::Pending, 0, vec![], WaveState::Waiting),
            (wave(1, false), 0, vec![0], WaveState::Healthy),
            (wave(1, false), 1, vec![0], WaveState::Moving),
            (wave(1, true), 1, vec![0], WaveState::Soaking),
            (wave(1, true), 2, vec![0], WaveState::Waiting),
            (RolloutState::Succeeded, 2, vec![0, 1], WaveState::Healthy),
            (
                RolloutState::Failed { reason: "x".into() },
                1,
                vec![0],
                WaveState::Stopped,
            ),
            (
                RolloutState::Failed { reason: "x".into() },
                0,
                vec![0],
                WaveState::Healthy,
            ),
        ];
        for (state, i, healthy, want) in cases {
            assert_eq!(wave_state(&state, i, &healthy), want, "{state:?} wave {i}");
        }
    }
}
