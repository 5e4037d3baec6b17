// What the kernel checks (kernels/check/*.cu) share: device memory, launches and random inputs,
// the same source on a GPU (nvcc) and in the CPU emulator (g++ -DACPO_EMU, cuda_emu.hpp).
// Include it after the kernels (it needs their headers for the emulator).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef ACPO_EMU
#define CK(x) (x)
// Emulated device memory: guard pages around every allocation (cuda_emu.hpp), so a kernel that
// reads or writes past a buffer stops with a message naming it.
static void* dalloc(size_t bytes) { return emu::device_alloc(bytes); }
static void dfree(void* p) { emu::device_free(p); }
static void h2d(void* d, const void* h, size_t n) { std::memcpy(d, h, n); }
static void d2h(void* h, const void* d, size_t n) { std::memcpy(h, d, n); }
static void poison(void* d, size_t n) { std::memset(d, 0xFF, n); }  // NaN in f32 and bf16
static void dzero(void* d, size_t n) { std::memset(d, 0, n); }
static void device_sync() {}
// A launch as a GPU's: above the default dynamic shared memory the kernel's limit is raised
// first (the Rust launches do the same, src/fused/flash/cuda.rs).
#define LAUNCH(kernel, grid, block, smem, ...)                                          \
  do {                                                                                  \
    if ((size_t)(smem) > SMEM_DEFAULT_LIMIT)                                            \
      emu::set_max_dynamic_smem((const void*)&kernel, (size_t)(smem));                  \
    emu::launch((const void*)&kernel, #kernel, grid, block, smem, [&] { kernel(__VA_ARGS__); }); \
  } while (0)
// A launch that does not raise the limit (the emulator's own tests plant one).
#define LAUNCH_AS_IS(kernel, grid, block, smem, ...) \
  emu::launch((const void*)&kernel, #kernel, grid, block, smem, [&] { kernel(__VA_ARGS__); })
static const bool on_gpu = false;
#else
#include <cuda_runtime.h>
#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__);       \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)
static void* dalloc(size_t bytes) {
  void* p;
  CK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}
static void dfree(void* p) { cudaFree(p); }
static void h2d(void* d, const void* h, size_t n) { CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static void d2h(void* h, const void* d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
static void poison(void* d, size_t n) { CK(cudaMemset(d, 0xFF, n)); }
static void dzero(void* d, size_t n) { CK(cudaMemset(d, 0, n)); }
static void device_sync() { CK(cudaDeviceSynchronize()); }
#define LAUNCH(kernel, grid, block, smem, ...)                                                 \
  do {                                                                                         \
    if ((smem) > SMEM_DEFAULT_LIMIT)                                                           \
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem))); \
    kernel<<<grid, block, smem>>>(__VA_ARGS__);                                                \
    CK(cudaGetLastError());                                                                    \
  } while (0)
#define LAUNCH_AS_IS(kernel, grid, block, smem, ...) \
  do {                                               \
    kernel<<<grid, block, smem>>>(__VA_ARGS__);      \
    CK(cudaGetLastError());                          \
  } while (0)
static const bool on_gpu = true;
// Median milliseconds of `reps` runs of `f`, timed with CUDA events, after one warm-up.
template <typename F>
static float median_ms(F f, int reps) {
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> ms;
  cudaEvent_t a, z;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&z));
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(z));
    CK(cudaEventSynchronize(z));
    float t;
    CK(cudaEventElapsedTime(&t, a, z));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(z));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
#endif

typedef __nv_bfloat16 bf;

// `--seeds N` from a check's command line: how many emulator schedules to run (at least 1).
static int seeds_arg(int argc, char** argv) {
  int seeds = 1;
  for (int a = 1; a + 1 < argc; ++a)
    if (std::string(argv[a]) == "--seeds") seeds = std::max(1, atoi(argv[a + 1]));
  return seeds;
}

// Run `s` of a check under the emulator's schedule s % `kinds` (0 fair, 1 a warp lagging behind
// the others, 2 and 3 cp.async copies landing late or as soon as issued) with its own thread
// order; nothing on a GPU.
static void use_schedule(int s, int kinds) {
#ifdef ACPO_EMU
  emu::S.rng = 0x9e3779b97f4a7c15ull + 7919ull * s;
  emu::S.schedule = s % kinds;
#else
  (void)s, (void)kinds;
#endif
}
// Up to `r` blocks of the next launches resident at once, interleaving (cuda_emu.hpp: for kernels
// whose blocks wait on one another); 1, every block to its end before the next. Nothing on a GPU,
// where the hardware decides.
static void use_residency(int r) {
#ifdef ACPO_EMU
  emu::S.resident = std::max(1, r);
#else
  (void)r;
#endif
}
static unsigned long long st = 88172645463325252ull;
// Uniform in [-1, 1).
static float rnd() {
  st ^= st << 13;
  st ^= st >> 7;
  st ^= st << 17;
  return ((st >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}
static float bfr(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
static int failures = 0;

// ‖got − ref‖ / ‖ref‖ (∞ when a NaN is in `got`).
static double rel_err(const std::vector<float>& got, const std::vector<double>& ref,
                      size_t stride = 1, size_t take = 1) {
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[(i / take) * stride + i % take];
    e += (g - ref[i]) * (g - ref[i]);
    n += ref[i] * ref[i];
  }
  const double r = std::sqrt(e / std::max(n, 1e-300));
  return std::isnan(r) ? INFINITY : r;
}
