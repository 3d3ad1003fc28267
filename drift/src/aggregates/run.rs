//! The trigger tick's drift, folded window by window: the hysteresis state
//! and the drifting run after every window but the newest are kept
//! (`drift_runs`), so a tick judges only the windows that closed since the
//! last one, plus the newest: O(1) windows a tick, not O(windows).
//!
//! The fold is valid for one drift config and reference; another starts
//! over. A sketch that lands in a window older than the newest (a clock
//! set back, in tests; records from before receive times; a rebuild)
//! bumps the fold's generation, which discards it, and a tick saves its
//! fold only if the generation it read is still the one stored.
//!
//! Each closed window also keeps its point of the fold (`drift_fold_points`,
//! keyed like the window): the hysteresis state after it. The drift API's
//! range (`from`) starts from the point before its first window, so an
//! answer costs O(windows in the range), not O(retained windows).

use edgeloop_models::manifest::ReferenceStats;
use serde::{Deserialize, Serialize};

use super::windows::{ensure, prefix};
use super::{ordered, unordered};
use crate::analysis::{self, DriftConfig, WindowDrift};
use crate::hysteresis::{self, DriftState, Hysteresis};
use crate::Trees;
use edgeloop_errors::Result;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCache {
    /// Bumped by every write the fold has not seen.
    pub generation: u64,
    pub fold: Option<Fold>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fold {
    pub config: DriftConfig,
    /// Which reference statistics judged it (the manifest's digest).
    pub reference: String,
    /// The start of the last window folded.
    pub through: i64,
    pub state: DriftState,
    /// The drifting run: since (its first window's start) and severity.
    pub run: Option<(i64, f64)>,
}

/// The hysteresis state after one closed window, as a fold judged it;
/// valid while its fold's generation, config and reference are current.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FoldPoint {
    pub generation: u64,
    pub config: DriftConfig,
    pub reference: String,
    pub state: DriftState,
}

/// What the tick needs: the drifting run after the newest window, and the
/// newest window itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub run: Option<(i64, f64)>,
    pub newest: Option<WindowDrift>,
}

pub(super) fn key(model: &str, version: &str, window_seconds: i64) -> String {
    format!("{model}/{version}/{window_seconds:010}")
}

/// Discards the fold of `model`'s `version` at `window_seconds`.
pub(super) fn discard(
    store: &Trees,
    model: &str,
    version: &str,
    window_seconds: i64,
) -> Result<()> {
    store
        .drift_runs
        .update(&key(model, version, window_seconds), |c| {
            let c = c.unwrap_or_default();
            Ok::<_, ()>(RunCache {
                generation: c.generation + 1,
                fold: None,
            })
        })?
        .ok();
    Ok(())
}

/// The run after one more judged window `w` (whose `drifting` is set), as
/// `runner::drifting_run` reads it off a whole series.
fn extend(run: Option<(i64, f64)>, w: &WindowDrift) -> Option<(i64, f64)> {
    if !w.drifting {
        return None;
    }
    let severity = if w.over.is_some() { w.severity } else { 0.0 };
    Some(match run {
        Some((since, s)) => (since, f64::max(s, severity)),
        None => (w.start, f64::max(0.0, severity)),
    })
}

/// The drifting run and the newest window of `model`'s `version`, judged
/// against `reference` (named `reference_id`) with `config`.
pub fn observe(
    store: &Trees,
    reference: &ReferenceStats,
    reference_id: &str,
    model: &str,
    version: &str,
    config: &DriftConfig,
) -> Result<Observed> {
    let ws = config.window_seconds;
    ensure(store, model, version, ws)?;
    let k = key(model, version, ws);
    let cache = store.drift_runs.get(&k)?.unwrap_or_default();
    let fold = cache
        .fold
        .filter(|f| f.config == *config && f.reference == reference_id);
    let p = prefix(model, version, ws);
    let after = fold.as_ref().map(|f| format!("{p}{}", ordered(f.through)));
    let windows = store
        .drift_windows
        .page_after(&p, after.as_deref(), usize::MAX, |_, _| true)?;
    let h = Hysteresis {
        set_after: config.set_after,
        clear_after: config.clear_after,
    };
    let (mut state, mut run) = fold
        .as_ref()
        .map_or((DriftState::default(), None), |f| (f.state, f.run));
    let mut closed: Option<Fold> = None;
    let mut points = Vec::new();
    let mut newest = None;
    let n = windows.len();
    for (i, (wk, sum)) in windows.iter().enumerate() {
        let Some(start) = unordered(&wk[p.len()..]) else {
            continue;
        };
        let mut w = analysis::judge_sum(reference, start, sum, config);
        state = hysteresis::next(h, state, w.over);
        w.drifting = state.drifting;
        run = extend(run, &w);
        if i + 1 < n {
            points.push((wk, state));
        }
        if i + 2 == n {
            closed = Some(Fold {
                config: *config,
                reference: reference_id.to_string(),
                through: start,
                state,
                run,
            });
        }
        newest = Some(w);
    }
    if let Some(fold) = closed {
        // Only over the generation read: a late write since discards it.
        let saved = store.drift_runs.update(&k, |c| {
            let c = c.unwrap_or_default();
            if c.generation != cache.generation {
                return Err(());
            }
            Ok(RunCache {
                generation: c.generation,
                fold: Some(fold.clone()),
            })
        })?;
        match saved {
            Err(()) => tracing::debug!(model, version, "a late sketch discarded the drift fold"),
            // A point written after a later discard carries the old
            // generation, so readers ignore it.
            Ok(_) => {
                for (wk, state) in points {
                    let point = FoldPoint {
                        generation: cache.generation,
                        config: *config,
                        reference: reference_id.to_string(),
                        state,
                    };
                    store.drift_fold_points.insert(wk, &point)?;
                }
            }
        }
    }
    Ok(Observed {
        run: newest.as_ref().and(run),
        newest,
    })
}

/// The hysteresis state before `model`'s `version`'s window at `start`,
/// judged with `config` against `reference` (named `reference_id`): the
/// default when no window precedes it, else the kept fold's point of the
/// window before, folding first if the points are stale. `None` when they
/// stay stale (another config than the tick's, or a write raced the
/// fold): the caller folds from the first window.
pub fn state_before(
    store: &Trees,
    reference: &ReferenceStats,
    reference_id: &str,
    model: &str,
    version: &str,
    config: &DriftConfig,
    start: i64,
) -> Result<Option<DriftState>> {
    let ws = config.window_seconds;
    ensure(store, model, version, ws)?;
    let p = prefix(model, version, ws);
    let Some((before, _)) = store
        .drift_windows
        .last_in_range(&p, &format!("{p}{}", ordered(start)))?
    else {
        return Ok(Some(DriftState::default()));
    };
    let k = key(model, version, ws);
    let read = || -> Result<Option<DriftState>> {
        let generation = store.drift_runs.get(&k)?.unwrap_or_default().generation;
        Ok(store
            .drift_fold_points
            .get(&before)?
            .filter(|pt| {
                pt.generation == generation && pt.config == *config && pt.reference == reference_id
            })
            .map(|pt| pt.state))
    };
    if let Some(state) = read()? {
        return Ok(Some(state));
    }
    observe(store, reference, reference_id, model, version, config)?;
    read()
}
