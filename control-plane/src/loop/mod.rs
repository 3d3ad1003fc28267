//! The loop wing: training jobs, drift analysis, retraining triggers and
//! the retraining pipeline's state machine.

pub mod drift;
pub mod jobs;
pub mod pipeline;
pub mod retrain;
pub mod triggers;
