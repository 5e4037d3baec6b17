//! Per-token quantities from logits: log-probabilities of chosen tokens and policy entropy.
//!
//! Both work on any leading shape `(..., V)` and are differentiable. The model calls them on
//! chunks of the sequence so that a `(B, T, V)` tensor with V = 151,936 never exists whole.

use candle_core::{DType, Result, Tensor, D};

/// log-sum-exp over the vocabulary with a detached max shift: the shift is for range only, and
/// detaching it keeps the gradient the exact softmax (no max-selection path in the graph).
fn log_sum_exp(z: &Tensor) -> Result<Tensor> {
    let max = z.max_keepdim(D::Minus1)?.detach();
    let sum = z.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?;
    sum.log()? + max
}

/// Logits divided by the sampling temperature, in f32 (f64 stays f64).
fn scaled(logits: &Tensor, temperature: f64) -> Result<Tensor> {
    if temperature.is_nan() || temperature <= 0.0 {
        candle_core::bail!("temperature must be > 0 to score tokens, got {temperature}");
    }
    let z = match logits.dtype() {
        DType::F64 => logits.clone(),
        _ => logits.to_dtype(DType::F32)?,
    };
    if temperature == 1.0 {
        Ok(z)
    } else {
        z / temperature
    }
}

/// `log softmax(logits / T)[token]`; `logits` `(..., V)`, `tokens` `(...)` (u32) → `(...)`.
pub fn log_probs(logits: &Tensor, tokens: &Tensor, temperature: f64) -> Result<Tensor> {
    let z = scaled(logits, temperature)?;
    if crate::fused::fused_on_f32(&z) {
        // One pass forward and one backward instead of eight ops each (same math, below).
        return crate::fused::token_log_probs(&z, tokens);
    }
    log_probs_composed_scaled(&z, tokens)
}

/// [`log_probs`] from basic ops: the reference the fused CPU kernel is tested against.
pub fn log_probs_composed(logits: &Tensor, tokens: &Tensor, temperature: f64) -> Result<Tensor> {
    log_probs_composed_scaled(&scaled(logits, temperature)?, tokens)
}

fn log_probs_composed_scaled(z: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    let lse = log_sum_exp(z)?; // (..., 1)
    let chosen = z.gather(
        &tokens
            .to_dtype(DType::U32)?
            .unsqueeze(D::Minus1)?
            .contiguous()?,
        D::Minus1,
    )?;
    (chosen - lse)?.squeeze(D::Minus1)
}

/// Entropy of softmax(logits / T): `H = log Σ exp(s) − Σ softmax(s)·s` with `s = z − max z`.
///
/// The shift (detached: H is shift-invariant, so its gradient is unchanged) keeps both terms
/// O(log V) whatever the logits' scale. Unshifted, `logsumexp(z)` and `Σ p·z` are each as large
/// as the logits and nearly cancel, and `p = exp(z − lse)` carries an error of f32's epsilon
/// times |z| into a sum weighted by |z|: at logits of a few hundred the f32 entropy was off in
/// the second digit; shifted, the error grows only linearly with the scale.
pub fn entropy(logits: &Tensor, temperature: f64) -> Result<Tensor> {
    let z = scaled(logits, temperature)?;
    let max = z.max_keepdim(D::Minus1)?.detach();
    let s = z.broadcast_sub(&max)?; // ≤ 0, 0 at the argmax
    let lse = s.exp()?.sum_keepdim(D::Minus1)?.log()?; // in [0, log V]
    let p = s.broadcast_sub(&lse)?.exp()?;
    let expected_s = (p * &s)?.sum_keepdim(D::Minus1)?;
    (lse - expected_s)?.squeeze(D::Minus1)
}
