//! Content digests. Every artifact, checkpoint and model in Edgeloop is named
//! by the sha256 of its bytes, so a name can be checked against the content.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// A sha256 digest, written as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest must be 64 hex characters (sha256), got {0} characters")]
    Length(usize),
    #[error("digest must be lowercase hex (0-9, a-f)")]
    NotHex,
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Also accept the common "sha256:" prefix, so digests copied from OCI
        // tooling work.
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        if hex_part.len() != 64 {
            return Err(DigestError::Length(hex_part.len()));
        }
        // Uppercase is refused so that one digest has exactly one spelling; it
        // is used as a file name and a database key.
        if !hex_part
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(DigestError::NotHex);
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| DigestError::NotHex)?;
        Ok(Self(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Hashes bytes as they stream past, counting them too.
#[derive(Default, Clone)]
pub struct Sha256Writer {
    hasher: Sha256,
    len: u64,
}

impl Sha256Writer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn finish(self) -> Digest {
        Digest(self.hasher.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_vector() {
        assert_eq!(
            Digest::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn parse_table() {
        let good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(
            good.parse::<Digest>().map(|d| d.to_hex()),
            Ok(good.to_string())
        );
        assert!(format!("sha256:{good}").parse::<Digest>().is_ok());
        assert_eq!("abc".parse::<Digest>(), Err(DigestError::Length(3)));
        assert_eq!(
            good.to_uppercase().parse::<Digest>(),
            Err(DigestError::NotHex)
        );
        assert_eq!(
            format!("{}zz", &good[..62]).parse::<Digest>(),
            Err(DigestError::NotHex)
        );
        assert!("../../../../etc/passwd".parse::<Digest>().is_err());
    }

    #[test]
    fn streaming_matches_one_shot() {
        let mut w = Sha256Writer::new();
        w.update(b"a");
        w.update(b"bc");
        assert_eq!(w.len(), 3);
        assert_eq!(w.finish(), Digest::of(b"abc"));
    }

    #[test]
    fn serde_round_trip_and_refusal() {
        let d = Digest::of(b"x");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Digest>("\"nope\"").is_err());
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,80}") {
            let _ = s.parse::<Digest>();
        }

        #[test]
        fn display_parse_round_trip(bytes in any::<[u8; 32]>()) {
            let d = Digest::from_bytes(bytes);
            prop_assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        }
    }
}
