use rcgen::{CertificateParams, KeyPair};

use super::*;
use crate::fleet::members::{self, CapabilitiesRecord, CreateToken, Enrollment};
use crate::fleet::Events;

fn at(days: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap() + Duration::days(days)
}

fn record(fingerprint: &[u8], not_before: i64, not_after: i64) -> Member {
    Member {
        cert_not_before: Some(at(not_before)),
        last_seen: None,
        ..Member::enrolled(
            "cam",
            MemberKind::Device,
            Digest::of(fingerprint),
            at(not_after),
            at(0),
        )
    }
}

fn pending(fingerprint: &[u8], not_before: i64, not_after: i64) -> PendingCert {
    PendingCert {
        key: Digest::of(b"new key"),
        certificate_pem: "PEM".into(),
        fingerprint: Digest::of(fingerprint),
        not_before: at(not_before),
        not_after: at(not_after),
    }
}

#[test]
fn renewal_is_due_from_two_thirds_of_the_lifetime() {
    let table = [
        (0, false),
        (243, false),
        // 365 * 2 / 3 = 243.33 days.
        (244, true),
        (364, true),
        (400, true),
    ];
    for (day, want) in table {
        assert_eq!(renewal_due(at(0), at(365), at(day)), want, "day {day}");
    }
    // Records from before renewal start at enrollment.
    let old = Member {
        cert_not_before: None,
        enrolled_at: at(10),
        ..record(b"c", 0, 365)
    };
    assert_eq!(cert_not_before(&old), at(10));
}

#[test]
fn only_the_current_certificate_past_two_thirds_is_told_to_renew() {
    let current = b"current".as_slice();
    let m = Member {
        previous_cert: Some(PreviousCert {
            fingerprint: Digest::of(b"old"),
            valid_until: at(300),
        }),
        ..record(current, 0, 365)
    };
    // (presented, day, told to renew)
    let cases: [(&[u8], i64, bool); 4] = [
        (current, 243, false),
        (current, 244, true),
        (b"old", 244, false), // draining: its successor exists
        (b"other", 300, false),
    ];
    for (presented, day, want) in cases {
        assert_eq!(
            renew_hint(&m, Digest::of(presented), at(day)),
            want,
            "{presented:?} day {day}"
        );
    }
}

#[test]
fn admission_table() {
    let current = b"current".as_slice();
    let new = b"new".as_slice();
    let old = b"old".as_slice();
    let base = record(current, 0, 365);
    let with_pending = Member {
        pending_cert: Some(pending(new, 250, 615)),
        ..base.clone()
    };
    let draining = Member {
        previous_cert: Some(PreviousCert {
            fingerprint: Digest::of(old),
            valid_until: at(251),
        }),
        ..base.clone()
    };
    use Admission::*;
    let cases: Vec<(&str, &Member, &[u8], i64, Admission)> = vec![
        ("current", &base, current, 100, Current),
        (
            "current, expired",
            &base,
            current,
            365,
            Refused(Refusal::Expired),
        ),
        (
            "a stranger",
            &base,
            b"other",
            100,
            Refused(Refusal::Superseded),
        ),
        // The old certificate keeps working while the new one is unused.
        (
            "current, renewal pending",
            &with_pending,
            current,
            300,
            Current,
        ),
        (
            "pending, first use",
            &with_pending,
            new,
            300,
            FirstUseOfRenewed,
        ),
        (
            "pending, expired",
            &with_pending,
            new,
            615,
            Refused(Refusal::Expired),
        ),
        (
            "current, pending, expired",
            &with_pending,
            current,
            365,
            Refused(Refusal::Expired),
        ),
        ("replaced, in its drain", &draining, old, 250, Draining),
        (
            "replaced, drained",
            &draining,
            old,
            251,
            Refused(Refusal::Expired),
        ),
    ];
    for (name, member, presented, day, want) in cases {
        assert_eq!(
            admit(member, Digest::of(presented), at(day)),
            want,
            "{name}"
        );
    }
}

#[test]
fn promotion_makes_the_pending_certificate_current_and_the_old_one_drain() {
    let m = Member {
        pending_cert: Some(pending(b"new", 250, 615)),
        ..record(b"current", 0, 365)
    };
    let now = at(300);
    let p = promote(m.clone(), now);
    assert_eq!(p.cert_fingerprint, Digest::of(b"new"));
    assert_eq!(p.cert_not_after, at(615));
    assert_eq!(p.cert_not_before, Some(at(250)));
    assert_eq!(p.pending_cert, None);
    assert_eq!(
        p.previous_cert,
        Some(PreviousCert {
            fingerprint: Digest::of(b"current"),
            valid_until: now + DRAIN
        })
    );
    // The drain never outlives the old certificate.
    let late = promote(m.clone(), at(365) - Duration::seconds(10));
    assert_eq!(late.previous_cert.unwrap().valid_until, at(365));
    // Nothing pending: nothing changes.
    let plain = record(b"current", 0, 365);
    assert_eq!(
        promote(plain.clone(), now).cert_fingerprint,
        plain.cert_fingerprint
    );
    assert_eq!(promote(plain, now).previous_cert, None);
}

fn csr(key: &KeyPair) -> String {
    CertificateParams::default()
        .serialize_request(key)
        .unwrap()
        .pem()
        .unwrap()
}

fn der(pem: &str) -> rustls::pki_types::CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// Enrollment, then two renewals years apart on an injected clock, through
/// the same `authorize` and `renew` the gRPC handlers call; then a
/// revoked member is refused.
#[tokio::test]
async fn a_member_renews_twice_and_a_revoked_one_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let pki = Pki::load_or_init(&dir.path().join("pki"), &["localhost".into()]).unwrap();
    let lifetime = Duration::days(365);
    let day0 = OffsetDateTime::now_utc();
    let day = |d: i64| day0 + Duration::days(d);
    let token = members::create_token(
        &store,
        &pki,
        CreateToken {
            kind: MemberKind::Device,
            name: Some("cam".into()),
            labels: None,
            project: None,
            ttl_seconds: None,
        },
        day0,
    )
    .await
    .unwrap();
    let key0 = KeyPair::generate().unwrap();
    let (_, cert0) = members::enroll(
        &store,
        &pki,
        Enrollment {
            kind: MemberKind::Device,
            token: &token.token,
            csr_pem: &csr(&key0),
            capabilities: CapabilitiesRecord::default(),
        },
        lifetime,
        day0,
    )
    .await
    .unwrap();
    let identity = Some("device/cam");
    let authorize = |fp: Digest, now: OffsetDateTime| {
        members::authorize(&store, MemberKind::Device, identity, fp, now).map(|a| a.member)
    };
    let renew_as = |member: &Member, presented: Digest, csr_pem: &str, now: OffsetDateTime| {
        let (store, pki, member, csr_pem) = (&store, &pki, member.clone(), csr_pem.to_string());
        async move { renew(store, pki, &member, presented, &csr_pem, lifetime, now).await }
    };

    let mut current = cert0;
    for (round, renew_on) in [(1, 250), (2, 500)] {
        let now = day(renew_on);
        let member = authorize(current.fingerprint, now).unwrap();
        assert!(
            renewal_due(cert_not_before(&member), member.cert_not_after, now),
            "round {round}: due on day {renew_on}"
        );
        let key = KeyPair::generate().unwrap();
        let new = renew_as(&member, current.fingerprint, &csr(&key), now)
            .await
            .unwrap();
        assert_eq!(new.not_after, now + lifetime, "round {round}");
        let new_der = der(&new.pem);
        assert_eq!(Digest::of(new_der.as_ref()), new.fingerprint);
        assert_eq!(pki::identity_of(new_der.as_ref()).as_deref(), identity);
        // The reply lost, the same key again: the same certificate.
        let again = renew_as(&member, current.fingerprint, &csr(&key), now)
            .await
            .unwrap();
        assert_eq!(
            again.fingerprint, new.fingerprint,
            "round {round}: idempotent"
        );
        // Until the new certificate is used, the old one works.
        let later = now + Duration::hours(1);
        authorize(current.fingerprint, later).unwrap();
        let promoted = authorize(new.fingerprint, later).unwrap();
        assert_eq!(promoted.cert_fingerprint, new.fingerprint);
        assert_eq!(promoted.cert_not_after, now + lifetime);
        assert!(!renewal_due(
            cert_not_before(&promoted),
            promoted.cert_not_after,
            later
        ));
        // The old one drains, then stops.
        authorize(current.fingerprint, later + Duration::seconds(60)).unwrap();
        let err = authorize(current.fingerprint, later + DRAIN).unwrap_err();
        assert!(matches!(err, Error::Unauthenticated(_)), "{err}");
        // A replaced certificate cannot renew.
        let draining = authorize(current.fingerprint, later + Duration::seconds(1)).unwrap();
        let err = renew_as(
            &draining,
            current.fingerprint,
            &csr(&KeyPair::generate().unwrap()),
            later,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Conflict(_)), "{err}");
        current = new;
    }
    // Past day 365 the first certificate would have ended; the fleet runs on.
    authorize(current.fingerprint, day(800)).unwrap();
    // Without renewal a certificate ends: refused on the control plane's clock.
    let err = authorize(current.fingerprint, day(865)).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");

    // Revoked: neither the certificate nor a renewal works.
    let stale = store
        .fleet
        .members(MemberKind::Device)
        .get("cam")
        .unwrap()
        .unwrap();
    members::revoke(
        &store,
        &Events::default(),
        MemberKind::Device,
        "cam",
        None,
        day(760),
    )
    .await
    .unwrap();
    let err = authorize(current.fingerprint, day(760)).unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err}");
    // Even with the record read before the revocation, the store refuses.
    let err = renew_as(
        &stale,
        current.fingerprint,
        &csr(&KeyPair::generate().unwrap()),
        day(760),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err}");
}
