//! Distances between a reference distribution and a window of live data,
//! on binned counts (the agents' sketches use the manifest's reference bin
//! edges, so bins line up). Pure functions; every input is checked, and a
//! distribution that cannot be compared is an error, never NaN.

/// Why two distributions could not be compared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    #[error("the distributions have {reference} and {window} bins")]
    BinMismatch { reference: usize, window: usize },
    #[error("the {which} distribution is empty")]
    Empty { which: &'static str },
    #[error("the {which} distribution has a negative or non-finite weight")]
    BadWeight { which: &'static str },
}

/// Floor for a bin's share in PSI, so an empty bin on one side gives a
/// large finite term instead of infinity (the usual smoothing).
pub const PSI_EPSILON: f64 = 1e-4;

fn shares(weights: &[f64], which: &'static str) -> Result<Vec<f64>, StatsError> {
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return Err(StatsError::BadWeight { which });
    }
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return Err(StatsError::Empty { which });
    }
    Ok(weights.iter().map(|w| w / total).collect())
}

fn paired(reference: &[f64], window: &[f64]) -> Result<(Vec<f64>, Vec<f64>), StatsError> {
    if reference.len() != window.len() {
        return Err(StatsError::BinMismatch {
            reference: reference.len(),
            window: window.len(),
        });
    }
    Ok((shares(reference, "reference")?, shares(window, "window")?))
}

/// Population stability index: `Σ (w − r) · ln(w / r)` over bins, with both
/// shares floored at [`PSI_EPSILON`]. Rule of thumb: < 0.1 stable, 0.1–0.2
/// watch, > 0.2 act.
pub fn psi(reference: &[f64], window: &[f64]) -> Result<f64, StatsError> {
    let (r, w) = paired(reference, window)?;
    Ok(r.iter()
        .zip(&w)
        .map(|(r, w)| {
            let (r, w) = (r.max(PSI_EPSILON), w.max(PSI_EPSILON));
            (w - r) * (w / r).ln()
        })
        .sum())
}

/// Jensen–Shannon distance (the square root of the divergence, base 2):
/// 0 for identical distributions, 1 for disjoint ones. A metric, and
/// defined even where one side has empty bins.
pub fn js_distance(reference: &[f64], window: &[f64]) -> Result<f64, StatsError> {
    let (p, q) = paired(reference, window)?;
    let kl = |a: &[f64], m: &[f64]| -> f64 {
        a.iter()
            .zip(m)
            .filter(|(a, _)| **a > 0.0)
            .map(|(a, m)| a * (a / m).log2())
            .sum()
    };
    let m: Vec<f64> = p.iter().zip(&q).map(|(p, q)| (p + q) / 2.0).collect();
    let divergence = (kl(&p, &m) + kl(&q, &m)) / 2.0;
    // Rounding can leave a tiny negative divergence for equal inputs.
    Ok(divergence.clamp(0.0, 1.0).sqrt())
}

/// The two-sample Kolmogorov–Smirnov test on binned counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KsTest {
    /// The largest gap between the two cumulative distributions, at bin
    /// edges (on binned data this is a lower bound of the exact statistic).
    pub statistic: f64,
    /// The asymptotic p-value for the sample sizes.
    pub p_value: f64,
}

/// KS on counts: the sample sizes are the counts' totals.
pub fn ks_test(reference: &[u64], window: &[u64]) -> Result<KsTest, StatsError> {
    let to_f = |c: &[u64]| c.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let (r, w) = paired(&to_f(reference), &to_f(window))?;
    let (mut cr, mut cw, mut d) = (0.0f64, 0.0f64, 0.0f64);
    for (r, w) in r.iter().zip(&w) {
        cr += r;
        cw += w;
        d = d.max((cr - cw).abs());
    }
    // In floating point: device-reported counts may total past `u64::MAX`.
    let total = |c: &[u64]| c.iter().map(|&v| v as f64).sum::<f64>();
    let (n, m) = (total(reference), total(window));
    let effective = n * m / (n + m);
    Ok(KsTest {
        statistic: d,
        p_value: kolmogorov_q((effective.sqrt() + 0.12 + 0.11 / effective.sqrt()) * d),
    })
}

/// `Q_KS(λ) = 2 Σ_{j≥1} (−1)^{j−1} e^{−2 j² λ²}`, the Kolmogorov
/// distribution's survival function (Numerical Recipes' `probks`).
fn kolmogorov_q(lambda: f64) -> f64 {
    if lambda < 1e-3 {
        return 1.0;
    }
    let mut sum = 0.0;
    let mut sign = 1.0;
    let mut previous_term = 0.0f64;
    for j in 1..=100 {
        let term = sign * 2.0 * (-2.0 * f64::from(j * j) * lambda * lambda).exp();
        sum += term;
        if term.abs() <= 1e-10 * sum.abs() || term.abs() <= 1e-8 * previous_term.abs() {
            return sum.clamp(0.0, 1.0);
        }
        previous_term = term;
        sign = -sign;
    }
    // Did not converge: only for tiny λ, where the answer is 1.
    1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn psi_table() {
        // (reference, window, expected PSI), computed by hand.
        let cases: &[(&[f64], &[f64], f64)] = &[
            (&[1.0, 1.0], &[1.0, 1.0], 0.0),
            (&[50.0, 50.0], &[5.0, 5.0], 0.0),
            // (0.6-0.5)ln(1.2) + (0.4-0.5)ln(0.8) = 0.040546
            (&[1.0, 1.0], &[0.6, 0.4], 0.040_546_5),
            // (0.9-0.5)ln(1.8) + (0.1-0.5)ln(0.2) = 0.878890
            (&[1.0, 1.0], &[0.9, 0.1], 0.878_889_9),
        ];
        for (r, w, want) in cases {
            let got = psi(r, w).unwrap();
            assert!(close(got, *want, 1e-6), "{r:?} {w:?}: {got} vs {want}");
        }
        // An empty bin is smoothed, not infinite.
        let got = psi(&[1.0, 0.0], &[0.5, 0.5]).unwrap();
        assert!(got.is_finite() && got > 2.0, "{got}");
    }

    #[test]
    fn js_distance_table() {
        assert_eq!(js_distance(&[1.0, 2.0], &[2.0, 4.0]).unwrap(), 0.0);
        assert!(close(
            js_distance(&[1.0, 0.0], &[0.0, 1.0]).unwrap(),
            1.0,
            1e-12
        ));
        // p = (0.5, 0.5), q = (1, 0): JSD = 0.311278 bits.
        let got = js_distance(&[1.0, 1.0], &[1.0, 0.0]).unwrap();
        assert!(close(got, 0.311_278_f64.sqrt(), 1e-5), "{got}");
        // Symmetric.
        let (a, b) = ([3.0, 1.0, 6.0], [1.0, 5.0, 4.0]);
        assert_eq!(js_distance(&a, &b).unwrap(), js_distance(&b, &a).unwrap());
    }

    #[test]
    fn ks_table() {
        // Identical large samples: no evidence of a difference.
        let t = ks_test(&[100, 200, 300], &[100, 200, 300]).unwrap();
        assert_eq!(t.statistic, 0.0);
        assert_eq!(t.p_value, 1.0);
        // A shifted distribution with large samples: D = 0.5, p tiny.
        let t = ks_test(&[500, 500, 0], &[0, 500, 500]).unwrap();
        assert!(close(t.statistic, 0.5, 1e-12));
        assert!(t.p_value < 1e-10, "{t:?}");
        // The same shape with 10 samples a side is not significant.
        let t = ks_test(&[5, 5, 0], &[0, 5, 5]).unwrap();
        assert!(close(t.statistic, 0.5, 1e-12));
        assert!(t.p_value > 0.05, "{t:?}");
        // Known value: λ = 1.0 gives Q = 0.26999967.
        assert!(close(kolmogorov_q(1.0), 0.269_999_67, 1e-7));
    }

    #[test]
    fn refusals_name_the_problem() {
        assert_eq!(
            psi(&[1.0], &[1.0, 2.0]),
            Err(StatsError::BinMismatch {
                reference: 1,
                window: 2
            })
        );
        assert_eq!(
            js_distance(&[0.0, 0.0], &[1.0, 1.0]),
            Err(StatsError::Empty { which: "reference" })
        );
        assert_eq!(
            psi(&[1.0, f64::NAN], &[1.0, 1.0]),
            Err(StatsError::BadWeight { which: "reference" })
        );
        assert_eq!(
            ks_test(&[1, 2], &[0, 0]),
            Err(StatsError::Empty { which: "window" })
        );
    }

    proptest::proptest! {
        #[test]
        fn distances_are_finite_and_in_range(
            r in proptest::collection::vec(0u32..1000, 1..20),
            w in proptest::collection::vec(0u32..1000, 1..20),
        ) {
            let n = r.len().min(w.len());
            let (r, w) = (&r[..n], &w[..n]);
            let rf: Vec<f64> = r.iter().map(|&v| f64::from(v)).collect();
            let wf: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
            let ru: Vec<u64> = r.iter().map(|&v| u64::from(v)).collect();
            let wu: Vec<u64> = w.iter().map(|&v| u64::from(v)).collect();
            if let Ok(p) = psi(&rf, &wf) {
                proptest::prop_assert!(p.is_finite() && p >= -1e-12);
            }
            if let Ok(j) = js_distance(&rf, &wf) {
                proptest::prop_assert!((0.0..=1.0).contains(&j));
            }
            if let Ok(t) = ks_test(&ru, &wu) {
                proptest::prop_assert!((0.0..=1.0 + 1e-12).contains(&t.statistic));
                proptest::prop_assert!((0.0..=1.0).contains(&t.p_value));
            }
        }
    }
}
