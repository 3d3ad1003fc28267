//! The PostgreSQL backend (`--store-url postgres://...`): every tree is rows
//! of one table, `kv(tree, key, value, gen)`, keyed by (tree, key) with
//! bytea keys so that ranges come back in sled's bytewise order. Every
//! call is one autocommitted statement, durable when it returns.

pub(super) mod pool;
pub mod schema;
mod testdb;
mod tls;
mod url;

use std::ops::Bound;
use std::sync::Arc;

use postgres::types::ToSql;

use super::backend::{Entry, FenceCheck, FencedCas, KvBackend, KvTree, Range};
use super::StoreError;
use pool::Pool;

pub use testdb::TestDatabase;
pub use url::{PostgresUrl, StoreUrlError};

/// The tree holding the record schema version (no real tree is unnamed).
const META_TREE: &str = "";
const SCHEMA_KEY: &[u8] = b"schema_version";

pub struct PostgresBackend {
    pool: Arc<Pool>,
}

impl PostgresBackend {
    /// Connects, and migrates the tables (see [`schema`]).
    pub fn open(url: &PostgresUrl) -> Result<Self, StoreError> {
        let pool = Arc::new(Pool::start(url)?);
        pool.call(false, |s| schema::migrate(s.client()?))?;
        Ok(Self { pool })
    }

    fn tree(&self, name: &str) -> PgTree {
        PgTree {
            pool: self.pool.clone(),
            name: Arc::from(name),
        }
    }
}

#[async_trait::async_trait]
impl KvBackend for PostgresBackend {
    fn open_tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StoreError> {
        Ok(Arc::new(self.tree(name)))
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        // Not retried: a lost answer only skips a number, but an id must
        // not be handed out twice, and nextval never repeats.
        let id: i64 = self.pool.call(false, |s| {
            let (c, st) = s.prepared("SELECT nextval('edgeloop_ids')")?;
            Ok(c.query_one(&st, &[])?.try_get(0)?)
        })?;
        Ok(id as u64)
    }

    /// One statement: the write's `WHERE` also requires the fence row to
    /// hold its value, and takes a share lock on it, so a change of the
    /// fence waits for this write to commit and every later reader of the
    /// fence sees the write. No retry after a lost connection, as for
    /// `compare_and_swap`.
    fn compare_and_swap_fenced(
        &self,
        tree: &str,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
        fence: FenceCheck<'_>,
    ) -> Result<FencedCas, StoreError> {
        let (tree, key) = (tree.to_string(), key.to_vec());
        let (old, new) = (old.map(<[u8]>::to_vec), new.map(<[u8]>::to_vec));
        let (ftree, fkey, fvalue) = (
            fence.tree.to_string(),
            fence.key.to_vec(),
            fence.value.to_vec(),
        );
        self.pool.call(false, move |s| {
            const HELD: &str = "EXISTS (SELECT 1 FROM kv f WHERE f.tree = $4 AND f.key = $5 \
                                AND f.value = $6 FOR SHARE)";
            let (tree, ftree): (&str, &str) = (&tree, &ftree);
            let rows = match (&old, &new) {
                // Only reads: nothing to order against the fence's change.
                (None, None) => {
                    let (c, st) =
                        s.prepared("SELECT 1 FROM kv WHERE tree = $1 AND key = $2 AND value = $3")?;
                    if c.query_opt(&st, &[&ftree, &fkey, &fvalue])?.is_none() {
                        return Ok(FencedCas::Fenced);
                    }
                    let (c, st) = s.prepared("SELECT 1 FROM kv WHERE tree = $1 AND key = $2")?;
                    return Ok(match c.query_opt(&st, &[&tree, &key])? {
                        None => FencedCas::Swapped,
                        Some(_) => FencedCas::Changed,
                    });
                }
                (None, Some(new)) => {
                    let (c, st) = s.prepared(&format!(
                        "INSERT INTO kv (tree, key, value, gen) SELECT $1, $2, $3, 1 WHERE {HELD} \
                         ON CONFLICT (tree, key) DO NOTHING"
                    ))?;
                    c.execute(&st, &[&tree, &key, new, &ftree, &fkey, &fvalue])?
                }
                (Some(old), Some(new)) => {
                    let (c, st) = s.prepared(&format!(
                        "UPDATE kv SET value = $7, gen = gen + 1 \
                         WHERE tree = $1 AND key = $2 AND value = $3 AND {HELD}"
                    ))?;
                    c.execute(&st, &[&tree, &key, old, &ftree, &fkey, &fvalue, new])?
                }
                (Some(old), None) => {
                    let (c, st) = s.prepared(&format!(
                        "DELETE FROM kv WHERE tree = $1 AND key = $2 AND value = $3 AND {HELD}"
                    ))?;
                    c.execute(&st, &[&tree, &key, old, &ftree, &fkey, &fvalue])?
                }
            };
            if rows == 1 {
                return Ok(FencedCas::Swapped);
            }
            // Which condition failed: the fence only moves on, so one that
            // no longer holds says the writer is stale.
            let (c, st) = s.prepared("SELECT value FROM kv WHERE tree = $1 AND key = $2")?;
            let held: Option<Vec<u8>> = c
                .query_opt(&st, &[&ftree, &fkey])?
                .map(|r| r.try_get(0))
                .transpose()?;
            Ok(if held.as_deref() == Some(&fvalue[..]) {
                FencedCas::Changed
            } else {
                FencedCas::Fenced
            })
        })
    }

    /// Nothing to do: each write committed (durably, with the default
    /// `synchronous_commit`) before it returned.
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn check(&self) -> Result<(), StoreError> {
        self.pool.call(true, |s| {
            let (c, st) = s.prepared("SELECT 1")?;
            c.query_one(&st, &[])?;
            Ok(())
        })
    }

    fn schema_version(&self) -> Result<Option<u32>, StoreError> {
        let Some(raw) = self.tree(META_TREE).get(SCHEMA_KEY)? else {
            return Ok(None);
        };
        let bytes: [u8; 4] = raw
            .as_slice()
            .try_into()
            .map_err(|_| StoreError::SchemaCorrupt(raw.len()))?;
        Ok(Some(u32::from_be_bytes(bytes)))
    }

    fn set_schema_version(&self, version: u32) -> Result<(), StoreError> {
        self.tree(META_TREE)
            .insert(SCHEMA_KEY, &version.to_be_bytes())
    }
}

struct PgTree {
    pool: Arc<Pool>,
    name: Arc<str>,
}

impl KvTree for PgTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let (tree, key) = (self.name.clone(), key.to_vec());
        self.pool.call(true, move |s| {
            let (c, st) = s.prepared("SELECT value FROM kv WHERE tree = $1 AND key = $2")?;
            match c.query_opt(&st, &[&&*tree, &key])? {
                Some(row) => Ok(Some(row.try_get(0)?)),
                None => Ok(None),
            }
        })
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let (tree, key, value) = (self.name.clone(), key.to_vec(), value.to_vec());
        // Writing the same value twice leaves what once would: safe to retry.
        self.pool.call(true, move |s| {
            let (c, st) = s.prepared(
                "INSERT INTO kv (tree, key, value, gen) VALUES ($1, $2, $3, 1)
                 ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value, gen = kv.gen + 1",
            )?;
            c.execute(&st, &[&&*tree, &key, &value])?;
            Ok(())
        })
    }

    /// One statement per case; under READ COMMITTED a statement that waited
    /// for a concurrent writer re-checks its WHERE against the row that
    /// writer committed, so exactly one of two racing swaps from the same
    /// value wins. Values are compared by their bytes, as sled compares
    /// them, so both backends accept the same swaps.
    fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        let tree = self.name.clone();
        let key = key.to_vec();
        let old = old.map(<[u8]>::to_vec);
        let new = new.map(<[u8]>::to_vec);
        // A swap from "absent to absent" only reads; the others must not be
        // repeated blindly (a retry of a swap that did apply would say it
        // lost, and `update` would then apply its change twice).
        let retry_safe = old.is_none() && new.is_none();
        self.pool.call(retry_safe, move |s| {
            let tree: &str = &tree;
            let rows = match (&old, &new) {
                (None, None) => {
                    let (c, st) = s.prepared("SELECT 1 FROM kv WHERE tree = $1 AND key = $2")?;
                    return Ok(c.query_opt(&st, &[&tree, &key])?.is_none());
                }
                (None, Some(new)) => {
                    let (c, st) = s.prepared(
                        "INSERT INTO kv (tree, key, value, gen) VALUES ($1, $2, $3, 1)
                         ON CONFLICT (tree, key) DO NOTHING",
                    )?;
                    c.execute(&st, &[&tree, &key, new])?
                }
                (Some(old), Some(new)) => {
                    let (c, st) = s.prepared(
                        "UPDATE kv SET value = $4, gen = gen + 1
                         WHERE tree = $1 AND key = $2 AND value = $3",
                    )?;
                    c.execute(&st, &[&tree, &key, old, new])?
                }
                (Some(old), None) => {
                    let (c, st) =
                        s.prepared("DELETE FROM kv WHERE tree = $1 AND key = $2 AND value = $3")?;
                    c.execute(&st, &[&tree, &key, old])?
                }
            };
            Ok(rows == 1)
        })
    }

    fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let (tree, key) = (self.name.clone(), key.to_vec());
        self.pool.call(false, move |s| {
            let (c, st) =
                s.prepared("DELETE FROM kv WHERE tree = $1 AND key = $2 RETURNING value")?;
            match c.query_opt(&st, &[&&*tree, &key])? {
                Some(row) => Ok(Some(row.try_get(0)?)),
                None => Ok(None),
            }
        })
    }

    fn range(&self, r: Range<'_>) -> Result<Vec<Entry>, StoreError> {
        let mut sql = String::from("SELECT key, value FROM kv WHERE tree = $1");
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for (bound, op_in, op_ex) in [(r.lower, ">=", ">"), (r.upper, "<=", "<")] {
            let (op, k) = match bound {
                Bound::Included(k) => (op_in, k),
                Bound::Excluded(k) => (op_ex, k),
                Bound::Unbounded => continue,
            };
            keys.push(k.to_vec());
            sql.push_str(&format!(" AND key {op} ${}", keys.len() + 1));
        }
        sql.push_str(if r.reverse {
            " ORDER BY key DESC"
        } else {
            " ORDER BY key"
        });
        sql.push_str(&format!(" LIMIT ${}", keys.len() + 2));
        let limit = i64::try_from(r.limit).unwrap_or(i64::MAX);
        let tree = self.name.clone();
        self.pool.call(true, move |s| {
            let (c, st) = s.prepared(&sql)?;
            let tree: &str = &tree;
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&tree];
            params.extend(keys.iter().map(|k| k as &(dyn ToSql + Sync)));
            params.push(&limit);
            c.query(&st, &params)?
                .into_iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect()
        })
    }

    fn len(&self) -> Result<usize, StoreError> {
        let tree = self.name.clone();
        let n: i64 = self.pool.call(true, move |s| {
            let (c, st) = s.prepared("SELECT count(*) FROM kv WHERE tree = $1")?;
            Ok(c.query_one(&st, &[&&*tree])?.try_get(0)?)
        })?;
        Ok(n as usize)
    }
}
