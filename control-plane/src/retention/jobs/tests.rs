//! The job and checkpoint decisions, and a pass on a store at an injected
//! `now`, followed by the sweep of what it let go.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;
use time::macros::datetime;

use super::*;
use crate::lifecycle::jobs::JobState;
use edgeloop_registry::artifacts::{put_bytes, ArtifactStore, LocalArtifactStore};

const NOW: OffsetDateTime = datetime!(2026-06-01 0:00 UTC);

fn days_ago(n: i64) -> OffsetDateTime {
    NOW - Duration::days(n)
}

/// A job whose spec is `spec` with a name and command added where it has
/// none.
fn job(id: &str, state: JobState, ended_days_ago: i64, spec: serde_json::Value) -> JobRecord {
    let mut spec = spec;
    for (field, value) in [("name", json!("t")), ("command", json!(["train"]))] {
        spec.as_object_mut().unwrap().entry(field).or_insert(value);
    }
    let spec = serde_json::from_value(spec).unwrap();
    let mut j = JobRecord::queued(id, spec, "default".into(), None, days_ago(200));
    j.state = state;
    j.updated_at = days_ago(ended_days_ago);
    j
}

fn ckpt(job: &str, step: u64) -> CheckpointRecord {
    CheckpointRecord {
        job_id: job.into(),
        attempt: 1,
        step,
        digest: Digest::of(format!("{job}/{step}").as_bytes()),
        size: 1,
        has_optimizer_state: true,
        metadata: BTreeMap::new(),
        cluster: "gpu".into(),
        uploaded_at: days_ago(150),
    }
}

#[test]
fn a_job_goes_once_ended_long_enough_ago_and_named_by_nothing() {
    let age = Duration::days(90);
    let pins = Pinned {
        jobs: BTreeSet::from(["pinned".to_string()]),
        ..Pinned::default()
    };
    let spec = json!({"name": "t"});
    // (job, goes)
    let table = [
        (job("a", JobState::Succeeded, 91, spec.clone()), true),
        (job("b", JobState::Failed, 91, spec.clone()), true),
        (job("c", JobState::Cancelled, 91, spec.clone()), true),
        (job("d", JobState::Succeeded, 89, spec.clone()), false),
        (job("e", JobState::Succeeded, 90, spec.clone()), false),
        // Not ended, however old its last change.
        (job("f", JobState::Queued, 500, spec.clone()), false),
        (job("g", JobState::Leased, 500, spec.clone()), false),
        (job("h", JobState::Running, 500, spec.clone()), false),
        // A version's lineage or an unfinished pipeline names it.
        (job("pinned", JobState::Succeeded, 500, spec.clone()), false),
    ];
    for (j, goes) in table {
        assert_eq!(job_expired(&j, &pins, NOW, age), goes, "{}", j.id);
    }
}

#[test]
fn keep_last_is_read_as_the_bridge_reads_the_spec() {
    // (spec, keep)
    let table = [
        (json!({"name": "t"}), Keep::Newest(3)),
        (json!({"checkpoint": {"every_steps": 5}}), Keep::Newest(3)),
        (
            json!({"checkpoint": {"every_steps": 5, "keep_last": 1}}),
            Keep::Newest(1),
        ),
        // Refused by the spec's validation, but a record may hold it:
        // every checkpoint stays.
        (json!({"checkpoint": {"keep_last": 0}}), Keep::All),
    ];
    for (spec, want) in table {
        let j = job("j", JobState::Running, 0, spec.clone());
        assert_eq!(Keep::of(Some(&j), false), want, "{spec}");
        assert_eq!(Keep::of(Some(&j), true), Keep::None, "{spec}");
    }
    assert_eq!(Keep::of(None, false), Keep::None);
}

#[test]
fn past_keep_last_checkpoints_go_unless_pinned() {
    let held: Vec<CheckpointRecord> = [5, 10, 15, 20].map(|s| ckpt("j", s)).to_vec();
    let pinned = HashSet::from([ckpt("j", 5).digest]);
    let none = HashSet::new();
    // (keep, pinned, steps that go)
    let table: [(Keep, &HashSet<Digest>, &[u64]); 7] = [
        (Keep::All, &none, &[]),
        (Keep::Newest(2), &none, &[5, 10]),
        (Keep::Newest(2), &pinned, &[10]),
        (Keep::Newest(4), &none, &[]),
        (Keep::Newest(9), &none, &[]),
        (Keep::None, &none, &[5, 10, 15, 20]),
        (Keep::None, &pinned, &[10, 15, 20]),
    ];
    for (keep, pins, want) in table {
        let got: Vec<u64> = checkpoints_to_drop(&held, keep, pins)
            .iter()
            .map(|c| c.step)
            .collect();
        assert_eq!(got, want, "{keep:?} {pins:?}");
    }
    assert!(checkpoints_to_drop(&[], Keep::None, &none).is_empty());
}

/// On a store at an injected `now`: an old finished job goes with its
/// checkpoints, but the one a version names stays (and its job with it
/// when the lineage names the job); a recent or running job keeps its
/// newest `keep_last`; a pipeline's job stays while the pipeline runs.
/// The sweep then collects the dropped checkpoints' artifacts only.
#[tokio::test]
async fn old_jobs_and_surplus_checkpoints_go_and_what_is_named_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let root = dir.path().join("artifacts");
    let artifacts = LocalArtifactStore::open(&root).unwrap();
    let keep2 = json!({"name": "t", "checkpoint": {"every_steps": 5, "keep_last": 2}});
    let jobs = [
        // Ended long ago, nothing names it: goes whole.
        job("old", JobState::Succeeded, 100, keep2.clone()),
        // Ended long ago; a version was exported from its step 10.
        job("exported", JobState::Succeeded, 100, keep2.clone()),
        // Ended long ago; a version's lineage names the job itself.
        job("lineage", JobState::Failed, 100, keep2.clone()),
        // Ended recently: keeps its newest two.
        job("recent", JobState::Succeeded, 5, keep2.clone()),
        // Still running: keeps its newest two, as its bridge does.
        job("running", JobState::Running, 100, keep2.clone()),
        // An unfinished pipeline's training job.
        job("p-3-train-1", JobState::Succeeded, 100, keep2.clone()),
        // Its spec keeps none, which validation refuses: all stay.
        job(
            "odd",
            JobState::Succeeded,
            5,
            json!({"checkpoint": {"keep_last": 0}}),
        ),
    ];
    for j in &jobs {
        store.lifecycle.jobs.insert(&j.id, j).unwrap();
        for step in [5, 10, 15, 20] {
            let c = ckpt(&j.id, step);
            store
                .registry
                .checkpoints
                .insert(&checkpoints::key(&j.id, step), &c)
                .unwrap();
            let bytes = format!("{}/{step}", j.id).into_bytes();
            assert_eq!(
                put_bytes(&artifacts, bytes, 1 << 20).await.unwrap(),
                c.digest
            );
        }
    }
    // A checkpoint left from a job an earlier pass dropped.
    let orphan = ckpt("gone", 5);
    store
        .registry
        .checkpoints
        .insert(&checkpoints::key("gone", 5), &orphan)
        .unwrap();
    let mut v = edgeloop_registry::models::ModelVersionRecord {
        model: "m".into(),
        version: "1".into(),
        artifact_digest: Digest::of(b"model"),
        artifact_size: 1,
        format: edgeloop_registry::models::ArtifactFormat::Onnx,
        manifest_digest: None,
        probe_inputs_digest: None,
        metrics: BTreeMap::new(),
        lineage: Default::default(),
        created_at: days_ago(100),
        variants: vec![],
    };
    v.lineage.job = Some("exported".into());
    v.lineage.checkpoint = Some(ckpt("exported", 10).digest);
    store.registry.model_versions.insert("m/1", &v).unwrap();
    let mut v2 = v.clone();
    v2.version = "2".into();
    v2.lineage.job = Some("lineage".into());
    v2.lineage.checkpoint = None;
    store.registry.model_versions.insert("m/2", &v2).unwrap();
    let (mut p, _) =
        crate::lifecycle::pipeline::Pipeline::new("p-3".into(), "m".into(), "drift".into(), 0);
    p.history[0].step = crate::lifecycle::pipeline::Step::Train;
    store.lifecycle.pipelines.insert("p-3", &p).unwrap();

    let r = crate::retention::Retention::default();
    let d = crate::retention::prune(&store, &artifacts, r, NOW).unwrap();
    let steps = |id: &str| -> Vec<u64> {
        checkpoints::list(&store.registry, id)
            .unwrap()
            .iter()
            .map(|c| c.step)
            .collect()
    };
    assert!(store.lifecycle.jobs.get("old").unwrap().is_none());
    assert_eq!(steps("old"), Vec::<u64>::new());
    // "exported" is named by the lineage too: kept, with its newest two and
    // the exported one.
    assert!(store.lifecycle.jobs.get("exported").unwrap().is_some());
    assert_eq!(steps("exported"), [10, 15, 20]);
    assert!(store.lifecycle.jobs.get("lineage").unwrap().is_some());
    assert_eq!(steps("lineage"), [15, 20]);
    assert_eq!(steps("recent"), [15, 20]);
    assert_eq!(steps("running"), [15, 20]);
    assert!(store.lifecycle.jobs.get("p-3-train-1").unwrap().is_some());
    assert_eq!(steps("p-3-train-1"), [15, 20]);
    assert_eq!(steps("odd"), [5, 10, 15, 20]);
    assert_eq!(steps("gone"), Vec::<u64>::new());
    assert_eq!((d.jobs, d.checkpoints), (1, 4 + 1 + 2 + 2 + 2 + 2 + 1));

    // Once nothing names the job (here its lineage is rewritten; versions
    // are never deleted), it goes; its exported checkpoint stays alone.
    v.lineage.job = None;
    store.registry.model_versions.insert("m/1", &v).unwrap();
    let d = crate::retention::prune(&store, &artifacts, r, NOW).unwrap();
    assert_eq!((d.jobs, d.checkpoints), (1, 2));
    assert!(store.lifecycle.jobs.get("exported").unwrap().is_none());
    assert_eq!(steps("exported"), [10]);
    // A pass finds nothing more.
    let d = crate::retention::prune(&store, &artifacts, r, NOW).unwrap();
    assert_eq!(d, crate::retention::Dropped::default());

    // The sweep, past the grace period, collects exactly the artifacts of
    // the checkpoints that went.
    let files_now = OffsetDateTime::now_utc() + Duration::days(2);
    let swept =
        super::super::gc::collect(&store, &artifacts, None, r.artifact_grace, files_now).unwrap();
    let mut want: BTreeSet<Digest> = BTreeSet::new();
    for (id, gone) in [
        ("old", &[5, 10, 15, 20][..]),
        ("exported", &[5, 15, 20]),
        ("lineage", &[5, 10]),
        ("recent", &[5, 10]),
        ("running", &[5, 10]),
        ("p-3-train-1", &[5, 10]),
    ] {
        want.extend(gone.iter().map(|s| ckpt(id, *s).digest));
    }
    assert_eq!(swept.deleted.iter().copied().collect::<BTreeSet<_>>(), want);
    for c in checkpoints::list(&store.registry, "exported").unwrap() {
        assert!(artifacts.head(c.digest).await.unwrap().is_some());
    }
}
