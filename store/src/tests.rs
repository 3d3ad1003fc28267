//! The store's behaviour, run on every backend: each test takes its stores
//! from [`cases`], sled in a temporary directory and, when
//! `EDGELOOP_TEST_POSTGRES_URL` names a server, PostgreSQL on a fresh
//! database (dropped afterwards). Without the variable the PostgreSQL cases
//! are skipped ([`crate::skip_or_fail!`]: a failure under
//! `EDGELOOP_REQUIRE_SERVICES=1`); `scripts/test.sh` always sets it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// One backend's store for one test, with what keeps its data alive.
struct Case {
    backend: &'static str,
    store: Store,
    place: Place,
}

/// Declared after the store, so the store closes first.
enum Place {
    Sled(tempfile::TempDir),
    Postgres(Box<TestDatabase>),
}

fn sled_path(dir: &Path) -> PathBuf {
    dir.join("db")
}

/// A store per backend; `what` names the test in the skip message.
fn cases(what: &str) -> Vec<Case> {
    let dir = tempfile::tempdir().unwrap();
    let mut out = vec![Case {
        backend: "sled",
        store: Store::open(&sled_path(dir.path())).unwrap(),
        place: Place::Sled(dir),
    }];
    if let Some(db) = TestDatabase::from_env(what) {
        out.push(Case {
            backend: "postgres",
            store: Store::open_postgres(db.url()).unwrap(),
            place: Place::Postgres(Box::new(db)),
        });
    }
    out
}

/// Opens `path` again once the last handle's background threads have
/// let go of sled's file lock: they outlive the drop by a moment, and
/// an open in that moment fails with "could not acquire lock".
fn reopen_sled(path: &Path) -> Result<Store, StoreError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Store::open(path) {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Trees of the value types these tests use. The store names no record
/// type, so the tests open their own (under names a wing uses, which the
/// raw backend calls below name too).
fn strings(store: &Store) -> Tree<String> {
    store.tree("pipeline_active").unwrap()
}

fn counts(store: &Store) -> Tree<u64> {
    store.tree("label_hours").unwrap()
}

fn flags(store: &Store) -> Tree<bool> {
    store.tree("accuracy_index").unwrap()
}

fn keys<V>(page: Vec<(String, V)>) -> Vec<String> {
    page.into_iter().map(|(k, _)| k).collect()
}

#[test]
fn pages_start_after_the_cursor_stay_in_the_prefix_and_stop_at_the_limit() {
    for case in cases("paging forward") {
        let t = &strings(&case.store);
        for k in ["a/1", "a/2", "a/3", "a/4", "b/1", "a0"] {
            t.insert(k, &k.to_string()).unwrap();
        }
        let all = |_: &str, _: &String| true;
        let b = case.backend;
        assert_eq!(
            keys(t.page_after("a/", None, 2, all).unwrap()),
            ["a/1", "a/2"],
            "{b}"
        );
        assert_eq!(
            keys(t.page_after("a/", Some("a/2"), 10, all).unwrap()),
            ["a/3", "a/4"],
            "{b}: from the cursor, and not past the prefix"
        );
        assert!(
            t.page_after("a/", Some("a/4"), 10, all).unwrap().is_empty(),
            "{b}"
        );
        // A cursor before the prefix starts at it; the filter does not
        // count toward the limit.
        let odd = |k: &str, _: &String| k.ends_with('1') || k.ends_with('3');
        assert_eq!(
            keys(t.page_after("a/", Some("0"), 2, odd).unwrap()),
            ["a/1", "a/3"],
            "{b}"
        );
    }
}

#[test]
fn pages_before_the_cursor_go_newest_first_and_stay_in_the_prefix() {
    for case in cases("paging backward") {
        let t = &strings(&case.store);
        for k in ["a/1", "a/2", "a/3", "a/4", "b/1", "a0", "0"] {
            t.insert(k, &k.to_string()).unwrap();
        }
        let all = |_: &str, _: &String| true;
        let b = case.backend;
        assert_eq!(
            keys(t.page_before("a/", None, 2, all).unwrap()),
            ["a/4", "a/3"],
            "{b}"
        );
        assert_eq!(
            keys(t.page_before("a/", Some("a/3"), 10, all).unwrap()),
            ["a/2", "a/1"],
            "{b}: below the cursor, and not past the prefix's start"
        );
        assert!(
            t.page_before("a/", Some("a/1"), 10, all)
                .unwrap()
                .is_empty(),
            "{b}"
        );
        // A cursor past the prefix starts at its end, one before it gives
        // nothing; the filter does not count toward the limit.
        let odd = |k: &str, _: &String| k.ends_with('1') || k.ends_with('3');
        assert_eq!(
            keys(t.page_before("a/", Some("z"), 2, odd).unwrap()),
            ["a/3", "a/1"],
            "{b}"
        );
        assert!(
            t.page_before("a/", Some("0"), 10, all).unwrap().is_empty(),
            "{b}"
        );
        assert_eq!(
            keys(t.page_before("", None, 3, all).unwrap()),
            ["b/1", "a0", "a/4"],
            "{b}: the empty prefix is every key"
        );
        assert_eq!(
            keys(t.page_rev_before(Some("a0"), 2).unwrap()),
            ["a/4", "a/3"],
            "{b}"
        );
    }
}

/// Scans that stop on a condition read in chunks; these cross several.
#[test]
fn filtered_scans_cross_chunk_boundaries() {
    for case in cases("scans over many records") {
        let t = &counts(&case.store);
        let b = case.backend;
        for i in 0..1000u64 {
            t.insert(&format!("m/{i:04}"), &i).unwrap();
        }
        t.insert("n/0", &0).unwrap();
        let every_97th = |_: &str, v: &u64| v.is_multiple_of(97);
        let page = t.page_after("m/", Some("m/0100"), 5, every_97th).unwrap();
        assert_eq!(
            keys(page),
            ["m/0194", "m/0291", "m/0388", "m/0485", "m/0582"],
            "{b}"
        );
        let page = t.page_before("m/", None, 3, every_97th).unwrap();
        assert_eq!(keys(page), ["m/0970", "m/0873", "m/0776"], "{b}");
        let tail = t.scan_prefix_rev_while("m/", |v| *v >= 300).unwrap();
        assert_eq!(tail.len(), 700, "{b}");
        assert_eq!((tail[0], tail[699]), (999, 300), "{b}");
        assert_eq!(t.scan_prefix("m/").unwrap().len(), 1000, "{b}");
        assert_eq!(t.first_with_prefix("m/", 3).unwrap().len(), 3, "{b}");
        assert_eq!(t.len().unwrap(), 1001, "{b}");
        assert_eq!(
            t.last_with_prefix("m/").unwrap().unwrap().0,
            "m/0999",
            "{b}"
        );
        assert_eq!(
            t.last_in_range("m/0500", "m/0600").unwrap().unwrap().0,
            "m/0599",
            "{b}"
        );
        assert_eq!(
            t.first_key_from("m/1").unwrap().as_deref(),
            Some("n/0"),
            "{b}"
        );
        assert_eq!(t.first_key_from("o").unwrap(), None, "{b}");
    }
}

/// Keys sort by their bytes on every backend, as sled sorts them (not by a
/// text collation): the wings' prefix walks rely on it.
#[test]
fn keys_sort_bytewise() {
    for case in cases("key order") {
        let t = &strings(&case.store);
        let mut ks = ["a", "A", "a/", "a0", "é", "z", "a\u{7f}", "Z/ü", "_", "~"];
        for k in ks {
            t.insert(k, &k.to_string()).unwrap();
        }
        ks.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        assert_eq!(keys(t.scan_prefix("").unwrap()), ks, "{}", case.backend);
        assert_eq!(t.first(2).unwrap().len(), 2);
    }
}

#[test]
fn single_records_read_write_and_compare_and_swap() {
    for case in cases("single-record operations") {
        let t = &counts(&case.store);
        let b = case.backend;
        assert!(t.is_empty().unwrap(), "{b}");
        assert_eq!(t.get("k").unwrap(), None, "{b}");
        assert!(t.insert_new("k", &1).unwrap(), "{b}");
        assert!(!t.insert_new("k", &2).unwrap(), "{b}: already there");
        assert!(t.contains("k").unwrap(), "{b}");
        assert_eq!(t.get("k").unwrap(), Some(1), "{b}");
        t.insert("k", &3).unwrap();
        assert!(!t.remove_if_eq("k", &1).unwrap(), "{b}: not 1 any more");
        let refused: Result<u64, &str> = t.update("k", |_| Err("no")).unwrap();
        assert_eq!(refused, Err("no"), "{b}");
        assert_eq!(
            t.update::<()>("k", |v| Ok(v.unwrap() + 1)).unwrap(),
            Ok(4),
            "{b}"
        );
        assert!(t.remove_if_eq("k", &4).unwrap(), "{b}");
        assert!(!t.contains("k").unwrap(), "{b}");
        t.insert("j", &9).unwrap();
        assert_eq!(t.remove("j").unwrap(), Some(9), "{b}");
        assert_eq!(t.remove("j").unwrap(), None, "{b}");
        assert!(t.is_empty().unwrap(), "{b}");
        assert_eq!(t.values().unwrap(), Vec::<u64>::new(), "{b}");
        // Trees are separate keyspaces.
        flags(&case.store).insert("k", &true).unwrap();
        assert_eq!(t.get("k").unwrap(), None, "{b}");
    }
}

/// Batched reads, writes and swaps (a rollout wave's) give each key what
/// one call per key would, and a batch's fence is checked once for all.
#[test]
fn batches_read_write_and_swap_per_key() {
    use super::backend::{FenceCheck, FencedCas, Swap};
    for case in cases("batched operations") {
        let (t, b) = (&counts(&case.store), case.backend);
        t.insert_many(&[("a", &1), ("b", &2), ("e", &5), ("a", &1)])
            .unwrap();
        assert_eq!(
            t.get_many(&["a", "zz", "b", "a"]).unwrap(),
            vec![Some(1), None, Some(2), Some(1)],
            "{b}: in order, absent keys as None, repeats answered"
        );
        assert_eq!(t.get_many(&[]).unwrap(), Vec::<Option<u64>>::new(), "{b}");
        let j = |v: u64| serde_json::to_vec(&v).unwrap();
        let (one, two, three, five, ten) = (j(1), j(2), j(3), j(5), j(10));
        let swaps = [
            // Each kind of swap, applying and not.
            Swap {
                key: b"a",
                old: Some(&one),
                new: Some(&ten),
            },
            Swap {
                key: b"b",
                old: Some(&three),
                new: Some(&ten),
            },
            Swap {
                key: b"c",
                old: None,
                new: Some(&three),
            },
            Swap {
                key: b"e",
                old: None,
                new: Some(&three),
            },
            Swap {
                key: b"f",
                old: Some(&five),
                new: None,
            },
            Swap {
                key: b"g",
                old: None,
                new: None,
            },
        ];
        let db = &*case.store.db;
        use FencedCas::{Changed, Fenced, Swapped};
        assert_eq!(
            db.compare_and_swap_many("label_hours", &swaps, None)
                .unwrap(),
            vec![Swapped, Changed, Swapped, Changed, Changed, Swapped],
            "{b}"
        );
        assert_eq!(
            t.get_many(&["a", "b", "c", "e", "f"]).unwrap(),
            vec![Some(10), Some(2), Some(3), Some(5), None],
            "{b}: only the swaps that held applied"
        );
        let removal = [
            Swap {
                key: b"e",
                old: Some(&five),
                new: None,
            },
            Swap {
                key: b"b",
                old: Some(&two),
                new: Some(&one),
            },
            Swap {
                key: b"x",
                old: None,
                new: None,
            },
        ];
        // A fence that holds lets the batch through; one that moved on
        // stops all of it.
        case.store.fences.insert("rollouts", &7).unwrap();
        let (seven, eight) = (j(7), j(8));
        let fence = |value| FenceCheck {
            tree: "fences",
            key: b"rollouts",
            value,
        };
        assert_eq!(
            db.compare_and_swap_many("label_hours", &removal, Some(fence(&eight)))
                .unwrap(),
            vec![Fenced, Fenced, Fenced],
            "{b}"
        );
        assert_eq!(
            t.get_many(&["e", "b"]).unwrap(),
            vec![Some(5), Some(2)],
            "{b}"
        );
        assert_eq!(
            db.compare_and_swap_many("label_hours", &removal, Some(fence(&seven)))
                .unwrap(),
            vec![Swapped, Swapped, Swapped],
            "{b}"
        );
        assert_eq!(t.get_many(&["e", "b"]).unwrap(), vec![None, Some(1)], "{b}");
        let twice = [
            Swap {
                key: b"a",
                old: None,
                new: Some(&one),
            },
            Swap {
                key: b"a",
                old: Some(&ten),
                new: Some(&one),
            },
        ];
        assert!(
            matches!(
                db.compare_and_swap_many("label_hours", &twice, None),
                Err(StoreError::DuplicateKey { .. })
            ),
            "{b}: a key twice in one batch is refused"
        );
        assert_eq!(t.get("a").unwrap(), Some(10), "{b}: and nothing written");
        assert_eq!(
            db.compare_and_swap_many("label_hours", &[], None).unwrap(),
            vec![],
            "{b}"
        );
    }
}

/// Threads add to the same counters with batched updates: the batch's
/// re-reads and retries lose no increment on either backend.
#[test]
fn racing_batched_updates_lose_no_increment() {
    const THREADS: u64 = 6;
    const EACH: u64 = 25;
    let keys = ["c0", "c1", "c2", "c3", "c4"];
    for case in cases("racing batched updates") {
        let store = Arc::new(case.store.clone());
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..EACH {
                        let out = store
                            .update_many_fenced(&counts(&store), None, &keys, |_, v| {
                                Ok::<_, ()>(v.unwrap_or(0) + 1)
                            })
                            .unwrap();
                        assert!(out.iter().all(Result::is_ok));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let got = counts(&store).get_many(&keys).unwrap();
        assert_eq!(
            got,
            vec![Some(THREADS * EACH); keys.len()],
            "{}",
            case.backend
        );
    }
}

/// Many threads add to one counter with `update`: the compare-and-swap
/// loses no increment on either backend.
#[test]
fn racing_updates_lose_no_increment() {
    const THREADS: u64 = 8;
    const EACH: u64 = 50;
    for case in cases("racing compare-and-swap") {
        let store = Arc::new(case.store.clone());
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..EACH {
                        counts(&store)
                            .update::<()>("counter", |v| Ok(v.unwrap_or(0) + 1))
                            .unwrap()
                            .unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(
            counts(&store).get("counter").unwrap(),
            Some(THREADS * EACH),
            "{}",
            case.backend
        );
    }
}

/// Racing `insert_new`s of one key: exactly one wins.
#[test]
fn racing_inserts_have_one_winner() {
    for case in cases("racing insert_new") {
        for round in 0..20 {
            let store = Arc::new(case.store.clone());
            let key = format!("k{round}");
            let handles: Vec<_> = (0..6u64)
                .map(|i| {
                    let (store, key) = (store.clone(), key.clone());
                    std::thread::spawn(move || counts(&store).insert_new(&key, &i).unwrap())
                })
                .collect();
            let wins = handles.into_iter().map(|h| h.join().unwrap());
            assert_eq!(wins.filter(|w| *w).count(), 1, "{}", case.backend);
        }
    }
}

#[test]
fn ids_increase_across_reopen() {
    for case in cases("next_id") {
        let a = case.store.next_id().unwrap();
        let b = case.store.next_id().unwrap();
        assert!(b > a, "{}", case.backend);
        let Case {
            store,
            place,
            backend,
        } = case;
        drop(store);
        let reopened = reopen_place(&place).unwrap();
        assert!(reopened.next_id().unwrap() > b, "{backend}");
    }
}

#[test]
fn newer_schema_is_refused() {
    for case in cases("the record schema check") {
        case.store.force_schema_version(SCHEMA_VERSION + 1).unwrap();
        let Case {
            store,
            place,
            backend,
        } = case;
        drop(store);
        let err = reopen_place(&place).err().unwrap();
        assert!(
            matches!(err, StoreError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
            "{backend}: {err:?}"
        );
        assert!(err.to_string().contains("newer Edgeloop"), "{err}");
    }
}

fn reopen_place(place: &Place) -> Result<Store, StoreError> {
    match place {
        Place::Sled(dir) => reopen_sled(&sled_path(dir.path())),
        Place::Postgres(db) => Store::open_postgres(db.url()),
    }
}

#[test]
fn reopen_keeps_schema_and_records() {
    for case in cases("reopening") {
        counts(&case.store).insert("x", &7).unwrap();
        let Case {
            store,
            place,
            backend,
        } = case;
        drop(store);
        let store = reopen_place(&place).unwrap();
        assert_eq!(counts(&store).get("x").unwrap(), Some(7), "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_flushes_all_complete() {
    for case in cases("flush") {
        let mut tasks = Vec::new();
        for i in 0u64..500 {
            let store = case.store.clone();
            tasks.push(tokio::spawn(async move {
                counts(&store).insert(&format!("{i:04}"), &i).unwrap();
                store.flush().await.unwrap();
            }));
        }
        let all = futures::future::join_all(tasks);
        tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("every flush completes");
        assert_eq!(counts(&case.store).len().unwrap(), 500, "{}", case.backend);
    }
}

/// Store calls from a current-thread runtime's task: the PostgreSQL
/// client never runs on the caller's thread, so nothing nests runtimes.
#[tokio::test(flavor = "current_thread")]
async fn store_calls_work_on_a_current_thread_runtime() {
    for case in cases("a current-thread runtime") {
        counts(&case.store).insert("a", &1).unwrap();
        case.store.flush().await.unwrap();
        assert_eq!(
            counts(&case.store).get("a").unwrap(),
            Some(1),
            "{}",
            case.backend
        );
        case.store.check().unwrap();
    }
}

/// Migrations, reconnection, TLS and connection errors.
mod postgres_only;

/// `remove_many` removes the keys that are there, counts them, and leaves
/// the rest, on either backend.
#[test]
fn remove_many_removes_and_counts_the_keys_there() {
    for case in cases("remove_many") {
        let t = &counts(&case.store);
        for k in ["a", "b", "c"] {
            t.insert(k, &1).unwrap();
        }
        assert_eq!(
            t.remove_many(&["a", "c", "missing"]).unwrap(),
            2,
            "{}",
            case.backend
        );
        assert_eq!(t.remove_many(&[]).unwrap(), 0, "{}", case.backend);
        assert_eq!(
            t.get_many(&["a", "b", "c"]).unwrap(),
            vec![None, Some(1), None],
            "{}",
            case.backend
        );
    }
}
