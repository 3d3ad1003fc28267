//! A trigger tick reads what its design says (the drift fold's new
//! windows, one label total, the newest `accuracy_window` labels, its own
//! state, the serving version), however much telemetry the store keeps:
//! counted by the store itself (`Store::read_counts`), not timed. Four
//! simulated days of reports from 20 devices, drifting on the last.

use edgeloop_control_plane::lifecycle::triggers::runner;
use edgeloop_control_plane::{Clock, ServeSettings};
use edgeloop_store::ReadCounts;
use edgeloop_tests::soak::{self, register_rain, Fleet, BASE, DAY};
use edgeloop_tests::ControlPlane;
use serde_json::json;

/// What the second of two ticks at `now` read (the first of a process
/// builds the aggregates).
async fn steady_tick_reads(cp: &ControlPlane, now: i64) -> ReadCounts {
    runner::tick(&cp.core, soak::at(now)).await.unwrap();
    let before = cp.core.store.read_counts();
    runner::tick(&cp.core, soak::at(now)).await.unwrap();
    cp.core.store.read_counts().since(&before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_tick_reads_as_much_on_day_four_as_on_day_one() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with_clock(
        ServeSettings {
            // The server's own trigger loop ticks at start, then not again
            // within the test: only the ticks counted here read.
            rollout_tick_ms: Some(60_000),
            ..edgeloop_tests::settings(dir.path())
        },
        Clock::manual(soak::at(BASE)),
    )
    .await;
    let fleet = Fleet {
        devices: 20,
        reports_per_day: 24,
        labels_per_day: 4,
    };
    // 80 labels a day: the accuracy window is full on day one.
    register_rain(
        &cp,
        fleet,
        json!({"accuracy_window": 50, "accuracy_min_samples": 10, "triggers": [
            {"id": "drift", "kind": "drift", "min_severity": 1000.0},
            {"id": "labels", "kind": "new_labels", "min": 100000000u64}
        ]}),
    )
    .await
    .unwrap();
    let mut seq = 0;
    soak::day(&cp, fleet, 0, &mut seq, false).await;
    let day_one = steady_tick_reads(&cp, BASE + DAY - 1).await;
    for day in 1..4 {
        soak::day(&cp, fleet, day, &mut seq, day == 3).await;
    }
    let day_four = steady_tick_reads(&cp, BASE + 4 * DAY - 1).await;

    let stored = cp.core.store.drift.samples.len().unwrap();
    assert!(stored > 300, "the store keeps the samples: {stored}");
    for raw in [
        "samples",
        "sketches",
        "telemetry",
        "sample_index",
        "label_index",
        "label_requests",
        "drift_window_devices",
    ] {
        for (day, reads) in [(1, &day_one), (4, &day_four)] {
            assert!(
                !reads.0.contains_key(raw),
                "day {day}: a tick read the raw records of {raw}: {reads:?}"
            );
        }
    }
    let calls_and_records = |r: &ReadCounts| -> Vec<(String, u64, u64)> {
        r.0.iter()
            .map(|(tree, n)| (tree.clone(), n.calls, n.records))
            .collect()
    };
    assert_eq!(
        calls_and_records(&day_four),
        calls_and_records(&day_one),
        "a tick on day 4 reads the same records as on day 1"
    );
    assert_eq!(
        day_one.0["accuracy_index"].records, 50,
        "the newest accuracy_window labels, no more"
    );
    // The drifting day reached the trigger's view: the tick judged it.
    let (status, body) = cp.api().get("/api/v1/models/rain/triggers").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["state"]["last"]["state"]["drifting_since"].is_i64(),
        "the tick saw the drift: {body}"
    );
    assert!(
        body["state"]["last"]["state"]["online_accuracy"].is_f64(),
        "and the labels: {body}"
    );
    cp.stop().await;
}
