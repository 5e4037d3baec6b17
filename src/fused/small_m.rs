//! The small-row product x · Wᵀ for a handful of rows (a decode step): streams W once, row by
//! row, with SIMD tiles where the CPU has them. Its length is in the SIMD kernel bodies, each of
//! which is one register-tiled loop nest that does not read better cut apart.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::{applies, matmul, slice_f32, worth_splitting};

/// Largest row count routed to [`linear_small_m`]: beyond it GEMM's packing pays for itself.
pub const SMALL_M: usize = 16;

/// Width of the blocks the small-row kernel walks the weights in (floats; a multiple of 8).
const K_BLOCK: usize = 256;

/// How far ahead of its reads (in floats of the pair-packed stream: 16 KB) the small-row kernel
/// prefetches weights into L2. Without it the memory stream stalls while the FMAs are busy, and
/// reading and computing take the sum of their times instead of the larger; into L1, or fewer
/// KB ahead, helped less. The single-row loop does not prefetch: its FMAs leave the hardware
/// prefetcher time, and prefetching there made it slower. (Measurements: docs/PERFORMANCE.md,
/// "The decode kernel".)
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
        Ok((Some(matmul(g, w)?), Some(matmul(&g.t()?, x)?)))
    }
}

/// `out[j·m + r] = x[r] · w[j]` for the `m` rows of `x` and each row `j` of the block `w`
/// (rows of length `k`, the width of `x`).
/// `w` is either plain rows or (`packed`) in [`pack_pairs`]' layout; the sums are the same,
/// bit for bit.
fn dot_rows(x: &[f32], m: usize, w: &[f32], out: &mut [f32], packed: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx2_fma() {
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
/// stream, which the hardware prefetcher follows at nearly twice the rate of two rows read side
/// by side (docs/PERFORMANCE.md, "The decode kernel").
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
    let (tiles, n_tiles, singles) = row_tiles(m, WIDE);
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

/// The row tiles of `m` rows, (first row, rows): of 8 when `wide`, then of 4; how many, and
/// the first of the leftover rows done one at a time.
fn row_tiles(m: usize, wide: bool) -> ([(usize, usize); SMALL_M / 4], usize, usize) {
    let mut tiles = [(0usize, 0usize); SMALL_M / 4];
    let mut n_tiles = 0;
    let mut r = 0;
    while wide && r + 8 <= m {
        tiles[n_tiles] = (r, 8);
        n_tiles += 1;
        r += 8;
    }
    while r + 4 <= m {
        tiles[n_tiles] = (r, 4);
        n_tiles += 1;
        r += 4;
    }
    (tiles, n_tiles, r)
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
