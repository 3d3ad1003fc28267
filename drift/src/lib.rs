//! Drift, in one place: what devices send for it (`records`: sketches and
//! samples, checked off the wire), and the analysis (issue #7): how far a
//! window of agent sketches is from the manifest's reference statistics,
//! and when that counts as drift.
//! The pure parts come first: `stats` (PSI, Jensen–Shannon distance, the
//! two-sample KS test on binned counts) and `hysteresis` (set after N
//! windows, clear after M). `labels`: the labelling queue over the samples.
//! `aggregates`: window sums and label indexes kept as records arrive, so
//! readers see O(windows) records.

pub mod aggregates;
pub mod analysis;
pub mod hysteresis;
pub mod labels;
pub mod records;
pub mod retention;
pub mod stats;
mod trees;

pub use trees::Trees;
