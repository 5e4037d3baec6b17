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

// Column j's z / T, as the CPU computes it.
template <typename T>
__device__ __forceinline__ float z_of(const T* zr, int j, float t) {
  return __fdiv_rn(to_f(zr[j]), t);
}

// Every column: the full distribution's draw.
struct All {
  __device__ __forceinline__ bool operator()(int, float) const { return true; }
};

// Column j's weight exp(z/T − m) if `in` keeps it, 0 past the row or where it does not.
template <typename T, typename In>
__device__ __forceinline__ double weight(const T* zr, int j, int v, float t, float m, const In& in) {
  if (j >= v) return 0.0;
  const float z = z_of(zr, j, t);
  return in(j, z) ? exp((double)__fsub_rn(z, m)) : 0.0;
}

// Group g, scanned: lane l returns the sum of lanes 0..=l's sums (each its SAMPLE_LANE columns
// in order), added in the same order wherever it is called.
template <typename T, typename In>
__device__ __forceinline__ double group_scan(const T* zr, int g, int v, float t, float m,
                                             const In& in) {
  const int lane = threadIdx.x & 31;
  const int j0 = g * SAMPLE_GROUP + lane * SAMPLE_LANE;
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < SAMPLE_LANE; ++k) s += weight(zr, j0 + k, v, t, m, in);
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double before = __shfl_sync(0xffffffffu, s, lane >= o ? lane - o : 0);
    if (lane >= o) s = before + s;
  }
  return s;
}

// The draw among the columns `in` keeps, walking them in index order: the first whose running
// sum of weights exceeds u·Σ. Every thread gets the column, or −1 where rounding left the draw
// past the last lane; `*sum` gets Σ (each thread).
template <typename T, typename In>
__device__ int draw(const T* zr, double u, int v, float t, float m, const In& in, double* sum) {
  ACPO_DYNAMIC_SMEM(smem);  // sample_smem(v) bytes: each group's sum
  double* group_sum = reinterpret_cast<double*>(smem);
  __shared__ double seg_sum[SAMPLE_THREADS / 32];
  __shared__ int owner, drawn;
  __shared__ double prefix, target, total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  // each warp's segment of groups, their sums in order
  const int groups = (v + SAMPLE_GROUP - 1) / SAMPLE_GROUP;
  const int per = (groups + warps - 1) / warps;
  const int g0 = min(groups, warp * per), g1 = min(groups, g0 + per);
  double seg = 0.0;
  for (int g = g0; g < g1; ++g) {
    const double gs = __shfl_sync(0xffffffffu, group_scan(zr, g, v, t, m, in), 31);
    if (lane == 0) {
      group_sum[g] = gs;
      seg += gs;
    }
  }
  if (lane == 0) seg_sum[warp] = seg;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int k = 0; k < warps; ++k) s += seg_sum[k];
    total = s;
    target = u * s;
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
    drawn = -1;  // rounding left the draw past the end
  }
  __syncthreads();
  if (owner >= 0 && warp == owner) {
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
    const double s = group_scan(zr, found, v, t, m, in);
    const double before = __shfl_sync(0xffffffffu, s, lane > 0 ? lane - 1 : 0);
    const uint32_t hit = warp_ballot(prefix + (part + s) > target);
    const int at = hit ? lowest_lane(hit) : 31;
    if (lane == at) {
      const int j0 = found * SAMPLE_GROUP + lane * SAMPLE_LANE;
      double run = lane > 0 ? before : 0.0;
      int tok = min(v, j0 + SAMPLE_LANE) - 1;
      for (int k = 0; k < SAMPLE_LANE && j0 + k < v; ++k) {
        run += weight(zr, j0 + k, v, t, m, in);
        if (prefix + (part + run) > target) {
          tok = j0 + k;
          break;
        }
      }
      drawn = tok;
    }
  }
  __syncthreads();
  const int tok = drawn;
  *sum = total;
  __syncthreads();  // drawn and total are the next call's
  return tok;
}

// Row `row`'s token and its log-probability z/T − lse.
template <typename T>
__device__ __forceinline__ void put(float* out, size_t row, const T* zr, int tok, float t,
                                   double lse) {
  out[row * 2] = (float)tok;
  out[row * 2 + 1] = (float)((double)z_of(zr, tok, t) - lse);
}

template <typename T>
__device__ void sample_full(const T* logits, const double* u, float* out, int v, float t) {
  const size_t row = blockIdx.x;
  const T* zr = logits + row * v;
  if (threadIdx.x == 0 && dynamic_smem_bytes() < (unsigned)sample_smem(v)) kernel_trap();
  float m = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, z_of(zr, j, t));
  m = block_max(m);
  double total;
  int tok = draw(zr, u[row], v, t, m, All{}, &total);
  if (tok < 0) tok = v - 1;  // rounding left the draw past the end: the last token
  if (threadIdx.x == 0) put(out, row, zr, tok, t, (double)m + log(total));
}

// ---- truncated sampling: top-k, top-p and greedy (src/rollout/sample.rs `sample_token`)
//
// The CPU sorts a row by z/T (larger first, −0 with +0, then lower index first), keeps the
// first k columns (top-k), then of those the shortest prefix whose weights add to at least
// top_p of theirs (top-p), and draws among the kept columns in index order as the full draw
// does. Here no row is sorted: each cut of that order is found by a radix select on the
// columns' order keys, 4 bits a pass from the top, counting columns for top-k and adding their
// weights for top-p, then a scan of the columns tied at the cut's key in index order. Every
// sum is in a fixed order (each thread's columns in order, then the block's threads in order),
// so a row's draw is the same on every run; the sums are grouped differently from the CPU's
// sorted ones, so a cut can differ from it only where a prefix's sum is within rounding of
// top_p's share (kernels/check/ops_check.cu counts those). Greedy is top-k 1 at T = 1.

// f32 bits (the emulator has no __float_as_uint).
__device__ __forceinline__ uint32_t bits_of(float f) {
#ifdef ACPO_EMU
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#else
  return __float_as_uint(f);
#endif
}

// A column's key in the CPU's order (src/rollout/sample.rs `order_key`): unsigned, larger
// first; −0 is +0.
__device__ __forceinline__ uint32_t order_key(float z) {
  uint32_t b = bits_of(z);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// A prefix of the order: every column with a larger key than `key`, and those with `key` up to
// index `last`. {0, EVERY} keeps every column.
#define EVERY 0x7fffffff
struct Cut {
  uint32_t key;
  int last;
  __device__ __forceinline__ bool keeps(uint32_t k, int j) const {
    return k > key || (k == key && j <= last);
  }
};

// The columns both cuts keep.
struct Kept {
  Cut a, b;
  __device__ __forceinline__ bool operator()(int j, float z) const {
    const uint32_t k = order_key(z);
    return a.keeps(k, j) && b.keeps(k, j);
  }
};

// What a column adds to a cut's sum: 1 (top-k counts columns) or its weight (top-p).
template <typename V>
__device__ __forceinline__ V value_of(float z, float m);
template <>
__device__ __forceinline__ int value_of<int>(float, float) {
  return 1;
}
template <>
__device__ __forceinline__ double value_of<double>(float z, float m) {
  return exp((double)__fsub_rn(z, m));
}

// Each of x's N values summed over the block in a fixed order (the warp's butterfly, then the
// warps in order); every thread gets the sums.
template <typename V, int N>
__device__ void block_add(V (&x)[N]) {
  __shared__ V part[SAMPLE_THREADS / 32][N];
  __shared__ V sum[N];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int q = 0; q < N; ++q) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x[q] += __shfl_xor_sync(0xffffffffu, x[q], o);
    if (lane == 0) part[warp][q] = x[q];
  }
  __syncthreads();
  if (threadIdx.x < N) {
    V s = 0;
    for (int w = 0; w < warps; ++w) s += part[w][threadIdx.x];
    sum[threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < N; ++q) x[q] = sum[q];
  __syncthreads();  // part and sum are the next call's
}

// The largest of each thread's x over the block.
__device__ int block_max_int(int x) {
  __shared__ int part[SAMPLE_THREADS / 32];
  __shared__ int most;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
  if (lane == 0) part[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = part[0];
    for (int w = 1; w < warps; ++w) s = max(s, part[w]);
    most = s;
  }
  __syncthreads();
  x = most;
  __syncthreads();
  return x;
}

// The shortest prefix of the order, among the columns `in` keeps, whose values (V: counts or
// weights) add to at least `need`. Where rounding leaves every digit short, the cut keeps all
// the columns of the digits chosen so far; where it leaves the tied columns short, all of them.
template <typename V, typename T, typename In>
__device__ Cut select(const T* zr, int v, float t, float m, const In& in, V need) {
  __shared__ int pick_s;
  __shared__ V above_s;
  __shared__ V tied[SAMPLE_THREADS];
  __shared__ int owner_s, last_s;
  __shared__ V base_s;
  uint32_t key = 0;  // the digits chosen so far, in place
  V above = 0;       // the values of the kept columns with a larger key than any so chosen
  for (int s = 28; s >= 0; s -= 4) {
    const uint32_t high = s == 28 ? 0u : ~0u << (s + 4);
    V acc[16];
#pragma unroll
    for (int q = 0; q < 16; ++q) acc[q] = 0;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
      const float z = z_of(zr, j, t);
      const uint32_t k = order_key(z);
      if ((k & high) != key || !in(j, z)) continue;
      const int d = (k >> s) & 15;
      const V x = value_of<V>(z, m);
#pragma unroll
      for (int q = 0; q < 16; ++q) acc[q] += d == q ? x : V(0);
    }
    block_add(acc);
    if (threadIdx.x == 0) {
      int pick = -1;
      V run = above;
      for (int d = 15; d >= 0; --d) {
        if (run + acc[d] >= need) {
          pick = d;
          break;
        }
        run += acc[d];
      }
      pick_s = pick;
      above_s = run;
    }
    __syncthreads();
    const int pick = pick_s;
    above = above_s;
    __syncthreads();
    if (pick < 0) return Cut{key, EVERY};  // block-uniform
    key |= (uint32_t)pick << s;
  }
  // the columns tied at `key`, in index order: each thread a consecutive chunk
  const int chunk = (v + (int)blockDim.x - 1) / (int)blockDim.x;
  const int j0 = min(v, (int)threadIdx.x * chunk), j1 = min(v, j0 + chunk);
  V mine = 0;
  for (int j = j0; j < j1; ++j) {
    const float z = z_of(zr, j, t);
    if (order_key(z) == key && in(j, z)) mine += value_of<V>(z, m);
  }
  tied[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    V run = above;
    owner_s = -1;
    last_s = EVERY;  // rounding left the ties short: keep them all
    for (int th = 0; th < (int)blockDim.x; ++th) {
      if (run + tied[th] >= need) {
        owner_s = th;
        base_s = run;
        break;
      }
      run += tied[th];
    }
  }
  __syncthreads();
  if ((int)threadIdx.x == owner_s) {
    // the chunk's own sum again, in the order that made tied[th]: it crosses by its end
    V run = 0;
    for (int j = j0; j < j1; ++j) {
      const float z = z_of(zr, j, t);
      if (order_key(z) != key || !in(j, z)) continue;
      run += value_of<V>(z, m);
      if (base_s + run >= need) {
        last_s = j;
        break;
      }
    }
  }
  __syncthreads();
  const Cut cut{key, last_s};
  __syncthreads();  // the shared values are the next call's
  return cut;
}

// Top-k (k in [1, v), else none) and top-p (p < 1, else none) at temperature t; greedy is
// k = 1, t = 1.
template <typename T>
__device__ void sample_trunc(const T* logits, const double* u, float* out, int v, float t,
                             int k, double p) {
  const size_t row = blockIdx.x;
  const T* zr = logits + row * v;
  if (threadIdx.x == 0 && dynamic_smem_bytes() < (unsigned)sample_smem(v)) kernel_trap();
  const Cut none{0u, EVERY};
  float m = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, z_of(zr, j, t));
  m = block_max(m);
  // Σ over the whole row (the log-probability's), then over the top-k columns (top-p's)
  double all[1] = {0.0};
  for (int j = threadIdx.x; j < v; j += blockDim.x) all[0] += value_of<double>(z_of(zr, j, t), m);
  block_add(all);
  const double lse = (double)m + log(all[0]);
  const Cut top_k = k >= 1 && k < v ? select<int>(zr, v, t, m, All{}, k) : none;
  Cut top_p = none;
  if (p < 1.0) {
    const Kept kept{top_k, none};
    double mass[1] = {0.0};
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
      const float z = z_of(zr, j, t);
      if (kept(j, z)) mass[0] += value_of<double>(z, m);
    }
    block_add(mass);
    top_p = select<double>(zr, v, t, m, kept, p * mass[0]);
  }
  const Kept kept{top_k, top_p};
  double sum;
  int tok = draw(zr, u[row], v, t, m, kept, &sum);
  // Rounding can leave the draw past the last kept column, or on a lane's column that is not
  // kept: the nearest kept column before it, else after it (the CPU draws the last kept one).
  if (tok < 0 || !kept(tok, z_of(zr, tok, t))) {
    const int at = tok < 0 ? v - 1 : tok;
    int before = -1, after = -EVERY;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
      if (!kept(j, z_of(zr, j, t))) continue;
      if (j <= at) before = max(before, j);
      else after = max(after, -j);
    }
    before = block_max_int(before);
    after = block_max_int(after);
    tok = before >= 0 ? before : after > -EVERY ? -after : at;  // none kept: only NaN logits
  }
  if (threadIdx.x == 0) put(out, row, zr, tok, t, lse);
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

#define SAMPLE_TRUNC(NAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_trunc_##NAME(           \
      const T* logits, const double* u, float* out, int v, float t, int k, double p) {       \
    sample_trunc<T>(logits, u, out, v, t, k, p);                                              \
  }

SAMPLE_TRUNC(f32, float)
SAMPLE_TRUNC(bf16, __nv_bfloat16)
