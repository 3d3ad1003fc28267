//! Manifest keys: the ed25519 signing key ([`ManifestKey`]), the public key
//! that manifests are verified against ([`PublicKey`]), and their key files.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use ed25519_dalek::{Signature, SignatureError, Signer, SigningKey, VerifyingKey};

use super::{io_error, ManifestError};
use crate::Digest;

/// Key files hold 64 hex characters and a newline; anything much larger is
/// not a key file.
const MAX_KEY_FILE_BYTES: u64 = 1024;

/// A manifest signing key. Its bytes are wiped when it is dropped.
pub struct ManifestKey {
    signing: SigningKey,
}

impl ManifestKey {
    pub fn generate() -> Self {
        // 32 random bytes rather than `SigningKey::generate`, whose rand_core
        // 0.6 traits the workspace's rand 0.9 does not implement.
        let mut seed: [u8; 32] = rand::random();
        let key = Self::from_bytes(&seed);
        wipe(&mut seed);
        key
    }

    /// The 32-byte ed25519 secret (seed).
    pub fn from_bytes(secret: &[u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(secret),
        }
    }

    pub fn public(&self) -> PublicKey {
        PublicKey {
            key: self.signing.verifying_key(),
        }
    }

    /// Writes the secret as hex, readable by the owner only, atomically so a
    /// crash never leaves a torn key.
    pub fn write_to(&self, path: &Path) -> Result<(), ManifestError> {
        let mut secret = self.signing.to_bytes();
        let mut text = hex::encode(secret).into_bytes();
        text.push(b'\n');
        let written = crate::fs::write_atomic(path, &text, 0o600);
        wipe(&mut secret);
        wipe(&mut text);
        written.map_err(io_error(format!("writing manifest key {}", path.display())))
    }

    pub fn read_from(path: &Path) -> Result<Self, ManifestError> {
        let mut text = read_key_file(path)?;
        let mut secret = [0u8; 32];
        let decoded = decode_key_hex(&text, &mut secret);
        wipe(&mut text);
        let key = decoded.map(|()| Self::from_bytes(&secret));
        wipe(&mut secret);
        key.map_err(|reason| ManifestError::Key(format!("{}: {reason}", path.display())))
    }

    /// Signs `message` with the secret.
    pub(super) fn sign_message(&self, message: &[u8]) -> Signature {
        self.signing.sign(message)
    }
}

impl fmt::Debug for ManifestKey {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManifestKey(key_id {})", self.public().key_id())
    }
}

/// A public key that manifests are verified against.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
}

impl PublicKey {
    /// Refuses bytes that are not a curve point, and weak (small-order) keys,
    /// for which a signature can verify against many messages.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, ManifestError> {
        let key = VerifyingKey::from_bytes(bytes)
            .map_err(|_| ManifestError::Key("not an ed25519 public key".into()))?;
        if key.is_weak() {
            return Err(ManifestError::Key(
                "weak (small-order) ed25519 public key".into(),
            ));
        }
        Ok(Self { key })
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        self.key.as_bytes()
    }

    /// The hex sha256 of the 32 key bytes: how a signed manifest names its key.
    pub fn key_id(&self) -> String {
        Digest::of(self.key.as_bytes()).to_hex()
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.key.as_bytes())
    }

    pub fn from_hex(s: &str) -> Result<Self, ManifestError> {
        let mut bytes = [0u8; 32];
        decode_key_hex(s.as_bytes(), &mut bytes).map_err(|r| ManifestError::Key(r.into()))?;
        Self::from_bytes(&bytes)
    }

    pub fn write_to(&self, path: &Path) -> Result<(), ManifestError> {
        let text = format!("{}\n", self.to_hex());
        crate::fs::write_atomic(path, text.as_bytes(), 0o644)
            .map_err(io_error(format!("writing public key {}", path.display())))
    }

    pub fn read_from(path: &Path) -> Result<Self, ManifestError> {
        let text = read_key_file(path)?;
        let mut bytes = [0u8; 32];
        decode_key_hex(&text, &mut bytes)
            .map_err(|reason| ManifestError::Key(format!("{}: {reason}", path.display())))?;
        Self::from_bytes(&bytes).map_err(|e| ManifestError::Key(format!("{}: {e}", path.display())))
    }

    /// Strict ed25519 verification of `signature` over `message`.
    pub(super) fn verify_message(
        &self,
        message: &[u8],
        signature: &Signature,
    ) -> Result<(), SignatureError> {
        self.key.verify_strict(message, signature)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

fn read_key_file(path: &Path) -> Result<Vec<u8>, ManifestError> {
    let what = || format!("reading key {}", path.display());
    let file = File::open(path).map_err(io_error(what()))?;
    let mut text = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(io_error(what()))?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        wipe(&mut text);
        return Err(ManifestError::Key(format!(
            "{}: over {MAX_KEY_FILE_BYTES} bytes, not a key file",
            path.display()
        )));
    }
    Ok(text)
}

/// 64 hex characters, surrounding whitespace allowed (a trailing newline).
fn decode_key_hex(text: &[u8], out: &mut [u8; 32]) -> Result<(), &'static str> {
    let hex_part = text.trim_ascii();
    if hex_part.len() != 64 {
        return Err("expected 64 hex characters");
    }
    hex::decode_to_slice(hex_part, out).map_err(|_| "expected 64 hex characters")
}

/// Best-effort wipe of secret bytes (no zeroize crate here): `black_box`
/// keeps the compiler from dropping the stores as dead.
fn wipe(bytes: &mut [u8]) {
    bytes.fill(0);
    std::hint::black_box(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_and_invalid_public_keys_are_refused() {
        // The identity point: small order, so it "verifies" too much.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(matches!(
            PublicKey::from_bytes(&identity),
            Err(ManifestError::Key(_))
        ));
        assert!(PublicKey::from_hex("zz").is_err());
        assert!(PublicKey::from_hex(&"0".repeat(63)).is_err());
    }

    #[test]
    fn debug_never_prints_the_secret() {
        let key = ManifestKey::from_bytes(&[7u8; 32]);
        let printed = format!("{key:?}");
        assert!(!printed.contains(&hex::encode([7u8; 32])), "{printed}");
        assert!(printed.contains(&key.public().key_id()));
    }
}
