// Sampling a token per row from the full distribution softmax(z / T) (no top-k / top-p), with
// the CPU sampler's arithmetic (src/rollout/sample.rs, `sample_token`): z/T and the max in f32,
// weights exp((z/T − max) as f64), the first index whose running f64 sum exceeds u·Σ, where u
// is the row's uniform draw, made on the host from the sample's own seeded RNG. Output (rows, 2)
// f32: the token (exact in f32 below 2^24) and its log-probability (z/T − logsumexp) as the CPU
// computes it.
//
// One block of SAMPLE_THREADS threads per row. The row is cut into groups of SAMPLE_GROUP (256)
// consecutive columns, SAMPLE_LANE (8) consecutive ones a lane, and each warp owns a consecutive
// segment of groups. A lane adds its columns' weights in order; the warp scans the lanes' sums
// (inclusive, over the lanes in order), and the last lane's is the group's sum; the warp adds its
// groups' sums in order (lane 0), keeping each in shared memory. Thread 0 adds the segments in
// order and finds the segment the draw falls in; that warp's lane 0 finds the group with the
// running sum that made the segment's total, so the crossing is inside it; the group's scan,
// the one that made its sum, gives the lane; the lane walks its columns from the scan's sum
// before it. Σ is grouped here and runs straight through on the CPU, so the two can round
// differently in the last bits: the same keys give the same tokens wherever the draw is not
// within rounding of a boundary (kernels/check/ops_check.cu counts those). Where rounding
// leaves the draw past a lane's last column, that column is the token.
//
// The version before this one gave each of 256 threads a contiguous chunk to sum alone, then
// one thread walked the chunk the draw fell in: 0.55 ms a step for 64 rows of Qwen3's 151,936 on
// the H100 (the 2026-11-23 profile), a tenth of a decode step. Here every thread of a block sums
// as many weights, and the walk is 8 of them.
#include "mma.cuh"

// The index of the lowest set bit of a nonzero mask.
__device__ __forceinline__ int lowest_lane(uint32_t mask) {
#ifdef ACPO_EMU
  return __builtin_ctz(mask);
#else
  return __ffs(mask) - 1;
#endif
}

// Column j's weight exp(z/T − m), 0 past the row.
template <typename T>
__device__ __forceinline__ double weight(const T* zr, int j, int v, float t, float m) {
  return j < v ? exp((double)__fsub_rn(__fdiv_rn(to_f(zr[j]), t), m)) : 0.0;
}

// Group g, scanned: lane l returns the sum of lanes 0..=l's sums (each its SAMPLE_LANE columns
// in order), added in the same order wherever it is called.
template <typename T>
__device__ __forceinline__ double group_scan(const T* zr, int g, int v, float t, float m) {
  const int lane = threadIdx.x & 31;
  const int j0 = g * SAMPLE_GROUP + lane * SAMPLE_LANE;
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < SAMPLE_LANE; ++k) s += weight(zr, j0 + k, v, t, m);
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double before = __shfl_sync(0xffffffffu, s, lane >= o ? lane - o : 0);
    if (lane >= o) s = before + s;
  }
  return s;
}

template <typename T>
__device__ void sample_full(const T* logits, const double* u, float* out, int v, float t) {
  ACPO_DYNAMIC_SMEM(smem);  // sample_smem(v) bytes: each group's sum
  double* group_sum = reinterpret_cast<double*>(smem);
  __shared__ double seg_sum[SAMPLE_THREADS / 32];
  __shared__ int owner;
  __shared__ double prefix, target, total;
  const size_t row = blockIdx.x;
  const T* zr = logits + row * v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0 && dynamic_smem_bytes() < (unsigned)sample_smem(v)) kernel_trap();
  float m = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, __fdiv_rn(to_f(zr[j]), t));
  m = block_max(m);
  // each warp's segment of groups, their sums in order
  const int groups = (v + SAMPLE_GROUP - 1) / SAMPLE_GROUP;
  const int per = (groups + warps - 1) / warps;
  const int g0 = min(groups, warp * per), g1 = min(groups, g0 + per);
  double seg = 0.0;
  for (int g = g0; g < g1; ++g) {
    const double gs = __shfl_sync(0xffffffffu, group_scan(zr, g, v, t, m), 31);
    if (lane == 0) {
      group_sum[g] = gs;
      seg += gs;
    }
  }
  if (lane == 0) seg_sum[warp] = seg;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int k = 0; k < warps; ++k) sum += seg_sum[k];
    total = sum;
    target = u[row] * sum;
    double acc = 0.0;
    owner = -1;
    for (int k = 0; k < warps; ++k) {
      if (acc + seg_sum[k] > target) {
        owner = k;
        break;
      }
      acc += seg_sum[k];
    }
    prefix = acc;
  }
  __syncthreads();
  const double lse = (double)m + log(total);
  int tok = v - 1;  // rounding left the draw past the end: the last token
  if (owner >= 0) {
    if (warp != owner) return;
    // the group, in the running sum that made the segment's total: the crossing is inside
    // the segment, so inside one of its groups
    int found = g1 - 1;
    double part = 0.0;
    if (lane == 0) {
      for (int g = g0; g < g1; ++g) {
        if (prefix + (part + group_sum[g]) > target) {
          found = g;
          break;
        }
        part += group_sum[g];
      }
    }
    found = __shfl_sync(0xffffffffu, found, 0);
    part = __shfl_sync(0xffffffffu, part, 0);
    // the lane, in the scan that made the group's sum (lane 31 crosses if none before it
    // does), then its column, from the scan's sum before it
    const double s = group_scan(zr, found, v, t, m);
    const double before = __shfl_sync(0xffffffffu, s, lane > 0 ? lane - 1 : 0);
    const uint32_t hit = warp_ballot(prefix + (part + s) > target);
    const int at = hit ? lowest_lane(hit) : 31;
    if (lane == at) {
      const int j0 = found * SAMPLE_GROUP + lane * SAMPLE_LANE;
      double run = lane > 0 ? before : 0.0;
      tok = min(v, j0 + SAMPLE_LANE) - 1;
      for (int k = 0; k < SAMPLE_LANE && j0 + k < v; ++k) {
        run += weight(zr, j0 + k, v, t, m);
        if (prefix + (part + run) > target) {
          tok = j0 + k;
          break;
        }
      }
      out[row * 2] = (float)tok;
      out[row * 2 + 1] = (float)((double)__fdiv_rn(to_f(zr[tok]), t) - lse);
    }
    return;
  }
  if (threadIdx.x == 0) {
    out[row * 2] = (float)tok;
    out[row * 2 + 1] = (float)((double)__fdiv_rn(to_f(zr[tok]), t) - lse);
  }
}

// The logits as the lm_head leaves them (bf16 on a GPU: no f32 copy of them first; bf16 to f32 is
// exact, so the weights are those of the f32 logits) or in f32.
#define SAMPLE_FULL(NAME, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                \
      sample_full_##NAME(const T* logits, const double* u, float* out, int v, float t) {      \
    sample_full<T>(logits, u, out, v, t);                                                     \
  }

SAMPLE_FULL(f32, float)
SAMPLE_FULL(bf16, __nv_bfloat16)
