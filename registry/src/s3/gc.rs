//! What garbage collection and retention need: listing artifacts with
//! their times (the later of the object's and its `refreshed/` marker's),
//! deleting one only if still old enough, and dropping idle partial
//! uploads with their parts.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use edgeloop_models::Digest;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::put::PendingPut;
use super::resumable::PartialState;
use super::{backend, is_not_found, S3ArtifactStore, PUT_DIR};
use crate::artifacts::{ArtifactError, StoredArtifact};

impl S3ArtifactStore {
    /// `prune_partials`: records under `partials/` idle past `max_age`
    /// go, after their multipart uploads are aborted.
    pub(super) async fn prune(&self, max_age: Duration) -> Result<u64, ArtifactError> {
        let now = SystemTime::now();
        let stale: Vec<ObjectMeta> = self
            .s3
            .list(Some(&self.key("partials")))
            .try_filter(|meta| {
                let modified = SystemTime::from(meta.last_modified);
                let idle = now.duration_since(modified).unwrap_or_default();
                futures::future::ready(idle > max_age)
            })
            .try_collect()
            .await
            .map_err(backend)?;
        let mut dropped = 0;
        for meta in stale {
            let in_puts = meta.location.parts().any(|p| p.as_ref() == PUT_DIR);
            // Whatever the record says (or if it no longer parses), the
            // record itself goes: nobody resumes what it describes.
            let upload = if in_puts {
                self.get_json::<PendingPut>(&meta.location)
                    .await
                    .ok()
                    .flatten()
                    .map(|p| (p.digest, p.upload_id))
            } else {
                self.get_json::<PartialState>(&meta.location)
                    .await
                    .ok()
                    .flatten()
                    .map(|p| (p.digest, p.upload_id))
            };
            if let Some((digest, upload_id)) = upload {
                self.abort_quietly(digest, &upload_id).await;
            }
            match self.s3.delete(&meta.location).await {
                Ok(()) => dropped += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(backend(e)),
            }
        }
        Ok(dropped)
    }

    /// `list`.
    pub(super) async fn list_all(&self) -> Result<Vec<StoredArtifact>, ArtifactError> {
        let mut refreshed: HashMap<Digest, SystemTime> = HashMap::new();
        let mut markers = self.s3.list(Some(&self.key("refreshed")));
        while let Some(meta) = markers.next().await {
            let meta = meta.map_err(backend)?;
            if let Some(d) = meta.location.filename().and_then(|n| n.parse().ok()) {
                refreshed.insert(d, meta.last_modified.into());
            }
        }
        let mut out = Vec::new();
        let mut objects = self.s3.list(Some(&self.key("sha256")));
        while let Some(meta) = objects.next().await {
            let meta = meta.map_err(backend)?;
            // Only objects named by their digest, where the store puts
            // them, are artifacts; anything else here is not ours to delete.
            let Some(digest) = meta
                .location
                .filename()
                .and_then(|n| n.parse::<Digest>().ok())
                .filter(|d| self.artifact_key(*d) == meta.location)
            else {
                continue;
            };
            let own: SystemTime = meta.last_modified.into();
            let modified = refreshed.get(&digest).map_or(own, |m| own.max(*m));
            out.push(StoredArtifact {
                digest,
                size: meta.size,
                modified,
            });
        }
        Ok(out)
    }

    /// `delete_if_older`.
    pub(super) async fn delete_older(
        &self,
        digest: Digest,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, ArtifactError> {
        let marker = self.marker_key(digest);
        let Some(meta) = self.head_meta(&self.artifact_key(digest)).await? else {
            self.delete_quietly(&marker).await;
            return Ok(None);
        };
        // Read right before the DELETE: see the module's note on the race.
        let refreshed = self.head_meta(&marker).await?;
        let own: SystemTime = meta.last_modified.into();
        let modified = refreshed.map_or(own, |m| own.max(m.last_modified.into()));
        if modified > cutoff {
            return Ok(None);
        }
        // One DELETE: the key is there with all its bytes or gone.
        self.s3
            .delete(&self.artifact_key(digest))
            .await
            .map_err(backend)?;
        self.delete_quietly(&marker).await;
        Ok(Some(meta.size))
    }
}
