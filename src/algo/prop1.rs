//! Proposition 1's quantities (paper Section 3): which tokens' gradients each clipping rule
//! retains, and the retention probabilities and gradient second moments of a batch's r·Â.
//! The trainer's diagnostics and the theory check (`acpo pmd`) both use these rules.

use candle_core::Tensor;

use super::clip::LOG_RATIO_BOUND;
use super::{check_same_shape, to_rows};
use candle_core::Result;

/// PPO's ratio clip retains a token's gradient unless its ratio left the trust region on the
/// side its advantage pushes: Â > 0 needs r ≤ 1+ε_high, Â < 0 needs r ≥ 1−ε_low. (Â = 0 has
/// no gradient and counts as not retained.)
pub fn ppo_retains(r: f64, a: f64, eps_low: f64, eps_high: f64) -> bool {
    (a > 0.0 && r <= 1.0 + eps_high) || (a < 0.0 && r >= 1.0 - eps_low)
}

/// ACPO's advantage clip retains a token's gradient where |r·Â| ≤ α (paper eq. 5).
pub fn acpo_retains(ratio_adv: f64, alpha: f64) -> bool {
    ratio_adv.abs() <= alpha
}

/// The gradient coefficients r·Â of a batch and the quantities of Proposition 1.
#[derive(Debug, Clone, PartialEq)]
pub struct CoefficientDiagnostics {
    /// r·Â of every valid token, row-major (for the tail histograms).
    pub values: Vec<f32>,
    pub mean: f64,
    pub abs_max: f64,
    /// P(|r·Â| ≤ α): the ACPO retention probability.
    pub retain_acpo: f64,
    /// P(Â > 0, r ≤ 1+ε_high or Â < 0, r ≥ 1−ε_low): the PPO retention probability.
    pub retain_ppo: f64,
    /// E[(r·Â)² · 1_ACPO]: the ACPO gradient second moment with ‖∇log π‖² ≡ 1.
    pub second_moment_acpo: f64,
    /// E[(r·Â)² · 1_PPO]: the PPO gradient second moment with ‖∇log π‖² ≡ 1.
    pub second_moment_ppo: f64,
}

/// Diagnostics of the gradient coefficients r·Â (paper Section 3, Proposition 1). They do not
/// depend on which objective is being trained, so both rules are evaluated on the same batch.
pub fn coefficient_diagnostics(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    response_mask: &Tensor,
    alpha: f64,
    eps_low: f64,
    eps_high: f64,
) -> Result<CoefficientDiagnostics> {
    check_same_shape(
        response_mask,
        &[
            ("log_prob", log_prob),
            ("old_log_prob", old_log_prob),
            ("advantages", advantages),
        ],
    )?;
    let lp = to_rows(log_prob)?;
    let old = to_rows(old_log_prob)?;
    let adv = to_rows(advantages)?;
    let mask = to_rows(response_mask)?;
    let mut values = Vec::new();
    let (mut sum, mut abs_max, mut keep_a, mut keep_p, mut m2_a, mut m2_p) =
        (0.0, 0f64, 0.0, 0.0, 0.0, 0.0);
    for b in 0..mask.len() {
        for t in 0..mask[b].len() {
            if mask[b][t] == 0.0 {
                continue;
            }
            let r = ((lp[b][t] - old[b][t]) as f64)
                .clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
                .exp();
            let a = adv[b][t] as f64;
            let ra = r * a;
            values.push(ra as f32);
            sum += ra;
            abs_max = abs_max.max(ra.abs());
            if acpo_retains(ra, alpha) {
                keep_a += 1.0;
                m2_a += ra * ra;
            }
            if ppo_retains(r, a, eps_low, eps_high) {
                keep_p += 1.0;
                m2_p += ra * ra;
            }
        }
    }
    let n = (values.len() as f64).max(1.0);
    Ok(CoefficientDiagnostics {
        mean: sum / n,
        abs_max,
        retain_acpo: keep_a / n,
        retain_ppo: keep_p / n,
        second_moment_acpo: m2_a / n,
        second_moment_ppo: m2_p / n,
        values,
    })
}
