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
}

/// `<data-dir>/identity/`: `key.pem` (0600), `cert.pem`, `ca.pem`, and
/// `identity.json`, written last, so its presence means the rest is complete.
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

    pub fn key_path(&self) -> PathBuf {
        self.dir.join("key.pem")
    }

    pub fn load(&self) -> io::Result<Option<Identity>> {
        let marker = self.dir.join("identity.json");
        let raw = match std::fs::read(&marker) {
            Ok(raw) => raw,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let file: IdentityFile = serde_json::from_slice(&raw).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", marker.display()),
            )
        })?;
        Ok(Some(Identity {
            name: file.name,
            key_pem: std::fs::read_to_string(self.key_path())?,
            cert_pem: std::fs::read_to_string(self.dir.join("cert.pem"))?,
            ca_pem: std::fs::read_to_string(self.dir.join("ca.pem"))?,
        }))
    }

    pub fn save(&self, identity: &Identity) -> io::Result<()> {
        crate::member::create_private_dir(&self.dir)?;
        write_atomic(&self.key_path(), identity.key_pem.as_bytes(), 0o600)?;
        write_atomic(
            &self.dir.join("cert.pem"),
            identity.cert_pem.as_bytes(),
            0o644,
        )?;
        write_atomic(&self.dir.join("ca.pem"), identity.ca_pem.as_bytes(), 0o644)?;
        let marker = serde_json::to_vec_pretty(&IdentityFile {
            name: identity.name.clone(),
        })
        .map_err(io::Error::other)?;
        write_atomic(&self.dir.join("identity.json"), &marker, 0o644)?;
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
