//! Proposition 1's quantities (paper Section 3): the retention probabilities and gradient
//! second moments of a batch's r·Â under PPO's ratio clip and ACPO's advantage clip, each rule
//! keeping a token as [`PolicyClip::retains`] says. The theory check (`acpo pmd`) asks the same
//! rules; the trainer's regime diagnostic compares the rules' gradient masks instead
//! ([`super::clip::ComparedRules`]).

use candle_core::Tensor;

use super::clip::{PolicyClip, LOG_RATIO_BOUND};
use super::{check_same_shape, to_rows};
use candle_core::Result;

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
/// depend on which objective is being trained, so both rules are evaluated on the same batch;
/// the ratio clip as the proposition states it, without verl's dual clip.
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
    let acpo = PolicyClip::Advantage { alpha };
    let ppo = PolicyClip::Ratio {
        eps_low,
        eps_high,
        dual_clip_c: f64::INFINITY,
    };
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
            if acpo.retains(r, a) {
                keep_a += 1.0;
                m2_a += ra * ra;
            }
            if ppo.retains(r, a) {
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
