//! Policy and value losses (paper Sections 2–3) and their aggregation.
//!
//! Every clipped loss is written as `keep · (unclipped term) + (1 − keep) · detach(clipped value)`
//! where `keep` is 1 exactly where the clipped objective still has a gradient. The value is the
//! same as the textbook min/max/clamp form, but the gradient is exact and explicit: autograd of
//! `min`/`max`/`clamp` splits the gradient at ties, and "exactly zero outside [−α, α]" is the
//! property ACPO is about.

use candle_core::{DType, Result, Tensor, D};

use super::check_same_shape;
use crate::algo::method::{AlgorithmKind, LossAggMode, PolicyClip};

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

/// Token-level statistics of a policy-loss call, as masked means over its valid tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PolicyStats {
    /// Valid tokens these means are over (the weight for merging micro-batches).
    pub tokens: f64,
    /// Mean of log π_old − log π (after the ±20 clamp), verl's `ppo_kl`.
    pub ppo_kl: f64,
    /// Ratio clip: fraction where the clipped term is active (PPO types; 0 for -AC).
    pub pg_clipfrac: f64,
    /// Ratio clip: fraction where the dual clip (Â < 0) is active (PPO types; 0 for -AC).
    pub pg_clipfrac_lower: f64,
    /// ACPO: fraction with r·Â > α (0 for ratio clipping).
    pub acpo_clipfrac_upper: f64,
    /// ACPO: fraction with r·Â < −α (0 for ratio clipping).
    pub acpo_clipfrac_lower: f64,
    /// Mean of r·Â over valid tokens.
    pub ratio_adv_mean: f64,
    /// Max of |r·Â| over valid tokens.
    pub ratio_adv_abs_max: f64,
    /// Both rules on the same tokens, whichever trains ([`rule_disagreement`]): the fraction
    /// where the ratio clip zeroes the gradient and ACPO's keeps it ...
    pub disagree_ratio_zeroes: f64,
    /// ... and where ACPO's zeroes it and the ratio clip keeps it.
    pub disagree_acpo_zeroes: f64,
}

impl PolicyStats {
    /// Token-weighted combination of micro-batch statistics (max for the abs-max).
    pub fn merge(&self, other: &PolicyStats) -> PolicyStats {
        let n = self.tokens + other.tokens;
        if n == 0.0 {
            return PolicyStats::default();
        }
        let w = |a: f64, b: f64| (a * self.tokens + b * other.tokens) / n;
        PolicyStats {
            tokens: n,
            ppo_kl: w(self.ppo_kl, other.ppo_kl),
            pg_clipfrac: w(self.pg_clipfrac, other.pg_clipfrac),
            pg_clipfrac_lower: w(self.pg_clipfrac_lower, other.pg_clipfrac_lower),
            acpo_clipfrac_upper: w(self.acpo_clipfrac_upper, other.acpo_clipfrac_upper),
            acpo_clipfrac_lower: w(self.acpo_clipfrac_lower, other.acpo_clipfrac_lower),
            ratio_adv_mean: w(self.ratio_adv_mean, other.ratio_adv_mean),
            ratio_adv_abs_max: self.ratio_adv_abs_max.max(other.ratio_adv_abs_max),
            disagree_ratio_zeroes: w(self.disagree_ratio_zeroes, other.disagree_ratio_zeroes),
            disagree_acpo_zeroes: w(self.disagree_acpo_zeroes, other.disagree_acpo_zeroes),
        }
    }
}

/// Bounds log π − log π_old before exponentiating, as verl does, so r stays finite.
pub(crate) const LOG_RATIO_BOUND: f64 = 20.0;

/// log r = clamp(log π − log π_old, ±20) and r = exp(log r), as verl computes them; `(B, T)`.
pub fn importance_ratio(log_prob: &Tensor, old_log_prob: &Tensor) -> Result<(Tensor, Tensor)> {
    let log_ratio = (log_prob - old_log_prob)?.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)?;
    let ratio = log_ratio.exp()?;
    Ok((log_ratio, ratio))
}

/// Policy loss for PPO/GRPO (ratio clipping) or PPO-AC/GRPO-AC (advantage clipping).
///
/// `log_prob` carries the gradient; `old_log_prob`, `advantages` are constants. With
/// r = exp(clamp(log π − log π_old, ±20)):
/// - Ratio clip (PPO, with dual clip c for Â < 0):
///   L = max(−Â·r, −Â·clamp(r, 1−ε_low, 1+ε_high)); for Â < 0, L = min(L, −Â·c).
/// - Advantage clip (ACPO, paper eq. 5): L = −clamp(r·Â, −α, α); no min with the unclipped
///   term and no ratio bound. ∂L/∂log π = −r·Â where |r·Â| ≤ α and exactly 0 elsewhere.
/// - CISPO, GSPO ([`cispo_loss`], [`gspo_loss`]) and no clip at all (L = −r·Â), issue #23.
pub fn policy_loss(
    clip: &PolicyClip,
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    response_mask: &Tensor,
    agg: &Aggregation,
) -> Result<PolicyLoss> {
    check_same_shape(
        response_mask,
        &[
            ("log_prob", log_prob),
            ("old_log_prob", old_log_prob),
            ("advantages", advantages),
        ],
    )?;
    let Prepared {
        mask,
        log_prob,
        old_log_prob,
        adv,
    } = prepare(log_prob, old_log_prob, advantages, response_mask)?;

    let (log_ratio, ratio) = importance_ratio(&log_prob, &old_log_prob)?;
    // (B, T) constant copies for the masks and clipped values.
    let ratio_c = ratio.detach();
    let ratio_adv = (&ratio * &adv)?;
    let ratio_adv_c = ratio_adv.detach();

    let (per_token, stats) = match *clip {
        PolicyClip::Cispo { eps_low, eps_high } => {
            cispo_loss(&log_prob, &ratio_c, &adv, &mask, eps_low, eps_high)?
        }
        PolicyClip::Gspo { eps_low, eps_high } => {
            gspo_loss(&log_prob, &old_log_prob, &adv, &mask, eps_low, eps_high)?
        }
        PolicyClip::Ratio { .. } | PolicyClip::Advantage { .. } | PolicyClip::Unclipped => {
            let unclipped = ratio_adv.neg()?; // −r·Â, carries the gradient
            let Clipped {
                keep,
                value: clipped_value,
                stats,
            } = clip_by(clip, &ratio_c, &adv, &ratio_adv_c, &mask)?;
            let per_token = ((&keep * &unclipped)? + ((1.0 - &keep)? * &clipped_value)?)?;
            (per_token, stats)
        }
    };
    // verl's `ppo_kl`: from the clamped log-ratio, except GSPO's (its own, unclamped).
    let ppo_kl = match clip {
        PolicyClip::Gspo { .. } => stats.ppo_kl,
        _ => masked_mean(&log_ratio.detach().neg()?, &mask)?,
    };
    let per_token = (per_token * &mask)?;
    let loss = agg.apply(&per_token, &mask)?;

    let tokens = mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    let abs_max = (ratio_adv_c.abs()? * &mask)?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()? as f64;
    let stats = PolicyStats {
        tokens,
        ppo_kl,
        ratio_adv_mean: masked_mean(&ratio_adv_c, &mask)?,
        ratio_adv_abs_max: abs_max,
        ..stats
    };
    Ok(PolicyLoss {
        loss,
        per_token,
        stats,
    })
}

/// A policy loss's inputs in f32: the mask, and the log-probs and advantages with padding
/// zeroed (it may hold anything, even NaN, which would leak through 0·NaN); only `log_prob`
/// keeps its graph.
struct Prepared {
    mask: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    adv: Tensor,
}

fn prepare(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    response_mask: &Tensor,
) -> Result<Prepared> {
    let mask = response_mask.to_dtype(DType::F32)?.detach();
    Ok(Prepared {
        log_prob: zero_padding(&log_prob.to_dtype(DType::F32)?, &mask)?,
        old_log_prob: zero_padding(&old_log_prob.to_dtype(DType::F32)?.detach(), &mask)?,
        adv: zero_padding(&advantages.to_dtype(DType::F32)?.detach(), &mask)?,
        mask,
    })
}

/// `rule` applied to constant r, Â and r·Â.
fn clip_by(
    rule: &PolicyClip,
    ratio: &Tensor,
    adv: &Tensor,
    ratio_adv: &Tensor,
    mask: &Tensor,
) -> Result<Clipped> {
    match *rule {
        PolicyClip::Ratio {
            eps_low,
            eps_high,
            dual_clip_c,
        } => ppo_clip(ratio, adv, mask, eps_low, eps_high, dual_clip_c),
        PolicyClip::Advantage { alpha } => acpo_clip(ratio_adv, mask, alpha),
        PolicyClip::Unclipped => Ok(Clipped {
            keep: ratio.ones_like()?,
            value: ratio.zeros_like()?,
            stats: PolicyStats::default(),
        }),
        PolicyClip::Cispo { .. } | PolicyClip::Gspo { .. } => candle_core::bail!(
            "{rule:?} does not keep or drop −r·Â per token: policy_loss computes it apart"
        ),
    }
}

/// Where a clip rule keeps the gradient, and the loss value where it does not.
#[derive(Debug, Clone)]
pub struct Clipped {
    /// 1 where the unclipped term −r·Â is the active one (its gradient flows), else 0; `(B, T)`.
    pub keep: Tensor,
    /// The (constant) loss value where `keep` is 0.
    pub value: Tensor,
    /// The rule's clip fractions (the other fields are filled by [`policy_loss`]).
    pub stats: PolicyStats,
}

/// PPO's ratio clip with dual clip (verl's `vanilla` loss): per token
/// L = max(−Â·r, −Â·clamp(r, 1−ε_low, 1+ε_high)), and for Â < 0, L = min(L, −Â·c).
/// `ratio` and `adv` are constants here; the gradient flows where −Â·r is the active term.
pub fn ppo_clip(
    ratio: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
    dual_clip_c: f64,
) -> Result<Clipped> {
    let loss1 = (ratio * adv)?.neg()?;
    let loss2 = (ratio.clamp(1.0 - eps_low, 1.0 + eps_high)? * adv)?.neg()?;
    let clip1 = loss1.maximum(&loss2)?;
    let loss3 = (adv * (-dual_clip_c))?;
    let negative_cond = adv.lt(0.0)?;
    let negative = negative_cond.to_dtype(DType::F32)?;
    let dual_active = (clip1.gt(&loss3)?.to_dtype(DType::F32)? * &negative)?;
    let ratio_clipped = loss2.gt(&loss1)?.to_dtype(DType::F32)?;
    // Gradient flows only where the unclipped term is the active one and the dual clip
    // is not: keep = (loss1 ≥ loss2) ∧ ¬dual.
    let keep = ((1.0 - &ratio_clipped)? * (1.0 - &dual_active)?)?;
    let value = negative_cond.where_cond(&clip1.minimum(&loss3)?, &clip1)?;
    let stats = PolicyStats {
        pg_clipfrac: masked_mean(&ratio_clipped, mask)?,
        pg_clipfrac_lower: masked_mean(&dual_active, mask)?,
        ..PolicyStats::default()
    };
    Ok(Clipped { keep, value, stats })
}

/// ACPO's advantage clip (paper eq. 5): L = −clamp(r·Â, −α, α) per token, no ratio bound and
/// no min with the unclipped term, so ∂L/∂log π = −r·Â where |r·Â| ≤ α and exactly 0
/// elsewhere. `ratio_adv` (r·Â) is a constant here.
pub fn acpo_clip(ratio_adv: &Tensor, mask: &Tensor, alpha: f64) -> Result<Clipped> {
    let above = ratio_adv.gt(alpha)?.to_dtype(DType::F32)?;
    let below = ratio_adv.lt(-alpha)?.to_dtype(DType::F32)?;
    let keep = ((1.0 - &above)? - &below)?;
    let value = ratio_adv.clamp(-alpha, alpha)?.neg()?;
    let stats = PolicyStats {
        acpo_clipfrac_upper: masked_mean(&above, mask)?,
        acpo_clipfrac_lower: masked_mean(&below, mask)?,
        ..PolicyStats::default()
    };
    Ok(Clipped { keep, value, stats })
}

/// CISPO (verl's `cispo`, MiniMax-M1): L = −sg(clamp(r, 1−ε_low, 1+ε_high))·Â·log π per
/// token. The clipped weight is detached, so every token keeps a gradient, −clamp(r)·Â: the
/// clip bounds its size and never zeroes it. The clip fraction is verl's, the share of tokens
/// with r outside the bounds. Returns the per-token loss (before masking) and the statistics.
pub fn cispo_loss(
    log_prob: &Tensor,
    ratio: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
) -> Result<(Tensor, PolicyStats)> {
    let weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)?;
    let clipped = ratio.ne(&weight)?.to_dtype(DType::F32)?;
    let per_token = ((&weight * adv)?.neg()? * log_prob)?;
    let stats = PolicyStats {
        pg_clipfrac: masked_mean(&clipped, mask)?,
        ..PolicyStats::default()
    };
    Ok((per_token, stats))
}

/// GSPO (verl's `gspo`, Zheng et al. 2025): the sequence-level ratio
/// s_i = exp(Σ_t (log π − log π_old) / |y_i|), at token t written sg(s_i)·π_t/sg(π_t) so that
/// its value is s_i and its gradient flows through the token's own log π_t, then PPO's clip:
/// L = max(−Â·s, −Â·clamp(s, 1−ε_low, 1+ε_high)), no dual clip. As in verl, log s is capped at
/// 10 (no gradient there) and `ppo_kl` is the token mean of log π_old − log π without the
/// ±20 clamp; the clip fraction is the share of tokens where the clipped term is the larger.
pub fn gspo_loss(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
) -> Result<(Tensor, PolicyStats)> {
    let diff = ((log_prob.detach() - old_log_prob)? * mask)?;
    let lengths = mask.sum_keepdim(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
    let seq = diff.sum_keepdim(D::Minus1)?.div(&lengths)?; // (B, 1), constant
    const LOG_CAP: f64 = 10.0;
    let free = seq.le(LOG_CAP)?.to_dtype(DType::F32)?;
    let own = (log_prob - log_prob.detach())?.broadcast_mul(&free)?; // value 0, gradient 1
    let s = own
        .broadcast_add(&seq.clamp(f64::NEG_INFINITY, LOG_CAP)?)?
        .exp()?;
    let unclipped = (&s * adv)?.neg()?;
    let unclipped_c = unclipped.detach();
    let clipped_value = (s.detach().clamp(1.0 - eps_low, 1.0 + eps_high)? * adv)?.neg()?;
    let clipped = clipped_value.gt(&unclipped_c)?.to_dtype(DType::F32)?;
    let per_token = (((1.0 - &clipped)? * &unclipped)? + (&clipped * &clipped_value)?)?;
    let stats = PolicyStats {
        pg_clipfrac: masked_mean(&clipped, mask)?,
        ppo_kl: masked_mean(&diff.neg()?, mask)?,
        ..PolicyStats::default()
    };
    Ok((per_token, stats))
}

/// The two rules whose disagreement the regime diagnostics count on every batch (issue #22),
/// as (ratio clip, ACPO's clip): the run's own rule with the other family's at the paper's
/// values when it trains with one of them, the paper's pair for its family when it trains with
/// neither (CISPO, GSPO, unclipped).
pub fn compared_rules(kind: AlgorithmKind, clip: &PolicyClip) -> (PolicyClip, PolicyClip) {
    match clip {
        PolicyClip::Ratio { .. } => (*clip, rival_rule(kind)),
        PolicyClip::Advantage { .. } => (rival_rule(kind), *clip),
        PolicyClip::Cispo { .. } | PolicyClip::Gspo { .. } | PolicyClip::Unclipped => {
            let (base, ac) = if kind.is_ppo_type() {
                (AlgorithmKind::Ppo, AlgorithmKind::PpoAc)
            } else {
                (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc)
            };
            (rival_rule(ac), rival_rule(base))
        }
    }
}

/// The other family's rule at the paper's values (appendix table), for the diagnostics only:
/// PPO's ratio clip (ε 0.2 / 0.2) beside PPO-AC's α = 3, GRPO's (ε 0.2 / 0.28) beside
/// GRPO-AC's α = 2, dual clip 3. `kind` trains with its own manifest values; this is the rule
/// it is compared with.
pub fn rival_rule(kind: AlgorithmKind) -> PolicyClip {
    match kind {
        AlgorithmKind::Ppo => PolicyClip::Advantage { alpha: 3.0 },
        AlgorithmKind::Grpo => PolicyClip::Advantage { alpha: 2.0 },
        AlgorithmKind::PpoAc => PolicyClip::Ratio {
            eps_low: 0.2,
            eps_high: 0.2,
            dual_clip_c: 3.0,
        },
        AlgorithmKind::GrpoAc => PolicyClip::Ratio {
            eps_low: 0.2,
            eps_high: 0.28,
            dual_clip_c: 3.0,
        },
    }
}

/// Where the ratio clip and ACPO's advantage clip disagree on the tokens of a batch (issue
/// #22's regime diagnostic): the fractions of valid tokens where the ratio rule zeroes the
/// gradient and ACPO's keeps it, and the reverse. `a` and `b` are the two rules, one of each
/// kind, in either order; `log_prob`, `old_log_prob`, `advantages` and `mask` as for
/// [`policy_loss`] (constants here).
pub fn rule_disagreement(
    a: &PolicyClip,
    b: &PolicyClip,
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    response_mask: &Tensor,
) -> Result<(f64, f64)> {
    let Prepared {
        mask,
        log_prob,
        old_log_prob,
        adv,
    } = prepare(&log_prob.detach(), old_log_prob, advantages, response_mask)?;
    let (_, ratio) = importance_ratio(&log_prob, &old_log_prob)?;
    let ratio_adv = (&ratio * &adv)?;
    let keep = |rule: &PolicyClip| {
        Ok::<_, candle_core::Error>(clip_by(rule, &ratio, &adv, &ratio_adv, &mask)?.keep)
    };
    let (ratio_rule, acpo_rule) = match (a, b) {
        (PolicyClip::Ratio { .. }, PolicyClip::Advantage { .. }) => (a, b),
        (PolicyClip::Advantage { .. }, PolicyClip::Ratio { .. }) => (b, a),
        _ => candle_core::bail!("rule_disagreement compares a ratio clip with an advantage clip"),
    };
    let (keep_ratio, keep_acpo) = (keep(ratio_rule)?, keep(acpo_rule)?);
    let ratio_zeroes = ((1.0 - &keep_ratio)? * &keep_acpo)?;
    let acpo_zeroes = ((1.0 - &keep_acpo)? * &keep_ratio)?;
    Ok((
        masked_mean(&ratio_zeroes, &mask)?,
        masked_mean(&acpo_zeroes, &mask)?,
    ))
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

/// `x` with padding positions replaced by 0 (gradient flows through valid positions only).
fn zero_padding(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    mask.ne(0.0)?.where_cond(x, &x.zeros_like()?)
}

/// Mean of `x` over valid tokens; 0 when there are none.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<f64> {
    let n = mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    if n == 0.0 {
        return Ok(0.0);
    }
    let s = (x * mask)?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    Ok(s / n)
}
