//! The references of each record kind, the sweep's decision, and a pass
//! over a real store and artifact store.

use std::collections::BTreeMap;
use std::path::Path;

use edgeloop_api::benchmarks::{BenchmarkState, ModelTiming};
use serde_json::json;
use time::macros::datetime;

use super::*;
use crate::fleet::assignments::AssignmentSetRecord;
use crate::lifecycle::pipeline::PipelineState;
use edgeloop_registry::artifacts::{put_bytes, LocalArtifactStore};

fn d(name: &str) -> Digest {
    Digest::of(name.as_bytes())
}

fn set(digests: impl IntoIterator<Item = Digest>) -> BTreeSet<Digest> {
    digests.into_iter().collect()
}

fn version(model: &str, artifact: &str) -> ModelVersionRecord {
    ModelVersionRecord {
        model: model.into(),
        version: "1".into(),
        artifact_digest: d(artifact),
        artifact_size: 1,
        format: edgeloop_registry::models::ArtifactFormat::Onnx,
        manifest_digest: None,
        probe_inputs_digest: None,
        metrics: BTreeMap::new(),
        lineage: Lineage::default(),
        created_at: datetime!(2026-01-01 0:00 UTC),
        variants: vec![],
    }
}

fn variant(name: &str, probe: Option<&str>) -> VariantView {
    VariantView {
        name: name.into(),
        artifact_digest: d(&format!("{name}.onnx")),
        artifact_size: 1,
        manifest_digest: d(&format!("{name}.manifest")),
        probe_inputs_digest: probe.map(d),
        providers: vec!["CUDAExecutionProvider".into()],
        quantization: None,
        created_at: datetime!(2026-01-01 0:00 UTC),
    }
}

fn pipeline(id: &str, state: PipelineState, outputs: Vec<(Step, Output)>) -> Pipeline {
    let (mut p, _) = Pipeline::new(id.into(), "m".into(), "manual".into(), 0);
    p.history.clear();
    for (step, output) in outputs {
        p.history.push(StepRecord {
            step,
            attempt: 1,
            started_at: 0,
            ended_at: Some(1),
            outcome: None,
            output: Some(output),
        });
    }
    p.state = state;
    p
}

fn running(step: Step) -> PipelineState {
    PipelineState::Running {
        step,
        attempt: 1,
        started_at: 0,
    }
}

fn benchmark(state: BenchmarkState, origin: Option<&str>) -> BenchmarkRecord {
    BenchmarkRecord {
        id: "b-1".into(),
        device: "edge-1".into(),
        selector: None,
        origin: origin.map(str::to_string),
        state,
        models: vec![ModelEntry {
            name: "int8".into(),
            artifact_digest: d("candidate"),
            artifact_size: 1,
            manifest_digest: Some(d("candidate.manifest")),
        }],
        inputs_digest: d("bench-inputs"),
        inputs_size: 1,
        runs: 1,
        timeout_seconds: 60,
        created_at: datetime!(2026-01-01 0:00 UTC),
        started_at: None,
        finished_at: None,
        reason: None,
        timed_on: None,
        results: vec![ModelTiming {
            name: "int8".into(),
            artifact_digest: d("candidate"),
            latency_p50_ms: Some(1.0),
            latency_p90_ms: Some(1.0),
            runs: 1,
            execution_provider: None,
            error: None,
        }],
    }
}

fn retraining(job: serde_json::Value, base: Option<&str>) -> RetrainingConfig {
    let mut c = json!({"job": job, "rollout": {"selector": "site=lab"}});
    if let Some(b) = base {
        c["base_dataset"] = json!(d(b).to_string());
    }
    serde_json::from_value(c).unwrap()
}

#[test]
fn artifact_uris_anywhere_in_a_spec_in_any_case() {
    let hex = d("data").to_hex();
    // (spec, what it names)
    let table: Vec<(serde_json::Value, Vec<Digest>)> = vec![
        (json!({}), vec![]),
        (
            json!({"datasets": [format!("edgeloop-artifact://sha256:{hex}")]}),
            vec![d("data")],
        ),
        // Without the prefix, and the scheme in capitals, as validation takes it.
        (
            json!({"datasets": [format!("EDGELOOP-Artifact://{hex}")]}),
            vec![d("data")],
        ),
        // Elsewhere in the spec: a hyperparameter naming one.
        (
            json!({"hyperparameters": {"init": [format!("edgeloop-artifact://sha256:{hex}")]}}),
            vec![d("data")],
        ),
        // Other schemes, a short digest, a bare digest: none.
        (
            json!({"datasets": ["s3://b/k", "edgeloop-artifact://sha256:ab", hex.clone()]}),
            vec![],
        ),
        (json!("edgeloop-artifact:/"), vec![]),
    ];
    for (spec, want) in table {
        assert_eq!(artifact_uris(&spec), want, "{spec}");
    }
}

#[test]
fn each_record_kind_names_its_digests() {
    let mut v = version("m", "model.onnx");
    v.manifest_digest = Some(d("manifest"));
    v.probe_inputs_digest = Some(d("probe"));
    v.lineage.dataset = Some(d("snapshot"));
    v.lineage.checkpoint = Some(d("checkpoint"));
    v.lineage.job = Some("job-1".into());
    v.variants = vec![variant("fp16", Some("fp16.probe")), variant("trt", None)];
    let names = |ns: &[&str]| set(ns.iter().map(|n| d(n)));
    assert_eq!(
        set(version_digests(&v)),
        names(&[
            "model.onnx",
            "manifest",
            "probe",
            "snapshot",
            "checkpoint",
            "fp16.onnx",
            "fp16.manifest",
            "fp16.probe",
            "trt.onnx",
            "trt.manifest",
        ])
    );
    assert_eq!(
        set(version_digests(&version("m", "bare"))),
        names(&["bare"])
    );

    let mut a = AssignmentRecord::for_version(&v, "d-1", 60);
    assert_eq!(
        set(assignment_digests(&a)),
        names(&["model.onnx", "manifest", "probe"])
    );
    a.manifest_digest = None;
    a.probe_inputs_digest = None;
    assert_eq!(set(assignment_digests(&a)), names(&["model.onnx"]));

    let spec = json!({"name": "r", "datasets": [format!("edgeloop-artifact://{}", d("extra"))]});
    assert_eq!(
        set(retraining_digests(&retraining(spec, Some("base")))),
        names(&["extra", "base"])
    );
    assert!(retraining_digests(&retraining(json!({"name": "r"}), None)).is_empty());

    let qv = QuantizedVariant {
        name: "fp16".into(),
        digest: d("qv"),
        method: "fp16".into(),
        manifest: d("qv.manifest"),
        providers: vec![],
    };
    // (output, what it holds)
    let outputs: Vec<(Output, Vec<&str>)> = vec![
        (
            Output::Dataset {
                digest: d("snap"),
                rows: 1,
                eval_rows: 0,
                edge_rows: 0,
                hard_examples: 0,
            },
            vec!["snap"],
        ),
        (
            Output::Job {
                id: "p-1-train-1".into(),
                checkpoint: d("ckpt"),
            },
            vec!["ckpt"],
        ),
        (Output::Onnx { digest: d("float") }, vec!["float"]),
        (
            Output::Unsigned {
                digest: d("q"),
                method: "int8".into(),
                manifest: d("q.manifest"),
                version: "2".into(),
                variants: vec![qv.clone()],
            },
            vec!["q", "q.manifest", "qv", "qv.manifest"],
        ),
        (
            Output::Quantized {
                digest: d("s"),
                method: "int8".into(),
                manifest: d("s.manifest"),
                version: "2".into(),
                variants: vec![],
            },
            vec!["s", "s.manifest"],
        ),
        (
            Output::Version {
                version: "2".into(),
            },
            vec![],
        ),
        (Output::Deployment { id: "d-1".into() }, vec![]),
        (Output::Reference, vec![]),
    ];
    for (o, want) in &outputs {
        assert_eq!(set(output_digests(o)), names(want), "{o:?}");
    }

    // A pipeline holds its outputs and its training jobs until it ends.
    let steps = vec![
        (
            Step::BuildDataset,
            Output::Dataset {
                digest: d("snap"),
                rows: 1,
                eval_rows: 0,
                edge_rows: 0,
                hard_examples: 0,
            },
        ),
        (
            Step::Train,
            Output::Job {
                id: "p-1-train-1".into(),
                checkpoint: d("ckpt"),
            },
        ),
    ];
    let live = pipeline_pins(&pipeline("p-1", running(Step::Export), steps.clone()));
    assert_eq!(set(live.digests), names(&["snap", "ckpt"]));
    assert_eq!(
        live.jobs,
        BTreeSet::from(["p-1-train-1".to_string()]),
        "its training job, by the id the step finds it by"
    );
    let waiting = PipelineState::AwaitingSignature { since: 0 };
    assert_eq!(
        pipeline_pins(&pipeline("p-1", waiting, steps.clone()))
            .digests
            .len(),
        2
    );
    // A training step still running: its job, not made yet, is pinned.
    let mut training = pipeline("p-2", running(Step::Train), vec![]);
    training.history.push(StepRecord {
        step: Step::Train,
        attempt: 2,
        started_at: 0,
        ended_at: None,
        outcome: None,
        output: None,
    });
    assert_eq!(
        pipeline_pins(&training).jobs,
        BTreeSet::from(["p-2-train-2".to_string()])
    );
    for ended in [
        PipelineState::Succeeded,
        PipelineState::Failed {
            step: Step::Export,
            reason: "x".into(),
        },
        PipelineState::Cancelled { step: Step::Export },
        PipelineState::Stopped {
            step: Step::Compare,
            reason: "no gain".into(),
        },
    ] {
        assert_eq!(
            pipeline_pins(&pipeline("p-1", ended.clone(), steps.clone())),
            Pinned::default(),
            "{ended:?}"
        );
    }

    // A benchmark: until it is finished, or while its pipeline runs.
    let unfinished = BTreeSet::from(["p-7".to_string()]);
    let all = names(&["bench-inputs", "candidate", "candidate.manifest"]);
    // (state, origin, holds)
    let table = [
        (BenchmarkState::Pending, None, true),
        (BenchmarkState::Running, None, true),
        (BenchmarkState::Succeeded, None, false),
        (BenchmarkState::Failed, None, false),
        (BenchmarkState::Succeeded, Some("p-7/quantize/1"), true),
        (BenchmarkState::Succeeded, Some("p-8/quantize/1"), false),
    ];
    for (state, origin, holds) in table {
        let got = set(benchmark_digests(&benchmark(state, origin), &unfinished));
        let want = if holds { all.clone() } else { BTreeSet::new() };
        assert_eq!(got, want, "{state:?} {origin:?}");
    }
}

#[test]
fn only_old_unreferenced_artifacts_are_collectable() {
    let now = datetime!(2026-06-01 0:00 UTC);
    let grace = Duration::hours(24);
    let stored = |name: &str, age: Duration| StoredArtifact {
        digest: d(name),
        size: 1,
        modified: (now - age).into(),
    };
    let live = HashSet::from([d("live-old"), d("live-young")]);
    // (artifact, collected)
    let table = [
        (stored("live-old", Duration::days(400)), false),
        (stored("live-young", Duration::minutes(1)), false),
        (stored("dead-old", Duration::hours(25)), true),
        (stored("dead-young", Duration::hours(23)), false),
        // Exactly the grace: not yet.
        (stored("dead-at-grace", Duration::hours(24)), false),
        // Stamped in the future (a clock step back): young.
        (stored("dead-future", -Duration::hours(5)), false),
    ];
    let all: Vec<StoredArtifact> = table.iter().map(|(a, _)| *a).collect();
    let got: BTreeSet<Digest> = collectable(&live, &all, now, grace)
        .into_iter()
        .map(|a| a.digest)
        .collect();
    let want: BTreeSet<Digest> = table
        .iter()
        .filter(|(_, c)| *c)
        .map(|(a, _)| a.digest)
        .collect();
    assert_eq!(got, want);
}

/// Sets every stored artifact's time `age` back.
fn age_all(root: &Path, age: std::time::Duration) {
    for shard in std::fs::read_dir(root.join("sha256")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let f = std::fs::File::options()
                .write(true)
                .open(f.unwrap().path())
                .unwrap();
            f.set_modified(std::time::SystemTime::now() - age).unwrap();
        }
    }
}

/// A pass over a real store and artifact store keeps every kind of
/// referenced artifact, however old, collects an old unreferenced one
/// (from the cache too), and keeps a young unreferenced one and one
/// uploaded again since it was old.
#[tokio::test]
async fn a_pass_keeps_what_records_reference_and_collects_old_unreferenced_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let root = dir.path().join("artifacts");
    let artifacts = LocalArtifactStore::open(&root).unwrap();
    let kept = [
        "model.onnx",
        "manifest",
        "probe",
        "snapshot",
        "lineage-ckpt",
        "fp16.onnx",
        "fp16.manifest",
        "fp16.probe",
        "assigned-only",
        "base",
        "policy-extra",
        "running-snap",
        "running-ckpt",
        "bench-inputs",
        "candidate",
        "candidate.manifest",
        "job-data",
        "ckpt-record",
    ];
    let gone = ["unreferenced", "finished-onnx", "done-bench-inputs"];
    let mut sizes = BTreeMap::new();
    for name in kept.iter().chain(&gone).chain(&["reput"]) {
        let bytes = name.as_bytes().to_vec();
        sizes.insert(*name, bytes.len() as u64);
        assert_eq!(
            put_bytes(&artifacts, bytes, 1 << 20).await.unwrap(),
            d(name)
        );
    }
    let day = std::time::Duration::from_secs(86_400);
    age_all(&root, 30 * day);
    // Uploaded again: its grace starts over.
    put_bytes(&artifacts, b"reput".to_vec(), 1 << 20)
        .await
        .unwrap();
    // Just uploaded, not registered yet.
    put_bytes(&artifacts, b"young".to_vec(), 1 << 20)
        .await
        .unwrap();

    let mut v = version("m", "model.onnx");
    v.manifest_digest = Some(d("manifest"));
    v.probe_inputs_digest = Some(d("probe"));
    v.lineage.dataset = Some(d("snapshot"));
    v.lineage.checkpoint = Some(d("lineage-ckpt"));
    v.variants = vec![variant("fp16", Some("fp16.probe"))];
    store.registry.model_versions.insert("m/1", &v).unwrap();
    let mut assigned = AssignmentRecord::for_version(&version("m", "assigned-only"), "d-1", 60);
    assigned.model_version = "0".into();
    store
        .fleet
        .assignments
        .insert(
            "edge-1",
            &AssignmentSetRecord {
                generation: 1,
                assignments: vec![assigned],
            },
        )
        .unwrap();
    let extra = format!("edgeloop-artifact://{}", d("policy-extra"));
    store
        .lifecycle
        .retraining
        .insert(
            "m",
            &retraining(json!({"name": "r", "datasets": [extra]}), Some("base")),
        )
        .unwrap();
    let snap = Output::Dataset {
        digest: d("running-snap"),
        rows: 1,
        eval_rows: 0,
        edge_rows: 0,
        hard_examples: 0,
    };
    let job_out = Output::Job {
        id: "p-1-train-1".into(),
        checkpoint: d("running-ckpt"),
    };
    let live_pipeline = pipeline(
        "p-1",
        running(Step::Export),
        vec![(Step::BuildDataset, snap), (Step::Train, job_out)],
    );
    store
        .lifecycle
        .pipelines
        .insert("p-1", &live_pipeline)
        .unwrap();
    let done = pipeline(
        "p-0",
        PipelineState::Succeeded,
        vec![(
            Step::Export,
            Output::Onnx {
                digest: d("finished-onnx"),
            },
        )],
    );
    store.lifecycle.pipelines.insert("p-0", &done).unwrap();
    store
        .fleet
        .benchmarks
        .insert("b-1", &benchmark(BenchmarkState::Running, None))
        .unwrap();
    let mut finished = benchmark(BenchmarkState::Succeeded, None);
    finished.id = "b-0".into();
    finished.inputs_digest = d("done-bench-inputs");
    finished.models.clear();
    finished.results.clear();
    store.fleet.benchmarks.insert("b-0", &finished).unwrap();
    let now = OffsetDateTime::now_utc();
    let spec = json!({"name": "t", "command": ["train"],
                      "datasets": [format!("edgeloop-artifact://{}", d("job-data"))]});
    let spec = serde_json::from_value(spec).unwrap();
    let job = crate::lifecycle::jobs::JobRecord::queued("t-1", spec, "default".into(), None, now);
    store.lifecycle.jobs.insert("t-1", &job).unwrap();
    let ckpt = CheckpointRecord {
        job_id: "t-1".into(),
        attempt: 1,
        step: 10,
        digest: d("ckpt-record"),
        size: 11,
        has_optimizer_state: false,
        metadata: BTreeMap::new(),
        cluster: "gpu".into(),
        uploaded_at: now,
    };
    store
        .registry
        .checkpoints
        .insert(&edgeloop_registry::checkpoints::key("t-1", 10), &ckpt)
        .unwrap();

    let cache = ArtifactCache::new(1 << 20);
    cache.get(&artifacts, d("unreferenced")).await.unwrap();
    cache.get(&artifacts, d("model.onnx")).await.unwrap();
    let grace = Duration::hours(24);
    // The records here ended in 1970: history retention (its own tests)
    // would drop the ended pipeline and benchmark, which pin nothing.
    let r = crate::retention::Retention {
        history: Duration::days(100_000),
        ..Default::default()
    };
    let dropped = crate::retention::prune(&store, &artifacts, r, now).unwrap();
    assert_eq!(dropped, crate::retention::Dropped::default());
    let swept = collect(&store, &artifacts, Some(&cache), grace, now).unwrap();
    assert_eq!(set(swept.deleted.iter().copied()), set(gone.map(d)));
    assert_eq!(swept.bytes, gone.iter().map(|n| sizes[n]).sum::<u64>());
    for name in kept.iter().chain(&["reput", "young"]) {
        assert!(
            artifacts.head(d(name)).await.unwrap().is_some(),
            "{name} was kept"
        );
    }
    for name in gone {
        assert_eq!(artifacts.head(d(name)).await.unwrap(), None, "{name}");
        assert!(matches!(
            artifacts.open_at(d(name), 0).await,
            Err(edgeloop_registry::artifacts::ArtifactError::NotFound(_))
        ));
    }
    assert!(cache.cached(d("unreferenced")).is_none(), "forgotten");
    assert!(cache.cached(d("model.onnx")).is_some());
    assert_eq!(cache.counters.collected.load(Relaxed), 3);
    assert_eq!(cache.counters.collected_bytes.load(Relaxed), swept.bytes);
    // Nothing more on a second pass.
    let again = collect(&store, &artifacts, Some(&cache), grace, now).unwrap();
    assert_eq!(again, Swept::default());
    // Once the pipeline ends, what only it held goes.
    let mut ended = live_pipeline;
    ended.state = PipelineState::Succeeded;
    store.lifecycle.pipelines.insert("p-1", &ended).unwrap();
    let swept = collect(&store, &artifacts, None, grace, now).unwrap();
    assert_eq!(
        set(swept.deleted),
        set([d("running-snap"), d("running-ckpt")])
    );
}
