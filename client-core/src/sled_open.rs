//! Opening a sled database when a previous handle in the same process was
//! just dropped (an agent or control plane restarted in-process, as the tests
//! and `edgeloop demo` do).

use std::time::Duration;

/// How long to wait for the file lock before giving up with sled's error.
/// Generous: on a loaded 2-core machine sled's flusher thread, which drops
/// the lock, has been seen to take longer than 5 s to run.
const LOCK_WAIT: Duration = Duration::from_secs(15);

/// Opens `config`, retrying while the database's file lock is held. sled
/// releases the lock from its background flusher thread, shortly *after*
/// the last `Db` is dropped, so an immediate reopen can see `WouldBlock`.
/// A lock held by another live process still fails, after [`LOCK_WAIT`].
pub fn open_waiting_for_lock(config: &sled::Config) -> sled::Result<sled::Db> {
    let pause = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    loop {
        match config.open() {
            Err(sled::Error::Io(e)) if is_lock_busy(&e) && waited < LOCK_WAIT => {
                std::thread::sleep(pause);
                waited += pause;
            }
            other => return other,
        }
    }
}

/// Whether `e` (anywhere in its chain) is sled's "the lock is held": a
/// live process has the database open, which is no reason to call it
/// broken.
pub fn is_lock_held(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|cause| match cause.downcast_ref::<sled::Error>() {
            Some(sled::Error::Io(io)) => is_lock_busy(io),
            _ => cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(is_lock_busy),
        })
}

/// sled 0.34 reports a held lock as `ErrorKind::Other` wrapping the
/// `WouldBlock` of `flock`, with only its message to tell; a bare
/// `WouldBlock` is matched too, should a later sled pass it through.
fn is_lock_busy(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_recognised_as_sled_reports_it() {
        let wrapped = std::io::Error::other(
            "could not acquire lock on \"/tmp/x/db\": Os { code: 11, kind: WouldBlock }",
        );
        assert!(is_lock_busy(&wrapped));
        assert!(is_lock_busy(&std::io::Error::from(
            std::io::ErrorKind::WouldBlock
        )));
        assert!(!is_lock_busy(&std::io::Error::from(
            std::io::ErrorKind::NotFound
        )));
    }

    #[test]
    fn a_held_lock_is_told_from_a_broken_database() {
        let busy = anyhow::Error::new(sled::Error::Io(std::io::Error::other(
            "could not acquire lock on \"db\": Os { code: 11, kind: WouldBlock }",
        )))
        .context("opening the buffer");
        assert!(is_lock_held(&busy));
        let broken = anyhow::Error::new(sled::Error::Corruption { at: None, bt: () })
            .context("opening the buffer");
        assert!(!is_lock_held(&broken));
    }

    #[test]
    fn reopen_right_after_drop_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(dir.path().join("db"));
        for i in 0u32..20 {
            let db = open_waiting_for_lock(&config).unwrap();
            db.insert(b"k", &i.to_be_bytes()).unwrap();
            db.flush().unwrap();
        }
        let db = open_waiting_for_lock(&config).unwrap();
        assert_eq!(
            db.get(b"k").unwrap().unwrap().as_ref(),
            &19u32.to_be_bytes()
        );
    }
}
