// The emulator's own test (built for the emulator only): kernels that break a rule hardware
// enforces, one per mode, each of which the emulator (cuda_emu.hpp) must refuse with a message
// naming the fault, and `control`, the same kernels keeping the rules, which must pass (so a
// refusal is the fault's, not the harness's). tests/it/kernels.rs runs every mode and reads
// the message.
//
//   g++ -O2 -std=c++17 -DACPO_EMU -Ikernels -x c++ kernels/check/emu_faults.cu -o faults
//   ./faults MODE
//
// The static shared overflow is caught only in a build with -fsanitize=address (the test makes
// one); the other modes in both builds. Exit status: 0 when the mode ran to its end (a fault
// not caught), 3 when the emulator refused, 1 when a cross-block sum came out in another order
// than its blocks' (the modes `unordered-add` and `post-before-barrier`: interleaving resident
// blocks, cuda_emu.hpp, is what shows them).
#include "mma.cuh"
#include "check/harness.hpp"

// cp.async of 16 bytes into dynamic shared memory at byte `offset` (16 keeps the rule).
extern "C" __global__ void planted_cp_async(const float* src, float* dst, int offset) {
  ACPO_DYNAMIC_SMEM(smem);
  if (threadIdx.x == 0) cp_async16(smem + offset, src, true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0) std::memcpy(dst, smem + offset, 16);
}

// ldmatrix.x4 whose row addresses start `offset` bytes into a shared tile (0 keeps the rule).
extern "C" __global__ void planted_ldmatrix(uint32_t* out, int offset) {
  __shared__ __align__(16) unsigned char tile[32 * 16 + 16];
  for (int i = threadIdx.x; i < (int)sizeof tile; i += blockDim.x) tile[i] = (unsigned char)i;
  __syncthreads();
  uint32_t r[4];
  ldmatrix_x4(r, tile + offset + 16 * threadIdx.x);
  for (int m = 0; m < 4; ++m) out[threadIdx.x * 4 + m] = r[m];
}

// A 16-byte load (common.cuh's load16, `ld.global.v4`) `offset` bytes into a buffer (a multiple
// of 16 keeps the rule).
extern "C" __global__ void planted_vector_load(const float* src, float* dst, int offset) {
  if (threadIdx.x == 0) {
    const uint4 w = load16((const char*)src + offset);
    std::memcpy(dst, &w, 16);
  }
}

// Warp 0 and the others reach different __syncthreads (one site for all keeps the rule).
extern "C" __global__ void planted_divergent_barrier(float* out, int diverge) {
  __shared__ float v[64];
  v[threadIdx.x] = (float)threadIdx.x;
  if (diverge && threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v[63 - threadIdx.x];
}

// Warps past the first return before a barrier the first waits at (none return when `exit_early`
// is 0).
extern "C" __global__ void planted_early_exit(float* out, int exit_early) {
  __shared__ float v[64];
  if (exit_early && threadIdx.x >= 32) return;
  v[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = v[(threadIdx.x + 1) % blockDim.x];
}

// Thread i reads x[i + shift] and writes y[i + wshift] of n-element buffers (n threads).
extern "C" __global__ void planted_global(const float* x, float* y, int shift, int wshift) {
  y[threadIdx.x + wshift] = x[threadIdx.x + shift];
}

// Reads dynamic shared memory at float index `at` (the launch gives 64 floats).
extern "C" __global__ void planted_shared_read(float* out, int at) {
  ACPO_DYNAMIC_SMEM(smem);
  float* s = reinterpret_cast<float*>(smem);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[at];
}

// A static __shared__ array of 32 floats indexed by every thread of the block.
extern "C" __global__ void planted_static_shared(float* out) {
  __shared__ float s[32];
  s[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

// Takes `bytes` of dynamic shared memory and touches its ends.
extern "C" __global__ void planted_big_smem(float* out, int bytes) {
  ACPO_DYNAMIC_SMEM(smem);
  smem[0] = 1;
  smem[bytes - 1] = 2;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = smem[0] + smem[bytes - 1];
}

// Block b adds its `n` values into `out` after blocks 0..b-1 (`count` holds how many have): a
// cross-block sum in the blocks' order, as the 5-product attention backward is to add dQ
// (common.cuh). `plant`: 0 none; 1 no wait; 2 the count posted by thread 0 without the barrier
// that waits for the block's other threads; 3 the wait for one block too many. It numbers its
// blocks by blockIdx.x, which the emulator issues in order (a GPU kernel takes a ticket instead,
// as flash_mma.cu's fused dQ does).
extern "C" __global__ void ordered_add(const float* part, float* out, int* count, int n,
                                       int plant) {
  const int b = blockIdx.x;
  if (plant != 1) block_wait_count(count, plant == 3 ? b + 1 : b);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] += part[b * n + i];
  if (plant == 2) {
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(count, 1);
    }
  } else {
    block_post_count(count);
  }
}

// `ordered_add` with `plant`, with `first` to 4 blocks resident under 8 schedules each: whether
// every run's bits are the sum in block order (a message and false at the first that is not).
static bool ordered_sums(int plant, int first) {
  const int blocks = 8, n = 64;
  std::vector<float> part(blocks * n);
  // values of many magnitudes: another order of the adds gives other bits
  for (size_t i = 0; i < part.size(); ++i) part[i] = rnd() * std::ldexp(1.0f, (int)(i * 7 % 41) - 20);
  std::vector<float> want(n, 0.0f);
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < n; ++i) want[i] += part[b * n + i];
  float* d_part = (float*)dalloc(part.size() * 4);
  float* d_out = (float*)dalloc(n * 4);
  int* d_count = (int*)dalloc(4);
  h2d(d_part, part.data(), part.size() * 4);
  bool ok = true;
  for (int resident = first; resident <= 4 && ok; ++resident)
    for (int s = 0; s < 8 && ok; ++s) {
      use_schedule(s, 4);
      use_residency(resident);
      std::vector<float> zeros(n, 0.0f);
      const int zero = 0;
      h2d(d_out, zeros.data(), n * 4);
      h2d(d_count, &zero, 4);
      LAUNCH(ordered_add, dim3(blocks), dim3(32), 0, d_part, d_out, d_count, n, plant);
      std::vector<float> got(n);
      d2h(got.data(), d_out, n * 4);
      if (std::memcmp(got.data(), want.data(), n * 4) != 0) {
        fprintf(stderr, "ordered_add: the blocks added out of order (%d resident, schedule %d)\n",
                resident, s);
        ok = false;
      }
    }
  use_residency(1);
  dfree(d_part), dfree(d_out), dfree(d_count);
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODE\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const bool all = mode == "control";
  float* x = (float*)dalloc(64 * 4);
  float* y = (float*)dalloc(64 * 4);
  uint32_t* u = (uint32_t*)dalloc(32 * 4 * 4);
  std::vector<float> ones(64, 1.0f);
  h2d(x, ones.data(), 64 * 4);
  bool ran = false;
  if (all || mode == "misaligned-cp-async") {
    LAUNCH(planted_cp_async, dim3(1), dim3(32), 64, x, y, all ? 16 : 8);
    ran = true;
  }
  if (all || mode == "misaligned-ldmatrix") {
    LAUNCH(planted_ldmatrix, dim3(1), dim3(32), 0, u, all ? 0 : 4);
    ran = true;
  }
  if (all || mode == "misaligned-vector-load") {
    LAUNCH(planted_vector_load, dim3(1), dim3(32), 0, x, y, all ? 16 : 4);
    ran = true;
  }
  if (all || mode == "divergent-barrier") {
    LAUNCH(planted_divergent_barrier, dim3(1), dim3(64), 0, y, all ? 0 : 1);
    ran = true;
  }
  if (all || mode == "exit-while-waiting") {
    LAUNCH(planted_early_exit, dim3(1), dim3(64), 0, y, all ? 0 : 1);
    ran = true;
  }
  if (all || mode == "oob-global-read") {
    LAUNCH(planted_global, dim3(1), dim3(64), 0, x, y, all ? 0 : 1, 0);
    ran = true;
  }
  if (all || mode == "oob-global-write") {
    LAUNCH(planted_global, dim3(1), dim3(64), 0, x, y, 0, all ? 0 : 1);
    ran = true;
  }
  if (all || mode == "oob-shared-read") {
    LAUNCH(planted_shared_read, dim3(1), dim3(64), 64 * 4, y, all ? 63 : 64 + 8);
    ran = true;
  }
  if (all || mode == "static-shared-overflow") {
    LAUNCH(planted_static_shared, dim3(1), dim3(all ? 32 : 64), 0, y);
    ran = true;
  }
  if (all || mode == "smem-without-opt-in") {
    // 64 KB: above the default 48 KB, so the launch must raise the kernel's limit first
    if (all)
      LAUNCH(planted_big_smem, dim3(1), dim3(32), 64 * 1024, y, 64 * 1024);
    else
      LAUNCH_AS_IS(planted_big_smem, dim3(1), dim3(32), 64 * 1024, y, 64 * 1024);
    ran = true;
  }
  if (all || mode == "smem-above-limit") {
    const int bytes = all ? SMEM_OPT_IN_LIMIT : SMEM_OPT_IN_LIMIT + 1024;
    LAUNCH(planted_big_smem, dim3(1), dim3(32), bytes, y, bytes);
    ran = true;
  }
  if (all || mode == "unordered-add" || mode == "post-before-barrier" ||
      mode == "wait-never-met" || mode == "wait-never-met-resident") {
    const int plant = all                              ? 0
                      : mode == "unordered-add"        ? 1
                      : mode == "post-before-barrier" ? 2
                                                       : 3;
    // the wait never met: with one block resident, and with three interleaving
    if (!ordered_sums(plant, mode == "wait-never-met-resident" ? 3 : 1)) {
      dfree(x), dfree(y), dfree(u);
      return 1;
    }
    ran = true;
  }
  if (!ran) {
    fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  dfree(x), dfree(y), dfree(u);
  printf("%s: ran to the end\n", mode.c_str());
  return 0;
}
