//! The tests the verdict stands on, each exact or with its approximation stated: a paired
//! label-swap test, Holm's step-down correction, a fixed-effect pooled estimate with Cochran's
//! heterogeneity test, and the χ² tail that test needs.
//!
//! Every test here is fair under its null: when the two arms of each pair are exchangeable, it
//! rejects at 5 % in at most 5 % of trials (`report::verdict`'s calibration tests check that on
//! arms the same by construction).

/// The exact two-sided paired label-swap (sign-flip permutation) test of `gaps`, one per seed:
/// the gap is what seed's baseline arm minus its -AC arm measured, so swapping the two runs'
/// labels within a seed flips its sign. Under the null (the runs of a seed exchangeable) every
/// one of the 2ⁿ sign patterns is equally likely; the p-value is the share whose |Σ| reaches
/// the observed |Σ|. Computed exactly by counting the sums' distribution over integer gaps
/// (divided by their common divisor first), so any number of seeds costs O(n·Σ|gap|) not 2ⁿ.
/// None when every gap is 0 (the data carry no information on the direction).
pub fn label_swap_test(gaps: &[i64]) -> Option<f64> {
    let abs: Vec<u64> = gaps
        .iter()
        .map(|g| g.unsigned_abs())
        .filter(|&g| g > 0)
        .collect();
    let divisor = abs.iter().copied().fold(0, gcd);
    if divisor == 0 {
        return None;
    }
    let units: Vec<usize> = abs.iter().map(|&g| (g / divisor) as usize).collect();
    let total: usize = units.iter().sum();
    let observed = gaps.iter().sum::<i64>().unsigned_abs() / divisor;
    // Above a million units the exact count would take longer than it is worth: the normal
    // approximation of the sign-flip distribution (mean 0, variance Σ gap²), with continuity.
    if total > 1_000_000 {
        let var: f64 = units.iter().map(|&u| (u as f64).powi(2)).sum();
        let z = (observed as f64 - 0.5).max(0.0) / var.sqrt();
        return Some((2.0 * normal_upper(z)).min(1.0));
    }
    // counts[s] = the number of sign patterns whose sum is s − total
    let mut counts = vec![0f64; 2 * total + 1];
    counts[total] = 1.0;
    let mut reach = 0;
    for &u in &units {
        let mut next = vec![0f64; 2 * total + 1];
        for s in (total - reach)..=(total + reach) {
            let c = counts[s];
            if c != 0.0 {
                next[s - u] += c;
                next[s + u] += c;
            }
        }
        counts = next;
        reach += u;
    }
    let at_least: f64 = counts
        .iter()
        .enumerate()
        .filter(|(s, _)| s.abs_diff(total) as u64 >= observed)
        .map(|(_, c)| c)
        .sum();
    Some((at_least / 2f64.powi(units.len() as i32)).min(1.0))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Holm's step-down adjustment of a family's p-values (Holm 1979): the i-th smallest of m is
/// multiplied by m − i + 1, then made non-decreasing; a test without a p-value is left out of
/// the family and stays None. Rejecting where the adjusted p < α keeps the family-wise error
/// rate at α under any dependence between the tests.
pub fn holm(ps: &[Option<f64>]) -> Vec<Option<f64>> {
    let mut order: Vec<(usize, f64)> = ps
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.map(|p| (i, p)))
        .collect();
    order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let m = order.len();
    let mut out = vec![None; ps.len()];
    let mut running: f64 = 0.0;
    for (rank, (i, p)) in order.into_iter().enumerate() {
        running = running.max(((m - rank) as f64 * p).min(1.0));
        out[i] = Some(running);
    }
    out
}

/// One estimate with its standard error, for pooling (a pair's mean paired difference).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub mean: f64,
    pub se: f64,
}

/// A fixed-effect (inverse-variance) pooled estimate over several pairs, with Cochran's Q test of
/// whether they share one effect.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pooled {
    pub k: usize,
    pub mean: f64,
    pub se: f64,
    /// Cochran's Q = Σ wᵢ(mᵢ − m̄)², wᵢ = 1/seᵢ², and its χ² tail with k − 1 degrees of freedom.
    pub q: f64,
    pub q_p: Option<f64>,
}

impl Pooled {
    /// The pooled estimate of `estimates` (those with a positive, finite standard error); None
    /// when none has one.
    pub fn of(estimates: &[Estimate]) -> Option<Pooled> {
        let used: Vec<(f64, f64)> = estimates
            .iter()
            .filter(|e| e.se.is_finite() && e.se > 0.0 && e.mean.is_finite())
            .map(|e| (e.mean, 1.0 / (e.se * e.se)))
            .collect();
        if used.is_empty() {
            return None;
        }
        let w: f64 = used.iter().map(|(_, w)| w).sum();
        let mean = used.iter().map(|(m, w)| m * w).sum::<f64>() / w;
        let q: f64 = used.iter().map(|(m, w)| w * (m - mean).powi(2)).sum();
        let k = used.len();
        Some(Pooled {
            k,
            mean,
            se: w.sqrt().recip(),
            q,
            q_p: (k > 1).then(|| chi2_upper(q, (k - 1) as f64)),
        })
    }

    /// The two-sided 95 % interval, normal (the pairs' own t intervals are wider; with 20 or
    /// more seeds each, the difference is under 5 %).
    pub fn interval(&self) -> (f64, f64) {
        let h = 1.959_964 * self.se;
        (self.mean - h, self.mean + h)
    }
}

/// P(Z > z) for a standard normal Z.
pub fn normal_upper(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The complementary error function: the regularised upper incomplete gamma Q(½, x²) for
/// x ≥ 0, reflected for x < 0.
fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        2.0 - erfc(-x)
    } else {
        upper_gamma(0.5, x * x)
    }
}

/// P(X > x) for X ~ χ²(df): the regularised upper incomplete gamma Q(df/2, x/2).
pub fn chi2_upper(x: f64, df: f64) -> f64 {
    if x <= 0.0 {
        1.0
    } else {
        upper_gamma(df / 2.0, x / 2.0)
    }
}

/// Q(a, x) = Γ(a, x)/Γ(a): the series of P for x < a + 1, Lentz's continued fraction for Q
/// beyond (Numerical Recipes §6.2), each to 1e-15 relative.
fn upper_gamma(a: f64, x: f64) -> f64 {
    let front = (a * x.ln() - x - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            n += 1.0;
            term *= x / n;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        (1.0 - sum * front).clamp(0.0, 1.0)
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let step = d * c;
            h *= step;
            if (step - 1.0).abs() < 1e-16 {
                break;
            }
        }
        (front * h).clamp(0.0, 1.0)
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9: about 15 significant digits).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // reflection: Γ(x)Γ(1 − x) = π / sin(πx)
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = G[1..]
        .iter()
        .enumerate()
        .fold(G[0], |s, (i, g)| s + g / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact p-value by listing all 2ⁿ sign patterns: the independent reference.
    fn by_enumeration(gaps: &[i64]) -> f64 {
        let n = gaps.len();
        let observed = gaps.iter().sum::<i64>().abs();
        let hits = (0..1u64 << n)
            .filter(|mask| {
                let s: i64 = (0..n)
                    .map(|i| {
                        if mask >> i & 1 == 1 {
                            -gaps[i]
                        } else {
                            gaps[i]
                        }
                    })
                    .sum();
                s.abs() >= observed
            })
            .count();
        hits as f64 / (1u64 << n) as f64
    }

    #[test]
    fn the_label_swap_test_equals_full_enumeration() {
        let cases: [&[i64]; 6] = [
            &[8, 8, 8, 8, 8],
            &[8, -4, 0, 12, 4, 4, -8, 16],
            &[-4, -4, -8, 0, 0, -12, 4, -4, -4, -8, 8],
            &[3, 5, -7, 11, 13, -2, 1, 1, 0, 6, -9, 4],
            &[0, 0, 24, 0],
            &[1, -1, 1, -1, 2, -2],
        ];
        for gaps in cases {
            let nonzero: Vec<i64> = gaps.iter().copied().filter(|&g| g != 0).collect();
            let p = label_swap_test(gaps).expect("a non-zero gap");
            assert!(
                (p - by_enumeration(&nonzero)).abs() < 1e-12,
                "{gaps:?}: {p}"
            );
        }
        // all five the same way: 2 of 32 patterns are as extreme
        assert_eq!(label_swap_test(&[8, 8, 8, 8, 8]), Some(2.0 / 32.0));
        assert_eq!(label_swap_test(&[0, 0, 0]), None);
        assert_eq!(label_swap_test(&[]), None);
        // the sign of the gaps does not change a two-sided p
        assert_eq!(label_swap_test(&[4, 8, -4]), label_swap_test(&[-4, -8, 4]));
    }

    #[test]
    fn holm_matches_the_textbook_example() {
        // p = 0.01, 0.04, 0.03, 0.005 (m = 4): sorted 0.005·4 = 0.02, 0.01·3 = 0.03,
        // 0.03·2 = 0.06, 0.04·1 = 0.04 → made monotone 0.06
        let adjusted = holm(&[Some(0.01), Some(0.04), Some(0.03), Some(0.005)]);
        let want = [0.03, 0.06, 0.06, 0.02];
        for (a, w) in adjusted.iter().zip(want) {
            assert!((a.expect("p") - w).abs() < 1e-12, "{adjusted:?}");
        }
        assert_eq!(holm(&[None, Some(0.5)]), vec![None, Some(0.5)]);
        assert_eq!(holm(&[Some(0.6), Some(0.7)]), vec![Some(1.0), Some(1.0)]);
    }

    #[test]
    fn chi2_and_normal_tails_match_the_tables() {
        // the 95th percentiles of χ²(1), χ²(2), χ²(3), χ²(7)
        for (x, df) in [
            (3.841_459, 1.0),
            (5.991_465, 2.0),
            (7.814_728, 3.0),
            (14.067_14, 7.0),
        ] {
            assert!((chi2_upper(x, df) - 0.05).abs() < 1e-6, "{x} {df}");
        }
        // far tails, both branches of the incomplete gamma
        assert!((chi2_upper(0.1, 3.0) - 0.991_837_9).abs() < 1e-6);
        assert!((chi2_upper(30.0, 2.0) - (-15f64).exp()).abs() < 1e-15);
        assert!((normal_upper(1.959_964) - 0.025).abs() < 1e-7);
        assert!((normal_upper(-1.0) - 0.841_344_746).abs() < 1e-8);
        assert!((normal_upper(0.0) - 0.5).abs() < 1e-15);
    }

    #[test]
    fn pooling_weights_by_inverse_variance() {
        let p = Pooled::of(&[
            Estimate { mean: 1.0, se: 1.0 },
            Estimate { mean: 4.0, se: 2.0 },
        ])
        .expect("pooled");
        // weights 1 and 1/4: mean (1 + 1) / 1.25 = 1.6, se 1/√1.25
        assert!((p.mean - 1.6).abs() < 1e-12);
        assert!((p.se - 1.25f64.sqrt().recip()).abs() < 1e-12);
        // Q = 1·0.36 + 0.25·5.76 = 1.8 on 1 degree of freedom
        assert!((p.q - 1.8).abs() < 1e-12);
        assert!((p.q_p.expect("k > 1") - chi2_upper(1.8, 1.0)).abs() < 1e-15);
        assert_eq!(Pooled::of(&[Estimate { mean: 1.0, se: 0.0 }]), None);
        let one = Pooled::of(&[Estimate { mean: 2.0, se: 0.5 }]).expect("one");
        assert_eq!((one.mean, one.q_p), (2.0, None));
    }
}
