//! Two replicas' leaderships over one store, as two processes on one
//! PostgreSQL database share it: on sled, and on PostgreSQL when
//! `EDGELOOP_TEST_POSTGRES_URL` names a server (`scripts/test.sh` sets it;
//! without it the PostgreSQL half skips or fails: [`edgeloop_store::skip_or_fail!`]).

use std::time::Duration;

use time::OffsetDateTime;

use super::*;
use edgeloop_store::NotWritten;

const T0: i64 = 1_796_083_200;

fn at(s: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(T0 + s).unwrap()
}

/// A store per backend, with what keeps its data alive (dropped after it).
pub(crate) fn stores(what: &str) -> Vec<(Db, Box<dyn std::any::Any>)> {
    let dir = tempfile::tempdir().unwrap();
    let mut out: Vec<(Db, Box<dyn std::any::Any>)> =
        vec![(Db::open(&dir.path().join("db")).unwrap(), Box::new(dir))];
    if let Some(db) = edgeloop_store::TestDatabase::from_env(what) {
        out.push((Db::open_postgres(db.url()).unwrap(), Box::new(db)));
    }
    out
}

#[test]
fn one_replica_leads_each_task_and_the_other_takes_over_with_a_new_token() {
    for (store, _keep) in stores("leader takeover") {
        takeover(&store);
    }
}

fn takeover(store: &Db) {
    let a = Leadership::new("a".into());
    let b = Leadership::new("b".into());
    assert_eq!(a.round(store, at(0)).unwrap(), Task::ALL);
    assert!(b.round(store, at(1)).unwrap().is_empty(), "a holds them");
    assert_eq!(a.token(Task::Rollouts), Some(1));
    assert_eq!(b.token(Task::Rollouts), None);
    // a renews: same token, still a's.
    a.round(store, at(5)).unwrap();
    assert!(b.round(store, at(14)).unwrap().is_empty(), "renewed at 5");
    // a stops renewing; once its lease is past, b takes every task.
    assert_eq!(b.round(store, at(15)).unwrap(), Task::ALL);
    assert_eq!(b.token(Task::Rollouts), Some(2), "a new token");
    // a, back, finds them taken and leads nothing.
    assert!(a.round(store, at(16)).unwrap().is_empty());
    assert_eq!(a.token(Task::Rollouts), None);
}

#[test]
fn a_restarted_replica_takes_its_own_lease_at_once_and_a_release_frees_it() {
    for (store, _keep) in stores("leader restart") {
        restart(&store);
    }
}

fn restart(store: &Db) {
    let first = Leadership::new("a".into());
    first.round(store, at(0)).unwrap();
    // The same replica (its data dir) in a new process, before expiry.
    let again = Leadership::new("a".into());
    assert_eq!(again.round(store, at(1)).unwrap(), Task::ALL);
    assert_eq!(again.token(Task::Pipelines), Some(2));
    // A clean stop lets go: another replica needs no wait.
    again.release(store, at(2));
    assert_eq!(again.token(Task::Pipelines), None);
    let b = Leadership::new("b".into());
    assert_eq!(b.round(store, at(2)).unwrap(), Task::ALL);
    assert_eq!(b.token(Task::Pipelines), Some(3));
}

#[test]
fn a_leader_that_cannot_renew_stops_leading_before_its_lease_ends() {
    let (store, _keep) = stores("leader lapse").swap_remove(0);
    let a = Leadership::with_ttl("a".into(), Duration::from_millis(300));
    a.round(&store, at(0)).unwrap();
    assert!(a.leads(Task::Triggers));
    std::thread::sleep(Duration::from_millis(150));
    assert!(a.leads(Task::Triggers), "inside its lead time");
    // No round since: past LEAD_FRACTION of the ttl it stops on its own,
    // while the stored lease (300 ms) may still be its.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!a.leads(Task::Triggers));
}

#[test]
fn the_replica_id_is_made_once_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let id = replica_id(dir.path()).unwrap();
    assert!(id.starts_with("r-"), "{id}");
    assert_eq!(replica_id(dir.path()).unwrap(), id);
}

#[test]
fn a_stale_leaders_fenced_write_is_refused_and_the_new_leaders_applies() {
    for (store, _keep) in stores("leader fencing") {
        fencing(&store);
    }
}

/// A batch written under a stale fence is refused as a whole, key by key.
#[test]
fn a_stale_leaders_batch_is_refused_whole() {
    for (store, _keep) in stores("leader fencing of batches") {
        let t = &store.lifecycle.pipeline_active;
        let a = Leadership::new("a".into());
        a.round(&store, at(0)).unwrap();
        let old = a.fence(Task::Rollouts).unwrap();
        let write = |fence, v: &str| {
            store
                .update_many_fenced(t, Some(fence), &["x", "y"], |_, _| {
                    Ok::<_, ()>(v.to_string())
                })
                .unwrap()
        };
        let ok = |v: &str| vec![Ok(v.to_string()), Ok(v.to_string())];
        assert_eq!(write(old, "from a"), ok("from a"));
        let b = Leadership::new("b".into());
        b.round(&store, at(30)).unwrap();
        let new = b.fence(Task::Rollouts).unwrap();
        let refused = vec![Err(NotWritten::FencedOut(old)); 2];
        assert_eq!(write(old, "stale a"), refused);
        assert_eq!(
            t.get_many(&["x", "y"]).unwrap(),
            vec![Some("from a".to_string()); 2],
            "nothing of the stale batch landed"
        );
        assert_eq!(write(new, "from b"), ok("from b"));
    }
}

fn fencing(store: &Db) {
    let t = &store.lifecycle.pipeline_active;
    let a = Leadership::new("a".into());
    a.round(store, at(0)).unwrap();
    let old = a.fence(Task::Pipelines).unwrap();
    let write = |fence, v: &str| {
        store
            .update_fenced(t, Some(fence), "k", |_| Ok::<_, ()>(v.to_string()))
            .unwrap()
    };
    assert_eq!(write(old, "from a"), Ok("from a".to_string()));
    // b takes over once a's lease is past; a has not noticed yet.
    let b = Leadership::new("b".into());
    b.round(store, at(30)).unwrap();
    let new = b.fence(Task::Pipelines).unwrap();
    assert!(new.token > old.token);
    assert_eq!(
        write(old, "stale a"),
        Err(NotWritten::FencedOut(old)),
        "the fence moved on"
    );
    assert_eq!(t.get("k").unwrap().as_deref(), Some("from a"));
    assert_eq!(write(new, "from b"), Ok("from b".to_string()));
    // A fence for a task nobody ever led refuses too.
    let never = edgeloop_store::Fence {
        task: "nobody",
        token: 1,
    };
    assert_eq!(write(never, "x"), Err(NotWritten::FencedOut(never)));
    // Without a fence it is a plain update; a refusal is `f`'s.
    assert_eq!(
        store
            .update_fenced(t, None, "k", |_| Err::<String, _>("no"))
            .unwrap(),
        Err(NotWritten::Refused("no"))
    );
}

#[test]
fn replicas_of_one_store_must_share_their_ca() {
    for (store, _keep) in stores("shared ca") {
        let (a, b) = (
            edgeloop_models::Digest::of(b"ca a"),
            edgeloop_models::Digest::of(b"ca b"),
        );
        check_shared_ca(&store, a).unwrap();
        check_shared_ca(&store, a).expect("the same CA again");
        let err = check_shared_ca(&store, b).unwrap_err().to_string();
        assert!(err.contains("copy pki/ca.crt"), "{err}");
    }
}
