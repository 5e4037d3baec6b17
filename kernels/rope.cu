// Rotary embedding of x (B, H, T, D) by cos, sin (B, 1, T, D) whose halves are equal: per pair
// (x₁, x₂) of the two halves, (x₁c − x₂s, x₂c + x₁s). The backward is the same kernel with −sin
// (`sign` = −1). CPU twin: src/fused/rope.rs (the fused op and rope_composed).
#include "common.cuh"

template <typename T>
__device__ void rope(const T* x, const T* cos, const T* sin, T* y, int h, int t, int d,
                     float sign, size_t pairs) {
  const int half = d / 2;
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs;
       p += (size_t)gridDim.x * blockDim.x) {
    const size_t row = p / half;  // (b, h, t) flattened
    const int j = p % half;
    const size_t ti = row % t, bi = row / ((size_t)h * t);
    const size_t cs = (bi * t + ti) * d + j;
    const float c = to_f(cos[cs]), s = sign * to_f(sin[cs]);
    const float x1 = to_f(x[row * d + j]), x2 = to_f(x[row * d + half + j]);
    y[row * d + j] = from_f<T>(x1 * c - x2 * s);
    y[row * d + half + j] = from_f<T>(x2 * c + x1 * s);
  }
}

#define ROPE(NAME, T)                                                                          \
  extern "C" __global__ void rope_##NAME(const T* x, const T* cos, const T* sin, T* y, int h,  \
                                         int t, int d, float sign, size_t pairs) {             \
    rope<T>(x, cos, sin, y, h, t, d, sign, pairs);                                             \
  }

ROPE(f32, float)
ROPE(bf16, __nv_bfloat16)
