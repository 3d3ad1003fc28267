//! Window sums of sketches, kept as each sketch is stored: per model
//! version and window size, one record per window (`drift_windows`,
//! `<model>/<version>/<window_seconds>/<start>`) and one per window and
//! device (`drift_window_devices`, the same key then `/<device>`), whose
//! first write counts the device in the window's distinct devices.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock};

use edgeloop_models::manifest::ReferenceStats;
use time::OffsetDateTime;

use super::{clear, is_current, ordered, set_current, unordered};
use crate::analysis::{self, DriftConfig, DriftSeries, WindowSum};
use crate::records::SketchRecord;
use crate::Trees;
use edgeloop_errors::Result;

/// Writers (a sketch and its sums) share it; a rebuild holds it alone, so
/// no sketch is stored between its scan and its mark.
static WRITERS: RwLock<()> = RwLock::new(());

fn mark(model: &str, version: &str, window_seconds: i64) -> String {
    format!("windows/{model}/{version}/{window_seconds:010}")
}

pub(super) fn prefix(model: &str, version: &str, window_seconds: i64) -> String {
    format!("{model}/{version}/{window_seconds:010}/")
}

/// The window sizes kept for `model`'s `version`.
fn kept(store: &Trees, model: &str, version: &str) -> Result<Vec<i64>> {
    let mut sizes = Vec::new();
    for (key, m) in store
        .agg_marks
        .scan_prefix(&format!("windows/{model}/{version}/"))?
    {
        if m == super::current() {
            if let Some(ws) = key.rsplit('/').next().and_then(|s| s.parse().ok()) {
                sizes.push(ws);
            }
        }
    }
    Ok(sizes)
}

/// Stores sketch `s` under `key` and adds it to its version's window sums.
/// A sketch already stored (a report retried after a crash) is not added
/// twice.
pub fn store_sketch(store: &Trees, key: &str, s: &SketchRecord) -> Result<()> {
    let _writer = WRITERS.read().unwrap_or_else(PoisonError::into_inner);
    let fresh = !store.sketches.contains(key)?;
    store.sketches.insert(key, s)?;
    if !fresh {
        return Ok(());
    }
    for ws in kept(store, &s.model_name, &s.model_version)? {
        if let Err(e) = add(store, ws, key, s) {
            tracing::warn!(error = %e, "adding a sketch to its window; the sums are rebuilt");
            super::invalidate(store, &mark(&s.model_name, &s.model_version, ws));
        }
    }
    Ok(())
}

fn add(store: &Trees, ws: i64, key: &str, s: &SketchRecord) -> Result<()> {
    let Some(start) = analysis::window_start(s, ws) else {
        return Ok(());
    };
    let p = prefix(&s.model_name, &s.model_version, ws);
    let window = format!("{p}{}", ordered(start));
    let mut new_device = false;
    store
        .drift_window_devices
        .update(&format!("{window}/{}", s.device), |old| {
            new_device = old.is_none();
            let mut w = old.unwrap_or_default();
            w.devices = 1;
            w.add_sketch(key, s);
            Ok::<_, ()>(w)
        })?
        .ok();
    store
        .drift_windows
        .update(&window, |old| {
            let mut w = old.unwrap_or_default();
            w.devices += u64::from(new_device);
            w.add_sketch(key, s);
            Ok::<_, ()>(w)
        })?
        .ok();
    // A window before the newest changed: the tick's fold has seen it.
    if let Some((newest, _)) = store.drift_windows.last_with_prefix(&p)? {
        if newest > window {
            super::run::discard(store, &s.model_name, &s.model_version, ws)?;
        }
    }
    Ok(())
}

/// Builds the sums of `model`'s `version` for `window_seconds` from the
/// stored sketches, unless this process already keeps them.
pub fn ensure(store: &Trees, model: &str, version: &str, window_seconds: i64) -> Result<()> {
    let m = mark(model, version, window_seconds);
    if is_current(store, &m)? {
        return Ok(());
    }
    let _alone = WRITERS.write().unwrap_or_else(PoisonError::into_inner);
    if is_current(store, &m)? {
        return Ok(());
    }
    let p = prefix(model, version, window_seconds);
    clear(&store.drift_windows, &p)?;
    clear(&store.drift_window_devices, &p)?;
    clear(&store.drift_fold_points, &p)?;
    // Sketch keys are device-major, so one device's sums are whole (and
    // written) before the next device's begin.
    let mut all: BTreeMap<i64, WindowSum> = BTreeMap::new();
    let mut device: Option<String> = None;
    let mut own: BTreeMap<i64, WindowSum> = BTreeMap::new();
    let write_own = |device: &str, own: &mut BTreeMap<i64, WindowSum>| -> Result<()> {
        for (start, w) in std::mem::take(own) {
            let k = format!("{p}{}/{device}", ordered(start));
            store.drift_window_devices.insert(&k, &w)?;
        }
        Ok(())
    };
    let scan = format!("{model}/{version}/");
    let mut after: Option<String> = None;
    let mut sketches = 0u64;
    loop {
        let page = store
            .sketches
            .page_after(&scan, after.as_deref(), 1024, |_, _| true)?;
        let Some((last, _)) = page.last() else {
            break;
        };
        after = Some(last.clone());
        for (key, s) in &page {
            sketches += 1;
            if device.as_deref() != Some(s.device.as_str()) {
                if let Some(d) = &device {
                    write_own(d, &mut own)?;
                }
                device = Some(s.device.clone());
            }
            let Some(start) = analysis::window_start(s, window_seconds) else {
                continue;
            };
            if !own.contains_key(&start) {
                // The device's first sketch in the window.
                all.entry(start).or_default().devices += 1;
            }
            let mine = own.entry(start).or_insert_with(|| WindowSum {
                devices: 1,
                ..WindowSum::default()
            });
            mine.add_sketch(key, s);
            all.entry(start).or_default().add_sketch(key, s);
        }
    }
    if let Some(d) = &device {
        write_own(d, &mut own)?;
    }
    for (start, w) in &all {
        store
            .drift_windows
            .insert(&format!("{p}{}", ordered(*start)), w)?;
    }
    super::run::discard(store, model, version, window_seconds)?;
    set_current(store, &m)?;
    tracing::info!(
        model,
        version,
        window_seconds,
        sketches,
        windows = all.len(),
        "rebuilt the drift window sums"
    );
    Ok(())
}

/// Every window's sum over all devices, by start.
pub fn all_windows(
    store: &Trees,
    model: &str,
    version: &str,
    window_seconds: i64,
) -> Result<BTreeMap<i64, WindowSum>> {
    ensure(store, model, version, window_seconds)?;
    let p = prefix(model, version, window_seconds);
    Ok(store
        .drift_windows
        .scan_prefix(&p)?
        .into_iter()
        .filter_map(|(k, w)| Some((unordered(&k[p.len()..])?, w)))
        .collect())
}

/// Each window's sums per group (`group_of` a device; `None`: `all`), from
/// the per-device sums merged in device order.
pub fn grouped_windows(
    store: &Trees,
    model: &str,
    version: &str,
    window_seconds: i64,
    group_of: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, BTreeMap<i64, WindowSum>>> {
    ensure(store, model, version, window_seconds)?;
    let p = prefix(model, version, window_seconds);
    // Keys are start-major; merge in device order, as the scan folds.
    let mut per: BTreeMap<(String, i64), BTreeMap<String, WindowSum>> = BTreeMap::new();
    for (k, w) in store.drift_window_devices.scan_prefix(&p)? {
        let Some((start, device)) = k[p.len()..].split_once('/') else {
            continue;
        };
        let Some(start) = unordered(start) else {
            continue;
        };
        let group = group_of(device).unwrap_or_else(|| "all".into());
        per.entry((group, start))
            .or_default()
            .insert(device.to_string(), w);
    }
    let mut out: BTreeMap<String, BTreeMap<i64, WindowSum>> = BTreeMap::new();
    for ((group, start), devices) in per {
        let sum = out.entry(group).or_default().entry(start).or_default();
        for w in devices.values() {
            sum.merge(w);
        }
    }
    Ok(out)
}

/// Maps a device to its group (`None`: `all`).
pub type GroupOf<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The drift series of `model`'s `version` from the kept sums: all devices
/// in one series, or grouped by `group_of`.
pub fn series(
    store: &Trees,
    reference: &ReferenceStats,
    model: &str,
    version: &str,
    config: &DriftConfig,
    group_of: Option<GroupOf<'_>>,
) -> Result<Vec<DriftSeries>> {
    let groups = match group_of {
        Some(g) => grouped_windows(store, model, version, config.window_seconds, g)?,
        None => {
            let all = all_windows(store, model, version, config.window_seconds)?;
            if all.is_empty() {
                BTreeMap::new()
            } else {
                BTreeMap::from([("all".to_string(), all)])
            }
        }
    };
    Ok(analysis::analyze_sums(reference, &groups, config))
}

/// Which windows an answer covers, by start: from the window holding
/// `from` (when set) up to those starting before `until` (when set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Range {
    pub from: Option<i64>,
    pub until: Option<i64>,
}

impl Range {
    /// The start of the first window in the range.
    pub fn first_start(&self, window_seconds: i64) -> Option<i64> {
        self.from.map(|t| t - t.rem_euclid(window_seconds.max(1)))
    }

    pub fn holds(&self, start: i64, window_seconds: i64) -> bool {
        self.first_start(window_seconds).is_none_or(|f| start >= f)
            && self.until.is_none_or(|u| start < u)
    }

    /// Keeps only the windows in the range, in every series.
    pub fn keep(&self, series: &mut Vec<DriftSeries>, window_seconds: i64) {
        for s in series.iter_mut() {
            s.windows.retain(|w| self.holds(w.start, window_seconds));
        }
        series.retain(|s| !s.windows.is_empty());
    }
}

/// The all-devices series of `model`'s `version` over `range`, from the
/// kept sums: reads only the windows in the range, and starts their
/// hysteresis at the kept fold's state before the first
/// (`run::state_before`), so its cost does not grow with history. With
/// another config than the fold's it folds from the first window, as a
/// whole answer does.
#[allow(clippy::too_many_arguments)]
pub fn series_in(
    store: &Trees,
    reference: &ReferenceStats,
    reference_id: &str,
    model: &str,
    version: &str,
    config: &DriftConfig,
    range: Range,
) -> Result<Vec<DriftSeries>> {
    let ws = config.window_seconds;
    let Some(first) = range.first_start(ws) else {
        let mut series = series(store, reference, model, version, config, None)?;
        range.keep(&mut series, ws);
        return Ok(series);
    };
    ensure(store, model, version, ws)?;
    let p = prefix(model, version, ws);
    let end = range.until.map(|u| format!("{p}{}", ordered(u)));
    let mut after = store
        .drift_windows
        .last_in_range(&p, &format!("{p}{}", ordered(first)))?
        .map(|(k, _)| k);
    let mut windows = BTreeMap::new();
    'pages: loop {
        let page = store
            .drift_windows
            .page_after(&p, after.as_deref(), 256, |_, _| true)?;
        let full = page.len() == 256;
        for (k, w) in page {
            if end.as_ref().is_some_and(|e| k >= *e) {
                break 'pages;
            }
            if let Some(start) = unordered(&k[p.len()..]) {
                windows.insert(start, w);
            }
            after = Some(k);
        }
        if !full {
            break;
        }
    }
    let Some(&first_held) = windows.keys().next() else {
        return Ok(Vec::new());
    };
    match super::run::state_before(
        store,
        reference,
        reference_id,
        model,
        version,
        config,
        first_held,
    )? {
        Some(initial) => {
            let groups = BTreeMap::from([("all".to_string(), windows)]);
            Ok(analysis::analyze_sums_from(
                reference, &groups, config, initial,
            ))
        }
        None => {
            let mut series = series(store, reference, model, version, config, None)?;
            range.keep(&mut series, ws);
            Ok(series)
        }
    }
}

/// Drops the window sums whose whole window is older than `max_age` (the
/// sketch retention: their sketches are gone). Returns how many windows.
pub fn prune(store: &Trees, now: OffsetDateTime, max_age: time::Duration) -> Result<u64> {
    let cutoff = (now - max_age).unix_timestamp();
    let mut dropped = 0;
    for (key, _) in store.agg_marks.scan_prefix("windows/")? {
        let Some(rest) = key.strip_prefix("windows/") else {
            continue;
        };
        let Some(ws) = rest.rsplit('/').next().and_then(|s| s.parse::<i64>().ok()) else {
            continue;
        };
        let p = format!("{rest}/");
        let ended = |k: &str| {
            k[p.len()..]
                .split('/')
                .next()
                .and_then(unordered)
                .is_some_and(|start| start.saturating_add(ws) <= cutoff)
        };
        dropped += drop_while(&store.drift_windows, &p, ended)?;
        drop_while(&store.drift_window_devices, &p, ended)?;
        drop_while(&store.drift_fold_points, &p, ended)?;
    }
    Ok(dropped)
}

fn drop_while<V: serde::Serialize + serde::de::DeserializeOwned>(
    tree: &edgeloop_store::Tree<V>,
    prefix: &str,
    ended: impl Fn(&str) -> bool,
) -> Result<u64> {
    let mut dropped = 0;
    loop {
        let batch = tree.first_with_prefix(prefix, 1024)?;
        let n = batch.len();
        for (k, _) in &batch {
            if !ended(k) {
                return Ok(dropped);
            }
            tree.remove(k)?;
            dropped += 1;
        }
        if n < 1024 {
            return Ok(dropped);
        }
    }
}
