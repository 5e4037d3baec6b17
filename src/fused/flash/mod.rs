//! Flash attention (FlashAttention-2, Dao 2023): softmax(Q·Kᵀ·scale + mask)·V without the
//! `(B, H, T, S)` scores, forward and backward. The forward keeps two numbers per query row, the
//! maximum score m and 1/Σ e^{s−m} (the log-sum-exp, split), and the backward recomputes the
//! probabilities from them.
//!
//! The semantics are those of the composed attention ([`attention_composed`], the model's path
//! on the CPU and the oracle of the tests):
//! - grouped-query attention: query head h reads KV head h / (H / KV), and K/V are never repeated;
//! - key j is visible to query i iff `key_valid[b, j]` and j ≤ past + i;
//! - a hidden key's score gets −1e9 added (not −∞). A query that sees no key at all (a left-padding
//!   row) therefore averages V uniformly over every key, as the composed softmax does.
//!
//! Backward (FA2, Algorithm 2): P = e^{S−m}/Σ is recomputed, then
//! - δᵢ = Σ_d dOᵢ·Oᵢ,
//! - dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P ⊙ (dP − δ),
//! - dQ = scale·dS·K, dK = scale·dSᵀ·Q, both summed over the query heads that share a KV head.
//!
//! FA2 keeps lse = m + ln Σ instead; here that would be wrong for a row that sees no key: its
//! scores are all ≈ −1e9, where f32 cannot hold ln Σ ≤ ln S beside m, and e^{s − lse} would
//! be 1 instead of 1/S.
//!
//! Each gradient row has one owner: dQ is computed by query rows, dK and dV by key rows. There
//! are no atomics, so a result is the same on every run.
//!
//! The CPU twin here computes every row exactly: all S scores, then max, exp and sum. The CUDA
//! kernels use FA2's online softmax over tiles of keys, and skip the tiles hidden from every row
//! of a block: the row kernels (`kernels/flash_attn.cu`, any dtype, head dim ≤ 128) and the
//! tensor-core kernels (`kernels/flash_mma.cu`, bf16 at head dim 64 and 128, forward and
//! backward); [`cuda`] launches them and says which takes a call. Their results agree with the
//! twin to float tolerance (tests/it/cuda.rs; kernels/check/flash_check.cu without this build).

use std::sync::Mutex;

#[cfg(feature = "cuda")]
use candle_core::{op::BackpropOp, Storage};
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use serde::Serialize;

use super::{
    attention_probs, exp_shifted_in_place, row_max, slice_f32, worth_splitting, PAR_MIN_ELEMS,
};

#[cfg(feature = "cuda")]
mod cuda;
mod paged;

pub use paged::{paged_applies, paged_attention_decode, RowLens};

/// The largest head dimension the kernels take (the paper's models use 128). Larger heads use
/// the composed attention.
pub const FLASH_MAX_HEAD_DIM: usize = 128;

/// The additive bias of a hidden key, as `model::qwen::attention_bias` writes it.
const MASKED: f32 = -1e9;

/// The shapes of one attention call: q `(B, H, T, D)`, k and v `(B, KV, cap, D)` of which the
/// first S = past + T columns are keys (a KV cache's buffers have room beyond them).
#[derive(Debug, Clone, Copy)]
pub struct FlashDims {
    pub b: usize,
    pub h: usize,
    pub kv: usize,
    pub t: usize,
    pub s: usize,
    /// Columns allocated in k and v (≥ s).
    pub cap: usize,
    pub d: usize,
    pub past: usize,
    pub scale: f32,
}

impl FlashDims {
    fn of(q: &Tensor, k: &Tensor, v: &Tensor, past: usize, scale: f64) -> Result<FlashDims> {
        let (b, h, t, d) = q.dims4()?;
        let (kb, kv, cap, kd) = k.dims4()?;
        let s = past + t;
        if kb != b || kd != d || v.dims() != k.dims() || kv == 0 || h % kv != 0 {
            candle_core::bail!(
                "flash attention: q {:?}, k {:?} and v {:?} do not fit together",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        if cap < s {
            candle_core::bail!(
                "flash attention: {cap} key columns for {past} cached and {t} new positions"
            );
        }
        Ok(FlashDims {
            b,
            h,
            kv,
            t,
            s,
            cap,
            d,
            past,
            scale: scale as f32,
        })
    }

    /// Query rows, `B·H·T`.
    pub fn rows(&self) -> usize {
        self.b * self.h * self.t
    }

    /// (batch, query head, position) of query row `r`, and the KV head it reads.
    fn query(&self, r: usize) -> (usize, usize, usize, usize) {
        let (bi, hi, i) = (r / (self.h * self.t), (r / self.t) % self.h, r % self.t);
        (bi, hi, i, hi / (self.h / self.kv))
    }

    /// The score bias of key j for query position i of batch row bi.
    fn bias(&self, valid: &[u8], bi: usize, i: usize, j: usize) -> f32 {
        if valid[bi * self.s + j] != 0 && j <= self.past + i {
            0.0
        } else {
            MASKED
        }
    }
}

/// The shapes of one paged decode: q `(B, H, 1, D)`, pools `(blocks, KV, block, D)`, tables
/// `(B, nblk)`.
#[derive(Debug, Clone, Copy)]
pub struct PagedDims {
    pub b: usize,
    pub h: usize,
    pub kv: usize,
    pub d: usize,
    pub blocks: usize,
    pub block: usize,
    pub nblk: usize,
    /// The longest row's keys.
    pub longest: usize,
    pub scale: f32,
}

/// Whether the flash kernels take attention on `device` in `dtype` with this head dim: CPU f32
/// (the twin), or CUDA f32/bf16, head dim ≤ [`FLASH_MAX_HEAD_DIM`].
pub fn flash_applies(device: &Device, dtype: DType, head_dim: usize) -> bool {
    let kernel = (device.is_cpu() && dtype == DType::F32)
        || (cfg!(feature = "cuda")
            && device.is_cuda()
            && matches!(dtype, DType::F32 | DType::BF16));
    kernel && head_dim <= FLASH_MAX_HEAD_DIM
}

/// The most query heads per KV head the pipelined decode kernel takes (`FDP_MAXG`,
/// kernels/launch.cuh).
pub const PIPE_MAX_GROUP: usize = 8;

/// Whether the pipelined decode kernel reads an FP8 KV cache (E4M3 bytes, on CUDA) as it is at
/// this head dim with `group` query heads per KV head (`kernels/flash_decode.cu`'s `*_fp8`
/// instances: one new position, bf16 queries). Elsewhere the model reads the cache cast to its
/// dtype.
pub fn fp8_decode_applies(head_dim: usize, group: usize) -> bool {
    cfg!(feature = "cuda") && matches!(head_dim, 64 | 128) && (1..=PIPE_MAX_GROUP).contains(&group)
}

/// How the CUDA tensor-core kernels compute the backward (FA2, Algorithm 2). Both give the same
/// dK and dV bits and a dQ that is the same from run to run; they differ in dQ's order of sums
/// and in speed. The CPU twin and the row kernels have one backward, which both choices take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlashBackward {
    /// Two kernels, 7 products: dQ by query tiles (recomputing S and dP), dK and dV by key
    /// blocks. Each gradient row has one owner. What every shipped result ran.
    #[default]
    Pair,
    /// One kernel, 5 products (`flash_dkdvq_*`, kernels/NOTES.md version 8): dK/dV by key
    /// blocks, each adding its share of dQ (dS·K) to f32 sums in key-block order, a counter per
    /// query tile holding the order; then dQ = scale · sums in bf16. Needs one f32 copy of dQ and
    /// the counters, zeroed per call.
    FiveProducts,
}

/// Whether the tensor-core kernels (`kernels/flash_mma.cu`) take this dtype and head dim:
/// bf16 at head dim 64 or 128 (their operands must also start on 16 bytes).
fn tensor_cores_take(dtype: DType, head_dim: usize) -> bool {
    dtype == DType::BF16 && matches!(head_dim, 64 | 128)
}

impl FlashBackward {
    /// The backward that runs where `self` is asked on `device` in `dtype` at this head dim:
    /// the 5 products only on CUDA's tensor-core kernels (bf16, head dim 64 or 128, operands on
    /// 16 bytes, which a contiguous tensor of its own is), the pair's everywhere else. What a
    /// report says ran.
    pub fn runs_on(self, device: &Device, dtype: DType, head_dim: usize) -> FlashBackward {
        if cfg!(feature = "cuda") && device.is_cuda() && tensor_cores_take(dtype, head_dim) {
            self
        } else {
            FlashBackward::Pair
        }
    }
}

/// The keys each sequence sees, as the flash kernels take them: `valid` `(B, S)` u8 (1 = a real
/// token) and, on CUDA, each sequence's first valid key `(B)` u32, where the kernels start a
/// row. Made once for every layer of a forward that shares the mask ([`ValidKeys::new`]: one
/// launch a forward, where each layer's call made its own, 28 a decode step of Qwen3-1.7B).
#[derive(Debug, Clone)]
pub struct ValidKeys {
    pub valid: Tensor,
    /// None: each call computes it (the CPU twin always does).
    pub first: Option<Tensor>,
}

impl ValidKeys {
    /// `key_valid` `(B, S)` (any dtype, 1 = a real token), its first valid keys made now on CUDA.
    pub fn new(key_valid: &Tensor) -> Result<ValidKeys> {
        let valid = key_valid.to_dtype(DType::U8)?.contiguous()?;
        let first = if valid.device().is_cuda() {
            Some(valid.apply_op1_no_bwd(&FirstValid)?)
        } else {
            None
        };
        Ok(ValidKeys { valid, first })
    }

    /// `key_valid` alone: each flash call finds its rows' first valid keys itself.
    pub fn plain(key_valid: &Tensor) -> Result<ValidKeys> {
        Ok(ValidKeys {
            valid: key_valid.to_dtype(DType::U8)?.contiguous()?,
            first: None,
        })
    }
}

/// The first valid key of each row of a `(B, S)` u8 mask (`S` when none): `(B)` u32, on CUDA
/// (`flash_first_valid`); the CPU twin finds it inside each call.
struct FirstValid;

impl candle_core::CustomOp1 for FirstValid {
    fn name(&self) -> &'static str {
        "acpo-flash-first-valid"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!(
            "{}: the CPU twin finds a row's first key itself",
            self.name()
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, n) = l.shape().dims2()?;
        let first = cuda::first_valid(b, n, (s, l))?;
        Ok((
            candle_core::CudaStorage::wrap_cuda_slice(first, s.device.clone()),
            Shape::from(b),
        ))
    }
}

/// softmax(q·kᵀ·scale + mask)·v, `(B, H, T, D)`, with q `(B, H, T, D)`, k and v `(B, KV, S, D)`,
/// `key_valid` `(B, S)` (1 = a real token) and `past` = S − T cached positions; its backward as
/// `backward` says. Callers check [`flash_applies`]; q, k and v share a dtype, except on CUDA
/// for one new position over an FP8 cache: k and v E4M3 bytes (u8) under a bf16 q
/// ([`fp8_decode_applies`]).
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_valid: &Tensor,
    past: usize,
    scale: f64,
    backward: FlashBackward,
) -> Result<Tensor> {
    flash_attention_keys(
        q,
        k,
        v,
        &ValidKeys::plain(key_valid)?,
        past,
        scale,
        backward,
    )
}

/// [`flash_attention`] over keys given as [`ValidKeys`] (their first valid keys made once for
/// the layers that share them).
pub fn flash_attention_keys(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keys: &ValidKeys,
    past: usize,
    scale: f64,
    backward: FlashBackward,
) -> Result<Tensor> {
    let dims = FlashDims::of(q, k, v, past, scale)?;
    let key_valid = &keys.valid;
    if key_valid.dims() != [dims.b, dims.s] || key_valid.dtype() != DType::U8 {
        candle_core::bail!(
            "flash attention: key_valid {:?} {:?} for {} sequences of {} keys",
            key_valid.dims(),
            key_valid.dtype(),
            dims.b,
            dims.s
        );
    }
    if let Some(first) = &keys.first {
        if first.dims() != [dims.b] || first.dtype() != DType::U32 {
            candle_core::bail!(
                "flash attention: first keys {:?} {:?} for {} sequences",
                first.dims(),
                first.dtype(),
                dims.b
            );
        }
    }
    let op = FlashAttention {
        dims,
        backward,
        key_valid: key_valid.contiguous()?,
        first: keys.first.clone(),
        stats: Mutex::new(None),
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// The oracle: scores, the masked softmax ([`attention_probs`]) and the product with V, from
/// candle ops, with `bias` `(B, 1, T, S)` from `model::qwen::attention_bias`. Grouped-query
/// without repeating K/V: the rep query heads of one KV head are stacked as rows of one product.
pub fn attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (_, kv, s, _) = k.dims4()?;
    let rep = h / kv;
    let qg = q.contiguous()?.reshape((b, kv, rep * t, d))?;
    let scores = qg.matmul(&k.t()?)?.reshape((b, kv, rep, t, s))?; // (B, KV, rep, T, S)
    let probs = attention_probs(&scores, bias, scale)?.reshape((b, kv, rep * t, s))?;
    probs.matmul(v)?.reshape((b, h, t, d)) // (B, KV, rep·T, D) = (B, H, T, D)
}

/// The forward op. Its output is O. The row statistics `(B, H, T, 2)` = [m, 1/Σ] stay in the
/// op for the backward, in f32 whatever the storage dtype. The autograd graph keeps the op alive.
struct FlashAttention {
    dims: FlashDims,
    /// Read by the CUDA kernels' backward only.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    backward: FlashBackward,
    key_valid: Tensor,
    /// Each sequence's first valid key, made once for the layers that share the mask (CUDA).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    first: Option<Tensor>,
    stats: Mutex<Option<Tensor>>,
}

impl FlashAttention {
    fn keep_stats(&self, stats: Tensor) {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
    }
}

fn cpu_u8(t: &Tensor) -> Result<Vec<u8>> {
    t.flatten_all()?.to_vec1::<u8>()
}

fn cpu_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Maps `f` over `0..n`, in parallel when `work` is large.
fn map_rows<R: Send, F: Fn(usize) -> R + Sync + Send>(n: usize, work: usize, f: F) -> Vec<R> {
    if worth_splitting(work, PAR_MIN_ELEMS) {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// Scores of query row `r` against every key: `q·k·scale + bias`.
fn row_scores(dims: &FlashDims, q: &[f32], k: &[f32], valid: &[u8], r: usize) -> Vec<f32> {
    let d = dims.d;
    let (bi, _, i, g) = dims.query(r);
    let qr = &q[r * d..(r + 1) * d];
    let kb = (bi * dims.kv + g) * dims.cap * d;
    (0..dims.s)
        .map(|j| {
            dot(qr, &k[kb + j * d..kb + (j + 1) * d]) * dims.scale + dims.bias(valid, bi, i, j)
        })
        .collect()
}

/// The CPU forward: O `(B·H·T·D)` and the row statistics [m, 1/Σ] `(B·H·T·2)`.
pub(crate) fn cpu_forward(
    dims: &FlashDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    valid: &[u8],
) -> (Vec<f32>, Vec<f32>) {
    let d = dims.d;
    let work = dims.rows() * dims.s * d;
    let rows = map_rows(dims.rows(), work, |r| {
        let (bi, _, _, g) = dims.query(r);
        let mut p = row_scores(dims, q, k, valid, r);
        let m = row_max(&p);
        let sum = exp_shifted_in_place(&mut p, m);
        let vb = (bi * dims.kv + g) * dims.cap * d;
        let mut o = vec![0f32; d];
        for (j, &pj) in p.iter().enumerate() {
            let w = pj / sum;
            for (o, &x) in o.iter_mut().zip(&v[vb + j * d..vb + (j + 1) * d]) {
                *o += w * x;
            }
        }
        (o, [m, 1.0 / sum])
    });
    let mut o = Vec::with_capacity(dims.rows() * d);
    let mut stats = Vec::with_capacity(2 * dims.rows());
    for (row, st) in rows {
        o.extend(row);
        stats.extend(st);
    }
    (o, stats)
}

/// The CPU backward: dQ, dK, dV (the layouts of q, k, v).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cpu_backward(
    dims: &FlashDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    dout: &[f32],
    stats: &[f32],
    valid: &[u8],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let prob = |sc: f32, r: usize| (sc - stats[2 * r]).exp() * stats[2 * r + 1];
    let d = dims.d;
    let work = dims.rows() * dims.s * d;
    let delta: Vec<f32> = (0..dims.rows())
        .map(|r| dot(&dout[r * d..(r + 1) * d], &o[r * d..(r + 1) * d]))
        .collect();
    // dQ, by query rows.
    let dq = map_rows(dims.rows(), work, |r| {
        let (bi, _, _, g) = dims.query(r);
        let kb = (bi * dims.kv + g) * dims.s * d;
        let dor = &dout[r * d..(r + 1) * d];
        let mut dq = vec![0f32; d];
        for (j, sc) in row_scores(dims, q, k, valid, r).into_iter().enumerate() {
            let p = prob(sc, r);
            let dp = dot(dor, &v[kb + j * d..kb + (j + 1) * d]);
            let ds = p * (dp - delta[r]) * dims.scale;
            for (x, &kx) in dq.iter_mut().zip(&k[kb + j * d..kb + (j + 1) * d]) {
                *x += ds * kx;
            }
        }
        dq
    });
    // dK and dV, by key rows: every query row of the rep heads that read this KV head.
    let rep = dims.h / dims.kv;
    let key_rows = dims.b * dims.kv * dims.s;
    let dkv = map_rows(key_rows, work, |kr| {
        let (bi, g, j) = (
            kr / (dims.kv * dims.s),
            (kr / dims.s) % dims.kv,
            kr % dims.s,
        );
        let kj = &k[kr * d..(kr + 1) * d];
        let vj = &v[kr * d..(kr + 1) * d];
        let (mut dk, mut dv) = (vec![0f32; d], vec![0f32; d]);
        for hi in g * rep..(g + 1) * rep {
            for i in 0..dims.t {
                let r = (bi * dims.h + hi) * dims.t + i;
                let qr = &q[r * d..(r + 1) * d];
                let dor = &dout[r * d..(r + 1) * d];
                let sc = dot(qr, kj) * dims.scale + dims.bias(valid, bi, i, j);
                let p = prob(sc, r);
                let ds = p * (dot(dor, vj) - delta[r]) * dims.scale;
                for c in 0..d {
                    dv[c] += p * dor[c];
                    dk[c] += ds * qr[c];
                }
            }
        }
        (dk, dv)
    });
    let (mut dk, mut dv) = (
        Vec::with_capacity(key_rows * d),
        Vec::with_capacity(key_rows * d),
    );
    for (a, b) in dkv {
        dk.extend(a);
        dv.extend(b);
    }
    (dq.concat(), dk, dv)
}

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "acpo-flash-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (
            slice_f32(s1, l1, self.name())?,
            slice_f32(s2, l2, self.name())?,
            slice_f32(s3, l3, self.name())?,
        );
        let valid = cpu_u8(&self.key_valid)?;
        let (o, stats) = cpu_forward(&self.dims, q, k, v, &valid);
        let dims = &self.dims;
        self.keep_stats(Tensor::from_vec(
            stats,
            (dims.b, dims.h, dims.t, 2),
            &Device::Cpu,
        )?);
        Ok((CpuStorage::F32(o), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (valid, lv) = self.key_valid.storage_and_layout();
        let Storage::Cuda(valid) = &*valid else {
            candle_core::bail!("{}: key_valid is not on the GPU", self.name());
        };
        let first_guard = self.first.as_ref().map(Tensor::storage_and_layout);
        let first = match &first_guard {
            Some((s, l)) => match &**s {
                Storage::Cuda(s) => Some((s, *l)),
                _ => candle_core::bail!("{}: the first keys are not on the GPU", self.name()),
            },
            None => None,
        };
        let (o, stats) = cuda::flash_fwd(
            &self.dims,
            (s1, l1),
            (s2, l2),
            (s3, l3),
            ((valid, lv), first),
        )?;
        let dims = &self.dims;
        self.keep_stats(Tensor::from_storage(
            Storage::Cuda(stats),
            (dims.b, dims.h, dims.t, 2),
            BackpropOp::none(),
            false,
        ));
        Ok((o, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        dout: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if self.dims.cap != self.dims.s {
            candle_core::bail!(
                "{}: no backward through a KV cache's spare room",
                self.name()
            );
        }
        let stats = self
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                candle_core::Error::Msg(format!("{}: backward before forward", self.name()))
            })?;
        crate::device::part(crate::device::BACKWARD_REST);
        let dout = dout.contiguous()?;
        let (dq, dk, dv) = if q.device().is_cpu() {
            let dims = &self.dims;
            let (dq, dk, dv) = cpu_backward(
                dims,
                &cpu_f32(q)?,
                &cpu_f32(k)?,
                &cpu_f32(v)?,
                &cpu_f32(o)?,
                &cpu_f32(&dout)?,
                &cpu_f32(&stats)?,
                &cpu_u8(&self.key_valid)?,
            );
            (
                Tensor::from_vec(dq, q.shape(), q.device())?,
                Tensor::from_vec(dk, k.shape(), k.device())?,
                Tensor::from_vec(dv, v.shape(), v.device())?,
            )
        } else {
            self.cuda_backward(q, k, v, o, &dout, &stats)?
        };
        // A traced backward's attention, apart from the rest of the layer's backward.
        crate::device::part(crate::device::BACKWARD_ATTENTION);
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

impl FlashAttention {
    #[cfg(feature = "cuda")]
    fn cuda_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        dout: &Tensor,
        stats: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let mut all = vec![q, k, v, o, dout, stats, &self.key_valid];
        all.extend(self.first.as_ref());
        let guards: Vec<_> = all.iter().map(|t| t.storage_and_layout()).collect();
        let mut cuda = Vec::with_capacity(guards.len());
        for (st, l) in &guards {
            match &**st {
                Storage::Cuda(s) => cuda.push((s, *l)),
                _ => candle_core::bail!("{}: backward inputs are not on one GPU", self.name()),
            }
        }
        let (dq, dk, dv) = cuda::flash_bwd(
            &self.dims,
            self.backward,
            cuda[0],
            cuda[1],
            cuda[2],
            cuda[3],
            cuda[4],
            cuda[5],
            (cuda[6], cuda.get(7).copied()),
        )?;
        let wrap = |s, t: &Tensor| {
            Tensor::from_storage(Storage::Cuda(s), t.shape(), BackpropOp::none(), false)
        };
        Ok((wrap(dq, q), wrap(dk, k), wrap(dv, v)))
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda_backward(
        &self,
        _q: &Tensor,
        _k: &Tensor,
        _v: &Tensor,
        _o: &Tensor,
        _dout: &Tensor,
        _stats: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        candle_core::bail!("{}: this binary has no CUDA", self.name())
    }
}
