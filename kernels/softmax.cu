// The attention probabilities softmax(x·scale + bias) over rows of n, with x (B, …, T, n) and
// the mask bias (B, T, n) broadcast over the middle dims; one block per row. CPU twin:
// src/fused/softmax.rs (the fused op and attention_probs_composed). The backward is composed
// from candle ops on every device.
#include "common.cuh"

template <typename T>
__device__ void attention_softmax(const T* x, const T* bias, T* y, int t, int n, size_t per_b,
                                  float scale) {
  const size_t row = blockIdx.x;
  const size_t bi = row / per_b, ti = row % t;
  const T* xr = x + row * n;
  const T* br = bias + (bi * t + ti) * n;
  T* yr = y + row * n;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, to_f(xr[j]) * scale + to_f(br[j]));
  m = block_max(m);
  float s = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(to_f(xr[j]) * scale + to_f(br[j]) - m);
  const float inv = 1.0f / block_sum(s);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    yr[j] = from_f<T>(expf(to_f(xr[j]) * scale + to_f(br[j]) - m) * inv);
  }
}

#define SOFTMAX(NAME, T)                                                                       \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                   \
      attention_softmax_##NAME(const T* x, const T* bias, T* y, int t,                         \
                                                      int n, size_t per_b, float scale) {      \
    attention_softmax<T>(x, bias, y, t, n, per_b, scale);                                      \
  }

SOFTMAX(f32, float)
SOFTMAX(bf16, __nv_bfloat16)
