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

use super::backend::{distinct_keys, Entry, FenceCheck, FencedCas, KvBackend, KvTree, Range, Swap};
use super::StoreError;
use pool::Pool;

pub use pool::urgent;
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

    /// One transaction of at most six statements, whatever the batch's
    /// size: the fence's row read `FOR SHARE` (so a change of the fence
    /// waits for this commit, as in `compare_and_swap_fenced`), the batch's
    /// existing rows locked in key order (so two batches over the same keys
    /// queue instead of deadlocking, as a join's order would let them), then
    /// one set-based statement per kind of swap over `unnest`ed arrays. Each
    /// statement returns the keys it applied to; the rest found another
    /// value. Not retried after a lost connection: whether it committed is
    /// unknown, and a blind retry would report its own swaps as lost.
    fn compare_and_swap_many(
        &self,
        tree: &str,
        swaps: &[Swap<'_>],
        fence: Option<FenceCheck<'_>>,
    ) -> Result<Vec<FencedCas>, StoreError> {
        distinct_keys(tree, swaps)?;
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        let batch = Batch::of(swaps);
        let tree = tree.to_string();
        let fence = fence.map(|f| (f.tree.to_string(), f.key.to_vec(), f.value.to_vec()));
        let n = swaps.len();
        let applied: Option<std::collections::HashSet<Vec<u8>>> =
            self.pool.call(false, move |s| {
                const FENCE: &str =
                    "SELECT 1 FROM kv WHERE tree = $1 AND key = $2 AND value = $3 FOR SHARE";
                const UPDATE: &str = "UPDATE kv SET value = u.new, gen = kv.gen + 1 \
                 FROM unnest($2::bytea[], $3::bytea[], $4::bytea[]) AS u(key, old, new) \
                 WHERE kv.tree = $1 AND kv.key = u.key AND kv.value = u.old RETURNING kv.key";
                const INSERT: &str = "INSERT INTO kv (tree, key, value, gen) \
                 SELECT $1, u.key, u.new, 1 FROM unnest($2::bytea[], $3::bytea[]) AS u(key, new) \
                 ON CONFLICT (tree, key) DO NOTHING RETURNING key";
                const DELETE: &str =
                    "DELETE FROM kv USING unnest($2::bytea[], $3::bytea[]) AS u(key, old) \
                 WHERE kv.tree = $1 AND kv.key = u.key AND kv.value = u.old RETURNING kv.key";
                const ABSENT: &str = "SELECT key FROM kv WHERE tree = $1 AND key = ANY($2)";
                const LOCK: &str = "SELECT 1 FROM kv WHERE tree = $1 AND key = ANY($2) \
                 ORDER BY key FOR UPDATE";
                // Prepared (and cached) before the transaction borrows the client.
                let statements = [FENCE, UPDATE, INSERT, DELETE, ABSENT, LOCK]
                    .map(|sql| s.prepared(sql).map(|(_, st)| st));
                let [fence_st, update_st, insert_st, delete_st, absent_st, lock_st] = statements;
                let (fence_st, update_st, insert_st, delete_st, absent_st, lock_st) = (
                    fence_st?, update_st?, insert_st?, delete_st?, absent_st?, lock_st?,
                );
                let mut tx = s.client()?.transaction()?;
                if let Some((ftree, fkey, fvalue)) = &fence {
                    if tx
                        .query_opt(&fence_st, &[&&ftree[..], fkey, fvalue])?
                        .is_none()
                    {
                        return Ok(None);
                    }
                }
                let tree: &str = &tree;
                if !batch.written.is_empty() {
                    tx.query(&lock_st, &[&tree, &batch.written])?;
                }
                let mut applied = std::collections::HashSet::new();
                let mut keys_of = |rows: Vec<postgres::Row>| -> Result<(), StoreError> {
                    for row in rows {
                        applied.insert(row.try_get::<_, Vec<u8>>(0)?);
                    }
                    Ok(())
                };
                if !batch.update.0.is_empty() {
                    let (k, o, n) = &batch.update;
                    keys_of(tx.query(&update_st, &[&tree, k, o, n])?)?;
                }
                if !batch.insert.0.is_empty() {
                    let (k, n) = &batch.insert;
                    keys_of(tx.query(&insert_st, &[&tree, k, n])?)?;
                }
                if !batch.delete.0.is_empty() {
                    let (k, o) = &batch.delete;
                    keys_of(tx.query(&delete_st, &[&tree, k, o])?)?;
                }
                if !batch.absent.is_empty() {
                    // "Absent to absent" applies where the key is absent.
                    let present: std::collections::HashSet<Vec<u8>> = tx
                        .query(&absent_st, &[&tree, &batch.absent])?
                        .into_iter()
                        .map(|r| r.try_get(0))
                        .collect::<Result<_, _>>()?;
                    applied.extend(
                        batch
                            .absent
                            .iter()
                            .filter(|k| !present.contains(*k))
                            .cloned(),
                    );
                }
                tx.commit()?;
                Ok(Some(applied))
            })?;
        Ok(match applied {
            None => vec![FencedCas::Fenced; n],
            Some(applied) => swaps
                .iter()
                .map(|s| {
                    if applied.contains(s.key) {
                        FencedCas::Swapped
                    } else {
                        FencedCas::Changed
                    }
                })
                .collect(),
        })
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

    fn write_metrics(&self, out: &mut String) {
        self.pool.stats().write(out);
    }
}

/// One column of a batch: the `bytea[]` a statement `unnest`s.
type Column = Vec<Vec<u8>>;

/// A batch of swaps as columns, one set per kind of swap.
#[derive(Default)]
struct Batch {
    /// Keys, old values, new values.
    update: (Column, Column, Column),
    /// Keys, new values.
    insert: (Column, Column),
    /// Keys, old values.
    delete: (Column, Column),
    /// Keys that must be absent.
    absent: Column,
    /// Keys of the updates, inserts and deletes, whose rows are locked first.
    written: Column,
}

impl Batch {
    /// Columns in key order, so two batches' inserts of the same new keys
    /// also meet in one order.
    fn of(swaps: &[Swap<'_>]) -> Batch {
        let mut b = Batch::default();
        let mut sorted: Vec<&Swap<'_>> = swaps.iter().collect();
        sorted.sort_by_key(|s| s.key);
        for s in sorted {
            let key = s.key.to_vec();
            if s.old.is_some() || s.new.is_some() {
                b.written.push(key.clone());
            }
            match (s.old, s.new) {
                (Some(old), Some(new)) => {
                    b.update.0.push(key);
                    b.update.1.push(old.to_vec());
                    b.update.2.push(new.to_vec());
                }
                (None, Some(new)) => {
                    b.insert.0.push(key);
                    b.insert.1.push(new.to_vec());
                }
                (Some(old), None) => {
                    b.delete.0.push(key);
                    b.delete.1.push(old.to_vec());
                }
                (None, None) => b.absent.push(key),
            }
        }
        b
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

    /// One statement for the whole list.
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let tree = self.name.clone();
        let wanted: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        let found: std::collections::HashMap<Vec<u8>, Vec<u8>> =
            self.pool.call(true, move |s| {
                let (c, st) =
                    s.prepared("SELECT key, value FROM kv WHERE tree = $1 AND key = ANY($2)")?;
                c.query(&st, &[&&*tree, &wanted])?
                    .into_iter()
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                    .collect()
            })?;
        Ok(keys.iter().map(|k| found.get(*k).cloned()).collect())
    }

    /// One statement for the whole list (an upsert, as `insert`).
    fn insert_many(&self, entries: &[(&[u8], &[u8])]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let tree = self.name.clone();
        // A key twice in one upsert is an error in PostgreSQL; the last
        // value wins, as it would insert by insert.
        let last: std::collections::HashMap<&[u8], &[u8]> = entries.iter().copied().collect();
        let (keys, values): (Vec<Vec<u8>>, Vec<Vec<u8>>) = last
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .unzip();
        self.pool.call(true, move |s| {
            let (c, st) = s.prepared(
                "INSERT INTO kv (tree, key, value, gen) \
                 SELECT $1, u.key, u.value, 1 FROM unnest($2::bytea[], $3::bytea[]) AS u(key, value) \
                 ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value, gen = kv.gen + 1",
            )?;
            c.execute(&st, &[&&*tree, &keys, &values])?;
            Ok(())
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

    /// One statement. Retried after a lost connection (removing twice
    /// leaves what once would), so the count may then miss the keys the
    /// lost try removed.
    fn remove_many(&self, keys: &[&[u8]]) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let tree = self.name.clone();
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        self.pool.call(true, move |s| {
            let (c, st) = s.prepared("DELETE FROM kv WHERE tree = $1 AND key = ANY($2)")?;
            Ok(c.execute(&st, &[&&*tree, &keys])?)
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
