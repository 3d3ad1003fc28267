//! The store: one typed tree per record kind and a schema version, over a
//! byte-level key-value backend ([`backend::KvBackend`]): embedded sled
//! under `--data-dir` by default, or PostgreSQL with `--store-url`. Values
//! are JSON so that fields can be added without a migration.

mod backend;
mod pg;
mod reads;
mod sled_backend;
#[cfg(test)]
mod tests;
mod tree;

use std::path::Path;
use std::sync::Arc;

pub use pg::{urgent, PostgresUrl, StoreUrlError, TestDatabase};
pub use reads::{ReadCounts, TreeReads};
pub use tree::Tree;

use backend::{FenceCheck, KvBackend};

use crate::drift::records::{SampleRecord, SketchRecord};
use crate::fleet::assignments::AssignmentSetRecord;
use crate::fleet::deployments::{DeploymentRecord, EventEntry};
use crate::fleet::members::{BootstrapTokenRecord, Member, MemberKind};
use crate::fleet::telemetry::{AssignmentStatusRecord, TelemetryRecord};
use crate::lifecycle::jobs::JobRecord;
use crate::registry::aliases::AliasRecord;
use crate::registry::checkpoints::CheckpointRecord;
use crate::registry::models::{ModelRecord, ModelVersionRecord};

/// The record schema this binary reads and writes. Bump it with a migration
/// in [`Store::open_backend`] when a change is not additive. (PostgreSQL's
/// tables have their own versioned migrations, `store/pg/schema.rs`.)
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the store was written by a newer Edgeloop (schema {found}); this binary knows schema {supported}. \
         Upgrade the binary, or point it at another --data-dir or --store-url"
    )]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("schema version key is corrupt ({0} bytes)")]
    SchemaCorrupt(usize),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    /// PostgreSQL answered with an error, or the connection broke during
    /// the call (then whether a write happened is unknown, and the next
    /// call reconnects).
    #[error("store (PostgreSQL): {0}")]
    Postgres(#[from] ::postgres::Error),
    /// The store cannot be reached: no connection to PostgreSQL could be
    /// made, or its connection threads are gone.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("record {key} in {tree} is corrupt: {source}")]
    Corrupt {
        tree: String,
        key: String,
        source: serde_json::Error,
    },
    /// A batch named one key twice (see [`backend::Swap`]).
    #[error("a batch of writes to {tree} names {key} twice")]
    DuplicateKey { tree: String, key: String },
    #[error("encoding a record for {tree}: {source}")]
    Encode {
        tree: String,
        source: serde_json::Error,
    },
}

/// A background task's fencing token, as its leader writes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The task's lease name (`leader::Task::name`).
    pub task: &'static str,
    pub token: u64,
}

impl Fence {
    /// The value the fence record holds while this token is current.
    fn encoded(self) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(&self.token).map_err(|source| StoreError::Encode {
            tree: "fences".into(),
            source,
        })
    }

    fn check(self, encoded: &[u8]) -> FenceCheck<'_> {
        FenceCheck {
            tree: "fences",
            key: self.task.as_bytes(),
            value: encoded,
        }
    }
}

/// Why [`Store::update_fenced`] wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotWritten<E> {
    /// The update function refused.
    Refused(E),
    /// The fence has moved on: a newer leader holds the task.
    FencedOut(Fence),
}

#[derive(Clone)]
pub struct Store {
    db: Arc<dyn KvBackend>,
    reads: Arc<reads::ReadCounters>,
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
    /// Background tasks' fencing tokens, by task (`leader`): raised before
    /// a new leader acts, checked by its writes.
    pub fences: Tree<u64>,
    /// What every replica of a shared store must agree on, by name
    /// (`leader::check_shared_ca`).
    pub replica_settings: Tree<String>,
    /// Background tasks' leases, by task (`leader`).
    pub leases: Tree<crate::leader::decide::Lease>,
    /// API tokens, by the sha256 of their secret.
    pub api_tokens: Tree<crate::auth::tokens::ApiTokenRecord>,
    /// Console sessions, by the sha256 of their id.
    pub console_sessions: Tree<crate::console::session::SessionRecord>,
    /// The console audit log, by zero-padded sequence (append-only).
    pub audit: Tree<edgeloop_api::access::AuditEntry>,
}

impl Store {
    /// Opens (or creates) the embedded sled store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_backend(Arc::new(sled_backend::SledBackend::open(path)?))
    }

    /// Opens the PostgreSQL store at `url`, migrating its tables first (see
    /// `store/pg/schema.rs`). Blocking, like [`Store::open`].
    pub fn open_postgres(url: &PostgresUrl) -> Result<Self, StoreError> {
        Self::open_backend(Arc::new(pg::PostgresBackend::open(url)?))
    }

    fn open_backend(db: Arc<dyn KvBackend>) -> Result<Self, StoreError> {
        match db.schema_version()? {
            None => db.set_schema_version(SCHEMA_VERSION)?,
            Some(found) if found > SCHEMA_VERSION => {
                return Err(StoreError::SchemaTooNew {
                    found,
                    supported: SCHEMA_VERSION,
                })
            }
            // found < SCHEMA_VERSION: migrations go here when there are any.
            Some(_) => {}
        }
        let db_ref: &dyn KvBackend = &*db;
        let reads = Arc::new(reads::ReadCounters::default());
        Ok(Self {
            devices: Tree::open(db_ref, &reads, "devices")?,
            clusters: Tree::open(db_ref, &reads, "clusters")?,
            tokens: Tree::open(db_ref, &reads, "bootstrap_tokens")?,
            models: Tree::open(db_ref, &reads, "models")?,
            model_versions: Tree::open(db_ref, &reads, "model_versions")?,
            model_aliases: Tree::open(db_ref, &reads, "model_aliases")?,
            assignments: Tree::open(db_ref, &reads, "assignments")?,
            assignment_status: Tree::open(db_ref, &reads, "assignment_status")?,
            telemetry: Tree::open(db_ref, &reads, "telemetry")?,
            sketches: Tree::open(db_ref, &reads, "sketches")?,
            samples: Tree::open(db_ref, &reads, "samples")?,
            sample_index: Tree::open(db_ref, &reads, "sample_index")?,
            sample_counts: Tree::open(db_ref, &reads, "sample_counts")?,
            checkpoints: Tree::open(db_ref, &reads, "checkpoints")?,
            jobs: Tree::open(db_ref, &reads, "jobs")?,
            deployments: Tree::open(db_ref, &reads, "deployments")?,
            deployment_events: Tree::open(db_ref, &reads, "deployment_events")?,
            retraining: Tree::open(db_ref, &reads, "retraining")?,
            pipelines: Tree::open(db_ref, &reads, "pipelines")?,
            pipeline_active: Tree::open(db_ref, &reads, "pipeline_active")?,
            drift_reference: Tree::open(db_ref, &reads, "drift_reference")?,
            triggers: Tree::open(db_ref, &reads, "triggers")?,
            trigger_state: Tree::open(db_ref, &reads, "trigger_state")?,
            benchmarks: Tree::open(db_ref, &reads, "benchmarks")?,
            assigned_history: Tree::open(db_ref, &reads, "assigned_history")?,
            telemetry_epochs: Tree::open(db_ref, &reads, "telemetry_epochs")?,
            agg_marks: Tree::open(db_ref, &reads, "agg_marks")?,
            drift_windows: Tree::open(db_ref, &reads, "drift_windows")?,
            drift_window_devices: Tree::open(db_ref, &reads, "drift_window_devices")?,
            drift_runs: Tree::open(db_ref, &reads, "drift_runs")?,
            drift_fold_points: Tree::open(db_ref, &reads, "drift_fold_points")?,
            label_requests: Tree::open(db_ref, &reads, "label_requests")?,
            label_index: Tree::open(db_ref, &reads, "label_index")?,
            label_hours: Tree::open(db_ref, &reads, "label_hours")?,
            accuracy_index: Tree::open(db_ref, &reads, "accuracy_index")?,
            fleet_events: Tree::open(db_ref, &reads, "fleet_events")?,
            fences: Tree::open(db_ref, &reads, "fences")?,
            replica_settings: Tree::open(db_ref, &reads, "replica_settings")?,
            leases: Tree::open(db_ref, &reads, "leases")?,
            api_tokens: Tree::open(db_ref, &reads, "api_tokens")?,
            console_sessions: Tree::open(db_ref, &reads, "console_sessions")?,
            audit: Tree::open(db_ref, &reads, "audit")?,
            db,
            reads,
        })
    }

    /// `tree.update(key, f)` as a background task's leader holding the
    /// fencing token `fence` (`None`: not a leased task's write, a plain
    /// update): applied only while the task's fence still holds that
    /// token, atomically with the check.
    pub fn update_fenced<V, E>(
        &self,
        tree: &Tree<V>,
        fence: Option<Fence>,
        key: &str,
        f: impl FnMut(Option<V>) -> Result<V, E>,
    ) -> Result<Result<V, NotWritten<E>>, StoreError>
    where
        V: serde::Serialize + serde::de::DeserializeOwned,
    {
        let Some(fence) = fence else {
            return Ok(tree.update(key, f)?.map_err(NotWritten::Refused));
        };
        let value = fence.encoded()?;
        Ok(tree
            .update_fenced(&*self.db, fence.check(&value), key, f)?
            .map_err(|e| e.map_or(NotWritten::FencedOut(fence), NotWritten::Refused)))
    }

    /// [`Store::update_fenced`] of many distinct keys of one tree in a few
    /// backend calls instead of a few per key (see [`Tree::update_many`]):
    /// a rollout wave's assignments. Per key, in `keys`' order.
    #[allow(clippy::type_complexity)]
    pub fn update_many_fenced<V, E>(
        &self,
        tree: &Tree<V>,
        fence: Option<Fence>,
        keys: &[&str],
        f: impl FnMut(&str, Option<V>) -> Result<V, E>,
    ) -> Result<Vec<Result<V, NotWritten<E>>>, StoreError>
    where
        V: serde::Serialize + serde::de::DeserializeOwned,
    {
        let value = fence.map(|f| f.encoded()).transpose()?;
        let check = fence.zip(value.as_deref()).map(|(f, v)| (f, f.check(v)));
        tree.update_many(&*self.db, check, keys, f)
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
    /// sled: a group commit of its log on the blocking pool
    /// (`SledBackend::flush`). PostgreSQL: nothing to do, every write is
    /// its own transaction, durable when it returns (`synchronous_commit`
    /// on); callers keep calling it, so each write path is correct on both.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().await
    }

    /// A number never handed out before by this store, increasing, also
    /// across restarts (sled persists its counter; PostgreSQL: a sequence).
    /// What every tree has read from the backend so far (calls, records,
    /// bytes): diff two snapshots to see what one piece of work read.
    pub fn read_counts(&self) -> ReadCounts {
        self.reads.snapshot()
    }

    /// Appends the backend's statistics (PostgreSQL: how long store calls
    /// waited for a connection and ran, by lane) to `/metrics` text.
    pub fn write_metrics(&self, out: &mut String) {
        self.db.write_metrics(out);
    }

    pub fn next_id(&self) -> Result<u64, StoreError> {
        self.db.next_id()
    }

    /// Cheap liveness probe for `/readyz`.
    pub fn check(&self) -> Result<(), StoreError> {
        self.db.check()
    }

    #[doc(hidden)]
    /// For tests of the schema check: pretend a newer binary wrote this store.
    pub fn force_schema_version(&self, v: u32) -> Result<(), StoreError> {
        self.db.set_schema_version(v)
    }
}
