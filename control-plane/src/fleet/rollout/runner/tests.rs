//! What a tick asks of the store, counted by the store itself
//! (`Store::read_counts`): a wave's reads and writes are a few calls
//! whatever the wave's size, so on PostgreSQL a wave of 10 000 devices is
//! a few round trips, not a few per device. Plus the batch's outcomes.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use edgeloop_models::Digest;
use serde_json::json;
use time::OffsetDateTime;

use super::*;
use crate::fleet::members::{CapabilitiesRecord, Member, MemberKind};
use edgeloop_registry::artifacts::LocalArtifactStore;
use edgeloop_store::ReadCounts;

const MODEL: &str = "m";

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_796_083_200).unwrap()
}

fn member(id: &str, providers: &[&str]) -> Member {
    Member {
        labels: BTreeMap::from([("site".into(), "lab".into())]),
        capabilities: CapabilitiesRecord {
            execution_providers: providers.iter().map(|p| p.to_string()).collect(),
            free_disk_bytes: 1 << 30,
            ..CapabilitiesRecord::default()
        },
        ..Member::enrolled(
            id,
            MemberKind::Device,
            Digest::of(id.as_bytes()),
            now() + time::Duration::days(365),
            now(),
        )
    }
}

fn version(v: &str) -> ModelVersionRecord {
    serde_json::from_value(json!({
        "model": MODEL, "version": v, "artifact_digest": Digest::of(v.as_bytes()),
        "artifact_size": 1, "format": "onnx", "created_at": "2026-12-01T00:00:00Z",
        "variants": [{
            "name": "gpu", "artifact_digest": Digest::of(b"gpu"), "artifact_size": 1,
            "manifest_digest": Digest::of(b"gpu.manifest"),
            "providers": ["CUDAExecutionProvider"], "created_at": "2026-12-01T00:00:00Z"
        }]
    }))
    .unwrap()
}

/// A store with `devices` enrolled devices (every third with a GPU) and
/// version 1 of the model, and a deployment of it in one wave.
async fn fleet(devices: usize) -> (Db, DeploymentRecord, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Db::open(&dir.path().join("db")).unwrap();
    let artifacts = LocalArtifactStore::open(&dir.path().join("artifacts")).unwrap();
    edgeloop_registry::models::create_model(
        &store.registry,
        serde_json::from_value(json!({"name": MODEL})).unwrap(),
        now(),
    )
    .await
    .unwrap();
    store
        .registry
        .model_versions
        .insert(&models::version_key(MODEL, "1"), &version("1"))
        .unwrap();
    for i in 0..devices {
        let gpu: &[&str] = if i % 3 == 0 {
            &["CUDAExecutionProvider"]
        } else {
            &[]
        };
        let id = format!("dev-{i:04}");
        store.fleet.devices.insert(&id, &member(&id, gpu)).unwrap();
    }
    let record = deployments::create(
        &store,
        &artifacts,
        serde_json::from_value(json!({
            "model": MODEL, "version": "1", "selector": "site=lab",
            "strategy": {"waves": {"percent": [100]}}
        }))
        .unwrap(),
        now(),
    )
    .await
    .unwrap();
    (store, record, dir)
}

/// The first tick's store reads (its wave moves every device), by tree.
async fn first_wave(devices: usize) -> (ReadCounts, Written, Db) {
    let (store, record, _dir) = fleet(devices).await;
    let before = store.read_counts();
    let written = step_and_write(&store, &record, now(), time::Duration::seconds(30), None)
        .unwrap()
        .expect("the first wave moves");
    (store.read_counts().since(&before), written, store)
}

#[tokio::test]
async fn a_wave_reads_and_writes_in_a_few_calls_whatever_its_size() {
    let (small, small_written, _) = first_wave(4).await;
    let (big, big_written, store) = first_wave(300).await;
    assert_eq!(small_written.woken.len(), 4);
    assert_eq!(big_written.woken.len(), 300);
    for tree in [
        "devices",
        "assignments",
        "assigned_history",
        "assignment_status",
    ] {
        let (s, b) = (small.0.get(tree), big.0.get(tree));
        let calls = |r: Option<&edgeloop_store::TreeReads>| r.map_or(0, |r| r.calls);
        assert!(calls(b) > 0, "{tree} is read: {big:?}");
        assert!(
            calls(b) <= calls(s) + 1,
            "{tree}: 300 devices took {} calls, 4 took {} (a per-device read crept in?)",
            calls(b),
            calls(s)
        );
    }
    // What each device got: its set, its generation, the variant that
    // fits it, and the history that admits its reports.
    for i in [0usize, 1, 299] {
        let id = format!("dev-{i:04}");
        let set = store.fleet.assignments.get(&id).unwrap().unwrap();
        assert_eq!(set.generation, 1, "{id}");
        assert_eq!(set.assignments.len(), 1, "{id}");
        assert_eq!(big_written.assigned_generation[&id], 1, "{id}");
        let gpu = i % 3 == 0;
        assert_eq!(
            big_written.assigned_variant.get(&id).map(String::as_str),
            gpu.then_some("gpu"),
            "{id}"
        );
        assert_eq!(set.assignments[0].variant.as_deref(), gpu.then_some("gpu"));
        let key = crate::fleet::admission::history_key(&id, MODEL, "1");
        assert!(store.fleet.assigned_history.contains(&key).unwrap(), "{id}");
    }
}

#[tokio::test]
async fn a_batch_skips_gone_devices_and_newer_deployments_entries() {
    let (store, record, _dir) = fleet(3).await;
    // One device left the fleet after the group was read; another's entry
    // belongs to a newer deployment.
    store.fleet.devices.remove("dev-0001").unwrap();
    let newer = AssignmentRecord {
        deployment_seq: record.seq + 1,
        ..AssignmentRecord::for_version(&version("1"), "newer", 60)
    };
    store
        .fleet
        .assignments
        .insert(
            "dev-0002",
            &crate::fleet::assignments::AssignmentSetRecord {
                generation: 7,
                assignments: vec![newer.clone()],
            },
        )
        .unwrap();
    let devices = ["dev-0000", "dev-0001", "dev-0002"];
    let entry = |m: &Member| {
        Some(AssignmentRecord {
            deployment_seq: record.seq,
            ..AssignmentRecord::for_device(
                &version("1"),
                &m.capabilities.execution_providers,
                &record.id,
                60,
            )
        })
    };
    let out = assignments::set_models(&store, MODEL, record.seq, None, &devices, entry).unwrap();
    let outcomes: Vec<SetOutcome> = out.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        outcomes,
        vec![
            SetOutcome::Changed(1),
            SetOutcome::UnknownDevice,
            SetOutcome::Stale
        ]
    );
    assert_eq!(store.fleet.assignments.get("dev-0001").unwrap(), None);
    let kept = store.fleet.assignments.get("dev-0002").unwrap().unwrap();
    assert_eq!((kept.generation, kept.assignments), (7, vec![newer]));
    // The same batch again changes nothing.
    let again = assignments::set_models(&store, MODEL, record.seq, None, &devices, entry).unwrap();
    assert_eq!(again[0].0, SetOutcome::Unchanged);
    assert_eq!(
        store
            .fleet
            .assignments
            .get("dev-0000")
            .unwrap()
            .unwrap()
            .generation,
        1
    );
}
