// The vocabulary end's per-chunk element-wise chain, one kernel each way (issue #44), for
// src/fused/vocab.rs: a chunk of logits z = (h·W_cᵀ) / τ, (N, C) in the matmul's dtype, is
//
// - forward, `vocab_stats_*`: folded into each row's running statistics (m, s, u, z_t): the
//   chunk's maximum, s = Σ e^{z−m}, u = Σ e^{z−m}(z − m) rescaled by α = e^{m_old − m} when the
//   maximum moves, and the target's z when the target falls in the chunk. In: (N, 4) f32 from
//   the previous chunk (`first`: none); out: (N, 4) f32;
// - backward, `vocab_grad_*`: turned into dz = ((onehot(t) − p)·g_lp − p·(z − E[z])·g_H) / τ with
//   p = e^{z − lse}, from the per-row (lse, E[z], g_lp, g_H) (N, 4) f32, written in z's dtype.
//
// Composed from candle ops these were ~12 passes over the (N, C) chunk each way (a cast to
// f32, a one-hot made and cast, subtractions, exponentials, products, sums): here z is read
// once and dz written once. One block of ROW_THREADS per row; sums in a fixed order, no
// atomics. CPU twin: the ops' `cpu_fwd` in src/fused/vocab_chunk.rs; the composed chunk of
// src/fused/vocab.rs is the reference both are tested against.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ float vocab_z(const T* zr, int j, float temperature) {
  return to_f(zr[j]) / temperature;
}

template <typename T>
__device__ void vocab_stats(const T* z, const uint32_t* targets, const float* in, float* out,
                            int c0, int cols, float temperature, int first) {
  const size_t row = blockIdx.x;
  const T* zr = z + row * cols;
  float cm = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) cm = fmaxf(cm, vocab_z(zr, j, temperature));
  cm = block_max(cm);
  const float m_old = first ? cm : in[row * 4];
  const float m = fmaxf(m_old, cm);
  float se = 0.0f, sed = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = vocab_z(zr, j, temperature) - m;
    const float e = expf(d);
    se += e;
    sed += e * d;
  }
  se = block_sum(se);
  sed = block_sum(sed);
  if (threadIdx.x == 0) {
    const uint32_t t = targets[row];
    const bool hit = t >= (uint32_t)c0 && t < (uint32_t)(c0 + cols);
    const float zt = hit ? vocab_z(zr, (int)(t - c0), temperature) : 0.0f;
    float* o = out + row * 4;
    o[0] = m;
    if (first) {
      o[1] = se;
      o[2] = sed;
      o[3] = zt;
    } else {
      const float s = in[row * 4 + 1], u = in[row * 4 + 2];
      const float diff = m_old - m, alpha = expf(diff);  // diff ≤ 0
      o[1] = alpha * s + se;
      o[2] = alpha * (u + s * diff) + sed;
      o[3] = in[row * 4 + 3] + zt;
    }
  }
}

template <typename T>
__device__ void vocab_grad(const T* z, const uint32_t* targets, const float* rowv, T* dz, int c0,
                           int cols, float temperature) {
  const size_t row = blockIdx.x;
  const T* zr = z + row * cols;
  T* dr = dz + row * cols;
  const float lse = rowv[row * 4], mean_z = rowv[row * 4 + 1];
  const float g_lp = rowv[row * 4 + 2], g_ent = rowv[row * 4 + 3];
  const int t = (int)targets[row] - c0;  // outside [0, cols) when the target is elsewhere
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float zz = vocab_z(zr, j, temperature);
    const float p = expf(zz - lse);
    const float d_lp = ((j == t ? 1.0f : 0.0f) - p) * g_lp;
    const float d_ent = p * (zz - mean_z) * g_ent;
    dr[j] = from_f<T>((d_lp - d_ent) / temperature);
  }
}

#define VOCAB(NAME, T)                                                                         \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                    \
      vocab_stats_##NAME(const T* z, const uint32_t* targets, const float* in, float* out,     \
                         int c0, int cols, float temperature, int first) {                     \
    vocab_stats<T>(z, targets, in, out, c0, cols, temperature, first);                         \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                    \
      vocab_grad_##NAME(const T* z, const uint32_t* targets, const float* rowv, T* dz, int c0, \
                        int cols, float temperature) {                                         \
    vocab_grad<T>(z, targets, rowv, dz, c0, cols, temperature);                                \
  }

VOCAB(f32, float)
VOCAB(bf16, __nv_bfloat16)
