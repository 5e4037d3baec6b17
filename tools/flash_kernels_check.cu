// The flash kernels of kernels/flash_attn.cu alone, on a GPU, without the Rust build: each
// forward path (the row kernel, the tensor-core forward, the split-K decode) against a float64
// reference on random bf16 inputs (left padding, rows that see no key, a cache buffer with room
// beyond its keys), then each timed with CUDA events at the decode and prefill shapes of
// Qwen3-1.7B, the row kernel beside the new ones in the same run (kernels/NOTES.md).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels tools/flash_kernels_check.cu -o /tmp/fa && /tmp/fa
//
// The reference adds a hidden key's -1e9 in f32, as the kernels and their CPU twin do: a row
// that sees no key then averages V uniformly (fused/flash.rs).
#include "flash_attn.cu"
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
static unsigned long long st = 88172645463325252ull;
static float rnd() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return ((st >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }
typedef __nv_bfloat16 bf;
struct Case { int B, H, KV, T, past, D, pad, cap; };
static int failures = 0;
static float bfr(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

double run_case(Case c, bool timing, int mode /*0 auto,1 scalar*/) {
  int S = c.past + c.T, cap = c.cap < S ? S : c.cap;
  size_t nq = (size_t)c.B * c.H * c.T * c.D, nk = (size_t)c.B * c.KV * cap * c.D;
  std::vector<float> q(nq), k(nk), v(nk);
  for (auto& x : q) x = bfr(rnd()); for (auto& x : k) x = bfr(rnd()); for (auto& x : v) x = bfr(rnd());
  std::vector<uint8_t> valid((size_t)c.B * S);
  for (int b = 0; b < c.B; ++b) for (int j = 0; j < S; ++j) valid[b * S + j] = (b == 0 && j < c.pad) ? 0 : 1;
  std::vector<bf> qh(nq), kh(nk), vh(nk);
  for (size_t i = 0; i < nq; ++i) qh[i] = __float2bfloat16_rn(q[i]);
  for (size_t i = 0; i < nk; ++i) { kh[i] = __float2bfloat16_rn(k[i]); vh[i] = __float2bfloat16_rn(v[i]); }
  bf *dq, *dk, *dv, *dout; uint8_t* dvalid; int* dfirst; float *dstats, *dpart;
  CK(cudaMalloc(&dq, nq * 2)); CK(cudaMalloc(&dk, nk * 2)); CK(cudaMalloc(&dv, nk * 2)); CK(cudaMalloc(&dout, nq * 2));
  CK(cudaMalloc(&dvalid, valid.size())); CK(cudaMalloc(&dfirst, c.B * 4)); CK(cudaMalloc(&dstats, nq / c.D * 8));
  int nsplit = (S + FD_SPLIT - 1) / FD_SPLIT;
  CK(cudaMalloc(&dpart, (size_t)c.B * c.H * nsplit * (c.D + 2) * 4));
  CK(cudaMemcpy(dq, qh.data(), nq * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dk, kh.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, vh.data(), nk * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dvalid, valid.data(), valid.size(), cudaMemcpyHostToDevice));
  float scale = 1.0f / sqrtf((float)c.D);
  auto launch = [&]() {
    flash_first_valid<<<c.B, 256>>>(dvalid, S, dfirst);
    if (mode == 1) { flash_fwd_bf16<<<dim3((c.T + 3) / 4, c.H, c.B), 128>>>(dq, dk, dv, dvalid, dfirst, dout, dstats, c.H, c.KV, c.T, S, cap, c.D, c.past, scale); return "scalar"; }
    if (c.T == 1) {
      flash_decode_split_bf16<<<dim3(nsplit, c.KV, c.B), 128>>>(dq, dk, dv, dvalid, dfirst, dpart, nsplit, c.H, c.KV, c.T, S, cap, c.D, c.past, scale);
      flash_decode_combine_bf16<<<dim3(c.H, c.B), 128>>>(dpart, dout, dstats, nsplit, c.H, c.D);
      return "decode";
    }
    if (c.D == 128) { flash_fwd_mma_d128_bf16<<<dim3((c.T + 63) / 64, c.H, c.B), 128>>>(dq, dk, dv, dvalid, dfirst, dout, dstats, c.H, c.KV, c.T, S, cap, c.D, c.past, scale); return "mma128"; }
    flash_fwd_mma_d64_bf16<<<dim3((c.T + 63) / 64, c.H, c.B), 128>>>(dq, dk, dv, dvalid, dfirst, dout, dstats, c.H, c.KV, c.T, S, cap, c.D, c.past, scale); return "mma64";
  };
  const char* what = launch();
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  std::vector<bf> oh(nq); std::vector<float> stats(nq / c.D * 2);
  CK(cudaMemcpy(oh.data(), dout, nq * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(stats.data(), dstats, stats.size() * 4, cudaMemcpyDeviceToHost));
  double err = 0, norm = 0, serr = 0;
  if (!timing) {
    int G = c.H / c.KV;
    for (int b = 0; b < c.B; ++b) for (int h = 0; h < c.H; ++h) for (int i = 0; i < c.T; ++i) {
      std::vector<double> sc(S); double mx = -1e300;
      const float* qr = &q[(((size_t)b * c.H + h) * c.T + i) * c.D];
      for (int j = 0; j < S; ++j) {
        const float* kr = &k[(((size_t)b * c.KV + h / G) * cap + j) * c.D];
        double d = 0; for (int x = 0; x < c.D; ++x) d += (double)qr[x] * kr[x];
        sc[j] = (float)(d * scale) + ((valid[b * S + j] && j <= c.past + i) ? 0.0f : -1e9f);
        mx = fmax(mx, sc[j]);
      }
      double l = 0; for (int j = 0; j < S; ++j) { sc[j] = exp(sc[j] - mx); l += sc[j]; }
      size_t row = ((size_t)b * c.H + h) * c.T + i;
      for (int x = 0; x < c.D; ++x) {
        double o = 0; for (int j = 0; j < S; ++j) o += sc[j] * v[(((size_t)b * c.KV + h / G) * cap + j) * c.D + x];
        o /= l; double got = __bfloat162float(oh[row * c.D + x]);
        err += (got - o) * (got - o); norm += o * o;
      }
      serr = fmax(serr, fabs(stats[2 * row] - mx) / fmax(1.0, fabs(mx)) + fabs(stats[2 * row + 1] * l - 1.0));
    }
    const bool ok = sqrt(err / norm) < 1e-2 && serr < 1e-3;
    printf("%-7s B%d H%d KV%d T%d past%d D%d pad%d cap%d: rel err %.2e, stats err %.2e %s\n", what, c.B, c.H, c.KV, c.T, c.past, c.D, c.pad, cap, sqrt(err / norm), serr, ok ? "ok" : "FAILED");
    if (!ok) failures++;
  } else {
    cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
    launch(); cudaEventRecord(a); int n = 10; for (int r = 0; r < n; ++r) launch(); cudaEventRecord(z); CK(cudaEventSynchronize(z));
    float ms; cudaEventElapsedTime(&ms, a, z); ms /= n;
    double bytes = (double)c.B * c.KV * S * c.D * 2 * 2 + nq * 4;
    double flops = 4.0 * c.B * c.H * c.D * ((c.T == 1) ? (double)S : (double)c.T * c.past + (double)c.T * c.T / 2);
    printf("%-7s B%d H%d KV%d T%d past%d D%d: %.3f ms, %.0f GB/s (K/V once), %.1f TFLOP/s\n", what, c.B, c.H, c.KV, c.T, c.past, c.D, ms, bytes / ms / 1e6, flops / ms / 1e9);
  }
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dvalid); cudaFree(dfirst); cudaFree(dstats); cudaFree(dpart);
  return 0;
}
int main() {
  Case checks[] = {{2, 4, 2, 100, 30, 128, 50, 0}, {2, 4, 1, 129, 70, 64, 100, 0}, {1, 2, 2, 64, 0, 128, 0, 0}, {3, 14, 2, 1, 1300, 128, 900, 1400},
                   {2, 16, 8, 1, 1024, 128, 0, 0}, {2, 2, 1, 1, 40, 32, 41, 0}, {2, 16, 8, 300, 0, 128, 40, 0}};
  for (auto c : checks) run_case(c, false, 0);
  run_case({2, 16, 8, 300, 0, 128, 40, 0}, false, 1);
  Case times[] = {{64, 16, 8, 1, 1024, 128, 0, 2048}, {64, 16, 8, 1, 2047, 128, 0, 2048}, {1, 16, 8, 1, 8191, 128, 0, 0}, {64, 16, 8, 1024, 0, 128, 0, 0}, {2, 16, 8, 2048, 0, 128, 0, 0}, {2, 16, 8, 9220, 0, 128, 0, 0}};
  for (auto c : times) run_case(c, true, 0);
  run_case({64, 16, 8, 1, 1024, 128, 0, 2048}, true, 1);
  run_case({2, 16, 8, 2048, 0, 128, 0, 0}, true, 1);
  printf("%s\n", failures ? "FAILED" : "all checks ok");
  return failures ? 1 : 0;
}
