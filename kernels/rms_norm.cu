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
// dw. Output rows 0..rows of `out` (the CPU twin's layout: dx rows, then the dw row). With a
// residual `res` (not null), res + dx in the same pass, rounded once: the gradient of a
// residual stream `h` whose RMSNorm feeds the layer (dh = g + rms_bwd(h, w, dn), a backward
// written by hand), where a separate add would write dx and read it back.
template <typename T>
__device__ void rms_norm_bwd_dx(const T* x, const T* w, const T* dy, const T* res, T* out,
                                float* rs, int n, float eps) {
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
    const float d = r * to_f(dyr[j]) * to_f(w[j]) - to_f(xr[j]) * c;
    out[row * n + j] = from_f<T>(res ? to_f(res[row * n + j]) + d : d);
  }
}

// dw_j = Σ_rows dy ⊙ x · r in two passes, in a fixed order and without atomics (the same bits
// on every run). One thread per column summing every row serially (the first version) gave
// Qwen3's q/k norms (128 columns, B·T·H = 65,536 rows at 2 × 2,048 tokens) one block walking
// all the rows, latency-bound; here the rows are cut in chunks so that the whole GPU reads:
// - pass 1, grid (ceil(n / RMS_DW_COLS), ceil(rows / RMS_DW_ROWS)), block (RMS_DW_COLS,
//   RMS_DW_GROUPS): thread (c, g) sums rows g, g + RMS_DW_GROUPS, … of its chunk for column c
//   (a warp reads 32 adjacent columns of one row: coalesced), then the block adds its groups'
//   sums in group order and writes partial[chunk][column];
// - pass 2, one thread per column: the chunks' partials in chunk order, into the last row of
//   `out` (the CPU twin's layout: dx rows, then the dw row).
// The CPU twin sums the rows in order; the grouping differs, so the two agree to f32 rounding.
template <typename T>
__device__ void rms_norm_bwd_dw_partial(const T* x, const T* dy, const float* rs, float* partial,
                                        int rows, int n) {
  __shared__ float sums[RMS_DW_GROUPS][RMS_DW_COLS];
  const int col = blockIdx.x * RMS_DW_COLS + threadIdx.x;
  const int r0 = blockIdx.y * RMS_DW_ROWS, r1 = min(rows, r0 + RMS_DW_ROWS);
  float acc = 0.0f;
  if (col < n)
    for (int i = r0 + (int)threadIdx.y; i < r1; i += RMS_DW_GROUPS) {
      const size_t k = (size_t)i * n + col;
      acc += to_f(dy[k]) * to_f(x[k]) * rs[i];
    }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    float s = 0.0f;
#pragma unroll
    for (int g = 0; g < RMS_DW_GROUPS; ++g) s += sums[g][threadIdx.x];
    partial[(size_t)blockIdx.y * n + col] = s;
  }
}

template <typename T>
__device__ void rms_norm_bwd_dw_sum(const float* partial, T* out, int chunks, int rows, int n) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.0f;
  for (int c = 0; c < chunks; ++c) acc += partial[(size_t)c * n + j];
  out[(size_t)rows * n + j] = from_f<T>(acc);
}

#define RMS_NORM(NAME, T)                                                                      \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                    \
      rms_norm_fwd_##NAME(const T* x, const T* w, T* y, int n, float eps) {                    \
    rms_norm_fwd<T>(x, w, y, n, eps);                                                          \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS) rms_norm_bwd_dx_##NAME(            \
      const T* x, const T* w, const T* dy, T* out, float* rs, int n, float eps) {              \
    rms_norm_bwd_dx<T>(x, w, dy, nullptr, out, rs, n, eps);                                    \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS) rms_norm_bwd_dx_res_##NAME(        \
      const T* x, const T* w, const T* dy, const T* res, T* out, float* rs, int n, float eps) {\
    rms_norm_bwd_dx<T>(x, w, dy, res, out, rs, n, eps);                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(RMS_DW_COLS * RMS_DW_GROUPS)                    \
      rms_norm_bwd_dw_partial_##NAME(const T* x, const T* dy, const float* rs, float* partial,  \
                                     int rows, int n) {                                        \
    rms_norm_bwd_dw_partial<T>(x, dy, rs, partial, rows, n);                                   \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS) rms_norm_bwd_dw_sum_##NAME(       \
      const float* partial, T* out, int chunks, int rows, int n) {                             \
    rms_norm_bwd_dw_sum<T>(partial, out, chunks, rows, n);                                     \
  }

RMS_NORM(f32, float)
RMS_NORM(bf16, __nv_bfloat16)
