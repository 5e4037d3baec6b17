//! The vocabulary end without a `(N, V)` logits tensor: the lm_head product, the log-softmax,
//! the taken token's log-probability and the entropy, in chunks of the vocabulary, forward and
//! backward.
//!
//! With V = 151,936, the logits of one paper micro-batch (2 × 9,220 positions) are 11 GB in f32.
//! Backpropagating through them also keeps them alive in the graph. Here each chunk `z_c = h·W_cᵀ/τ`
//! `(N, C)` is made, folded into per-row running statistics, and dropped. The backward makes each
//! chunk again from `h` and `W` and turns it into its share of dh and its rows of dW. The largest
//! temporary is `(N, C)`.
//!
//! Per row, with a running maximum m: s = Σ e^{z−m}, u = Σ e^{z−m}(z − m), and the target's z.
//! Then lse = m + ln s, log p(t) = z_t − lse, and H = ln s − u/s. This is `algo::token::entropy`'s
//! stable form: E[z − m] ≤ 0 and ln s ≥ 0, so nothing cancels. A new maximum m′ rescales by
//! α = e^{m−m′}: s′ = α·s, u′ = α·(u + s·(m − m′)).
//!
//! Backward, with p = e^{z − lse}:
//! - ∂ log p(t)/∂z = onehot(t) − p;
//! - ∂H/∂z = −p ⊙ (z − E[z]).
//!
//! The chunks are matrix products ([`super::matmul`]: cuBLAS on the GPU, gemm with fixed depth
//! blocks on the CPU) and element-wise ops on detached tensors, so this one code serves both
//! devices. The custom op only hangs the chunked backward on the graph: its forward returns the
//! statistics computed just before it.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor};

use super::{fused_on, vocab_chunk};

/// Per-row results of the forward: `[log p(t), H]` `(N, 2)`, and lse and E[z] `(N, 1)` for the
/// backward, all f32.
struct Stats {
    packed: Tensor,
    lse: Tensor,
    mean_z: Tensor,
}

/// `z_c = h·W[c0..c0+len]ᵀ / τ` in f32 `(N, len)`, and the one-hot of the targets in it.
fn chunk(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    c0: usize,
    len: usize,
    temperature: f64,
) -> Result<(Tensor, Tensor)> {
    let z = super::matmul(h, &w.narrow(0, c0, len)?.t()?)?.to_dtype(DType::F32)?;
    let z = if temperature == 1.0 {
        z
    } else {
        (z / temperature)?
    };
    let cols = Tensor::arange(c0 as u32, (c0 + len) as u32, h.device())?.unsqueeze(0)?;
    let hit = targets
        .unsqueeze(1)?
        .broadcast_eq(&cols)?
        .to_dtype(DType::F32)?;
    Ok((z, hit))
}

/// The chunk `z_c = h·W[c0..c0+len]ᵀ` as the matmul gives it (h's dtype), for the fused ops.
fn chunk_raw(h: &Tensor, w: &Tensor, c0: usize, len: usize) -> Result<Tensor> {
    super::matmul(h, &w.narrow(0, c0, len)?.t()?)
}

/// [`Stats`] of every row, chunk by chunk: one op per chunk ([`vocab_chunk::chunk_stats`]) when
/// `fused`, else candle's ops.
fn forward(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
    step: usize,
    fused: bool,
) -> Result<Stats> {
    let v = w.dim(0)?;
    if fused {
        let mut acc: Option<Tensor> = None; // (N, 4): m, s, u, z_t
        for c0 in (0..v).step_by(step) {
            let z = chunk_raw(h, w, c0, step.min(v - c0))?;
            let prev = acc.take();
            acc = Some(vocab_chunk::chunk_stats(
                &z,
                targets,
                prev.as_ref(),
                c0,
                temperature,
            )?);
        }
        let acc = acc.ok_or_else(|| candle_core::Error::Msg("an empty vocabulary".into()))?;
        let col = |k: usize| acc.narrow(1, k, 1);
        return finish(col(0)?, col(1)?, col(2)?, col(3)?);
    }
    // (m, s, u, z_t), each (N, 1).
    let mut acc: Option<(Tensor, Tensor, Tensor, Tensor)> = None;
    for c0 in (0..v).step_by(step) {
        let (z, hit) = chunk(h, w, targets, c0, step.min(v - c0), temperature)?;
        let zt = (&z * &hit)?.sum_keepdim(1)?;
        let cm = z.max_keepdim(1)?;
        acc = Some(match acc {
            None => {
                let d = z.broadcast_sub(&cm)?;
                let e = d.exp()?;
                (cm, e.sum_keepdim(1)?, (e * d)?.sum_keepdim(1)?, zt)
            }
            Some((m, s, u, zt_acc)) => {
                let m2 = m.maximum(&cm)?;
                let diff = (&m - &m2)?; // ≤ 0
                let alpha = diff.exp()?;
                let d = z.broadcast_sub(&m2)?;
                let e = d.exp()?;
                let s2 = ((&alpha * &s)? + e.sum_keepdim(1)?)?;
                let u2 = ((alpha * (u + (s * diff)?)?)? + (e * d)?.sum_keepdim(1)?)?;
                (m2, s2, u2, (zt_acc + zt)?)
            }
        });
    }
    let (m, s, u, zt) = acc.ok_or_else(|| candle_core::Error::Msg("an empty vocabulary".into()))?;
    finish(m, s, u, zt)
}

/// The rows' log p(t), entropy, lse and E[z] from their statistics (m, s, u, z_t), each (N, 1).
fn finish(m: Tensor, s: Tensor, u: Tensor, zt: Tensor) -> Result<Stats> {
    let ln_s = s.log()?;
    let lse = (&m + &ln_s)?;
    let mean_rel = (u / &s)?; // E[z − m]
    let entropy = (ln_s - &mean_rel)?;
    let lp = (zt - &lse)?;
    Ok(Stats {
        packed: Tensor::cat(&[&lp, &entropy], 1)?,
        mean_z: (m + mean_rel)?,
        lse,
    })
}

/// The op whose forward is [`forward`]'s result and whose backward remakes the chunks.
struct VocabLogProbs {
    targets: Tensor,
    temperature: f64,
    step: usize,
    stats: Stats,
    /// Each chunk's element-wise chain as one op ([`vocab_chunk`]), not candle's ops.
    fused: bool,
}

impl VocabLogProbs {
    /// dz of the chunk of columns `c0..c0 + len` from candle's ops, in h's dtype.
    fn chunk_dz(
        &self,
        h: &Tensor,
        w: &Tensor,
        c0: usize,
        len: usize,
        (g_lp, g_ent): (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        let (z, hit) = chunk(h, w, &self.targets, c0, len, self.temperature)?;
        let p = z.broadcast_sub(&self.stats.lse)?.exp()?;
        let d_lp = (hit - &p)?.broadcast_mul(g_lp)?;
        let d_ent = (p * z.broadcast_sub(&self.stats.mean_z)?)?.broadcast_mul(g_ent)?;
        let dz = (d_lp - d_ent)?;
        let dz = if self.temperature == 1.0 {
            dz
        } else {
            (dz / self.temperature)?
        };
        dz.to_dtype(h.dtype())
    }

    fn packed_layout(&self) -> Result<()> {
        if !self.stats.packed.is_contiguous() {
            candle_core::bail!("{}: statistics must be contiguous", self.name());
        }
        Ok(())
    }
}

impl CustomOp2 for VocabLogProbs {
    fn name(&self) -> &'static str {
        "acpo-vocab-log-probs"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.packed_layout()?;
        let (st, l) = self.stats.packed.storage_and_layout();
        match &*st {
            Storage::Cpu(s) => Ok((s.try_clone(l)?, l.shape().clone())),
            _ => candle_core::bail!("{}: statistics on another device", self.name()),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.packed_layout()?;
        let (st, l) = self.stats.packed.storage_and_layout();
        match &*st {
            Storage::Cuda(s) => Ok((s.try_clone(l)?, l.shape().clone())),
            _ => candle_core::bail!("{}: statistics on another device", self.name()),
        }
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (h, w) = (hidden.detach(), weight.detach());
        let v = w.dim(0)?;
        let g_lp = grad.narrow(1, 0, 1)?.to_dtype(DType::F32)?;
        let g_ent = grad.narrow(1, 1, 1)?.to_dtype(DType::F32)?;
        let mut dh: Option<Tensor> = None;
        let mut dw = Vec::with_capacity(v.div_ceil(self.step));
        // the fused ops read the rows' values packed: (lse, E[z], g_lp, g_H)
        let rowv = if self.fused {
            Some(Tensor::cat(
                &[&self.stats.lse, &self.stats.mean_z, &g_lp, &g_ent],
                1,
            )?)
        } else {
            None
        };
        for c0 in (0..v).step_by(self.step) {
            let len = self.step.min(v - c0);
            let dz = match &rowv {
                Some(rowv) => {
                    let z = chunk_raw(&h, &w, c0, len)?;
                    vocab_chunk::chunk_grad(&z, &self.targets, rowv, c0, self.temperature)?
                }
                None => self.chunk_dz(&h, &w, c0, len, (&g_lp, &g_ent))?,
            };
            let part = super::matmul(&dz, &w.narrow(0, c0, len)?)?.to_dtype(DType::F32)?;
            dh = Some(match dh {
                None => part,
                Some(acc) => (acc + part)?,
            });
            dw.push(super::matmul(&dz.t()?, &h)?);
        }
        let dh = dh
            .ok_or_else(|| candle_core::Error::Msg("an empty vocabulary".into()))?
            .to_dtype(hidden.dtype())?;
        Ok((Some(dh), Some(Tensor::cat(&dw, 0)?)))
    }
}

/// log p(targets) and the entropy of softmax(hidden·weightᵀ / temperature), each `(N)` f32,
/// for `hidden` `(N, H)`, `weight` `(V, H)` (the lm_head) and `targets` `(N)`, in vocabulary
/// chunks of `chunk`; gradients flow to `hidden` and `weight`. On CUDA each chunk's
/// element-wise chain is one kernel each way ([`vocab_log_probs_fused`]); elsewhere candle's
/// ops compose it, with the numbers every CPU result was made with.
pub fn vocab_log_probs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
) -> Result<(Tensor, Tensor)> {
    let fused = hidden.device().is_cuda() && fused_on(hidden);
    log_probs_in_chunks(hidden, weight, targets, temperature, chunk, fused)
}

/// [`vocab_log_probs`] with each chunk's element-wise chain as one op each way (the CUDA path:
/// `kernels/vocab_chunk.cu`), on any device that has it (on the CPU: the kernels' twin, f32).
pub fn vocab_log_probs_fused(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
) -> Result<(Tensor, Tensor)> {
    log_probs_in_chunks(hidden, weight, targets, temperature, chunk, true)
}

fn log_probs_in_chunks(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: usize,
    fused: bool,
) -> Result<(Tensor, Tensor)> {
    let (n, hd) = hidden.dims2()?;
    let (_, wd) = weight.dims2()?;
    if hd != wd || targets.elem_count() != n {
        candle_core::bail!(
            "vocab log-probs: hidden {:?}, weight {:?} and targets {:?} do not fit together",
            hidden.dims(),
            weight.dims(),
            targets.dims()
        );
    }
    let targets = targets.to_dtype(DType::U32)?.flatten_all()?.contiguous()?;
    let (h, w) = (hidden.detach(), weight.detach());
    let step = chunk.max(1);
    let stats = forward(&h, &w, &targets, temperature, step, fused)?;
    let op = VocabLogProbs {
        targets,
        temperature,
        step,
        stats,
        fused,
    };
    let packed = hidden.apply_op2(weight, op)?;
    Ok((
        packed.narrow(1, 0, 1)?.squeeze(1)?,
        packed.narrow(1, 1, 1)?.squeeze(1)?,
    ))
}
