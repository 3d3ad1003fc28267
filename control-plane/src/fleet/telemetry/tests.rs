//! Ingestion's tables and stores: deduplication, epochs, admission,
//! status, and the compactor over what was ingested.

use super::*;

fn report(sequence: u64) -> pb::TelemetryReport {
    pb::TelemetryReport {
        sequence,
        sketches: vec![pb::ModelSketch {
            model_name: "m".into(),
            model_version: "1".into(),
            requests: 2,
            features: vec![pb::FeatureHistogram {
                name: "x".into(),
                bin_edges: vec![0.0, 1.0],
                counts: vec![2],
                ..Default::default()
            }],
            ..Default::default()
        }],
        samples: vec![pb::Sample {
            kind: pb::SampleKind::Feedback as i32,
            model_name: "m".into(),
            model_version: "1".into(),
            request_id: "r".into(),
            label: Some(1),
            ..Default::default()
        }],
        dropped_batches: 2,
        ..Default::default()
    }
}

/// Records a report as the gRPC handler does, for a device assigned
/// `m` versions 0 to 9, with the default quota; the ack.
fn ingest(
    store: &Db,
    device: &str,
    report: pb::TelemetryReport,
    now: OffsetDateTime,
) -> Result<u64> {
    assign_m(store, device);
    let quotas = admission::Quotas::default();
    let admit = Admission {
        quota: admission::Quota::default(),
        quotas: &quotas,
    };
    Ok(record_telemetry(store, &admit, device, report, now)?
        .0
        .acked)
}

fn assign_m(store: &Db, device: &str) {
    for v in 0..10 {
        admission::remember(store, device, "m", &v.to_string()).unwrap();
    }
}

fn status(
    generation: u64,
    version: &str,
    state: pb::AssignmentState,
    serving: &str,
) -> pb::AssignmentStatusReport {
    pb::AssignmentStatusReport {
        generation,
        model_name: "m".into(),
        model_version: version.into(),
        state: state as i32,
        serving_version: serving.into(),
        ..Default::default()
    }
}

/// A buffer lost on the device starts a new epoch at sequence 1. Its
/// reports are stored (not taken for the old epoch's), its ack counts
/// only its own, a replay within an epoch is still a duplicate, and an
/// agent from before epochs keeps its numbering.
#[test]
fn a_new_epoch_starts_its_own_span_and_acks_only_its_own_reports() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let now = OffsetDateTime::now_utc();
    let at = |epoch: u64, seq: u64| pb::TelemetryReport {
        epoch,
        ..report(seq)
    };
    let stored = || store.fleet.telemetry.scan_prefix("d/").unwrap().len();
    // The old buffer sent five.
    for seq in 1..=5 {
        assert_eq!(ingest(&store, "d", at(0xa, seq), now).unwrap(), seq);
    }
    // It is wiped: the new epoch's 1 and 2 are new reports, acked as 1, 2.
    assert_eq!(ingest(&store, "d", at(0xb, 1), now).unwrap(), 1);
    assert_eq!(ingest(&store, "d", at(0xb, 2), now).unwrap(), 2);
    assert_eq!(stored(), 7);
    // A replay of either epoch's report is a duplicate.
    assert_eq!(ingest(&store, "d", at(0xb, 1), now).unwrap(), 2);
    assert_eq!(ingest(&store, "d", at(0xa, 3), now).unwrap(), 5);
    assert_eq!(stored(), 7);
    // Each epoch has its own span, above the ones before.
    let stored_at: Vec<(u64, u64, u64)> = store
        .fleet
        .telemetry
        .scan_prefix("d/")
        .unwrap()
        .into_iter()
        .map(|(k, r)| (key_sequence(&k), r.epoch, r.sequence))
        .collect();
    let (a, b) = (EPOCH_SPAN, 2 * EPOCH_SPAN);
    assert_eq!(
        stored_at,
        vec![
            (a + 1, 0xa, 1),
            (a + 2, 0xa, 2),
            (a + 3, 0xa, 3),
            (a + 4, 0xa, 4),
            (a + 5, 0xa, 5),
            (b + 1, 0xb, 1),
            (b + 2, 0xb, 2)
        ]
    );
    // Samples and sketches of both epochs are all kept.
    assert_eq!(store.drift.samples.scan_prefix("m/").unwrap().len(), 7);
    // Before epochs: the span at 0, as such reports were always stored.
    assert_eq!(ingest(&store, "old", report(1), now).unwrap(), 1);
    assert_eq!(
        store.fleet.telemetry.scan_prefix("old/").unwrap()[0]
            .1
            .sequence,
        1
    );
    // Another device's epoch is its own.
    assert_eq!(ingest(&store, "e", at(0xb, 9), now).unwrap(), 9);
    // A sequence past the span is refused, naming the field.
    match ingest(&store, "d", at(0xb, EPOCH_SPAN), now) {
        Err(Error::BadRequest { field, .. }) => assert_eq!(field.as_deref(), Some("sequence")),
        other => panic!("{other:?}"),
    }
}

/// The compactor (`crate::retention`) drops reports and sketches by the
/// age they were received at, keeps each device's newest report (its
/// ack's anchor), and leaves what is young.
#[test]
fn retention_drops_old_reports_and_sketches_but_keeps_each_devices_newest() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let t0 = OffsetDateTime::now_utc() - time::Duration::days(45);
    let day = |n: i64| t0 + time::Duration::days(n);
    for (seq, at) in [(1, day(0)), (2, day(20)), (3, day(35))] {
        ingest(&store, "d", report(seq), at).unwrap();
    }
    ingest(&store, "lone", report(1), day(0)).unwrap();
    let now = day(45);
    let r = crate::retention::Retention {
        telemetry: time::Duration::days(30),
        sketches: time::Duration::days(20),
        ..Default::default()
    };
    let artifacts =
        edgeloop_registry::artifacts::LocalArtifactStore::open(&dir.path().join("a")).unwrap();
    let dropped = crate::retention::prune(&store, &artifacts, r, now).unwrap();
    assert_eq!((dropped.telemetry, dropped.sketches), (1, 3));
    let seqs = |device: &str| -> Vec<u64> {
        store
            .fleet
            .telemetry
            .scan_prefix(&format!("{device}/"))
            .unwrap()
            .into_iter()
            .map(|(_, r)| r.sequence)
            .collect()
    };
    assert_eq!(seqs("d"), vec![2, 3], "the 45-day-old report went");
    assert_eq!(seqs("lone"), vec![1], "a device's newest report stays");
    // Sketches older than 20 days went (d's first two, lone's one).
    assert_eq!(store.drift.sketches.scan_prefix("m/").unwrap().len(), 1);
    // The ack still counts from what is kept.
    assert_eq!(ingest(&store, "d", report(4), now).unwrap(), 4);
    // A second pass finds nothing more.
    let again = crate::retention::prune(&store, &artifacts, r, now).unwrap();
    assert_eq!(again, crate::retention::Dropped::default());
}

#[test]
fn status_keeps_what_serves_and_ignores_older_generations() {
    use pb::AssignmentState as S;
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let now = OffsetDateTime::now_utc();
    let get = || store.fleet.assignment_status.get("d/m").unwrap().unwrap();
    assign_m(&store, "d");
    record_status(&store, "d", status(1, "1", S::Active, "1"), now).unwrap();
    assert_eq!(get().running_version.as_deref(), Some("1"));
    // Version 2 fails its activation; 1 still serves.
    record_status(&store, "d", status(2, "2", S::RolledBack, "1"), now).unwrap();
    assert_eq!(
        (get().state, get().running_version.as_deref()),
        (AssignmentState::RolledBack, Some("1"))
    );
    // A retried report of generation 1 arrives late: generation 2 stands.
    record_status(&store, "d", status(1, "1", S::Active, "1"), now).unwrap();
    assert_eq!(get().generation, 2);
    // A reverted assignment: the old version serves again.
    record_status(&store, "d", status(3, "0", S::RolledBack, "0"), now).unwrap();
    assert_eq!(get().running_version.as_deref(), Some("0"));
    // Without the field (an older agent): active is what serves, a
    // download leaves what served before.
    record_status(&store, "d", status(4, "5", S::Downloading, ""), now).unwrap();
    assert_eq!(get().running_version.as_deref(), Some("0"));
    record_status(&store, "d", status(4, "5", S::Active, ""), now).unwrap();
    assert_eq!(get().running_version.as_deref(), Some("5"));
}

/// A device with a valid certificate writes only into what it was
/// assigned: another model, or another version of its own, is refused
/// and counted; and each model's samples stop at the quota.
#[test]
fn a_device_reports_only_on_what_it_was_assigned_within_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let now = OffsetDateTime::now_utc();
    admission::remember(&store, "d", "m", "1").unwrap();
    let quotas = admission::Quotas::default();
    let admit = Admission {
        quota: admission::Quota {
            sketches_per_hour: 100,
            samples_per_hour: 3,
            ..admission::Quota::default()
        },
        quotas: &quotas,
    };
    let mut r = report(1);
    let honest = (r.sketches[0].clone(), r.samples[0].clone());
    for (model, version) in [("victim", "1"), ("m", "2")] {
        let mut sketch = honest.0.clone();
        (sketch.model_name, sketch.model_version) = (model.into(), version.into());
        r.sketches.push(sketch);
        let mut sample = honest.1.clone();
        (sample.model_name, sample.model_version) = (model.into(), version.into());
        r.samples.push(sample);
        r.models.push(pb::ModelMetrics {
            model_name: model.into(),
            model_version: version.into(),
            requests: 1,
            ..Default::default()
        });
    }
    for i in 0..4 {
        let mut sample = honest.1.clone();
        sample.request_id = format!("more-{i}");
        r.samples.push(sample);
    }
    let (rec, models) = record_telemetry(&store, &admit, "d", r, now).unwrap();
    assert_eq!(
        rec,
        Recorded {
            acked: 1,
            refused_foreign: 6,
            refused_over_quota: 2,
        }
    );
    assert_eq!(models, ["m"]);
    assert_eq!(store.drift.sketches.scan_prefix("").unwrap().len(), 1);
    assert!(store
        .drift
        .samples
        .scan_prefix("victim/")
        .unwrap()
        .is_empty());
    assert!(store.drift.samples.scan_prefix("m/2/").unwrap().is_empty());
    assert_eq!(store.drift.samples.scan_prefix("m/1/d/").unwrap().len(), 3);
    let stored = store
        .fleet
        .telemetry
        .get("d/00000000000000000001")
        .unwrap()
        .unwrap();
    assert!(stored.models.is_empty(), "{:?}", stored.models);
    assert_eq!((stored.refused_foreign, stored.refused_over_quota), (6, 2));

    let mut foreign = status(1, "1", pb::AssignmentState::Active, "1");
    foreign.model_name = "victim".into();
    assert!(matches!(
        record_status(&store, "d", foreign, now),
        Err(Error::PermissionDenied(_))
    ));
    assert!(store
        .fleet
        .assignment_status
        .get("d/victim")
        .unwrap()
        .is_none());
}

#[test]
fn a_replayed_report_is_stored_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let now = OffsetDateTime::now_utc();
    assert_eq!(ingest(&store, "d", report(1), now).unwrap(), 1);
    // The replay differs (a bug on the device): the first copy stays.
    let mut replay = report(1);
    replay.sketches[0].requests = 99;
    assert_eq!(ingest(&store, "d", replay, now).unwrap(), 1);
    assert_eq!(ingest(&store, "d", report(2), now).unwrap(), 2);
    assert_eq!(ingest(&store, "other", report(1), now).unwrap(), 1);

    let sketches = store.drift.sketches.scan_prefix("m/1/d/").unwrap();
    assert_eq!(sketches.len(), 2);
    assert_eq!(sketches[0].1.requests, 2);
    assert_eq!(store.drift.samples.scan_prefix("m/").unwrap().len(), 3);
    let rec = store
        .fleet
        .telemetry
        .get("d/00000000000000000001")
        .unwrap()
        .unwrap();
    assert_eq!(
        (rec.sketch_count, rec.sample_count, rec.dropped_batches),
        (1, 1, 2)
    );
}

#[test]
fn an_invalid_report_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let mut bad = report(1);
    bad.samples[0].kind = 0;
    let err = ingest(&store, "d", bad, OffsetDateTime::now_utc()).unwrap_err();
    assert!(
        matches!(&err, Error::BadRequest { field: Some(f), .. } if f == "samples[0].kind"),
        "{err}"
    );
    assert!(store.drift.sketches.scan_prefix("").unwrap().is_empty());
    assert!(store.fleet.telemetry.scan_prefix("").unwrap().is_empty());
    let err = ingest(&store, "d", report(0), OffsetDateTime::now_utc()).unwrap_err();
    assert!(err.to_string().contains("start at 1"));
    let mut bad = report(1);
    bad.models.push(pb::ModelMetrics {
        latency_p99_ms: f64::INFINITY,
        ..Default::default()
    });
    let err = ingest(&store, "d", bad, OffsetDateTime::now_utc()).unwrap_err();
    assert!(
        matches!(&err, Error::BadRequest { field: Some(f), .. } if f == "models[0].latency_p99_ms"),
        "{err}"
    );
}

#[test]
fn status_records_written_with_proto_names_still_decode() {
    let old = serde_json::json!({
        "device": "d",
        "generation": 3,
        "model_name": "m",
        "model_version": "2",
        "state": "ASSIGNMENT_STATE_ROLLED_BACK",
        "reason": "probe failed",
        "execution_provider": "CPUExecutionProvider",
        "at": "2024-05-01T12:00:00Z",
    });
    let record: AssignmentStatusRecord = serde_json::from_value(old).unwrap();
    assert_eq!(record.state, AssignmentState::RolledBack);
    assert_eq!(record.running_version, None);
    for (name, state) in [
        ("ASSIGNMENT_STATE_DOWNLOADING", AssignmentState::Downloading),
        ("ASSIGNMENT_STATE_ACTIVATING", AssignmentState::Activating),
        ("ASSIGNMENT_STATE_ACTIVE", AssignmentState::Active),
        ("ASSIGNMENT_STATE_FAILED", AssignmentState::Failed),
        ("ASSIGNMENT_STATE_ROLLED_BACK", AssignmentState::RolledBack),
    ] {
        let old: AssignmentState = serde_json::from_value(name.into()).unwrap();
        assert_eq!(old, state);
        // New writes use the short form, which reads back the same.
        let new = serde_json::to_value(state).unwrap();
        assert_eq!(
            new,
            name.trim_start_matches("ASSIGNMENT_STATE_").to_lowercase()
        );
        assert_eq!(
            serde_json::from_value::<AssignmentState>(new).unwrap(),
            state
        );
    }
    assert!(
        serde_json::from_value::<AssignmentState>("ASSIGNMENT_STATE_UNSPECIFIED".into()).is_err()
    );
}

#[test]
fn the_store_reads_an_old_status_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Written as the previous release wrote it.
    let old = br#"{"device":"d","generation":1,"model_name":"m","model_version":"1","state":"ASSIGNMENT_STATE_ACTIVE","reason":"","execution_provider":"","at":"2024-05-01T12:00:00Z","running_version":"1"}"#;
    let raw: serde_json::Value = serde_json::from_slice(old).unwrap();
    {
        let store = edgeloop_store::Store::open(&path).unwrap();
        let tree = store
            .tree::<serde_json::Value>("assignment_status")
            .unwrap();
        tree.insert("d/m", &raw).unwrap();
    }
    let store = Db::open(&path).unwrap();
    let got = store.fleet.assignment_status.get("d/m").unwrap().unwrap();
    assert_eq!(got.state, AssignmentState::Active);
}
