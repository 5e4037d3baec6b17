// Token log-probabilities log softmax(z)[t] over rows of v (f32: the logits are scaled in f32
// first), and the backward dz = g · (onehot(t) − softmax(z)) with the softmax recomputed row by
// row, never stored. One block per row. CPU twin: src/fused/log_probs.rs and
// algo::token::log_probs_composed.
#include "common.cuh"

__device__ float row_lse(const float* zr, int v) {
  float m = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, zr[j]);
  m = block_max(m);
  float s = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(zr[j] - m);
  return m + logf(block_sum(s));
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS) token_log_probs_f32(const float* z, const uint32_t* t, float* lp,
                                               int v) {
  const size_t row = blockIdx.x;
  const float* zr = z + row * v;
  const float lse = row_lse(zr, v);
  if (threadIdx.x == 0) lp[row] = zr[t[row]] - lse;
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS) token_log_probs_bwd_f32(const float* z, const uint32_t* t,
                                                   const float* g, float* dz, int v) {
  const size_t row = blockIdx.x;
  const float* zr = z + row * v;
  float* dr = dz + row * v;
  const float gi = g[row];
  if (gi == 0.0f) {  // uniform across the block: no thread skips a barrier the others reach
    for (int j = threadIdx.x; j < v; j += blockDim.x) dr[j] = 0.0f;
    return;
  }
  const float lse = row_lse(zr, v);
  const uint32_t ti = t[row];
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    dr[j] = -gi * expf(zr[j] - lse) + (j == (int)ti ? gi : 0.0f);
  }
}
