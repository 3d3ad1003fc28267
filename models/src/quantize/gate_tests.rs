//! Table tests of the gate's pure parts: candidate labels, and the choice
//! made again with latencies timed on a device.

use super::*;

fn tagged(name: &str) -> ir::ModelProto {
    ir::ModelProto {
        producer_name: Some(name.into()),
        ..Default::default()
    }
}

fn measured(name: &str, size: u64, loss: f64, local_ms: f64) -> Measurement {
    let budget = 1.0;
    let (accepted, verdict) = verdict(MetricKind::Top1Accuracy, loss, budget, None);
    Measurement {
        name: name.into(),
        metric: 90.0 - loss,
        loss,
        details: BTreeMap::new(),
        size_bytes: size,
        latency_ms: local_ms,
        quantize_ms: 1.0,
        within_budget: loss <= budget,
        accepted,
        verdict,
        report: Report::default(),
    }
}

/// Float 100 bytes; int8 30 (within budget), dynamic 25 (over budget),
/// fp16 50 (within budget); timed on the quantizing host as 1 ms each.
fn outcome() -> GateOutcome {
    let candidates = vec![
        measured("int8-static-entropy", 30, 0.2, 1.0),
        measured("int8-dynamic", 25, 3.0, 1.0),
        measured("fp16", 50, 0.0, 1.0),
    ];
    let float = measured("float", 100, 0.0, 1.0);
    let models: Vec<_> = candidates.iter().map(|c| Some(tagged(&c.name))).collect();
    let (chosen, reason, chosen_model) = choose(
        &float,
        &candidates,
        &models,
        &tagged("float"),
        MetricKind::Top1Accuracy,
        1.0,
    );
    GateOutcome {
        task: Task::Classification,
        metric: MetricRecord::new(MetricKind::Top1Accuracy, 1.0, 90.0),
        latency: LatencyRecord {
            gate: LatencyGate::Report,
            timed_on: "here".into(),
        },
        float,
        candidates,
        chosen,
        reason,
        chosen_model,
        candidate_models: models,
    }
}

#[test]
fn device_timings_decide_latency_and_the_choice_is_made_again() {
    let not_slower = LatencyGate::NotSlowerThanFloat { tolerance: 0.1 };
    let ms = |pairs: &[(&str, Result<f64, &str>)]| -> BTreeMap<String, Result<f64, String>> {
        pairs
            .iter()
            .map(|(n, t)| (n.to_string(), t.map_err(str::to_string)))
            .collect()
    };
    let before = outcome();
    assert_eq!(before.chosen, "int8-static-entropy");
    for (rule, timings, chosen, int8_verdict) in [
        // int8 slower than float on the device: fp16 ships.
        (
            not_slower,
            ms(&[
                ("float", Ok(1.0)),
                ("int8-static-entropy", Ok(2.0)),
                ("fp16", Ok(0.8)),
            ]),
            "fp16",
            "slower than float on the device",
        ),
        // Within 10 %: int8 stays.
        (
            not_slower,
            ms(&[
                ("float", Ok(1.0)),
                ("int8-static-entropy", Ok(1.05)),
                ("fp16", Ok(0.8)),
            ]),
            "int8-static-entropy",
            "within budget",
        ),
        // Reported only: the device's numbers are recorded, size decides.
        (
            LatencyGate::Report,
            ms(&[
                ("float", Ok(1.0)),
                ("int8-static-entropy", Ok(9.0)),
                ("fp16", Ok(0.8)),
            ]),
            "int8-static-entropy",
            "within budget",
        ),
        // A budget in ms on the device.
        (
            LatencyGate::Budget { max_ms: 0.9 },
            ms(&[
                ("float", Ok(1.0)),
                ("int8-static-entropy", Ok(0.95)),
                ("fp16", Ok(0.85)),
            ]),
            "fp16",
            "slower than the latency budget on the device",
        ),
        // int8 would not run there (an op the provider lacks).
        (
            not_slower,
            ms(&[
                ("float", Ok(1.0)),
                ("int8-static-entropy", Err("no kernel")),
                ("fp16", Ok(1.0)),
            ]),
            "fp16",
            "could not run on the device: no kernel",
        ),
        // Not timed at all: refused as such; nothing qualifies, float.
        (
            not_slower,
            ms(&[("float", Ok(1.0)), ("fp16", Ok(5.0))]),
            "float",
            "not timed on the device",
        ),
    ] {
        let mut o = outcome();
        judge_latency_on(&mut o, &tagged("float"), &timings, rule, "device d1".into()).unwrap();
        assert_eq!(o.chosen, chosen, "{rule:?} {timings:?}: {}", o.reason);
        assert_eq!(o.chosen_model.producer_name(), chosen);
        assert!(
            o.reason.ends_with("latency judged on device d1"),
            "{}",
            o.reason
        );
        assert_eq!(o.latency.timed_on, "device d1");
        assert_eq!(o.latency.gate, rule);
        assert_eq!(o.float.latency_ms, 1.0);
        let int8 = &o.candidates[0];
        assert!(int8.verdict.contains(int8_verdict), "{}", int8.verdict);
        if let Some(Ok(l)) = timings.get("int8-static-entropy") {
            assert_eq!(int8.latency_ms, *l);
        }
        // The accuracy verdict stands: over budget whatever the device says.
        let dynamic = &o.candidates[1];
        assert!(!dynamic.accepted && dynamic.verdict.contains("exceeds the budget"));
        assert_eq!(
            dynamic.latency_ms, 1.0,
            "not timed: it was never a contender"
        );
    }
    for timings in [
        ms(&[("fp16", Ok(1.0))]),
        ms(&[("float", Err("could not load"))]),
        ms(&[("float", Ok(f64::NAN))]),
    ] {
        let mut o = outcome();
        let err = judge_latency_on(&mut o, &tagged("float"), &timings, not_slower, "d".into());
        assert!(err.is_err(), "{timings:?}");
    }
}

#[test]
fn every_candidate_is_named_by_its_label() {
    for c in Candidate::default_order() {
        assert_eq!(Candidate::from_label(&c.label()), Some(c));
    }
    assert_eq!(Candidate::from_label("int4"), None);
}

/// A small model whose candidates are all within budget but none smaller
/// than float: the reason says so for each, not just "within budget".
#[test]
fn keeping_float_says_when_candidates_are_not_smaller() {
    let candidates = vec![
        measured("int8-dynamic", 140, 0.1, 1.0),
        measured("fp16", 100, 0.0, 1.0),
        measured("int8-static-entropy", 90, 5.0, 1.0),
    ];
    let float = measured("float", 100, 0.0, 1.0);
    let models: Vec<_> = candidates.iter().map(|c| Some(tagged(&c.name))).collect();
    let (chosen, reason, _) = choose(
        &float,
        &candidates,
        &models,
        &tagged("float"),
        MetricKind::Top1Accuracy,
        1.0,
    );
    assert_eq!(chosen, "float");
    assert!(
        reason.starts_with("no candidate qualified, keeping float: "),
        "{reason}"
    );
    let part = |name: &str| {
        reason
            .split("; ")
            .find(|p| p.contains(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("{name} is not in {reason}"))
            .to_string()
    };
    let dynamic = part("int8-dynamic");
    assert!(dynamic.contains("within budget"), "{dynamic}");
    assert!(
        dynamic.ends_with("but not smaller than float (140 vs 100 bytes)"),
        "{dynamic}"
    );
    let fp16 = part("fp16");
    assert!(
        fp16.ends_with("but not smaller than float (100 vs 100 bytes)"),
        "{fp16}"
    );
    // Refused by the budget: its verdict alone is the reason.
    let entropy = part("int8-static-entropy");
    assert!(entropy.contains("exceeds the budget"), "{entropy}");
    assert!(!entropy.contains("not smaller"), "{entropy}");
}
