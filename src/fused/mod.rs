//! Fused CPU kernels, each with its backward, for the hot spots of a training step and of
//! sampling on CPU (f32).
//!
//! The model is built from basic candle ops so that every weight gets a gradient (candle's own
//! fused `softmax_last_dim` / `rms_norm` have no backward). Composed ops cost one pass over
//! memory and one allocation each, forward and backward: RMSNorm is 6 passes, the attention
//! softmax 5, the token log-probability 8, and their backward passes more. The ops here do the
//! same math in one pass and define `bwd` explicitly, so the autograd graph stays complete.
//! Backward passes that need several outputs (RMSNorm: dx and dw) return them stacked in one
//! tensor that is then split, since a custom op has one output.
//!
//! - [`attention_probs`]: softmax(scores·scale + mask) over the last dim; backward
//!   `dx = scale · y ⊙ (dy − Σ dy·y)`.
//! - [`rope`]: the rotary embedding; backward is the inverse rotation.
//! - [`swiglu`]: silu(gate) ⊙ up; backward for both.
//! - [`rms_norm`]: `x / sqrt(mean(x²) + ε) · w`; backward for `x` and `w`.
//! - [`token_log_probs`]: `log softmax(z)[t]` per row; backward `dz = g · (onehot(t) − softmax(z))`.
//! - [`flash_attention`]: softmax(Q·Kᵀ·scale + mask)·V without the `(B, H, T, S)` scores, forward
//!   and backward (FlashAttention-2), keeping the log-sum-exp of each row for the backward.
//! - [`vocab_log_probs`]: the lm_head product, log-softmax, the taken token's log-probability and
//!   the entropy in vocabulary chunks, forward and backward, with no `(N, V)` logits.
//! - [`matmul`]: `a · b` with gemm's depth blocks fixed, so that the bits do not depend on the
//!   CPU's cache (the weight gradients of every linear layer and the lm_head go through it).
//! - [`linear_small_m`]: `x · Wᵀ` for a handful of rows (sampling decodes 1 token per sequence):
//!   a general GEMM packs W for every call, which costs more than the product at these shapes;
//!   this kernel streams W once, row by row.
//! - [`attention_decode`]: a decode step's attention (one query per row, no backward) with the
//!   composed attention's numbers bit for bit, without two gemm calls per (row, key head).
//! - [`qk_norm_rope_cache`], [`add_rms_norm`]: a decode step's q/k norms, rotary embedding and
//!   KV-cache write in one CUDA launch after one q/k/v product, and each residual add with the
//!   RMSNorm after it in another (sampling on CUDA only; the CPU keeps the composed ops).
//! - [`backward_seed`]: the scalar ⟨y, g⟩ whose backward hands a known output gradient `g` to
//!   `y`, to start a backward from `g` without a single-block `sum_all` to differentiate.
//! - [`embedding_backward`]: the embedding lookup's backward in one pass (each vocabulary row's
//!   positions gathered first), the tied lm_head's share its starting value, in f32.
//! - [`exp_in_place`]: `f32::exp` eight at a time with libm's bits (glibc's `expf` in AVX2),
//!   for SwiGLU.
//!
//! Every op lives in its own file beside its composed reference path (other devices, other
//! dtypes) — the twin a CUDA kernel is tested against too — and the tests in
//! `tests/it/fused.rs` compare values and gradients of the two. With the `cuda` feature each op
//! also has a `cuda_fwd` launching its kernel from `kernels/` (f32 and bf16 storage) from a
//! `cuda` module in the op's own file (`launch` holds what the launches share), tested against
//! the CPU op in `tests/it/cuda.rs`.

mod decode_attention;
mod decode_chain;
mod embedding;
mod expf;
mod flash;
mod fp8;
#[cfg(feature = "cuda")]
pub(crate) mod launch;
mod log_probs;
mod matmul;
mod rms_norm;
mod rope;
mod seed;
mod small_m;
mod softmax;
mod swiglu;
mod vocab;
mod vocab_chunk;

pub use decode_attention::attention_decode;
pub use decode_chain::{
    add_rms_norm, add_rms_norm_composed, decode_chain_launches, pool_store_launches,
    qk_chain_applies, qk_norm_rope_cache, qk_norm_rope_cache_composed, store_rows, ChainLaunches,
    KvWrite, QkNorms,
};
pub use embedding::{
    embedding_backward, embedding_backward_applies, embedding_backward_host, TokenRows,
};
pub use expf::exp_in_place;
pub use flash::{
    attention_composed, flash_applies, flash_attention, flash_attention_keys, fp8_decode_applies,
    paged_applies, paged_attention_decode, FlashBackward, FlashDims, RowLens, ValidKeys,
    FLASH_MAX_HEAD_DIM,
};
pub use fp8::{fp8_byte, fp8_value, from_fp8_bytes, to_fp8_bytes};
pub use log_probs::token_log_probs;
pub use matmul::{matmul, DEPTH_BLOCK};
pub use rms_norm::{rms_norm, rms_norm_backward, rms_norm_backward_add, rms_norm_composed};
pub use rope::{rope, rope_composed, rope_heads, rope_table, rope_tables, rope_tokens_first, Trig};
pub use seed::backward_seed;
pub use small_m::{linear_small_m, linear_small_m_packed, pack_pairs, SMALL_M};
pub use softmax::{attention_probs, attention_probs_composed, softmax_last_composed};
pub use swiglu::{swiglu, swiglu_backward, swiglu_composed};
pub use vocab::{vocab_log_probs, vocab_log_probs_fused};

use candle_core::{CpuStorage, DType, Layout, Result, Tensor};
use rayon::prelude::*;

/// Output elements below which an op runs on the calling thread, where handing rows to the
/// pool costs more than the work; the same threshold as candle's own element-wise ops.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Whether this CPU runs the AVX2 + FMA kernels of this module (x86-64 only). Their sums are
/// gemm's and libm's where they repeat them; elsewhere the scalar paths round differently.
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the fused CPU path applies to `t`.
pub fn applies(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// Whether a fused op runs on `t`: on the CPU in f32, on CUDA (with the `cuda` feature) in f32
/// or bf16 through the kernels of `kernels/`.
pub fn fused_on(t: &Tensor) -> bool {
    applies(t)
        || (cfg!(feature = "cuda")
            && t.device().is_cuda()
            && matches!(t.dtype(), DType::F32 | DType::BF16))
}

/// Whether a fused op runs on `t` in f32 (the ops whose CUDA kernels read f32 only).
pub fn fused_on_f32(t: &Tensor) -> bool {
    fused_on(t) && t.dtype() == DType::F32
}

pub(crate) fn slice_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let data = s.as_slice::<f32>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("{what}: input must be contiguous"),
    }
}

/// Whether `len` output elements are worth splitting over the pool.
fn parallel(len: usize) -> bool {
    worth_splitting(len, PAR_MIN_ELEMS)
}

/// Whether `work` units, at least `min`, are worth splitting over the pool. A pool of one
/// thread (as `reproduce --jobs N` and [`crate::parallel::map`] give each piece of work) would
/// only serialise behind its single worker: then the calling thread does the work.
pub(crate) fn worth_splitting(work: usize, min: usize) -> bool {
    work >= min && crate::parallel::workers() > 1
}

/// Runs `f(row index, row)` on each `row_len`-long row of `out`, in parallel when large.
fn for_rows<F>(out: &mut [f32], row_len: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if parallel(out.len()) && row_len > 0 {
        out.par_chunks_mut(row_len)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    } else {
        for (i, r) in out.chunks_mut(row_len.max(1)).enumerate() {
            f(i, r);
        }
    }
}

fn row_max(x: &[f32]) -> f32 {
    // Eight lanes with a compare-select, which compiles to packed max instructions
    // (`f32::max` does not vectorise: it must order NaN against numbers).
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// `out[i] = scale · exp(row[i] − shift)`; returns Σ exp(row[i] − shift). `out` may be
/// empty (only the sum is wanted). The exponential of the softmax rows is most of their cost,
/// and libm's `expf` is scalar: on AVX2 a vectorised Cephes polynomial (relative error ~1e-7)
/// does eight at a time.
fn exp_shifted(row: &[f32], shift: f32, scale: f32, out: &mut [f32]) -> f32 {
    let dst = if out.len() >= row.len() {
        out.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: `row` is read for row.len() elements and `dst`, when not null, is a distinct
    // buffer at least as long.
    unsafe { exp_kernel(row.as_ptr(), dst, row.len(), shift, scale) }
}

/// [`exp_shifted`] in place: `buf[i] = exp(buf[i] − shift)`; returns the sum.
fn exp_shifted_in_place(buf: &mut [f32], shift: f32) -> f32 {
    let p = buf.as_mut_ptr();
    // SAFETY: each element is read before it is written, through one pointer.
    unsafe { exp_kernel(p, p, buf.len(), shift, 1.0) }
}

/// `dst[i] = scale · exp(src[i] − shift)` for i < n (`dst` null: sum only); returns the sum.
/// `dst` may equal `src`.
unsafe fn exp_kernel(src: *const f32, dst: *mut f32, n: usize, shift: f32, scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            return exp_kernel_avx2(src, dst, n, shift, scale);
        }
    }
    let mut sum = 0f32;
    for i in 0..n {
        let e = (*src.add(i) - shift).exp();
        sum += e;
        if !dst.is_null() {
            *dst.add(i) = scale * e;
        }
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_kernel_avx2(src: *const f32, dst: *mut f32, n: usize, shift: f32, scale: f32) -> f32 {
    use std::arch::x86_64::*;
    let full = n / 8 * 8;
    let (vshift, vscale) = (_mm256_set1_ps(shift), _mm256_set1_ps(scale));
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < full {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(src.add(i)), vshift));
        acc = _mm256_add_ps(acc, e);
        if !dst.is_null() {
            _mm256_storeu_ps(dst.add(i), _mm256_mul_ps(e, vscale));
        }
        i += 8;
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    let mut sum: f32 = lanes.iter().sum();
    for j in full..n {
        let e = (*src.add(j) - shift).exp();
        sum += e;
        if !dst.is_null() {
            *dst.add(j) = scale * e;
        }
    }
    sum
}

/// exp of eight lanes: x = k·ln2 + r, exp(r) by Cephes' degree-6 polynomial, times 2^k.
/// Inputs below −87.3 give ~1e-38 instead of 0 (masked attention logits), which no sum notices.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp256(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.3),
    );
    let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let p = _mm256_fmadd_ps(
        p,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(k),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(pow2))
}
