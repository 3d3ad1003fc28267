//! The page frame every console page shares, and the small pieces pages
//! repeat: times, states, the API's failures. Markup is `maud`: HTML
//! written in Rust, checked when compiled, every interpolated value
//! escaped unless a page says otherwise (none does).

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use time::OffsetDateTime;

use super::api::ApiFailure;
use super::session::Session;
use edgeloop_auth::permissions;

/// The sections the navigation offers, by path.
const SECTIONS: &[(&str, &str)] = &[
    ("/ui/fleet", "Fleet"),
    ("/ui/bridges", "Bridges"),
    ("/ui/models", "Models"),
    ("/ui/pipelines", "Pipelines"),
    ("/ui/deployments", "Deployments"),
];

/// A whole page: `current` is the section it belongs to.
pub fn page(title: &str, current: &str, session: Option<&Session>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Edgeloop" }
                link rel="stylesheet" href="/ui/assets/console.css";
                script src="/ui/assets/console.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    span.brand { "Edgeloop" }
                    @if let Some(s) = session {
                        nav aria-label="Sections" {
                            ul {
                                @for (path, name) in SECTIONS {
                                    li {
                                        @if *path == current {
                                            a href=(path) aria-current="page" { (name) }
                                        } @else {
                                            a href=(path) { (name) }
                                        }
                                    }
                                }
                            }
                        }
                        div.who {
                            span { (s.principal.token_name) " (" (s.principal.role) ")" }
                            form method="post" action="/ui/logout" {
                                (csrf_field(s))
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main #main tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The hidden field every state-changing form carries.
pub fn csrf_field(s: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(s.csrf); }
}

/// Whether the session's role may make this API call: the console shows
/// an action only to those the API would let do it (the API checks again
/// when it is done).
pub fn may(s: &Session, method: Method, api_route: &str) -> bool {
    permissions::rule_for(&method, api_route)
        .is_some_and(|rule| permissions::allows(s.principal.role, rule.permission))
}

/// A time as people read it, UTC, to the second.
pub fn time(t: OffsetDateTime) -> Markup {
    let u = t.to_offset(time::UtcOffset::UTC);
    let shown = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        u.year(),
        u8::from(u.month()),
        u.day(),
        u.hour(),
        u.minute(),
        u.second()
    );
    let machine = t
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    html! { time datetime=(machine) { (shown) } }
}

/// How long ago, in the largest unit that fits.
pub fn ago(t: OffsetDateTime, now: OffsetDateTime) -> String {
    let s = (now - t).whole_seconds().max(0);
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A state as a badge; `kind` picks its colour (good, bad, busy, quiet).
pub fn badge(text: &str, kind: &str) -> Markup {
    html! { span class={"badge " (kind)} { (text) } }
}

/// An API refusal or failure shown in place of a page, with its status.
pub fn failure(session: Option<&Session>, current: &str, f: &ApiFailure) -> Response {
    let title = match f.status {
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::FORBIDDEN => "Not allowed",
        s if s.is_client_error() => "Refused",
        _ => "Something went wrong",
    };
    let body = html! { p.error role="alert" { (f.message) } };
    (f.status, page(title, current, session, body)).into_response()
}

/// A short form of a digest for a box; the whole one is its title.
pub fn short(d: &impl std::fmt::Display) -> String {
    let s = d.to_string();
    let hex = s.strip_prefix("sha256:").unwrap_or(&s);
    format!("sha256:{}…", &hex[..hex.len().min(12)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ago_picks_the_largest_unit_that_fits() {
        let now = time::macros::datetime!(2026-12-04 12:00 UTC);
        let cases = [
            (0, "0 s ago"),
            (59, "59 s ago"),
            (60, "1 min ago"),
            (3599, "59 min ago"),
            (7200, "2 h ago"),
            (3 * 86_400, "3 d ago"),
            // A clock ahead of ours reads as now, not negative.
            (-5, "0 s ago"),
        ];
        for (secs, want) in cases {
            let t = now - time::Duration::seconds(secs);
            assert_eq!(ago(t, now), want, "{secs} s");
        }
    }

    #[test]
    fn values_are_escaped() {
        let m = badge("<script>alert(1)</script>", "bad");
        let s = m.into_string();
        assert!(!s.contains("<script>"), "{s}");
        assert!(s.contains("&lt;script&gt;"), "{s}");
    }
}
