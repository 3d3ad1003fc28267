//! Table tests of the pure decisions: expiry, the representative, reports
//! and requests.

use super::*;

fn at(s: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
}

fn record(state: BenchmarkState) -> BenchmarkRecord {
    let d = Digest::of(b"m");
    BenchmarkRecord {
        id: "b-1".into(),
        device: "edge-1".into(),
        selector: None,
        origin: None,
        state,
        models: ["float", "fp16"]
            .map(|n| ModelEntry {
                name: n.into(),
                artifact_digest: d,
                artifact_size: 10,
                manifest_digest: None,
            })
            .to_vec(),
        inputs_digest: d,
        inputs_size: 5,
        runs: 10,
        timeout_seconds: 60,
        created_at: at(0),
        started_at: None,
        finished_at: None,
        reason: None,
        timed_on: None,
        results: vec![],
    }
}

#[test]
fn an_unfinished_benchmark_fails_at_its_deadline_saying_how_far_it_got() {
    use BenchmarkState::*;
    for (state, now, failed_with) in [
        (Pending, 59, None),
        (Pending, 60, Some("did not take the benchmark within 60 s")),
        (Running, 61, Some("did not report within 60 s")),
        (Succeeded, 1_000, None),
        (Failed, 1_000, None),
    ] {
        let got = expire(&record(state), at(now));
        assert_eq!(got.is_some(), failed_with.is_some(), "{state:?} at {now}");
        if let (Some(r), Some(why)) = (got, failed_with) {
            assert_eq!((r.state, r.finished_at), (Failed, Some(at(now))));
            let reason = r.reason.unwrap();
            assert!(
                reason.starts_with("device edge-1 ") && reason.contains(why),
                "{reason}"
            );
        }
    }
}

fn member(id: &str, seen: Option<i64>, revoked: bool) -> Member {
    Member {
        cert_not_before: None,
        last_seen: seen.map(at),
        revoked_at: revoked.then(|| at(-1)),
        ..Member::enrolled(
            id,
            MemberKind::Device,
            Digest::of(id.as_bytes()),
            at(1_000_000),
            at(-1_000),
        )
    }
}

#[test]
fn the_representative_is_online_and_seen_last_ties_to_the_lower_id() {
    let window = Duration::seconds(30);
    let now = at(100);
    for (members, want) in [
        (vec![], None),
        (vec![member("a", Some(0), false)], None), // offline
        (vec![member("a", None, false)], None),    // never seen
        (vec![member("a", Some(95), true)], None), // revoked
        (
            vec![member("a", Some(80), false), member("b", Some(90), false)],
            Some("b"),
        ),
        (
            vec![member("c", Some(90), false), member("b", Some(90), false)],
            Some("b"),
        ),
        (
            vec![member("a", Some(10), false), member("z", Some(99), false)],
            Some("z"),
        ),
    ] {
        let got = representative(&members, now, window).map(|m| m.id.as_str());
        assert_eq!(
            got,
            want,
            "{:?}",
            members.iter().map(|m| &m.id).collect::<Vec<_>>()
        );
    }
}

fn timing(name: &str, p50: f64, error: &str) -> pb::ModelTiming {
    pb::ModelTiming {
        name: name.into(),
        latency_p50_ms: p50,
        latency_p90_ms: p50,
        runs: 10,
        execution_provider: "CPUExecutionProvider".into(),
        error: error.into(),
    }
}

fn report(timings: Vec<pb::ModelTiming>) -> pb::BenchmarkReport {
    pb::BenchmarkReport {
        id: "b-1".into(),
        timings,
        timed_on: "x".into(),
        error: String::new(),
    }
}

#[test]
fn a_report_is_accepted_only_whole_from_its_device_in_time() {
    use BenchmarkState::*;
    let running = record(Running);
    let ok = report(vec![timing("fp16", 2.0, ""), timing("float", 1.0, "")]);
    let done = accept_report(&running, "edge-1", &ok, at(5)).unwrap();
    assert_eq!(done.state, Succeeded);
    // In the request's order, whatever the report's.
    let names: Vec<_> = done.results.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["float", "fp16"]);
    let one_failed = report(vec![
        timing("float", 1.0, ""),
        timing("fp16", 0.0, "no CUDA"),
    ]);
    let done = accept_report(&running, "edge-1", &one_failed, at(5)).unwrap();
    assert_eq!(done.state, Succeeded);
    assert_eq!(done.results[1].error.as_deref(), Some("no CUDA"));
    assert_eq!(done.results[1].latency_p50_ms, None);
    let whole_failure = pb::BenchmarkReport {
        error: "ONNX Runtime missing".into(),
        ..report(vec![])
    };
    let failed = accept_report(&running, "edge-1", &whole_failure, at(5)).unwrap();
    assert_eq!(
        (failed.state, failed.reason.as_deref()),
        (Failed, Some("ONNX Runtime missing"))
    );

    let field = |e: Error| match e {
        Error::BadRequest { field, .. } => field.unwrap_or_default(),
        other => format!("{other:?}"),
    };
    for (r, want) in [
        (report(vec![timing("float", 1.0, "")]), "timings"),
        (
            report(vec![timing("float", 1.0, ""), timing("x", 1.0, "")]),
            "timings[1].name",
        ),
        (
            report(vec![timing("float", 1.0, ""), timing("float", 1.0, "")]),
            "timings[1].name",
        ),
        (
            report(vec![timing("float", -1.0, ""), timing("fp16", 1.0, "")]),
            "timings[0].latency_p50_ms",
        ),
        (
            report(vec![
                timing("float", f64::INFINITY, ""),
                timing("fp16", 1.0, ""),
            ]),
            "timings[0].latency_p50_ms",
        ),
    ] {
        assert_eq!(
            field(accept_report(&running, "edge-1", &r, at(5)).unwrap_err()),
            want
        );
    }
    assert!(matches!(
        accept_report(&running, "edge-2", &ok, at(5)),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        accept_report(&running, "edge-1", &ok, at(60)),
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        accept_report(&record(Succeeded), "edge-1", &ok, at(5)),
        Err(Error::Conflict(_))
    ));
    // Long text is cut, never a reason to lose the report.
    let chatty = pb::BenchmarkReport {
        timed_on: "é".repeat(5_000),
        ..ok.clone()
    };
    let kept = accept_report(&running, "edge-1", &chatty, at(5)).unwrap();
    assert!(kept.timed_on.unwrap().len() <= MAX_REPORTED_TEXT + '…'.len_utf8());
}

#[test]
fn requests_are_checked_naming_the_field() {
    let d = Digest::of(b"m");
    let ok = CreateBenchmark {
        device: Some("edge-1".into()),
        selector: None,
        models: vec![BenchmarkModel {
            name: "float".into(),
            artifact_digest: d,
            manifest_digest: None,
        }],
        inputs_digest: d,
        runs: None,
        timeout_seconds: None,
    };
    assert!(check_request(&ok).is_ok());
    let field = |r: CreateBenchmark| match check_request(&r) {
        Err(Error::BadRequest { field, .. }) => field.unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(CreateBenchmark {
            device: None,
            ..ok.clone()
        }),
        "device"
    );
    assert_eq!(
        field(CreateBenchmark {
            selector: Some("a=b".into()),
            ..ok.clone()
        }),
        "selector"
    );
    assert_eq!(
        field(CreateBenchmark {
            runs: Some(0),
            ..ok.clone()
        }),
        "runs"
    );
    assert_eq!(
        field(CreateBenchmark {
            runs: Some(MAX_RUNS + 1),
            ..ok.clone()
        }),
        "runs"
    );
    assert_eq!(
        field(CreateBenchmark {
            timeout_seconds: Some(MIN_TIMEOUT_SECONDS - 1),
            ..ok.clone()
        }),
        "timeout_seconds"
    );
    let many = vec![ok.models[0].clone(); MAX_MODELS + 1];
    assert_eq!(
        field(CreateBenchmark {
            models: many,
            ..ok.clone()
        }),
        "models"
    );
    let bad_name = vec![BenchmarkModel {
        name: "Float".into(),
        artifact_digest: d,
        manifest_digest: None,
    }];
    assert_eq!(
        field(CreateBenchmark {
            models: bad_name,
            ..ok
        }),
        "models[0].name"
    );
}
