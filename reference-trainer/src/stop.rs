//! SIGTERM: a preemption, a node going away, `podman stop`. The training
//! loop reads the flag after each step, commits a checkpoint of that step,
//! and the process exits with 143 (128 + SIGTERM), so the bridge restarts
//! it as preempted and nothing is lost. A step in flight finishes: its
//! result is part of the checkpoint.
//!
//! No signal handler (and no `unsafe`): SIGTERM is blocked in the main
//! thread before any other thread starts, so every thread inherits the
//! mask, and one thread waits for it with `sigwait`.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{SigSet, Signal};

/// The exit status of a run stopped by SIGTERM after its checkpoint.
pub const EXIT_STOPPED: u8 = 143;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Starts listening for SIGTERM. Call it first in `main`, before any other
/// thread exists (rayon's pool starts with the first kernel).
pub fn install() -> std::io::Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.thread_block().map_err(std::io::Error::from)?;
    std::thread::Builder::new()
        .name("sigterm".into())
        .spawn(move || {
            if set.wait().is_ok() {
                REQUESTED.store(true, Ordering::SeqCst);
            }
        })
        .map(|_| ())
}

/// Whether a SIGTERM came.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
