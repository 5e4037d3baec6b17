//! `f32::exp` eight at a time with the same bits: glibc's `expf` (2.28 and later; its FMA
//! variant, the one glibc picks on a CPU with FMA) repeated in AVX2. The scalar call was most of
//! SwiGLU's cost, a tenth of an evaluation (docs/PERFORMANCE.md, "The main job"), and a
//! vectorised exponential of our own would have changed every sample.
//!
//! glibc's algorithm (sysdeps/ieee754/flt-32/e_expf.c, with the data of e_exp2f_data.c): in
//! binary64, z = x·32/ln2, k = round(z) by the 1.5·2^52 shift, r = z − k; s = 2^(k/32) from a
//! 32-entry table with k's upper bits added to the exponent; y = (C0·r + C1)·r² + (C2·r + 1);
//! then (float)(y·s). GCC compiles the FMA variant with every `a·b ± c` fused, z's two uses
//! included (so z itself is never rounded): at x = 0x4202422f and 0xc27c65d9 the unfused
//! variant's results are one unit lower. Eight inputs of which one is of magnitude 88 or more
//! (or NaN), where glibc leaves this path, take glibc's own call, all eight.
//! `tests/it/fused.rs` holds every result to `f32::exp` over a sweep of all floats, and
//! `exp_matches_libm_on_every_float` (ignored: a minute) over all 2^32.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the kernels are x86-64 only

/// `buf[i] = buf[i].exp()`, bit for bit.
pub fn exp_in_place(buf: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx2_fma() {
            // SAFETY: the features were just checked.
            return unsafe { exp_avx2(buf) };
        }
    }
    buf.iter_mut().for_each(|x| *x = x.exp());
}

/// 2^(i/32) as binary64 words, less i << 47 (glibc's `__exp2f_data.tab`).
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// 32/ln2, the 1.5·2^52 rounding shift and the polynomial (glibc's `invln2_scaled`, `shift`,
/// `poly_scaled`).
// (Powers of two: the scalings are exact, as in glibc's compile-time constants.)
const INV_LN2_N: f64 = f64::from_bits(0x3ff71547652b82fe) * 32.0; // 0x1.71547652b82fep+0
const SHIFT: f64 = f64::from_bits(0x4338000000000000); // 0x1.8p+52
const C0: f64 = f64::from_bits(0x3fac6af84b912394) / 32.0 / 32.0 / 32.0; // 0x1.c6af84b912394p-5
const C1: f64 = f64::from_bits(0x3fcebfce50fac4f3) / 32.0 / 32.0; // 0x1.ebfce50fac4f3p-3
const C2: f64 = f64::from_bits(0x3fe62e42ff0c52d6) / 32.0; // 0x1.62e42ff0c52d6p-1

/// The upper 12 bits of 88.0f32 (`top12(88.0f)`): from there on glibc leaves its fast path.
const ABSTOP_LIMIT: i32 = 0x42b;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(buf: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        let x = _mm256_loadu_ps(c.as_ptr());
        let top = _mm256_and_si256(
            _mm256_srli_epi32(_mm256_castps_si256(x), 20),
            _mm256_set1_epi32(0x7ff),
        );
        let special = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(ABSTOP_LIMIT - 1));
        if _mm256_movemask_epi8(special) != 0 {
            c.iter_mut().for_each(|x| *x = x.exp());
            continue;
        }
        let lo = exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
        let hi = exp4(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
        let y = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
        _mm256_storeu_ps(c.as_mut_ptr(), y);
    }
    chunks
        .into_remainder()
        .iter_mut()
        .for_each(|x| *x = x.exp());
}

/// glibc's fast path for four inputs already widened to binary64; the result before its
/// rounding to f32.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp4(xd: std::arch::x86_64::__m256d) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::*;
    let set = _mm256_set1_pd;
    // z = x·32/ln2 is never rounded on its own: GCC fuses it into both of its uses.
    let kd = _mm256_fmadd_pd(set(INV_LN2_N), xd, set(SHIFT));
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, set(SHIFT));
    let r = _mm256_fmsub_pd(set(INV_LN2_N), xd, kd);
    let index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    let t = _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, index);
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(set(C0), r, set(C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(set(C2), r, set(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_mul_pd(y, s)
}
