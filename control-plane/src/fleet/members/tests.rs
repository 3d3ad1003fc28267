use super::*;

pub(crate) fn at(secs: i64) -> OffsetDateTime {
    OffsetDateTime::UNIX_EPOCH + Duration::seconds(secs)
}

/// A device enrolled at 0, its certificate valid until 1 000 000, and
/// revoked at 5 when `revoked`.
pub(crate) fn member(last_seen: Option<i64>, revoked: bool) -> Member {
    Member {
        last_seen: last_seen.map(at),
        revoked_at: revoked.then(|| at(5)),
        ..Member::enrolled(
            "d",
            MemberKind::Device,
            Digest::of(b"c"),
            at(1_000_000),
            at(0),
        )
    }
}

#[test]
fn status_table() {
    let window = Duration::seconds(30);
    let cases = [
        (None, false, 100, MemberStatus::Offline),
        (Some(100), false, 100, MemberStatus::Online),
        (Some(100), false, 130, MemberStatus::Online),
        (Some(100), false, 131, MemberStatus::Offline),
        (Some(100), true, 100, MemberStatus::Revoked),
    ];
    for (seen, revoked, now, want) in cases {
        assert_eq!(
            member_status(&member(seen, revoked), at(now), window),
            want,
            "{seen:?} {revoked} {now}"
        );
    }
}

#[test]
fn heartbeat_write_table() {
    // Beats every 10 s, offline after three missed.
    let offline_after = Duration::seconds(30);
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
    let store = Store::open(&dir.path().join("db")).unwrap();
    // Beats every 10 s, offline after three missed.
    let offline_after = Duration::seconds(30);
    let read = |m: &Member| get(&store, MemberKind::Device, &m.id).unwrap();
    let m = member(Some(100), false);
    store.members(MemberKind::Device).insert(&m.id, &m).unwrap();

    let before = store.read_counts();
    heartbeat(&store, &m, None, at(105), offline_after).unwrap();
    let due = read(&m);
    assert_eq!(due.last_seen, Some(at(100)), "not due: nothing written");
    let before_due = store.read_counts();
    heartbeat(&store, &due, None, at(115), offline_after).unwrap();
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
    heartbeat(&store, &due, Some(gpu.clone()), at(116), offline_after).unwrap();
    let moved = read(&m);
    assert_eq!(moved.last_seen, Some(at(116)));
    assert_eq!(moved.capabilities, gpu);

    // Revoked meanwhile: refused, and nothing written.
    let revoked = member(Some(100), true);
    store
        .members(MemberKind::Device)
        .insert(&m.id, &revoked)
        .unwrap();
    let err = heartbeat(&store, &moved, None, at(200), offline_after).unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    assert_eq!(read(&m).last_seen, Some(at(100)));
}

#[test]
fn token_refusal_table() {
    let secret = Digest::of(b"s");
    let record = |kind, expires, used: Option<i64>| BootstrapTokenRecord {
        project: "default".into(),
        id: "t".into(),
        kind,
        member_id: "m".into(),
        labels: BTreeMap::new(),
        secret_hash: secret,
        created_at: at(0),
        expires_at: at(expires),
        used_at: used.map(at),
        enrolled: None,
    };
    let d = MemberKind::Device;
    let c = MemberKind::Cluster;
    type Case = (
        BootstrapTokenRecord,
        Digest,
        MemberKind,
        i64,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (record(d, 100, None), secret, d, 50, None),
        (
            record(d, 100, None),
            Digest::of(b"wrong"),
            d,
            50,
            Some("unknown"),
        ),
        (
            record(d, 100, None),
            secret,
            c,
            50,
            Some("enrolls a device"),
        ),
        (record(d, 100, None), secret, d, 100, Some("expired")),
        (
            record(d, 100, Some(10)),
            secret,
            d,
            50,
            Some("already used"),
        ),
    ];
    for (rec, presented, kind, now, want) in cases {
        let got = token_refusal(&rec, presented, kind, at(now)).map(|e| e.to_string());
        match (got, want) {
            (None, None) => {}
            (Some(msg), Some(frag)) => assert!(msg.contains(frag), "{msg} !~ {frag}"),
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn only_the_same_secret_kind_and_key_make_a_retry() {
    let secret = Digest::of(b"s");
    let key = Digest::of(b"the device's public key");
    let enrolled = EnrolledKey {
        key,
        certificate_pem: "PEM".into(),
        fingerprint: Digest::of(b"cert"),
        not_after: at(1000),
    };
    let spent = BootstrapTokenRecord {
        project: "default".into(),
        id: "t".into(),
        kind: MemberKind::Device,
        member_id: "m".into(),
        labels: BTreeMap::new(),
        secret_hash: secret,
        created_at: at(0),
        expires_at: at(100),
        used_at: Some(at(10)),
        enrolled: Some(enrolled.clone()),
    };
    let d = MemberKind::Device;
    assert_eq!(retried(&spent, secret, d, key), Some(enrolled));
    // Anything else is a new enrollment, which the spent token refuses.
    let other_key = Digest::of(b"another key");
    assert_eq!(retried(&spent, secret, d, other_key), None);
    assert_eq!(retried(&spent, Digest::of(b"x"), d, key), None);
    assert_eq!(retried(&spent, secret, MemberKind::Cluster, key), None);
    let unused = BootstrapTokenRecord {
        used_at: None,
        ..spent.clone()
    };
    assert_eq!(retried(&unused, secret, d, key), None);
    let from_before = BootstrapTokenRecord {
        enrolled: None,
        ..spent
    };
    assert_eq!(retried(&from_before, secret, d, key), None);
}

#[test]
fn identity_round_trip() {
    assert_eq!(
        MemberKind::parse_identity("device/cam-1"),
        Some((MemberKind::Device, "cam-1"))
    );
    assert_eq!(
        MemberKind::parse_identity("cluster/gpu"),
        Some((MemberKind::Cluster, "gpu"))
    );
    assert_eq!(MemberKind::parse_identity("admin/x"), None);
    assert_eq!(MemberKind::parse_identity("device"), None);
}
