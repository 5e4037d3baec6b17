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
// every run. A row's positions are read by every thread of its block alike (one broadcast load),
// and four rows of dy are loaded before they are added, in order, so a frequent token's loads
// overlap. Candle's `index_add`, which this replaces on the GPU, starts one thread a column and
// walks all N positions in each.
//
// CPU twin: src/fused/embedding.rs (`embedding_backward_host`).
#include "common.cuh"

template <typename T>
__device__ void embedding_grad(const T* dy, const T* base, int has_base, const unsigned int* meta,
                               float* out, size_t vocab, size_t h) {
  const unsigned int* order = meta + vocab + 1;
  const size_t per_row = (h + blockDim.x - 1) / blockDim.x;
  for (size_t k = blockIdx.x; k < vocab * per_row; k += gridDim.x) {
    const size_t t = k / per_row, c = (k - t * per_row) * blockDim.x + threadIdx.x;
    if (c >= h) continue;
    // `0 + b`: the zero-filled gradient the lm_head's share was added into (−0 becomes +0)
    float acc = __fadd_rn(0.0f, has_base ? to_f(base[t * h + c]) : 0.0f);
    unsigned int j = meta[t];
    const unsigned int end = meta[t + 1];
    for (; j + 4 <= end; j += 4) {
      const float a = to_f(dy[(size_t)order[j] * h + c]);
      const float b = to_f(dy[(size_t)order[j + 1] * h + c]);
      const float d = to_f(dy[(size_t)order[j + 2] * h + c]);
      const float e = to_f(dy[(size_t)order[j + 3] * h + c]);
      acc = __fadd_rn(acc, a);
      acc = __fadd_rn(acc, b);
      acc = __fadd_rn(acc, d);
      acc = __fadd_rn(acc, e);
    }
    for (; j < end; ++j) acc = __fadd_rn(acc, to_f(dy[(size_t)order[j] * h + c]));
    out[t * h + c] = acc;
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
