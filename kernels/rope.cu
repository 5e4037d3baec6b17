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

// The rotary tables of positions (B, T) (u32): per position p and frequency j < D/2,
// f = float(p)·inv_freq[j], its row [cos f…, cos f…] or [sin f…, sin f…] (HF's cat(freqs, freqs))
// of (B, 1, T, D), stored as T. One launch a table where the model's composed tables took eight
// kernels in bf16 (six in f32) and an upload of inv_freq each forward: the same f32 operations in the same order as
// candle's kernels (the cast of p, one product, cosf/sinf, round to T), so the same bits. CPU
// twin: src/fused/rope.rs (`RopeTable`), beside the composed `rope_tables` in src/model/qwen.rs.
template <typename T>
__device__ void rope_table(const unsigned* pos, const float* inv_freq, T* out, int d, int want_sin,
                           size_t n) {
  const int half = d / 2;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const int c = i % d;
    const float f = (float)pos[i / d] * inv_freq[c < half ? c : c - half];
    out[i] = from_f<T>(want_sin ? sinf(f) : cosf(f));
  }
}

#define ROPE_TABLE(NAME, T)                                                                    \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                   \
      rope_table_##NAME(const unsigned* pos, const float* inv_freq, T* out, int d, int want_sin, \
                        size_t n) {                                                            \
    rope_table<T>(pos, inv_freq, out, d, want_sin, n);                                         \
  }

ROPE_TABLE(f32, float)
ROPE_TABLE(bf16, __nv_bfloat16)
