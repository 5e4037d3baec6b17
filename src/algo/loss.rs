//! Policy and value losses (paper Sections 2–3) and their aggregation: the policy loss of a
//! clipping rule ([`super::clip`]) aggregated over a (micro-)batch, the entropy bonus taken
//! from it, and the critic's clipped value loss.

use candle_core::{DType, Result, Tensor, D};

use super::clip::{PolicyClip, PolicyStats, RuleTerms, Tokens};
use super::{check_same_shape, masked_mean, zero_padding};
use crate::algo::method::LossAggMode;

/// How per-token losses of one micro-batch are reduced so that summing the results over the
/// micro-batches of a mini-batch gives the mini-batch loss (gradient accumulation is a sum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregation {
    pub mode: LossAggMode,
    /// Valid tokens in the whole mini-batch.
    pub minibatch_tokens: f64,
    /// Responses in the whole mini-batch.
    pub minibatch_seqs: f64,
    /// Micro-batches the mini-batch is split into (used by `token-mean-microbatch` only).
    pub micro_batches: usize,
    /// Fixed token horizon for `seq-mean-token-sum-norm` (the max response length).
    pub horizon: f64,
}

impl Aggregation {
    /// Aggregation for micro-batches of the mini-batch whose mask is `minibatch_mask` `(B, T)`.
    pub fn new(
        mode: LossAggMode,
        minibatch_mask: &Tensor,
        micro_batches: usize,
        horizon: usize,
    ) -> Result<Self> {
        if micro_batches == 0 || horizon == 0 {
            candle_core::bail!("aggregation needs micro_batches ≥ 1 and horizon ≥ 1");
        }
        Ok(Aggregation {
            mode,
            minibatch_tokens: minibatch_mask
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?,
            minibatch_seqs: minibatch_mask.dim(0)? as f64,
            micro_batches,
            horizon: horizon as f64,
        })
    }

    /// Aggregation when the mini-batch is processed in one piece.
    pub fn whole(mode: LossAggMode, mask: &Tensor, horizon: usize) -> Result<Self> {
        Self::new(mode, mask, 1, horizon)
    }

    /// This micro-batch's share of the mini-batch loss; a scalar tensor.
    ///
    /// - `token-mean`: Σ loss·mask / (valid tokens of the mini-batch)
    /// - `token-mean-microbatch`: (Σ loss·mask / valid tokens of this micro-batch) / micro-batches
    /// - `seq-mean-token-sum`: Σ_seq (Σ_t loss·mask) / mini-batch responses
    /// - `seq-mean-token-mean`: Σ_seq (Σ_t loss·mask / |seq|) / mini-batch responses
    /// - `seq-mean-token-sum-norm`: Σ_seq (Σ_t loss·mask / horizon) / mini-batch responses
    pub fn apply(&self, per_token: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let masked = (per_token * mask)?;
        match self.mode {
            LossAggMode::TokenMean => masked.sum_all()? / self.minibatch_tokens.max(1.0),
            LossAggMode::TokenMeanMicrobatch => {
                let tokens = mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                masked.sum_all()? / (tokens.max(1.0) * self.micro_batches as f64)
            }
            LossAggMode::SeqMeanTokenSum => masked.sum_all()? / self.minibatch_seqs.max(1.0),
            LossAggMode::SeqMeanTokenMean => {
                // A row with no valid token contributes 0 rather than 0/0.
                let lengths = mask.sum(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
                masked.sum(D::Minus1)?.div(&lengths)?.sum_all()? / self.minibatch_seqs.max(1.0)
            }
            LossAggMode::SeqMeanTokenSumNorm => {
                masked.sum_all()? / (self.horizon * self.minibatch_seqs.max(1.0))
            }
        }
    }
}

/// The policy loss of one (micro-)batch.
#[derive(Debug, Clone)]
pub struct PolicyLoss {
    /// Aggregated loss (scalar) to call `backward` on.
    pub loss: Tensor,
    /// `(B, T)` per-token loss before aggregation (0 on padding).
    pub per_token: Tensor,
    pub stats: PolicyStats,
}

/// Policy loss for PPO/GRPO (ratio clipping) or PPO-AC/GRPO-AC (advantage clipping): the rule's
/// per-token objective ([`PolicyClip::terms`]) on the valid tokens, aggregated.
///
/// `log_prob` carries the gradient; `old_log_prob`, `advantages` are constants. With
/// r = exp(clamp(log π − log π_old, ±20)):
/// - Ratio clip (PPO, with dual clip c for Â < 0):
///   L = max(−Â·r, −Â·clamp(r, 1−ε_low, 1+ε_high)); for Â < 0, L = min(L, −Â·c).
/// - Advantage clip (ACPO, paper eq. 5): L = −clamp(r·Â, −α, α); no min with the unclipped
///   term and no ratio bound. ∂L/∂log π = −r·Â where |r·Â| ≤ α and exactly 0 elsewhere.
/// - CISPO, GSPO ([`super::clip::cispo_loss`], [`super::clip::gspo_loss`]) and no clip at all
///   (L = −r·Â), the related work's rules the clipping study sets beside ACPO's.
pub fn policy_loss(
    clip: &PolicyClip,
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    response_mask: &Tensor,
    agg: &Aggregation,
) -> Result<PolicyLoss> {
    let t = Tokens::new(log_prob, old_log_prob, advantages, response_mask)?;
    let RuleTerms {
        objective, stats, ..
    } = clip.terms(&t)?;
    let per_token = (objective * &t.mask)?;
    let loss = agg.apply(&per_token, &t.mask)?;
    let abs_max = (t.ratio_adv_c.abs()? * &t.mask)?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()? as f64;
    let stats = PolicyStats {
        tokens: t.count()?,
        ratio_adv_mean: masked_mean(&t.ratio_adv_c, &t.mask)?,
        ratio_adv_abs_max: abs_max,
        ..stats
    };
    Ok(PolicyLoss {
        loss,
        per_token,
        stats,
    })
}

/// The actor's loss: the policy loss minus the entropy bonus c_H · agg(H) (verl's
/// `entropy_coeff`; the entropy aggregated as the policy loss is), or the policy loss itself
/// when c_H is 0.
pub fn minus_entropy_bonus(
    policy_loss: &Tensor,
    entropy: &Tensor,
    response_mask: &Tensor,
    agg: &Aggregation,
    entropy_coeff: f64,
) -> Result<Tensor> {
    if entropy_coeff > 0.0 {
        policy_loss - (agg.apply(entropy, response_mask)? * entropy_coeff)?
    } else {
        Ok(policy_loss.clone())
    }
}

/// The clipped value loss of one (micro-)batch.
#[derive(Debug, Clone)]
pub struct ValueLoss {
    /// 0.5 · agg(max((V − R)², (clamp(V, V_old ± c) − R)²)); scalar.
    pub loss: Tensor,
    /// Fraction of valid tokens where the clipped error is the larger (verl's `vf_clipfrac`).
    pub clipfrac: f64,
    pub tokens: f64,
}

/// Value loss for the critic of the PPO types (verl's `compute_value_loss`).
pub fn value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    response_mask: &Tensor,
    cliprange_value: f64,
    agg: &Aggregation,
) -> Result<ValueLoss> {
    check_same_shape(
        response_mask,
        &[
            ("values", values),
            ("old_values", old_values),
            ("returns", returns),
        ],
    )?;
    let mask = response_mask.to_dtype(DType::F32)?.detach();
    let values = zero_padding(&values.to_dtype(DType::F32)?, &mask)?;
    let old = zero_padding(&old_values.to_dtype(DType::F32)?.detach(), &mask)?;
    let ret = zero_padding(&returns.to_dtype(DType::F32)?.detach(), &mask)?;

    let err1 = (&values - &ret)?.sqr()?; // carries the gradient
    let err1_c = err1.detach();
    let clipped = values
        .detach()
        .maximum(&(&old - cliprange_value)?)?
        .minimum(&(&old + cliprange_value)?)?;
    let err2_c = (clipped - &ret)?.sqr()?;
    // err2 > err1 only when V is outside V_old ± c, where the clipped term has no gradient.
    let clipped_active = err2_c.gt(&err1_c)?.to_dtype(DType::F32)?;
    let per_token = (((1.0 - &clipped_active)? * &err1)? + (&clipped_active * &err2_c)?)?;
    let loss = (agg.apply(&(per_token * &mask)?, &mask)? * 0.5)?;
    Ok(ValueLoss {
        loss,
        clipfrac: masked_mean(&clipped_active, &mask)?,
        tokens: mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?,
    })
}
