//! Which ended pipelines, deployments and benchmarks go, by tables on an
//! injected `now`, and a pass over a real store.

use std::collections::BTreeMap;

use edgeloop_api::benchmarks::BenchmarkState;
use edgeloop_api::deployments::{CancelReason, Deployment, Gates, Requirements};
use time::macros::datetime;

use super::*;
use crate::fleet::rollout::{Strategy, Waves};
use crate::lifecycle::pipeline::{PipelineState, Step, StepRecord};

const NOW: OffsetDateTime = datetime!(2027-06-01 0:00 UTC);

fn days_ago(n: i64) -> OffsetDateTime {
    NOW - Duration::days(n)
}

fn pipeline(id: &str, model: &str, ended_days_ago: Option<i64>) -> Pipeline {
    let start = days_ago(ended_days_ago.unwrap_or(0) + 1).unix_timestamp();
    let (mut p, _) = Pipeline::new(id.into(), model.into(), "manual".into(), start);
    if let Some(n) = ended_days_ago {
        p.history = vec![StepRecord {
            step: Step::BuildDataset,
            attempt: 1,
            started_at: start,
            ended_at: Some(days_ago(n).unix_timestamp()),
            outcome: None,
            output: None,
        }];
        p.state = PipelineState::Failed {
            step: Step::BuildDataset,
            reason: "no data".into(),
        };
    }
    p
}

fn deployment(
    seq: u64,
    model: &str,
    state: RolloutState,
    updated_days_ago: i64,
) -> DeploymentRecord {
    let id = format!("d-{seq:08}");
    DeploymentRecord {
        id: id.clone(),
        seq,
        deployment: Deployment {
            id: id.clone(),
            group: "site=lab".into(),
            model: model.into(),
            target_version: "1.0.0".into(),
            seed: id,
            strategy: Strategy {
                waves: Waves::Percent(vec![100]),
                min_soak_seconds: 60,
                wave_timeout_seconds: 600,
                rollback_timeout_seconds: 300,
            },
            gates: Gates {
                max_error_rate: 0.05,
                max_p99_latency_ratio: 1.5,
                max_activation_failures: 0,
                min_online_accuracy: None,
                min_requests: 10,
            },
            offline_tolerance: 0.0,
            deadline: 0,
            state,
            moved: BTreeMap::new(),
            skipped: BTreeMap::new(),
            cancel_requested: false,
            superseded_by: None,
            generation: 0,
        },
        requirements: Requirements::default(),
        alias: None,
        activation_timeout_seconds: 60,
        assigned_generation: BTreeMap::new(),
        assigned_variant: BTreeMap::new(),
        created_at: days_ago(updated_days_ago + 1),
        updated_at: days_ago(updated_days_ago),
    }
}

fn failed() -> RolloutState {
    RolloutState::Failed {
        reason: "deadline".into(),
    }
}

fn benchmark(
    state: BenchmarkState,
    origin: Option<&str>,
    finished_days_ago: i64,
) -> BenchmarkRecord {
    BenchmarkRecord {
        id: "b-00000001".into(),
        device: "edge-1".into(),
        selector: None,
        origin: origin.map(str::to_string),
        state,
        models: vec![],
        inputs_digest: edgeloop_models::Digest::of(b"inputs"),
        inputs_size: 1,
        runs: 1,
        timeout_seconds: 60,
        created_at: days_ago(finished_days_ago + 1),
        started_at: None,
        finished_at: state.is_finished().then(|| days_ago(finished_days_ago)),
        reason: None,
        timed_on: None,
        results: vec![],
    }
}

const AGE: Duration = Duration::days(180);

#[test]
fn ended_pipelines_go_after_their_age_but_never_a_models_newest() {
    let all = [
        pipeline("p-00000001", "m", Some(400)),
        pipeline("p-00000002", "m", Some(100)),
        pipeline("p-00000003", "m", Some(300)),
        // A running one never goes, however old.
        pipeline("p-00000004", "other", None),
        pipeline("p-00000005", "lone", Some(900)),
        pipeline("p-00000006", "m", Some(200)),
    ];
    // m's newest (p-6) stays though it is past the age; p-2 is young;
    // "lone" has only its newest.
    assert_eq!(
        pipelines_to_drop(&all, NOW, AGE),
        ["p-00000001", "p-00000003"]
    );
    assert_eq!(pipeline_ended_at(&all[3]), None);
}

#[test]
fn ended_deployments_go_but_the_serving_one_the_newest_and_a_live_pipelines_stay() {
    let mut by_pipeline = deployment(7, "m", failed(), 400);
    by_pipeline.deployment.seed = "p-00000009-deploy-2".into();
    let all = [
        // (seq, state, days since its last change)
        deployment(1, "m", RolloutState::Succeeded, 500),
        deployment(2, "m", failed(), 400),
        // The serving one: m's newest succeeded, however old.
        deployment(3, "m", RolloutState::Succeeded, 300),
        deployment(4, "m", failed(), 100),
        // Still rolling out, old: stays.
        deployment(5, "m", RolloutState::Pending, 900),
        deployment(
            6,
            "m",
            RolloutState::Cancelled {
                reason: CancelReason::Requested,
            },
            250,
        ),
        by_pipeline,
        deployment(8, "m", failed(), 200),
        deployment(9, "named", failed(), 400),
        // m's newest of any state, ended long ago: stays.
        deployment(10, "m", failed(), 365),
        deployment(11, "named", failed(), 390),
    ];
    let live = Live {
        pipelines: ["p-00000009".to_string()].into(),
        deployments: ["d-00000009".to_string()].into(),
    };
    assert_eq!(
        deployments_to_drop(&all, &live, NOW, AGE),
        ["d-00000001", "d-00000002", "d-00000006", "d-00000008"]
    );
    // With no live pipeline, its deployment and the one it named go too.
    let mut dropped = deployments_to_drop(&all, &Live::default(), NOW, AGE);
    dropped.sort();
    assert_eq!(
        dropped,
        [
            "d-00000001",
            "d-00000002",
            "d-00000006",
            "d-00000007",
            "d-00000008",
            "d-00000009"
        ]
    );
}

#[test]
fn finished_benchmarks_go_unless_a_live_pipeline_asked_for_them() {
    let live = Live {
        pipelines: ["p-00000003".to_string()].into(),
        deployments: Default::default(),
    };
    let table = [
        (benchmark(BenchmarkState::Succeeded, None, 200), true),
        (benchmark(BenchmarkState::Failed, None, 200), true),
        (benchmark(BenchmarkState::Succeeded, None, 100), false),
        // Never finished (its deadline settles it first): stays.
        (benchmark(BenchmarkState::Running, None, 400), false),
        (
            benchmark(
                BenchmarkState::Succeeded,
                Some("p-00000003/quantize/1"),
                400,
            ),
            false,
        ),
        (
            benchmark(
                BenchmarkState::Succeeded,
                Some("p-00000002/quantize/1"),
                400,
            ),
            true,
        ),
    ];
    for (b, want) in table {
        assert_eq!(benchmark_expired(&b, &live, NOW, AGE), want, "{b:?}");
    }
}

#[test]
fn a_pass_drops_old_history_with_its_events_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    for p in [
        pipeline("p-00000001", "m", Some(400)),
        pipeline("p-00000002", "m", Some(300)),
        // A live pipeline whose deploy step named d-00000003.
        pipeline("p-00000003", "n", None),
    ] {
        store.lifecycle.pipelines.insert(&p.id.clone(), &p).unwrap();
    }
    let mut live = store
        .lifecycle
        .pipelines
        .get("p-00000003")
        .unwrap()
        .unwrap();
    live.history[0].output = Some(Output::Deployment {
        id: "d-00000003".into(),
    });
    store
        .lifecycle
        .pipelines
        .insert("p-00000003", &live)
        .unwrap();
    for d in [
        deployment(1, "m", failed(), 400),
        deployment(2, "m", RolloutState::Succeeded, 400),
        deployment(3, "n", failed(), 400),
        deployment(4, "n", failed(), 10),
    ] {
        store.fleet.deployments.insert(&d.id.clone(), &d).unwrap();
        for index in 0..3 {
            let event = crate::fleet::rollout::Event::WaveStarted {
                index,
                assigned: vec![],
                skipped: vec![],
            };
            crate::fleet::deployments::append_event(&store, &d.id, event, days_ago(400)).unwrap();
        }
    }
    let old = benchmark(BenchmarkState::Succeeded, None, 400);
    store
        .fleet
        .benchmarks
        .insert(&old.id.clone(), &old)
        .unwrap();

    let d = prune(&store, NOW, AGE).unwrap();
    assert_eq!(
        d,
        DroppedHistory {
            pipelines: 1,
            deployments: 1,
            benchmarks: 1
        }
    );
    let pipelines: Vec<String> = store
        .lifecycle
        .pipelines
        .scan_prefix("")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(pipelines, ["p-00000002", "p-00000003"]);
    let deployments: Vec<String> = store
        .fleet
        .deployments
        .scan_prefix("")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(deployments, ["d-00000002", "d-00000003", "d-00000004"]);
    assert!(
        crate::fleet::deployments::events(&store, "d-00000001")
            .unwrap()
            .is_empty(),
        "its event log went with it"
    );
    assert_eq!(
        crate::fleet::deployments::events(&store, "d-00000002")
            .unwrap()
            .len(),
        3
    );
    assert!(store.fleet.benchmarks.is_empty().unwrap());
    // A second pass finds nothing more.
    assert_eq!(prune(&store, NOW, AGE).unwrap(), DroppedHistory::default());
}
