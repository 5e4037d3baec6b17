// FP8 E4M3 numbers as an FP8 KV cache holds them (issue #57): one byte each, sign, 4 exponent
// bits (bias 7), 3 mantissa bits, no infinity, S.1111.111 NaN, largest finite 448, scale 1.
// The decode (exact in f32) and the rounding (to nearest, ties to even, saturating at ±448, as
// `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)` and candle's CPU cast round) are plain
// arithmetic, the same on a GPU, in the emulator and on the host (kernels/check builds inputs
// with them); src/fused/fp8.rs is their CPU twin.
#pragma once
#ifdef ACPO_EMU
#include "check/cuda_emu.hpp"
#else
#include <cuda_fp8.h>
#endif
#include <math.h>
#include <stdint.h>

// One E4M3 number: its byte.
struct fp8e4m3 {
  uint8_t bits;
};

// f32 from its bits, and back (on the host too: kernels/check builds E4M3 inputs with them).
__host__ __device__ __forceinline__ float fdp_f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}
__host__ __device__ __forceinline__ uint32_t fdp_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

// An E4M3 byte's value, exactly: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0
// is subnormal (m·2⁻⁹), S.1111.111 NaN, and there is no infinity.
__host__ __device__ __forceinline__ float fp8_e4m3_value(uint32_t b) {
  const uint32_t sign = (b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15 && m == 7) return fdp_f(sign | 0x7fc00000u);
  if (e == 0) return fdp_f(sign | fdp_bits((float)m * 0.001953125f));
  return fdp_f(sign | ((e + 120u) << 23) | (m << 20));
}
// x rounded to E4M3, to nearest with ties to even, saturating at ±448; NaN to 0x7f.
__host__ __device__ __forceinline__ uint8_t fp8_e4m3_byte(float x) {
  const uint32_t u = fdp_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const float a = fdp_f(u & 0x7fffffffu);
  if (!(a == a)) return 0x7f;
  if (a >= 448.0f) return (uint8_t)(sign | 0x7eu);
  // subnormal: m·2⁻⁹, m = 0..8 (m = 8 is 2⁻⁶, the first normal's code); a·512 is exact
  if (a < 0.015625f) return (uint8_t)(sign | (uint32_t)rintf(a * 512.0f));
  int e;
  const float f = frexpf(a, &e);  // a = f·2^e, f in [0.5, 1): a = (1 + q/8)·2^(e − 1)
  uint32_t q = (uint32_t)rintf(16.0f * f - 8.0f);  // exact before the rounding
  uint32_t biased = (uint32_t)(e - 1 + 7);
  if (q == 8) q = 0, ++biased;  // rounded up into the next binade
  const uint32_t code = (biased << 3) | q;
  return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
}
