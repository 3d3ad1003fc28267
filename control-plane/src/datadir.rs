//! The data dir's layout, and the admin token created on first start.
//!
//! ```text
//! DIR/db/          sled store
//! DIR/artifacts/   content-addressed blobs (sha256/xx/<digest>), tmp/
//! DIR/pki/         ca.crt, ca.key (0600), server.crt, server.key (0600)
//! DIR/admin.token  console API bearer token (0600)
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use edgeloop_models::fs::write_atomic;
use edgeloop_models::Digest;

#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn create(root: &Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .with_context(|| format!("creating data dir {}", root.display()))?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    pub fn db(&self) -> PathBuf {
        self.root.join("db")
    }

    pub fn artifacts(&self) -> PathBuf {
        self.root.join("artifacts")
    }

    pub fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }

    pub fn admin_token(&self) -> PathBuf {
        self.root.join("admin.token")
    }

    /// Returns the admin token's hash, and the token itself when it was just
    /// created (so the caller can print it once).
    pub fn load_or_create_admin_token(&self) -> anyhow::Result<(Digest, Option<String>)> {
        let path = self.admin_token();
        match std::fs::read_to_string(&path) {
            Ok(token) => {
                let token = token.trim();
                anyhow::ensure!(!token.is_empty(), "{} is empty", path.display());
                Ok((Digest::of(token.as_bytes()), None))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let token = format!("ela1_{}", hex::encode(rand::random::<[u8; 32]>()));
                write_atomic(&path, format!("{token}\n").as_bytes(), 0o600)
                    .with_context(|| format!("writing {}", path.display()))?;
                Ok((Digest::of(token.as_bytes()), Some(token)))
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}
