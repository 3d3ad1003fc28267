//! Drift series: the agents' sketches of one model version, summed per
//! time window (and per device group), compared with the manifest's
//! reference statistics, with the hysteresis state after each window. A
//! pure function of its inputs; the handler reads the store.

use std::collections::BTreeMap;

use edgeloop_models::manifest::ReferenceStats;
use serde::{Deserialize, Serialize};

use super::hysteresis::{self, DriftState, Hysteresis};
use super::stats;
use crate::records::SketchRecord;
use edgeloop_errors::device_counts::Adder;

/// The thresholds and the series are what the console API shows.
pub use edgeloop_api::drift::{DriftConfig, DriftLevel, DriftSeries, FeatureDrift, WindowDrift};

/// Checks thresholds; errors name the field, after `prefix`.
pub fn validate(c: &DriftConfig, prefix: &str) -> Result<(), edgeloop_errors::Error> {
    use edgeloop_errors::Error;
    let field = |f: &str| format!("{prefix}{f}");
    // Down to a second: a replay (the demo) compresses days into seconds.
    if !(1..=30 * 86_400).contains(&c.window_seconds) {
        return Err(Error::bad_field(
            field("window_seconds"),
            "must be 1 to 2592000",
        ));
    }
    for (f, v) in [
        ("psi_watch", c.psi_watch),
        ("psi_act", c.psi_act),
        ("js_act", c.js_act),
        ("ks_alpha", c.ks_alpha),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(Error::bad_field(field(f), "must be a positive number"));
        }
    }
    if c.psi_watch > c.psi_act {
        return Err(Error::bad_field(
            field("psi_watch"),
            "must not exceed psi_act",
        ));
    }
    if c.set_after == 0 || c.clear_after == 0 {
        return Err(Error::bad_field(
            field("set_after"),
            "windows must be at least 1",
        ));
    }
    Ok(())
}

/// One prediction that got a label.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledRow {
    pub device: String,
    /// Unix seconds of the prediction.
    pub at: i64,
    pub correct: bool,
}

/// Annotates each window of `series` with the accuracy of the labelled
/// predictions that fall in it (same windows and groups as the sketches).
pub fn add_accuracy(
    series: &mut [DriftSeries],
    rows: &[LabelledRow],
    group_of: &dyn Fn(&str) -> Option<String>,
    window_seconds: i64,
) {
    let window = window_seconds.max(1);
    let mut counts: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for r in rows {
        let group = group_of(&r.device).unwrap_or_else(|| "all".into());
        let c = counts
            .entry((group, r.at - r.at.rem_euclid(window)))
            .or_default();
        c.0 += u64::from(r.correct);
        c.1 += 1;
    }
    for s in series.iter_mut() {
        for w in s.windows.iter_mut() {
            if let Some(&(hits, n)) = counts.get(&(s.group.clone(), w.start)) {
                w.labelled = n;
                w.accuracy = Some(hits as f64 / n as f64);
            }
        }
    }
}

#[derive(Default)]
struct Sum {
    requests: u64,
    devices: usize,
    features: BTreeMap<String, Vec<u64>>,
    classes: BTreeMap<i64, u64>,
    confidence: Vec<u64>,
}

/// A window's sketches summed in an order-free way, so that sums built as
/// sketches arrive ([`crate::aggregates`]) judge exactly like the
/// full scan in [`analyze`], which folds them in key order: a feature's
/// counts are kept per binning (number of bins) with the smallest sketch
/// key that had it, and the binning of the smallest key is the one judged
/// (the scan's "a sketch binned differently from the first is skipped").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowSum {
    pub requests: u64,
    /// Distinct devices: 1 in a device's own sum, and the number of device
    /// sums merged into a group's.
    pub devices: u64,
    pub features: BTreeMap<String, Vec<Binned>>,
    pub classes: BTreeMap<i64, u64>,
    pub confidence: Vec<u64>,
}

/// One binning of a feature within a window sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binned {
    /// The smallest sketch key (store order) counted here.
    pub first: String,
    pub counts: Vec<u64>,
}

impl WindowSum {
    /// Adds the sketch stored under `key` (not its device: the caller
    /// counts distinct devices). Device-reported counts: held at
    /// `u64::MAX` (see [`edgeloop_errors::device_counts`]).
    pub fn add_sketch(&mut self, key: &str, s: &SketchRecord) {
        let mut sum = Adder::default();
        sum.add(&mut self.requests, s.requests);
        for f in &s.features {
            let folded = f.folded_counts();
            self.add_binned(&mut sum, &f.name, key, &folded);
        }
        for c in &s.classes {
            sum.add(self.classes.entry(c.class).or_default(), c.count);
        }
        self.add_confidence(&mut sum, &s.confidence_counts);
    }

    fn add_binned(&mut self, sum: &mut Adder, name: &str, first: &str, counts: &[u64]) {
        let binnings = self.features.entry(name.to_string()).or_default();
        match binnings.iter_mut().find(|b| b.counts.len() == counts.len()) {
            Some(b) => {
                for (a, &c) in b.counts.iter_mut().zip(counts) {
                    sum.add(a, c);
                }
                if first < b.first.as_str() {
                    b.first = first.to_string();
                }
            }
            None => binnings.push(Binned {
                first: first.to_string(),
                counts: counts.to_vec(),
            }),
        }
    }

    fn add_confidence(&mut self, sum: &mut Adder, counts: &[u64]) {
        if self.confidence.len() < counts.len() {
            self.confidence.resize(counts.len(), 0);
        }
        for (a, &c) in self.confidence.iter_mut().zip(counts) {
            sum.add(a, c);
        }
    }

    /// Adds another sum (another device's, for a group).
    pub fn merge(&mut self, other: &WindowSum) {
        let mut sum = Adder::default();
        sum.add(&mut self.requests, other.requests);
        sum.add(&mut self.devices, other.devices);
        for (name, binnings) in &other.features {
            for b in binnings {
                self.add_binned(&mut sum, name, &b.first, &b.counts);
            }
        }
        for (class, &n) in &other.classes {
            sum.add(self.classes.entry(*class).or_default(), n);
        }
        self.add_confidence(&mut sum, &other.confidence);
    }

    fn to_sum(&self) -> Sum {
        Sum {
            requests: self.requests,
            devices: self.devices as usize,
            features: self
                .features
                .iter()
                .filter_map(|(name, b)| {
                    let first = b.iter().min_by(|x, y| x.first.cmp(&y.first))?;
                    Some((name.clone(), first.counts.clone()))
                })
                .collect(),
            classes: self.classes.clone(),
            confidence: self.confidence.clone(),
        }
    }
}

/// The start of the window (of `window_seconds`) that counts sketch `s`,
/// if it has a time.
pub fn window_start(s: &SketchRecord, window_seconds: i64) -> Option<i64> {
    let t = s.window_time()?.unix_timestamp();
    Some(t - t.rem_euclid(window_seconds.max(1)))
}

/// One series per group (`group_of` maps a device to its group; `None`
/// puts every device in `all`), windows in time order. The full scan: the
/// drift API's fallback for a window or grouping that has no aggregates,
/// and the reference the aggregates are tested against.
pub fn analyze(
    reference: &ReferenceStats,
    sketches: &[SketchRecord],
    group_of: &dyn Fn(&str) -> Option<String>,
    config: &DriftConfig,
) -> Vec<DriftSeries> {
    let window = config.window_seconds.max(1);
    type Sums = BTreeMap<String, BTreeMap<i64, (Sum, std::collections::BTreeSet<String>)>>;
    let mut sums: Sums = BTreeMap::new();
    // Device-reported counts: held at `u64::MAX` (edgeloop_errors::device_counts).
    let mut add = Adder::default();
    for s in sketches {
        let Some(end) = s.window_time() else {
            continue;
        };
        let t = end.unix_timestamp();
        let start = t - t.rem_euclid(window);
        let group = group_of(&s.device).unwrap_or_else(|| "all".into());
        let (sum, devices) = sums.entry(group).or_default().entry(start).or_default();
        add.add(&mut sum.requests, s.requests);
        devices.insert(s.device.clone());
        for f in &s.features {
            let folded = f.folded_counts();
            let acc = sum
                .features
                .entry(f.name.clone())
                .or_insert_with(|| vec![0; folded.len()]);
            // A sketch binned differently from the others is skipped.
            if acc.len() == folded.len() {
                for (a, c) in acc.iter_mut().zip(folded) {
                    add.add(a, c);
                }
            }
        }
        for c in &s.classes {
            add.add(sum.classes.entry(c.class).or_default(), c.count);
        }
        if sum.confidence.len() < s.confidence_counts.len() {
            sum.confidence.resize(s.confidence_counts.len(), 0);
        }
        for (a, &c) in sum.confidence.iter_mut().zip(&s.confidence_counts) {
            add.add(a, c);
        }
    }
    let sums = sums
        .into_iter()
        .map(|(group, windows)| {
            let windows = windows
                .into_iter()
                .map(|(start, (mut sum, devices))| {
                    sum.devices = devices.len();
                    (start, sum)
                })
                .collect();
            (group, windows)
        })
        .collect();
    series(reference, sums, config, DriftState::default())
}

/// [`analyze`] over sums kept as sketches arrived: per group, per window
/// start.
pub fn analyze_sums(
    reference: &ReferenceStats,
    groups: &BTreeMap<String, BTreeMap<i64, WindowSum>>,
    config: &DriftConfig,
) -> Vec<DriftSeries> {
    analyze_sums_from(reference, groups, config, DriftState::default())
}

/// [`analyze_sums`] for windows that follow others: the hysteresis starts
/// at `initial`, the state after the window before the first.
pub fn analyze_sums_from(
    reference: &ReferenceStats,
    groups: &BTreeMap<String, BTreeMap<i64, WindowSum>>,
    config: &DriftConfig,
    initial: DriftState,
) -> Vec<DriftSeries> {
    let sums = groups
        .iter()
        .map(|(group, windows)| {
            let windows = windows.iter().map(|(s, w)| (*s, w.to_sum())).collect();
            (group.clone(), windows)
        })
        .collect();
    series(reference, sums, config, initial)
}

/// One window's verdict from its kept sum (its `drifting` left false: the
/// hysteresis is the caller's).
pub fn judge_sum(
    reference: &ReferenceStats,
    start: i64,
    sum: &WindowSum,
    config: &DriftConfig,
) -> WindowDrift {
    judge(reference, start, &sum.to_sum(), config)
}

fn series(
    reference: &ReferenceStats,
    sums: BTreeMap<String, BTreeMap<i64, Sum>>,
    config: &DriftConfig,
    initial: DriftState,
) -> Vec<DriftSeries> {
    let h = Hysteresis {
        set_after: config.set_after,
        clear_after: config.clear_after,
    };
    sums.into_iter()
        .map(|(group, windows)| {
            let mut state = initial;
            let windows = windows
                .into_iter()
                .map(|(start, sum)| {
                    let w = judge(reference, start, &sum, config);
                    state = hysteresis::next(h, state, w.over);
                    WindowDrift {
                        drifting: state.drifting,
                        ..w
                    }
                })
                .collect();
            DriftSeries { group, windows }
        })
        .collect()
}

fn judge(reference: &ReferenceStats, start: i64, sum: &Sum, config: &DriftConfig) -> WindowDrift {
    let features: Vec<FeatureDrift> = reference
        .inputs
        .iter()
        .map(|r| {
            let live = sum.features.get(&r.name);
            let as_f = |c: &[u64]| c.iter().map(|&v| v as f64).collect::<Vec<_>>();
            let psi = live.and_then(|l| stats::psi(&as_f(&r.counts), &as_f(l)).ok());
            let ks = live.and_then(|l| stats::ks_test(&r.counts, l).ok());
            let js = live.and_then(|l| stats::js_distance(&as_f(&r.counts), &as_f(l)).ok());
            let level = match psi {
                Some(p) if p >= config.psi_act => DriftLevel::Act,
                Some(p) if p >= config.psi_watch => DriftLevel::Watch,
                Some(_) => DriftLevel::Stable,
                None => DriftLevel::Unknown,
            };
            FeatureDrift {
                name: r.name.clone(),
                psi,
                ks_statistic: ks.map(|k| k.statistic),
                ks_p_value: ks.map(|k| k.p_value),
                js_distance: js,
                level,
            }
        })
        .collect();
    let prediction_js = if reference.prediction_distribution.is_empty() || sum.classes.is_empty() {
        None
    } else {
        let mut classes: Vec<i64> = reference
            .prediction_distribution
            .iter()
            .map(|c| c.class)
            .chain(sum.classes.keys().copied())
            .collect();
        classes.sort_unstable();
        classes.dedup();
        let r: Vec<f64> = classes
            .iter()
            .map(|c| {
                reference
                    .prediction_distribution
                    .iter()
                    .find(|s| s.class == *c)
                    .map_or(0.0, |s| s.share)
            })
            .collect();
        let w: Vec<f64> = classes
            .iter()
            .map(|c| sum.classes.get(c).copied().unwrap_or(0) as f64)
            .collect();
        stats::js_distance(&r, &w).ok()
    };
    // In floating point: a window's counts may total past `u64::MAX`.
    let total_confidence: f64 = sum.confidence.iter().map(|&c| c as f64).sum();
    let low_confidence_share = (total_confidence > 0.0).then(|| {
        let half = sum.confidence.len() / 2;
        sum.confidence[..half]
            .iter()
            .map(|&c| c as f64)
            .sum::<f64>()
            / total_confidence
    });
    let severity = features.iter().filter_map(|f| f.psi).fold(0.0f64, f64::max);
    let over = (sum.requests >= config.min_requests)
        .then(|| severity >= config.psi_act || prediction_js.is_some_and(|j| j >= config.js_act));
    WindowDrift {
        start,
        requests: sum.requests,
        devices: sum.devices,
        features,
        prediction_js,
        low_confidence_share,
        severity,
        over,
        drifting: false,
        labelled: 0,
        accuracy: None,
    }
}

#[cfg(test)]
mod tests {
    use edgeloop_models::manifest::{ClassShare, InputHistogram};
    use time::OffsetDateTime;

    use super::*;
    use crate::records::{ClassCountRecord, FeatureHistogramRecord};

    fn reference() -> ReferenceStats {
        ReferenceStats {
            inputs: vec![InputHistogram {
                name: "temp".into(),
                bin_edges: vec![0.0, 10.0, 20.0, 30.0],
                counts: vec![300, 400, 300],
                input: None,
                column: None,
            }],
            prediction_distribution: vec![
                ClassShare {
                    class: 0,
                    share: 0.7,
                },
                ClassShare {
                    class: 1,
                    share: 0.3,
                },
            ],
            sample_count: 1000,
        }
    }

    fn sketch(device: &str, t: i64, counts: [u64; 3], classes: [u64; 2]) -> SketchRecord {
        SketchRecord {
            received_at: None,
            device: device.into(),
            sequence: 1,
            model_name: "m".into(),
            model_version: "1".into(),
            window_start: None,
            window_end: Some(OffsetDateTime::from_unix_timestamp(t).unwrap()),
            requests: counts.iter().sum(),
            errors: 0,
            latency_p50_ms: 1.0,
            latency_p99_ms: 2.0,
            features: vec![FeatureHistogramRecord {
                name: "temp".into(),
                bin_edges: vec![0.0, 10.0, 20.0, 30.0],
                counts: counts.to_vec(),
                underflow: 0,
                overflow: 0,
                non_finite: 0,
            }],
            classes: vec![
                ClassCountRecord {
                    class: 0,
                    count: classes[0],
                },
                ClassCountRecord {
                    class: 1,
                    count: classes[1],
                },
            ],
            confidence_counts: vec![0, 0, 0, 0, 0, 10, 10, 10, 10, 10],
            low_confidence: 0,
        }
    }

    #[test]
    fn windows_and_groups_sum_then_drift_sets_after_three_windows() {
        let config = DriftConfig {
            window_seconds: 100,
            min_requests: 50,
            ..DriftConfig::default()
        };
        let mut sketches = Vec::new();
        // Windows 0..2 look like the reference; 3..6 are hot; two devices
        // per window, in two groups.
        for w in 0..7i64 {
            let hot = w >= 3;
            let counts = if hot { [30, 100, 370] } else { [150, 200, 150] };
            let classes = if hot { [100, 400] } else { [350, 150] };
            for d in ["a1", "b1"] {
                sketches.push(sketch(d, w * 100 + 50, counts, classes));
            }
        }
        let by_site = |d: &str| Some(d[..1].to_string());
        let series = analyze(&reference(), &sketches, &by_site, &config);
        assert_eq!(series.len(), 2);
        for s in &series {
            let flags: Vec<bool> = s.windows.iter().map(|w| w.drifting).collect();
            assert_eq!(
                flags,
                [false, false, false, false, false, true, true],
                "{}",
                s.group
            );
            let first = &s.windows[0];
            assert_eq!((first.requests, first.devices), (500, 1));
            assert!(first.features[0].psi.unwrap() < 0.01);
            assert_eq!(first.features[0].level, DriftLevel::Stable);
            let hot = &s.windows[3];
            assert!(hot.features[0].psi.unwrap() > 0.2, "{hot:?}");
            assert_eq!(hot.features[0].level, DriftLevel::Act);
            assert!(hot.features[0].ks_p_value.unwrap() < 1e-6);
            let (calm_js, hot_js) = (
                first.features[0].js_distance.unwrap(),
                hot.features[0].js_distance.unwrap(),
            );
            assert!(
                calm_js < 0.05 && (0.1..=1.0).contains(&hot_js),
                "{calm_js} {hot_js}"
            );
            assert!(hot.prediction_js.unwrap() > 0.1);
            assert_eq!(hot.low_confidence_share, Some(0.0));
        }
        // Without groups, both devices sum into one series.
        let all = analyze(&reference(), &sketches, &|_| None, &config);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].group, "all");
        assert_eq!(all[0].windows[0].devices, 2);
        assert_eq!(all[0].windows[0].requests, 1000);
    }

    #[test]
    fn thin_windows_are_reported_but_not_judged() {
        let config = DriftConfig {
            window_seconds: 100,
            min_requests: 1000,
            set_after: 1,
            ..DriftConfig::default()
        };
        let sketches = vec![sketch("a", 50, [0, 0, 500], [0, 500])];
        let series = analyze(&reference(), &sketches, &|_| None, &config);
        let w = &series[0].windows[0];
        assert_eq!(w.over, None);
        assert!(!w.drifting);
        assert!(w.severity > 1.0, "measured anyway: {w:?}");
    }

    #[test]
    fn labelled_predictions_give_each_window_its_accuracy() {
        let mk = |start: i64| WindowDrift {
            start,
            requests: 10,
            devices: 1,
            features: vec![],
            prediction_js: None,
            low_confidence_share: None,
            severity: 0.0,
            over: Some(false),
            drifting: false,
            labelled: 0,
            accuracy: None,
        };
        let mut series = vec![
            DriftSeries {
                group: "berlin".into(),
                windows: vec![mk(0), mk(60)],
            },
            DriftSeries {
                group: "oslo".into(),
                windows: vec![mk(0)],
            },
        ];
        let row = |device: &str, at: i64, correct: bool| LabelledRow {
            device: device.into(),
            at,
            correct,
        };
        let rows = [
            row("b1", 5, true),
            row("b1", 59, false),
            row("b2", 61, true),
            row("o1", 10, false),
            row("o1", 200, true), // no sketch window there
        ];
        let group_of =
            |d: &str| Some(if d.starts_with('b') { "berlin" } else { "oslo" }.to_string());
        add_accuracy(&mut series, &rows, &group_of, 60);
        assert_eq!(
            (series[0].windows[0].labelled, series[0].windows[0].accuracy),
            (2, Some(0.5))
        );
        assert_eq!(
            (series[0].windows[1].labelled, series[0].windows[1].accuracy),
            (1, Some(1.0))
        );
        assert_eq!(
            (series[1].windows[0].labelled, series[1].windows[0].accuracy),
            (1, Some(0.0))
        );
    }

    /// `sketch` with arbitrary counts from a device: its requests as sent,
    /// not their sum.
    fn raw_sketch(
        device: &str,
        requests: u64,
        counts: [u64; 3],
        classes: [u64; 2],
    ) -> SketchRecord {
        let mut s = sketch(device, 50, [0; 3], [0; 2]);
        s.requests = requests;
        s.features[0].counts = counts.to_vec();
        s.classes[0].count = classes[0];
        s.classes[1].count = classes[1];
        s.confidence_counts = counts.to_vec();
        s
    }

    #[test]
    fn huge_counts_hold_at_the_maximum_and_are_counted() {
        let before = edgeloop_errors::device_counts::saturated_total();
        let big = raw_sketch("a", u64::MAX, [u64::MAX, 1, 0], [u64::MAX, 2]);
        let more = raw_sketch("b", 7, [9, 1, 0], [1, 2]);
        let config = DriftConfig {
            window_seconds: 100,
            ..DriftConfig::default()
        };
        let series = analyze(
            &reference(),
            &[big.clone(), more.clone()],
            &|_| None,
            &config,
        );
        let w = &series[0].windows[0];
        assert_eq!(w.requests, u64::MAX, "held, not wrapped to 6");
        assert!(w.low_confidence_share.is_some_and(f64::is_finite));
        let mut a = WindowSum::default();
        a.add_sketch("k1", &big);
        a.add_sketch("k2", &more);
        let mut group = WindowSum::default();
        group.merge(&a);
        group.merge(&a);
        assert_eq!(group.requests, u64::MAX);
        assert_eq!(group.features["temp"][0].counts, vec![u64::MAX, 4, 0]);
        assert_eq!(group.classes[&0], u64::MAX);
        assert!(edgeloop_errors::device_counts::saturated_total() > before);
    }

    proptest::proptest! {
        /// Whatever counts devices sent: adding and merging window sums
        /// never panics and no total goes down, and the full scan agrees
        /// with the kept sums.
        #[test]
        fn arbitrary_counts_never_panic_and_totals_never_go_down(
            reports in proptest::collection::vec(
                (
                    proptest::prelude::any::<u64>(),
                    proptest::prelude::any::<[u64; 3]>(),
                    proptest::prelude::any::<[u64; 2]>(),
                ),
                1..8,
            ),
        ) {
            let sketches: Vec<SketchRecord> = reports
                .iter()
                .enumerate()
                .map(|(i, &(r, c, k))| raw_sketch(&format!("d{i}"), r, c, k))
                .collect();
            let mut kept = WindowSum::default();
            let mut group = WindowSum::default();
            for (i, s) in sketches.iter().enumerate() {
                let before = kept.clone();
                kept.add_sketch(&format!("k{i}"), s);
                proptest::prop_assert!(kept.requests >= before.requests);
                let bins = |w: &WindowSum| w.features.get("temp").map(|b| b[0].counts.clone());
                if let (Some(old), Some(new)) = (bins(&before), bins(&kept)) {
                    proptest::prop_assert!(old.iter().zip(&new).all(|(o, n)| n >= o));
                }
                for (class, n) in &before.classes {
                    proptest::prop_assert!(kept.classes[class] >= *n);
                }
                proptest::prop_assert!(
                    before.confidence.iter().zip(&kept.confidence).all(|(o, n)| n >= o)
                );
                let merged = group.requests;
                group.merge(&kept);
                proptest::prop_assert!(group.requests >= merged);
            }
            let config = DriftConfig {
                window_seconds: 100,
                ..DriftConfig::default()
            };
            let scanned = analyze(&reference(), &sketches, &|_| None, &config);
            let groups = BTreeMap::from([("all".to_string(), BTreeMap::from([(0, kept.clone())]))]);
            let summed = analyze_sums(&reference(), &groups, &config);
            proptest::prop_assert_eq!(scanned[0].windows[0].requests, kept.requests);
            proptest::prop_assert_eq!(summed[0].windows[0].requests, kept.requests);
        }
    }
}
