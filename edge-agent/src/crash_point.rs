//! Named crash points for the crash tests (`tests/it/crash/`): with
//! `EDGELOOP_CRASH_AT=<name>` in its environment, the agent aborts the
//! moment it reaches `<name>`: no destructors, no flush, as a power cut
//! between two durable steps would leave it. A kill from outside can only
//! land near such a step; this lands on it.
//!
//! The points are the install and flip steps of a model into its A/B
//! slots ([`POINTS`]). Unset (every real deployment), a point is one
//! comparison against a value read once.

use std::sync::OnceLock;

/// The environment variable that names the point to crash at.
pub const ENV: &str = "EDGELOOP_CRASH_AT";

/// Every point, in the order an install reaches them.
pub const POINTS: [&str; 5] = [
    // The inactive slot is forgotten and emptied.
    "slot_cleared",
    // The verified files are in it, not yet recorded.
    "slot_placed",
    // It is recorded as holding the new version, not yet served.
    "slot_recorded",
    // The new version serves; the active slot is not yet recorded.
    "slot_serving",
    // The flip is recorded; the result is not yet reported.
    "slot_flipped",
];

/// Aborts the process if `point` is the one named by [`ENV`].
pub fn reached(point: &'static str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    debug_assert!(POINTS.contains(&point), "{point} is listed in POINTS");
    if AT.get_or_init(|| std::env::var(ENV).ok()).as_deref() == Some(point) {
        eprintln!("crash point {point} reached ({ENV}): aborting");
        std::process::abort();
    }
}
