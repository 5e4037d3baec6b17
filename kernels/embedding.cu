// The embedding lookup's backward in one pass (issue #59 item 2): the f32 gradient (V, H) of an
// embedding matrix from the gradient dy (N, H) of its N looked-up rows, starting from `base`
// (V, H) (the tied lm_head's share) where `has_base`:
//
//   out[t][c] = ((0 + base[t][c]) + dy[p1][c]) + dy[p2][c] + ...   p1 < p2 < ... t's positions
//
// in f32, in position order: what autograd's `index_add` into the gradient so far gives, bit for
// bit in f32. `meta` holds V + 1 starts then the N positions grouped by token, each group in
// position order (the host's counting sort): t's positions are meta[V + 1 + starts[t] ..
// V + 1 + starts[t + 1]].
//
// A block takes a chunk of blockDim.x columns of one row (a grid-stride loop over the V·⌈H /
// blockDim⌉ chunks), one thread a column, so every output element is written once, by one thread,
// and its sum's order is the row's positions' whatever the grid: no atomics, the same bits on
// every run. A row's positions come into shared memory EMB_TILE at a time, and eight rows of dy
// are loaded before they are added, in order, so a frequent token's loads (padding: thousands of
// positions) overlap rather than wait on each position's index. Candle's `index_add`, which this
// replaces on the GPU, starts one thread a column and walks all N positions in each.
//
// CPU twin: src/fused/embedding.rs (`embedding_backward_host`).
#include "common.cuh"

template <typename T>
__device__ void embedding_grad(const T* dy, const T* base, int has_base, const unsigned int* meta,
                               float* out, size_t vocab, size_t h) {
  __shared__ unsigned int pos[EMB_TILE];
  const unsigned int* order = meta + vocab + 1;
  const size_t per_row = (h + blockDim.x - 1) / blockDim.x;
  // k is the block's alone, so every thread of a block reaches the barriers below alike
  for (size_t k = blockIdx.x; k < vocab * per_row; k += gridDim.x) {
    const size_t t = k / per_row, c = (k - t * per_row) * blockDim.x + threadIdx.x;
    const bool mine = c < h;
    // `0 + b`: the zero-filled gradient the lm_head's share was added into (−0 becomes +0)
    float acc = __fadd_rn(0.0f, mine && has_base ? to_f(base[t * h + c]) : 0.0f);
    const unsigned int first = meta[t], end = meta[t + 1];
    for (unsigned int tile = first; tile < end; tile += EMB_TILE) {
      const unsigned int n = end - tile < EMB_TILE ? end - tile : EMB_TILE;
      for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) pos[i] = order[tile + i];
      __syncthreads();
      if (mine) {
        unsigned int i = 0;
        for (; i + 8 <= n; i += 8) {
          float v[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) v[u] = to_f(dy[(size_t)pos[i + u] * h + c]);
#pragma unroll
          for (int u = 0; u < 8; ++u) acc = __fadd_rn(acc, v[u]);
        }
        for (; i < n; ++i) acc = __fadd_rn(acc, to_f(dy[(size_t)pos[i] * h + c]));
      }
      __syncthreads();  // pos is refilled by the next tile
    }
    if (mine) out[t * h + c] = acc;
  }
}

#define EMBEDDING_GRAD(NAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                    \
      embedding_grad_##NAME(const T* dy, const T* base, int has_base, const unsigned int* meta, \
                            float* out, size_t vocab, size_t h) {                               \
    embedding_grad<T>(dy, base, has_base, meta, out, vocab, h);                                 \
  }

EMBEDDING_GRAD(f32, float)
EMBEDDING_GRAD(bf16, __nv_bfloat16)
