//! The aggregates against the full scans they replace: the same records,
//! stored in a shuffled order (some before the aggregate was built, some
//! after, some twice), give the same drift series, label counts and
//! online accuracy.

use edgeloop_models::manifest::{ClassShare, InputHistogram, ReferenceStats};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use time::OffsetDateTime;

use super::full_scan as runner;
use super::*;
use crate::analysis::{self, DriftConfig};
use crate::records::{
    record_key, ClassCountRecord, FeatureHistogramRecord, SampleKind, SampleRecord, SketchRecord,
};

const T0: i64 = 1_700_000_000;

fn store() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let store = Trees::open(&edgeloop_store::Store::open(&dir.path().join("db")).unwrap()).unwrap();
    (dir, store)
}

fn at(t: i64) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(t).ok()
}

fn reference() -> ReferenceStats {
    let h = |name: &str, counts: Vec<u64>| InputHistogram {
        name: name.into(),
        bin_edges: (0..=counts.len()).map(|i| i as f64 * 10.0).collect(),
        counts,
        input: None,
        column: None,
    };
    ReferenceStats {
        inputs: vec![h("temp", vec![300, 400, 300]), h("hum", vec![500, 500])],
        prediction_distribution: vec![
            ClassShare {
                class: 0,
                share: 0.6,
            },
            ClassShare {
                class: 1,
                share: 0.4,
            },
        ],
        sample_count: 1000,
    }
}

fn feature(name: &str, counts: Vec<u64>) -> FeatureHistogramRecord {
    FeatureHistogramRecord {
        name: name.into(),
        bin_edges: (0..=counts.len()).map(|i| i as f64 * 10.0).collect(),
        counts,
        underflow: 1,
        overflow: 2,
        non_finite: 0,
    }
}

/// A sketch at `t`; from `hot_from` on, its `temp` has moved up.
fn random_sketch(
    rng: &mut StdRng,
    version: &str,
    device: &str,
    seq: u64,
    (t, hot_from): (i64, i64),
) -> SketchRecord {
    let hot = t >= hot_from && rng.random_bool(0.9);
    // Now and then a device bins a feature differently.
    let bins = if rng.random_bool(0.05) { 4 } else { 3 };
    let temp: Vec<u64> = (0..bins)
        .map(|i| {
            let base = if hot && i == bins - 1 { 200 } else { 40 };
            base + rng.random_range(0..30)
        })
        .collect();
    let mut features = vec![feature("temp", temp)];
    if rng.random_bool(0.8) {
        features.push(feature("hum", vec![rng.random_range(0..60), 50]));
    }
    let legacy = rng.random_bool(0.05);
    SketchRecord {
        device: device.into(),
        sequence: seq,
        model_name: "m".into(),
        model_version: version.into(),
        window_start: None,
        // Legacy records have only the device's time; a few have none.
        window_end: (legacy && rng.random_bool(0.7)).then(|| at(t)).flatten(),
        received_at: (!legacy).then(|| at(t)).flatten(),
        requests: rng.random_range(0..80),
        errors: 0,
        latency_p50_ms: 1.0,
        latency_p99_ms: 2.0,
        features,
        classes: (0..rng.random_range(0..4))
            .map(|c| ClassCountRecord {
                class: c,
                count: rng.random_range(0..50),
            })
            .collect(),
        confidence_counts: if rng.random_bool(0.9) {
            (0..10).map(|_| rng.random_range(0..5)).collect()
        } else {
            vec![]
        },
        low_confidence: 0,
    }
}

#[test]
fn window_sums_judge_exactly_like_the_full_scan() {
    for seed in 0..6u64 {
        let (_dir, store) = store();
        let mut rng = StdRng::seed_from_u64(seed);
        let ws = [60, 100, 3600][seed as usize % 3];
        let config = DriftConfig {
            window_seconds: ws,
            min_requests: 30,
            set_after: 2,
            clear_after: 2,
            ..DriftConfig::default()
        };
        let mut records = Vec::new();
        for seq in 1..=300u64 {
            let device = format!("d{}", rng.random_range(0..7));
            let version = if rng.random_bool(0.9) { "1" } else { "2" };
            let t = T0 + rng.random_range(0..25 * ws);
            for index in 0..rng.random_range(1..3) {
                let s = random_sketch(&mut rng, version, &device, seq, (t, T0 + 12 * ws));
                records.push((record_key("m", version, &device, seq, index), s));
            }
        }
        // Replays store the same keys again.
        let replays: Vec<_> = records.iter().take(20).cloned().collect();
        records.extend(replays);
        records.shuffle(&mut rng);
        let (before, after) = records.split_at(records.len() / 3);
        for (k, s) in before {
            windows::store_sketch(&store, k, s).unwrap();
        }
        // Built from what is stored, then kept as the rest arrives.
        windows::ensure(&store, "m", "1", ws).unwrap();
        for (k, s) in after {
            windows::store_sketch(&store, k, s).unwrap();
        }
        let scanned: Vec<SketchRecord> = store
            .sketches
            .scan_prefix("m/1/")
            .unwrap()
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        let reference = reference();
        let by_site = |d: &str| Some(if d < "d3" { "a" } else { "b" }.to_string());
        let check = |store: &Trees| {
            let kept = windows::series(store, &reference, "m", "1", &config, None).unwrap();
            let full = analysis::analyze(&reference, &scanned, &|_| None, &config);
            assert!(
                full[0].windows.len() > 10,
                "seed {seed}: {}",
                full[0].windows.len()
            );
            assert!(
                full[0].windows.iter().any(|w| w.drifting),
                "seed {seed}: some drift to compare"
            );
            assert_eq!(kept, full, "seed {seed}, all devices");
            let kept = windows::series(store, &reference, "m", "1", &config, Some(&by_site));
            let full = analysis::analyze(&reference, &scanned, &by_site, &config);
            assert_eq!(kept.unwrap(), full, "seed {seed}, by site");
        };
        check(&store);
        // Another process (or format) rebuilds them, to the same.
        let stale = AggMark {
            version: AGGREGATE_VERSION,
            process: process().wrapping_add(1),
        };
        store
            .agg_marks
            .insert(&format!("windows/m/1/{ws:010}"), &stale)
            .unwrap();
        check(&store);
    }
}

#[test]
fn retention_drops_whole_windows_past_the_sketch_age() {
    let (_dir, store) = store();
    let mut rng = StdRng::seed_from_u64(7);
    windows::ensure(&store, "m", "1", 100).unwrap();
    for seq in 1..=50u64 {
        let t = T0 + seq as i64 * 20;
        let mut s = random_sketch(&mut rng, "1", "d", seq, (t, t));
        s.received_at = at(t);
        windows::store_sketch(&store, &record_key("m", "1", "d", seq, 0), &s).unwrap();
    }
    let starts = |store: &Trees| -> Vec<i64> {
        windows::all_windows(store, "m", "1", 100)
            .unwrap()
            .into_keys()
            .collect()
    };
    let before = starts(&store);
    assert_eq!(before.len(), 11);
    // Sketches older than 30 s at T0 + 530: windows ending by T0 + 500 go.
    let now = at(T0 + 530).unwrap();
    let dropped = prune(&store, now, time::Duration::seconds(30)).unwrap();
    let after = starts(&store);
    assert_eq!(dropped as usize, before.len() - after.len());
    assert!(after.iter().all(|s| s + 100 > T0 + 500), "{after:?}");
    assert_eq!(after.first().copied(), Some(T0 + 500 - (T0 + 500) % 100));
    let devices = store.drift_window_devices.scan_prefix("m/1/").unwrap();
    assert_eq!(devices.len(), after.len(), "per-device sums go too");
}

fn sample(rng: &mut StdRng, version: &str, device: &str, seq: u64, request: u32) -> SampleRecord {
    let predicted = rng.random_bool(0.9).then(|| rng.random_range(0..3));
    let t = T0 + rng.random_range(0..10 * 3600);
    SampleRecord {
        device: device.into(),
        sequence: seq,
        kind: if rng.random_bool(0.5) {
            SampleKind::Feedback
        } else {
            SampleKind::HardExample
        },
        model_name: "m".into(),
        model_version: version.into(),
        request_id: format!("r{request}"),
        observed_at: at(t),
        // A few from before the receive time was kept; one in a while
        // with no time at all.
        received_at: rng.random_bool(0.95).then(|| at(t)).flatten(),
        inputs: vec![],
        predicted_class: predicted,
        confidence: None,
        label: rng
            .random_bool(0.6)
            .then(|| predicted.unwrap_or(0) + i64::from(rng.random_bool(0.3))),
        labelled_at: None,
        labelled_by: None,
    }
}

#[test]
fn label_counts_and_online_accuracy_match_the_full_scan() {
    for seed in 0..5u64 {
        let (_dir, store) = store();
        let mut rng = StdRng::seed_from_u64(100 + seed);
        let mut keys = Vec::new();
        for seq in 1..=400u64 {
            let device = format!("d{}", rng.random_range(0..4));
            let version = if rng.random_bool(0.7) { "1" } else { "2" };
            // Requests repeat: a hard example and its feedback, say.
            let request = rng.random_range(0..120);
            let mut r = sample(&mut rng, version, &device, seq, request);
            if rng.random_bool(0.02) {
                r.observed_at = None;
                r.received_at = None;
            }
            let key = record_key("m", version, &device, seq, 0);
            crate::retention::store_sample(&store, &key, &r).unwrap();
            keys.push((key, r));
            if seq == 130 {
                // Built from what is stored, kept from here on.
                labelled::ensure(&store, "m").unwrap();
            }
        }
        // Labelled (and relabelled) later, through the labelling queue.
        for _ in 0..60 {
            let (key, r) = keys.choose(&mut rng).unwrap();
            let index = key.rsplit('/').next().unwrap().parse().unwrap();
            let id =
                edgeloop_api::samples::sample_id(&r.model_version, &r.device, r.sequence, index);
            let label = rng.random_range(0..3);
            crate::labels::label(&store, "m", &id, label, "me", at(T0).unwrap()).unwrap();
        }
        // Sample retention drops the oldest.
        crate::retention::enforce(&store, "m", 300).unwrap();
        let check = |store: &Trees| {
            let all = runner::labelled(
                store
                    .samples
                    .scan_prefix("m/")
                    .unwrap()
                    .into_iter()
                    .map(|(_, r)| r)
                    .collect(),
            );
            assert!(all.len() > 50, "seed {seed}: {}", all.len());
            let mut sinces = vec![None];
            sinces.extend((0..12).map(|i| Some(T0 + i * 3000 + rng_free(i))));
            for since in sinces {
                let want = all
                    .iter()
                    .filter(|r| {
                        since.is_none_or(|s| r.at().is_some_and(|t| t.unix_timestamp() > s))
                    })
                    .count() as u64;
                let got = labelled::labels_since(store, "m", since).unwrap();
                assert_eq!(got, want, "seed {seed}, since {since:?}");
            }
            for version in ["1", "2"] {
                let mine: Vec<SampleRecord> = all
                    .iter()
                    .filter(|r| r.model_version == version)
                    .cloned()
                    .collect();
                for (window, min) in [(1, 1), (10, 5), (40, 40), (1000, 1), (1000, 900)] {
                    assert_eq!(
                        labelled::online_accuracy(store, "m", version, window, min).unwrap(),
                        runner::online_accuracy(&mine, window, min),
                        "seed {seed}, version {version}, window {window}"
                    );
                }
                let rows: Vec<(String, i64, bool)> = labelled::rows(store, "m", version, None)
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.device, r.at, r.correct))
                    .collect();
                let want: Vec<(String, i64, bool)> = mine
                    .iter()
                    .filter_map(|r| {
                        let t = r.at()?.unix_timestamp();
                        Some((r.device.clone(), t, r.predicted_class? == r.label?))
                    })
                    .collect();
                assert_eq!(rows, want, "seed {seed}, version {version}");
                // From a time on: those rows (and at most a second before).
                let from = T0 + 5 * 3600 + 17;
                let later: Vec<i64> = labelled::rows(store, "m", version, Some(from))
                    .unwrap()
                    .into_iter()
                    .map(|r| r.at)
                    .collect();
                let want_later: Vec<i64> = want
                    .iter()
                    .map(|w| w.1)
                    .filter(|t| *t >= from - 1)
                    .collect();
                assert_eq!(later, want_later, "seed {seed}, version {version}");
            }
        };
        check(&store);
        // Another process rebuilds the indexes, to the same.
        store.agg_marks.remove("labels/m").unwrap();
        check(&store);
    }
}

/// Odd offsets, so `since` falls inside hours as well as on their edges.
fn rng_free(i: i64) -> i64 {
    [0, 1, 599, 1799, 3599][i as usize % 5]
}

#[test]
fn the_ticks_fold_sees_the_same_drifting_run_as_the_full_series() {
    for seed in 0..4u64 {
        let (_dir, store) = store();
        let mut rng = StdRng::seed_from_u64(200 + seed);
        let ws = 100;
        let mut config = DriftConfig {
            window_seconds: ws,
            min_requests: 30,
            set_after: 2,
            clear_after: 3,
            ..DriftConfig::default()
        };
        let reference = reference();
        let mut t = T0;
        let mut drifted = false;
        let mut ranges = 0usize;
        for seq in 1..=400u64 {
            // Mostly forward in time; now and then a late one (a clock set
            // back) into an older window.
            let late = rng.random_bool(0.03);
            let when = if late {
                t - rng.random_range(100..600)
            } else {
                t += rng.random_range(0..40);
                t
            };
            // Drift comes and goes in spells of 1000 s.
            let hot_from = if (when - T0) / 1000 % 2 == 1 {
                when
            } else {
                i64::MAX
            };
            let device = format!("d{}", rng.random_range(0..3));
            let s = random_sketch(&mut rng, "1", &device, seq, (when, hot_from));
            windows::store_sketch(&store, &record_key("m", "1", &device, seq, 0), &s).unwrap();
            if seq == 250 {
                // Another config: the fold starts over.
                config.set_after = 1;
            }
            if rng.random_bool(0.3) {
                let seen = run::observe(&store, &reference, "ref", "m", "1", &config).unwrap();
                let scanned: Vec<SketchRecord> = store
                    .sketches
                    .scan_prefix("m/1/")
                    .unwrap()
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect();
                let full = analysis::analyze(&reference, &scanned, &|_| None, &config);
                let windows = full.first().map(|s| s.windows.clone()).unwrap_or_default();
                assert_eq!(
                    seen.run,
                    runner::drifting_run(&windows),
                    "seed {seed}, sketch {seq}"
                );
                assert_eq!(
                    seen.newest.as_ref(),
                    windows.last(),
                    "seed {seed}, sketch {seq}"
                );
                drifted |= seen.run.is_some();
                // A range answer, started from the fold's point before it,
                // is the whole answer's windows in that range; with a
                // config the fold never saw it folds from the first.
                let from = T0 + rng.random_range(0..(when - T0 + 300).max(1));
                let until = rng
                    .random_bool(0.5)
                    .then(|| from + rng.random_range(1..2000));
                let range = windows::Range {
                    from: Some(from),
                    until,
                };
                let mut other = config;
                other.clear_after = config.clear_after + 1;
                for c in [config, other] {
                    let mut full = analysis::analyze(&reference, &scanned, &|_| None, &c);
                    range.keep(&mut full, ws);
                    let part =
                        windows::series_in(&store, &reference, "ref", "m", "1", &c, range).unwrap();
                    assert_eq!(part, full, "seed {seed}, sketch {seq}, {range:?}");
                    ranges += usize::from(!part.is_empty());
                }
            }
        }
        assert!(
            drifted,
            "seed {seed}: the run was compared while drifting too"
        );
        assert!(
            ranges > 20,
            "seed {seed}: ranges with windows were compared"
        );
    }
}
