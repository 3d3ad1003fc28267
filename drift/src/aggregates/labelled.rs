//! The labelled samples, indexed as they are stored, labelled and dropped:
//!
//! - `label_requests` (`<model>/<device>/<request id>`): the labelled
//!   samples of one request, by key. The first (oldest key) is the one
//!   that counts, as the full scan's dedup kept the first in key order.
//! - `label_index` (`<model>/<time>/<sample key>`): the counted ones by
//!   when they were received; `label_hours` (`<model>/<hour>`) counts them
//!   per hour, and `<model>#total` all of them, so "labels since the last
//!   retrain" reads one total, or the hours since and the rest of one hour.
//! - `accuracy_index` (`<model>/<version>/<time>/<sample key>` → correct):
//!   the counted ones that carry a predicted class, newest last; online
//!   accuracy reads the newest `accuracy_window` of them.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{clear, is_current, ordered, set_current, unordered};
use crate::analysis::LabelledRow;
use crate::records::SampleRecord;
use crate::Trees;
use edgeloop_errors::Result;

/// Index changes read and write several keys; one at a time (labels arrive
/// far more rarely than sketches).
static INDEX: Mutex<()> = Mutex::new(());

const HOUR: i64 = 3600;

/// One labelled sample of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelledSample {
    pub key: String,
    /// Its time as an index key part ([`time_key`]).
    pub at: String,
    pub version: String,
    pub predicted: Option<i64>,
    pub label: i64,
}

fn mark(model: &str) -> String {
    format!("labels/{model}")
}

/// Sorts like `Option<OffsetDateTime>` (no time first): seconds, then
/// nanoseconds.
fn time_key(at: Option<OffsetDateTime>) -> String {
    match at {
        None => "0".repeat(29),
        Some(t) => format!("{}{:09}", ordered(t.unix_timestamp()), t.nanosecond()),
    }
}

fn seconds_of(time_key: &str) -> Option<i64> {
    let s = unordered(time_key.get(..20)?)?;
    (s != i64::MIN).then_some(s)
}

fn hour_key(model: &str, seconds: Option<i64>) -> String {
    let h = seconds.map_or(i64::MIN, |s| s - s.rem_euclid(HOUR));
    format!("{model}/{}", ordered(h))
}

/// All of `model`'s counted labels (outside the `<model>/` hours).
fn total_key(model: &str) -> String {
    format!("{model}#total")
}

fn request_key(model: &str, r: &SampleRecord) -> String {
    format!("{model}/{}/{}", r.device, r.request_id)
}

fn entry(key: &str, r: &SampleRecord, label: i64) -> LabelledSample {
    LabelledSample {
        key: key.to_string(),
        at: time_key(r.at()),
        version: r.model_version.clone(),
        predicted: r.predicted_class,
        label,
    }
}

fn count(model: &str, e: &LabelledSample, store: &Trees) -> Result<()> {
    if store
        .label_index
        .insert_new(&format!("{model}/{}/{}", e.at, e.key), &())?
    {
        for k in [hour_key(model, seconds_of(&e.at)), total_key(model)] {
            store
                .label_hours
                .update(&k, |n| Ok::<_, ()>(n.unwrap_or(0) + 1))?
                .ok();
        }
    }
    if let Some(p) = e.predicted {
        store.accuracy_index.insert(
            &format!("{model}/{}/{}/{}", e.version, e.at, e.key),
            &(p == e.label),
        )?;
    }
    Ok(())
}

fn uncount(model: &str, e: &LabelledSample, store: &Trees) -> Result<()> {
    if store
        .label_index
        .remove(&format!("{model}/{}/{}", e.at, e.key))?
        .is_some()
    {
        for k in [hour_key(model, seconds_of(&e.at)), total_key(model)] {
            let left = store
                .label_hours
                .update(&k, |n| Ok::<_, ()>(n.unwrap_or(0).saturating_sub(1)))?;
            if left == Ok(0) {
                store.label_hours.remove_if_eq(&k, &0)?;
            }
        }
    }
    store
        .accuracy_index
        .remove(&format!("{model}/{}/{}/{}", e.version, e.at, e.key))?;
    Ok(())
}

/// Indexes sample `r`, stored under `key`, if it has a label (called after
/// it is stored or labelled).
pub fn on_labelled(store: &Trees, key: &str, r: &SampleRecord) -> Result<()> {
    if r.label.is_none() {
        return Ok(());
    }
    let model = &r.model_name;
    let _one = INDEX.lock().unwrap_or_else(PoisonError::into_inner);
    // Not kept (yet) in this process: the rebuild reads the sample.
    if !is_current(store, &mark(model))? {
        return Ok(());
    }
    // Read again under the lock: of two labellings racing, the index ends
    // with the one stored last.
    let Some(r) = store.samples.get(key)? else {
        return Ok(());
    };
    let Some(label) = r.label else {
        return Ok(());
    };
    let e = entry(key, &r, label);
    if let Err(err) = labelled(store, model, &request_key(model, &r), e) {
        tracing::warn!(error = %err, "indexing a label; the index is rebuilt");
        super::invalidate(store, &mark(model));
    }
    Ok(())
}

fn labelled(store: &Trees, model: &str, request: &str, e: LabelledSample) -> Result<()> {
    let mut samples = store.label_requests.get(request)?.unwrap_or_default();
    let old_first = samples.first().cloned();
    match samples.binary_search_by(|s| s.key.cmp(&e.key)) {
        Ok(i) => samples[i] = e,
        Err(i) => samples.insert(i, e),
    }
    store.label_requests.insert(request, &samples)?;
    let first = &samples[0];
    if old_first.as_ref() != Some(first) {
        if let Some(old) = &old_first {
            uncount(model, old, store)?;
        }
    }
    count(model, first, store)
}

/// Takes sample `r`, just removed from under `key`, out of the indexes.
pub fn on_removed(store: &Trees, key: &str, r: &SampleRecord) -> Result<()> {
    if r.label.is_none() {
        return Ok(());
    }
    let model = &r.model_name;
    let _one = INDEX.lock().unwrap_or_else(PoisonError::into_inner);
    if !is_current(store, &mark(model))? {
        return Ok(());
    }
    if let Err(err) = removed(store, model, &request_key(model, r), key) {
        tracing::warn!(error = %err, "unindexing a label; the index is rebuilt");
        super::invalidate(store, &mark(model));
    }
    Ok(())
}

fn removed(store: &Trees, model: &str, request: &str, key: &str) -> Result<()> {
    let mut samples = store.label_requests.get(request)?.unwrap_or_default();
    let Ok(i) = samples.binary_search_by(|s| s.key.as_str().cmp(key)) else {
        return Ok(());
    };
    let gone = samples.remove(i);
    if i == 0 {
        uncount(model, &gone, store)?;
        if let Some(next) = samples.first() {
            count(model, next, store)?;
        }
    }
    if samples.is_empty() {
        store.label_requests.remove(request)?;
    } else {
        store.label_requests.insert(request, &samples)?;
    }
    Ok(())
}

/// Builds `model`'s label indexes from its samples, unless this process
/// already keeps them.
pub fn ensure(store: &Trees, model: &str) -> Result<()> {
    let m = mark(model);
    if is_current(store, &m)? {
        return Ok(());
    }
    let _one = INDEX.lock().unwrap_or_else(PoisonError::into_inner);
    if is_current(store, &m)? {
        return Ok(());
    }
    let p = format!("{model}/");
    clear(&store.label_requests, &p)?;
    clear(&store.label_index, &p)?;
    clear(&store.label_hours, &p)?;
    store.label_hours.remove(&total_key(model))?;
    clear(&store.accuracy_index, &p)?;
    let mut requests: BTreeMap<String, Vec<LabelledSample>> = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        // Small pages: samples carry their inputs.
        let page = store
            .samples
            .page_after(&p, after.as_deref(), 256, |_, _| true)?;
        let Some((last, _)) = page.last() else {
            break;
        };
        after = Some(last.clone());
        for (key, r) in &page {
            if let Some(label) = r.label {
                // Key order: each request's list comes out sorted.
                requests
                    .entry(request_key(model, r))
                    .or_default()
                    .push(entry(key, r, label));
            }
        }
    }
    let n = requests.len();
    for (request, samples) in requests {
        store.label_requests.insert(&request, &samples)?;
        count(model, &samples[0], store)?;
    }
    set_current(store, &m)?;
    tracing::info!(model, requests = n, "rebuilt the label indexes");
    Ok(())
}

/// Labelled requests of `model` received after `since` (unix seconds; all
/// of them when `None`).
pub fn labels_since(store: &Trees, model: &str, since: Option<i64>) -> Result<u64> {
    ensure(store, model)?;
    let p = format!("{model}/");
    let Some(since) = since else {
        return Ok(store.label_hours.get(&total_key(model))?.unwrap_or(0));
    };
    // Whole hours after the one `since` is in...
    let hour = since - since.rem_euclid(HOUR);
    let mut n: u64 = store
        .label_hours
        .page_after(
            &p,
            Some(&hour_key(model, Some(hour))),
            usize::MAX,
            |_, _| true,
        )?
        .into_iter()
        .map(|(_, n)| n)
        .sum();
    // ...and the rest of that hour, one by one.
    let mut after = format!("{p}{}", ordered(since.saturating_add(1)));
    loop {
        let page = store
            .label_index
            .page_after(&p, Some(&after), 1024, |_, _| true)?;
        let len = page.len();
        for (k, ()) in &page {
            if seconds_of(&k[p.len()..]).is_none_or(|s| s >= hour + HOUR) {
                return Ok(n);
            }
            n += 1;
        }
        match page.last() {
            Some((k, _)) if len == 1024 => after = k.clone(),
            _ => return Ok(n),
        }
    }
}

/// Top-1 accuracy (0..1) of the newest `window` labelled predictions of
/// `model`'s `version`, once there are at least `min`.
pub fn online_accuracy(
    store: &Trees,
    model: &str,
    version: &str,
    window: usize,
    min: usize,
) -> Result<Option<f64>> {
    ensure(store, model)?;
    // A page of exactly the window, newest first: no read past it.
    let recent: Vec<bool> = store
        .accuracy_index
        .page_before(&format!("{model}/{version}/"), None, window, |_, _| true)?
        .into_iter()
        .map(|(_, correct)| correct)
        .collect();
    if recent.len() < min.max(1) {
        return Ok(None);
    }
    let hits = recent.iter().filter(|c| **c).count();
    Ok(Some(hits as f64 / recent.len() as f64))
}

/// `model`'s `version`'s labelled predictions (those counted, with a time)
/// received at or after `from` (unix seconds), oldest first, for the drift
/// API's accuracy per window: it reads from the first window on, not every
/// labelled sample kept.
pub fn rows(
    store: &Trees,
    model: &str,
    version: &str,
    from: Option<i64>,
) -> Result<Vec<LabelledRow>> {
    ensure(store, model)?;
    let p = format!("{model}/{version}/");
    // Keys of the second before `from` extend this and sort after it, as
    // do all later ones: a second too many, never one too few.
    let after = from.map(|f| format!("{p}{}", ordered(f.saturating_sub(1))));
    Ok(store
        .accuracy_index
        .page_after(&p, after.as_deref(), usize::MAX, |_, _| true)?
        .into_iter()
        .filter_map(|(k, correct)| {
            let (at, sample) = k[p.len()..].split_once('/')?;
            // The sample key: <model>/<version>/<device>/<sequence>/<index>.
            let device = sample.split('/').nth(2)?;
            Some(LabelledRow {
                device: device.to_string(),
                at: seconds_of(at)?,
                correct,
            })
        })
        .collect())
}
