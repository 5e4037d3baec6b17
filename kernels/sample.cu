// Sampling a token per row from the full distribution softmax(z / T) (no top-k / top-p), with
// the CPU sampler's arithmetic (src/rollout/mod.rs, `sample_token`): z/T and the max in f32,
// weights exp((z/T − max) as f64), the first index whose running f64 sum exceeds u·Σ, where u
// is the row's uniform draw, made on the host from the sample's own seeded RNG. One block of
// ROW_THREADS threads per row; thread k sums its contiguous chunk in order, thread 0 finds the
// chunk the draw falls in, and that chunk's thread walks it. Sums are grouped by chunk here and run straight through on
// the CPU, so the two can round differently in the last bits: the same keys give the same
// tokens wherever the draw is not within rounding of a boundary. Output (rows, 2) f32: the
// token (exact in f32 below 2^24) and its log-probability (z/T − logsumexp) as the CPU computes.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    sample_full_f32(const float* logits, const double* u, float* out, int v, float t) {
  __shared__ double chunk_sum[ROW_THREADS];
  __shared__ int owner;
  __shared__ double prefix, target, total;
  const size_t row = blockIdx.x;
  const float* zr = logits + row * v;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, __fdiv_rn(zr[j], t));
  m = block_max(m);
  const int chunk = (v + blockDim.x - 1) / blockDim.x;
  const int lo = min(v, (int)threadIdx.x * chunk), hi = min(v, lo + chunk);
  double s = 0.0;
  for (int j = lo; j < hi; ++j) s += exp((double)__fsub_rn(__fdiv_rn(zr[j], t), m));
  chunk_sum[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int k = 0; k < (int)blockDim.x; ++k) sum += chunk_sum[k];
    total = sum;
    target = u[row] * sum;
    double acc = 0.0;
    owner = -1;
    for (int k = 0; k < (int)blockDim.x; ++k) {
      if (acc + chunk_sum[k] > target) {
        owner = k;
        break;
      }
      acc += chunk_sum[k];
    }
    prefix = acc;
  }
  __syncthreads();
  const double lse = (double)m + log(total);
  if (owner < 0 && threadIdx.x == 0) {  // rounding left the draw past the end: the last token
    out[row * 2] = (float)(v - 1);
    out[row * 2 + 1] = (float)((double)__fdiv_rn(zr[v - 1], t) - lse);
  }
  if ((int)threadIdx.x == owner) {
    // the same running sum as the chunk's total, so the crossing is inside this chunk
    double p = 0.0;
    int tok = hi - 1;
    for (int j = lo; j < hi; ++j) {
      p += exp((double)__fsub_rn(__fdiv_rn(zr[j], t), m));
      if (prefix + p > target) {
        tok = j;
        break;
      }
    }
    out[row * 2] = (float)tok;
    out[row * 2 + 1] = (float)((double)__fdiv_rn(zr[tok], t) - lse);
  }
}
