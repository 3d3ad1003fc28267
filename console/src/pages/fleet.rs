//! Fleet: devices (filtered by label selector, a page at a time, so it
//! stays quick at 10 000 devices) and the training clusters' bridges with
//! their pools' GPU facts.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use edgeloop_api::fleet::{AssignmentState, MemberStatus, MemberView};
use maud::{html, Markup};

use super::{query, with_query};
use crate::html::{ago, badge, failure, page, time};
use crate::Console;

/// Devices on one page.
pub const PAGE: usize = 50;

#[derive(serde::Deserialize)]
pub struct FleetQuery {
    #[serde(default)]
    selector: String,
    #[serde(default)]
    after: String,
}

pub async fn devices(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<FleetQuery>,
) -> Result<Response, Response> {
    let here = with_query(
        "/ui/fleet",
        &[("selector", &q.selector), ("after", &q.after)],
    );
    let s = c.session(&headers, &here).await?;
    let limit = PAGE.to_string();
    let path = format!(
        "/api/v1/devices?{}",
        query(&[
            ("limit", &limit),
            ("selector", &q.selector),
            ("after", &q.after),
            ("include", "serving")
        ])
    );
    let answer = match c.api.get::<Vec<MemberView>>(&s.principal, &path).await {
        Ok(a) => a,
        Err(f) => {
            // A bad selector is the person's typo: show it with the form.
            if f.status.is_client_error() {
                let body = html! {
                    (filter(&q.selector))
                    p.error role="alert" { (f.message) }
                };
                return Err((f.status, page("Fleet", "/ui/fleet", Some(&s), body)).into_response());
            }
            return Err(failure(Some(&s), "/ui/fleet", &f));
        }
    };
    let now = c.host.now();
    let devices = answer.body;
    let body = html! {
        (filter(&q.selector))
        @if devices.is_empty() {
            p { "No devices" @if !q.selector.is_empty() { " match " code { (q.selector) } } "." }
        } @else {
            table.data {
                caption { (devices.len()) " devices on this page" }
                thead { tr {
                    th scope="col" { "Device" }
                    th scope="col" { "Status" }
                    th scope="col" { "Project" }
                    th scope="col" { "Labels" }
                    th scope="col" { "Serving" }
                    th scope="col" { "Runtime" }
                    th scope="col" { "GPU" }
                    th scope="col" { "Last seen" }
                    th scope="col" { "Telemetry" }
                } }
                tbody {
                    @for d in &devices {
                        tr {
                            th scope="row" { (d.id) }
                            td { (status(d.status)) }
                            td { (d.project) }
                            td { (labels(d)) }
                            td { (serving(d)) }
                            td { (runtime(d)) }
                            td { (gpus(d)) }
                            td {
                                @match d.last_seen {
                                    Some(t) => { (ago(t, now)) br; small { (time(t)) } }
                                    None => { "never" }
                                }
                            }
                            td {
                                @match &d.telemetry {
                                    Some(t) => {
                                        "last report " (ago(t.received_at, now))
                                        @if let Some(lag) = t.lag_seconds { br; small { "arrived " (lag_text(lag)) " after it was recorded" } }
                                    }
                                    None => { "none yet" }
                                }
                            }
                        }
                    }
                }
            }
        }
        nav.pages aria-label="Pages" {
            @if !q.after.is_empty() {
                a href=(with_query("/ui/fleet", &[("selector", &q.selector)])) { "First page" }
            }
            @if let Some(next) = &answer.next {
                a rel="next" href=(with_query("/ui/fleet", &[("selector", &q.selector), ("after", next)])) { "Next page" }
            }
        }
    };
    Ok(page("Fleet", "/ui/fleet", Some(&s), body).into_response())
}

/// Each assigned model: what serves, and the assignment when it differs
/// (a rollout on its way, or a failed one with the old version serving).
fn serving(d: &MemberView) -> Markup {
    let models = d.serving.as_deref().unwrap_or_default();
    html! {
        @if models.is_empty() { "—" }
        @for m in models {
            div {
                (m.model) " "
                @match &m.serving_version {
                    Some(v) => { strong { (v) } }
                    None => { "nothing yet" }
                }
                @if let Some(variant) = &m.variant { " (" (variant) ")" }
                @if m.serving_version.as_deref() != Some(m.assigned_version.as_str()) || m.state != Some(AssignmentState::Active) {
                    " " small { "→ " (m.assigned_version) ": "
                        (m.state.map_or("no report yet", AssignmentState::as_str)) }
                }
            }
        }
    }
}

/// Seconds as people read them: `0.4 s`, `12 s`, `3 min`, `2 h`.
fn lag_text(s: f64) -> String {
    let s = s.max(0.0);
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.0} h", s / 3600.0)
    }
}

fn filter(selector: &str) -> Markup {
    html! {
        form.filter method="get" action="/ui/fleet" role="search" {
            label for="selector" { "Label selector" }
            input #selector type="text" name="selector" value=(selector)
                placeholder="site=berlin,edgeloop.io/provider=CUDAExecutionProvider";
            button type="submit" { "Filter" }
        }
    }
}

pub fn status(s: MemberStatus) -> Markup {
    let kind = match s {
        MemberStatus::Online => "good",
        MemberStatus::Offline => "quiet",
        MemberStatus::Revoked => "bad",
    };
    badge(s.as_str(), kind)
}

fn labels(d: &MemberView) -> Markup {
    html! {
        ul.labels {
            @for (k, v) in &d.labels {
                li { code { (k) "=" (v) } }
            }
        }
    }
}

fn runtime(d: &MemberView) -> Markup {
    let c = &d.capabilities;
    html! {
        @if !c.agent_version.is_empty() { "agent " (c.agent_version) br; }
        @for p in &c.execution_providers {
            small { (p.trim_end_matches("ExecutionProvider")) } " "
        }
    }
}

fn gpus(d: &MemberView) -> Markup {
    html! {
        @for g in &d.capabilities.gpus {
            (g.count) "× " (g.model) " (" (g.memory_bytes >> 20) " MiB)" br;
        }
        @if d.capabilities.gpus.is_empty() { "—" }
    }
}

pub async fn bridges(State(c): State<Console>, headers: HeaderMap) -> Result<Response, Response> {
    let s = c.session(&headers, "/ui/bridges").await?;
    let clusters = c
        .get::<Vec<MemberView>>(&s, "/api/v1/clusters", "/ui/bridges")
        .await?;
    let now = c.host.now();
    let body = html! {
        @if clusters.is_empty() {
            p { "No trainer bridge has enrolled." }
        }
        @for b in &clusters {
            section.card aria-labelledby={"bridge-" (b.id)} {
                h2 #{"bridge-" (b.id)} { (b.id) " " (status(b.status)) }
                p {
                    "Engines: " (b.capabilities.engines.join(", "))
                    @if let Some(t) = b.last_seen { " · last seen " (ago(t, now)) }
                }
                @if b.capabilities.pools.is_empty() {
                    p { "No node pools reported." }
                } @else {
                    table.data {
                        caption { "Node pools" }
                        thead { tr {
                            th scope="col" { "Engine" }
                            th scope="col" { "Pool" }
                            th scope="col" { "Nodes" }
                            th scope="col" { "GPUs per node" }
                            th scope="col" { "GPU" }
                            th scope="col" { "Driver / CUDA" }
                            th scope="col" { "Source" }
                        } }
                        tbody {
                            @for p in &b.capabilities.pools {
                                tr {
                                    td { (p.engine) }
                                    th scope="row" { (p.name) }
                                    td { @match p.nodes { Some(n) => { (n) } None => { "any" } } }
                                    td { (p.gpus_per_node) }
                                    td {
                                        (p.gpu_type.as_deref().unwrap_or("—"))
                                        @if let Some(m) = p.gpu_memory_bytes { " (" (m >> 20) " MiB)" }
                                    }
                                    td {
                                        (p.driver_version.as_deref().unwrap_or("—")) " / "
                                        (p.cuda_version.as_deref().unwrap_or("—"))
                                    }
                                    td { small { (p.source) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page("Bridges", "/ui/bridges", Some(&s), body).into_response())
}
