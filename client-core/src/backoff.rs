//! Reconnect delays: exponential with full jitter, capped. A pure function of
//! the attempt number and a random draw, so it is tested without sleeping.

use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(250),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based). `jitter` is a draw
    /// from [0, 1); the delay lies in [ceiling/2, ceiling] so a fleet that lost
    /// the server at once does not come back at once.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .min(self.max);
        let jitter = jitter.clamp(0.0, 1.0);
        ceiling.mul_f64(0.5 + 0.5 * jitter)
    }

    /// [`Backoff::delay`] with a fresh random draw.
    pub fn next(&self, attempt: u32) -> Duration {
        self.delay(attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_jitters() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let table = [
            (0, 0.0, 50),
            (0, 1.0, 100),
            (1, 1.0, 200),
            (3, 0.5, 600),
            (5, 1.0, 2000),
            (40, 1.0, 2000),
            (u32::MAX, 0.0, 1000),
        ];
        for (attempt, jitter, want_ms) in table {
            assert_eq!(
                b.delay(attempt, jitter),
                Duration::from_millis(want_ms),
                "attempt {attempt} jitter {jitter}"
            );
        }
    }
}
