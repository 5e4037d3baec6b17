//! What each phase of a step hands the later ones (the module doc of [`super`] lists the
//! phases): the rollout, its rewards, the actor's and the critic's totals. One home, so the
//! phases (`step`, `update`, `probe`, `metrics`) import these and not each other.

use candle_core::Tensor;

use super::Result;
use crate::algo::clip::{Disagreement, PolicyStats};
use crate::rollout::Completion;

/// The step's prompts and the responses sampled for them.
pub struct Rollout {
    /// Training-problem index of each prompt.
    pub indices: Vec<usize>,
    /// Token ids of each prompt.
    pub prompts: Vec<Vec<u32>>,
    /// Response r answers prompt r / n.
    pub completions: Vec<Completion>,
}

/// The verifier's judgement of each response and its reward.
pub struct Rewards {
    pub correct: Vec<bool>,
    pub scores: Vec<f32>,
}

/// The actor's totals over a step's mini-batches.
#[derive(Debug, Clone, Default)]
pub struct ActorOutcome {
    /// Sum of the mini-batches' policy losses.
    pub pg_loss: f64,
    pub stats: PolicyStats,
    /// Where the ratio clip and ACPO's disagree, beside the clip statistics.
    pub disagreement: Disagreement,
    pub entropy: TokenEntropy,
    /// Gradient norm before clipping, per mini-batch.
    pub grad_norms: Vec<f64>,
    /// r and |r·Â| over the response tokens of the step's first mini-batch (on-policy) and of
    /// the later ones: how far off-policy the later updates are.
    pub first: Option<RatioQuantiles>,
    pub later: Option<RatioQuantiles>,
    /// The clip statistics of the later, off-policy mini-batches alone (a regime where the
    /// rules differ has the ratio clip acting there on >= 0.1 % of tokens), and the rules'
    /// disagreement.
    pub later_stats: PolicyStats,
    pub later_disagreement: Disagreement,
}

/// The policy's entropy summed over response tokens, and the tokens: the step's mean entropy
/// (`actor/entropy`) is their ratio.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenEntropy {
    pub sum: f64,
    pub tokens: f64,
}

impl TokenEntropy {
    /// Of the per-token entropy `(B, T)` over the valid tokens of `mask`.
    pub fn of(entropy: &Tensor, mask: &Tensor) -> Result<TokenEntropy> {
        let sum = (&entropy.detach() * mask)?.sum_all()?.to_scalar::<f32>()? as f64;
        let tokens = mask
            .sum_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
        Ok(TokenEntropy { sum, tokens })
    }

    pub fn add(&mut self, other: TokenEntropy) {
        self.sum += other.sum;
        self.tokens += other.tokens;
    }

    /// The mean entropy per token (0 for none).
    pub fn mean(&self) -> f64 {
        self.sum / self.tokens.max(1.0)
    }
}

/// Quantiles (nearest rank) of the importance ratio r and of |r·Â| over a set of tokens, as
/// each token's gradient is taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioQuantiles {
    pub ratio_p01: f64,
    pub ratio_p99: f64,
    pub ratio_adv_abs_p99: f64,
}

impl RatioQuantiles {
    /// From (r, |r·Â|) pairs; None for no token.
    pub fn of(values: &[(f32, f32)]) -> Option<RatioQuantiles> {
        if values.is_empty() {
            return None;
        }
        let sorted = |mut v: Vec<f32>| {
            v.sort_by(f32::total_cmp);
            v
        };
        let at = |v: &[f32], p: f64| {
            let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1] as f64
        };
        let r = sorted(values.iter().map(|x| x.0).collect());
        let ra = sorted(values.iter().map(|x| x.1).collect());
        Some(RatioQuantiles {
            ratio_p01: at(&r, 0.01),
            ratio_p99: at(&r, 0.99),
            ratio_adv_abs_p99: at(&ra, 0.99),
        })
    }
}

impl ActorOutcome {
    pub fn updates(&self) -> usize {
        self.grad_norms.len()
    }
}

/// The critic's totals over a step's mini-batches.
#[derive(Debug, Clone, Default)]
pub struct CriticOutcome {
    /// Sum of the mini-batches' value losses.
    pub vf_loss: f64,
    /// Σ clip fraction × tokens, and the tokens.
    pub vf_clipped_tokens: f64,
    pub vf_tokens: f64,
    pub grad_norms: Vec<f64>,
}
