//! Attention for one new position per row (a decode step) on the CPU, with the numbers of
//! [`super::attention_composed`] bit for bit but without its two batched products through
//! candle's gemm, which for sampling's shapes (a few query heads against at most a few hundred
//! keys of 12–16 numbers) cost more in dispatch and packing than in arithmetic
//! (docs/PERFORMANCE.md, "The main job").
//!
//! The sums repeat gemm 0.19's for candle's row-major products (which gemm runs transposed):
//! - scores q·kᵀ, r query heads per key head against s keys, depth d: where r·s ≤ 256, gemm's
//!   horizontal kernel: eight lanes, lane l a chain of FMAs over the depths l, l + 8, … (a last
//!   partial chunk zero-filled, still through the FMA), reduced as ((l0 + l4) + (l2 + l6)) +
//!   ((l1 + l5) + (l3 + l7)) (gemm-f32's AVX2 `reduce_sum`); above 256, one FMA chain over the
//!   depth from zero (its microkernel);
//! - weights · values, depth s: one FMA chain over the keys from zero per output;
//! - between them the row softmax of [`super::attention_probs`] (`softmax::scaled_masked_row`).
//!
//! Each product is one depth block (gemm cuts depths beyond 512, or 1024 in the horizontal
//! kernel), and gemm's final multiply by 1.0 is exact. Shapes gemm sends elsewhere (a depth of
//! at most 2: gevv; one query head per key head: gemv) stay with candle's product, as do CPUs
//! without AVX2 and FMA, where gemm's arithmetic differs.
//!
//! The kernels take a whole (row, key head) block per call: a `target_feature` function cannot
//! inline into its caller, and a first version that called one per key was slower than gemm.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the kernels are x86-64 only

use candle_core::{Storage, Tensor};

use super::softmax::scaled_masked_row;
use super::{applies, avx2_fma};

/// Outputs up to which gemm takes its horizontal kernel (`gemm_basic_generic`).
const HORIZONTAL_OUTPUTS: usize = 256;

/// The deepest product gemm sums in one block on every CPU.
const ONE_BLOCK: usize = 512;

/// `attention_composed(q, k, v, bias, scale)` for `q` `(B, H, 1, D)`, `k`, `v` `(B, KV, S, D)`
/// (any row stride, e.g. a KV cache's first S columns) and `bias` `(B, 1, 1, S)`, all f32 on
/// the CPU; None where it does not apply (the caller then runs the composed path). No backward:
/// for detached (sampling) models only.
pub fn attention_decode(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> candle_core::Result<Option<Tensor>> {
    let (b, h, t, d) = q.dims4()?;
    let (_, kv, s, _) = k.dims4()?;
    let fits = t == 1
        && kv > 0
        && h % kv == 0
        && h / kv >= 2
        && (3..=ONE_BLOCK).contains(&s)
        && (3..=ONE_BLOCK).contains(&d)
        && v.dims4()? == (b, kv, s, d)
        && bias.dims4()? == (b, 1, 1, s)
        && [q, k, v, bias].iter().all(|x| applies(x))
        && avx2_fma();
    if !fits {
        return Ok(None);
    }
    let rep = h / kv;
    let (q, bias) = (q.contiguous()?, bias.contiguous()?);
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (bs, bl) = bias.storage_and_layout();
    let (Storage::Cpu(qc), Storage::Cpu(kc), Storage::Cpu(vc), Storage::Cpu(bc)) =
        (&*qs, &*ks, &*vs, &*bs)
    else {
        return Ok(None);
    };
    // Keys and values: unit stride within a row; rows, heads and batch rows anywhere.
    let (kst, vst) = (kl.stride(), vl.stride());
    if kst[3] != 1 || vst[3] != 1 {
        return Ok(None);
    }
    let qd = &qc.as_slice::<f32>()?[ql.start_offset()..];
    let bd = &bc.as_slice::<f32>()?[bl.start_offset()..];
    let (kd, vd) = (
        &kc.as_slice::<f32>()?[kl.start_offset()..],
        &vc.as_slice::<f32>()?[vl.start_offset()..],
    );
    // The last element each block reads must lie in its buffer (checked once, so the kernels
    // may take raw pointers).
    let last = |st: &[usize]| (b - 1) * st[0] + (kv - 1) * st[1] + (s - 1) * st[2] + d;
    if last(kst) > kd.len() || last(vst) > vd.len() || qd.len() < b * h * d || bd.len() < b * s {
        return Ok(None);
    }
    let horizontal = rep * s <= HORIZONTAL_OUTPUTS;
    let scale = scale as f32;
    let mut out = vec![0f32; b * h * d];
    let mut probs = vec![0f32; rep * s];
    for bi in 0..b {
        let mask = &bd[bi * s..(bi + 1) * s];
        for g in 0..kv {
            let heads = (bi * h + g * rep) * d..(bi * h + (g + 1) * rep) * d;
            let block = Block {
                keys: kd[bi * kst[0] + g * kst[1]..].as_ptr(),
                key_stride: kst[2],
                values: vd[bi * vst[0] + g * vst[1]..].as_ptr(),
                value_stride: vst[2],
                s,
                d,
            };
            // SAFETY: avx2_fma() above; the block's last key and value lie in their
            // buffers (checked above); `probs` holds rep·s and the query and output rows rep·d.
            unsafe {
                scores(&block, &qd[heads.clone()], horizontal, &mut probs);
            }
            for row in probs.chunks_exact_mut(s) {
                scaled_masked_row(row, mask, scale);
            }
            unsafe { weighted_values(&block, &probs, &mut out[heads]) };
        }
    }
    Ok(Some(Tensor::from_vec(out, (b, h, 1, d), q.device())?))
}

/// One (batch row, key head)'s keys and values: `s` rows of `d` numbers, a stride apart.
struct Block {
    keys: *const f32,
    key_stride: usize,
    values: *const f32,
    value_stride: usize,
    s: usize,
    d: usize,
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Lanes `0..n` of eight set (all ones), the rest clear: `maskload` reads zeros there, as gemm
/// fills a last partial chunk.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn lanes(n: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx)
}

/// `probs[i·s + j] = q_i · key_j` for the block's r = q.len() / d query heads, in gemm's order.
///
/// # Safety
/// AVX2 and FMA; the block's keys readable; `q` r·d long, `probs` r·s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores(block: &Block, q: &[f32], horizontal: bool, probs: &mut [f32]) {
    let (s, d) = (block.s, block.d);
    let key = |j: usize| block.keys.add(j * block.key_stride);
    let (full, tail) = (d / 8 * 8, lanes(d % 8));
    for (qi, row) in q.chunks_exact(d).zip(probs.chunks_exact_mut(s)) {
        let qp = qi.as_ptr();
        let qt = _mm256_maskload_ps(qp.add(full), tail);
        let eights = s / 8 * 8;
        if horizontal {
            // Eight keys at a time: their eight lane sums each, then gemm's reduction of each
            // key's lanes, done for the eight keys at once.
            for j0 in (0..eights).step_by(8) {
                let kp: [*const f32; 8] = std::array::from_fn(|l| key(j0 + l));
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut p = 0;
                while p < full {
                    let x = _mm256_loadu_ps(qp.add(p));
                    for l in 0..8 {
                        acc[l] = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[l].add(p)), acc[l]);
                    }
                    p += 8;
                }
                if full < d {
                    for l in 0..8 {
                        let y = _mm256_maskload_ps(kp[l].add(full), tail);
                        acc[l] = _mm256_fmadd_ps(qt, y, acc[l]);
                    }
                }
                _mm256_storeu_ps(row.as_mut_ptr().add(j0), reduce_eight(acc));
            }
            for (j, o) in row.iter_mut().enumerate().skip(eights) {
                let kp = key(j);
                let mut acc = _mm256_setzero_ps();
                let mut p = 0;
                while p < full {
                    let (x, y) = (_mm256_loadu_ps(qp.add(p)), _mm256_loadu_ps(kp.add(p)));
                    acc = _mm256_fmadd_ps(x, y, acc);
                    p += 8;
                }
                if full < d {
                    acc = _mm256_fmadd_ps(qt, _mm256_maskload_ps(kp.add(full), tail), acc);
                }
                // gemm-f32's reduce_sum: the halves added, then lanes (0+2, 1+3), then 0 + 1.
                let h4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
                let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
                *o = _mm_cvtss_f32(h2) + _mm_cvtss_f32(_mm_shuffle_ps(h2, h2, 1));
            }
        } else {
            // One chain over the depth per key; eight keys side by side for the FMA units.
            for j0 in (0..eights).step_by(8) {
                let kp: [*const f32; 8] = std::array::from_fn(|l| key(j0 + l));
                let mut acc = [0f32; 8];
                for (p, &x) in qi.iter().enumerate() {
                    for l in 0..8 {
                        acc[l] = x.mul_add(*kp[l].add(p), acc[l]);
                    }
                }
                row[j0..j0 + 8].copy_from_slice(&acc);
            }
            for (j, o) in row.iter_mut().enumerate().skip(eights) {
                let kp = key(j);
                *o = qi
                    .iter()
                    .enumerate()
                    .fold(0.0, |a, (p, &x)| x.mul_add(*kp.add(p), a));
            }
        }
    }
}

/// gemm-f32's `reduce_sum`, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), of eight
/// vectors at once: the eight sums, in order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn reduce_eight(a: [__m256; 8]) -> __m256 {
    // Halves added, two keys a vector: lanes [k.p0..k.p3 | k'.p0..k'.p3], pi = li + l(i+4).
    let halves = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps(x, y, 0x20),
            _mm256_permute2f128_ps(x, y, 0x31),
        )
    };
    let (h01, h23, h45, h67) = (
        halves(a[0], a[1]),
        halves(a[2], a[3]),
        halves(a[4], a[5]),
        halves(a[6], a[7]),
    );
    // Then p0 + p2 and p1 + p3: [k.q0, k.q1, k2.q0, k2.q1 | k1.q0, k1.q1, k3.q0, k3.q1].
    let pairs = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps(x, y, 0b01_00_01_00),
            _mm256_shuffle_ps(x, y, 0b11_10_11_10),
        )
    };
    let (q0123, q4567) = (pairs(h01, h23), pairs(h45, h67));
    // Then q0 + q1: [k0, k2, k4, k6 | k1, k3, k5, k7].
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps(q0123, q4567, 0b10_00_10_00),
        _mm256_shuffle_ps(q0123, q4567, 0b11_01_11_01),
    );
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// `out[i·d + e] = Σ_j probs[i·s + j] · value_j[e]`, each a chain of FMAs over the keys from
/// zero, for the block's r query heads.
///
/// # Safety
/// AVX2 and FMA; the block's values readable; `probs` r·s long, `out` r·d.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_values(block: &Block, probs: &[f32], out: &mut [f32]) {
    match (out.len() / block.d, block.d.div_ceil(8)) {
        (2, 1) => weighted_values_rc::<2, 1>(block, probs, out),
        (2, 2) => weighted_values_rc::<2, 2>(block, probs, out),
        (3, 1) => weighted_values_rc::<3, 1>(block, probs, out),
        (3, 2) => weighted_values_rc::<3, 2>(block, probs, out),
        (4, 1) => weighted_values_rc::<4, 1>(block, probs, out),
        (4, 2) => weighted_values_rc::<4, 2>(block, probs, out),
        _ => weighted_values_any(block, probs, out),
    }
}

/// [`weighted_values`] for R query heads of C chunks of eight outputs: the R·C chains in
/// registers, each value row loaded once for all heads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_values_rc<const R: usize, const C: usize>(
    block: &Block,
    probs: &[f32],
    out: &mut [f32],
) {
    let (s, d) = (block.s, block.d);
    let last = lanes(d - 8 * (C - 1)); // the last chunk's outputs
    let whole = |c: usize| c + 1 < C || d % 8 == 0;
    let load = |p: *const f32, c: usize| {
        if whole(c) {
            _mm256_loadu_ps(p.add(8 * c))
        } else {
            _mm256_maskload_ps(p.add(8 * c), last)
        }
    };
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for j in 0..s {
        let vj = block.values.add(j * block.value_stride);
        let x: [__m256; C] = std::array::from_fn(|c| load(vj, c));
        for (i, acc) in acc.iter_mut().enumerate() {
            let p = _mm256_set1_ps(*probs.get_unchecked(i * s + j));
            for c in 0..C {
                acc[c] = _mm256_fmadd_ps(p, x[c], acc[c]);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (c, &a) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(i * d + 8 * c);
            if whole(c) {
                _mm256_storeu_ps(o, a);
            } else {
                _mm256_maskstore_ps(o, last, a);
            }
        }
    }
}

/// [`weighted_values`] for any shape: four chains at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_values_any(block: &Block, probs: &[f32], out: &mut [f32]) {
    let (s, d) = (block.s, block.d);
    let per_head = d.div_ceil(8);
    let total = out.len() / d * per_head;
    let chunk = |k: usize| (k / per_head, 8 * (k % per_head)); // (query head, first output)
    for first in (0..total).step_by(4) {
        let n = (total - first).min(4);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut at = [(0usize, 0usize); 4];
        let mut masks = [_mm256_setzero_si256(); 4];
        for l in 0..n {
            at[l] = chunk(first + l);
            masks[l] = lanes(d - at[l].1);
        }
        for j in 0..s {
            let vj = block.values.add(j * block.value_stride);
            for l in 0..n {
                let (i, e) = at[l];
                let p = _mm256_set1_ps(*probs.get_unchecked(i * s + j));
                acc[l] = _mm256_fmadd_ps(p, _mm256_maskload_ps(vj.add(e), masks[l]), acc[l]);
            }
        }
        for l in 0..n {
            let (i, e) = at[l];
            _mm256_maskstore_ps(out.as_mut_ptr().add(i * d + e), masks[l], acc[l]);
        }
    }
}

// Elsewhere `avx2_fma()` is false and `attention_decode` returns before any kernel runs;
// these only let it compile.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn scores(_: &Block, _: &[f32], _: bool, _: &mut [f32]) {
    unreachable!("attention_decode applies on x86-64 only")
}
#[cfg(not(target_arch = "x86_64"))]
unsafe fn weighted_values(_: &Block, _: &[f32], _: &mut [f32]) {
    unreachable!("attention_decode applies on x86-64 only")
}
