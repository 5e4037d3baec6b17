// SwiGLU: y = silu(g) ⊙ u, and its backward into a (2, N) output [dg; du]. CPU twin:
// src/fused/swiglu.rs (the fused op and swiglu_composed).
#include "common.cuh"

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

template <typename T>
__device__ void swiglu_fwd(const T* g, const T* u, T* y, size_t len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
       i += (size_t)gridDim.x * blockDim.x) {
    const float a = to_f(g[i]);
    y[i] = from_f<T>(a * sigmoid(a) * to_f(u[i]));
  }
}

// With σ = sigmoid(g): dg = dy·u·σ·(1 + g·(1 − σ)), du = dy·g·σ.
template <typename T>
__device__ void swiglu_bwd(const T* g, const T* u, const T* dy, T* out, size_t len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
       i += (size_t)gridDim.x * blockDim.x) {
    const float a = to_f(g[i]), b = to_f(u[i]), d = to_f(dy[i]);
    const float s = sigmoid(a);
    out[i] = from_f<T>(d * b * s * (1.0f + a * (1.0f - s)));
    out[len + i] = from_f<T>(d * a * s);
  }
}

#define SWIGLU(NAME, T)                                                                       \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                  \
      swiglu_fwd_##NAME(const T* g, const T* u, T* y, size_t len) {                           \
    swiglu_fwd<T>(g, u, y, len);                                                              \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                  \
      swiglu_bwd_##NAME(const T* g, const T* u, const T* dy, T* out,                          \
                                               size_t len) {                                  \
    swiglu_bwd<T>(g, u, dy, out, len);                                                        \
  }

SWIGLU(f32, float)
SWIGLU(bf16, __nv_bfloat16)
