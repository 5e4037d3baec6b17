// Flash attention, forward and backward (FlashAttention-2's algorithm; src/fused/flash.rs is
// the CPU twin and states the semantics: grouped-query, key j visible to query i iff
// valid[b, j] and j <= past + i, a hidden key's score gets -1e9 added, a query that sees no
// key averages V uniformly over every key).
//
// Each query row keeps stats[row] = {m, 1/sum}, its maximum score and the inverse of its
// normaliser, and the backward recomputes p = exp(s - m) / sum. FA2 keeps lse = m + log(sum)
// instead. For a row that sees no key, m = -1e9 and f32 cannot hold log(sum) beside it, so
// that would give p = 1 instead of 1/S.
//
// K and V rows are `cap` columns apart (a KV cache's buffer, of which the first S are keys);
// the backward takes cap == S.
//
// These are the row kernels: CUDA cores, any head dim up to 128, f32 or bf16; the oracle of the
// tensor-core kernels (flash_mma.cu), which take bf16 at head dim 64 and 128. One warp owns a row:
// - forward and dQ: a query row. The block's FA_WARPS rows share tiles of FA_TILE keys in shared
//   memory; lane l scores key l of the tile; online softmax over the tiles;
// - dK/dV: a key row. The block's FA_WARPS keys share tiles of FA_TILE query rows of every query
//   head that reads the KV head.
// Sums run in a fixed order and there are no atomics, so a result is the same on every run.
// Tiles that causality hides from every row of a block are skipped. They would add exp(-1e9)
// = 0, unless the block holds a row that sees no key: then it reads every key.
#include "flash.cuh"

#define FA_TILE 32
#define FA_CHUNKS (FA_MAXD / 32)

// first[b] = the first valid key of sequence b (S when there is none).
extern "C" __global__ void __launch_bounds__(ROW_THREADS) flash_first_valid(const uint8_t* __restrict__ valid, int S,
                                             int* __restrict__ first) {
  const uint8_t* row = valid + (size_t)blockIdx.x * S;
  float best = -(float)S;
  for (int j = threadIdx.x; j < S; j += blockDim.x)
    if (row[j]) best = fmaxf(best, -(float)j);
  best = block_max(best);
  if (threadIdx.x == 0) first[blockIdx.x] = (int)(-best);
}

template <typename T>
__device__ void fa_load_tile(float (*dst)[FA_MAXD + 1], const T* src, int j0, int n, int D) {
  for (int x = threadIdx.x; x < FA_TILE * D; x += blockDim.x) {
    const int jj = x / D, d = x % D, j = j0 + jj;
    dst[jj][d] = j < n ? to_f(src[(size_t)j * D + d]) : 0.0f;
  }
}

// grid (ceil(T / FA_WARPS), H, B), block 32 * FA_WARPS.
template <typename T>
__device__ void fa_forward(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const uint8_t* __restrict__ valid,
                           const int* __restrict__ first, T* __restrict__ o,
                           float* __restrict__ stats, int H, int KV, int Tq, int S, int cap, int D, int past,
                           float scale) {
  __shared__ float ks[FA_TILE][FA_MAXD + 1];
  __shared__ float vs[FA_TILE][FA_MAXD + 1];
  __shared__ float qs[FA_WARPS][FA_MAXD];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bi = blockIdx.z, hi = blockIdx.y, g = hi / (H / KV);
  const int row0 = blockIdx.x * FA_WARPS, i = row0 + warp;
  const bool active = i < Tq;
  const size_t row = ((size_t)bi * H + hi) * Tq + i;
  if (active)
    for (int d = lane; d < D; d += 32) qs[warp][d] = to_f(q[row * D + d]);
  const T* kb = k + ((size_t)bi * KV + g) * cap * D;
  const T* vb = v + ((size_t)bi * KV + g) * cap * D;
  const uint8_t* valid_b = valid + (size_t)bi * S;
  const int last = min(Tq - 1, row0 + FA_WARPS - 1);
  const int kend = fa_blind_rows(first[bi], past, row0) ? S : min(S, past + last + 1);
  float m = -INFINITY, l = 0.0f, acc[FA_CHUNKS];
#pragma unroll
  for (int c = 0; c < FA_CHUNKS; ++c) acc[c] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += FA_TILE) {
    __syncthreads();
    fa_load_tile(ks, kb, j0, S, D);
    fa_load_tile(vs, vb, j0, S, D);
    __syncthreads();
    if (!active) continue;
    const int j = j0 + lane;
    float sc = -INFINITY;
    if (j < kend) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += qs[warp][d] * ks[lane][d];
      sc = dot * scale + fa_bias(valid_b, j, i, past);
    }
    const float m_new = fmaxf(m, warp_max(sc));
    const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
    const float alpha = expf(m - m_new);
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int c = 0; c < FA_CHUNKS; ++c) acc[c] *= alpha;
    for (int jj = 0; jj < FA_TILE; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
      for (int c = 0; c < FA_CHUNKS; ++c) {
        const int d = lane + 32 * c;
        if (d < D) acc[c] += pj * vs[jj][d];
      }
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
#pragma unroll
  for (int c = 0; c < FA_CHUNKS; ++c) {
    const int d = lane + 32 * c;
    if (d < D) o[row * D + d] = from_f<T>(acc[c] * inv);
  }
  if (lane == 0) {
    stats[2 * row] = m;
    stats[2 * row + 1] = inv;
  }
}

// delta[r] = sum_d dO[r, d] * O[r, d]; one warp per row, grid ceil(rows / FA_WARPS).
template <typename T>
__device__ void fa_delta(const T* __restrict__ o, const T* __restrict__ dout,
                         float* __restrict__ delta, int rows, int D) {
  const int lane = threadIdx.x & 31, r = blockIdx.x * FA_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) s += to_f(dout[(size_t)r * D + d]) * to_f(o[(size_t)r * D + d]);
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

// dQ: the forward's layout, P recomputed from the row statistics.
template <typename T>
__device__ void fa_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ stats,
                      const float* __restrict__ delta, const uint8_t* __restrict__ valid,
                      const int* __restrict__ first, T* __restrict__ dq, int H, int KV, int Tq,
                      int S, int cap, int D, int past, float scale) {
  __shared__ float ks[FA_TILE][FA_MAXD + 1];
  __shared__ float vs[FA_TILE][FA_MAXD + 1];
  __shared__ float qs[FA_WARPS][FA_MAXD];
  __shared__ float dos[FA_WARPS][FA_MAXD];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bi = blockIdx.z, hi = blockIdx.y, g = hi / (H / KV);
  const int row0 = blockIdx.x * FA_WARPS, i = row0 + warp;
  const bool active = i < Tq;
  const size_t row = ((size_t)bi * H + hi) * Tq + i;
  if (active)
    for (int d = lane; d < D; d += 32) {
      qs[warp][d] = to_f(q[row * D + d]);
      dos[warp][d] = to_f(dout[row * D + d]);
    }
  const float m_i = active ? stats[2 * row] : 0.0f, inv_i = active ? stats[2 * row + 1] : 0.0f;
  const float delta_i = active ? delta[row] : 0.0f;
  const T* kb = k + ((size_t)bi * KV + g) * cap * D;
  const T* vb = v + ((size_t)bi * KV + g) * cap * D;
  const uint8_t* valid_b = valid + (size_t)bi * S;
  const int last = min(Tq - 1, row0 + FA_WARPS - 1);
  const int kend = fa_blind_rows(first[bi], past, row0) ? S : min(S, past + last + 1);
  float acc[FA_CHUNKS];
#pragma unroll
  for (int c = 0; c < FA_CHUNKS; ++c) acc[c] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += FA_TILE) {
    __syncthreads();
    fa_load_tile(ks, kb, j0, S, D);
    fa_load_tile(vs, vb, j0, S, D);
    __syncthreads();
    if (!active) continue;
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j < kend) {
      float dot = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        dot += qs[warp][d] * ks[lane][d];
        dp += dos[warp][d] * vs[lane][d];
      }
      const float p = expf(dot * scale + fa_bias(valid_b, j, i, past) - m_i) * inv_i;
      ds = p * (dp - delta_i) * scale;
    }
    for (int jj = 0; jj < FA_TILE; ++jj) {
      const float dj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
      for (int c = 0; c < FA_CHUNKS; ++c) {
        const int d = lane + 32 * c;
        if (d < D) acc[c] += dj * ks[jj][d];
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int c = 0; c < FA_CHUNKS; ++c) {
    const int d = lane + 32 * c;
    if (d < D) dq[row * D + d] = from_f<T>(acc[c]);
  }
}

// dK and dV: grid (ceil(S / FA_WARPS), KV, B); warp w owns key j = blockIdx.x * FA_WARPS + w and
// sums over the query rows of the H / KV heads that read this KV head.
template <typename T>
__device__ void fa_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ dout, const float* __restrict__ stats,
                        const float* __restrict__ delta, const uint8_t* __restrict__ valid,
                        const int* __restrict__ first, T* __restrict__ dk, T* __restrict__ dv,
                        int H, int KV, int Tq, int S, int cap, int D, int past, float scale) {
  __shared__ float qs[FA_TILE][FA_MAXD + 1];
  __shared__ float dos[FA_TILE][FA_MAXD + 1];
  __shared__ float kj[FA_WARPS][FA_MAXD];
  __shared__ float vj[FA_WARPS][FA_MAXD];
  __shared__ float m_t[FA_TILE], inv_t[FA_TILE], delta_t[FA_TILE];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bi = blockIdx.z, g = blockIdx.y, rep = H / KV;
  const int key0 = blockIdx.x * FA_WARPS, j = key0 + warp;
  const bool active = j < S;
  const size_t krow = ((size_t)bi * KV + g) * S + j;
  if (active)
    for (int d = lane; d < D; d += 32) {
      kj[warp][d] = to_f(k[krow * D + d]);
      vj[warp][d] = to_f(v[krow * D + d]);
    }
  const uint8_t* valid_b = valid + (size_t)bi * S;
  // Query rows i < key0 - past cannot see these keys, unless some row sees no key at all.
  const int istart = fa_blind_rows(first[bi], past, 0) ? 0 : max(0, key0 - past) / FA_TILE * FA_TILE;
  float dk_acc[FA_CHUNKS], dv_acc[FA_CHUNKS];
#pragma unroll
  for (int c = 0; c < FA_CHUNKS; ++c) dk_acc[c] = dv_acc[c] = 0.0f;
  for (int hi = g * rep; hi < (g + 1) * rep; ++hi) {
    const size_t head = ((size_t)bi * H + hi) * Tq;
    for (int i0 = istart; i0 < Tq; i0 += FA_TILE) {
      __syncthreads();
      fa_load_tile(qs, q + head * D, i0, Tq, D);
      fa_load_tile(dos, dout + head * D, i0, Tq, D);
      if (threadIdx.x < FA_TILE) {
        const int i = i0 + threadIdx.x;
        m_t[threadIdx.x] = i < Tq ? stats[2 * (head + i)] : 0.0f;
        inv_t[threadIdx.x] = i < Tq ? stats[2 * (head + i) + 1] : 0.0f;
        delta_t[threadIdx.x] = i < Tq ? delta[head + i] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      const int i = i0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < Tq) {
        float dot = 0.0f, dp = 0.0f;
        for (int d = 0; d < D; ++d) {
          dot += qs[lane][d] * kj[warp][d];
          dp += dos[lane][d] * vj[warp][d];
        }
        p = expf(dot * scale + fa_bias(valid_b, j, i, past) - m_t[lane]) * inv_t[lane];
        ds = p * (dp - delta_t[lane]) * scale;
      }
      for (int ii = 0; ii < FA_TILE; ++ii) {
        const float pi = __shfl_sync(0xffffffffu, p, ii);
        const float di = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
        for (int c = 0; c < FA_CHUNKS; ++c) {
          const int d = lane + 32 * c;
          if (d < D) {
            dv_acc[c] += pi * dos[ii][d];
            dk_acc[c] += di * qs[ii][d];
          }
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int c = 0; c < FA_CHUNKS; ++c) {
    const int d = lane + 32 * c;
    if (d < D) {
      dk[krow * D + d] = from_f<T>(dk_acc[c]);
      dv[krow * D + d] = from_f<T>(dv_acc[c]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Decode: one query row per (sequence, query head), Tq == 1 (issue #20). Split-K over the keys,
// as flash-decoding does: block (split, KV head, sequence) reads its FD_SPLIT keys once for all
// G = H / KV query heads that share them, and writes one partial (m, l, acc[D]) per query head;
// fd_combine merges the partials of a row in split order. Warp w takes keys 4w..4w+3 of every
// 16; its lanes hold D/32 dims of each key's K and V rows (coalesced loads) and the warp reduces
// the dot products. No shared K/V tile and no __syncthreads in the key loop.
//
// Splits start at the row's first valid key, not at column 0: a row's sums are grouped the same
// way whatever left padding the batch gives it, so a completion does not depend on the batch
// it is decoded in (the engine's property; tests/it/cuda.rs checks the bits). A row that sees
// no key reads every key from column 0, as the forward does.
#define FD_UNROLL 4

// grid (nsplit, KV, B), block 32 * FD_WARPS. part: (B, H, nsplit, 2 + D) f32 = m, l, acc.
template <typename T>
__device__ void fd_split(const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, const uint8_t* __restrict__ valid,
                         const int* __restrict__ first, float* __restrict__ part, int nsplit,
                         int H, int KV, int S, int cap, int D, int past, float scale) {
  __shared__ float qs[FD_MAXG][FA_MAXD];
  __shared__ float wml[FD_WARPS][FD_MAXG][2];
  __shared__ float wacc[FD_WARPS][FD_MAXG][FA_MAXD];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = blockIdx.x, g = blockIdx.y, bi = blockIdx.z, G = H / KV, h0 = g * G;
  for (int x = threadIdx.x; x < G * D; x += blockDim.x)
    qs[x / D][x % D] = to_f(q[((size_t)bi * H + h0 + x / D) * D + x % D]);
  __syncthreads();
  const int f = first[bi];
  const int lo = (f > past ? 0 : f) + split * FD_SPLIT, hi = min(S, lo + FD_SPLIT);
  const T* kb = k + ((size_t)bi * KV + g) * cap * D;
  const T* vb = v + ((size_t)bi * KV + g) * cap * D;
  const uint8_t* valid_b = valid + (size_t)bi * S;
  float m[FD_MAXG], l[FD_MAXG], acc[FD_MAXG][FA_CHUNKS];
#pragma unroll
  for (int h = 0; h < FD_MAXG; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < FA_CHUNKS; ++c) acc[h][c] = 0.0f;
  }
  // FD_UNROLL consecutive keys per warp and step: their loads are in flight together, and the
  // running max is rescaled once per step.
  for (int j = lo + warp * FD_UNROLL; j < hi; j += FD_WARPS * FD_UNROLL) {
    float kx[FD_UNROLL][FA_CHUNKS], vx[FD_UNROLL][FA_CHUNKS], bias[FD_UNROLL];
#pragma unroll
    for (int u = 0; u < FD_UNROLL; ++u) {
      const int ju = j + u;
      const bool in = ju < hi;
#pragma unroll
      for (int c = 0; c < FA_CHUNKS; ++c) {
        const int d = lane + 32 * c;
        kx[u][c] = in && d < D ? to_f(kb[(size_t)ju * D + d]) : 0.0f;
        vx[u][c] = in && d < D ? to_f(vb[(size_t)ju * D + d]) : 0.0f;
      }
      bias[u] = in ? fa_bias(valid_b, ju, 0, past) : -INFINITY;  // -inf: past the split
    }
#pragma unroll
    for (int h = 0; h < FD_MAXG; ++h) {
      if (h < G) {
        float sc[FD_UNROLL];
        float m_new = m[h];
#pragma unroll
        for (int u = 0; u < FD_UNROLL; ++u) {
          float dot = 0.0f;
#pragma unroll
          for (int c = 0; c < FA_CHUNKS; ++c) {
            const int d = lane + 32 * c;
            if (d < D) dot += qs[h][d] * kx[u][c];
          }
          // finite for a key of the split (a hidden key's bias is -1e9, not -inf); key j < hi
          // is one, so m_new is finite
          sc[u] = warp_sum(dot) * scale + bias[u];
          m_new = fmaxf(m_new, sc[u]);
        }
        const float alpha = expf(m[h] - m_new);
        float psum = 0.0f, p[FD_UNROLL];
#pragma unroll
        for (int u = 0; u < FD_UNROLL; ++u) {
          p[u] = bias[u] == -INFINITY ? 0.0f : expf(sc[u] - m_new);
          psum += p[u];
        }
        l[h] = l[h] * alpha + psum;
#pragma unroll
        for (int c = 0; c < FA_CHUNKS; ++c) {
          float a = acc[h][c] * alpha;
#pragma unroll
          for (int u = 0; u < FD_UNROLL; ++u) a += p[u] * vx[u][c];
          acc[h][c] = a;
        }
        m[h] = m_new;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < FD_MAXG; ++h) {
    if (h < G) {
      if (lane == 0) {
        wml[warp][h][0] = m[h];
        wml[warp][h][1] = l[h];
      }
#pragma unroll
      for (int c = 0; c < FA_CHUNKS; ++c) {
        const int d = lane + 32 * c;
        if (d < D) wacc[warp][h][d] = acc[h][c];
      }
    }
  }
  __syncthreads();
  // The block's partial: its warps merged in warp order (a warp with no key has l = 0).
  for (int x = threadIdx.x; x < G * D; x += blockDim.x) {
    const int h = x / D, d = x % D;
    float mx = -INFINITY, sum = 0.0f, a = 0.0f;
    for (int w = 0; w < FD_WARPS; ++w) mx = fmaxf(mx, wml[w][h][0]);
    for (int w = 0; w < FD_WARPS; ++w)
      if (wml[w][h][1] > 0.0f) {
        const float e = expf(wml[w][h][0] - mx);
        sum += wml[w][h][1] * e;
        a += wacc[w][h][d] * e;
      }
    float* pr = part + (((size_t)bi * H + h0 + h) * nsplit + split) * (2 + D);
    pr[2 + d] = a;
    if (d == 0) {
      pr[0] = mx;
      pr[1] = sum;
    }
  }
}

// grid (H, B), block FA_MAXD: the partials of each row in split order; O and the row's stats.
template <typename T>
__device__ void fd_combine(const float* __restrict__ part, T* __restrict__ o,
                           float* __restrict__ stats, int nsplit, int H, int D) {
  const size_t row = (size_t)blockIdx.y * H + blockIdx.x;
  const float* pr = part + row * nsplit * (2 + D);
  const int d = threadIdx.x;
  float mx = -INFINITY, sum = 0.0f, a = 0.0f;
  for (int s = 0; s < nsplit; ++s) mx = fmaxf(mx, pr[s * (2 + D)]);
  for (int s = 0; s < nsplit; ++s) {
    const float* ps = pr + s * (2 + D);
    if (ps[1] > 0.0f) {
      const float e = expf(ps[0] - mx);
      sum += ps[1] * e;
      if (d < D) a += ps[2 + d] * e;
    }
  }
  const float inv = 1.0f / sum;
  if (d < D) o[row * D + d] = from_f<T>(a * inv);
  if (d == 0) {
    stats[2 * row] = mx;
    stats[2 * row + 1] = inv;
  }
}

#define FA_INSTANCES(T, SFX)                                                                  \
  extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                                 \
      flash_fwd_##SFX(const T* q, const T* k, const T* v, const uint8_t* valid, const int* first,\
                      T* o, float* stats, FA_ARGS) {                                          \
    fa_forward<T>(q, k, v, valid, first, o, stats, FA_PASS);                                  \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                                 \
      flash_delta_##SFX(const T* o, const T* dout, float* delta, int rows, int D) {           \
    fa_delta<T>(o, dout, delta, rows, D);                                                     \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                                 \
      flash_dq_##SFX(const T* q, const T* k, const T* v, const T* dout, const float* stats,   \
                     const float* delta, const uint8_t* valid, const int* first, T* dq,       \
                     FA_ARGS) {                                                               \
    fa_dq<T>(q, k, v, dout, stats, delta, valid, first, dq, FA_PASS);                         \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(FA_WARPS * 32) flash_dkdv_##SFX(               \
      const T* q, const T* k, const T* v, const T* dout, const float* stats,                  \
      const float* delta, const uint8_t* valid, const int* first, T* dk, T* dv, FA_ARGS) {    \
    fa_dkdv<T>(q, k, v, dout, stats, delta, valid, first, dk, dv, FA_PASS);                   \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(FD_WARPS * 32)                                 \
      flash_decode_split_##SFX(const T* q, const T* k, const T* v, const uint8_t* valid,      \
                               const int* first, float* part, int nsplit, FA_ARGS) {          \
    fd_split<T>(q, k, v, valid, first, part, nsplit, H, KV, S, cap, D, past, scale);          \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(FA_MAXD) flash_decode_combine_##SFX(           \
      const float* part, T* o, float* stats, int nsplit, int H, int D) {                      \
    fd_combine<T>(part, o, stats, nsplit, H, D);                                              \
  }

FA_INSTANCES(float, f32)
FA_INSTANCES(__nv_bfloat16, bf16)
