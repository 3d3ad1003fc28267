//! Signed manifests: round trips, and every kind of tampering failing closed.

use std::os::unix::fs::PermissionsExt;

use edgeloop_models::manifest::{
    ArtifactRef, ClassShare, DimSpec, HealthProbe, InputHistogram, IoSignature, Lineage, Manifest,
    ManifestError, ManifestKey, PublicKey, QuantizationRecord, ReferenceStats, SignedManifest,
    TensorSpec, MAX_SIGNED_MANIFEST_BYTES, SCHEMA_VERSION, SIGNING_CONTEXT,
};
use edgeloop_models::Digest;
use proptest::prelude::*;
use serde::Serialize;

const ARTIFACT: &[u8] = b"pretend this is an ONNX model";

#[derive(Serialize)]
struct Candidate {
    method: &'static str,
    accuracy_drop: f64,
    latency_ms: f64,
}

#[derive(Serialize)]
struct Evidence {
    chosen: &'static str,
    candidates: Vec<Candidate>,
}

fn evidence(latency: f64) -> Evidence {
    Evidence {
        chosen: "static-int8",
        candidates: vec![
            Candidate {
                method: "dynamic-int8",
                accuracy_drop: 0.012,
                latency_ms: 4.5,
            },
            Candidate {
                method: "static-int8",
                accuracy_drop: 0.004,
                latency_ms: latency,
            },
        ],
    }
}

fn sample() -> Manifest {
    Manifest {
        schema: SCHEMA_VERSION,
        name: "mnist-cnn".into(),
        version: "1.2.0-rc.1+build.7".into(),
        artifact: ArtifactRef {
            sha256: Digest::of(ARTIFACT),
            size: ARTIFACT.len() as u64,
            format: "onnx".into(),
        },
        signature: IoSignature {
            inputs: vec![TensorSpec {
                name: "input".into(),
                dtype: "float32".into(),
                shape: vec![
                    DimSpec::Symbolic("batch".into()),
                    DimSpec::Fixed(1),
                    DimSpec::Fixed(28),
                    DimSpec::Fixed(28),
                ],
            }],
            outputs: vec![TensorSpec {
                name: "logits".into(),
                dtype: "float32".into(),
                shape: vec![DimSpec::Symbolic("batch".into()), DimSpec::Fixed(10)],
            }],
        },
        quantization: Some(
            QuantizationRecord::new("static-int8", &evidence(3.25)).expect("finite evidence"),
        ),
        reference_stats: Some(ReferenceStats {
            inputs: vec![InputHistogram {
                name: "input".into(),
                bin_edges: vec![0.0, 0.1, 0.5, 1.0],
                counts: vec![700, 20, 80],
                input: None,
                column: None,
            }],
            prediction_distribution: vec![
                ClassShare {
                    class: 0,
                    share: 0.1,
                },
                ClassShare {
                    class: 1,
                    share: 0.2,
                },
                ClassShare {
                    class: 2,
                    share: 0.7,
                },
            ],
            sample_count: 800,
        }),
        lineage: Lineage {
            job: Some("job-42".into()),
            checkpoint: Some(Digest::of(b"checkpoint")),
            dataset: Some(Digest::of(b"dataset")),
            parent_version: Some("1.1.0".into()),
        },
        health_probe: Some(HealthProbe {
            sample_inputs: Digest::of(b"samples.npz"),
            max_latency_ms: 25.0,
        }),
        created_at: "2025-01-02T03:04:05.678Z".into(),
        min_version: None,
        rollback: false,
    }
}

fn signed() -> (ManifestKey, SignedManifest) {
    let key = ManifestKey::generate();
    let signed = key.sign(sample()).expect("valid manifest signs");
    (key, signed)
}

fn invalid_field(err: &ManifestError) -> &str {
    match err {
        ManifestError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// Edits the JSON of a signed manifest the way an attacker with the file would.
fn tamper(signed: &SignedManifest, edit: impl FnOnce(&mut serde_json::Value)) -> SignedManifest {
    let mut json = serde_json::to_value(signed).expect("serialises");
    edit(&mut json);
    SignedManifest::from_json(&serde_json::to_vec(&json).expect("serialises"))
        .expect("tampered JSON still parses")
}

#[test]
fn sign_verify_round_trip() {
    let (key, signed) = signed();
    assert_eq!(signed.key_id, key.public().key_id());
    assert_eq!(signed.signature.len(), 128);
    let trusted = [key.public()];
    assert_eq!(signed.verify(&trusted).unwrap(), &sample());
    // Signing is deterministic (ed25519), so re-signing gives the same bytes.
    assert_eq!(key.sign(sample()).unwrap(), signed);
}

#[test]
fn pretty_json_round_trip_keeps_the_signature_valid() {
    let (key, signed) = signed();
    let pretty = signed.to_json_pretty().unwrap();
    assert!(pretty.contains('\n'));
    let parsed = SignedManifest::from_json(pretty.as_bytes()).unwrap();
    assert_eq!(parsed, signed);
    parsed.verify(&[key.public()]).unwrap();

    // Whitespace and key order do not matter: verification re-serialises
    // what was parsed.
    let mut reordered: serde_json::Value = serde_json::from_str(&pretty).unwrap();
    let manifest = reordered["manifest"].as_object_mut().unwrap();
    let version = manifest.remove("version").unwrap();
    manifest.insert("version".into(), version);
    let compact = serde_json::to_vec(&reordered).unwrap();
    SignedManifest::from_json(&compact)
        .unwrap()
        .verify(&[key.public()])
        .unwrap();
}

#[test]
fn tampered_manifest_fields_fail() {
    let (key, signed) = signed();
    let trusted = [key.public()];
    type JsonEdit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: Vec<(&str, JsonEdit)> = vec![
        (
            "version",
            Box::new(|j| j["manifest"]["version"] = "1.2.1".into()),
        ),
        (
            "artifact sha256",
            Box::new(|j| {
                j["manifest"]["artifact"]["sha256"] = Digest::of(b"evil").to_hex().into();
            }),
        ),
        (
            "artifact size",
            Box::new(|j| j["manifest"]["artifact"]["size"] = 1.into()),
        ),
        (
            "evidence number",
            Box::new(|j| {
                j["manifest"]["quantization"]["evidence"]["candidates"][1]["accuracy_drop"] =
                    0.0.into();
            }),
        ),
        (
            "histogram count",
            Box::new(|j| j["manifest"]["reference_stats"]["inputs"][0]["counts"][0] = 701.into()),
        ),
        (
            "dropped health probe",
            Box::new(|j| j["manifest"]["health_probe"] = serde_json::Value::Null),
        ),
        (
            "lineage parent",
            Box::new(|j| j["manifest"]["lineage"]["parent_version"] = "1.0.0".into()),
        ),
    ];
    for (what, edit) in edits {
        let tampered = tamper(&signed, edit);
        let err = tampered.verify(&trusted).unwrap_err();
        assert!(
            matches!(err, ManifestError::BadSignature(_)),
            "{what}: {err:?}"
        );
    }
}

#[test]
fn tampered_signature_fails() {
    let (key, signed) = signed();
    let trusted = [key.public()];

    let mut flipped = signed.clone();
    let last = flipped.signature.pop().unwrap();
    flipped.signature.push(if last == '0' { '1' } else { '0' });
    assert!(matches!(
        flipped.verify(&trusted),
        Err(ManifestError::BadSignature(_))
    ));

    for bad in [
        String::new(),
        "zz".repeat(64),
        signed.signature[..126].to_string(),
        format!("{}00", signed.signature),
        signed.signature.to_uppercase(),
    ] {
        let mut s = signed.clone();
        s.signature = bad.clone();
        assert!(
            matches!(s.verify(&trusted), Err(ManifestError::BadSignature(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn tampered_key_id_fails() {
    let (key, signed) = signed();
    let other = ManifestKey::generate();
    let trusted = [key.public(), other.public()];

    let mut unknown = signed.clone();
    unknown.key_id = Digest::of(b"nobody").to_hex();
    assert!(matches!(
        unknown.verify(&trusted),
        Err(ManifestError::UnknownKey { .. })
    ));

    // Pointing key_id at another trusted key only makes the wrong key check
    // the signature.
    let mut swapped = signed.clone();
    swapped.key_id = other.public().key_id();
    assert!(matches!(
        swapped.verify(&trusted),
        Err(ManifestError::BadSignature(_))
    ));

    let mut huge = signed;
    huge.key_id = "k".repeat(10_000);
    match huge.verify(&trusted) {
        Err(ManifestError::UnknownKey { key_id }) => assert!(key_id.len() <= 64),
        other => panic!("{other:?}"),
    }
}

#[test]
fn untrusted_key_is_unknown() {
    let (_, signed) = signed();
    let stranger = ManifestKey::generate();
    assert!(matches!(
        signed.verify(&[stranger.public()]),
        Err(ManifestError::UnknownKey { .. })
    ));
    assert!(matches!(
        signed.verify(&[]),
        Err(ManifestError::UnknownKey { .. })
    ));
}

#[test]
fn artifact_bytes_and_files_are_checked() {
    let (key, signed) = signed();
    let trusted = [key.public()];
    signed.verify_artifact(&trusted, ARTIFACT).unwrap();

    let mut flipped = ARTIFACT.to_vec();
    flipped[3] ^= 1;
    match signed.verify_artifact(&trusted, flipped.as_slice()) {
        Err(ManifestError::ArtifactMismatch {
            field,
            expected,
            actual,
        }) => {
            assert_eq!(field, "artifact.sha256");
            assert_eq!(expected, Digest::of(ARTIFACT).to_hex());
            assert_eq!(actual, Digest::of(&flipped).to_hex());
        }
        other => panic!("{other:?}"),
    }

    let longer = [ARTIFACT, b"!"].concat();
    assert!(matches!(
        signed.verify_artifact(&trusted, longer.as_slice()),
        Err(ManifestError::ArtifactMismatch {
            field: "artifact.size",
            ..
        })
    ));
    assert!(matches!(
        signed.verify_artifact(&trusted, &ARTIFACT[1..]),
        Err(ManifestError::ArtifactMismatch {
            field: "artifact.size",
            ..
        })
    ));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, ARTIFACT).unwrap();
    signed.verify_artifact(&trusted, path.as_path()).unwrap();
    signed
        .verify_artifact_reader(&trusted, std::fs::File::open(&path).unwrap())
        .unwrap();

    std::fs::write(&path, &flipped).unwrap();
    assert!(matches!(
        signed.verify_artifact(&trusted, path.as_path()),
        Err(ManifestError::ArtifactMismatch {
            field: "artifact.sha256",
            ..
        })
    ));
    std::fs::write(&path, &longer).unwrap();
    assert!(matches!(
        signed.verify_artifact(&trusted, path.as_path()),
        Err(ManifestError::ArtifactMismatch {
            field: "artifact.size",
            ..
        })
    ));
    // An endless stream is cut off just past the declared size.
    assert!(matches!(
        signed.verify_artifact_reader(&trusted, std::io::repeat(7)),
        Err(ManifestError::ArtifactMismatch {
            field: "artifact.size",
            ..
        })
    ));
    assert!(matches!(
        signed.verify_artifact(&trusted, dir.path().join("missing").as_path()),
        Err(ManifestError::Io { .. })
    ));

    // The artifact is only looked at once the manifest is trusted.
    assert!(matches!(
        signed.verify_artifact(&[ManifestKey::generate().public()], ARTIFACT),
        Err(ManifestError::UnknownKey { .. })
    ));
}

#[test]
fn nan_and_infinity_are_refused_at_sign_time() {
    let key = ManifestKey::generate();

    let err = QuantizationRecord::new("static-int8", &evidence(f64::NAN)).unwrap_err();
    assert_eq!(
        invalid_field(&err),
        "quantization.evidence.candidates[1].latency_ms"
    );

    type Edit = Box<dyn Fn(&mut Manifest)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "reference_stats.inputs[0].bin_edges",
            Box::new(|m| m.reference_stats.as_mut().unwrap().inputs[0].bin_edges[1] = f64::NAN),
        ),
        (
            "reference_stats.inputs[0].bin_edges",
            Box::new(|m| {
                m.reference_stats.as_mut().unwrap().inputs[0].bin_edges[3] = f64::INFINITY;
            }),
        ),
        (
            "reference_stats.prediction_distribution[1].share",
            Box::new(|m| {
                m.reference_stats.as_mut().unwrap().prediction_distribution[1].share = f64::NAN;
            }),
        ),
        (
            "health_probe.max_latency_ms",
            Box::new(|m| m.health_probe.as_mut().unwrap().max_latency_ms = f64::INFINITY),
        ),
    ];
    for (field, edit) in cases {
        let mut m = sample();
        edit(&mut m);
        let err = key.sign(m).unwrap_err();
        assert_eq!(invalid_field(&err), field);
    }
}

#[test]
fn validation_names_the_field() {
    type Edit = Box<dyn Fn(&mut Manifest)>;
    fn stats(m: &mut Manifest) -> &mut ReferenceStats {
        m.reference_stats.as_mut().expect("sample has stats")
    }
    let cases: Vec<(&str, Edit)> = vec![
        ("schema", Box::new(|m| m.schema = 2)),
        ("name", Box::new(|m| m.name = String::new())),
        ("name", Box::new(|m| m.name = "Bad Name".into())),
        ("version", Box::new(|m| m.version = "1.2".into())),
        ("version", Box::new(|m| m.version = "01.2.3".into())),
        ("artifact.size", Box::new(|m| m.artifact.size = 0)),
        (
            "artifact.format",
            Box::new(|m| m.artifact.format = "".into()),
        ),
        (
            "signature.inputs[0].dtype",
            Box::new(|m| m.signature.inputs[0].dtype = "float".into()),
        ),
        (
            "signature.inputs[0].shape[1]",
            Box::new(|m| m.signature.inputs[0].shape[1] = DimSpec::Fixed(-1)),
        ),
        (
            "signature.inputs[0].shape[0]",
            Box::new(|m| m.signature.inputs[0].shape[0] = DimSpec::Symbolic(String::new())),
        ),
        (
            "signature.outputs",
            Box::new(|m| m.signature.outputs.clear()),
        ),
        (
            "signature.outputs[1].name",
            Box::new(|m| {
                let dup = m.signature.outputs[0].clone();
                m.signature.outputs.push(dup);
            }),
        ),
        (
            "quantization.method",
            Box::new(|m| m.quantization.as_mut().unwrap().method = "Static INT8".into()),
        ),
        (
            "reference_stats.inputs[0].counts",
            Box::new(|m| stats(m).inputs[0].counts.push(1)),
        ),
        (
            "reference_stats.inputs[0].bin_edges",
            Box::new(|m| stats(m).inputs[0].bin_edges.swap(1, 2)),
        ),
        (
            "reference_stats.inputs[0].bin_edges",
            Box::new(|m| stats(m).inputs[0].bin_edges[2] = 0.1),
        ),
        (
            "reference_stats.inputs[0].bin_edges",
            Box::new(|m| {
                stats(m).inputs[0].bin_edges = vec![0.0];
                stats(m).inputs[0].counts.clear();
            }),
        ),
        (
            "reference_stats.prediction_distribution[0].share",
            Box::new(|m| stats(m).prediction_distribution[0].share = -0.1),
        ),
        (
            "reference_stats.prediction_distribution[2].class",
            Box::new(|m| stats(m).prediction_distribution[2].class = 0),
        ),
        (
            "reference_stats.prediction_distribution",
            Box::new(|m| stats(m).prediction_distribution[2].share = 0.6),
        ),
        (
            "reference_stats.sample_count",
            Box::new(|m| stats(m).sample_count = 0),
        ),
        (
            "lineage.parent_version",
            Box::new(|m| m.lineage.parent_version = Some("one".into())),
        ),
        (
            "lineage.parent_version",
            Box::new(|m| m.lineage.parent_version = Some(m.version.clone())),
        ),
        (
            "lineage.job",
            Box::new(|m| m.lineage.job = Some("a\nb".into())),
        ),
        (
            "health_probe.max_latency_ms",
            Box::new(|m| m.health_probe.as_mut().unwrap().max_latency_ms = 0.0),
        ),
        (
            "created_at",
            Box::new(|m| m.created_at = "yesterday".into()),
        ),
    ];
    sample().validate().unwrap();
    for (field, edit) in cases {
        let mut m = sample();
        edit(&mut m);
        let err = m.validate().unwrap_err();
        assert_eq!(invalid_field(&err), field, "{err}");
    }
}

#[test]
fn a_signed_but_invalid_manifest_still_fails_verification() {
    // A signer that skipped validation (an older or foreign tool) must not
    // get an invalid manifest past a verifier, however good its signature.
    use ed25519_dalek::Signer;
    let secret = [9u8; 32];
    let mut manifest = sample();
    manifest.reference_stats.as_mut().unwrap().inputs[0].bin_edges[1] = 0.9;
    let message = [SIGNING_CONTEXT, &manifest.canonical_bytes().unwrap()].concat();
    let signature = ed25519_dalek::SigningKey::from_bytes(&secret).sign(&message);
    let public = ManifestKey::from_bytes(&secret).public();
    let signed = SignedManifest {
        manifest,
        key_id: public.key_id(),
        signature: hex::encode(signature.to_bytes()),
    };
    let err = signed.verify(&[public]).unwrap_err();
    assert_eq!(invalid_field(&err), "reference_stats.inputs[0].bin_edges");
}

#[test]
fn optional_sections_may_be_absent() {
    let key = ManifestKey::generate();
    let mut m = sample();
    m.quantization = None;
    m.reference_stats = None;
    m.health_probe = None;
    m.lineage = Lineage::default();
    let signed = key.sign(m.clone()).unwrap();
    let parsed = SignedManifest::from_json(signed.to_json_pretty().unwrap().as_bytes()).unwrap();
    assert_eq!(parsed.verify(&[key.public()]).unwrap(), &m);

    // Omitted optional fields read as None, and the signature (made over the
    // `null` form) still verifies.
    let mut json = serde_json::to_value(&signed).unwrap();
    for field in ["quantization", "reference_stats", "health_probe"] {
        json["manifest"].as_object_mut().unwrap().remove(field);
    }
    SignedManifest::from_json(&serde_json::to_vec(&json).unwrap())
        .unwrap()
        .verify(&[key.public()])
        .unwrap();
}

#[test]
fn parsing_is_strict() {
    let (_, signed) = signed();
    let good = serde_json::to_value(&signed).unwrap();

    let mut extra = good.clone();
    extra["manifest"]["artifact"]["url"] = "http://evil".into();
    assert!(matches!(
        SignedManifest::from_json(&serde_json::to_vec(&extra).unwrap()),
        Err(ManifestError::Parse(_))
    ));
    let mut extra_top = good.clone();
    extra_top["trusted"] = true.into();
    assert!(matches!(
        SignedManifest::from_json(&serde_json::to_vec(&extra_top).unwrap()),
        Err(ManifestError::Parse(_))
    ));
    let mut bad_digest = good.clone();
    bad_digest["manifest"]["artifact"]["sha256"] = "../../etc/passwd".into();
    assert!(matches!(
        SignedManifest::from_json(&serde_json::to_vec(&bad_digest).unwrap()),
        Err(ManifestError::Parse(_))
    ));
    let mut null_float = good;
    null_float["manifest"]["health_probe"]["max_latency_ms"] = serde_json::Value::Null;
    assert!(matches!(
        SignedManifest::from_json(&serde_json::to_vec(&null_float).unwrap()),
        Err(ManifestError::Parse(_))
    ));

    let duplicate = br#"{"manifest":{},"manifest":{},"key_id":"","signature":""}"#;
    assert!(matches!(
        SignedManifest::from_json(duplicate),
        Err(ManifestError::Parse(_))
    ));

    let too_big = vec![b' '; MAX_SIGNED_MANIFEST_BYTES + 1];
    assert!(matches!(
        SignedManifest::from_json(&too_big),
        Err(ManifestError::TooLarge { .. })
    ));

    let deep = format!(
        r#"{{"manifest":{{"quantization":{{"evidence":{}1{}}}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(matches!(
        SignedManifest::from_json(deep.as_bytes()),
        Err(ManifestError::Parse(_))
    ));
}

#[test]
fn keys_round_trip_through_files_with_modes() {
    let dir = tempfile::tempdir().unwrap();
    let key = ManifestKey::generate();
    let secret_path = dir.path().join("manifest.key");
    let public_path = dir.path().join("manifest.pub");
    key.write_to(&secret_path).unwrap();
    key.public().write_to(&public_path).unwrap();

    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&secret_path), 0o600);
    assert_eq!(mode(&public_path), 0o644);

    let reread = ManifestKey::read_from(&secret_path).unwrap();
    assert_eq!(reread.public(), key.public());
    let public = PublicKey::read_from(&public_path).unwrap();
    assert_eq!(public, key.public());
    assert_eq!(PublicKey::from_hex(&public.to_hex()).unwrap(), public);

    // A manifest signed with the re-read key verifies with the re-read public key.
    reread.sign(sample()).unwrap().verify(&[public]).unwrap();

    std::fs::write(&secret_path, "not hex\n").unwrap();
    assert!(matches!(
        ManifestKey::read_from(&secret_path),
        Err(ManifestError::Key(_))
    ));
    std::fs::write(&public_path, vec![b'a'; 4096]).unwrap();
    assert!(matches!(
        PublicKey::read_from(&public_path),
        Err(ManifestError::Key(_))
    ));
    assert!(matches!(
        ManifestKey::read_from(&dir.path().join("missing")),
        Err(ManifestError::Io { .. })
    ));
}

#[test]
fn key_id_is_sha256_of_public_key() {
    let key = ManifestKey::from_bytes(&[42u8; 32]);
    let public = key.public();
    assert_eq!(public.key_id(), Digest::of(public.as_bytes()).to_hex());
    assert_eq!(public.to_hex().len(), 64);
}

fn finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
        -1e6..1e6f64,
        Just(0.1),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
    ]
}

proptest! {
    #[test]
    fn from_json_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = SignedManifest::from_json(&bytes);
    }
}

proptest! {
    // Each case signs a manifest, which is slow in debug builds.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn from_json_never_panics_on_mutated_manifests(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let key = ManifestKey::from_bytes(&[1u8; 32]);
        let mut bytes = key.sign(sample()).unwrap().to_json_pretty().unwrap().into_bytes();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Ok(parsed) = SignedManifest::from_json(&bytes) {
            let _ = parsed.verify(&[key.public()]);
        }
    }

    /// Any finite float survives JSON exactly, so the re-serialised manifest
    /// matches what was signed.
    #[test]
    fn floats_survive_the_round_trip(
        latency in finite_f64(),
        edge in 0.0..1.0f64,
        share in 0.0..1.0f64,
    ) {
        let key = ManifestKey::from_bytes(&[2u8; 32]);
        let mut m = sample();
        m.quantization = Some(QuantizationRecord::new("static-int8", &evidence(latency)).unwrap());
        let stats = m.reference_stats.as_mut().unwrap();
        stats.inputs[0].bin_edges[1] = edge.min(0.4999);
        stats.prediction_distribution = vec![
            ClassShare { class: 0, share },
            ClassShare { class: 1, share: 1.0 - share },
        ];
        let signed = key.sign(m).unwrap();
        let parsed = SignedManifest::from_json(signed.to_json_pretty().unwrap().as_bytes()).unwrap();
        prop_assert!(parsed.verify(&[key.public()]).is_ok());
        prop_assert_eq!(parsed, signed);
    }
}

/// Anti-rollback: the floor a served manifest sets, and which versions a
/// device with a floor may install. A manifest signed before the fields
/// existed still verifies (they are left out of the signed bytes when
/// unset), and a tampered floor breaks the signature.
#[test]
fn the_signed_floor_refuses_older_versions_unless_a_signed_rollback() {
    let at = |version: &str, floor: Option<&str>, rollback: bool| Manifest {
        version: version.into(),
        min_version: floor.map(str::to_string),
        rollback,
        lineage: Default::default(),
        ..sample()
    };
    // (manifest, device floor) -> may install, floor after serving it
    let table: &[(Manifest, Option<&str>, bool, Option<&str>)] = &[
        (at("1.0.0", None, false), None, true, None),
        (at("2.0.0", Some("2.0.0"), false), None, true, Some("2.0.0")),
        (
            at("1.5.0", None, false),
            Some("2.0.0"),
            false,
            Some("2.0.0"),
        ),
        (
            at("2.1.0", Some("1.0.0"), false),
            Some("2.0.0"),
            true,
            Some("2.0.0"),
        ),
        (
            at("3.0.0", Some("3.0.0"), false),
            Some("2.0.0"),
            true,
            Some("3.0.0"),
        ),
        (at("1.5.0", None, true), Some("2.0.0"), true, None),
        (
            at("1.5.0", Some("1.5.0"), true),
            Some("2.0.0"),
            true,
            Some("1.5.0"),
        ),
        (
            at("2.0.0-rc.1", None, false),
            Some("2.0.0"),
            false,
            Some("2.0.0"),
        ),
    ];
    for (m, floor, allowed, next) in table {
        assert_eq!(
            m.allowed_above(*floor),
            *allowed,
            "{} at floor {floor:?}",
            m.version
        );
        assert_eq!(
            m.next_floor(*floor).as_deref(),
            *next,
            "{} at floor {floor:?}",
            m.version
        );
    }
    let above_itself = at("1.0.0", Some("2.0.0"), false);
    assert_eq!(
        invalid_field(&above_itself.validate().unwrap_err()),
        "min_version"
    );
    let not_semver = at("1.0.0", Some("one"), false);
    assert_eq!(
        invalid_field(&not_semver.validate().unwrap_err()),
        "min_version"
    );

    let key = ManifestKey::generate();
    let unset = key.sign(at("1.0.0", None, false)).unwrap();
    let bytes = String::from_utf8(unset.manifest.canonical_bytes().unwrap()).unwrap();
    assert!(
        !bytes.contains("min_version") && !bytes.contains("rollback"),
        "{bytes}"
    );
    let floored = key.sign(at("2.0.0", Some("2.0.0"), false)).unwrap();
    assert!(floored.verify(&[key.public()]).is_ok());
    let lowered = tamper(&floored, |j| j["manifest"]["min_version"] = "1.0.0".into());
    assert!(lowered.verify(&[key.public()]).is_err(), "a tampered floor");
    let rolled = tamper(&floored, |j| j["manifest"]["rollback"] = true.into());
    assert!(rolled.verify(&[key.public()]).is_err(), "a forged rollback");
}
