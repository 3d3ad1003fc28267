//! The identity a device or bridge holds after enrollment, and its on-disk
//! form. The private key is generated here, written with mode 0600, and never
//! sent anywhere: only a CSR leaves the device.

use std::io;
use std::path::{Path, PathBuf};

use edgeloop_models::fs::write_atomic;
use serde::{Deserialize, Serialize};

#[derive(Clone)]
pub struct Identity {
    /// What the control plane calls us, e.g. `device/cam-01`.
    pub name: String,
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct IdentityFile {
    name: String,
    /// Which key and certificate files are current: 0 for `key.pem` and
    /// `cert.pem` (enrollment), n for `key-n.pem` and `cert-n.pem` (the
    /// n-th renewal).
    #[serde(default, skip_serializing_if = "is_zero")]
    generation: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `<data-dir>/identity/`: `key.pem` (0600), `cert.pem`, `ca.pem`, and
/// `identity.json`, written last, so its presence means the rest is complete.
/// A renewal writes the next generation's key and certificate beside the
/// current ones and then `identity.json`, which names the generation: a
/// crash before that rename leaves the old pair current and whole.
#[derive(Debug, Clone)]
pub struct IdentityStore {
    dir: PathBuf,
}

impl IdentityStore {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("identity"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current private key's file.
    pub fn key_path(&self) -> io::Result<PathBuf> {
        let generation = self.read_marker()?.map_or(0, |f| f.generation);
        Ok(self.pair(generation).0)
    }

    /// A generation's key and certificate files.
    fn pair(&self, generation: u64) -> (PathBuf, PathBuf) {
        if generation == 0 {
            (self.dir.join("key.pem"), self.dir.join("cert.pem"))
        } else {
            (
                self.dir.join(format!("key-{generation}.pem")),
                self.dir.join(format!("cert-{generation}.pem")),
            )
        }
    }

    fn marker_path(&self) -> PathBuf {
        self.dir.join("identity.json")
    }

    fn read_marker(&self) -> io::Result<Option<IdentityFile>> {
        let marker = self.marker_path();
        let raw = match std::fs::read(&marker) {
            Ok(raw) => raw,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&raw).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", marker.display()),
            )
        })
    }

    fn write_marker(&self, name: &str, generation: u64) -> io::Result<()> {
        let marker = serde_json::to_vec_pretty(&IdentityFile {
            name: name.to_string(),
            generation,
        })
        .map_err(io::Error::other)?;
        write_atomic(&self.marker_path(), &marker, 0o644)
    }

    pub fn load(&self) -> io::Result<Option<Identity>> {
        let Some(file) = self.read_marker()? else {
            return Ok(None);
        };
        let (key, cert) = self.pair(file.generation);
        Ok(Some(Identity {
            name: file.name,
            key_pem: std::fs::read_to_string(key)?,
            cert_pem: std::fs::read_to_string(cert)?,
            ca_pem: std::fs::read_to_string(self.dir.join("ca.pem"))?,
        }))
    }

    /// Replaces the current key and certificate with a renewed pair, as
    /// the next generation (see the type's docs for why that is crash-safe).
    pub fn save_renewed(&self, identity: &Identity) -> io::Result<()> {
        let current = self
            .read_marker()?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no identity to renew"))?;
        let next = current.generation + 1;
        let (key, cert) = self.pair(next);
        write_atomic(&key, identity.key_pem.as_bytes(), 0o600)?;
        write_atomic(&cert, identity.cert_pem.as_bytes(), 0o644)?;
        self.write_marker(&identity.name, next)?;
        // The replaced pair is no use to anyone now; a failed removal
        // only leaves a file behind.
        let (old_key, old_cert) = self.pair(current.generation);
        for old in [old_key, old_cert] {
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!(path = %old.display(), error = %e, "removing a replaced key or certificate");
            }
        }
        Ok(())
    }

    pub fn save(&self, identity: &Identity) -> io::Result<()> {
        crate::member::create_private_dir(&self.dir)?;
        let (key, cert) = self.pair(0);
        write_atomic(&key, identity.key_pem.as_bytes(), 0o600)?;
        write_atomic(&cert, identity.cert_pem.as_bytes(), 0o644)?;
        write_atomic(&self.dir.join("ca.pem"), identity.ca_pem.as_bytes(), 0o644)?;
        self.write_marker(&identity.name, 0)?;
        // Enrolled: the key is in key.pem now.
        match std::fs::remove_file(self.enroll_key_path()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// `enroll-key.pem` (0600): the key an enrollment in progress asks a
    /// certificate for, kept until the identity is saved, so that a retry
    /// after a lost reply presents the same key and gets the same answer.
    pub fn enroll_key_path(&self) -> PathBuf {
        self.dir.join("enroll-key.pem")
    }

    /// The enrollment key in progress (PEM), if one was made.
    pub fn load_enroll_key(&self) -> io::Result<Option<String>> {
        match std::fs::read_to_string(self.enroll_key_path()) {
            Ok(pem) => Ok(Some(pem)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Keeps `key_pem` as the enrollment key, durably, before it is used.
    pub fn save_enroll_key(&self, key_pem: &str) -> io::Result<()> {
        crate::member::create_private_dir(&self.dir)?;
        write_atomic(&self.enroll_key_path(), key_pem.as_bytes(), 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(n: u32) -> Identity {
        Identity {
            name: "device/cam".into(),
            key_pem: format!("key {n}"),
            cert_pem: format!("cert {n}"),
            ca_pem: "ca".into(),
        }
    }

    #[test]
    fn a_renewal_replaces_the_pair_and_a_crash_before_the_marker_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = IdentityStore::new(dir.path());
        assert!(store.load().unwrap().is_none());
        assert!(
            store.save_renewed(&identity(1)).is_err(),
            "nothing to renew"
        );
        store.save(&identity(0)).unwrap();
        assert_eq!(store.load().unwrap().unwrap().cert_pem, "cert 0");

        store.save_renewed(&identity(1)).unwrap();
        let loaded = store.load().unwrap().unwrap();
        assert_eq!(
            (loaded.key_pem.as_str(), loaded.cert_pem.as_str()),
            ("key 1", "cert 1")
        );
        assert_eq!(loaded.ca_pem, "ca");
        assert_eq!(
            store.key_path().unwrap(),
            dir.path().join("identity/key-1.pem")
        );
        assert!(!dir.path().join("identity/key.pem").exists());
        assert!(!dir.path().join("identity/cert.pem").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(store.key_path().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        // A crash after the next pair is written but before identity.json
        // names it: the current pair is still whole and still current.
        let (key, cert) = store.pair(2);
        std::fs::write(key, "key 2").unwrap();
        std::fs::write(cert, "half a cert").unwrap();
        assert_eq!(store.load().unwrap().unwrap().cert_pem, "cert 1");
        // The next renewal simply writes over the leftovers.
        store.save_renewed(&identity(2)).unwrap();
        assert_eq!(store.load().unwrap().unwrap().cert_pem, "cert 2");
        assert!(!dir.path().join("identity/key-1.pem").exists());
    }
}
