//! A fresh PostgreSQL database per test, dropped when the test ends: the
//! store tests and the integration harness run each case on its own
//! database of one shared server (`scripts/postgres-up.sh`).
//!
//! Also home of [`skip_or_fail!`](crate::skip_or_fail), the one way a test
//! in this crate (or the integration harness) says a service it needs is
//! missing.

use super::url::PostgresUrl;
use crate::StoreError;

/// The variable naming the test server (an admin URL that may create
/// databases); `scripts/test.sh` sets it.
pub const TEST_URL_VAR: &str = "EDGELOOP_TEST_POSTGRES_URL";

#[doc(hidden)]
pub struct TestDatabase {
    admin: PostgresUrl,
    url: PostgresUrl,
}

impl TestDatabase {
    /// A new database `edgeloop_t_<random>` on the server of
    /// `$EDGELOOP_TEST_POSTGRES_URL`; `None` (said on stderr, with `what`)
    /// when the variable is unset, so a run without a server shows what it
    /// did not test, or a panic under `EDGELOOP_REQUIRE_SERVICES=1`
    /// ([`skip_or_fail!`](crate::skip_or_fail)).
    pub fn from_env(what: &str) -> Option<Self> {
        match std::env::var(TEST_URL_VAR) {
            Ok(url) if !url.is_empty() => {
                let admin = PostgresUrl::parse(&url)
                    .unwrap_or_else(|e| panic!("{TEST_URL_VAR} is not usable: {e}"));
                Some(
                    Self::create(&admin)
                        .unwrap_or_else(|e| panic!("creating a test database: {e}")),
                )
            }
            _ => {
                crate::skip_or_fail!(
                    "{what} on PostgreSQL: {TEST_URL_VAR} is unset (scripts/postgres-up.sh \
                     starts a server and prints its env file; scripts/test.sh does)"
                );
                None
            }
        }
    }

    pub fn create(admin: &PostgresUrl) -> Result<Self, StoreError> {
        let name = format!("edgeloop_t_{:016x}", rand::random::<u64>());
        let url = admin
            .with_database(&name)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        // The name is ours (hex), so it needs no quoting.
        admin_statement(admin, format!("CREATE DATABASE {name}"))?;
        Ok(Self {
            admin: admin.clone(),
            url,
        })
    }

    pub fn url(&self) -> &PostgresUrl {
        &self.url
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.url.database()
        );
        if let Err(e) = admin_statement(&self.admin, sql) {
            eprintln!("dropping test database {}: {e}", self.url);
        }
    }
}

/// Runs one statement as the admin, on a thread of its own: the sync
/// client must not run on a tokio worker, and tests call this from one.
fn admin_statement(admin: &PostgresUrl, sql: String) -> Result<(), StoreError> {
    let admin = admin.clone();
    std::thread::spawn(move || -> Result<(), StoreError> {
        let mut client = admin.connect()?;
        client.batch_execute(&sql)?;
        Ok(())
    })
    .join()
    .map_err(|_| StoreError::Unavailable("the test database thread panicked".into()))?
}

/// Set to `1` (as `scripts/test.sh` does) to make a missing test service a
/// failure instead of a skip.
pub const REQUIRE_SERVICES_VAR: &str = "EDGELOOP_REQUIRE_SERVICES";

/// A file each skip appends one line to (`scripts/test.sh` counts them).
pub const SKIP_LOG_VAR: &str = "EDGELOOP_SKIP_LOG";

/// What a test does when a service it needs (a PostgreSQL or S3 server, a
/// browser) is not there: `cargo test` hides stderr, so a plain early
/// return would count as a pass. Under `EDGELOOP_REQUIRE_SERVICES=1` it
/// panics with the reason (which names the service and how to start it), so
/// the test fails; otherwise it appends `<test>: <reason>` to
/// `$EDGELOOP_SKIP_LOG` (when set) and says the same on stderr, and the
/// caller returns early.
///
/// A macro so that every module of this crate reaches it as
/// `crate::skip_or_fail!`, and the control plane's tests and the integration
/// harness as `edgeloop_store::skip_or_fail!`; its body sits on
/// [`TestDatabase`], the one test-only item this crate exports.
#[doc(hidden)]
#[macro_export]
macro_rules! skip_or_fail {
    ($($reason:tt)+) => {
        $crate::TestDatabase::skip_or_fail(&format!($($reason)+))
    };
}

impl TestDatabase {
    /// The body of [`skip_or_fail!`](crate::skip_or_fail).
    ///
    /// # Panics
    /// Under `EDGELOOP_REQUIRE_SERVICES=1`: that is its purpose.
    #[doc(hidden)]
    pub fn skip_or_fail(reason: &str) {
        // libtest runs each test on a thread named after it.
        let thread = std::thread::current();
        let test = thread.name().filter(|n| *n != "main").unwrap_or("a test");
        if std::env::var(REQUIRE_SERVICES_VAR).is_ok_and(|v| v == "1") {
            panic!(
                "{test}: a service this test needs is missing ({REQUIRE_SERVICES_VAR}=1): {reason}"
            );
        }
        let line = format!("{test}: skipped: {reason}\n");
        if let Some(log) = std::env::var_os(SKIP_LOG_VAR).filter(|v| !v.is_empty()) {
            use std::io::Write;
            // O_APPEND and one write per line: lines from tests running in
            // parallel (or in other test binaries) do not interleave.
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = written {
                eprintln!("{SKIP_LOG_VAR}={}: {e}", log.to_string_lossy());
            }
        }
        eprint!("{line}");
    }
}
