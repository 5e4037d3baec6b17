//! Qwen2 / Qwen3 decoder for training and sampling.
//!
//! Written for this crate after candle-transformers 0.11.1's `qwen2.rs` / `qwen3.rs` (same
//! weight names and block structure), with the changes a trainer needs:
//! 1. Only differentiable ops: RMSNorm, RoPE, softmax and attention are composed of basic tensor
//!    ops. candle's fused `rms_norm`, `rope`, `softmax_last_dim` have no backward, so a model
//!    built on them trains only the weights outside them, silently (a test asserts that every
//!    parameter receives a gradient).
//! 2. Hidden states for *all* positions; logits and log-probs are computed from them in chunks
//!    of positions so a `(B, T, V)` tensor with V = 151,936 is never materialised whole.
//! 3. The KV cache is passed in and returned ([`KvCache`], preallocated buffers written in
//!    place), not state inside the layers,
//!    so one set of weights serves training and sampling.
//! 4. Per-sequence positions and a key-padding mask, so left-padded batches give each sequence
//!    exactly the result it would get alone.
//!
//! Sampling should use a detached model (`Qwen::new(.., detach = true)`): candle has no no-grad
//! mode, and with var-backed weights every decode step would extend the autograd graph (and keep
//! the KV cache alive in it). A detached model on the CPU also keeps a decode-layout copy of each
//! matrix it has decoded with ([`crate::fused::pack_pairs`]).

use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::Embedding;
use serde::Serialize;

use super::paged::{PagedKv, PagedRead, PagedStep};
use super::{Family, Params, QwenConfig, Result};
use crate::algo::token;
use crate::device::{BACKWARD_REST, FORWARD_ATTENTION, FORWARD_ELEMENTWISE, FORWARD_MATMUL, SEED};
use crate::fused::KvWrite;

mod by_hand;

/// Large negative bias for masked attention logits. Finite, so a fully masked row (a padding
/// query) gives a uniform distribution instead of NaN.
const MASKED: f64 = -1e9;

/// `y = x·Wᵀ + b` over the last dim. Leading dims are flattened into one matrix product:
/// candle_nn's `Linear` broadcasts W over the batch instead, and the backward of that broadcast
/// materialises a `(B, out, in)` gradient per layer before summing it.
#[derive(Debug, Clone)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// Detached models only: the weight in the decode kernel's layout, made on first use.
    decode: Option<DecodeCopy>,
}

impl Linear {
    fn new(weight: Tensor, bias: Option<Tensor>, detached: bool) -> Linear {
        Linear {
            weight,
            bias,
            decode: detached.then(DecodeCopy::default),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::device::part(FORWARD_ELEMENTWISE);
        let y = matmul_last(x, &self.weight, self.bias.as_ref(), self.decode.as_ref())?;
        crate::device::part(FORWARD_MATMUL);
        Ok(y)
    }
}

/// A pair-packed copy of a detached weight ([`crate::fused::pack_pairs`]), made the first time
/// a decode step (a few rows) multiplies by it and shared by the model's clones: +1× the
/// weights' memory for a sampling model, none for a model that never decodes. `None` inside
/// when the kernel does not apply (not CPU f32).
#[derive(Debug, Clone, Default)]
struct DecodeCopy(Arc<OnceLock<Option<Tensor>>>);

impl DecodeCopy {
    /// Packs inside the lock, so clones decoding at once wait for one copy instead of each
    /// making its own. A failed pack is returned to the caller that tried it;
    /// later calls then use the plain weight (the same numbers).
    fn get(&self, w: &Tensor) -> candle_core::Result<Option<&Tensor>> {
        let mut failed = None;
        let packed = self.0.get_or_init(|| {
            crate::fused::pack_pairs(w).unwrap_or_else(|e| {
                failed = Some(e);
                None
            })
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(packed.as_ref()),
        }
    }
}

/// `x (..., in) · wᵀ (in, out) [+ b]` as one 2-D product.
fn matmul_last(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    decode: Option<&DecodeCopy>,
) -> candle_core::Result<Tensor> {
    let dims = x.dims().to_vec();
    let inp = *dims.last().expect("invariant: at least 1-D");
    let rows = x.elem_count() / inp.max(1);
    let x2 = x.reshape((rows, inp))?;
    // Decoding multiplies a few rows by every weight matrix: stream W instead of packing it,
    // from the decode copy when there is one.
    let small = rows <= crate::fused::SMALL_M;
    let packed = match decode {
        Some(d) if small => d.get(w)?,
        _ => None,
    };
    let y = match packed {
        Some(p) => crate::fused::linear_small_m_packed(&x2, p)?,
        None => crate::fused::linear_small_m(&x2, w)?,
    };
    let y = match y {
        Some(y) => y,
        None => crate::fused::matmul(&x2, &w.t()?)?,
    };
    let y = match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let mut out = dims;
    *out.last_mut().expect("invariant: at least 1-D") = w.dim(0)?;
    y.reshape(out)
}

/// RMSNorm: x / sqrt(mean(x²) + ε) · w, computed in f32 like HF (fused on CPU f32, with its
/// backward; from basic ops elsewhere).
#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(crate::fused::rms_norm(x, &self.weight, self.eps)?)
    }
}

/// The rotary frequencies `1 / θ^(2i/D)`, `(D/2)` f32, made once for a model (no upload per
/// forward).
fn rope_inv_freq(head_dim: usize, theta: f64, device: &Device) -> Result<Tensor> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / (theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect();
    Ok(Tensor::from_vec(inv_freq, half, device)?)
}

/// cos/sin of rotary embeddings for given positions `(B, T)` (u32) with `inv_freq`
/// ([`rope_inv_freq`]), `(B, 1, T, D)` each, in `dtype`: one kernel a table on CUDA
/// (`fused::rope_tables`, the same f32 operations), these ops elsewhere.
fn rope_tables(positions: &Tensor, inv_freq: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
    if let Some(tables) = crate::fused::rope_tables(positions, inv_freq, dtype)? {
        return Ok(tables);
    }
    let inv_freq = inv_freq.reshape((1, 1, ()))?;
    let pos = positions.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?; // (B, T, 1)
    let freqs = pos.broadcast_mul(&inv_freq)?; // (B, T, D/2)
    let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?; // (B, T, D)
    let cos = emb.cos()?.to_dtype(dtype)?.unsqueeze(1)?;
    let sin = emb.sin()?.to_dtype(dtype)?.unsqueeze(1)?;
    Ok((cos, sin))
}

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// [`Kernels::decode_chain`]: a detached model's decode step runs its element-wise chain
    /// fused where the kernels apply.
    decode_chain: bool,
    /// How the cache holds this layer's keys and values ([`KvCacheDtype`]).
    kv_dtype: KvCacheDtype,
    /// `[Wq; Wk; Wv]` (and the biases likewise) for the fused decode chain's one product, made
    /// at a detached model's first fused decode step and shared by its clones.
    stacked: StackedQkv,
}

/// The q, k and v weights stacked on their output dim (`[Wq; Wk; Wv]`, biases likewise), made
/// once, on first use: +1× those weights' memory for a model that decodes with the fused chain
/// (0.45 GB at Qwen3-1.7B in bf16), none for any other. A copy: every sampling model is built
/// for its step from the weights of that step (`train::step`) or from fixed ones (evaluation),
/// never kept while its weights are updated in place.
#[derive(Debug, Clone, Default)]
struct StackedQkv(Arc<OnceLock<(Tensor, Option<Tensor>)>>);

impl StackedQkv {
    fn get(&self, q: &Linear, k: &Linear, v: &Linear) -> Result<&(Tensor, Option<Tensor>)> {
        if let Some(done) = self.0.get() {
            return Ok(done);
        }
        let w = Tensor::cat(&[&q.weight, &k.weight, &v.weight], 0)?;
        let b = match (&q.bias, &k.bias, &v.bias) {
            (Some(bq), Some(bk), Some(bv)) => Some(Tensor::cat(&[bq, bk, bv], 0)?),
            (None, None, None) => None,
            _ => {
                return Err(candle_core::Error::Msg(
                    "attention: biases on some of q, k and v only".into(),
                )
                .into())
            }
        };
        // a clone that stacked them at the same time keeps its own: the same values
        Ok(self.0.get_or_init(|| (w, b)))
    }
}

impl Attention {
    /// `x` `(B, T, H)`; returns the output and this layer's key/value buffers
    /// `(B, kv_heads, capacity, D)`, their first `past.len + T` columns filled.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask,
        past: &LayerCache,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (b, t, _) = x.dims3()?;
        // the fused chain writes the new column where the buffers have room for it
        let fused = match &past.buffers {
            Some((kb, vb)) if kb.dim(2)? > past.len => self
                .fused_chain(x, cos, sin, (kb, vb), KvWrite::Column(past.len))?
                .map(|q| (q, kb.clone(), vb.clone())),
            _ => None,
        };
        let (q, kb, vb) = match fused {
            Some(done) => done,
            None => {
                let (q, k, v) = self.project(x)?;
                let (q, k, v) = self.norm_rope(q, k, v, cos, sin)?;
                (q, past.write(&k, 0)?, past.write(&v, 1)?)
            }
        };
        let out = self.attend(&q, &kb, &vb, past.len + t, mask)?;
        Ok((self.output(&out, b, t)?, (kb, vb)))
    }

    /// The same layer over a paged cache ([`super::paged`]): the new positions' keys and values
    /// written to the pool rows `step` names, then attention over each sequence's keys, read
    /// through its blocks.
    fn forward_paged(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&AttnMask>,
        pool: &(Tensor, Tensor),
        step: &PagedStep,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let at = KvWrite::PoolRows(&step.write);
        let q = match self.fused_chain(x, cos, sin, (&pool.0, &pool.1), at)? {
            Some(q) => q,
            None => {
                let (q, k, v) = self.project(x)?;
                let (q, k, v) = self.norm_rope(q, k, v, cos, sin)?;
                let rows = b * self.kv_heads * t;
                let row = |x: &Tensor| x.reshape((rows, self.head_dim));
                crate::fused::store_rows(&pool.0, &step.write, &row(&k)?)?;
                crate::fused::store_rows(&pool.1, &step.write, &row(&v)?)?;
                q
            }
        };
        let out = match (&step.read, mask) {
            (PagedRead::Gather { index, width, .. }, Some(mask)) => {
                let gather = |p: &Tensor| -> Result<Tensor> {
                    Ok(p.index_select(index, 0)?.reshape((
                        b,
                        self.kv_heads,
                        *width,
                        self.head_dim,
                    ))?)
                };
                let (kb, vb) = (gather(&pool.0)?, gather(&pool.1)?);
                self.attend(&q, &kb, &vb, *width, mask)?
            }
            (
                PagedRead::Table {
                    tables,
                    lens,
                    block,
                },
                _,
            ) => {
                let paged = |p: &Tensor| -> Result<Tensor> {
                    let per = self.kv_heads * block;
                    Ok(p.reshape((p.dim(0)? / per, self.kv_heads, *block, self.head_dim))?)
                };
                crate::fused::paged_attention_decode(
                    &q,
                    &paged(&pool.0)?,
                    &paged(&pool.1)?,
                    tables,
                    lens,
                    1.0 / (self.head_dim as f64).sqrt(),
                )?
            }
            (PagedRead::Gather { .. }, None) => {
                return Err(candle_core::Error::Msg(
                    "paged attention: a gathered read without its mask".into(),
                )
                .into())
            }
        };
        self.output(&out, b, t)
    }

    /// The projections of `x` `(B, T, H)`, tokens first: q `(B, T, H, D)`, k and v
    /// `(B, T, KV, D)`.
    fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _) = x.dims3()?;
        let split = |y: Tensor, heads: usize| -> Result<Tensor> {
            Ok(y.reshape((b, t, heads, self.head_dim))?)
        };
        let q = split(self.q.forward(x)?, self.heads)?;
        let k = split(self.k.forward(x)?, self.kv_heads)?;
        let v = split(self.v.forward(x)?, self.kv_heads)?;
        Ok((q, k, v))
    }

    /// The projections normed (Qwen3) and rotated, heads first: q `(B, H, T, D)`, k and v
    /// `(B, KV, T, D)`.
    fn norm_rope(
        &self,
        mut q: Tensor,
        mut k: Tensor,
        v: Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        // q and k rotated into heads first as they are read: no transposed copy first
        let q = crate::fused::rope_heads(&q, cos, sin)?; // (B, H, T, D)
        let k = crate::fused::rope_heads(&k, cos, sin)?; // (B, KV, T, D)
        let v = v.transpose(1, 2)?.contiguous()?;
        match self.kv_dtype {
            KvCacheDtype::Model => Ok((q, k, v)),
            // On a GPU the cache holds the E4M3 bytes (`DType::U8`, half a bf16 cache's: the
            // decode kernel reads them, fused::flash); on the CPU their values in the model's
            // dtype.
            fp8 if fp8.holds_bytes(k.device()) => Ok((q, to_fp8_e4m3(&k)?, to_fp8_e4m3(&v)?)),
            KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E4m3Values | KvCacheDtype::Fp8E4m3Bytes => {
                Ok((q, fp8_e4m3(&k)?, fp8_e4m3(&v)?))
            }
        }
    }

    /// Attention of `q` over the first `s` columns of the key/value buffers `kb`, `vb`
    /// `(B, KV, capacity, D)`: `(B, H, T, D)`.
    fn attend(
        &self,
        q: &Tensor,
        kb: &Tensor,
        vb: &Tensor,
        s: usize,
        mask: &AttnMask,
    ) -> Result<Tensor> {
        let t = q.dim(2)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        // An FP8 cache (E4M3 bytes, on a GPU) is read as it is by the decode kernel; any other
        // attention reads its filled columns cast to the query's dtype (exact: bf16 holds every
        // E4M3 value), so a prefill over it has the bits of one over the emulated cache.
        let fp8_read = matches!(mask, AttnMask::Keys { .. })
            && t == 1
            && kb.device().is_cuda()
            && crate::fused::fp8_decode_applies(self.head_dim, self.heads / self.kv_heads);
        let cast;
        let (kb, vb, s) = if kb.dtype() == DType::U8 && !fp8_read {
            let read = |b: &Tensor| -> Result<Tensor> {
                let filled = b.narrow(2, 0, s)?.contiguous()?;
                Ok(crate::fused::from_fp8_bytes(&filled, q.dtype())?)
            };
            cast = (read(kb)?, read(vb)?);
            (&cast.0, &cast.1, s)
        } else {
            (kb, vb, s)
        };
        Ok(match mask {
            AttnMask::Bias(bias) => {
                // The filled columns, read in place: each (row, head)'s keys are one matrix
                // with the layout of a contiguous copy, only further apart in the buffer, and
                // the batched product takes that stride, so the products, and every result,
                // are unchanged. A contiguous copy would cost about 8 % of an evaluation's
                // profile for cache misses the strided product pays anyway (docs/PERFORMANCE.md,
                // "The main job").
                let (k, v) = (kb.narrow(2, 0, s)?, vb.narrow(2, 0, s)?);
                // A detached model's decode step: the same numbers without gemm's per-call
                // cost (fused::attention_decode).
                let decoded = match (t, &self.q.decode) {
                    (1, Some(_)) => crate::fused::attention_decode(q, &k, &v, bias, scale)?,
                    _ => None,
                };
                match decoded {
                    Some(out) => out,
                    None => crate::fused::attention_composed(q, &k, &v, bias, scale)?,
                }
            }
            // The kernel reads the buffer in place, its first `s` columns.
            AttnMask::Keys {
                keys,
                past,
                backward,
            } => {
                crate::device::part(FORWARD_ELEMENTWISE);
                let out =
                    crate::fused::flash_attention_keys(q, kb, vb, keys, *past, scale, *backward)?;
                crate::device::part(FORWARD_ATTENTION);
                out
            }
        }) // (B, H, T, D)
    }

    /// The output projection of the heads' attention `(B, H, T, D)`.
    fn output(&self, out: &Tensor, b: usize, t: usize) -> Result<Tensor> {
        let out = out
            .reshape((b, self.heads, t, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, self.heads * self.head_dim))?;
        self.o.forward(&out)
    }

    /// A detached model's decode step (one new position) on kernels that fuse its chain: the
    /// q/k/v projection of `x` as one product with the stacked weights, then the q/k norms, the
    /// rotations and the new keys' and values' write into the cache buffers `kv` where `at`
    /// says (a dense cache's column, a paged pool's rows) in one launch
    /// ([`crate::fused::qk_norm_rope_cache`]). Returns q heads first; None where the fused
    /// kernel does not apply (the composed ops then run).
    fn fused_chain(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: (&Tensor, &Tensor),
        at: KvWrite,
    ) -> Result<Option<Tensor>> {
        // The fused chain writes the model's dtype or E4M3 bytes; a cache of E4M3 values in
        // the model's dtype (the bytes' oracle) takes the composed path.
        let writes = self.kv_dtype == KvCacheDtype::Model || self.kv_dtype.holds_bytes(x.device());
        if !self.decode_chain
            || x.dim(1)? != 1
            || self.q.decode.is_none()
            || !writes
            || !crate::fused::qk_chain_applies(x.device(), x.dtype(), self.head_dim)
        {
            return Ok(None);
        }
        let norms = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => Some(crate::fused::QkNorms {
                q: &qn.weight,
                k: &kn.weight,
                eps: qn.eps,
            }),
            _ => None,
        };
        let (w, bias) = self.stacked.get(&self.q, &self.k, &self.v)?;
        crate::device::part(FORWARD_ELEMENTWISE);
        let qkv = matmul_last(x, w, bias.as_ref(), None)?;
        crate::device::part(FORWARD_MATMUL);
        let heads = (self.heads, self.kv_heads);
        Ok(crate::fused::qk_norm_rope_cache(
            &qkv, heads, norms, cos, sin, kv, at,
        )?)
    }
}

/// Which keys each query sees, in the form its attention takes.
#[derive(Debug, Clone)]
enum AttnMask {
    /// The composed attention's additive bias `(B, 1, T, S)` ([`attention_bias`]).
    Bias(Tensor),
    /// Flash attention's: the valid keys `(B, S)` (with each row's first, made once for every
    /// layer) and the cached positions; the kernel applies causality itself, and no `(T, S)`
    /// tensor exists.
    Keys {
        keys: crate::fused::ValidKeys,
        past: usize,
        backward: crate::fused::FlashBackward,
    },
}

/// How a model computes its two memory-heavy parts (issue #19): the attention, which composed
/// materialises `(B, H, T, S)` scores, and the vocabulary end, whose logits are `(B, T, V)`.
/// Both choices compute the same function (to float rounding); tests/it/model.rs holds each
/// pair to that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Kernels {
    /// Flash attention ([`crate::fused::flash_attention`]) where it applies, else composed.
    pub flash_attention: bool,
    /// lm_head + log-softmax + entropy in vocabulary chunks of this size, fused per chunk
    /// ([`crate::fused::vocab_log_probs`]); `None`: logits of `LOGIT_CHUNK` positions at a time.
    pub vocab_chunk: Option<usize>,
    /// A sampling model's decode step with its element-wise chain fused where the kernels
    /// apply (CUDA): the q/k norms, RoPE and the KV-cache write in one launch, the residual add
    /// and the next RMSNorm in another ([`crate::fused::qk_norm_rope_cache`],
    /// [`crate::fused::add_rms_norm`]). Off: the composed ops.
    pub decode_chain: bool,
    /// A checkpointed backward takes each decoder layer's backward written out by hand
    /// (`qwen/by_hand.rs`: each gradient written once, no autograd graph but the attention's)
    /// instead of candle's autograd over the composed layer, its oracle. Off on every device
    /// until a GPU run times the two side by side (`acpo bench train-step --layer-by-hand`).
    pub layer_by_hand: bool,
    /// The flash kernels' backward ([`crate::fused::FlashBackward`]): the pair of kernels in 7
    /// products, or one in 5 with dQ added up in key-block order. The pair on every device until
    /// a GPU run times the two side by side (`acpo bench train-step --flash-backward five`).
    pub flash_backward: crate::fused::FlashBackward,
}

/// Vocabulary chunk of the GPU path: (rows, 8192) f32 per chunk instead of (rows, 151,936).
pub const VOCAB_CHUNK: usize = 8192;

impl Kernels {
    /// What each device runs by default. The CPU keeps the composed paths, whose numbers every
    /// shipped CPU result was made with; CUDA takes flash attention and the chunked vocabulary,
    /// without which paper-length sequences do not fit (docs/CUDA.md).
    pub fn for_device(device: &Device) -> Kernels {
        if device.is_cuda() {
            Kernels {
                flash_attention: true,
                vocab_chunk: Some(VOCAB_CHUNK),
                decode_chain: true,
                layer_by_hand: false,
                flash_backward: crate::fused::FlashBackward::Pair,
            }
        } else {
            Kernels::composed()
        }
    }

    /// The composed paths everywhere (the oracles).
    pub fn composed() -> Kernels {
        Kernels {
            flash_attention: false,
            vocab_chunk: None,
            decode_chain: false,
            layer_by_hand: false,
            flash_backward: crate::fused::FlashBackward::Pair,
        }
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = crate::fused::swiglu(&self.gate.forward(x)?, &self.up.forward(x)?)?;
        self.down.forward(&h)
    }
}

#[derive(Debug, Clone)]
struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    /// The decoder layer: x + attn(norm(x)), then + mlp(norm(·)). Returns its keys/values too.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask,
        past: &LayerCache,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (a, kv) = self
            .attn
            .forward(&self.input_norm.forward(x)?, cos, sin, mask, past)?;
        Ok((self.residual_mlp(x, &a)?, kv))
    }

    /// The layer after its attention `a`: x + a, then + mlp(norm(·)).
    fn residual_mlp(&self, x: &Tensor, a: &Tensor) -> Result<Tensor> {
        let (x, normed) = self.add_norm(x, a, &self.post_norm)?;
        Ok((&x + self.mlp.forward(&normed)?)?)
    }

    /// The layer after its attention `a` as the residual stream runs it in a forward's loop:
    /// y = x + a + mlp(norm(x + a)), returned with `next`'s norm of it (the next layer's input
    /// norm, or the final norm), so that the layer's last add and the norm after it are one
    /// launch where the decode chain applies, as its first add and norm are.
    fn residual_mlp_normed(
        &self,
        x: &Tensor,
        a: &Tensor,
        next: &RmsNorm,
    ) -> Result<(Tensor, Tensor)> {
        let (h, normed) = self.add_norm(x, a, &self.post_norm)?;
        self.add_norm(&h, &self.mlp.forward(&normed)?, next)
    }

    /// `(x + a, norm(x + a))`: one launch in a detached model's decode step where the kernel
    /// applies ([`crate::fused::add_rms_norm`]), else the add and the norm.
    fn add_norm(&self, x: &Tensor, a: &Tensor, norm: &RmsNorm) -> Result<(Tensor, Tensor)> {
        let fused = if self.attn.decode_chain && x.dim(1)? == 1 && self.attn.q.decode.is_some() {
            crate::fused::add_rms_norm(x, a, &norm.weight, norm.eps)?
        } else {
            None
        };
        match fused {
            Some(both) => Ok(both),
            None => {
                let x = (x + a)?;
                let normed = norm.forward(&x)?;
                Ok((x, normed))
            }
        }
    }

    /// The same layer on detached weights: runs without recording a graph.
    fn detached(&self) -> Block {
        let lin = |l: &Linear| {
            Linear::new(
                l.weight.detach(),
                l.bias.as_ref().map(Tensor::detach),
                false,
            )
        };
        let norm = |n: &RmsNorm| RmsNorm {
            weight: n.weight.detach(),
            eps: n.eps,
        };
        let a = &self.attn;
        Block {
            input_norm: norm(&self.input_norm),
            attn: Attention {
                q: lin(&a.q),
                k: lin(&a.k),
                v: lin(&a.v),
                o: lin(&a.o),
                q_norm: a.q_norm.as_ref().map(norm),
                k_norm: a.k_norm.as_ref().map(norm),
                heads: a.heads,
                kv_heads: a.kv_heads,
                head_dim: a.head_dim,
                decode_chain: a.decode_chain,
                kv_dtype: a.kv_dtype,
                stacked: StackedQkv::default(),
            },
            post_norm: norm(&self.post_norm),
            mlp: Mlp {
                gate: lin(&self.mlp.gate),
                up: lin(&self.mlp.up),
                down: lin(&self.mlp.down),
            },
        }
    }
}

/// How a KV cache holds keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// In the model's dtype (bf16 on a GPU, f32 at the mini scale): what every result uses.
    #[default]
    Model,
    /// Rounded to FP8 E4M3 (4 exponent bits, 3 mantissa bits, largest finite 448), with a
    /// scale of 1 as an uncalibrated FP8 cache stores them (vLLM's `kv_cache_dtype="fp8"`
    /// without scales): half a bf16 cache's bytes, so twice the KV-bandwidth bound on decode
    /// (`acpo bench paper-plan`). Values beyond ±448 saturate. On the CPU the cache keeps
    /// each value in the model's dtype (what an FP8 cache does to accuracy); on a GPU its byte
    /// (`DType::U8`, [`to_fp8_e4m3`]: what it does to speed).
    Fp8E4m3,
    /// The values of [`KvCacheDtype::Fp8E4m3`] in the model's dtype on every device: what the
    /// CPU keeps for it, and on a GPU the oracle of its bytes (tests/it/cuda.rs: the same bits).
    Fp8E4m3Values,
    /// The bytes of [`KvCacheDtype::Fp8E4m3`] on every device: its GPU form, which the CPU runs
    /// through the kernels' twins (`fused::fp8`, the paged decode's), so that the GPU's byte
    /// path, dense and paged, is tested where CI runs (tests/it/model.rs: the tokens of
    /// [`KvCacheDtype::Fp8E4m3Values`]). A quarter of an f32 cache's memory on the CPU, for a
    /// conversion at each read.
    Fp8E4m3Bytes,
}

impl KvCacheDtype {
    /// Whether the cache holds E4M3 bytes (`DType::U8`) on `device`.
    pub fn holds_bytes(self, device: &Device) -> bool {
        match self {
            KvCacheDtype::Fp8E4m3Bytes => true,
            KvCacheDtype::Fp8E4m3 => device.is_cuda(),
            KvCacheDtype::Model | KvCacheDtype::Fp8E4m3Values => false,
        }
    }
}

/// FP8 E4M3's largest finite magnitude.
pub const FP8_E4M3_MAX: f64 = 448.0;

/// `x` rounded to the nearest FP8 E4M3 value (ties to even, saturating at ±448), in its own
/// dtype: what an FP8 cache holds, as the CPU keeps it (candle's CPU cast; on a GPU the same
/// rounding by `kernels/fp8.cu`, candle's E4M3 kernels being unreachable there).
pub fn fp8_e4m3(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() {
        return Ok(x
            .clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)?
            .to_dtype(DType::F8E4M3)?
            .to_dtype(x.dtype())?);
    }
    Ok(crate::fused::from_fp8_bytes(&to_fp8_e4m3(x)?, x.dtype())?)
}

/// `x` rounded as [`fp8_e4m3`] rounds it, as E4M3 bytes (`DType::U8`, one a number,
/// [`crate::fused::to_fp8_bytes`]): what an FP8 cache holds on a GPU.
pub fn to_fp8_e4m3(x: &Tensor) -> Result<Tensor> {
    Ok(crate::fused::to_fp8_bytes(x)?)
}

/// Keys and values of every layer, in buffers `(B, kv_heads, capacity, D)` whose first `len`
/// columns hold the positions seen so far. A buffer is allocated once, with room for `reserve`
/// more positions, and each forward writes its new columns into it in place (`slice_set`): no
/// per-token concatenation or reallocation while the room lasts. A forward that needs more room
/// moves the cache into a buffer twice as large.
///
/// A forward extends the buffers of the cache passed to it: the returned cache shares them, and
/// the cache passed in must not be used again (sampling replaces it at each step). A sampler's
/// continuous batching, whose history outgrows any sequence's, drops the columns no row reads
/// any more before its buffers would double (`KvCache::drop_front`).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
    reserve: usize,
}

impl KvCache {
    /// An empty cache whose first forward allocates room for `reserve` positions beyond its own
    /// (a sampler reserves its new tokens). `forward_hidden(.., None)` reserves none.
    pub fn with_reserve(reserve: usize) -> KvCache {
        KvCache {
            layers: Vec::new(),
            len: 0,
            reserve,
        }
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Columns allocated per row (≥ [`KvCache::len`]).
    pub fn capacity(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    /// Keeps the batch rows `rows` (for dropping finished sequences during sampling); the
    /// buffers keep their capacity. Layer by layer, each layer's old buffers freed as its new
    /// ones are made: one layer's new buffers more memory at most.
    pub fn select_rows(self, rows: &Tensor) -> Result<KvCache> {
        let len = self.len;
        let keep = |buf: Tensor| -> Result<Tensor> {
            Ok(match kept_rows(&buf, rows, len)? {
                Some(kept) => kept,
                None => buf.index_select(rows, 0)?,
            })
        };
        let layers = self
            .layers
            .into_iter()
            .map(|(k, v)| Ok((keep(k)?, keep(v)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            len,
            reserve: self.reserve,
        })
    }

    /// The rows of `self`, then those of `other`, both right-aligned to the longer of the two:
    /// the next position of every row is column `len` (continuous batching: a prefilled prompt
    /// joins sequences that are decoding). The columns left of the shorter cache's are zeros;
    /// the caller marks them invalid in `key_valid`. Layer by layer, each layer's old buffers
    /// freed as its new ones are made; each side is written once into the merged buffer
    /// (`place_columns`).
    pub fn append_rows(self, other: &KvCache) -> Result<KvCache> {
        if self.layers.is_empty() {
            return Ok(other.clone());
        }
        if other.layers.is_empty() {
            return Ok(self);
        }
        let len = self.len.max(other.len);
        let cap = (self.capacity() + len - self.len).max(other.capacity() + len - other.len);
        let (self_len, reserve) = (self.len, self.reserve);
        let merged = |a: &Tensor, b: &Tensor| -> Result<Tensor> {
            let (rows_a, kv, _, d) = a.dims4()?;
            let out = Tensor::zeros((rows_a + b.dim(0)?, kv, cap, d), a.dtype(), a.device())?;
            for (at, buf, c_len) in [(0, a, self_len), (rows_a, b, other.len)] {
                let rows = out.narrow(0, at, buf.dim(0)?)?;
                place_columns(&rows, buf, c_len, len - c_len)?;
            }
            Ok(out)
        };
        let layers = self
            .layers
            .into_iter()
            .zip(&other.layers)
            .map(|((ak, av), (bk, bv))| Ok((merged(&ak, bk)?, merged(&av, bv)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            len,
            reserve,
        })
    }

    /// The same rows without their first `drop` columns, in new buffers of `capacity` columns
    /// (at least the `len − drop` kept): for columns no row reads any more (a sampler's
    /// continuous batching, whose history outgrows every sequence's). Layer by layer, each
    /// layer's old buffers freed as its new ones are made: at most one layer's new buffers and a
    /// copy of its kept columns more memory (`slice_set` takes a contiguous source).
    pub(crate) fn drop_front(self, drop: usize, capacity: usize) -> Result<KvCache> {
        if drop > self.len || capacity < self.len - drop {
            let (len, cap) = (self.len, capacity);
            let msg = format!("drop_front: {drop} of {len} columns, then {cap} columns of room");
            return Err(candle_core::Error::Msg(msg).into());
        }
        let len = self.len - drop;
        let kept = |buf: &Tensor| moved(&buf.narrow(2, drop, len)?, len, capacity, 0);
        let layers = self
            .layers
            .into_iter()
            .map(|(k, v)| Ok((kept(&k)?, kept(&v)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            len,
            reserve: self.reserve,
        })
    }

    /// Writes row `from` of `other` into row `row` of these buffers, in place, right-aligned:
    /// `other`'s `len` columns end at this cache's column `len` (continuous batching: a prefilled
    /// prompt takes the slot of a sequence that finished, no other row moving). The columns left
    /// of them keep what they held (the finished sequence's keys); the caller marks them invalid
    /// in `key_valid`. The buffers are this cache's alone (a sampler's), so writing into them
    /// changes no other tensor.
    pub(crate) fn place_row(&self, row: usize, other: &KvCache, from: usize) -> Result<()> {
        let fail = |msg: String| -> Result<()> {
            Err(candle_core::Error::Msg(format!("place_row: {msg}")).into())
        };
        if self.layers.len() != other.layers.len() {
            let (a, b) = (self.layers.len(), other.layers.len());
            return fail(format!("a cache of {a} layers and one of {b}"));
        }
        if other.len > self.len {
            let (a, b) = (self.len, other.len);
            return fail(format!("{b} positions do not fit before column {a}"));
        }
        for ((k, v), (ok, ov)) in self.layers.iter().zip(&other.layers) {
            for (dst, src) in [(k, ok), (v, ov)] {
                let (rows, from_rows) = (dst.dim(0)?, src.dim(0)?);
                if row >= rows || from >= from_rows {
                    return fail(format!(
                        "row {row} of {rows} from row {from} of {from_rows}"
                    ));
                }
                // a view of one row: contiguous, sharing the buffer's storage
                let slot = dst.narrow(0, row, 1)?;
                let keys = src.narrow(0, from, 1)?.narrow(2, 0, other.len)?;
                slot.slice_set(&keys.contiguous()?, 2, self.len - other.len)?;
            }
        }
        Ok(())
    }

    /// Each layer's key and value buffers `(B, kv_heads, capacity, D)`.
    pub fn layers(&self) -> &[(Tensor, Tensor)] {
        &self.layers
    }

    fn layer(&self, i: usize) -> LayerCache {
        LayerCache {
            buffers: self.layers.get(i).cloned(),
            len: self.len,
            reserve: self.reserve,
        }
    }
}

/// One layer's view of a [`KvCache`].
struct LayerCache {
    buffers: Option<(Tensor, Tensor)>,
    len: usize,
    reserve: usize,
}

impl LayerCache {
    /// Writes `new` `(B, KV, T, D)` at columns `len..len + T` of buffer `which` (0: K, 1: V) and
    /// returns the buffer: in place when it has room; else in a new buffer of twice the columns
    /// (or `T + reserve` for the first forward; exactly `new` when nothing is reserved).
    fn write(&self, new: &Tensor, which: usize) -> Result<Tensor> {
        let (b, kv, t, d) = new.dims4()?;
        let s = self.len + t;
        let old = self
            .buffers
            .as_ref()
            .map(|(k, v)| if which == 0 { k } else { v });
        match old {
            Some(buf) if buf.dim(2)? >= s => {
                buf.slice_set(new, 2, self.len)?;
                Ok(buf.clone())
            }
            None if self.reserve == 0 => Ok(new.clone()),
            Some(old) => {
                let buf = moved(old, self.len, (2 * s).max(s + self.reserve), 0)?;
                buf.slice_set(new, 2, self.len)?;
                Ok(buf)
            }
            None => {
                let buf = Tensor::zeros((b, kv, s + self.reserve, d), new.dtype(), new.device())?;
                buf.slice_set(new, 2, 0)?;
                Ok(buf)
            }
        }
    }
}

/// The batch rows `rows` of a CPU f32 cache buffer `buf` `(B, KV, cap, D)` in a new buffer of
/// the same capacity: each (row, head)'s first `len` columns copied, the rest zeros (columns at
/// `len` and beyond are written before they are read). `index_select` makes the same filled
/// columns, but clears the whole new buffer and then copies every column: twice the passes,
/// 4 % of an evaluation's profile. None where it does not apply (another device or dtype).
fn kept_rows(buf: &Tensor, rows: &Tensor, len: usize) -> Result<Option<Tensor>> {
    if !buf.device().is_cpu()
        || buf.dtype() != DType::F32
        || !buf.is_contiguous()
        || rows.dtype() != DType::U32
    {
        return Ok(None);
    }
    let (b, kv, cap, d) = buf.dims4()?;
    if len > cap {
        return Ok(None);
    }
    let picks = rows.to_vec1::<u32>()?;
    if let Some(&bad) = picks.iter().find(|&&r| r as usize >= b) {
        let msg = format!("select_rows: row {bad} of a cache of {b} rows");
        return Err(candle_core::Error::Msg(msg).into());
    }
    let (storage, layout) = buf.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Ok(None);
    };
    let src = &cpu.as_slice::<f32>()?[layout.start_offset()..];
    let mut out = Vec::with_capacity(picks.len() * kv * cap * d);
    for &r in &picks {
        for h in 0..kv {
            let at = (r as usize * kv + h) * cap * d;
            out.extend_from_slice(&src[at..at + len * d]);
            out.resize(out.len() + (cap - len) * d, 0.0);
        }
    }
    Ok(Some(Tensor::from_vec(
        out,
        (picks.len(), kv, cap, d),
        buf.device(),
    )?))
}

/// The first `len` columns of the cache buffer `buf` `(B, KV, _, D)` in a new zeroed buffer of
/// `cap` columns, starting at column `at`.
fn moved(buf: &Tensor, len: usize, cap: usize, at: usize) -> Result<Tensor> {
    let (b, kv, _, d) = buf.dims4()?;
    let out = Tensor::zeros((b, kv, cap, d), buf.dtype(), buf.device())?;
    place_columns(&out, buf, len, at)?;
    Ok(out)
}

/// Writes the first `len` columns of the cache buffer `buf` into `dst` (the same rows, a
/// contiguous view) from column `at`. A buffer as wide as `dst` placed at column 0 goes over
/// whole (its columns past `len` are zeros, never written, as `dst`'s are); otherwise through
/// a copy of its `len` columns, as `slice_set` takes a contiguous source.
fn place_columns(dst: &Tensor, buf: &Tensor, len: usize, at: usize) -> Result<()> {
    if at == 0 && buf.dim(2)? == dst.dim(2)? && buf.is_contiguous() {
        dst.slice_set(buf, 2, 0)?;
    } else {
        dst.slice_set(&buf.narrow(2, 0, len)?.contiguous()?, 2, at)?;
    }
    Ok(())
}

/// A Qwen2/Qwen3 causal language model.
#[derive(Debug, Clone)]
pub struct Qwen {
    cfg: QwenConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    /// `(V, H)`, no bias; the embedding matrix itself when embeddings are tied.
    lm_head: Linear,
    dtype: DType,
    /// The rotary frequencies ([`rope_inv_freq`]).
    inv_freq: Tensor,
    device: Device,
    kernels: Kernels,
    /// The master of each weight the model reads as a cast of it (`Params::weight`: bf16 from
    /// f32 on the GPU), keyed by the cast's id: where a layer's backward by hand hands each such
    /// weight's gradient (cast back to the master's dtype, what the cast's own backward gives).
    /// Empty for a detached model and for weights read as they are.
    masters: std::sync::Arc<by_hand::Masters>,
}

/// What the checkpointed backward keeps for the embedding's backward: the ids grouped by token
/// for the backward by hand ([`by_hand::embedding_backward`]), or the lookup's output, seeded
/// under autograd.
enum EmbeddingBackward {
    ByHand(crate::fused::TokenRows),
    Seeded(Tensor),
}

impl Qwen {
    /// Builds the model from named parameters (HF names). `detach` gives a copy for sampling
    /// that shares storage with the trainable weights but records no autograd graph.
    pub fn new(cfg: &QwenConfig, params: &Params, detach: bool) -> Result<Qwen> {
        let family = cfg.family().map_err(|reason| super::ModelError::Config {
            path: "config.json".into(),
            reason,
        })?;
        let masters = std::cell::RefCell::new(std::collections::HashMap::new());
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let w = params.weight(name, shape, detach)?;
            if !detach && !w.is_variable() {
                masters
                    .borrow_mut()
                    .insert(w.id(), params.get(name, shape)?);
            }
            Ok(w)
        };
        let (h, v, hd) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim());
        let (nh, nkv, inter) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.intermediate_size,
        );
        let linear = |name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
            let w = get(&format!("{name}.weight"), &[out, inp])?;
            let b = if bias {
                Some(get(&format!("{name}.bias"), &[out])?)
            } else {
                None
            };
            Ok(Linear::new(w, b, detach))
        };
        let norm = |name: &str, n: usize| -> Result<RmsNorm> {
            Ok(RmsNorm {
                weight: get(name, &[n])?,
                eps: cfg.rms_norm_eps,
            })
        };
        let embed_w = get("model.embed_tokens.weight", &[v, h])?;
        let dtype = embed_w.dtype();
        let device = embed_w.device().clone();
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let qk_norm = family == Family::Qwen3;
            let bias = cfg.qkv_bias();
            blocks.push(Block {
                input_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                attn: Attention {
                    q: linear(&format!("{p}.self_attn.q_proj"), nh * hd, h, bias)?,
                    k: linear(&format!("{p}.self_attn.k_proj"), nkv * hd, h, bias)?,
                    v: linear(&format!("{p}.self_attn.v_proj"), nkv * hd, h, bias)?,
                    o: linear(&format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
                    q_norm: if qk_norm {
                        Some(norm(&format!("{p}.self_attn.q_norm.weight"), hd)?)
                    } else {
                        None
                    },
                    k_norm: if qk_norm {
                        Some(norm(&format!("{p}.self_attn.k_norm.weight"), hd)?)
                    } else {
                        None
                    },
                    heads: nh,
                    kv_heads: nkv,
                    head_dim: hd,
                    decode_chain: Kernels::for_device(&device).decode_chain,
                    kv_dtype: KvCacheDtype::Model,
                    stacked: StackedQkv::default(),
                },
                post_norm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                mlp: Mlp {
                    gate: linear(&format!("{p}.mlp.gate_proj"), inter, h, false)?,
                    up: linear(&format!("{p}.mlp.up_proj"), inter, h, false)?,
                    down: linear(&format!("{p}.mlp.down_proj"), h, inter, false)?,
                },
            });
        }
        let lm_head = if cfg.tie_word_embeddings && !params.contains("lm_head.weight") {
            embed_w.clone()
        } else {
            get("lm_head.weight", &[v, h])?
        };
        let norm = norm("model.norm.weight", h)?;
        Ok(Qwen {
            cfg: cfg.clone(),
            embed: Embedding::new(embed_w, h),
            blocks,
            norm,
            lm_head: Linear::new(lm_head, None, detach),
            dtype,
            inv_freq: rope_inv_freq(hd, cfg.rope_theta(), &device)?,
            kernels: Kernels::for_device(&device),
            device,
            masters: std::sync::Arc::new(masters.into_inner()),
        })
    }

    /// The same model computing with `kernels`.
    pub fn with_kernels(mut self, kernels: Kernels) -> Qwen {
        self.kernels = kernels;
        for block in &mut self.blocks {
            block.attn.decode_chain = kernels.decode_chain;
        }
        self
    }

    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// How the KV cache holds keys and values ([`Qwen::with_kv_cache`]).
    pub fn kv_cache_dtype(&self) -> KvCacheDtype {
        self.blocks
            .first()
            .map_or(KvCacheDtype::Model, |b| b.attn.kv_dtype)
    }

    /// Bytes a cached key or value number takes on this model's device: one where the cache
    /// holds E4M3 bytes, else the model's dtype's (the CPU keeps FP8 values in it).
    pub fn kv_elem_bytes(&self) -> usize {
        self.kv_storage_dtype().size_in_bytes()
    }

    /// The dtype a KV cache's tensors have on this model's device: `U8` where it holds E4M3
    /// bytes ([`KvCacheDtype::holds_bytes`]), else the model's.
    pub fn kv_storage_dtype(&self) -> DType {
        if self.kv_cache_dtype().holds_bytes(&self.device) {
            DType::U8
        } else {
            self.dtype
        }
    }

    /// The same model with its KV cache holding keys and values as `dtype` says. FP8: each key
    /// and value rounded to E4M3 as it is cached; on the CPU its value is kept in the model's
    /// dtype (what an FP8 cache does to accuracy), on a GPU its byte (half the bytes a decode
    /// step reads: what it does to speed), bf16 models only there; dense or paged alike.
    pub fn with_kv_cache(mut self, dtype: KvCacheDtype) -> Result<Qwen> {
        if dtype.holds_bytes(&self.device) && self.device.is_cuda() && self.dtype != DType::BF16 {
            return Err(candle_core::Error::Msg(format!(
                "an FP8 KV cache on a GPU takes a bf16 model (this one computes in {:?})",
                self.dtype
            ))
            .into());
        }
        if dtype != KvCacheDtype::Model && !self.device.is_cpu() && !self.device.is_cuda() {
            return Err(candle_core::Error::Msg(
                "an FP8 KV cache runs on the CPU (emulated) or on CUDA".into(),
            )
            .into());
        }
        for block in &mut self.blocks {
            block.attn.kv_dtype = dtype;
        }
        Ok(self)
    }

    /// What every layer of a forward over `t` new positions after `past` cached ones takes
    /// besides its input: the attention mask and the rotary tables.
    fn layer_inputs(
        &self,
        positions: &Tensor,
        key_valid: &Tensor,
        past: usize,
        t: usize,
    ) -> Result<(AttnMask, Tensor, Tensor)> {
        let (cos, sin) = rope_tables(positions, &self.inv_freq, self.dtype)?;
        Ok((self.attn_mask(key_valid, past, t)?, cos, sin))
    }

    /// The attention mask of a forward over `t` new positions after `past` cached ones.
    fn attn_mask(&self, key_valid: &Tensor, past: usize, t: usize) -> Result<AttnMask> {
        let head_dim = self.cfg.head_dim();
        if self.kernels.flash_attention
            && crate::fused::flash_applies(&self.device, self.dtype, head_dim)
        {
            Ok(AttnMask::Keys {
                keys: crate::fused::ValidKeys::new(key_valid)?,
                past,
                backward: self.kernels.flash_backward,
            })
        } else {
            Ok(AttnMask::Bias(attention_bias(
                key_valid, past, t, self.dtype,
            )?))
        }
    }

    pub fn config(&self) -> &QwenConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Final hidden states `(B, T, H)` for `ids` `(B, T)` at `positions` `(B, T)` (u32), where
    /// `key_valid` `(B, S_past + T)` (u8, 1 = a real token) masks padding keys; attention is
    /// causal in the column index. Returns the extended cache.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&KvCache>,
    ) -> Result<(Tensor, KvCache)> {
        let (b, t) = ids.dims2()?;
        let past = cache.map_or(0, KvCache::len);
        let (mask, cos, sin) = self.layer_inputs(positions, key_valid, past, t)?;
        let (mut x, mut normed) = self.embedded(ids)?;
        let mut layers = Vec::with_capacity(self.blocks.len());
        let empty = KvCache::default();
        let cache = cache.unwrap_or(&empty);
        for (i, block) in self.blocks.iter().enumerate() {
            let (a, kv) = block
                .attn
                .forward(&normed, &cos, &sin, &mask, &cache.layer(i))?;
            (x, normed) = block.residual_mlp_normed(&x, &a, self.norm_after(i))?;
            layers.push(kv);
        }
        debug_assert_eq!(x.dims3()?.0, b);
        let cache = KvCache {
            layers,
            len: past + t,
            reserve: cache.reserve,
        };
        Ok((normed, cache))
    }

    /// The embedding of `ids` and its norm by the first layer's input norm (the final norm in
    /// a model without layers): where a forward's residual stream starts.
    fn embedded(&self, ids: &Tensor) -> Result<(Tensor, Tensor)> {
        let x = self.embed.forward(ids)?;
        let first = self.blocks.first().map_or(&self.norm, |b| &b.input_norm);
        let normed = first.forward(&x)?;
        Ok((x, normed))
    }

    /// The norm applied to layer i's output: the next layer's input norm, or the final norm.
    fn norm_after(&self, i: usize) -> &RmsNorm {
        self.blocks.get(i + 1).map_or(&self.norm, |b| &b.input_norm)
    }

    /// Final hidden states `(B, T, H)` for `ids` `(B, T)` at `positions` `(B, T)` (u32) over the
    /// paged cache `kv`: each layer writes the new positions' keys and values to the pool rows
    /// of `step` and attends through the blocks ([`PagedStep`]: a gathered view with the
    /// composed attention's mask, or the block tables for the decode kernel, T = 1).
    pub fn forward_paged(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        kv: &PagedKv,
        step: &PagedStep,
    ) -> Result<Tensor> {
        let t = ids.dim(1)?;
        let (cos, sin) = rope_tables(positions, &self.inv_freq, self.dtype)?;
        let mask = match &step.read {
            PagedRead::Gather {
                key_valid, width, ..
            } => Some(self.attn_mask(key_valid, width - t, t)?),
            PagedRead::Table { .. } => None,
        };
        let (mut x, mut normed) = self.embedded(ids)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let pool = kv
                .layer(i)
                .ok_or_else(|| candle_core::Error::Msg(format!("paged KV cache: no layer {i}")))?;
            let a = block
                .attn
                .forward_paged(&normed, &cos, &sin, mask.as_ref(), pool, step)?;
            (x, normed) = block.residual_mlp_normed(&x, &a, self.norm_after(i))?;
        }
        Ok(normed)
    }

    /// A forward and backward with gradient checkpointing per decoder layer (the manifests'
    /// `gradient_checkpointing`, as HF's and verl's): the layers first run without a graph,
    /// keeping only each layer's input `(B, T, H)`. Then `head` maps the final hidden states
    /// (as [`Qwen::forward_hidden`] returns them) to a scalar loss and whatever else it wants
    /// kept, computing logits with the model it is given (this one, up to the lm_head's leaf),
    /// and its backward gives the gradient at the last layer's output. Each layer, last to
    /// first, is then run again from its kept input, with a graph, and backpropagated from the
    /// gradient at its output, seeded with it directly ([`crate::fused::backward_seed`]: the
    /// gradients of `(y ⊙ g).sum_all()`, bit for bit, without a single-block reduction).
    ///
    /// Each backward's gradients go to `sink` as soon as it is done (the head's, each layer's,
    /// last to first, then the embedding's), and every parameter's gradient reaches `sink` in
    /// one store. A store's gradients still hang on the graph of their backward (a weight's
    /// `hᵀ·dy` holds h): a sink that adds them into detached sums ([`crate::optim::Gradients`])
    /// and drops the store lets that layer's activations go, so at most one layer's activations
    /// are alive at a time besides the sums (tests/it/train.rs measures it); one that keeps the
    /// stores keeps every layer's. The gradients are the plain backward's, bit for bit in f32
    /// (tests/it/model.rs).
    pub fn checkpointed_backward<T, E>(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        head: impl FnOnce(&Qwen, &Tensor) -> std::result::Result<(Tensor, T), E>,
        mut sink: impl FnMut(candle_core::backprop::GradStore) -> std::result::Result<(), E>,
    ) -> std::result::Result<T, E>
    where
        E: From<super::ModelError> + From<candle_core::Error>,
    {
        let (mask, cos, sin) = self.layer_inputs(positions, key_valid, 0, ids.dim(1)?)?;
        let x0 = self.embed.forward(ids)?;
        // The ids grouped by token for the embedding's backward by hand (a trained embedding's:
        // a frozen one's keeps autograd's route, which gives it nothing), read to the host here,
        // where the device's queue is short, rather than behind the whole backward.
        let embeddings = self.embed.embeddings();
        let token_rows = (self.kernels.layer_by_hand
            && by_hand::trained(embeddings, &self.masters)
            && crate::fused::embedding_backward_applies(&x0))
        .then(|| crate::fused::TokenRows::of(ids, embeddings.dim(0)?))
        .transpose()?;
        let none = KvCache::default().layer(0);
        let mut inputs = Vec::with_capacity(self.blocks.len());
        let mut x = x0.detach();
        for block in &self.blocks {
            let y = block.detached().forward(&x, &cos, &sin, &mask, &none)?.0;
            inputs.push(std::mem::replace(&mut x, y));
        }
        // The embedding's backward by hand reads the grouped ids, not the lookup's output: that
        // goes with the first layer's kept input (one `(B, T, H)` less through the backward).
        let embedding_backward = match token_rows {
            Some(rows) => {
                drop(x0);
                EmbeddingBackward::ByHand(rows)
            }
            None => EmbeddingBackward::Seeded(x0),
        };
        crate::device::mark(|| "forward without a graph: every layer's input kept".into());
        // With tied embeddings, the head reads the lm_head through a leaf of its own, and its
        // gradient joins the embedding's in the last backward below. Both then reach the weight
        // in the plain backward's order: the lm_head's share first, then the rows the
        // embedding lookup adds.
        let tied = self.embed.embeddings().id() == self.lm_head.weight.id();
        let (head_model, lm_leaf) = if tied {
            let leaf = candle_core::Var::from_tensor(&self.lm_head.weight.detach())?;
            let mut m = self.clone();
            m.lm_head = Linear::new(leaf.as_tensor().clone(), None, false);
            (std::borrow::Cow::Owned(m), Some(leaf))
        } else {
            (std::borrow::Cow::Borrowed(self), None)
        };
        let last = candle_core::Var::from_tensor(&x)?;
        let (loss, kept) = head(&head_model, &head_model.norm.forward(last.as_tensor())?)?;
        let mut grads = loss.backward()?;
        let mut g = take_grad(&mut grads, last.as_tensor())?;
        // (A head that never read the lm_head, the critic's, left no gradient to join.)
        let g_lm = lm_leaf.and_then(|leaf| grads.remove(leaf.as_tensor()));
        sink(grads)?;
        crate::device::mark(|| "head: the loss, its backward to the last layer".into());
        for (i, (block, input)) in self.blocks.iter().zip(inputs).enumerate().rev() {
            if self.kernels.layer_by_hand {
                let (dx, layer) =
                    block.backward_by_hand(&input, &g, &cos, &sin, &mask, &self.masters)?;
                drop(input);
                g = dx;
                sink(layer)?;
                crate::device::mark(|| format!("layer {i}: recomputed and backpropagated"));
                continue;
            }
            let input = candle_core::Var::from_tensor(&input)?;
            let y = block
                .forward(input.as_tensor(), &cos, &sin, &mask, &none)?
                .0;
            crate::device::part(FORWARD_ELEMENTWISE);
            let seed = crate::fused::backward_seed(&y, &g)?;
            crate::device::part(SEED);
            let mut layer = seed.backward()?;
            crate::device::part(BACKWARD_REST);
            // The seed holds the layer's graph (y and everything y was made from): gone before
            // the gradients go to the sink, so one layer's activations are alive at a time.
            drop((seed, y));
            g = take_grad(&mut layer, input.as_tensor())?;
            sink(layer)?;
            crate::device::mark(|| format!("layer {i}: recomputed and backpropagated"));
        }
        match &embedding_backward {
            EmbeddingBackward::ByHand(rows) => {
                // the lookup's backward in one pass, the lm_head's share its starting value
                sink(by_hand::embedding_backward(
                    embeddings,
                    rows,
                    &g,
                    g_lm.as_ref(),
                    &self.masters,
                )?)?;
            }
            EmbeddingBackward::Seeded(x0) => {
                let mut tail = crate::fused::backward_seed(x0, &g)?;
                if let Some(g_lm) = g_lm {
                    tail = (tail + crate::fused::backward_seed(&self.lm_head.weight, &g_lm)?)?;
                }
                sink(tail.backward()?)?;
            }
        }
        crate::device::mark(|| "embedding: backpropagated".into());
        Ok(kept)
    }

    /// Logits `(..., V)` from hidden states `(..., H)`, in f32.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.sampling_logits(hidden)?.to_dtype(DType::F32)?)
    }

    /// The logits a sampler draws from: the lm_head's output in the model's dtype, which the
    /// GPU's sampler reads as it is (no f32 copy of a step's `(rows, V)` first) and the host's
    /// casts to f32 (exactly: the values [`Qwen::logits`] gives).
    pub fn sampling_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)
    }

    /// Log-probabilities of `targets` `(B, T)` under softmax(logits / temperature) and, if
    /// asked, the entropy, both `(B, T)`: in vocabulary chunks when the kernels say so
    /// ([`Kernels::vocab_chunk`]), else from the logits of `chunk` positions at a time.
    pub fn token_log_probs(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        temperature: f64,
        chunk: usize,
        with_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if let Some(step) = self.kernels.vocab_chunk {
            let (b, t, h) = hidden.dims3()?;
            let (lp, ent) = crate::fused::vocab_log_probs(
                &hidden.reshape((b * t, h))?,
                &self.lm_head.weight,
                &targets.flatten_all()?,
                temperature,
                step,
            )?;
            let ent = with_entropy.then(|| ent.reshape((b, t))).transpose()?;
            return Ok((lp.reshape((b, t))?, ent));
        }
        let t = hidden.dim(1)?;
        let chunk = chunk.max(1);
        let (mut lps, mut ents) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < t {
            let len = chunk.min(t - start);
            let logits = self.logits(&hidden.narrow(1, start, len)?)?; // (B, len, V)
            lps.push(token::log_probs(
                &logits,
                &targets.narrow(1, start, len)?,
                temperature,
            )?);
            if with_entropy {
                ents.push(token::entropy(&logits, temperature)?);
            }
            start += len;
        }
        let lp = Tensor::cat(&lps, 1)?;
        let ent = if with_entropy {
            Some(Tensor::cat(&ents, 1)?)
        } else {
            None
        };
        Ok((lp, ent))
    }
}

/// The gradient of `t` taken out of `grads`, detached; zeros when nothing reached it. candle
/// keeps the graph of a leaf's gradient (e.g. a weight's `hᵀ·dy` still hangs on h), and a
/// later backward through it would add that graph's gradients a second time.
fn take_grad(grads: &mut candle_core::backprop::GradStore, t: &Tensor) -> Result<Tensor> {
    Ok(match grads.remove(t) {
        Some(g) => g.detach(),
        None => t.zeros_like()?,
    })
}

/// `(B, 1, T, S_past + T)` additive attention bias: 0 where key j is a real token and
/// j ≤ S_past + i (causal in the column index), −1e9 elsewhere.
pub fn attention_bias(key_valid: &Tensor, past: usize, t: usize, dtype: DType) -> Result<Tensor> {
    let valid = key_valid.to_dtype(DType::U8)?.to_vec2::<u8>()?;
    let b = valid.len();
    let s = past + t;
    let mut data = vec![MASKED as f32; b * t * s];
    for (bi, row) in valid.iter().enumerate() {
        if row.len() != s {
            return Err(candle_core::Error::Msg(format!(
                "key_valid has {} columns, expected {s}",
                row.len()
            ))
            .into());
        }
        for i in 0..t {
            for j in 0..=(past + i) {
                if row[j] != 0 {
                    data[(bi * t + i) * s + j] = 0.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(data, (b, 1, t, s), key_valid.device())?.to_dtype(dtype)?)
}

/// The critic of the PPO types: the policy's backbone with a scalar value head `score`
/// (HF's `*ForTokenClassification` with one label, as verl builds it).
#[derive(Debug, Clone)]
pub struct Critic {
    pub backbone: Qwen,
    head: Linear,
}

impl Critic {
    /// `params` must hold the backbone's weights and `score.weight` `(1, H)` + `score.bias` `(1)`
    /// (see [`super::init::add_value_head`]).
    pub fn new(cfg: &QwenConfig, params: &Params, detach: bool) -> Result<Critic> {
        let backbone = Qwen::new(cfg, params, detach)?;
        let h = cfg.hidden_size;
        let get = |n: &str, s: &[usize]| params.weight(n, s, detach);
        let head = Linear::new(
            get("score.weight", &[1, h])?,
            Some(get("score.bias", &[1])?),
            false,
        );
        Ok(Critic { backbone, head })
    }

    /// The same critic computing with `kernels` ([`Qwen::with_kernels`]).
    pub fn with_kernels(mut self, kernels: Kernels) -> Critic {
        self.backbone = self.backbone.with_kernels(kernels);
        self
    }

    /// Per-position values `(B, T)` in f32.
    pub fn values(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self
            .head
            .forward(hidden)?
            .squeeze(D::Minus1)?
            .to_dtype(DType::F32)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of `rows` rows whose first `len` of `cap` columns hold distinct numbers (keys
    /// positive, values negative), the rest zeros, as a sampler's cache keeps them.
    fn filled_cache(rows: usize, len: usize, cap: usize, first: f32) -> KvCache {
        let (kv, d) = (2, 3);
        let buf = |sign: f32| {
            let data: Vec<f32> = (0..rows * kv * cap * d)
                .map(|i| match i / d % cap < len {
                    true => sign * (first + i as f32),
                    false => 0.0,
                })
                .collect();
            Tensor::from_vec(data, (rows, kv, cap, d), &Device::Cpu).unwrap()
        };
        KvCache {
            layers: vec![(buf(1.0), buf(-1.0)), (buf(2.0), buf(-2.0))],
            len,
            reserve: 0,
        }
    }

    /// Merging two caches right-aligns each row's filled columns to end at the longer history,
    /// with zeros to their left and in the room beyond, the second cache's rows after the
    /// first's: whichever side is longer, and whether or not the longer one's buffer is already
    /// as wide as the merge (the path that copies it whole).
    #[test]
    fn append_rows_right_aligns_both_sides_into_one_buffer() {
        let (kv, d) = (2, 3);
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for ((ra, la, ca), (rb, lb, cb)) in [
            ((2, 5, 9), (3, 2, 4)),
            ((1, 2, 3), (2, 6, 8)),
            ((2, 4, 4), (1, 4, 7)),
        ] {
            let (a, b) = (
                filled_cache(ra, la, ca, 1.0),
                filled_cache(rb, lb, cb, 1000.0),
            );
            let merged = a.clone().append_rows(&b).unwrap();
            let len = la.max(lb);
            let cap = (ca + len - la).max(cb + len - lb);
            assert_eq!((merged.len(), merged.capacity()), (len, cap));
            for (layer, (mk, mv)) in merged.layers().iter().enumerate() {
                for (which, got) in [mk, mv].into_iter().enumerate() {
                    let side = |c: &KvCache| {
                        let (k, v) = &c.layers()[layer];
                        flat(if which == 0 { k } else { v })
                    };
                    let (sa, sb, got) = (side(&a), side(&b), flat(got));
                    assert_eq!(got.len(), (ra + rb) * kv * cap * d);
                    for (i, &x) in got.iter().enumerate() {
                        let (row, h, col, e) =
                            (i / d / cap / kv, i / d / cap % kv, i / d % cap, i % d);
                        let (src, r, c_len, c_cap) = match row < ra {
                            true => (&sa, row, la, ca),
                            false => (&sb, row - ra, lb, cb),
                        };
                        let want = match (len - c_len..len).contains(&col) {
                            true => src[((r * kv + h) * c_cap + col + c_len - len) * d + e],
                            false => 0.0,
                        };
                        assert_eq!(
                            x.to_bits(),
                            want.to_bits(),
                            "layer {layer} {} row {row} head {h} column {col} dim {e}",
                            ["keys", "values"][which]
                        );
                    }
                }
            }
        }
    }

    /// Dropping rows keeps each kept row's buffers as `index_select` does: the filled columns
    /// copied, and the capacity beyond them (never read before written) zeros.
    #[test]
    fn kept_rows_equal_index_select_on_the_filled_columns() {
        let (b, kv, cap, d, len) = (5, 2, 7, 3, 4);
        let n = b * kv * cap * d;
        // Filled columns hold their index + 1; the unfilled ones zeros, as a cache keeps them.
        let data: Vec<f32> = (0..n)
            .map(|i| {
                if (i / d) % cap < len {
                    i as f32 + 1.0
                } else {
                    0.0
                }
            })
            .collect();
        let buf = Tensor::from_vec(data, (b, kv, cap, d), &Device::Cpu).unwrap();
        let rows = Tensor::new(&[4u32, 0, 2], &Device::Cpu).unwrap();
        let kept = kept_rows(&buf, &rows, len).unwrap().expect("applies");
        let want = buf.index_select(&rows, 0).unwrap();
        assert_eq!(kept.dims(), want.dims());
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&kept), flat(&want));
        // A row outside the batch is an error, not a read beyond the buffer.
        let bad = Tensor::new(&[5u32], &Device::Cpu).unwrap();
        assert!(kept_rows(&buf, &bad, len).is_err());
    }

    /// A cache of `b` rows, one layer, `len` positions filled with `fill(i)` (`i` the buffer's
    /// flat index; the values are 10 times the keys) in buffers of `cap` columns (the rest
    /// zeros).
    fn cache(b: usize, len: usize, cap: usize, fill: impl Fn(usize) -> f32) -> KvCache {
        let (kv, d) = (2, 3);
        let data: Vec<f32> = (0..b * kv * cap * d)
            .map(|i| if (i / d) % cap < len { fill(i) } else { 0.0 })
            .collect();
        let buf = Tensor::from_vec(data, (b, kv, cap, d), &Device::Cpu).unwrap();
        KvCache {
            layers: vec![(buf.clone(), (buf * 10.0).unwrap())],
            len,
            reserve: 0,
        }
    }

    /// Dropping the first columns keeps every row's later columns, at the front of buffers of
    /// the capacity asked for (the rest zeros); more than the cache holds is an error.
    #[test]
    fn dropping_the_front_columns_keeps_the_rest_in_order() {
        let (b, len, cap) = (3, 6, 7);
        let full = cache(b, len, cap, |i| i as f32 + 1.0);
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let before = [flat(&full.layers[0].0), flat(&full.layers[0].1)];
        let (_, kv, _, d) = full.layers[0].0.dims4().unwrap();
        let (drop, room) = (4, 5);
        let kept = full.clone().drop_front(drop, room).expect("drops");
        assert_eq!((kept.len(), kept.capacity()), (len - drop, room));
        for (which, buf) in [&kept.layers[0].0, &kept.layers[0].1]
            .into_iter()
            .enumerate()
        {
            let got = flat(buf);
            for r in 0..b {
                for h in 0..kv {
                    for col in 0..room {
                        for e in 0..d {
                            let want = match col < len - drop {
                                true => before[which][((r * kv + h) * cap + col + drop) * d + e],
                                false => 0.0,
                            };
                            let at = ((r * kv + h) * room + col) * d + e;
                            assert_eq!(got[at], want, "buffer {which}, row {r}, column {col}");
                        }
                    }
                }
            }
        }
        assert!(full.clone().drop_front(len + 1, cap).is_err());
        assert!(full.drop_front(1, len - 2).is_err());
    }

    /// A joining prompt's row lands in the finished row's place, right-aligned to the batch's
    /// history; the columns left of it and every other row keep what they held.
    #[test]
    fn a_placed_row_ends_at_the_batchs_column_and_moves_nothing_else() {
        let (b, len, cap) = (3, 5, 8);
        let batch = cache(b, len, cap, |i| i as f32 + 1.0);
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let before = [flat(&batch.layers[0].0), flat(&batch.layers[0].1)];
        // two rows of two positions; row 1 joins in the place of the batch's row 1
        let joined = cache(2, 2, 2, |i| -(i as f32) - 1.0);
        batch.place_row(1, &joined, 1).expect("fits");
        let (k, v) = &batch.layers[0];
        let (jk, jv) = &joined.layers[0];
        let (_, kv, _, d) = k.dims4().unwrap();
        for (which, (buf, src)) in [(k, jk), (v, jv)].into_iter().enumerate() {
            let (got, src) = (flat(buf), flat(src));
            for r in 0..b {
                for h in 0..kv {
                    for col in 0..cap {
                        for e in 0..d {
                            let at = ((r * kv + h) * cap + col) * d + e;
                            // the joined row's 2 columns end at the batch's column 5
                            let want = if r == 1 && (3..5).contains(&col) {
                                src[((kv + h) * 2 + col - 3) * d + e]
                            } else {
                                before[which][at]
                            };
                            assert_eq!(
                                got[at], want,
                                "buffer {which}, row {r}, head {h}, column {col}"
                            );
                        }
                    }
                }
            }
        }
        // what does not fit, or is not there, is an error
        let longer = cache(1, len + 1, len + 1, |i| i as f32);
        assert!(batch.place_row(0, &longer, 0).is_err());
        assert!(batch.place_row(b, &joined, 0).is_err());
        assert!(batch.place_row(0, &joined, 2).is_err());
    }
}
