//! The console's pages, one module per section.

pub mod deployments;
mod fleet;
mod labelling;
mod models;
mod training;

use axum::routing::{get, post};
use axum::Router;

use super::Console;

pub fn routes() -> Router<Console> {
    Router::new()
        .route("/ui/fleet", get(fleet::devices))
        .route("/ui/bridges", get(fleet::bridges))
        .route("/ui/models", get(models::list))
        .route("/ui/models/{name}", get(models::show))
        .route("/ui/models/{name}/drift", get(models::drift))
        .route(
            "/ui/models/{name}/labelling",
            get(labelling::queue).post(labelling::save),
        )
        .route("/ui/pipelines", get(training::pipelines))
        .route("/ui/pipelines/{id}", get(training::pipeline))
        .route("/ui/jobs/{id}", get(training::job))
        .route("/ui/deployments", get(deployments::list))
        .route("/ui/deployments/{id}", get(deployments::show))
        .route("/ui/deployments/{id}/live", get(deployments::live))
        .route("/ui/deployments/{id}/cancel", post(deployments::cancel))
}

/// A query string from pairs, each value encoded.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if !v.is_empty() {
            s.append_pair(k, v);
        }
    }
    s.finish()
}

/// `path`, with a query string when any value is set.
pub fn with_query(path: &str, pairs: &[(&str, &str)]) -> String {
    match query(pairs) {
        q if q.is_empty() => path.to_string(),
        q => format!("{path}?{q}"),
    }
}

/// Whether a path segment taken from the URL is a plain id (`d-12`, a
/// device name): anything else goes no further than a 404.
pub fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}
