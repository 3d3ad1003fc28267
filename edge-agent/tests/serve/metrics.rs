//! `/metrics` is valid Prometheus text and its counters move; the observer
//! sees every finished request once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use edgeloop_edge_agent::serving::ModelServing;

use crate::common::*;

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// A strict parser for the text format (0.0.4): every line is a HELP, a
/// TYPE or a sample; every sample belongs to a family declared by an
/// earlier TYPE; labels are `name="value"` with `\\`, `\"` and `\n` escapes;
/// histograms have cumulative buckets ending in `+Inf` equal to `_count`.
fn parse(text: &str) -> Vec<Sample> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(name_ok(name), "bad HELP name: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            assert_eq!(parts.len(), 2, "bad TYPE line: {line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&parts[1]),
                "bad type: {line}"
            );
            assert!(
                types.insert(parts[0].into(), parts[1].into()).is_none(),
                "family declared twice: {line}"
            );
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line: {line:?}"
        );
        let (name, rest) = match line.find('{') {
            Some(i) => (&line[..i], &line[i..]),
            None => line.split_at(line.find(' ').unwrap()),
        };
        assert!(name_ok(name), "bad metric name: {line}");
        let mut labels = BTreeMap::new();
        let rest = if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let end;
            loop {
                let (i, c) = chars
                    .next()
                    .unwrap_or_else(|| panic!("unclosed labels: {line}"));
                if c == '}' {
                    end = i;
                    break;
                }
                let start = i;
                let mut eq = None;
                for (j, c) in chars.by_ref() {
                    if c == '=' {
                        eq = Some(j);
                        break;
                    }
                }
                let eq = eq.unwrap_or_else(|| panic!("label without '=': {line}"));
                let label = &body[start..eq];
                assert!(name_ok(label), "bad label name {label:?}: {line}");
                assert_eq!(
                    chars.next().map(|c| c.1),
                    Some('"'),
                    "unquoted label: {line}"
                );
                let mut value = String::new();
                loop {
                    match chars.next().map(|c| c.1) {
                        Some('\\') => match chars.next().map(|c| c.1) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            other => panic!("bad escape {other:?}: {line}"),
                        },
                        Some('"') => break,
                        Some(c) => value.push(c),
                        None => panic!("unterminated label value: {line}"),
                    }
                }
                assert!(
                    labels.insert(label.to_string(), value).is_none(),
                    "label twice: {line}"
                );
                if let Some(&(_, ',')) = chars.peek() {
                    chars.next();
                }
            }
            &body[end + 1..]
        } else {
            rest
        };
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value {v:?}: {line}")),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample before its TYPE: {line}");
        samples.push((name.to_string(), labels, value));
    }
    // Histograms: cumulative buckets, +Inf last and equal to _count.
    for (family, kind) in &types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for (name, labels, value) in &samples {
            if *name == format!("{family}_bucket") {
                let mut key = labels.clone();
                let le = key.remove("le").expect("a bucket has le");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                series.entry(key).or_default().push((le, *value));
            }
        }
        for (key, buckets) in series {
            assert!(
                buckets
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
                "{family} {key:?}: {buckets:?}"
            );
            assert_eq!(buckets.last().unwrap().0, f64::INFINITY);
            let count = samples
                .iter()
                .find(|(n, l, _)| *n == format!("{family}_count") && *l == key)
                .unwrap_or_else(|| panic!("{family} {key:?} has no _count"));
            assert_eq!(count.2, buckets.last().unwrap().1, "{family} {key:?}");
            assert!(samples
                .iter()
                .any(|(n, l, _)| *n == format!("{family}_sum") && *l == key));
        }
    }
    samples
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map_or(0.0, |s| s.2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_move_and_the_observer_sees_each_request() {
    let recorder = Arc::new(Recorder::default());
    let server = start_observed(config(), recorder.clone()).await;
    let models = Models::new();
    // A quote and a backslash in the name exercise label escaping.
    let model = "add";
    server
        .host
        .activate(spec(
            model,
            "v\"1\\",
            &models.write("add1", &add_model(1.0)),
        ))
        .await
        .unwrap();
    let version = "v\"1\\";
    let labels = [("model", model), ("version", version)];

    let before = parse(&server.get("/metrics").await.text);
    assert_eq!(
        value(&before, "edgeloop_inference_requests_total", &labels),
        0.0
    );
    assert_eq!(
        value(
            &before,
            "edgeloop_model_info",
            &[("model", model), ("provider", "CPUExecutionProvider")]
        ),
        1.0
    );

    let url = "/v2/models/add/infer";
    for i in 0..5 {
        let got = server
            .post(url, &infer_body("x", &[2, 4], &[i as f32; 8]))
            .await;
        assert_eq!(got.status, 200, "{}", got.text);
    }
    let bad = server.post(url, &infer_body("x", &[1, 3], &[0.0; 3])).await;
    assert_eq!(bad.status, 400);
    let mut with_id = infer_body("x", &[1, 4], &[0.0; 4]);
    with_id["id"] = "mine".into();
    assert_eq!(server.post(url, &with_id).await.body["id"], "mine");

    let after = parse(&server.get("/metrics").await.text);
    let requests = value(&after, "edgeloop_inference_requests_total", &labels);
    let errors = value(&after, "edgeloop_inference_errors_total", &labels);
    assert_eq!((requests, errors), (7.0, 1.0));
    assert_eq!(
        value(&after, "edgeloop_inference_latency_seconds_count", &labels),
        7.0
    );
    assert!(value(&after, "edgeloop_inference_latency_seconds_sum", &labels) > 0.0);
    // The bad request never reached the model: 6 runs of at least one request.
    assert_eq!(
        value(&after, "edgeloop_inference_batch_size_count", &labels),
        6.0
    );
    assert_eq!(
        value(
            &after,
            "edgeloop_inference_queue_depth",
            &[("model", model)]
        ),
        0.0
    );

    let observed = recorder.observed.lock().unwrap();
    assert_eq!(observed.len(), 7);
    let oks = observed.iter().filter(|o| o.ok).count();
    assert_eq!(oks, 6);
    for o in observed.iter() {
        assert_eq!((o.model.as_str(), o.version.as_str()), (model, version));
        assert!(!o.id.is_empty());
        assert_eq!(o.inputs, ["x"], "inputs as sent, also for errors");
        assert_eq!(o.outputs.is_empty(), !o.ok);
    }
    assert!(observed.iter().any(|o| o.id == "mine"));
}
