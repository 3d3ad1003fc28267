//! Bootstrap tokens: `elb1.<id>.<secret>.<ca-sha256>`.
//!
//! The token carries the sha256 of the control plane's CA certificate, so a
//! fresh device can authenticate the server on first contact without a CA file
//! being copied to it (the kubeadm discovery-hash idea). The id is public (it
//! names the token in listings); only the secret is checked, by its hash.

use std::fmt;
use std::str::FromStr;

use edgeloop_models::Digest;
use rand::RngCore;

const PREFIX: &str = "elb1";
pub const ID_HEX_LEN: usize = 16;
pub const SECRET_HEX_LEN: usize = 64;

#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    pub secret: String,
    pub ca_fingerprint: Digest,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("bootstrap token must look like elb1.<id>.<secret>.<ca-sha256>")]
    Format,
    #[error("bootstrap token id must be {ID_HEX_LEN} lowercase hex characters")]
    Id,
    #[error("bootstrap token secret must be {SECRET_HEX_LEN} lowercase hex characters")]
    Secret,
    #[error("bootstrap token CA fingerprint is invalid: {0}")]
    CaFingerprint(edgeloop_models::DigestError),
}

impl BootstrapToken {
    /// A fresh token with a random id and a 256-bit secret.
    pub fn generate(ca_fingerprint: Digest) -> Self {
        let mut rng = rand::rng();
        let mut id = [0u8; ID_HEX_LEN / 2];
        let mut secret = [0u8; SECRET_HEX_LEN / 2];
        rng.fill_bytes(&mut id);
        rng.fill_bytes(&mut secret);
        Self {
            id: hex::encode(id),
            secret: hex::encode(secret),
            ca_fingerprint,
        }
    }

    /// What the control plane stores instead of the secret.
    pub fn secret_hash(&self) -> Digest {
        Digest::of(self.secret.as_bytes())
    }
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl FromStr for BootstrapToken {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split('.');
        let (Some(PREFIX), Some(id), Some(secret), Some(ca), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Format);
        };
        if !is_lower_hex(id, ID_HEX_LEN) {
            return Err(TokenError::Id);
        }
        if !is_lower_hex(secret, SECRET_HEX_LEN) {
            return Err(TokenError::Secret);
        }
        Ok(Self {
            id: id.to_string(),
            secret: secret.to_string(),
            ca_fingerprint: ca.parse().map_err(TokenError::CaFingerprint)?,
        })
    }
}

impl fmt::Display for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}.{}.{}.{}",
            self.id, self.secret, self.ca_fingerprint
        )
    }
}

// Never print the secret by accident.
impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .field("ca_fingerprint", &self.ca_fingerprint)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = BootstrapToken::generate(Digest::of(b"ca"));
        let parsed: BootstrapToken = t.to_string().parse().unwrap();
        assert_eq!(parsed, t);
        assert!(!format!("{t:?}").contains(&t.secret));
    }

    #[test]
    fn refusals() {
        let t = BootstrapToken::generate(Digest::of(b"ca")).to_string();
        assert_eq!("".parse::<BootstrapToken>(), Err(TokenError::Format));
        assert_eq!(
            t.replacen("elb1", "elb2", 1).parse::<BootstrapToken>(),
            Err(TokenError::Format)
        );
        assert_eq!(
            format!("{t}.x").parse::<BootstrapToken>(),
            Err(TokenError::Format)
        );
        let parts: Vec<&str> = t.split('.').collect();
        let bad_id = format!("elb1.XYZ.{}.{}", parts[2], parts[3]);
        assert_eq!(bad_id.parse::<BootstrapToken>(), Err(TokenError::Id));
        let bad_secret = format!("elb1.{}.short.{}", parts[1], parts[3]);
        assert_eq!(
            bad_secret.parse::<BootstrapToken>(),
            Err(TokenError::Secret)
        );
        let bad_ca = format!("elb1.{}.{}.nope", parts[1], parts[2]);
        assert!(matches!(
            bad_ca.parse::<BootstrapToken>(),
            Err(TokenError::CaFingerprint(_))
        ));
    }
}
