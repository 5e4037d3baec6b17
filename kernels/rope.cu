// Rotary embedding by cos, sin (B, 1, T, D) whose halves are equal: per pair (x₁, x₂) of the two
// halves, (x₁c − x₂s, x₂c + x₁s). The backward is the same kernel with −sin (`sign` = −1).
// x and y each in one of two layouts, chosen per launch: heads first, (B, H, T, D), which
// attention reads, or tokens first, (B, T, H, D), which the q/k/v projections write. The
// model's forward rotates q and k from tokens first to heads first (no transpose made
// contiguous before), its backward back. CPU twin: src/fused/rope.rs (the fused op and
// rope_composed).
#include "common.cuh"

// Pairs are walked in y's order, so the writes are coalesced; a thread reads its pair's two
// elements of x's row, the row's pairs by adjacent threads.
template <typename T>
__device__ void rope(const T* x, const T* cos, const T* sin, T* y, int h, int t, int d,
                     float sign, size_t pairs, int x_heads_first, int y_heads_first) {
  const int half = d / 2;
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs;
       p += (size_t)gridDim.x * blockDim.x) {
    const size_t row = p / half;  // y's row: (b, h, t) or (b, t, h) flattened
    const int j = p % half;
    const size_t bi = row / ((size_t)h * t);
    const size_t ti = y_heads_first ? row % t : (row / h) % t;
    const size_t hi = y_heads_first ? (row / t) % h : row % h;
    const size_t xrow = x_heads_first ? (bi * h + hi) * t + ti : (bi * t + ti) * h + hi;
    const size_t cs = (bi * t + ti) * d + j;
    const float c = to_f(cos[cs]), s = sign * to_f(sin[cs]);
    const float x1 = to_f(x[xrow * d + j]), x2 = to_f(x[xrow * d + half + j]);
    y[row * d + j] = from_f<T>(x1 * c - x2 * s);
    y[row * d + half + j] = from_f<T>(x2 * c + x1 * s);
  }
}

#define ROPE(NAME, T)                                                                          \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                   \
      rope_##NAME(const T* x, const T* cos, const T* sin, T* y, int h, int t, int d,           \
                  float sign, size_t pairs, int x_heads_first, int y_heads_first) {            \
    rope<T>(x, cos, sin, y, h, t, d, sign, pairs, x_heads_first, y_heads_first);               \
  }

ROPE(f32, float)
ROPE(bf16, __nv_bfloat16)
