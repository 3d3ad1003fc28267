//! Key-range pagination, the same for every list: `limit` (1 to
//! [`MAX_LIMIT`]) and `after` (the previous page's [`NEXT_CURSOR`] header);
//! a page is read from its cursor to its end, never the whole list.

use axum::Json;

use edgeloop_errors::Error;

/// The most records one page holds.
pub const MAX_LIMIT: usize = 1000;
/// The longest cursor taken: keys are ids and names, far shorter.
pub const MAX_CURSOR_BYTES: usize = 1024;

pub use edgeloop_api::NEXT_CURSOR;

/// Up to `limit` records of `tree` below the cursor `after`, newest key
/// first, that `keep` accepts. `keep` may fail (it asks the store whether
/// the caller sees a record): the first error ends the page and is the
/// answer.
pub fn newest_first<V: serde::Serialize + serde::de::DeserializeOwned>(
    tree: &edgeloop_store::Tree<V>,
    after: Option<&str>,
    limit: usize,
    mut keep: impl FnMut(&V) -> Result<bool, Error>,
) -> Result<Vec<(String, V)>, Error> {
    let mut failed = None;
    let page = tree.page_before("", after, limit, |_, v| {
        failed.is_none()
            && keep(v).unwrap_or_else(|e| {
                failed = Some(e);
                false
            })
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(page),
    }
}

/// Checks a list's `limit` and `after`; the page size, every record when
/// `limit` is absent (lists that predate paging answer whole, as before).
pub fn limit_of(limit: Option<usize>, after: Option<&str>) -> Result<usize, Error> {
    if limit.is_some_and(|l| l == 0 || l > MAX_LIMIT) {
        return Err(Error::bad_field(
            "limit",
            format!("must be 1 to {MAX_LIMIT}"),
        ));
    }
    if after.is_some_and(|a| a.len() > MAX_CURSOR_BYTES) {
        return Err(Error::bad_field(
            "after",
            format!("a cursor is at most {MAX_CURSOR_BYTES} bytes"),
        ));
    }
    Ok(limit.unwrap_or(usize::MAX))
}

/// One page, and the header that finds the next (only when this page is
/// full: there may be more).
pub fn paged<T: serde::Serialize>(
    items: Vec<T>,
    last_key: Option<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let mut response = Json(items).into_response();
    if let Some(key) = last_key {
        if let Ok(v) = axum::http::HeaderValue::from_str(&key) {
            response
                .headers_mut()
                .insert(axum::http::HeaderName::from_static(NEXT_CURSOR), v);
        }
    }
    response
}

/// The items of a page and, when it is full, its last key as the cursor.
pub fn page_of<V, T: serde::Serialize>(
    page: Vec<(String, V)>,
    limit: usize,
    view: impl FnMut((String, V)) -> T,
) -> axum::response::Response {
    let last = (page.len() >= limit)
        .then(|| page.last().map(|(k, _)| k.clone()))
        .flatten();
    paged(page.into_iter().map(view).collect(), last)
}

/// [`page_of`] for views that may fail to build.
pub fn try_page_of<V, T: serde::Serialize>(
    page: Vec<(String, V)>,
    limit: usize,
    view: impl FnMut((String, V)) -> Result<T, Error>,
) -> Result<axum::response::Response, Error> {
    let last = (page.len() >= limit)
        .then(|| page.last().map(|(k, _)| k.clone()))
        .flatten();
    let items = page
        .into_iter()
        .map(view)
        .collect::<Result<Vec<T>, Error>>()?;
    Ok(paged(items, last))
}
