//! What only the PostgreSQL backend has: migrations, reconnection, TLS,
//! and its errors. Without a server each test skips, or fails under
//! `EDGELOOP_REQUIRE_SERVICES=1` (`crate::skip_or_fail!`).

use super::*;
use crate::pg;
use crate::pg::schema;

/// Runs `f` with a fresh connection on a thread of its own.
fn with_client<R: Send + 'static>(
    url: &PostgresUrl,
    f: impl FnOnce(&mut ::postgres::Client) -> R + Send + 'static,
) -> R {
    let url = url.clone();
    std::thread::spawn(move || {
        let mut c = url.connect().unwrap();
        f(&mut c)
    })
    .join()
    .unwrap()
}

fn versions(url: &PostgresUrl) -> Vec<i32> {
    with_client(url, |c| {
        c.query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
}

#[test]
fn an_empty_database_is_migrated_and_reopening_is_a_no_op() {
    let Some(db) = TestDatabase::from_env("migrations") else {
        return;
    };
    let all: Vec<i32> = schema::MIGRATIONS.iter().map(|(v, _)| *v).collect();
    let applied = with_client(db.url(), |c| schema::migrate(c).unwrap());
    assert_eq!(applied, all.len());
    assert_eq!(versions(db.url()), all);
    let again = with_client(db.url(), |c| schema::migrate(c).unwrap());
    assert_eq!(again, 0, "nothing left to apply");
    drop(Store::open_postgres(db.url()).unwrap());
    drop(Store::open_postgres(db.url()).unwrap());
    assert_eq!(versions(db.url()), all, "each migration recorded once");
}

#[test]
fn a_database_migrated_by_a_newer_binary_is_refused() {
    let Some(db) = TestDatabase::from_env("the migration version check") else {
        return;
    };
    drop(Store::open_postgres(db.url()).unwrap());
    let newer = schema::latest() + 1;
    with_client(db.url(), move |c| {
        c.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[&newer],
        )
        .unwrap()
    });
    let err = Store::open_postgres(db.url()).err().unwrap();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, supported } if found == newer as u32 && supported == schema::latest() as u32),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer Edgeloop"), "{err}");
}

#[test]
fn concurrent_opens_migrate_once() {
    let Some(db) = TestDatabase::from_env("concurrent migrations") else {
        return;
    };
    let applied: usize = (0..4)
        .map(|_| {
            let url = db.url().clone();
            std::thread::spawn(move || {
                let mut c = url.connect().unwrap();
                schema::migrate(&mut c).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum();
    assert_eq!(
        applied,
        schema::MIGRATIONS.len(),
        "applied by one opener only"
    );
    let all: Vec<i32> = schema::MIGRATIONS.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions(db.url()), all);
    // And whole stores opening at once all come up.
    let opens: Vec<_> = (0..3)
        .map(|_| {
            let url = db.url().clone();
            std::thread::spawn(move || Store::open_postgres(&url).map(drop))
        })
        .collect();
    for h in opens {
        h.join().unwrap().unwrap();
    }
}

/// The server ends every connection (a restart, a failover): the next
/// read reconnects, and writes go on after that.
#[test]
fn a_broken_connection_is_replaced() {
    let Some(db) = TestDatabase::from_env("reconnecting") else {
        return;
    };
    let store = Store::open_postgres(db.url()).unwrap();
    counts(&store).insert("a", &1).unwrap();
    let name = db.url().database();
    let killed = with_client(db.url(), move |c| {
        c.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .unwrap()
        .len()
    });
    assert!(killed >= 1, "the store's connection was there to end");
    // Reads are retried once on a new connection.
    for _ in 0..2 * pg::pool::POOL_SIZE {
        assert_eq!(counts(&store).get("a").unwrap(), Some(1));
    }
    // A write on a connection that broke says so (its outcome is
    // unknown in general, so it is not repeated), and the next one
    // reconnects. Here the server ran none of the failed ones.
    let mut errors = 0;
    loop {
        match counts(&store).update::<()>("a", |v| Ok(v.unwrap() + 1)) {
            Ok(v) => {
                assert_eq!(v, Ok(2));
                break;
            }
            Err(e) => {
                assert!(matches!(e, StoreError::Postgres(_)), "{e:?}");
                errors += 1;
                assert!(
                    errors <= pg::pool::POOL_SIZE,
                    "each connection fails once at most"
                );
            }
        }
    }
    assert_eq!(counts(&store).get("a").unwrap(), Some(2));
    store.check().unwrap();
}

/// `sslmode=require` with the server's CA: every connection the store
/// makes is TLS in the server's own view (`pg_stat_ssl`), and the store
/// works over them; a CA that did not sign the server's certificate is
/// refused at open, saying so.
#[test]
fn tls_connections_are_verified_and_encrypted() {
    let Some(db) = TestDatabase::from_env("TLS") else {
        return;
    };
    let Some(ca) = std::env::var_os("EDGELOOP_TEST_POSTGRES_CA") else {
        crate::skip_or_fail!(
            "TLS to PostgreSQL: EDGELOOP_TEST_POSTGRES_CA is unset (scripts/postgres-up.sh \
             prints it in its env file; scripts/test.sh exports it)"
        );
        return;
    };
    let with_root = |root: &Path| {
        let sep = if db.url().expose().contains('?') {
            '&'
        } else {
            '?'
        };
        PostgresUrl::parse(&format!(
            "{}{sep}sslmode=require&sslrootcert={}",
            db.url().expose(),
            root.display()
        ))
        .unwrap()
    };
    let store = Store::open_postgres(&with_root(Path::new(&ca))).unwrap();
    counts(&store).insert("a", &1).unwrap();
    // Several at once, so that more than one pool connection opens.
    std::thread::scope(|s| {
        for _ in 0..pg::pool::POOL_SIZE {
            s.spawn(|| {
                for _ in 0..20 {
                    assert_eq!(counts(&store).get("a").unwrap(), Some(1));
                }
            });
        }
    });
    counts(&store)
        .update::<()>("a", |v| Ok(v.unwrap() + 1))
        .unwrap()
        .unwrap();
    let name = db.url().database();
    let (encrypted, clear): (i64, i64) = with_client(db.url(), move |c| {
        let row = c
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
                 FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid
                 WHERE a.datname = $1 AND a.pid <> pg_backend_pid()",
                &[&name],
            )
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert!(
        encrypted >= 1,
        "the store's connections: {encrypted} over TLS"
    );
    assert_eq!(clear, 0, "no store connection in clear");
    assert_eq!(counts(&store).get("a").unwrap(), Some(2));
    drop(store);

    // Another CA: the server's certificate does not chain to it.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(&other, cert.cert.pem()).unwrap();
    let err = Store::open_postgres(&with_root(&other))
        .err()
        .expect("refused");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn an_unreachable_server_is_a_clear_error() {
    // A port nothing listens on (the test server's is 55432).
    let url = PostgresUrl::parse("postgres://u:p@127.0.0.1:9/db?connect_timeout=2").unwrap();
    let err = Store::open_postgres(&url).err().unwrap();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:9/db"), "{err}");
    assert!(!err.to_string().contains(":p@"), "no password: {err}");
}

/// A store call that waits on the server (here, for a row another session
/// holds locked for 300 ms) does not hold its runtime worker: on a runtime
/// with one worker, another task keeps running during the wait. Held, the
/// ticker would stop until the lock went, as heartbeats stopped behind a
/// rollout's store calls.
#[test]
fn a_call_waiting_on_the_server_leaves_the_runtime_worker_to_other_tasks() {
    let Some(db) = TestDatabase::from_env("waits off the runtime's worker") else {
        return;
    };
    let store = Arc::new(Store::open_postgres(db.url()).unwrap());
    counts(&store).insert("held", &1).unwrap();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let url = db.url().clone();
    let holder = std::thread::spawn(move || {
        let mut c = url.connect().unwrap();
        let mut tx = c.transaction().unwrap();
        tx.query(
            "SELECT 1 FROM kv WHERE tree = 'label_hours' AND key = 'held'::bytea FOR UPDATE",
            &[],
        )
        .unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        tx.commit().unwrap();
    });
    locked_rx.recv().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let writer = store.clone();
    let ticks_while_waiting = rt.block_on(async move {
        let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = ticks.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let write = tokio::spawn(async move { counts(&writer).insert("held", &2) });
        write.await.unwrap().unwrap();
        let during = ticks.load(std::sync::atomic::Ordering::Relaxed);
        ticker.abort();
        during
    });
    holder.join().unwrap();
    assert_eq!(counts(&store).get("held").unwrap(), Some(2));
    assert!(
        ticks_while_waiting >= 10,
        "the other task ran {ticks_while_waiting} times while the write waited 300 ms"
    );
}
