// The decode step's per-layer element-wise chain, fused (one query position per row):
//
// - `qk_norm_rope_cache_*`: after the q/k/v projection (one product with the stacked weights
//   [Wq; Wk; Wv]: a row's q, k and v heads side by side), Qwen3's RMSNorm of every q and k head
//   (Qwen2: none), the rotary embedding of both, q written heads first for attention, and the
//   new token's k and v written into the KV cache at column `col`. Composed, that is three
//   products, q_norm, k_norm, two RoPE launches and the cache's two column writes: nine
//   launches, two here.
//   One block of DEC_THREADS threads per (row, head), heads in the order q (h), k (kv), v (kv).
//   The norm reduces as rms_norm.cu's row kernel does (block_sum: a warp's xor tree, then the
//   warps' in warp order), and each value is rounded to the storage type where the composed
//   chain stores it (the normalised row, its product with w, the rotation), so for head dims
//   up to DEC_THREADS the result is the composed kernels' bit for bit.
// - `qk_norm_rope_paged_*`: the same over a paged KV cache (src/model/paged.rs): the new k and
//   v rows go to the pool rows the step's write index names (`rows[(b·kv + j)·rows_stride]`),
//   where the composed path writes them with two `scatter_set` launches.
// - `*_bf16_fp8`: both over an FP8 KV cache (E4M3 bytes, issue #57): each new k and v value, as
//   the bf16 instance computes it, written as its E4M3 byte (fp8.cuh's rounding, which
//   `fp8_e4m3_from_bf16` applies on the composed path: the same bytes); q as the bf16 instance.
// - `add_rms_norm_*`: the residual add and the next RMSNorm, h = x + a (rounded as the add's
//   kernel rounds it) and y = rms_norm(h)·w, both written: two launches, one here; one block of
//   ROW_THREADS per row, reducing as rms_norm.cu does (the same bits).
//
// - `pool_store_w4` / `pool_store_w16`: whole rows into the pool rows an index names, as the
//   paged cache's prefill stores a batch's keys and values and copies a shared block: source
//   row r (`words` words of 4 or 16 bytes) to pool row rows[r · rows_stride] (the write index's
//   first column, as the paged chain reads it). One thread a word, so a prefill's millions of
//   rows go at the copy rate, where candle's `scatter_set` on CUDA walks the rows one after
//   another in one block of D threads (a 1,024-row prefill of 1,024-token prompts: ~470 M rows
//   in sequence). An index past the pool stops the kernel. Rows that name one pool row (a
//   batched prefill's padding, all written to the scratch block's first row) land in no fixed
//   order: the GPU never reads that row (the decode kernel starts at a row's first valid key).
//
// CPU twin: src/fused/decode_chain.rs (the composed ops it replaces; `scatter_set` for the
// stores).
#include "common.cuh"
#include "fp8.cuh"

// Where head j of row b's new key and value start in the cache buffers: column `col` of the
// row's dense buffer (B, KV, capacity, D).
struct DenseSlot {
  size_t row_stride, head_stride, col;
  int d;
  __device__ size_t operator()(size_t b, int j, int) const {
    return b * row_stride + j * head_stride + col * d;
  }
};

// ... or the pool row (N, D) that the paged step's write index names for (b, j); an index past
// the pool stops the kernel (the host built the index from the pool's own block tables).
struct PagedSlot {
  const unsigned int* rows;
  size_t rows_stride, n_rows;
  int d;
  __device__ size_t operator()(size_t b, int j, int kv) const {
    const size_t r = rows[(b * kv + j) * rows_stride];
    if (r >= n_rows) kernel_trap();
    return r * d;
  }
};

// A value the cache holds: itself in a cache of its own type, its E4M3 byte in an FP8 cache.
template <typename T>
__device__ __forceinline__ T cached(T x, const T*) {
  return x;
}
template <typename T>
__device__ __forceinline__ uint8_t cached(T x, const uint8_t*) {
  return fp8_e4m3_byte(to_f(x));
}

// `qkv` (B, H + 2·KV, D): a row's q, k and v heads in that order, as one product with the
// stacked weights [Wq; Wk; Wv] gives them; block (b, hd) reads head hd of row b. The cache
// buffers hold C: T, or E4M3 bytes (uint8_t).
template <typename T, typename C, typename Slot>
__device__ void qk_norm_rope_cache(const T* qkv, const T* qw, const T* kw, const T* cos,
                                   const T* sin, T* qo, C* kc, C* vc, int h, int kv, int d,
                                   float eps, int norm, Slot slot) {
  __shared__ float n[DEC_MAXD];
  const int heads = h + 2 * kv;
  const size_t b = blockIdx.x / heads;
  const int hd = blockIdx.x % heads;
  const T* x = qkv + (b * heads + hd) * d;
  if (hd >= h + kv) {  // v: into its slot, as it is
    C* dst = vc + slot(b, hd - h - kv, kv);
    for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = cached(x[j], dst);
    return;
  }
  const bool is_q = hd < h;
  const T* w = is_q ? qw : kw;
  T* yq = is_q ? qo + (b * h + hd) * d : nullptr;
  C* yk = is_q ? nullptr : kc + slot(b, hd - h, kv);
  if (norm) {
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
      const float xv = to_f(x[j]);
      ss += xv * xv;
    }
    const float r = 1.0f / sqrtf(block_sum(ss) / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
      n[j] = to_f(from_f<T>(to_f(from_f<T>(to_f(x[j]) * r)) * to_f(w[j])));
  } else {
    for (int j = threadIdx.x; j < d; j += blockDim.x) n[j] = to_f(x[j]);
  }
  __syncthreads();
  const int half = d / 2;
  const T* c = cos + b * d;
  const T* s = sin + b * d;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float cj = to_f(c[j]), sj = to_f(s[j]);
    const float x1 = n[j], x2 = n[half + j];
    const T y1 = from_f<T>(x1 * cj - x2 * sj), y2 = from_f<T>(x2 * cj + x1 * sj);
    if (is_q) {
      yq[j] = y1;
      yq[half + j] = y2;
    } else {
      yk[j] = cached(y1, yk);
      yk[half + j] = cached(y2, yk);
    }
  }
}

template <typename T>
__device__ void add_rms_norm(const T* x, const T* a, const T* w, T* hs, T* y, int n, float eps) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * n;
  const T* ar = a + row * n;
  T* hr = hs + row * n;
  T* yr = y + row * n;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const T sum = from_f<T>(to_f(xr[j]) + to_f(ar[j]));
    hr[j] = sum;
    const float v = to_f(sum);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(block_sum(ss) / n + eps);
  // each thread reads back the sums it wrote itself: no barrier needed between the loops
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    yr[j] = from_f<T>(to_f(from_f<T>(to_f(hr[j]) * r)) * to_f(w[j]));
  }
}

// The q/k chain into a cache of C (NAME: the suffix).
#define QK_CHAIN(NAME, T, C)                                                                    \
  extern "C" __global__ void __launch_bounds__(DEC_THREADS) qk_norm_rope_cache_##NAME(          \
      const T* qkv, const T* qw, const T* kw, const T* cos, const T* sin, T* qo, C* kc, C* vc,  \
      int h, int kv, int d, float eps, int norm, size_t row_stride, size_t head_stride,         \
      size_t col) {                                                                             \
    qk_norm_rope_cache<T, C>(qkv, qw, kw, cos, sin, qo, kc, vc, h, kv, d, eps, norm,            \
                             DenseSlot{row_stride, head_stride, col, d});                       \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(DEC_THREADS) qk_norm_rope_paged_##NAME(          \
      const T* qkv, const T* qw, const T* kw, const T* cos, const T* sin, T* qo, C* kc, C* vc,  \
      int h, int kv, int d, float eps, int norm, const unsigned int* rows, size_t rows_stride,  \
      size_t n_rows) {                                                                          \
    qk_norm_rope_cache<T, C>(qkv, qw, kw, cos, sin, qo, kc, vc, h, kv, d, eps, norm,            \
                             PagedSlot{rows, rows_stride, n_rows, d});                          \
  }

#define ADD_RMS_NORM(NAME, T)                                                                   \
  extern "C" __global__ void __launch_bounds__(ROW_THREADS)                                     \
      add_rms_norm_##NAME(const T* x, const T* a, const T* w, T* hs, T* y, int n, float eps) {  \
    add_rms_norm<T>(x, a, w, hs, y, n, eps);                                                    \
  }

QK_CHAIN(f32, float, float)
QK_CHAIN(bf16, __nv_bfloat16, __nv_bfloat16)
QK_CHAIN(bf16_fp8, __nv_bfloat16, uint8_t)
ADD_RMS_NORM(f32, float)
ADD_RMS_NORM(bf16, __nv_bfloat16)

// ---- whole rows into the pool (`pool_store_*`)

template <typename W>
__device__ void pool_store(const W* src, W* pool, const unsigned int* rows, size_t rows_stride,
                           size_t n, size_t words, size_t n_pool) {
  const size_t total = n * words;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / words, w = i - r * words;
    const size_t to = rows[r * rows_stride];
    if (to >= n_pool) kernel_trap();
    pool[to * words + w] = src[i];
  }
}

#define POOL_STORE(NAME, W)                                                                    \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                  \
      pool_store_##NAME(const W* src, W* pool, const unsigned int* rows, size_t rows_stride,  \
                        size_t n, size_t words, size_t n_pool) {                              \
    pool_store<W>(src, pool, rows, rows_stride, n, words, n_pool);                            \
  }

POOL_STORE(w4, unsigned int)
POOL_STORE(w16, uint4)
