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

/// log softmax(logits / T)[token]; `logits` `(..., V)`, `tokens` `(...)` (u32) → `(...)`.
pub fn log_probs(logits: &Tensor, tokens: &Tensor, temperature: f64) -> Result<Tensor> {
    let z = scaled(logits, temperature)?;
    if crate::fused::applies(&z) {
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

/// Entropy of softmax(logits / T): logsumexp(z) − Σ softmax(z)·z; `(..., V)` → `(...)`.
pub fn entropy(logits: &Tensor, temperature: f64) -> Result<Tensor> {
    let z = scaled(logits, temperature)?;
    let lse = log_sum_exp(&z)?; // (..., 1)
    let p = z.broadcast_sub(&lse)?.exp()?;
    let expected_z = (p * &z)?.sum_keepdim(D::Minus1)?;
    (lse - expected_z)?.squeeze(D::Minus1)
}
