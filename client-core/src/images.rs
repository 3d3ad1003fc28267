//! A pinned image on the wire: the bridge sends it with its progress
//! reports, the control plane stores it and hands it back with a lease.

use edgeloop_api::images::{PinKind, PinnedImage};
use edgeloop_proto::bridge::v1 as pb;

pub fn to_wire(p: &PinnedImage) -> pb::PinnedImage {
    pb::PinnedImage {
        reference: p.reference.clone(),
        digest: p.digest.to_hex(),
        kind: match p.kind {
            PinKind::ImageId => pb::PinKind::ImageId,
            PinKind::Manifest => pb::PinKind::Manifest,
        } as i32,
    }
}

/// The pinned image a message carries, checked: the reference is one, the
/// digest is sha256 hex, and the kind is known. The error names the field.
pub fn from_wire(p: &pb::PinnedImage) -> Result<PinnedImage, (&'static str, String)> {
    edgeloop_api::images::check_reference(&p.reference)
        .map_err(|e| ("image.reference", e.to_string()))?;
    let digest = p
        .digest
        .parse()
        .map_err(|e| ("image.digest", format!("{e}")))?;
    let kind = match pb::PinKind::try_from(p.kind) {
        Ok(pb::PinKind::ImageId) => PinKind::ImageId,
        Ok(pb::PinKind::Manifest) => PinKind::Manifest,
        _ => return Err(("image.kind", format!("{} is not a pin kind", p.kind))),
    };
    Ok(PinnedImage {
        reference: p.reference.clone(),
        digest,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_survives_the_wire_and_a_bad_one_names_its_field() {
        let pin = PinnedImage {
            reference: "localhost/trainer:1".into(),
            digest: edgeloop_models::Digest::of(b"config"),
            kind: PinKind::ImageId,
        };
        assert_eq!(from_wire(&to_wire(&pin)).unwrap(), pin);
        let mut w = to_wire(&pin);
        w.digest = "sha1:abc".into();
        assert_eq!(from_wire(&w).unwrap_err().0, "image.digest");
        let mut w = to_wire(&pin);
        w.kind = 0;
        assert_eq!(from_wire(&w).unwrap_err().0, "image.kind");
        let mut w = to_wire(&pin);
        w.reference = "a b".into();
        assert_eq!(from_wire(&w).unwrap_err().0, "image.reference");
    }
}
