// RMSNorm over rows of n: y = x / sqrt(mean(x²) + eps) · w, and its backward. CPU twin:
// src/fused/rms_norm.rs (the fused op and rms_norm_composed). As HF does for bf16, the
// normalised row is rounded to the input dtype before the product with w.
#include "common.cuh"

template <typename T>
__device__ void rms_norm_fwd(const T* x, const T* w, T* y, int n, float eps) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float v = to_f(xr[j]);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(block_sum(ss) / n + eps);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    yr[j] = from_f<T>(to_f(from_f<T>(to_f(xr[j]) * r)) * to_f(w[j]));
  }
}

// dx = r·g − x·r³·mean(g ⊙ x) with g = dy ⊙ w, one block per row; r of each row to `rs` for
// dw. Output rows 0..rows of `out` (the CPU twin's layout: dx rows, then the dw row).
template <typename T>
__device__ void rms_norm_bwd_dx(const T* x, const T* w, const T* dy, T* out, float* rs, int n,
                                float eps) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * n;
  const T* dyr = dy + row * n;
  float ss = 0.0f, gx = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float v = to_f(xr[j]);
    ss += v * v;
    gx += v * to_f(dyr[j]) * to_f(w[j]);
  }
  ss = block_sum(ss);
  gx = block_sum(gx);
  const float r = 1.0f / sqrtf(ss / n + eps);
  const float c = r * r * r * gx / n;
  if (threadIdx.x == 0) rs[row] = r;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    out[row * n + j] = from_f<T>(r * to_f(dyr[j]) * to_f(w[j]) - to_f(xr[j]) * c);
  }
}

// dw_j = Σ_rows dy ⊙ x · r, one thread per column, rows in order (deterministic): the last row
// of `out`.
template <typename T>
__device__ void rms_norm_bwd_dw(const T* x, const T* dy, const float* rs, T* out, int rows,
                                int n) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.0f;
  for (int i = 0; i < rows; ++i) {
    const size_t k = (size_t)i * n + j;
    acc += to_f(dy[k]) * to_f(x[k]) * rs[i];
  }
  out[(size_t)rows * n + j] = from_f<T>(acc);
}

#define RMS_NORM(NAME, T)                                                                      \
  extern "C" __global__ void rms_norm_fwd_##NAME(const T* x, const T* w, T* y, int n,          \
                                                 float eps) {                                  \
    rms_norm_fwd<T>(x, w, y, n, eps);                                                          \
  }                                                                                            \
  extern "C" __global__ void rms_norm_bwd_dx_##NAME(const T* x, const T* w, const T* dy,      \
                                                    T* out, float* rs, int n, float eps) {     \
    rms_norm_bwd_dx<T>(x, w, dy, out, rs, n, eps);                                             \
  }                                                                                            \
  extern "C" __global__ void rms_norm_bwd_dw_##NAME(const T* x, const T* dy, const float* rs, \
                                                    T* out, int rows, int n) {                 \
    rms_norm_bwd_dw<T>(x, dy, rs, out, rows, n);                                               \
  }

RMS_NORM(f32, float)
RMS_NORM(bf16, __nv_bfloat16)
