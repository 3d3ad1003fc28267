//! A rollout's wake-ups, paced to the downloads they start.
//!
//! Waking a device's assignment watch queues work on the runtime: its
//! stream reads the set, its connection encrypts the message, and soon the
//! device asks for the artifact. A fleet-wide wave woken at once (10 000
//! devices at 100 %) put all of it on the runtime's queue together, and a
//! heartbeat that arrived then waited behind every device of the wave
//! (`docs/fleet-scale.md`). Waking devices faster than downloads can start
//! gains nothing either: their streams only wait for a permit, and hold
//! memory while they wait.
//!
//! So the rollout queues its woken devices here ([`Wakeups::push`]) and
//! one task ([`run`]) wakes them a batch at a time: a batch when the
//! streams waiting for a download permit are fewer than the permits, and
//! never more often than [`WAKE_SPACING`]. Stuck downloads hold the
//! wake-ups back for at most [`MAX_HOLD`] a batch, so devices with nothing
//! to download (and other deployments') still move. Only the rollout's
//! leader queues wake-ups, and the waiting streams it counts are its own:
//! with several replicas, a wave is paced by the downloads of the devices
//! connected to the leader.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Events, FleetEvent};
use crate::Core;

/// Devices woken together.
pub const WAKE_BATCH: usize = 64;
/// The least time between two batches: long enough for a batch's devices
/// to ask for their downloads on a local network, so the next batch's
/// decision counts them.
pub const WAKE_SPACING: Duration = Duration::from_millis(20);
/// The longest a batch waits for the waiting downloads to fall below the
/// permits.
pub const MAX_HOLD: Duration = Duration::from_secs(1);
/// How often a held batch looks at the downloads again.
const RECHECK: Duration = Duration::from_millis(10);

/// Devices to wake, in the order queued, each once.
#[derive(Debug, Default)]
pub struct Wakeups {
    queue: Mutex<Queue>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    order: VecDeque<String>,
    queued: HashSet<String>,
}

impl Wakeups {
    /// Queues `devices` to be woken. A device already queued keeps its
    /// place: its stream reads the current set when woken, whatever
    /// changed since.
    pub fn push(&self, devices: impl IntoIterator<Item = String>) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        for device in devices {
            if q.queued.insert(device.clone()) {
                q.order.push_back(device);
            }
        }
        drop(q);
        self.notify.notify_one();
    }

    /// Devices queued and not yet woken (for `/metrics`).
    pub fn queued(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .order
            .len()
    }

    fn take(&self, n: usize) -> Vec<String> {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let n = n.min(q.order.len());
        let batch: Vec<String> = q.order.drain(..n).collect();
        for device in &batch {
            q.queued.remove(device);
        }
        batch
    }
}

/// When the next batch may be woken: `None` now, or how long to wait
/// before asking again. `last` is when the last batch was woken;
/// `waiting` the download streams waiting for one of `permits`.
pub fn next_wake(
    last: Option<Instant>,
    now: Instant,
    waiting: usize,
    permits: usize,
) -> Option<Duration> {
    // Nothing woken yet: at once.
    let last = last?;
    let since = now.saturating_duration_since(last);
    if since < WAKE_SPACING {
        return Some(WAKE_SPACING - since);
    }
    if waiting < permits || since >= MAX_HOLD {
        return None;
    }
    Some(RECHECK.min(MAX_HOLD - since))
}

/// Wakes the queued devices until `shutdown`. Devices still queued at
/// shutdown are not woken: they read their set when they reconnect.
pub async fn run(core: Arc<Core>, shutdown: CancellationToken) {
    let downloads = || (core.downloads.waiting(), core.downloads.capacity());
    pump(&core.wakeups, &core.events, downloads, shutdown).await
}

async fn pump(
    wakeups: &Wakeups,
    events: &Events,
    downloads: impl Fn() -> (usize, usize),
    shutdown: CancellationToken,
) {
    let mut last = None;
    loop {
        if wakeups.queued() == 0 {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wakeups.notify.notified() => continue,
            }
        }
        loop {
            let (waiting, permits) = downloads();
            let Some(wait) = next_wake(last, Instant::now(), waiting, permits) else {
                break;
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let batch: Vec<FleetEvent> = wakeups
            .take(WAKE_BATCH)
            .into_iter()
            .map(|device| FleetEvent::AssignmentsChanged { device })
            .collect();
        if events.is_relayed() {
            // The log for the other replicas is a store write, which on
            // PostgreSQL is a round trip: not on a runtime worker.
            let events = events.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || events.publish_many(batch)).await {
                tracing::error!(error = %e, "waking a batch of devices");
            }
        } else {
            events.publish_many(batch);
        }
        last = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::fleet::members::MemberKind;

    #[test]
    fn a_batch_waits_for_the_spacing_and_for_downloads_to_drain_at_most_the_hold() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // (since the last batch, waiting, permits) → the decision
        let cases = [
            (None, 1000, 64, None),                   // the first batch: at once
            (Some(ms(0)), 0, 64, Some(WAKE_SPACING)), // just woken: the spacing
            (Some(ms(15)), 0, 64, Some(ms(5))),
            (Some(ms(20)), 0, 64, None),  // spaced, nothing waiting
            (Some(ms(20)), 63, 64, None), // fewer waiting than permits
            (Some(ms(20)), 64, 64, Some(RECHECK)), // as many: held
            (Some(ms(995)), 500, 64, Some(ms(5))), // held, not past the hold
            (Some(ms(1000)), 500, 64, None), // the hold is over
            (Some(ms(5000)), 500, 64, None),
        ];
        for (since, waiting, permits, want) in cases {
            let last = since.map(|_| t0);
            let now = t0 + since.unwrap_or_default();
            assert_eq!(
                next_wake(last, now, waiting, permits),
                want,
                "since {since:?}, {waiting} waiting for {permits} permits"
            );
        }
    }

    #[test]
    fn a_device_queued_twice_is_woken_once_in_its_first_place() {
        let w = Wakeups::default();
        w.push(["a".to_string(), "b".to_string()]);
        w.push(["c".to_string(), "a".to_string()]);
        assert_eq!(w.queued(), 3);
        assert_eq!(w.take(2), ["a", "b"]);
        // Taken, so queued again: it is woken again.
        w.push(["a".to_string()]);
        assert_eq!(w.take(10), ["c", "a"]);
        assert_eq!(w.queued(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_downloads_hold_the_wave_back_until_they_drain_or_the_hold_ends() {
        let wakeups = Arc::new(Wakeups::default());
        let events = Events::default();
        let waiting = Arc::new(AtomicUsize::new(1000));
        let devices: Vec<String> = (0..3 * WAKE_BATCH).map(|i| format!("d{i:03}")).collect();
        let signals: Vec<_> = devices
            .iter()
            .map(|d| events.member(MemberKind::Device, d))
            .collect();
        let woken = |i: usize| signals[i].borrow().assignments > 0;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (wakeups, events, waiting, shutdown) = (
                wakeups.clone(),
                events.clone(),
                waiting.clone(),
                shutdown.clone(),
            );
            async move {
                pump(
                    &wakeups,
                    &events,
                    || (waiting.load(Ordering::Relaxed), 64),
                    shutdown,
                )
                .await
            }
        });
        let t0 = Instant::now();
        wakeups.push(devices.clone());
        tokio::time::sleep(Duration::from_millis(1)).await;
        // The first batch at once, in the order queued.
        assert!((0..WAKE_BATCH).all(woken));
        assert!(!woken(WAKE_BATCH));
        // The downloads stay stuck: the second batch after the hold.
        tokio::time::sleep(MAX_HOLD - Duration::from_millis(10)).await;
        assert!(!woken(WAKE_BATCH), "held while downloads wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!((WAKE_BATCH..2 * WAKE_BATCH).all(woken));
        assert!(!woken(2 * WAKE_BATCH));
        // They drain: the last batch after the spacing, not the hold.
        waiting.store(0, Ordering::Relaxed);
        tokio::time::sleep(WAKE_SPACING + RECHECK).await;
        assert!((0..3 * WAKE_BATCH).all(woken));
        assert!(t0.elapsed() < MAX_HOLD * 2);
        assert_eq!(wakeups.queued(), 0);
        shutdown.cancel();
        task.await.unwrap();
    }
}
