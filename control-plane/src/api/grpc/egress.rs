//! A replica-wide cap on the artifact bytes its downloads send a second,
//! shared fairly between them (`--max-download-bytes-per-sec`).
//!
//! Why: on loopback or a fast network, downloads send as fast as the
//! replica can encrypt, and the permits (`max_concurrent_downloads`) bound
//! how many send, not how much CPU they take: a rollout fills the cores,
//! and every other task, heartbeats included, queues behind TLS work. A
//! byte rate below what the cores encrypt leaves them room. Fair: each
//! download reserves one chunk at a time, in the order they ask, so the
//! sending downloads take turns chunk by chunk.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The pacing decision: when reserved bytes may go. Pure, so tests give it
/// the clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// Bytes a second.
    rate: u64,
    /// Idle time earns at most this much sending at once.
    burst: Duration,
    /// When every byte reserved so far has gone at the rate; `None` before
    /// the first reservation.
    busy_until: Option<Instant>,
}

impl Schedule {
    pub(crate) fn new(rate: u64, burst: Duration) -> Schedule {
        Schedule {
            rate: rate.max(1),
            burst,
            busy_until: None,
        }
    }

    /// Reserves `bytes` at `now`: how long the caller waits before sending
    /// them. Reservations are served in the order they are made.
    pub(crate) fn reserve(&mut self, now: Instant, bytes: u64) -> Duration {
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(self.rate);
        let cost = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let earliest = now.checked_sub(self.burst).unwrap_or(now);
        let start = match self.busy_until {
            Some(busy) if busy > earliest => busy,
            _ => earliest,
        };
        self.busy_until = Some(start + cost);
        start.saturating_duration_since(now)
    }
}

/// The replica's pacer; `None` rate: no cap.
#[derive(Debug)]
pub struct Egress {
    schedule: Option<Mutex<Schedule>>,
}

/// A tenth of a second of the rate may go at once after an idle spell: a
/// small artifact goes without waiting, and a burst stays short.
const BURST: Duration = Duration::from_millis(100);

impl Egress {
    pub fn new(bytes_per_sec: Option<u64>) -> Egress {
        Egress {
            schedule: bytes_per_sec.map(|rate| Mutex::new(Schedule::new(rate, BURST))),
        }
    }

    /// Waits for this download's turn to send `bytes`.
    pub async fn pace(&self, bytes: u64) {
        let Some(schedule) = &self.schedule else {
            return;
        };
        let wait = schedule
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reserve(Instant::now(), bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn reservations_go_at_the_rate_in_order() {
        let t0 = Instant::now() + Duration::from_secs(10);
        // 1000 bytes a second; (at, bytes, wait), one schedule per table.
        let no_burst: &[(Duration, u64, Duration)] = &[
            // The first goes at once.
            (ms(0), 500, ms(0)),
            // The next waits for the first's half second.
            (ms(0), 500, ms(500)),
            // A third asked at the same time queues behind both.
            (ms(0), 250, ms(1000)),
            // Asked later, it waits only what is left.
            (ms(1100), 100, ms(150)),
            // After an idle spell nothing is owed: at once again.
            (ms(5000), 1000, ms(0)),
            (ms(5000), 1, ms(1000)),
        ];
        let with_burst: &[(Duration, u64, Duration)] = &[
            // Idle before: a burst's worth (100 ms = 100 bytes) and the
            // reservation that crosses it go at once.
            (ms(0), 60, ms(0)),
            (ms(0), 60, ms(0)),
            // Now 20 bytes are owed past `now`: 20 ms.
            (ms(0), 10, ms(20)),
            // Idle time earns no more than the burst.
            (ms(10_000), 100, ms(0)),
            (ms(10_000), 100, ms(0)),
            (ms(10_000), 100, ms(100)),
        ];
        for (burst, table) in [(ms(0), no_burst), (ms(100), with_burst)] {
            let mut s = Schedule::new(1000, burst);
            for (i, (at, bytes, want)) in table.iter().enumerate() {
                let got = s.reserve(t0 + *at, *bytes);
                assert_eq!(got, *want, "burst {burst:?}, row {i}");
            }
        }
    }

    #[test]
    fn a_zero_rate_is_taken_as_one_byte_a_second() {
        let t0 = Instant::now();
        let mut s = Schedule::new(0, ms(0));
        assert_eq!(s.reserve(t0, 2), ms(0));
        assert_eq!(s.reserve(t0, 1), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn downloads_share_the_rate_turn_by_turn() {
        // Two downloads of four 100-byte chunks at 1000 bytes a second
        // without a burst: they alternate, and the last chunk goes at
        // 700 ms, not earlier.
        let egress = std::sync::Arc::new(Egress {
            schedule: Some(Mutex::new(Schedule::new(1000, ms(0)))),
        });
        let t0 = Instant::now();
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for who in ['a', 'b'] {
            let (egress, order) = (egress.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    egress.pace(100).await;
                    order.lock().unwrap().push((who, t0.elapsed()));
                    tokio::task::yield_now().await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let who: String = order.iter().map(|(w, _)| *w).collect();
        assert_eq!(who, "abababab");
        assert_eq!(order.last().unwrap().1, ms(700));
    }

    #[tokio::test]
    async fn without_a_rate_nothing_waits() {
        let egress = Egress::new(None);
        let t0 = Instant::now();
        for _ in 0..1000 {
            egress.pace(1 << 30).await;
        }
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
