//! The PostgreSQL tables, as versioned migrations applied in order.
//!
//! Several control planes may start on one database at once, so the whole
//! check-and-apply runs in one transaction under a transaction-scoped
//! advisory lock: the first migrates, the others wait and then find nothing
//! left to do. A database migrated by a newer binary (a version above the
//! last one here) is refused, as sled's newer schema is.

use super::super::{StoreError, SCHEMA_VERSION};

/// `pg_advisory_xact_lock`'s key for migrations: "edgeloop" in ASCII.
const MIGRATION_LOCK: i64 = 0x6564_6765_6c6f_6f70;

/// (version, SQL), in order. Never edit one that has shipped: add the next.
pub const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    // Keys and values are bytea so that key order is bytewise, as sled's
    // (text would sort by collation). `gen` counts a row's writes.
    // The tree "" holds the store's record schema version, like sled's
    // default tree.
    "CREATE TABLE kv (
         tree text NOT NULL,
         key bytea NOT NULL,
         value bytea NOT NULL,
         gen bigint NOT NULL,
         PRIMARY KEY (tree, key)
     );
     CREATE SEQUENCE edgeloop_ids;",
)];

/// The newest migration this binary knows.
pub fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

/// Brings the database's tables up to [`latest`]; how many migrations this
/// call applied (0 when another replica, or an earlier start, did).
pub fn migrate(client: &mut postgres::Client) -> Result<usize, StoreError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )?;
    let found: Option<i32> = tx
        .query_one("SELECT max(version) FROM schema_migrations", &[])?
        .get(0);
    let found = found.unwrap_or(0);
    if found > latest() {
        return Err(StoreError::SchemaTooNew {
            found: found as u32,
            supported: latest() as u32,
        });
    }
    let mut applied = 0;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.batch_execute(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[version],
        )?;
        applied += 1;
    }
    tx.commit()?;
    if applied > 0 {
        tracing::info!(
            applied,
            version = latest(),
            record_schema = SCHEMA_VERSION,
            "PostgreSQL store migrated"
        );
    }
    Ok(applied)
}
