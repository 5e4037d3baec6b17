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

// A row's columns as a thread walks them: VW = 16 / sizeof(T) consecutive columns a 16-byte load
// where the row allows (its length a multiple of VW, its start on 16 bytes: every chunk of
// Qwen3's vocabulary), one column a load otherwise; `f(j, z_j)` for each of the thread's columns,
// in a fixed order (the block's size fixes it). One 2-byte load a thread kept too few bytes in
// flight to reach the copy rate (the H200 run: 438 and 959 GB/s; kernels/NOTES.md, version 19).
template <typename T>
struct Pack {
  static constexpr int n = 16 / sizeof(T);
  T v[n];
};

// Whether a row of `cols` numbers at `p` (and at `q`, a row written beside it) takes 16-byte loads.
template <typename T>
__device__ __forceinline__ bool packs_fit(int cols, const void* p, const void* q = nullptr) {
  return cols % Pack<T>::n == 0 && ((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(q)) & 15) == 0;
}

template <typename T, typename F>
__device__ __forceinline__ void for_columns(const T* zr, int cols, F f) {
  constexpr int VW = Pack<T>::n;
  if (packs_fit<T>(cols, zr)) {
#pragma unroll 4
    for (int j = threadIdx.x * VW; j < cols; j += blockDim.x * VW) {
      Pack<T> k;
      const uint4 w = load16(zr + j);
      memcpy(&k, &w, 16);
#pragma unroll
      for (int u = 0; u < VW; ++u) f(j + u, k.v[u]);
    }
  } else {
    for (int j = threadIdx.x; j < cols; j += blockDim.x) f(j, zr[j]);
  }
}

template <typename T>
__device__ void vocab_stats(const T* z, const uint32_t* targets, const float* in, float* out,
                            int c0, int cols, float temperature, int first) {
  const size_t row = blockIdx.x;
  const T* zr = z + row * cols;
  float cm = -INFINITY;
  for_columns(zr, cols, [&](int, T x) { cm = fmaxf(cm, to_f(x) / temperature); });
  cm = block_max(cm);
  const float m_old = first ? cm : in[row * 4];
  const float m = fmaxf(m_old, cm);
  float se = 0.0f, sed = 0.0f;
  for_columns(zr, cols, [&](int, T x) {
    const float d = to_f(x) / temperature - m;
    const float e = expf(d);
    se += e;
    sed += e * d;
  });
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
__device__ __forceinline__ T vocab_dz(float zz, int j, int t, float lse, float mean_z, float g_lp,
                                      float g_ent, float temperature) {
  const float p = expf(zz - lse);
  const float d_lp = ((j == t ? 1.0f : 0.0f) - p) * g_lp;
  const float d_ent = p * (zz - mean_z) * g_ent;
  return from_f<T>((d_lp - d_ent) / temperature);
}

template <typename T>
__device__ void vocab_grad(const T* __restrict__ z, const uint32_t* targets, const float* rowv,
                           T* __restrict__ dz, int c0, int cols, float temperature) {
  const size_t row = blockIdx.x;
  const T* __restrict__ zr = z + row * cols;
  T* __restrict__ dr = dz + row * cols;
  const float lse = rowv[row * 4], mean_z = rowv[row * 4 + 1];
  const float g_lp = rowv[row * 4 + 2], g_ent = rowv[row * 4 + 3];
  const int t = (int)targets[row] - c0;  // outside [0, cols) when the target is elsewhere
  constexpr int VW = Pack<T>::n;
  if (packs_fit<T>(cols, zr, dr)) {
    // z and dz are separate buffers (__restrict__): the next columns' loads may pass this
    // store, so the unrolled loop keeps several in flight
#pragma unroll 4
    for (int j = threadIdx.x * VW; j < cols; j += blockDim.x * VW) {
      Pack<T> k, o;
      const uint4 w = load16(zr + j);
      memcpy(&k, &w, 16);
#pragma unroll
      for (int u = 0; u < VW; ++u)
        o.v[u] = vocab_dz<T>(to_f(k.v[u]) / temperature, j + u, t, lse, mean_z, g_lp, g_ent, temperature);
      uint4 ow;
      memcpy(&ow, &o, 16);
      store16(dr + j, ow);
    }
  } else {
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
      dr[j] = vocab_dz<T>(vocab_z(zr, j, temperature), j, t, lse, mean_z, g_lp, g_ent, temperature);
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
