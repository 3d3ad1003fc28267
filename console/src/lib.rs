//! The web console at `/ui/` (issue #18): server-rendered pages over the
//! console API, for people who would rather look than read JSON.
//!
//! - Pages read and act through the console API itself, in-process, as
//!   the logged-in token (`api.rs`): what a page shows and what a button
//!   does is what the API shows and does for that token, with the same
//!   roles, scopes, validation and audit log.
//! - A person logs in with an API token once; the browser keeps a session
//!   cookie, never the token (`session.rs`). Every form that changes
//!   something carries the session's CSRF secret.
//! - The assets (one stylesheet, one small script of our own) are compiled
//!   into the binary: nothing is fetched from anywhere else, and the
//!   Content-Security-Policy says so to the browser.

pub mod api;
pub mod chart;
pub mod html;
mod pages;
pub mod session;
mod trees;

pub use trees::Trees;

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use maud::html;

use time::OffsetDateTime;

use edgeloop_errors::Error;
use session::Session;

/// What the console needs of the server that serves it. Everything else a
/// page shows or does goes through the console API (`api.rs`).
pub trait Host: Send + Sync + 'static {
    /// The server's clock (a test's manual clock included).
    fn now(&self) -> OffsetDateTime;
    /// Whether `presented` is the data dir's bootstrap admin token.
    fn is_admin_token(&self, presented: &str) -> bool;
    /// The sessions.
    fn sessions(&self) -> &Trees;
    /// The API tokens a session stands for.
    fn tokens(&self) -> &edgeloop_auth::Trees;
    /// Whether the console is served over TLS: cookies are then `Secure`.
    fn over_tls(&self) -> bool;
    /// Counts a refused login for `/metrics`.
    fn count_unauthenticated(&self);
}

/// What every console handler is given.
#[derive(Clone)]
pub struct Console {
    pub host: Arc<dyn Host>,
    pub api: api::Api,
}

/// The console's routes; `api` is the console API's router, which the
/// pages call in-process.
pub fn router(host: Arc<dyn Host>, api: Router) -> Router {
    let console = Console {
        host,
        api: api::Api::new(api),
    };
    Router::new()
        .route("/ui", get(home))
        .route("/ui/", get(home))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/assets/{name}", get(asset))
        .merge(pages::routes())
        .layer(middleware::from_fn(security_headers))
        .with_state(console)
}

/// The browser may load and send only this origin's own resources; no
/// page may frame the console (clickjacking a Cancel button).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // Pages show live state and who is logged in: never from a cache.
    h.entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    res
}

impl Console {
    /// The request's live session, or the answer that sends the browser to
    /// the login page (and back to `here` afterwards).
    pub async fn session(&self, headers: &HeaderMap, here: &str) -> Result<Session, Response> {
        let found = match session::cookie_value(headers) {
            Some(id) => {
                let host = self.host.clone();
                tokio::task::spawn_blocking(move || session::lookup(&*host, &id))
                    .await
                    .map_err(|e| Error::Internal(e.into()).into_response())?
                    .map_err(IntoResponse::into_response)?
            }
            None => None,
        };
        found.ok_or_else(|| to_login(here))
    }

    /// [`Console::session`] for a form that changes something: the form's
    /// CSRF value must be the session's, or the answer is 403.
    pub async fn acting_session(
        &self,
        headers: &HeaderMap,
        here: &str,
        csrf: &str,
    ) -> Result<Session, Response> {
        let s = self.session(headers, here).await?;
        if !session::csrf_matches(&s, csrf) {
            return Err((
                StatusCode::FORBIDDEN,
                html::page(
                    "Not allowed",
                    "",
                    Some(&s),
                    html! { p.error role="alert" { "This form has expired (its security token does not match your session). Reload the page and try again." } },
                ),
            )
                .into_response());
        }
        Ok(s)
    }

    /// An API answer's body for a page, or the page that shows the API's
    /// refusal or failure in `section`.
    pub async fn get<T: serde::de::DeserializeOwned>(
        &self,
        s: &Session,
        path: &str,
        section: &str,
    ) -> Result<T, Response> {
        self.api
            .get::<T>(&s.principal, path)
            .await
            .map(|a| a.body)
            .map_err(|f| html::failure(Some(s), section, &f))
    }

    pub fn secure_cookies(&self) -> bool {
        self.host.over_tls()
    }
}

fn to_login(here: &str) -> Response {
    let next = form_urlencoded::byte_serialize(here.as_bytes()).collect::<String>();
    redirect(&format!("/ui/login?next={next}"))
}

/// A 303: after a form, the browser GETs the next page.
pub fn redirect(to: &str) -> Response {
    match HeaderValue::from_str(to) {
        Ok(v) => (StatusCode::SEE_OTHER, [(LOCATION, v)]).into_response(),
        Err(_) => (StatusCode::SEE_OTHER, [(LOCATION, "/ui/fleet")]).into_response(),
    }
}

/// Where to go after login: only a console path, so a crafted link cannot
/// send a person who logs in to another site.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n) if n.starts_with("/ui/") && !n.starts_with("//") && !n.contains('\\') => n,
        _ => "/ui/fleet",
    }
}

async fn home() -> Response {
    redirect("/ui/fleet")
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    next: Option<String>,
}

async fn login_page(axum::extract::Query(q): axum::extract::Query<LoginQuery>) -> Response {
    login_form(StatusCode::OK, safe_next(q.next.as_deref()), None)
}

fn login_form(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let body = html! {
        @if let Some(e) = error {
            p.error role="alert" { (e) }
        }
        form.login method="post" action="/ui/login" {
            input type="hidden" name="next" value=(next);
            label for="token" { "API token" }
            input #token type="password" name="token" autocomplete="off" required autofocus;
            p.hint { "An API token from " code { "edgeloop api-token create" } " or the data dir's admin token. The browser keeps a session, not the token." }
            button type="submit" { "Log in" }
        }
    };
    (status, html::page("Log in", "", None, body)).into_response()
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

async fn login(State(c): State<Console>, Form(f): Form<LoginForm>) -> Response {
    let next = safe_next(f.next.as_deref()).to_string();
    if f.token.trim().is_empty() || f.token.len() > 512 {
        return login_form(
            StatusCode::BAD_REQUEST,
            &next,
            Some("token: paste an API token"),
        );
    }
    let host = c.host.clone();
    let started = tokio::task::spawn_blocking(move || session::login(&*host, &f.token)).await;
    match started {
        Ok(Ok(Some(id))) => {
            let mut res = redirect(&next);
            if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id, c.secure_cookies())) {
                res.headers_mut().insert(SET_COOKIE, v);
            }
            res
        }
        Ok(Ok(None)) => {
            c.host.count_unauthenticated();
            login_form(
                StatusCode::UNAUTHORIZED,
                &next,
                Some("That token is not valid: unknown, expired or revoked."),
            )
        }
        Ok(Err(e)) => e.into_response(),
        Err(e) => Error::Internal(e.into()).into_response(),
    }
}

/// A form that changes something and carries nothing but its CSRF value.
#[derive(serde::Deserialize)]
pub(crate) struct CsrfForm {
    pub csrf: String,
}

async fn logout(State(c): State<Console>, headers: HeaderMap, Form(f): Form<CsrfForm>) -> Response {
    if let Err(res) = c.acting_session(&headers, "/ui/fleet", &f.csrf).await {
        return res;
    }
    if let Some(id) = session::cookie_value(&headers) {
        let host = c.host.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || session::logout(&*host, &id)).await
        {
            return e.into_response();
        }
    }
    let mut res = redirect("/ui/login");
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie(c.secure_cookies())) {
        res.headers_mut().insert(SET_COOKIE, v);
    }
    res
}

/// The console's own stylesheet and script, compiled in.
async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "console.css" => (
            include_str!("assets/console.css"),
            "text/css; charset=utf-8",
        ),
        "console.js" => (
            include_str!("assets/console.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => return (StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    (
        [(CONTENT_TYPE, kind), (CACHE_CONTROL, "public, max-age=300")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_goes_back_only_to_a_console_page() {
        let cases = [
            (None, "/ui/fleet"),
            (Some("/ui/deployments/d-1"), "/ui/deployments/d-1"),
            (Some("https://evil.example/"), "/ui/fleet"),
            (Some("//evil.example/ui/"), "/ui/fleet"),
            (Some("/ui/\\evil"), "/ui/fleet"),
            (Some("/api/v1/devices"), "/ui/fleet"),
        ];
        for (next, want) in cases {
            assert_eq!(safe_next(next), want, "{next:?}");
        }
    }
}
