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
//! - [`linear_small_m`]: `x · Wᵀ` for a handful of rows (sampling decodes 1 token per sequence):
//!   a general GEMM packs W for every call, which costs more than the product at these shapes;
//!   this kernel streams W once, row by row.
//!
//! Every op has a composed reference path (other devices, other dtypes) and the tests in
//! `tests/it/fused.rs` compare values and gradients of the two.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Output elements below which an op runs on the calling thread, where handing rows to the
/// pool costs more than the work; the same threshold as candle's own element-wise ops.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Whether the fused CPU path applies to `t`.
pub fn applies(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
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
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
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

// ---------------------------------------------------------------------------------------------
// Softmax over the last dim.

/// The reference: softmax from basic ops, with a detached max shift.
pub fn softmax_last_composed(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// softmax(x·scale + bias) over the last dim, with `x` `(B, …, T, S)` and `bias` `(B, T, S)`
/// broadcast over the middle dims: the attention probabilities in one pass. The bias (padding
/// and causal mask) is a constant: it gets no gradient.
struct ScaledMaskedSoftmax {
    scale: f32,
}

impl CustomOp2 for ScaledMaskedSoftmax {
    fn name(&self) -> &'static str {
        "acpo-attention-softmax"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = slice_f32(s1, l1, self.name())?;
        let bias = slice_f32(s2, l2, self.name())?;
        let (b, t, n) = l2.shape().dims3()?;
        let rows = x.len() / n.max(1);
        if l1.dims().first() != Some(&b) || l1.dims().last() != Some(&n) || rows % (b * t) != 0 {
            candle_core::bail!(
                "{}: scores {:?} do not match the bias {:?}",
                self.name(),
                l1.dims(),
                l2.dims()
            );
        }
        let per_b = rows / b;
        let mut y = vec![0f32; x.len()];
        for_rows(&mut y, n, |i, out| {
            let (bi, ti) = (i / per_b, i % t);
            let brow = &bias[(bi * t + ti) * n..(bi * t + ti + 1) * n];
            for ((o, &v), &c) in out.iter_mut().zip(&x[i * n..(i + 1) * n]).zip(brow) {
                *o = v * self.scale + c;
            }
            let m = row_max(out);
            let sum = exp_shifted_in_place(out, m);
            let inv = 1.0 / sum;
            out.iter_mut().for_each(|o| *o *= inv);
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _bias: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dot = (dy * y)?.sum_keepdim(D::Minus1)?;
        Ok((
            Some(((dy.broadcast_sub(&dot)? * y)? * self.scale as f64)?),
            None,
        ))
    }
}

/// Attention probabilities softmax(scores·scale + bias): `scores` `(B, KV, rep, T, S)`, `bias`
/// `(B, 1, T, S)` (0 or −1e9). Fused on CPU f32.
pub fn attention_probs(scores: &Tensor, bias: &Tensor, scale: f64) -> Result<Tensor> {
    if applies(scores) && applies(bias) {
        let (b, _, t, s) = bias.dims4()?;
        let bias = bias.contiguous()?.reshape((b, t, s))?;
        return scores.contiguous()?.apply_op2(
            &bias,
            ScaledMaskedSoftmax {
                scale: scale as f32,
            },
        );
    }
    attention_probs_composed(scores, bias, scale)
}

/// The reference: scale, add the mask, softmax, from basic ops.
pub fn attention_probs_composed(scores: &Tensor, bias: &Tensor, scale: f64) -> Result<Tensor> {
    softmax_last_composed(&(scores * scale)?.broadcast_add(&bias.unsqueeze(2)?)?)
}

// ---------------------------------------------------------------------------------------------
// Rotary position embedding.

/// x·cos + rotate_half(x)·sin over `x` `(B, H, T, D)` with `cos`, `sin` `(B, 1, T, D)` whose two
/// halves are equal (HF's `cat(freqs, freqs)`): per pair (x₁, x₂) of the two halves,
/// (x₁c − x₂s, x₂c + x₁s). The backward is the inverse rotation: the same op with −sin.
struct Rope;

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "acpo-rope"
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
        let x = slice_f32(s1, l1, self.name())?;
        let cos = slice_f32(s2, l2, self.name())?;
        let sin = slice_f32(s3, l3, self.name())?;
        let (b, h, t, d) = l1.shape().dims4()?;
        if l2.dims() != [b, 1, t, d] || l3.dims() != l2.dims() || d % 2 != 0 {
            candle_core::bail!(
                "{}: x {:?}, cos {:?}, sin {:?}",
                self.name(),
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let half = d / 2;
        let mut y = vec![0f32; x.len()];
        for_rows(&mut y, d, |i, out| {
            let (bi, ti) = (i / (h * t), i % t);
            let xr = &x[i * d..(i + 1) * d];
            let c = &cos[(bi * t + ti) * d..(bi * t + ti) * d + half];
            let s = &sin[(bi * t + ti) * d..(bi * t + ti) * d + half];
            let (o1, o2) = out.split_at_mut(half);
            let (x1, x2) = xr.split_at(half);
            for j in 0..half {
                o1[j] = x1[j] * c[j] - x2[j] * s[j];
                o2[j] = x2[j] * c[j] + x1[j] * s[j];
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = dy.contiguous()?.apply_op3_no_bwd(cos, &sin.neg()?, &Rope)?;
        Ok((Some(dx), None, None))
    }
}

/// Rotary embedding of `x` `(B, H, T, D)` by `cos`, `sin` `(B, 1, T, D)` (positions' tables, no
/// gradient); fused on CPU f32.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if applies(x) && applies(cos) && applies(sin) {
        return x
            .contiguous()?
            .apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope);
    }
    rope_composed(x, cos, sin)
}

/// The reference: x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁], basic ops.
pub fn rope_composed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

// ---------------------------------------------------------------------------------------------
// SwiGLU.

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// silu(g) ⊙ u, the MLP's gate: one pass instead of silu, then a product.
struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "acpo-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = slice_f32(s1, l1, self.name())?;
        let u = slice_f32(s2, l2, self.name())?;
        if l1.dims() != l2.dims() {
            candle_core::bail!("{}: gate {:?}, up {:?}", self.name(), l1.dims(), l2.dims());
        }
        let n = l1.dims().last().copied().unwrap_or(1);
        let mut y = vec![0f32; g.len()];
        for_rows(&mut y, n, |i, out| {
            let (gr, ur) = (&g[i * n..(i + 1) * n], &u[i * n..(i + 1) * n]);
            for ((o, &a), &b) in out.iter_mut().zip(gr).zip(ur) {
                *o = a * sigmoid(a) * b;
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let both = g.apply_op3_no_bwd(u, &dy.contiguous()?, &SwiGluBwd)?;
        let dg = both.get(0)?.reshape(g.shape())?;
        let du = both.get(1)?.reshape(u.shape())?;
        Ok((Some(dg), Some(du)))
    }
}

/// With σ = sigmoid(g): dg = dy·u·σ·(1 + g·(1 − σ)), du = dy·g·σ. Output `(2, N)`.
struct SwiGluBwd;

impl CustomOp3 for SwiGluBwd {
    fn name(&self) -> &'static str {
        "acpo-swiglu-bwd"
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
        let g = slice_f32(s1, l1, self.name())?;
        let u = slice_f32(s2, l2, self.name())?;
        let dy = slice_f32(s3, l3, self.name())?;
        let len = g.len();
        let n = l1.dims().last().copied().unwrap_or(1);
        let mut out = vec![0f32; 2 * len];
        let (dg, du) = out.split_at_mut(len);
        let work = |i: usize, dgr: &mut [f32], dur: &mut [f32]| {
            for j in 0..dgr.len() {
                let k = i * n + j;
                let sg = sigmoid(g[k]);
                dgr[j] = dy[k] * u[k] * sg * (1.0 + g[k] * (1.0 - sg));
                dur[j] = dy[k] * g[k] * sg;
            }
        };
        if parallel(len) {
            dg.par_chunks_mut(n)
                .zip(du.par_chunks_mut(n))
                .enumerate()
                .for_each(|(i, (a, b))| work(i, a, b));
        } else {
            for (i, (a, b)) in dg.chunks_mut(n).zip(du.chunks_mut(n)).enumerate() {
                work(i, a, b);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((2, len))))
    }
}

/// silu(gate) ⊙ up; fused on CPU f32.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if applies(gate) && applies(up) {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu);
    }
    swiglu_composed(gate, up)
}

/// The reference: candle's silu, then the product.
pub fn swiglu_composed(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

// ---------------------------------------------------------------------------------------------
// RMSNorm.

struct RmsNorm {
    eps: f32,
}

fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let ss: f32 = row.iter().map(|v| v * v).sum();
    1.0 / (ss / row.len() as f32 + eps).sqrt()
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "acpo-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = slice_f32(s1, l1, self.name())?;
        let w = slice_f32(s2, l2, self.name())?;
        let n = w.len();
        let mut y = vec![0f32; x.len()];
        for_rows(&mut y, n, |i, out| {
            let row = &x[i * n..(i + 1) * n];
            let r = inv_rms(row, self.eps);
            for ((o, &v), &g) in out.iter_mut().zip(row).zip(w) {
                *o = v * r * g;
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = w.elem_count();
        let rows = x.elem_count() / n.max(1);
        // One pass computes dx (rows 0..rows) and dw (last row) together.
        let both = x.contiguous()?.apply_op3_no_bwd(
            &w.contiguous()?,
            &dy.contiguous()?,
            &RmsNormBwd { eps: self.eps },
        )?;
        let dx = both.narrow(0, 0, rows)?.reshape(x.shape())?;
        let dw = both.narrow(0, rows, 1)?.reshape(w.shape())?;
        Ok((Some(dx), Some(dw)))
    }
}

/// Backward of RMSNorm: with r = 1/rms(x) and g = dy ⊙ w,
/// dx = r·g − x · r³ · mean(g ⊙ x), dw = Σ_rows dy ⊙ x · r. Output `(rows + 1, n)`.
struct RmsNormBwd {
    eps: f32,
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "acpo-rms-norm-bwd"
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
        let x = slice_f32(s1, l1, self.name())?;
        let w = slice_f32(s2, l2, self.name())?;
        let dy = slice_f32(s3, l3, self.name())?;
        let n = w.len();
        let rows = x.len() / n.max(1);
        let mut out = vec![0f32; (rows + 1) * n];
        let (dx, dw) = out.split_at_mut(rows * n);
        // 1/rms per row, once: both dx and dw need it.
        let rs: Vec<f32> = x
            .chunks_exact(n.max(1))
            .map(|xr| inv_rms(xr, self.eps))
            .collect();
        for_rows(dx, n, |i, o| {
            let (xr, dyr) = (&x[i * n..(i + 1) * n], &dy[i * n..(i + 1) * n]);
            let r = rs[i];
            let gx: f32 = xr.iter().zip(dyr).zip(w).map(|((a, b), c)| a * b * c).sum();
            let c = r * r * r * gx / n as f32;
            for (j, oj) in o.iter_mut().enumerate() {
                *oj = r * dyr[j] * w[j] - xr[j] * c;
            }
        });
        // dw accumulates over rows: serial over rows, vectorisable over the row.
        for (i, &r) in rs.iter().enumerate() {
            let (xr, dyr) = (&x[i * n..(i + 1) * n], &dy[i * n..(i + 1) * n]);
            for ((d, a), b) in dw.iter_mut().zip(xr).zip(dyr) {
                *d += a * b * r;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows + 1, n))))
    }
}

/// RMSNorm over the last dim, `x / sqrt(mean(x²) + ε) · w`; fused on CPU f32.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if applies(x) && applies(w) {
        return x
            .contiguous()?
            .apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 });
    }
    rms_norm_composed(x, w, eps)
}

/// The reference: RMSNorm from basic ops, in f32 like HF.
pub fn rms_norm_composed(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x32.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.to_dtype(dtype)?.broadcast_mul(w)
}

// ---------------------------------------------------------------------------------------------
// Token log-probabilities.

/// log softmax(z)[t] per row; `z` `(N, V)` f32, `t` `(N)` u32.
struct TokenLogProbs;

fn log_sum_exp(row: &[f32]) -> f32 {
    let m = row_max(row);
    let s = exp_shifted(row, m, 1.0, &mut []);
    m + s.ln()
}

fn targets_u32<'a>(s: &'a CpuStorage, l: &Layout, v: usize, what: &str) -> Result<&'a [u32]> {
    let data = s.as_slice::<u32>()?;
    let t = match l.contiguous_offsets() {
        Some((a, b)) => &data[a..b],
        None => candle_core::bail!("{what}: targets must be contiguous"),
    };
    if let Some(bad) = t.iter().find(|&&t| t as usize >= v) {
        candle_core::bail!("{what}: target token {bad} outside the vocabulary of {v}");
    }
    Ok(t)
}

impl CustomOp2 for TokenLogProbs {
    fn name(&self) -> &'static str {
        "acpo-token-log-probs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = slice_f32(s1, l1, self.name())?;
        let v = l1.dims().last().copied().unwrap_or(1);
        let t = targets_u32(s2, l2, v, self.name())?;
        let row_lp = |(i, &ti): (usize, &u32)| {
            let row = &z[i * v..(i + 1) * v];
            row[ti as usize] - log_sum_exp(row)
        };
        let lp: Vec<f32> = if parallel(z.len()) {
            t.par_iter().enumerate().map(row_lp).collect()
        } else {
            t.iter().enumerate().map(row_lp).collect()
        };
        Ok((CpuStorage::F32(lp), Shape::from(t.len())))
    }

    fn bwd(
        &self,
        z: &Tensor,
        t: &Tensor,
        _lp: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dz = z.apply_op3_no_bwd(t, &g.contiguous()?, &TokenLogProbsBwd)?;
        Ok((Some(dz), None))
    }
}

/// dz = g · (onehot(t) − softmax(z)), the softmax recomputed row by row (never stored).
struct TokenLogProbsBwd;

impl CustomOp3 for TokenLogProbsBwd {
    fn name(&self) -> &'static str {
        "acpo-token-log-probs-bwd"
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
        let z = slice_f32(s1, l1, self.name())?;
        let v = l1.dims().last().copied().unwrap_or(1);
        let t = targets_u32(s2, l2, v, self.name())?;
        let g = slice_f32(s3, l3, self.name())?;
        let mut dz = vec![0f32; z.len()];
        for_rows(&mut dz, v, |i, o| {
            let row = &z[i * v..(i + 1) * v];
            let gi = g[i];
            if gi == 0.0 {
                return;
            }
            let lse = log_sum_exp(row);
            exp_shifted(row, lse, -gi, o);
            o[t[i] as usize] += gi;
        });
        Ok((CpuStorage::F32(dz), l1.shape().clone()))
    }
}

/// log softmax(z)[t] over the last dim: `z` `(..., V)` f32, `t` `(...)` u32 → `(...)`.
/// Callers check [`applies`] first; the composed reference lives in `algo::token`.
pub fn token_log_probs(z: &Tensor, t: &Tensor) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let v = z.dim(D::Minus1)?;
    let z2 = z.contiguous()?.reshape(((), v))?;
    let t1 = t.to_dtype(DType::U32)?.contiguous()?.flatten_all()?;
    z2.apply_op2(&t1, TokenLogProbs)?.reshape(dims)
}

// ---------------------------------------------------------------------------------------------
// x · Wᵀ for a few rows.

/// Largest row count routed to [`linear_small_m`]: beyond it GEMM's packing pays for itself.
pub const SMALL_M: usize = 16;

/// Width of the blocks the small-row kernel walks the weights in (floats; a multiple of 8).
const K_BLOCK: usize = 256;

/// How far ahead of its reads (in floats of the pair-packed stream: 16 KB) the small-row kernel
/// prefetches weights into L2. Without it the memory stream stalls while the FMAs are busy, and
/// reading and computing take the sum of their times instead of the larger. One core, m = 8,
/// 400 MB of weights: 56 ms without, 37–45 ms prefetching into L1 at 2–32 KB, 23–27 ms into L2
/// at 16 KB; 19 ms with the weights in cache, 15 ms to only stream them (m = 1). The
/// single-row loop does not prefetch: its FMAs leave the hardware prefetcher time, and
/// prefetching there made m = 1 slower (15 → 20 ms). Qwen3-100M sampling, 8 × 64 tokens on 2
/// cores: 170–204 → 227–290 tokens/s.
const PREFETCH_AHEAD: usize = 4096;

/// `x (m, k) · wᵀ` with `w (n, k)`, both contiguous f32, m ≤ [`SMALL_M`]. With `packed`, `w`
/// is in [`pack_pairs`]' layout instead (same shape, same length) and has no backward.
struct LinearSmallM {
    packed: bool,
}

impl CustomOp2 for LinearSmallM {
    fn name(&self) -> &'static str {
        if self.packed {
            "acpo-linear-small-m-packed"
        } else {
            "acpo-linear-small-m"
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = slice_f32(s1, l1, self.name())?;
        let w = slice_f32(s2, l2, self.name())?;
        let (m, k) = l1.shape().dims2()?;
        let (n, k2) = l2.shape().dims2()?;
        if k != k2 {
            candle_core::bail!("{}: x has {k} columns, w {k2}", self.name());
        }
        // Output transposed, (n, m): a contiguous block of output rows per task.
        let mut yt = vec![0f32; n * m];
        let block = 16usize;
        // Blocks of 16 rows start on a pair, so a block of the packed layout is the same
        // slice as in the plain one.
        let packed = self.packed;
        let work = |j0: usize, out: &mut [f32]| {
            let nb = out.len() / m;
            dot_rows(x, m, &w[j0 * k..(j0 + nb) * k], out, packed);
        };
        if worth_splitting(n * k, 1 << 18) {
            yt.par_chunks_mut(block * m)
                .enumerate()
                .for_each(|(b, out)| work(b * block, out));
        } else {
            work(0, &mut yt);
        }
        let mut y = vec![0f32; m * n];
        for j in 0..n {
            for r in 0..m {
                y[r * n + j] = yt[j * m + r];
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if self.packed {
            // Packed copies belong to detached (sampling) models, which record no graph.
            candle_core::bail!("{}: packed weights have no backward", self.name());
        }
        // y = x·wᵀ: dx = g·w, dw = gᵀ·x.
        Ok((Some(g.matmul(w)?), Some(g.t()?.matmul(x)?)))
    }
}

/// `out[j·m + r] = x[r] · w[j]` for the `m` rows of `x` and each row `j` of the block `w`
/// (rows of length `k`, the width of `x`).
/// `w` is either plain rows or (`packed`) in [`pack_pairs`]' layout; the sums are the same,
/// bit for bit.
fn dot_rows(x: &[f32], m: usize, w: &[f32], out: &mut [f32], packed: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features each kernel is compiled for were just detected, and both
            // read only inside `x` (m·k) and `w` (nb·k) and write only `out` (nb·m); their
            // prefetches may point past `w`, which reads nothing.
            unsafe {
                let wide = std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl");
                match (packed, wide) {
                    (true, true) => dot_rows_avx512vl::<true>(x, m, w, out),
                    (false, true) => dot_rows_avx512vl::<false>(x, m, w, out),
                    (true, false) => dot_rows_avx2::<true>(x, m, w, out),
                    (false, false) => dot_rows_avx2::<false>(x, m, w, out),
                }
            };
            return;
        }
    }
    if packed {
        let k = x.len() / m;
        let mut plain = vec![0f32; w.len()];
        unpack_pairs_into(w, k, &mut plain);
        dot_rows_portable(x, m, &plain, out);
    } else {
        dot_rows_portable(x, m, w, out);
    }
}

/// Pair-packed layout of a `(n, k)` row-major matrix, for the decode kernel: rows 2p and 2p+1
/// share one contiguous `2k` block (starting where row 2p starts), their 8-wide chunks
/// interleaved (`a[0..8] b[0..8] a[8..16] b[8..16] …`) and then the two tails (`k mod 8` each);
/// a last unpaired row stays as it is. The kernel then reads each matrix front to back as one
/// stream, which the hardware prefetcher follows: 22.7 GB/s on one core of the development VM
/// against 12.6 GB/s for two rows read side by side with software prefetch (a C model of the
/// kernel, 400 MB of weights).
fn pack_pairs_into(w: &[f32], k: usize, out: &mut [f32]) {
    let full = k / 8 * 8;
    let mut rows = w.chunks_exact(2 * k);
    let mut dst = out.chunks_exact_mut(2 * k);
    for (src, o) in (&mut rows).zip(&mut dst) {
        let (a, b) = src.split_at(k);
        for c in 0..full / 8 {
            o[16 * c..16 * c + 8].copy_from_slice(&a[8 * c..8 * c + 8]);
            o[16 * c + 8..16 * c + 16].copy_from_slice(&b[8 * c..8 * c + 8]);
        }
        o[2 * full..2 * full + (k - full)].copy_from_slice(&a[full..]);
        o[2 * full + (k - full)..].copy_from_slice(&b[full..]);
    }
    let rest = rows.remainder();
    let n_out = out.len();
    out[n_out - rest.len()..].copy_from_slice(rest);
}

/// The inverse of [`pack_pairs_into`].
fn unpack_pairs_into(p: &[f32], k: usize, out: &mut [f32]) {
    let full = k / 8 * 8;
    let mut src = p.chunks_exact(2 * k);
    let mut rows = out.chunks_exact_mut(2 * k);
    for (s, o) in (&mut src).zip(&mut rows) {
        let (a, b) = o.split_at_mut(k);
        for c in 0..full / 8 {
            a[8 * c..8 * c + 8].copy_from_slice(&s[16 * c..16 * c + 8]);
            b[8 * c..8 * c + 8].copy_from_slice(&s[16 * c + 8..16 * c + 16]);
        }
        a[full..].copy_from_slice(&s[2 * full..2 * full + (k - full)]);
        b[full..].copy_from_slice(&s[2 * full + (k - full)..]);
    }
    let rest = src.remainder();
    let n_out = out.len();
    out[n_out - rest.len()..].copy_from_slice(rest);
}

/// A pair-packed copy of `w (n, k)` for [`linear_small_m_packed`], when [`applies`]; `None`
/// otherwise (the caller keeps using `w`).
pub fn pack_pairs(w: &Tensor) -> Result<Option<Tensor>> {
    if !applies(w) || w.rank() != 2 {
        return Ok(None);
    }
    let (n, k) = w.dims2()?;
    let plain = w.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let mut packed = vec![0f32; n * k];
    pack_pairs_into(&plain, k, &mut packed);
    Ok(Some(Tensor::from_vec(packed, (n, k), w.device())?))
}

fn dot_rows_portable(x: &[f32], m: usize, w: &[f32], out: &mut [f32]) {
    let k = x.len() / m;
    for (w_row, o) in w.chunks_exact(k).zip(out.chunks_exact_mut(m)) {
        for (r, oj) in o.iter_mut().enumerate() {
            let xr = &x[r * k..(r + 1) * k];
            // Eight independent partial sums, as the SIMD path keeps them.
            let mut acc = [0f32; 8];
            for (a, b) in xr.chunks_exact(8).zip(w_row.chunks_exact(8)) {
                for l in 0..8 {
                    acc[l] += a[l] * b[l];
                }
            }
            let tail: f32 = xr[k / 8 * 8..]
                .iter()
                .zip(&w_row[k / 8 * 8..])
                .map(|(a, b)| a * b)
                .sum();
            *oj = acc.iter().sum::<f32>() + tail;
        }
    }
}

/// The AVX2 kernel: tiles of 4 rows of `x` × 2 rows of `w`, eight accumulators in flight
/// (FMA latency 4 × 2 ports), six loads per eight FMAs; leftovers one row at a time. `PACKED`:
/// `w` is in [`pack_pairs_into`]' layout, read as one stream; otherwise plain rows, with the
/// next pair prefetched.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2<const PACKED: bool>(x: &[f32], m: usize, w: &[f32], out: &mut [f32]) {
    dot_rows_body::<PACKED, false>(x, m, w, out)
}

/// [`dot_rows_avx2`] where AVX-512VL gives 32 vector registers: tiles of 8 rows × 2 rows of
/// `w` (16 accumulators), 10 loads per 16 FMAs. Still 8-wide vectors, each accumulator summing
/// its chunks in the same order, so the numbers are those of the AVX2 kernel, bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn dot_rows_avx512vl<const PACKED: bool>(x: &[f32], m: usize, w: &[f32], out: &mut [f32]) {
    dot_rows_body::<PACKED, true>(x, m, w, out)
}

/// The body of both kernels (inlined into each, so it is compiled for its features). `WIDE`:
/// tiles of 8 rows before those of 4.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot_rows_body<const PACKED: bool, const WIDE: bool>(
    x: &[f32],
    m: usize,
    w: &[f32],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let k = x.len() / m;
    let nb = w.len() / k;
    let full = k / 8 * 8;
    let hsum = |v: __m256| -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    };
    // x[full..k] · the tail of a weight row, which starts at `wt`.
    let tail = |xr: *const f32, wt: *const f32| -> f32 {
        let mut s = 0.0;
        for i in full..k {
            s += *xr.add(i) * *wt.add(i - full);
        }
        s
    };
    // Row tiles: (first row, rows) — of 8 when WIDE, then of 4; leftovers one at a time.
    let mut tiles = [(0usize, 0usize); SMALL_M / 4];
    let mut n_tiles = 0;
    let mut r = 0;
    while WIDE && r + 8 <= m {
        tiles[n_tiles] = (r, 8);
        n_tiles += 1;
        r += 8;
    }
    while r + 4 <= m {
        tiles[n_tiles] = (r, 4);
        n_tiles += 1;
        r += 4;
    }
    let singles = r;
    let xp = x.as_ptr();
    let mut j = 0;
    while j < nb {
        let pair = j + 1 < nb;
        let wa = w.as_ptr().add(j * k);
        // Where chunk i (a multiple of 8) of rows a and b is, and where their tails start.
        let (step, b_off, ta, tb) = if PACKED && pair {
            (2, 8, wa.add(2 * full), wa.add(2 * full + (k - full)))
        } else if pair {
            (1, k, wa.add(full), wa.add(k + full))
        } else {
            (1, 0, wa.add(full), wa.add(full))
        };
        // The tiles walk the width in blocks of K_BLOCK: a block of all the tiles' rows
        // (≤ 16 KB at m = 16) stays in L1 while the pair's block is read once from memory and
        // reused by the other tiles, so the memory stream never waits for a whole second pass
        // (at m = 8 and k = 768 the unblocked loop ran at half speed even from cache). Each
        // accumulator still sums its chunks in order, so the blocking does not change the sums.
        let mut acc = [[_mm256_setzero_ps(); 16]; SMALL_M / 4];
        let mut i0 = 0;
        while i0 < full {
            let i1 = (i0 + K_BLOCK).min(full);
            let span = Span {
                xp,
                k,
                wa,
                step,
                b_off,
                i0,
                i1,
                j,
                nb,
            };
            for (t, &(r0, rows)) in tiles[..n_tiles].iter().enumerate() {
                if rows == 8 {
                    tile_block::<8, PACKED>(&span, r0, t, &mut acc[t]);
                } else {
                    tile_block::<4, PACKED>(&span, r0, t, &mut acc[t]);
                }
            }
            i0 = i1;
        }
        for (&(r0, rows), a) in tiles[..n_tiles].iter().zip(&acc) {
            for q in 0..rows {
                let xr = xp.add((r0 + q) * k);
                out[j * m + r0 + q] = hsum(a[q]) + tail(xr, ta);
                if pair {
                    out[(j + 1) * m + r0 + q] = hsum(a[rows + q]) + tail(xr, tb);
                }
            }
        }
        for r in singles..m {
            let xr = xp.add(r * k);
            let (mut aa, mut ab) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i < full {
                let xv = _mm256_loadu_ps(xr.add(i));
                aa = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wa.add(step * i)), aa);
                ab = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wa.add(step * i + b_off)), ab);
                i += 8;
            }
            out[j * m + r] = hsum(aa) + tail(xr, ta);
            if pair {
                out[(j + 1) * m + r] = hsum(ab) + tail(xr, tb);
            }
        }
        j += 2;
    }
}

/// Where a tile works: `x` (rows of length `k`), the weight pair at `wa` (chunk i of its rows
/// a and b at `step · i` and `step · i + b_off`), chunks `i0..i1`, pair `j` of `nb` rows.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Span {
    xp: *const f32,
    k: usize,
    wa: *const f32,
    step: usize,
    b_off: usize,
    i0: usize,
    i1: usize,
    j: usize,
    nb: usize,
}

/// The span's chunks of rows `r0..r0 + R` of `x` against its pair (see [`dot_rows_body`]),
/// into `acc` (`acc[q]`: row q with w's row a, `acc[R + q]`: with row b). `t`: the tile's
/// index (the first one prefetches).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_block<const R: usize, const PACKED: bool>(
    span: &Span,
    r0: usize,
    t: usize,
    acc: &mut [std::arch::x86_64::__m256; 16],
) {
    let (xp, k, wa, step, b_off) = (span.xp, span.k, span.wa, span.step, span.b_off);
    let (i0, i1, j, nb) = (span.i0, span.i1, span.j, span.nb);
    use std::arch::x86_64::*;
    let mut xr = [xp; R];
    for (q, p) in xr.iter_mut().enumerate() {
        *p = xp.add((r0 + q) * k);
    }
    let mut a = *acc;
    // Packed: the first tile asks for the line PREFETCH_AHEAD floats further along the stream
    // into L2, one per iteration (a prefetch past the end is harmless); see PREFETCH_AHEAD.
    let ahead = wa.wrapping_add(step * i0 + PREFETCH_AHEAD);
    let mut i = i0;
    while i < i1 {
        if PACKED && t == 0 {
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(2 * (i - i0)) as *const i8);
        } else if !PACKED && t == 0 && j + 4 < nb {
            // The weights come from DRAM once: fetch the next pair while on this one.
            _mm_prefetch::<_MM_HINT_NTA>(wa.add(4 * k + i) as *const i8);
            _mm_prefetch::<_MM_HINT_NTA>(wa.add(5 * k + i) as *const i8);
        }
        let va = _mm256_loadu_ps(wa.add(step * i));
        let vb = _mm256_loadu_ps(wa.add(step * i + b_off));
        for q in 0..R {
            let xv = _mm256_loadu_ps(xr[q].add(i));
            a[q] = _mm256_fmadd_ps(xv, va, a[q]);
            a[R + q] = _mm256_fmadd_ps(xv, vb, a[R + q]);
        }
        i += 8;
    }
    *acc = a;
}

/// `x (m, k) · wᵀ` for `w (n, k)` when `m ≤ SMALL_M` on CPU f32; `None` when it does not apply.
pub fn linear_small_m(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    small_m_product(x, w, false)
}

/// [`linear_small_m`] with `packed` from [`pack_pairs`]: the same numbers, bit for bit, read
/// faster; no backward (for detached, sampling models).
pub fn linear_small_m_packed(x: &Tensor, packed: &Tensor) -> Result<Option<Tensor>> {
    small_m_product(x, packed, true)
}

fn small_m_product(x: &Tensor, w: &Tensor, packed: bool) -> Result<Option<Tensor>> {
    let (m, _) = x.dims2()?;
    if m == 0 || m > SMALL_M || !applies(x) || !applies(w) {
        return Ok(None);
    }
    Ok(Some(
        x.contiguous()?
            .apply_op2(&w.contiguous()?, LinearSmallM { packed })?,
    ))
}
