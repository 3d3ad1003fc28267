//! Deterministic randomness, keyed rather than stateful.
//!
//! Every random draw comes from a SplitMix64 stream named by
//! `(seed, purpose, index)`: the weights of parameter `i`, the data order of
//! epoch `e`, the augmentation of step `s`. A resumed run therefore needs no
//! saved generator state: the stream of step `s` is the same whether the
//! process started at step 0 or at a checkpoint, and `state.json` only has
//! to name the seed and the step.
//!
//! Hand-written instead of `rand`: `rand`'s `StdRng` documents that its
//! algorithm may change between versions, and a dependency update must not
//! change which digits a checkpointed run trains on next.

/// What a stream is for; part of the key, so streams never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    Init = 1,
    Order = 2,
    Augment = 3,
}

/// SplitMix64 (Steele, Lea, Flood 2014): one u64 of state, passes BigCrush,
/// and trivially reproducible in any language.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub fn new(state: u64) -> Self {
        SplitMix64 { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` without modulo bias (Lemire's multiply-and-reject).
    /// `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Standard normal (Box-Muller, one value per call; the pair's second
    /// value is dropped so that a stream has no hidden cached state).
    pub fn normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the log is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// The stream for `(seed, purpose, index)`.
pub fn stream(seed: u64, purpose: Purpose, index: u64) -> SplitMix64 {
    // Each part goes through the full mixer, so nearby seeds, purposes and
    // indices give unrelated streams.
    let key = mix(mix(mix(seed ^ GOLDEN) ^ purpose as u64) ^ index);
    SplitMix64::new(key)
}

/// A uniformly random permutation of `0..n` (Fisher-Yates).
pub fn permutation(n: usize, rng: &mut SplitMix64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // From the reference C implementation seeded with 1234567.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        assert_eq!(r.next_u64(), 9817491932198370423);
    }

    #[test]
    fn streams_are_keyed_and_repeatable() {
        let a: Vec<u64> = (0..4)
            .scan(stream(7, Purpose::Order, 3), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(stream(7, Purpose::Order, 3), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        for other in [
            stream(8, Purpose::Order, 3),
            stream(7, Purpose::Augment, 3),
            stream(7, Purpose::Order, 4),
        ] {
            let mut other = other;
            assert_ne!(other.next_u64(), a[0]);
        }
    }

    #[test]
    fn permutation_is_a_permutation_and_below_is_in_range() {
        let mut r = stream(1, Purpose::Order, 0);
        let mut p = permutation(1000, &mut r);
        assert_ne!(p, (0..1000).collect::<Vec<u32>>(), "shuffled");
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<u32>>());
        for n in [1u64, 2, 3, 7, 1 << 40] {
            for _ in 0..100 {
                assert!(r.below(n) < n);
            }
        }
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = stream(3, Purpose::Init, 0);
        let xs: Vec<f64> = (0..20_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
        assert!(xs.iter().all(|x| x.is_finite()));
    }
}
