//! The `checkpoint` and `restarts` sections: when a job writes
//! checkpoints and how many the bridge keeps, and how often (and after how
//! long) the bridge restarts it from the newest one; and their rules.

use serde::{Deserialize, Serialize};

use super::{JobSpec, SpecError};

/// When the job writes checkpoints, and how many the bridge keeps.
///
/// An absent `checkpoint` section means every 30 minutes; a present one must
/// say when (steps, minutes or both), since `{}` is more likely an unfinished
/// edit than a wish for the default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            minimum = 1,
            format = "uint64",
            maximum = 18_446_744_073_709_551_615_u64
        )
    )]
    pub every_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub every_minutes: Option<u32>,
    /// Keeping none would leave nothing to resume from (default 3).
    #[serde(default = "default_keep_last")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, format = "uint32", maximum = 4_294_967_295_u32)
    )]
    pub keep_last: u32,
}

fn default_keep_last() -> u32 {
    3
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_steps: None,
            every_minutes: Some(30),
            keep_last: default_keep_last(),
        }
    }
}

/// Restarts after a failure, with exponential backoff from `backoff_seconds`
/// capped at `backoff_max_seconds`; and after a preemption (the engine
/// stopped the attempt from outside: a spot node reclaimed, a node lost, a
/// SIGTERM the bridge did not send), counted apart and restarted after
/// `backoff_seconds`, since nothing is wrong with the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, default)]
pub struct RestartPolicy {
    /// At most 100 (default 3).
    #[cfg_attr(feature = "openapi", schema(maximum = 100))]
    pub max_restarts: u32,
    /// At most `backoff_max_seconds` (default 10).
    #[cfg_attr(feature = "openapi", schema(maximum = 86400))]
    pub backoff_seconds: u32,
    /// At most a day, 86400 (default 600).
    #[cfg_attr(feature = "openapi", schema(maximum = 86400))]
    pub backoff_max_seconds: u32,
    /// At most 1000 (default 10). Preemptions do not count against
    /// `max_restarts`.
    #[cfg_attr(feature = "openapi", schema(maximum = 1000))]
    pub max_preemptions: u32,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 3,
            backoff_seconds: 10,
            backoff_max_seconds: 600,
            max_preemptions: 10,
        }
    }
}

pub const MAX_RESTARTS: u32 = 100;
pub const MAX_PREEMPTIONS: u32 = 1000;
/// A day: a longer pause is a stuck job, not a backoff.
pub const MAX_BACKOFF_SECONDS: u32 = 86_400;

impl JobSpec {
    pub(super) fn validate_checkpoint(&self) -> Result<(), SpecError> {
        let c = &self.checkpoint;
        if c.every_steps.is_none() && c.every_minutes.is_none() {
            return Err(SpecError::invalid(
                "checkpoint.every_steps",
                "set every_steps, every_minutes or both",
            ));
        }
        if c.every_steps == Some(0) {
            return Err(SpecError::invalid(
                "checkpoint.every_steps",
                "must be at least 1",
            ));
        }
        if c.every_minutes == Some(0) {
            return Err(SpecError::invalid(
                "checkpoint.every_minutes",
                "must be at least 1",
            ));
        }
        if c.keep_last == 0 {
            // Keeping none would leave nothing to resume from.
            return Err(SpecError::invalid(
                "checkpoint.keep_last",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    pub(super) fn validate_restarts(&self) -> Result<(), SpecError> {
        let r = &self.restarts;
        if r.max_restarts > MAX_RESTARTS {
            return Err(SpecError::invalid(
                "restarts.max_restarts",
                format!("{} is more than {MAX_RESTARTS}", r.max_restarts),
            ));
        }
        if r.max_preemptions > MAX_PREEMPTIONS {
            return Err(SpecError::invalid(
                "restarts.max_preemptions",
                format!("{} is more than {MAX_PREEMPTIONS}", r.max_preemptions),
            ));
        }
        if r.backoff_max_seconds > MAX_BACKOFF_SECONDS {
            return Err(SpecError::invalid(
                "restarts.backoff_max_seconds",
                format!(
                    "{} is more than a day ({MAX_BACKOFF_SECONDS})",
                    r.backoff_max_seconds
                ),
            ));
        }
        if r.backoff_seconds > r.backoff_max_seconds {
            return Err(SpecError::invalid(
                "restarts.backoff_seconds",
                format!(
                    "{} is more than backoff_max_seconds ({})",
                    r.backoff_seconds, r.backoff_max_seconds
                ),
            ));
        }
        Ok(())
    }
}
