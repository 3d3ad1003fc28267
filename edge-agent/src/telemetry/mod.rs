//! Telemetry: drift sketches per model version and window, feedback labels
//! matched to earlier predictions, sampled hard examples, and a
//! store-and-forward buffer that survives days offline and agent restarts.
//!
//! [`Telemetry`] is the [`Observer`] the serving path calls once per
//! request: it only updates in-memory accumulators (histograms computed
//! before a short per-model lock). Everything that touches the disk or the
//! network happens in [`run`] (window closing, then sending) or in the
//! feedback handler ([`feedback_router`]).

mod buffer;
pub mod feedback;
mod http;
pub mod samples;
pub mod sketch;
mod uploader;
pub mod window;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use edgeloop_models::manifest::Manifest;
use edgeloop_proto::agent::v1 as pb;
use rand::Rng as _;

pub use buffer::{BufferStats, Limits};
pub use http::{feedback_router, FeedbackLabel, FeedbackReply, FeedbackRequest};
pub use uploader::run;

use crate::config::TelemetryConfig;
use crate::observe::{Observation, Observer};
use feedback::{Accuracy, Labelled, Predicted, PredictionKey, PredictionMap};
use sketch::{classifier_output, predictions, Prediction};
use window::{feature_delta, feature_refs, FeatureRef, ModelWindow};

/// Everything telemetry can be tuned by. [`TelemetryOptions::new`] takes the
/// interval and buffer cap from the agent's config; the rest are defaults
/// sized for a small device.
#[derive(Debug, Clone)]
pub struct TelemetryOptions {
    /// One window, and how often a batch is created.
    pub interval: Duration,
    /// Batches kept unsent; past it the oldest are dropped and counted.
    pub max_batches: u64,
    /// Predictions remembered for feedback (0 turns feedback matching off).
    pub feedback_capacity: usize,
    /// Bytes of request inputs remembered for labelled uploads (the newest
    /// predictions keep theirs; 0 uploads labels without inputs).
    pub feedback_input_bytes: usize,
    /// Labelled predictions the rolling accuracy covers, per model.
    pub accuracy_window: usize,
    /// Rows with a top-class probability below this are hard examples.
    pub hard_threshold: f64,
    /// Hard examples sampled per model version and window (a reservoir, so
    /// a uniform sample of that window's low-confidence rows).
    pub hard_per_window: usize,
    /// A row whose inputs are larger than this is never kept as a sample.
    pub max_sample_bytes: usize,
    /// Samples (hard examples, labelled feedback) kept unsent, by count and
    /// bytes; past either the oldest are dropped and counted.
    pub max_samples: u64,
    pub max_samples_bytes: u64,
    /// Samples per uploaded batch, by count and bytes.
    pub samples_per_batch: usize,
    pub sample_bytes_per_batch: usize,
}

impl TelemetryOptions {
    pub fn new(config: &TelemetryConfig) -> TelemetryOptions {
        TelemetryOptions {
            interval: config.interval,
            max_batches: config.max_batches,
            feedback_capacity: 100_000,
            feedback_input_bytes: 32 << 20,
            accuracy_window: 1000,
            hard_threshold: 0.6,
            hard_per_window: 16,
            max_sample_bytes: 1 << 20,
            max_samples: 10_000,
            max_samples_bytes: 64 << 20,
            samples_per_batch: 64,
            sample_bytes_per_batch: 4 << 20,
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_batches: self.max_batches.max(1),
            max_samples: self.max_samples,
            max_sample_bytes: self.max_samples_bytes,
            samples_per_batch: self.samples_per_batch,
            sample_bytes_per_batch: self.sample_bytes_per_batch,
        }
    }
}

/// Why feedback was refused.
#[derive(Debug, thiserror::Error)]
pub enum FeedbackError {
    #[error("model {0:?} is not served here")]
    UnknownModel(String),
    #[error("storing feedback: {0:#}")]
    Storage(anyhow::Error),
}

type Nested<V> = HashMap<String, HashMap<String, V>>;

/// What a version's manifest says telemetry should compare against.
struct VersionRefs {
    features: Arc<[FeatureRef]>,
    /// Read class predictions from its outputs: the manifest's gate task is
    /// classification (or predates tasks). A detector's or a VAD's first
    /// float output is not a class score, and drift and online accuracy
    /// must not pretend it is.
    classifier: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct FeedbackState {
    predictions: PredictionMap,
    accuracy: HashMap<String, Accuracy>,
}

pub struct Telemetry {
    options: TelemetryOptions,
    /// Reference features per (model, version), set when a version activates.
    references: RwLock<Nested<Arc<VersionRefs>>>,
    /// Models that have served here, for the feedback API's 404.
    known: RwLock<HashSet<String>>,
    /// The open window, per (model, version). The map lock is taken for
    /// writing only for a version's first request in a window and to close.
    windows: RwLock<Nested<Arc<Mutex<ModelWindow>>>>,
    window_start: Mutex<SystemTime>,
    feedback: Mutex<FeedbackState>,
    buffer: buffer::Buffer,
    /// Wakes the sender when a batch is created.
    wake: tokio::sync::Notify,
    /// Times a buffer that could not be opened was moved aside.
    store_resets: u64,
}

/// How many times the buffer was moved aside, in the data dir.
const RESETS_FILE: &str = "telemetry-resets";

fn open_buffer(dir: &Path, options: &TelemetryOptions) -> anyhow::Result<buffer::Buffer> {
    // Samples hold request inputs: private, like the identity beside them.
    edgeloop_client_core::member::create_private_dir(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    buffer::Buffer::open(dir, options.limits())
}

fn read_resets(data_dir: &Path) -> u64 {
    std::fs::read_to_string(data_dir.join(RESETS_FILE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Renames `dir` to `telemetry.corrupt-<unix time>` beside it, after
/// removing older such copies: one is enough to look at, and a disk that
/// keeps corrupting must not fill up with them.
fn move_aside(data_dir: &Path, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    for entry in std::fs::read_dir(data_dir)
        .with_context(|| format!("reading {}", data_dir.display()))?
        .flatten()
    {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("telemetry.corrupt-")
        {
            let p = entry.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
    let at = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = data_dir.join(format!("telemetry.corrupt-{at}"));
    if dir.exists() {
        std::fs::rename(dir, &aside).with_context(|| format!("moving {} aside", dir.display()))?;
        edgeloop_models::fs::sync_dir(data_dir)
            .with_context(|| format!("syncing {}", data_dir.display()))?;
    }
    Ok(aside)
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Opens (or creates) the buffer in `<data_dir>/telemetry`. A buffer
    /// that cannot be opened (corrupt, say) is moved aside to
    /// `telemetry.corrupt-<unix time>` (only the newest such copy is kept),
    /// counted in `<data_dir>/telemetry-resets`, and replaced by a new one
    /// under a new epoch: its unsent reports are lost, but the device goes
    /// on serving. A buffer another live process holds is an error.
    pub fn open(data_dir: &Path, options: TelemetryOptions) -> anyhow::Result<Arc<Telemetry>> {
        let dir = data_dir.join("telemetry");
        let (buffer, store_resets) = match open_buffer(&dir, &options) {
            Ok(b) => (b, read_resets(data_dir)),
            Err(e) if edgeloop_client_core::sled_open::is_lock_held(&e) => return Err(e),
            Err(e) => {
                let resets = read_resets(data_dir) + 1;
                let aside = move_aside(data_dir, &dir)?;
                tracing::error!(error = %format!("{e:#}"), aside = %aside.display(), resets,
                    "the telemetry buffer cannot be opened: moved it aside and started a new \
                     one (its unsent reports are lost; serving goes on)");
                edgeloop_models::fs::write_atomic(
                    &data_dir.join(RESETS_FILE),
                    format!("{resets}\n").as_bytes(),
                    0o600,
                )
                .context("counting the telemetry buffer reset")?;
                let fresh = open_buffer(&dir, &options)
                    .context("opening a new telemetry buffer after moving the old one aside")?;
                (fresh, resets)
            }
        };
        Ok(Arc::new(Telemetry {
            store_resets,
            feedback: Mutex::new(FeedbackState {
                predictions: PredictionMap::new(
                    options.feedback_capacity,
                    options.feedback_input_bytes,
                ),
                accuracy: HashMap::new(),
            }),
            options,
            references: RwLock::default(),
            known: RwLock::default(),
            windows: RwLock::default(),
            window_start: Mutex::new(SystemTime::now()),
            buffer,
            wake: tokio::sync::Notify::new(),
        }))
    }

    pub fn options(&self) -> &TelemetryOptions {
        &self.options
    }

    /// What the buffer holds.
    pub fn stats(&self) -> anyhow::Result<BufferStats> {
        self.buffer.stats()
    }

    /// The sequences of the batches not yet acknowledged, oldest first.
    pub fn pending(&self) -> anyhow::Result<Vec<u64>> {
        self.buffer.pending()
    }

    fn note_model(&self, model: &str) {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        if known.contains(model) {
            return;
        }
        drop(known);
        self.known
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(model.to_string());
    }

    fn refs(&self, model: &str, version: &str) -> Arc<VersionRefs> {
        self.references
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(model)
            .and_then(|v| v.get(version))
            .cloned()
            .unwrap_or_else(|| {
                Arc::new(VersionRefs {
                    features: Arc::from([]),
                    classifier: true,
                })
            })
    }

    /// The open window's cell for a version, created on first use.
    fn cell(&self, model: &str, version: &str, refs: &[FeatureRef]) -> Arc<Mutex<ModelWindow>> {
        if let Some(cell) = self
            .windows
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(model)
            .and_then(|v| v.get(version))
        {
            return cell.clone();
        }
        self.windows
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(model.to_string())
            .or_default()
            .entry(version.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(ModelWindow::new(
                    refs,
                    self.options.hard_per_window,
                )))
            })
            .clone()
    }

    /// Closes the open window: its sketches, and the hard examples it
    /// sampled, become a batch persisted under the next sequence. Returns
    /// that sequence, or `None` when there was nothing to send. Blocking
    /// (disk I/O): call it off the async workers.
    pub fn close_window(&self) -> anyhow::Result<Option<u64>> {
        let end = SystemTime::now();
        let start = std::mem::replace(&mut *lock(&self.window_start), end);
        let cells =
            std::mem::take(&mut *self.windows.write().unwrap_or_else(PoisonError::into_inner));
        let mut sketches = vec![];
        let mut hard = vec![];
        for (model, versions) in cells {
            for (version, cell) in versions {
                let mut w = lock(&cell);
                w.closed = true;
                if w.requests > 0 {
                    sketches.push(w.to_sketch(&model, &version, start, end));
                }
                hard.extend(w.hard.take());
            }
        }
        sketches.sort_by(|a, b| {
            (&a.model_name, &a.model_version).cmp(&(&b.model_name, &b.model_version))
        });
        self.buffer.add_samples(hard)?;
        let stats = self.buffer.stats()?;
        // An idle window creates a batch only to carry queued samples or
        // drop counts that no pending batch will carry.
        let carry = stats.batches == 0
            && (stats.samples > 0
                || stats.unreported_dropped_batches > 0
                || stats.unreported_dropped_samples > 0);
        if sketches.is_empty() && !carry {
            return Ok(None);
        }
        let report = pb::TelemetryReport {
            recorded_at: Some(end.into()),
            window_start: Some(start.into()),
            window_end: Some(end.into()),
            models: sketches
                .iter()
                .map(|s| pb::ModelMetrics {
                    model_name: s.model_name.clone(),
                    model_version: s.model_version.clone(),
                    requests: s.requests,
                    errors: s.errors,
                    latency_p50_ms: s.latency_p50_ms,
                    latency_p99_ms: s.latency_p99_ms,
                    execution_provider: String::new(),
                })
                .collect(),
            sketches,
            ..Default::default()
        };
        let seq = self.buffer.push(report)?;
        self.wake.notify_one();
        Ok(Some(seq))
    }

    /// Whether `model` has served here (feedback for it can match).
    pub fn knows_model(&self, model: &str) -> bool {
        self.known
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(model)
    }

    /// Matches labels to `model`'s earlier predictions. Blocking (the
    /// labelled samples are queued on disk).
    pub fn feedback(
        &self,
        model: &str,
        labels: &[FeedbackLabel],
    ) -> Result<FeedbackReply, FeedbackError> {
        if !self
            .known
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(model)
        {
            return Err(FeedbackError::UnknownModel(model.to_string()));
        }
        let mut matched = 0;
        let mut unknown_ids = vec![];
        let mut first = vec![];
        let (rolling_accuracy, window) = {
            let mut state = lock(&self.feedback);
            let FeedbackState {
                predictions,
                accuracy,
            } = &mut *state;
            let accuracy = accuracy
                .entry(model.to_string())
                .or_insert_with(|| Accuracy::new(self.options.accuracy_window));
            for l in labels {
                match predictions.label(model, &l.id) {
                    Labelled::Unknown => unknown_ids.push(l.id.clone()),
                    Labelled::Again => matched += 1,
                    Labelled::First(p) => {
                        matched += 1;
                        if let Some(class) = p.class {
                            accuracy.record(class == l.label);
                        }
                        first.push((l, p));
                    }
                }
            }
            (accuracy.value(), accuracy.window())
        };
        let mut queue = vec![];
        for (l, p) in first {
            // A hard example of the same row takes the label instead of a
            // second copy of the row being queued.
            let in_window = self
                .windows
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(model)
                .and_then(|v| v.get(&p.version))
                .cloned()
                .is_some_and(|cell| lock(&cell).hard.label(&l.id, l.label));
            if in_window
                || self
                    .buffer
                    .label_sample(model, &l.id, l.label)
                    .map_err(FeedbackError::Storage)?
            {
                continue;
            }
            queue.push(sample(
                pb::SampleKind::Feedback,
                model,
                &l.id,
                p,
                Some(l.label),
            ));
        }
        self.buffer
            .add_samples(queue)
            .map_err(FeedbackError::Storage)?;
        Ok(FeedbackReply {
            matched,
            unknown_ids,
            rolling_accuracy,
            window,
        })
    }
}

fn sample(
    kind: pb::SampleKind,
    model: &str,
    request_id: &str,
    p: Predicted,
    label: Option<i64>,
) -> pb::Sample {
    pb::Sample {
        kind: kind as i32,
        model_name: model.to_string(),
        model_version: p.version,
        request_id: request_id.to_string(),
        observed_at: Some(p.observed_at.into()),
        inputs: p.inputs.unwrap_or_default(),
        predicted_class: p.class,
        confidence: p.confidence,
        label,
    }
}

/// The id a row's prediction is known by: the request id for a single-row
/// request, `<request id>/<row>` for each row of a batched one.
pub fn row_id(request_id: &str, row: usize, rows: usize) -> String {
    if rows == 1 {
        request_id.to_string()
    } else {
        format!("{request_id}/{row}")
    }
}

impl Observer for Telemetry {
    fn metrics_text(&self) -> String {
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, value: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        };
        line(
            "edgeloop_agent_telemetry_store_resets_total",
            "counter",
            "Times the telemetry buffer could not be opened and was moved aside for a new one.",
            self.store_resets,
        );
        if let Ok(s) = self.buffer.stats() {
            line(
                "edgeloop_agent_telemetry_pending_batches",
                "gauge",
                "Telemetry reports stored and not yet acknowledged.",
                s.batches,
            );
        }
        out
    }

    fn model_activated(&self, model: &str, version: &str, manifest: Option<&Manifest>) {
        self.note_model(model);
        self.references
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(model.to_string())
            .or_default()
            .insert(
                version.to_string(),
                Arc::new(VersionRefs {
                    features: feature_refs(manifest),
                    classifier: manifest.is_none_or(Manifest::is_classifier),
                }),
            );
    }

    fn observe(&self, o: &Observation<'_>) {
        self.note_model(o.model);
        let refs = self.refs(o.model, o.version);
        // The per-request work happens here, outside every lock.
        let (features, rows): (Vec<_>, Vec<Option<Prediction>>) = if o.ok {
            let rows = classifier_output(o.outputs)
                .filter(|_| refs.classifier)
                .and_then(predictions)
                .unwrap_or_else(|| {
                    // No classifier output: still one entry per input row,
                    // so labels can be matched and uploaded.
                    let n = o
                        .inputs
                        .first()
                        .and_then(|(_, t)| t.shape().first().copied());
                    vec![None; n.unwrap_or(1).max(1)]
                });
            (feature_delta(&refs.features, o.inputs), rows)
        } else {
            (vec![], vec![])
        };
        let now = SystemTime::now();
        let make_sample = |row: usize, p: &Prediction| {
            samples::encode_inputs(o.inputs, row, self.options.max_sample_bytes).map(|inputs| {
                pb::Sample {
                    kind: pb::SampleKind::HardExample as i32,
                    model_name: o.model.to_string(),
                    model_version: o.version.to_string(),
                    request_id: row_id(o.request_id, row, rows.len()),
                    observed_at: Some(now.into()),
                    inputs,
                    predicted_class: Some(p.class),
                    confidence: Some(p.confidence),
                    label: None,
                }
            })
        };
        loop {
            let cell = self.cell(o.model, o.version, &refs.features);
            let mut w = lock(&cell);
            if w.closed {
                // Closed between the lookup and the lock: use the new window.
                continue;
            }
            let low = w.record(
                o.ok,
                o.latency,
                &features,
                &rows,
                self.options.hard_threshold,
            );
            for row in low {
                let Some(p) = rows[row] else { continue };
                let Some(slot) = w.hard.offer(|n| rand::rng().random_range(0..n)) else {
                    continue;
                };
                // A copy of one row, only when the reservoir chose it.
                if let Some(s) = make_sample(row, &p) {
                    w.hard.place(slot, s);
                }
            }
            break;
        }
        if rows.is_empty() || self.options.feedback_capacity == 0 {
            return;
        }
        let keep_inputs = self.options.feedback_input_bytes > 0;
        let entries: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(row, p)| {
                (
                    PredictionKey {
                        model: o.model.to_string(),
                        id: row_id(o.request_id, row, rows.len()),
                    },
                    Predicted {
                        version: o.version.to_string(),
                        class: p.map(|p| p.class),
                        confidence: p.map(|p| p.confidence),
                        observed_at: now,
                        inputs: keep_inputs
                            .then(|| {
                                samples::encode_inputs(o.inputs, row, self.options.max_sample_bytes)
                            })
                            .flatten(),
                    },
                )
            })
            .collect();
        let mut state = lock(&self.feedback);
        for (k, v) in entries {
            state.predictions.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests;
