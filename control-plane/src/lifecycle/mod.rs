//! A model's lifecycle after it ships: training jobs, retraining triggers
//! and the retraining pipeline (its pure state machine and the steps).

pub mod jobs;
pub mod pipeline;
pub mod retrain;
mod trees;
pub mod triggers;

pub use trees::Trees;
