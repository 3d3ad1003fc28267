//! Wave membership: which devices a deployment moves in which wave.
//!
//! Devices are ordered by SHA-256 of `(seed, device id)`, so the order is the
//! same in every process and every release (unlike `DefaultHasher`, whose
//! output Rust does not promise to keep), and a retry with the same seed picks
//! the same devices first. Waves are cuts of that order.

use sha2::{Digest, Sha256};

use edgeloop_errors::{Error, Result};

pub use edgeloop_api::deployments::{Strategy, Waves};

/// Checks the strategy; the error names the offending field, e.g.
/// `strategy.waves[2]`.
pub fn validate_strategy(strategy: &Strategy) -> Result<()> {
    let at = |i: usize| format!("strategy.waves[{i}]");
    if strategy.waves.is_empty() {
        return Err(Error::bad_field(
            "strategy.waves",
            "at least one wave is required",
        ));
    }
    match &strategy.waves {
        Waves::Percent(p) => {
            for (i, &v) in p.iter().enumerate() {
                if !(1..=100).contains(&v) {
                    return Err(Error::bad_field(at(i), format!("{v}% is not in 1..=100")));
                }
                if i > 0 && v <= p[i - 1] {
                    return Err(Error::bad_field(
                        at(i),
                        format!(
                            "{v}% must be greater than the previous wave's {}%",
                            p[i - 1]
                        ),
                    ));
                }
            }
            let last = p.len() - 1;
            if p[last] != 100 {
                return Err(Error::bad_field(at(last), "the last wave must be 100%"));
            }
        }
        Waves::Count(c) => {
            for (i, &v) in c.iter().enumerate() {
                if v == 0 {
                    return Err(Error::bad_field(at(i), "a wave needs at least one device"));
                }
                if i > 0 && v <= c[i - 1] {
                    return Err(Error::bad_field(
                        at(i),
                        format!("{v} must be greater than the previous wave's {}", c[i - 1]),
                    ));
                }
            }
        }
    }
    if strategy.min_soak_seconds < 0 {
        return Err(Error::bad_field(
            "strategy.min_soak_seconds",
            "must not be negative",
        ));
    }
    // A wave that must soak longer than it may take can never pass.
    if strategy.wave_timeout_seconds <= strategy.min_soak_seconds {
        return Err(Error::bad_field(
            "strategy.wave_timeout_seconds",
            "must be greater than min_soak_seconds",
        ));
    }
    if strategy.rollback_timeout_seconds <= 0 {
        return Err(Error::bad_field(
            "strategy.rollback_timeout_seconds",
            "must be positive",
        ));
    }
    Ok(())
}

/// The stable rank of a device within a deployment. The seed is length
/// prefixed so `("ab", "c")` and `("a", "bc")` rank differently.
pub fn rank(seed: &str, device: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((seed.len() as u64).to_be_bytes());
    h.update(seed.as_bytes());
    h.update(device.as_bytes());
    h.finalize().into()
}

/// The devices in rollout order. Ties (practically impossible) fall back to
/// the id so the order is total.
pub fn order<'a>(seed: &str, devices: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = devices.into_iter().cloned().collect();
    out.sort_by_cached_key(|d| (rank(seed, d), d.clone()));
    out
}

/// The cumulative end index of each wave for a group of `n` devices.
pub fn wave_ends(waves: &Waves, n: usize) -> Vec<usize> {
    match waves {
        Waves::Percent(p) => p
            .iter()
            .map(|&pct| (n * pct as usize).div_ceil(100).min(n))
            .collect(),
        Waves::Count(c) => c
            .iter()
            .enumerate()
            .map(|(i, &k)| if i + 1 == c.len() { n } else { k.min(n) })
            .collect(),
    }
}

/// The members of each wave, in rollout order.
pub fn plan<'a>(
    seed: &str,
    devices: impl IntoIterator<Item = &'a String>,
    waves: &Waves,
) -> Vec<Vec<String>> {
    let ordered = order(seed, devices);
    let mut start = 0;
    wave_ends(waves, ordered.len())
        .into_iter()
        .map(|end| {
            let end = end.max(start);
            let wave = ordered[start..end].to_vec();
            start = end;
            wave
        })
        .collect()
}
