//! A fresh PostgreSQL database per test, dropped when the test ends: the
//! store tests and the integration harness run each case on its own
//! database of one shared server (`scripts/postgres-up.sh`).

use super::url::PostgresUrl;
use crate::store::StoreError;

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
    /// did not test.
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
                eprintln!(
                    "skipped: {what} on PostgreSQL ({TEST_URL_VAR} is unset; \
                     scripts/postgres-up.sh starts a server and prints its env file)"
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
