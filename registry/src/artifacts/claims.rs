//! Which call writes each partial upload file: the newest. A client that
//! retries while its first try still streams (stalled, or slow to notice a
//! broken connection) would otherwise append two streams to one file, and
//! the first to finish would commit the mix under a digest that only its
//! own stream matched. So each call takes the file, and a call that has
//! been superseded stops at its next write ([`ArtifactError::Superseded`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use super::ArtifactError;

/// The owner of one path: the number of the call that took it last.
type Slot = Arc<tokio::sync::Mutex<u64>>;

#[derive(Debug, Default)]
pub(super) struct Claims {
    next: std::sync::atomic::AtomicU64,
    /// A slot is cloned only under this lock, so a slot whose count is the
    /// map's and one caller's has no other user.
    slots: Mutex<HashMap<PathBuf, Slot>>,
}

/// One call's hold on a path.
pub(super) struct Claim {
    claims: Arc<Claims>,
    path: PathBuf,
    slot: Slot,
    mine: u64,
}

impl Claims {
    /// Takes `path` for a new call; the guard it returns lets the caller
    /// look at the file before any other call can write to it.
    pub(super) async fn take(self: &Arc<Self>, path: &Path) -> (Claim, OwnedMutexGuard<u64>) {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        let mine = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let mut guard = slot.clone().lock_owned().await;
        *guard = mine;
        let claim = Claim {
            claims: self.clone(),
            path: path.to_path_buf(),
            slot,
            mine,
        };
        (claim, guard)
    }
}

impl Claim {
    /// Exclusive use of the path for one write, while this call still
    /// holds it.
    pub(super) async fn write_turn(&self) -> Result<OwnedMutexGuard<u64>, ArtifactError> {
        let guard = self.slot.clone().lock_owned().await;
        if *guard != self.mine {
            return Err(ArtifactError::Superseded);
        }
        Ok(guard)
    }
}

impl Drop for Claim {
    /// Forgets the path once no call uses it, so the map stays as small as
    /// the uploads in flight.
    fn drop(&mut self) {
        let mut slots = self
            .claims
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map's reference and this one: nobody else can clone it now.
        if Arc::strong_count(&self.slot) == 2 {
            slots.remove(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_newest_call_holds_the_path_and_the_map_empties() {
        let claims = Arc::new(Claims::default());
        let p = Path::new("/x");
        let (first, g) = claims.take(p).await;
        drop(g);
        assert!(first.write_turn().await.is_ok());
        let (second, g) = claims.take(p).await;
        drop(g);
        assert!(matches!(
            first.write_turn().await,
            Err(ArtifactError::Superseded)
        ));
        assert!(second.write_turn().await.is_ok());
        // Another path is its own.
        let (other, g) = claims.take(Path::new("/y")).await;
        drop(g);
        assert!(other.write_turn().await.is_ok());
        drop((first, second, other));
        assert!(claims.slots.lock().unwrap().is_empty());
    }
}
