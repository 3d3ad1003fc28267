use std::collections::BTreeMap;

use edgeloop_models::Digest;
use time::{Duration, OffsetDateTime};

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
