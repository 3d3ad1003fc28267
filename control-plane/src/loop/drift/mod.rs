//! Drift analysis (issue #7): how far a window of agent sketches is from
//! the manifest's reference statistics, and when that counts as drift.
//! The pure parts come first: `stats` (PSI, Jensen–Shannon distance, the
//! two-sample KS test on binned counts) and `hysteresis` (set after N
//! windows, clear after M).

pub mod analysis;
pub mod hysteresis;
pub mod stats;
