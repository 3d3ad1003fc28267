//! The embedded store: sled, with one typed tree per record kind and a schema
//! version. Values are JSON so that fields can be added without a migration.

mod tree;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use tree::Tree;

use crate::drift::records::{SampleRecord, SketchRecord};
use crate::fleet::assignments::AssignmentSetRecord;
use crate::fleet::deployments::{DeploymentRecord, EventEntry};
use crate::fleet::members::{BootstrapTokenRecord, Member, MemberKind};
use crate::fleet::telemetry::{AssignmentStatusRecord, TelemetryRecord};
use crate::lifecycle::jobs::JobRecord;
use crate::registry::aliases::AliasRecord;
use crate::registry::checkpoints::CheckpointRecord;
use crate::registry::models::{ModelRecord, ModelVersionRecord};

/// The schema this binary reads and writes. Bump it with a migration in
/// [`Store::open`] when a change is not additive.
pub const SCHEMA_VERSION: u32 = 1;
const SCHEMA_KEY: &[u8] = b"schema_version";
/// sled's page cache. Records are small JSON; the hot set (members,
/// assignments, statuses of 10 000 devices) is a few tens of MiB.
const STORE_CACHE_BYTES: u64 = 128 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the data dir was written by a newer Edgeloop (schema {found}); this binary knows schema {supported}. \
         Upgrade the binary, or point it at another --data-dir"
    )]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("schema version key is corrupt ({0} bytes)")]
    SchemaCorrupt(usize),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error("record {key} in {tree} is corrupt: {source}")]
    Corrupt {
        tree: String,
        key: String,
        source: serde_json::Error,
    },
    #[error("encoding a record for {tree}: {source}")]
    Encode {
        tree: String,
        source: serde_json::Error,
    },
}

/// Group commit: callers that ask for a flush while one runs share the
/// next one, so a burst of N acknowledged writes costs a few fsyncs, not
/// N flushes on N blocking threads.
#[derive(Default)]
struct Flusher {
    /// Flush requests so far; a request's number is taken after its write.
    requested: AtomicU64,
    /// Every request numbered up to this is durable.
    completed: AtomicU64,
    /// One flush at a time.
    running: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    flusher: Arc<Flusher>,
    pub devices: Tree<Member>,
    pub clusters: Tree<Member>,
    pub tokens: Tree<BootstrapTokenRecord>,
    pub models: Tree<ModelRecord>,
    pub model_versions: Tree<ModelVersionRecord>,
    /// Each model's aliases with their history, by `<model>/<alias>`.
    pub model_aliases: Tree<AliasRecord>,
    pub assignments: Tree<AssignmentSetRecord>,
    pub assignment_status: Tree<AssignmentStatusRecord>,
    pub telemetry: Tree<TelemetryRecord>,
    /// Drift sketches, by model/version/device/sequence.
    pub sketches: Tree<SketchRecord>,
    /// Hard examples and labelled feedback, keyed like sketches.
    pub samples: Tree<SampleRecord>,
    /// The samples by when they were observed, per model (retention).
    pub sample_index: Tree<String>,
    /// Each model's stored and dropped sample counts (retention).
    pub sample_counts: Tree<crate::drift::retention::SampleCounts>,
    pub checkpoints: Tree<CheckpointRecord>,
    pub jobs: Tree<JobRecord>,
    /// Rollouts, by id (`d-<seq>`, so key order is creation order).
    pub deployments: Tree<DeploymentRecord>,
    /// Each deployment's event log, by `<id>/<n>`.
    pub deployment_events: Tree<EventEntry>,
    /// Each model's retraining policy, by model.
    pub retraining: Tree<crate::lifecycle::retrain::RetrainingConfig>,
    /// Retraining pipelines, by id (`p-<seq>`).
    pub pipelines: Tree<crate::lifecycle::pipeline::Pipeline>,
    /// The pipeline that holds each model's one retraining slot, by model.
    pub pipeline_active: Tree<String>,
    /// Each model's retraining triggers, by model.
    pub triggers: Tree<crate::lifecycle::triggers::config::TriggersConfig>,
    /// What the trigger task last saw and decided, by model.
    pub trigger_state: Tree<crate::lifecycle::triggers::runner::TriggerStateRecord>,
    /// Device benchmarks, by id (`b-<seq>`, so key order is creation order).
    pub benchmarks: Tree<crate::fleet::benchmarks::BenchmarkRecord>,
    /// What each model's drift is measured against, by model.
    pub drift_reference: Tree<crate::lifecycle::retrain::ReferenceRecord>,
    /// Every (model, version) each device was ever assigned, by
    /// `<device>/<model>/<version>`: what its reports may name.
    pub assigned_history: Tree<()>,
    /// Where each agent telemetry epoch's sequences start in its device's
    /// one sequence space, by `<device>/<epoch as 16 hex>`
    /// (`fleet::telemetry`).
    pub telemetry_epochs: Tree<u64>,
    /// Which drift aggregates this process keeps, and in which format
    /// (`drift::aggregates`): a stale mark means rebuild from the raw records.
    pub agg_marks: Tree<crate::drift::aggregates::AggMark>,
    /// Each drift window's sum of sketches over all devices, by
    /// `<model>/<version>/<window seconds>/<start>`.
    pub drift_windows: Tree<crate::drift::analysis::WindowSum>,
    /// The same per device: `<model>/<version>/<window seconds>/<start>/<device>`.
    pub drift_window_devices: Tree<crate::drift::analysis::WindowSum>,
    /// The trigger tick's drift fold over each version's closed windows,
    /// by `<model>/<version>/<window seconds>`.
    pub drift_runs: Tree<crate::drift::aggregates::run::RunCache>,
    /// The fold's hysteresis state after each closed window, keyed like
    /// `drift_windows`.
    pub drift_fold_points: Tree<crate::drift::aggregates::run::FoldPoint>,
    /// The labelled samples of each request, by `<model>/<device>/<request id>`.
    pub label_requests: Tree<Vec<crate::drift::aggregates::labelled::LabelledSample>>,
    /// The counted labels by time, `<model>/<time>/<sample key>`.
    pub label_index: Tree<()>,
    /// Counted labels per hour, by `<model>/<hour>`.
    pub label_hours: Tree<u64>,
    /// Whether each counted prediction was right, by
    /// `<model>/<version>/<time>/<sample key>`.
    pub accuracy_index: Tree<bool>,
    /// Fleet events for the other replicas, by store sequence
    /// (`fleet::relay`).
    pub fleet_events: Tree<crate::fleet::relay::Relayed>,
    /// Background tasks' leases, by task (`leader`).
    pub leases: Tree<crate::leader::decide::Lease>,
    /// API tokens, by the sha256 of their secret.
    pub api_tokens: Tree<crate::auth::tokens::ApiTokenRecord>,
    /// The console audit log, by zero-padded sequence (append-only).
    pub audit: Tree<edgeloop_api::access::AuditEntry>,
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = edgeloop_client_core::sled_open::open_waiting_for_lock(
            &sled::Config::new()
                .path(path)
                // sled's default page cache is 1 GiB, which alone would
                // spend the control plane's memory budget at fleet scale.
                .cache_capacity(STORE_CACHE_BYTES),
        )?;
        match db.get(SCHEMA_KEY)? {
            None => {
                db.insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes())?;
                db.flush()?;
            }
            Some(raw) => {
                let bytes: [u8; 4] = raw
                    .as_ref()
                    .try_into()
                    .map_err(|_| StoreError::SchemaCorrupt(raw.len()))?;
                let found = u32::from_be_bytes(bytes);
                if found > SCHEMA_VERSION {
                    return Err(StoreError::SchemaTooNew {
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                // found < SCHEMA_VERSION: migrations go here when there are any.
            }
        }
        Ok(Self {
            devices: Tree::open(&db, "devices")?,
            clusters: Tree::open(&db, "clusters")?,
            tokens: Tree::open(&db, "bootstrap_tokens")?,
            models: Tree::open(&db, "models")?,
            model_versions: Tree::open(&db, "model_versions")?,
            model_aliases: Tree::open(&db, "model_aliases")?,
            assignments: Tree::open(&db, "assignments")?,
            assignment_status: Tree::open(&db, "assignment_status")?,
            telemetry: Tree::open(&db, "telemetry")?,
            sketches: Tree::open(&db, "sketches")?,
            samples: Tree::open(&db, "samples")?,
            sample_index: Tree::open(&db, "sample_index")?,
            sample_counts: Tree::open(&db, "sample_counts")?,
            checkpoints: Tree::open(&db, "checkpoints")?,
            jobs: Tree::open(&db, "jobs")?,
            deployments: Tree::open(&db, "deployments")?,
            deployment_events: Tree::open(&db, "deployment_events")?,
            retraining: Tree::open(&db, "retraining")?,
            pipelines: Tree::open(&db, "pipelines")?,
            pipeline_active: Tree::open(&db, "pipeline_active")?,
            drift_reference: Tree::open(&db, "drift_reference")?,
            triggers: Tree::open(&db, "triggers")?,
            trigger_state: Tree::open(&db, "trigger_state")?,
            benchmarks: Tree::open(&db, "benchmarks")?,
            assigned_history: Tree::open(&db, "assigned_history")?,
            telemetry_epochs: Tree::open(&db, "telemetry_epochs")?,
            agg_marks: Tree::open(&db, "agg_marks")?,
            drift_windows: Tree::open(&db, "drift_windows")?,
            drift_window_devices: Tree::open(&db, "drift_window_devices")?,
            drift_runs: Tree::open(&db, "drift_runs")?,
            drift_fold_points: Tree::open(&db, "drift_fold_points")?,
            label_requests: Tree::open(&db, "label_requests")?,
            label_index: Tree::open(&db, "label_index")?,
            label_hours: Tree::open(&db, "label_hours")?,
            accuracy_index: Tree::open(&db, "accuracy_index")?,
            fleet_events: Tree::open(&db, "fleet_events")?,
            leases: Tree::open(&db, "leases")?,
            api_tokens: Tree::open(&db, "api_tokens")?,
            audit: Tree::open(&db, "audit")?,
            db,
            flusher: Arc::default(),
        })
    }

    pub fn members(&self, kind: MemberKind) -> &Tree<Member> {
        match kind {
            MemberKind::Device => &self.devices,
            MemberKind::Cluster => &self.clusters,
        }
    }

    /// Makes every write so far durable. Called before acknowledging a write
    /// that the caller must not lose (a token, an enrollment, a record).
    ///
    /// sled 0.34's `flush_async` can leave concurrent callers waiting forever
    /// (spacejam/sled#1308; seen here with 1 000 devices reporting at once),
    /// so the blocking flush runs on the blocking pool, and concurrent
    /// callers share flushes ([`Flusher`]).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let f = &self.flusher;
        let mine = f.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let _turn = f.running.lock().await;
        if f.completed.load(Ordering::SeqCst) >= mine {
            // A flush that began after this request covered it.
            return Ok(());
        }
        // Every request numbered up to `covers` wrote before this point.
        let covers = f.requested.load(Ordering::SeqCst);
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| StoreError::Sled(sled::Error::Io(std::io::Error::other(e))))??;
        f.completed.fetch_max(covers, Ordering::SeqCst);
        Ok(())
    }

    /// A number never handed out before by this store, increasing, also
    /// across restarts (sled persists the counter).
    pub fn next_id(&self) -> Result<u64, StoreError> {
        Ok(self.db.generate_id()?)
    }

    /// Cheap liveness probe for `/readyz`.
    pub fn check(&self) -> Result<(), StoreError> {
        self.db.get(SCHEMA_KEY)?;
        Ok(())
    }

    #[doc(hidden)]
    /// For tests of the schema check: pretend a newer binary wrote this store.
    pub fn force_schema_version(&self, v: u32) -> Result<(), StoreError> {
        self.db.insert(SCHEMA_KEY, &v.to_be_bytes())?;
        self.db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens `path` again once the last handle's background threads have
    /// let go of sled's file lock: they outlive the drop by a moment, and
    /// an open in that moment fails with "could not acquire lock".
    fn reopen(path: &Path) -> Result<Store, StoreError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match Store::open(path) {
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    #[test]
    fn pages_start_after_the_cursor_stay_in_the_prefix_and_stop_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let t = &store.pipeline_active;
        for k in ["a/1", "a/2", "a/3", "a/4", "b/1", "a0"] {
            t.insert(k, &k.to_string()).unwrap();
        }
        let keys = |page: Vec<(String, String)>| -> Vec<String> {
            page.into_iter().map(|(k, _)| k).collect()
        };
        let all = |_: &str, _: &String| true;
        assert_eq!(
            keys(t.page_after("a/", None, 2, all).unwrap()),
            ["a/1", "a/2"]
        );
        assert_eq!(
            keys(t.page_after("a/", Some("a/2"), 10, all).unwrap()),
            ["a/3", "a/4"],
            "from the cursor, and not past the prefix"
        );
        assert!(t.page_after("a/", Some("a/4"), 10, all).unwrap().is_empty());
        // A cursor before the prefix starts at it; the filter does not
        // count toward the limit.
        let odd = |k: &str, _: &String| k.ends_with('1') || k.ends_with('3');
        assert_eq!(
            keys(t.page_after("a/", Some("0"), 2, odd).unwrap()),
            ["a/1", "a/3"]
        );
    }

    #[test]
    fn pages_before_the_cursor_go_newest_first_and_stay_in_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let t = &store.pipeline_active;
        for k in ["a/1", "a/2", "a/3", "a/4", "b/1", "a0", "0"] {
            t.insert(k, &k.to_string()).unwrap();
        }
        let keys = |page: Vec<(String, String)>| -> Vec<String> {
            page.into_iter().map(|(k, _)| k).collect()
        };
        let all = |_: &str, _: &String| true;
        assert_eq!(
            keys(t.page_before("a/", None, 2, all).unwrap()),
            ["a/4", "a/3"]
        );
        assert_eq!(
            keys(t.page_before("a/", Some("a/3"), 10, all).unwrap()),
            ["a/2", "a/1"],
            "below the cursor, and not past the prefix's start"
        );
        assert!(t
            .page_before("a/", Some("a/1"), 10, all)
            .unwrap()
            .is_empty());
        // A cursor past the prefix starts at its end, one before it gives
        // nothing; the filter does not count toward the limit.
        let odd = |k: &str, _: &String| k.ends_with('1') || k.ends_with('3');
        assert_eq!(
            keys(t.page_before("a/", Some("z"), 2, odd).unwrap()),
            ["a/3", "a/1"]
        );
        assert!(t.page_before("a/", Some("0"), 10, all).unwrap().is_empty());
        assert_eq!(
            keys(t.page_before("", None, 3, all).unwrap()),
            ["b/1", "a0", "a/4"],
            "the empty prefix is every key"
        );
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let store = Store::open(&path).unwrap();
            store.force_schema_version(SCHEMA_VERSION + 1).unwrap();
        }
        let err = reopen(&path).err().unwrap();
        assert!(
            matches!(err, StoreError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
            "{err:?}"
        );
        assert!(err.to_string().contains("newer Edgeloop"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_concurrent_flushes_all_complete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let mut tasks = Vec::new();
        for i in 0u32..500 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store.db.insert(i.to_be_bytes(), &[1]).unwrap();
                store.flush().await.unwrap();
            }));
        }
        let all = futures::future::join_all(tasks);
        tokio::time::timeout(std::time::Duration::from_secs(60), all)
            .await
            .expect("every flush completes");
    }

    #[test]
    fn reopen_keeps_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        drop(Store::open(&path).unwrap());
        reopen(&path).unwrap();
    }
}
