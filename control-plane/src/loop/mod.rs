//! The loop wing: training jobs today; drift, triggers and retraining
//! pipelines build on it.

pub mod drift;
pub mod jobs;
pub mod triggers;
