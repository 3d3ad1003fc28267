//! The drift wing's trees: its record kinds, each in a store tree whose name
//! is part of the on-disk format (sled trees, PostgreSQL rows), so a name
//! never changes. The store itself names none of them.

use edgeloop_store::{Store, StoreError, Tree};

#[derive(Clone)]
pub struct Trees {
    /// Drift sketches, by model/version/device/sequence.
    pub sketches: Tree<super::records::SketchRecord>,
    /// Hard examples and labelled feedback, keyed like sketches.
    pub samples: Tree<super::records::SampleRecord>,
    /// The samples by when they were observed, per model (retention).
    pub sample_index: Tree<String>,
    /// Each model's stored and dropped sample counts (retention).
    pub sample_counts: Tree<super::retention::SampleCounts>,
    /// Which drift aggregates this process keeps, and in which format
    /// (`aggregates`): a stale mark means rebuild from the raw records.
    pub agg_marks: Tree<super::aggregates::AggMark>,
    /// Each drift window's sum of sketches over all devices, by
    /// `<model>/<version>/<window seconds>/<start>`.
    pub drift_windows: Tree<super::analysis::WindowSum>,
    /// The same per device: `<model>/<version>/<window seconds>/<start>/<device>`.
    pub drift_window_devices: Tree<super::analysis::WindowSum>,
    /// The trigger tick's drift fold over each version's closed windows,
    /// by `<model>/<version>/<window seconds>`.
    pub drift_runs: Tree<super::aggregates::run::RunCache>,
    /// The fold's hysteresis state after each closed window, keyed like
    /// `drift_windows`.
    pub drift_fold_points: Tree<super::aggregates::run::FoldPoint>,
    /// The labelled samples of each request, by `<model>/<device>/<request id>`.
    pub label_requests: Tree<Vec<super::aggregates::labelled::LabelledSample>>,
    /// The counted labels by time, `<model>/<time>/<sample key>`.
    pub label_index: Tree<()>,
    /// Counted labels per hour, by `<model>/<hour>`.
    pub label_hours: Tree<u64>,
    /// Whether each counted prediction was right, by
    /// `<model>/<version>/<time>/<sample key>`.
    pub accuracy_index: Tree<bool>,
}

impl Trees {
    pub fn open(store: &Store) -> Result<Trees, StoreError> {
        Ok(Trees {
            sketches: store.tree("sketches")?,
            samples: store.tree("samples")?,
            sample_index: store.tree("sample_index")?,
            sample_counts: store.tree("sample_counts")?,
            agg_marks: store.tree("agg_marks")?,
            drift_windows: store.tree("drift_windows")?,
            drift_window_devices: store.tree("drift_window_devices")?,
            drift_runs: store.tree("drift_runs")?,
            drift_fold_points: store.tree("drift_fold_points")?,
            label_requests: store.tree("label_requests")?,
            label_index: store.tree("label_index")?,
            label_hours: store.tree("label_hours")?,
            accuracy_index: store.tree("accuracy_index")?,
        })
    }
}
