//! The full scans the drift aggregates replace, kept as the reference the
//! aggregates are tested against (`aggregates/tests.rs`): the same records
//! must give the same drifting run, label counts and online accuracy.

use std::collections::BTreeSet;

use crate::analysis::WindowDrift;
use crate::records::SampleRecord;

/// The current drifting run of `windows`: since when (the start of its
/// first window) and how severe (its largest judged severity). The tick
/// folds the same thing window by window (`super::run`).
pub(crate) fn drifting_run(windows: &[WindowDrift]) -> Option<(i64, f64)> {
    if !windows.last()?.drifting {
        return None;
    }
    let run: Vec<&WindowDrift> = windows.iter().rev().take_while(|w| w.drifting).collect();
    let since = run.last()?.start;
    let severity = run
        .iter()
        .filter(|w| w.over.is_some())
        .map(|w| w.severity)
        .fold(0.0, f64::max);
    Some((since, severity))
}

/// Labelled rows once per `(device, request)`, oldest first: the full scan
/// the label indexes (`drift::aggregates::labelled`) are tested against.
pub(crate) fn labelled(records: Vec<SampleRecord>) -> Vec<SampleRecord> {
    let mut seen = BTreeSet::new();
    let mut out: Vec<SampleRecord> = records
        .into_iter()
        .filter(|r| r.label.is_some())
        .filter(|r| seen.insert((r.device.clone(), r.request_id.clone())))
        .collect();
    out.sort_by_key(|r| r.at());
    out
}

/// Top-1 accuracy (0..1) of the newest `window` labelled predictions, once
/// there are at least `min`: the full-scan form of
/// `drift::aggregates::labelled::online_accuracy`.
pub(crate) fn online_accuracy(rows: &[SampleRecord], window: usize, min: usize) -> Option<f64> {
    let scored: Vec<&SampleRecord> = rows
        .iter()
        .filter(|r| r.predicted_class.is_some())
        .collect();
    let recent = &scored[scored.len().saturating_sub(window)..];
    if recent.len() < min.max(1) {
        return None;
    }
    let hits = recent
        .iter()
        .filter(|r| r.predicted_class == r.label)
        .count();
    Some(hits as f64 / recent.len() as f64)
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;

    fn w(start: i64, severity: f64, over: Option<bool>, drifting: bool) -> WindowDrift {
        WindowDrift {
            start,
            requests: 100,
            devices: 1,
            features: vec![],
            prediction_js: None,
            low_confidence_share: None,
            severity,
            over,
            drifting,
            labelled: 0,
            accuracy: None,
        }
    }

    #[test]
    fn the_drifting_run_starts_at_its_first_window() {
        assert_eq!(drifting_run(&[]), None);
        assert_eq!(drifting_run(&[w(0, 0.5, Some(true), false)]), None);
        let windows = [
            w(0, 0.3, Some(true), true),
            w(10, 0.0, Some(false), false),
            w(20, 0.4, Some(true), true),
            w(30, 0.9, None, true),
            w(40, 0.3, Some(true), true),
        ];
        assert_eq!(drifting_run(&windows), Some((20, 0.4)));
    }

    fn row(i: i64, predicted: i64, label: i64) -> SampleRecord {
        SampleRecord {
            received_at: None,
            device: "d".into(),
            sequence: 1,
            kind: crate::records::SampleKind::Feedback,
            model_name: "m".into(),
            model_version: "1".into(),
            request_id: format!("r{i}"),
            observed_at: OffsetDateTime::from_unix_timestamp(i).ok(),
            inputs: vec![],
            predicted_class: Some(predicted),
            confidence: None,
            label: Some(label),
            labelled_at: None,
            labelled_by: None,
        }
    }

    #[test]
    fn online_accuracy_is_over_the_newest_window_once_there_are_enough() {
        let mut rows: Vec<SampleRecord> = (0..10).map(|i| row(i, 0, 1)).collect();
        rows.extend((10..20).map(|i| row(i, 1, 1)));
        assert_eq!(online_accuracy(&rows, 10, 5), Some(1.0));
        assert_eq!(online_accuracy(&rows, 20, 5), Some(0.5));
        assert_eq!(online_accuracy(&rows, 20, 21), None);
        let dup = labelled(vec![row(1, 1, 1), row(1, 1, 1), row(0, 0, 1)]);
        assert_eq!(dup.len(), 2);
        assert_eq!(dup[0].request_id, "r0", "oldest first");
    }
}
