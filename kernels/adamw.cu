// AdamW for a whole model in three launches and no host round trip until the step is done
// (issue #44): every parameter tensor of one dtype in one launch, over a device table of
// pointers and lengths, the fp32 moments and the parameter updated in place.
//
//   1. adamw_sq_partials: the squared gradient norm of each chunk of ADAMW_CHUNK elements of
//      each tensor, one block per chunk, summed in float64 in a fixed order.
//   2. adamw_sq_total: one block sums the chunk partials in chunk order into out[0] = ‖g‖²
//      and clears out[1], the non-finite flag.
//   3. adamw_update_{f32,bf16}: every block reads ‖g‖² from out[0] and forms the clip scale as
//      the host does (`optim::AdamW::step`: max_norm / (‖g‖ + 1e-6), at most 1, in float64,
//      then rounded to f32); a non-finite norm skips the step (nothing is written). Each element
//      is then the CPU twin's arithmetic (`fused_update` in src/optim.rs), operation for
//      operation: candle's `x * c` is `x·c + 0` and `x / c` is `x·(1/c) + 0` in f32, so products
//      go through __fmul_rn and sums through __fadd_rn, which nvcc never contracts into an FMA
//      (one rounding where the CPU rounds twice); `/` and sqrtf are IEEE round-to-nearest under
//      nvcc's defaults (-prec-div=true, -prec-sqrt=true; build.rs passes no fast-math flag), and
//      a − b is computed as a + (−b), which is exact. The results are the CPU's bits where the
//      inputs agree. A parameter left non-finite (NaN, ±∞) sets out[1] = 1: every writer stores
//      the same value, so the flag does not depend on the order blocks run in.
//
// The host reads out[0..2] once, after the update: one device-to-host copy per step, where the
// per-tensor path read two scalars per tensor (2 × 311 syncs for Qwen3-1.7B). Nothing is
// atomic and every sum has a fixed order, so a step gives the same bits on every run.
//
// The table (u64 words): for each of the n tensors, 5 words (p, g, m, v addresses, and its
// length; g = 0 for a parameter without a gradient, a zero gradient), then n + 1 words `first`:
// tensor i's chunks are blocks first[i] .. first[i+1].
#include "common.cuh"  // ADAMW_CHUNK, ADAMW_THREADS (launch.cuh)

struct AdamWConsts {
  float b1, one_minus_b1, b2, one_minus_b2, decay, inv_sqrt_bc2, eps, step;
};

// The tensor whose chunks include block `b`: the last i with first[i] <= b (tensors without
// elements own no chunk and are skipped), and where its chunk starts.
__device__ __forceinline__ void adamw_chunk(const uint64_t* table, unsigned n, unsigned b,
                                            unsigned* tensor, size_t* start) {
  const uint64_t* first = table + 5 * (size_t)n;
  unsigned lo = 0, hi = n;  // first[lo] <= b < first[hi]
  while (hi - lo > 1) {
    const unsigned mid = (lo + hi) / 2;
    if (first[mid] <= b) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  *tensor = lo;
  *start = (size_t)(b - first[lo]) * ADAMW_CHUNK;
}

// Sum over the block of a float64 per thread, in a fixed tree order (blockDim.x a power of two,
// at most ADAMW_THREADS); thread 0 gets the result.
__device__ __forceinline__ double adamw_block_sum(double v) {
  __shared__ double part[ADAMW_THREADS];
  part[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  return part[0];
}

extern "C" __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_sq_partials(const uint64_t* table, unsigned n, double* partials) {
  unsigned i;
  size_t start;
  adamw_chunk(table, n, blockIdx.x, &i, &start);
  const float* g = (const float*)table[5 * (size_t)i + 1];
  const size_t len = table[5 * (size_t)i + 4];
  const size_t end = start + ADAMW_CHUNK < len ? start + ADAMW_CHUNK : len;
  double acc = 0.0;
  if (g) {
    for (size_t j = start + threadIdx.x; j < end; j += blockDim.x) {
      const double x = g[j];
      acc += x * x;
    }
  }
  const double total = adamw_block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

extern "C" __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_sq_total(const double* partials, unsigned chunks, double* out) {
  double acc = 0.0;
  for (unsigned c = threadIdx.x; c < chunks; c += blockDim.x) acc += partials[c];
  const double total = adamw_block_sum(acc);
  if (threadIdx.x == 0) {
    out[0] = total;
    out[1] = 0.0;
  }
}

template <typename T>
__device__ void adamw_update(const uint64_t* table, unsigned n, double* out, double max_norm,
                             AdamWConsts c) {
  __shared__ float scale_s;
  __shared__ int skip_s;
  if (threadIdx.x == 0) {
    const double norm = sqrt(out[0]);
    const double coef = max_norm / (norm + 1e-6);
    skip_s = !(norm <= 1.7976931348623157e308);  // NaN or +inf: the step is skipped
    scale_s = (float)(coef < 1.0 ? coef : 1.0);
  }
  __syncthreads();
  if (skip_s) return;
  const float scale = scale_s;
  unsigned i;
  size_t start;
  adamw_chunk(table, n, blockIdx.x, &i, &start);
  const uint64_t* e = table + 5 * (size_t)i;
  T* p = (T*)e[0];
  const float* g = (const float*)e[1];
  float* m = (float*)e[2];
  float* v = (float*)e[3];
  const size_t end = start + ADAMW_CHUNK < e[4] ? start + ADAMW_CHUNK : e[4];
  int bad = 0;
  for (size_t j = start + threadIdx.x; j < end; j += blockDim.x) {
    // A missing gradient is a zero one: 0·scale + 0 = +0, the twin's `elem(0.0, …)`.
    const float gs = g ? __fadd_rn(__fmul_rn(g[j], scale), 0.0f) : 0.0f;
    const float m1 = __fadd_rn(__fadd_rn(__fmul_rn(m[j], c.b1), 0.0f),
                               __fadd_rn(__fmul_rn(gs, c.one_minus_b1), 0.0f));
    const float v1 = __fadd_rn(__fadd_rn(__fmul_rn(v[j], c.b2), 0.0f),
                               __fadd_rn(__fmul_rn(__fmul_rn(gs, gs), c.one_minus_b2), 0.0f));
    const float denom =
        __fadd_rn(__fmul_rn(__fadd_rn(__fmul_rn(sqrtf(v1), c.inv_sqrt_bc2), 0.0f), 1.0f), c.eps);
    const float decayed = __fadd_rn(__fmul_rn(to_f(p[j]), c.decay), 0.0f);
    const float delta = __fadd_rn(__fmul_rn(m1 / denom, c.step), 0.0f);
    const T stored = from_f<T>(__fadd_rn(decayed, -delta));
    p[j] = stored;
    m[j] = m1;
    v[j] = v1;
    bad |= !(fabsf(to_f(stored)) <= 3.402823466e38f);
  }
  if (bad) out[1] = 1.0;
}

#define ADAMW_UPDATE(NAME, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(ADAMW_THREADS)                                  \
      adamw_update_##NAME(const uint64_t* table, unsigned n, double* out, double max_norm,     \
                          AdamWConsts c) {                                                     \
    adamw_update<T>(table, n, out, max_norm, c);                                               \
  }

ADAMW_UPDATE(f32, float)
ADAMW_UPDATE(bf16, __nv_bfloat16)
