//! SHA-256 whose state can be saved between requests: a resumable upload
//! continued by another control-plane replica (or after a restart) goes on
//! hashing where the last one stopped, without reading back the bytes it
//! has already stored. The state is saved only at 64-byte block
//! boundaries (parts are block-aligned), so it is the eight words of
//! `sha2::compress256` and a length; the padding is FIPS 180-4's.

use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};
use sha2::digest::generic_array::GenericArray;

const BLOCK: usize = 64;

/// FIPS 180-4 §5.3.3.
const INITIAL: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// The hash after a whole number of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedSha256 {
    pub words: [u32; 8],
    /// Bytes hashed; a multiple of 64.
    pub len: u64,
}

#[derive(Debug, Clone)]
pub struct ResumableSha256 {
    words: [u32; 8],
    /// Bytes compressed into `words`.
    len: u64,
    /// Less than one block, not yet compressed.
    tail: Vec<u8>,
}

impl Default for ResumableSha256 {
    fn default() -> Self {
        ResumableSha256 {
            words: INITIAL,
            len: 0,
            tail: Vec::with_capacity(BLOCK),
        }
    }
}

impl ResumableSha256 {
    /// Continues from `saved`; None if it is not at a block boundary (a
    /// state that could not have been saved by [`ResumableSha256::save`]).
    pub fn resume(saved: SavedSha256) -> Option<Self> {
        saved
            .len
            .is_multiple_of(BLOCK as u64)
            .then(|| ResumableSha256 {
                words: saved.words,
                len: saved.len,
                tail: Vec::with_capacity(BLOCK),
            })
    }

    /// Bytes hashed so far.
    fn len(&self) -> u64 {
        self.len + self.tail.len() as u64
    }

    pub fn update(&mut self, mut data: &[u8]) {
        if !self.tail.is_empty() {
            let take = (BLOCK - self.tail.len()).min(data.len());
            self.tail.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.tail.len() < BLOCK {
                return;
            }
            let block = std::mem::take(&mut self.tail);
            self.compress(&block);
            self.tail = block;
            self.tail.clear();
        }
        let whole = data.len() - data.len() % BLOCK;
        self.compress(&data[..whole]);
        self.tail.extend_from_slice(&data[whole..]);
    }

    fn compress(&mut self, blocks: &[u8]) {
        // One block a call: no copy of a part into an array of blocks.
        for block in blocks.chunks_exact(BLOCK) {
            sha2::compress256(
                &mut self.words,
                std::slice::from_ref(GenericArray::from_slice(block)),
            );
            self.len += BLOCK as u64;
        }
    }

    /// The state to save, when no partial block is pending.
    pub fn save(&self) -> Option<SavedSha256> {
        self.tail.is_empty().then_some(SavedSha256 {
            words: self.words,
            len: self.len,
        })
    }

    pub fn finish(mut self) -> Digest {
        let bits = self.len().wrapping_mul(8);
        let mut pad = std::mem::take(&mut self.tail);
        pad.push(0x80);
        while pad.len() % BLOCK != BLOCK - 8 {
            pad.push(0);
        }
        pad.extend_from_slice(&bits.to_be_bytes());
        self.compress(&pad);
        let mut out = [0u8; 32];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.words) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        Digest::from_bytes(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_answers() {
        // FIPS 180-2 appendix B.1 and B.2, and the empty string.
        let abc = ResumableSha256::default();
        let mut h = abc.clone();
        h.update(b"abc");
        assert_eq!(
            h.finish().to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut h = abc.clone();
        h.update(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
        assert_eq!(
            h.finish().to_hex(),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(abc.finish(), Digest::of(b""));
    }

    proptest! {
        /// Any split into updates, saved and resumed at any block boundary,
        /// hashes like sha2 over the whole.
        #[test]
        fn resumed_at_block_boundaries_it_agrees_with_sha2(
            data in proptest::collection::vec(any::<u8>(), 0..700),
            cuts in proptest::collection::vec(0usize..700, 0..6),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort();
            let mut h = ResumableSha256::default();
            let mut from = 0;
            for cut in cuts.into_iter().chain([data.len()]) {
                h.update(&data[from..cut]);
                from = cut;
                if let Some(saved) = h.save() {
                    prop_assert_eq!(saved.len, cut as u64);
                    // Through JSON, as the partial upload's state travels.
                    let json = serde_json::to_string(&saved).unwrap();
                    h = ResumableSha256::resume(serde_json::from_str(&json).unwrap()).unwrap();
                }
                prop_assert_eq!(h.len(), cut as u64);
            }
            prop_assert_eq!(h.finish(), Digest::of(&data));
        }
    }

    #[test]
    fn a_state_off_a_block_boundary_is_refused() {
        let saved = SavedSha256 {
            words: INITIAL,
            len: 65,
        };
        assert!(ResumableSha256::resume(saved).is_none());
        let mut h = ResumableSha256::default();
        h.update(&[0; 70]);
        assert!(h.save().is_none());
        h.update(&[0; 58]);
        assert_eq!(h.save().map(|s| s.len), Some(128));
    }
}
