//! The objectives' math: the one place it lives (docs/ARCHITECTURE.md). The trainer, and any CUDA kernel,
//! call these functions or are tested against them.
//!
//! All tensors are `(B, T)` over response tokens — B responses, T = the padded response length —
//! with a `response_mask` of 1.0 on valid tokens and 0.0 on padding. Padding never changes any
//! output: masked entries are ignored on input and written as 0 on output.
//!
//! - [`method`]: the paper's vocabulary of objectives — the four methods, how losses aggregate,
//!   how advantages are estimated — which manifests parse into ([`Algorithm`] with a rule of
//!   [`clip`]).
//! - [`advantage`]: GAE with batch whitening (PPO types) and group-normalised advantages (GRPO
//!   types), paper Section 2.
//! - [`clip`]: the clipping rules, each one's whole life: its declaration, its manifest fields
//!   and their checks, its per-token objective and gradient mask — PPO's ratio clip
//!   ([`clip::ppo_clip`]), ACPO's advantage clip ([`clip::acpo_clip`], paper eq. 5), and the
//!   family the paper's related work names: CISPO ([`clip::cispo_loss`]), GSPO
//!   ([`clip::gspo_loss`]) and the unclipped importance-sampling control —, which tokens it
//!   retains (Proposition 1), its metric names, its verl settings, and the rule-disagreement
//!   diagnostic.
//! - [`loss`]: the policy loss of a rule aggregated over a (micro-)batch, the entropy bonus, the
//!   clipped value loss.
//! - [`prop1`]: Proposition 1 — retention probabilities and gradient second moments of a
//!   batch's r·Â under the ratio clip and ACPO's.
//! - [`token`]: per-token log-probabilities and entropy from logits.
//!
//! The formulas follow verl (the framework the paper trained with) except where numbered here:
//! 1. A GRPO group of size 1 gets advantage 0; verl gives it s/(1 + ε).
//! 2. `token-mean` is an exact mean over every valid token of the *mini-batch*, also when the
//!    mini-batch is split into micro-batches; verl's legacy path averages micro-batch means,
//!    offered as `token-mean-microbatch`.
//! 3. `seq-mean-token-sum-norm` divides by a fixed horizon (the manifest's max response length)
//!    rather than by the padded width of the batch, so it does not depend on batch composition.
//! 4. Outputs at padding positions are 0 (verl leaves whatever the recursion produced there).
//! 5. `seq-mean-token-sum-norm` averages the per-response sums Σ_t loss / horizon over the
//!    mini-batch's responses. Older verl releases' `agg_loss` *sums* them — Σ_seq Σ_t loss /
//!    horizon, Dr. GRPO read literally — while its newer loss code divides by the global
//!    response count as we do. For a fixed mini-batch the two differ by that constant factor:
//!    AdamW's step is invariant to it except through ε and the gradient-norm clip.
//! 6. Where a clipped and an unclipped term tie exactly (r on a bound), the gradient is the
//!    unclipped term's (PPO, GSPO); torch's `maximum` splits it in half. A tie has measure zero.
//! 7. The unclipped control (−r·Â) is not a verl loss mode; verl has CISPO and GSPO as used here.

pub mod advantage;
pub mod clip;
pub mod loss;
pub mod method;
pub mod prop1;
pub mod token;

use candle_core::{DType, Result, Tensor};
use serde::Serialize;

/// A run's objective: the method, its clipping rule, how its advantages are estimated and how
/// its token losses are aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Algorithm {
    pub kind: method::AlgorithmKind,
    pub clip: clip::PolicyClip,
    pub advantage: method::AdvantageEstimator,
    pub loss_agg_mode: method::LossAggMode,
}

/// Host copy of a `(B, T)` f32 tensor, row-major.
pub(crate) fn to_rows(t: &Tensor) -> Result<Vec<Vec<f32>>> {
    t.to_dtype(DType::F32)?.to_vec2::<f32>()
}

/// A `(B, T)` f32 tensor from rows, on the device of `like`.
pub(crate) fn from_rows(rows: &[Vec<f32>], like: &Tensor) -> Result<Tensor> {
    let b = rows.len();
    let t = rows.first().map_or(0, Vec::len);
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (b, t), like.device())
}

/// Checks that every tensor has the `(B, T)` shape of the mask.
pub(crate) fn check_same_shape(mask: &Tensor, named: &[(&str, &Tensor)]) -> Result<()> {
    let want = mask.dims();
    if want.len() != 2 {
        candle_core::bail!("response_mask must be (B, T), got {:?}", want);
    }
    for (name, t) in named {
        if t.dims() != want {
            candle_core::bail!(
                "{name} has shape {:?}, expected (B, T) = {:?}",
                t.dims(),
                want
            );
        }
    }
    Ok(())
}

/// `x` with padding positions replaced by 0 (gradient flows through valid positions only).
pub(crate) fn zero_padding(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
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
