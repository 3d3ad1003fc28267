use time::Duration as Span;

use super::*;
use crate::fleet::members;
use crate::fleet::members::tests::{at, member};

#[test]
fn a_heartbeat_batches_a_stale_last_seen_and_writes_new_capabilities_now() {
    use HeartbeatWrite as W;
    let window = time::Duration::seconds(30);
    let gpu = CapabilitiesRecord {
        execution_providers: vec!["CUDAExecutionProvider".into()],
        ..Default::default()
    };
    let same = CapabilitiesRecord::default();
    // (last seen, capabilities sent, now, want)
    let cases = [
        (Some(100), None, 110, W::Nothing),
        (Some(100), Some(&same), 114, W::Nothing),
        (Some(100), None, 115, W::Batched),
        (Some(100), Some(&same), 200, W::Batched),
        (None, None, 100, W::Batched),
        (Some(100), Some(&gpu), 101, W::Now),
        (Some(100), Some(&gpu), 200, W::Now),
    ];
    for (seen, caps, now, want) in cases {
        assert_eq!(
            heartbeat_write(&member(seen, false), caps, at(now), window),
            want,
            "{seen:?} {caps:?} {now}"
        );
    }
}

#[test]
fn a_flush_moves_last_seen_forward_only_and_skips_revoked_and_unknown_members() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(dir.path()).unwrap();
    let devices = store.fleet.members(MemberKind::Device);
    let fresh = Member {
        id: "fresh".into(),
        ..member(Some(500), false)
    };
    let stale = Member {
        id: "stale".into(),
        ..member(Some(100), false)
    };
    let revoked = Member {
        id: "revoked".into(),
        ..member(Some(100), true)
    };
    for m in [&fresh, &stale, &revoked] {
        devices.insert(&m.id, m).unwrap();
    }
    let p = Presence::default();
    p.note(MemberKind::Device, "stale", at(200));
    p.note(MemberKind::Device, "stale", at(190)); // older: kept at 200
    p.note(MemberKind::Device, "fresh", at(300)); // older than stored
    p.note(MemberKind::Device, "revoked", at(200));
    p.note(MemberKind::Device, "gone", at(200));
    p.note(MemberKind::Cluster, "stale", at(200)); // no such cluster
    assert_eq!(p.pending(), 5);
    assert_eq!(p.flush(&store).unwrap(), 2, "stale and fresh");
    assert_eq!(p.pending(), 0);
    let seen = |id: &str| devices.get(id).unwrap().and_then(|m| m.last_seen);
    assert_eq!(seen("stale"), Some(at(200)));
    assert_eq!(seen("fresh"), Some(at(500)), "never backwards");
    assert_eq!(seen("revoked"), Some(at(100)), "a revoked member is left");
    assert!(devices.get("gone").unwrap().is_none(), "nothing created");
    assert!(store
        .fleet
        .members(MemberKind::Cluster)
        .get("stale")
        .unwrap()
        .is_none());
}

#[test]
fn heartbeat_write_table() {
    // Beats every 10 s, offline after three missed.
    let offline_after = Span::seconds(30);
    let gpu = CapabilitiesRecord {
        hostname: "other".into(),
        ..CapabilitiesRecord::default()
    };
    let same = CapabilitiesRecord::default();
    let cases = [
        // (last_seen, now, capabilities sent, writes)
        (None, 100, None, true),
        (Some(100), 100, None, false),
        (Some(100), 110, None, false), // one interval: the next beat writes
        (Some(100), 114, None, false),
        (Some(100), 115, None, true), // an interval and a half
        (Some(100), 200, None, true),
        (Some(100), 101, Some(&same), false), // unchanged capabilities
        (Some(100), 101, Some(&gpu), true),   // changed ones, at once
        (Some(100), 90, None, false),         // a clock that went back
    ];
    for (seen, now, caps, want) in cases {
        assert_eq!(
            heartbeat_write_due(&member(seen, false), caps, at(now), offline_after),
            want,
            "{seen:?} {now} {caps:?}"
        );
    }
    // Beats every interval, jittered by a second either way: a live member
    // is written every other beat and never looks offline.
    let mut m = member(Some(0), false);
    let (mut writes, beats) = (0, 100);
    for beat in 1..=beats {
        let now = beat * 10 + if beat % 2 == 0 { 1 } else { -1 };
        let age_before = now - m.last_seen.map_or(0, |s| (s - at(0)).whole_seconds());
        assert!(age_before <= 30, "offline at beat {beat}: {age_before} s");
        if heartbeat_write_due(&m, None, at(now), offline_after) {
            m.last_seen = Some(at(now));
            writes += 1;
        }
    }
    assert!(
        writes <= beats * 6 / 10,
        "{writes} writes for {beats} beats"
    );
}

/// A beat that is not due touches nothing; a due one writes from the
/// record the caller read, reading nothing more (on PostgreSQL, one
/// statement); a caller's copy that is out of date still gets the right
/// answer, a member revoked meanwhile included.
#[test]
fn heartbeats_write_when_due_from_the_record_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    // Beats every 10 s, offline after three missed.
    let offline_after = Span::seconds(30);
    let read = |m: &Member| members::get(&store, MemberKind::Device, &m.id).unwrap();
    let m = member(Some(100), false);
    store
        .fleet
        .members(MemberKind::Device)
        .insert(&m.id, &m)
        .unwrap();

    let before = store.read_counts();
    write_now(&store, &m, None, at(105), offline_after).unwrap();
    let due = read(&m);
    assert_eq!(due.last_seen, Some(at(100)), "not due: nothing written");
    let before_due = store.read_counts();
    write_now(&store, &due, None, at(115), offline_after).unwrap();
    let after = store.read_counts();
    assert_eq!(
        before_due.since(&before).total().calls,
        1,
        "only the test's own read"
    );
    assert_eq!(
        after.since(&before_due).total().calls,
        0,
        "a due beat reads nothing"
    );
    let written = read(&m);
    assert_eq!(written.last_seen, Some(at(115)));

    // An out-of-date copy (another replica wrote since): the swap misses,
    // the write is made from what is stored.
    let gpu = CapabilitiesRecord {
        hostname: "moved".into(),
        ..CapabilitiesRecord::default()
    };
    write_now(&store, &due, Some(gpu.clone()), at(116), offline_after).unwrap();
    let moved = read(&m);
    assert_eq!(moved.last_seen, Some(at(116)));
    assert_eq!(moved.capabilities, gpu);

    // Revoked meanwhile: refused, and nothing written.
    let revoked = member(Some(100), true);
    store
        .fleet
        .members(MemberKind::Device)
        .insert(&m.id, &revoked)
        .unwrap();
    let err = write_now(&store, &moved, None, at(200), offline_after).unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    assert_eq!(read(&m).last_seen, Some(at(100)));
}

/// The entry point does what [`heartbeat_write`] decides: a stale
/// `last_seen` waits in the batch, new capabilities are written at once.
#[test]
fn a_heartbeat_notes_or_writes_as_decided() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let window = Span::seconds(30);
    let m = member(Some(100), false);
    store
        .fleet
        .members(MemberKind::Device)
        .insert(&m.id, &m)
        .unwrap();
    let p = Presence::default();
    let beat = |caps, now| p.heartbeat(&store, &m, caps, at(now), window).unwrap();
    assert_eq!(beat(None, 101), HeartbeatWrite::Nothing);
    assert_eq!(p.pending(), 0);
    assert_eq!(beat(None, 120), HeartbeatWrite::Batched);
    assert_eq!(p.pending(), 1);
    let stored = |store: &Db| members::get(store, MemberKind::Device, "d").unwrap();
    assert_eq!(stored(&store).last_seen, Some(at(100)), "not written yet");
    let gpu = CapabilitiesRecord {
        hostname: "moved".into(),
        ..CapabilitiesRecord::default()
    };
    assert_eq!(beat(Some(gpu.clone()), 121), HeartbeatWrite::Now);
    assert_eq!(stored(&store).capabilities, gpu);
    assert_eq!(stored(&store).last_seen, Some(at(121)));
}
