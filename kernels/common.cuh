// Shared helpers of acpo's kernels: f32/bf16 loads and stores with f32 arithmetic, and block
// reductions. Every kernel computes in f32 whatever it reads and writes (the CPU twins do too).
#pragma once
#ifdef ACPO_EMU
#include "check/cuda_emu.hpp"  // the CPU emulator (kernels/check/): no CUDA headers there
#else
#include <cuda_bf16.h>
#endif
#include <stdint.h>
#include "launch.cuh"

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16 bytes at p, which must be 16-byte aligned (the emulator refuses an address that is not, as
// a GPU would fault on it).
__device__ __forceinline__ uint4 load16(const void* p) {
#ifdef ACPO_EMU
  emu::check_vector_align(p, "load");
#endif
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(void* p, uint4 w) {
#ifdef ACPO_EMU
  emu::check_vector_align(p, "store");
#endif
  *reinterpret_cast<uint4*>(p) = w;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The order of additions is fixed by the block size, so a result is the same on every run.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
    w = warp_sum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  float out = total;
  __syncthreads();  // partial/total are reused by the next call
  return out;
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < (int)(blockDim.x >> 5) ? partial[lane] : -INFINITY;
    w = warp_max(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  float out = total;
  __syncthreads();
  return out;
}

// ---- blocks that add into one buffer in a fixed order (issue #59: dQ in key-block order)
//
// A counter in global memory (zeroed before the launch) holds how many blocks have added to
// a destination. Block k waits until it equals the number of blocks that add there before k
// (`block_wait_count`), adds with plain loads and stores, then counts itself
// (`block_post_count`). The sum's order is then the blocks' order, not the schedule's: the same
// bits on every run. A block must wait only on blocks that are running or done: CUDA does not
// promise to start blocks in grid order, so a kernel numbers its blocks by a ticket each takes
// at its start (an atomicAdd), and waits only on smaller tickets (flash_mma.cu's fused dQ). The fence that makes a block's adds visible before its
// count lives in `block_post_count`, so no kernel can leave it out (the emulator cannot see a
// missing one: kernels/check/cuda_emu.hpp).

// Stops the kernel: a launch that broke a precondition the host should have kept.
__device__ __forceinline__ void kernel_trap() {
#ifdef ACPO_EMU
  emu::fail("a kernel trapped (a precondition of its launch does not hold)");
#else
  __trap();
#endif
}

// The longest a block waits for the blocks before it before trapping, in ns: a wait the
// kernel's order can never meet (a wrong visit count, a block waiting on a later ticket) then
// fails its launch with an error instead of hanging the GPU until the caller's time runs out.
// A met wait takes microseconds; a whole layer's backward takes milliseconds.
#define BLOCK_WAIT_LIMIT_NS 10000000000ull

// Waits (the whole block) until `*count` equals `want` (traps after BLOCK_WAIT_LIMIT_NS; the
// emulator reports a wait never met as a deadlock instead).
__device__ __forceinline__ void block_wait_count(const int* count, int want) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
#ifdef ACPO_EMU
    emu::wait_flag(count, want);
#else
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start > BLOCK_WAIT_LIMIT_NS) __trap();
    } while (seen != want);
#endif
  }
  __syncthreads();
}

// *p += v for an ordered add: through L2 on a GPU (cache-global loads and stores: another SM's
// earlier adds are there, never in this SM's L1).
__device__ __forceinline__ void ordered_add_f32(float* p, float v) {
#ifdef ACPO_EMU
  *p += v;
#else
  __stcg(p, __ldcg(p) + v);
#endif
}

// Counts this block's adds as done: after every thread's (the barrier), made visible to every
// block (the fence), then the count.
__device__ __forceinline__ void block_post_count(int* count) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence();
    atomicAdd(count, 1);
  }
}

// ---- the last block of a group to finish (issue #57: the decode's merge in its own launch)
//
// `blocks` blocks share a counter (zero before the launch). Each calls this once, when its
// writes for the group are issued: the barrier (every thread's writes), the fence (visible to
// every block), then the count. The block that brings the count to `blocks` gets true, every
// other false (the whole block gets the same answer); that last block then sees every block's
// writes (the fence after the count: read them through L2, `ld_l2`) and must set the counter back
// to zero (`block_reset_count`) after its reads, so the next launch finds it zero with no clear.
__device__ __forceinline__ bool block_arrive_last(int* count, int blocks) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence();
    last = atomicAdd(count, 1) == blocks - 1;
    __threadfence();
  }
  __syncthreads();
  const bool out = last;
  __syncthreads();  // `last` is reused by the next call
  return out;
}
__device__ __forceinline__ void block_reset_count(int* count) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) *count = 0;
}

// Loads of what other blocks wrote in this launch: through L2 on a GPU (cache-global: never a
// line this SM's L1 may hold from before).
__device__ __forceinline__ float ld_l2(const float* p) {
#ifdef ACPO_EMU
  return *p;
#else
  return __ldcg(p);
#endif
}
__device__ __forceinline__ float2 ld_l2(const float2* p) {
#ifdef ACPO_EMU
  if ((uintptr_t)p % 8 != 0) emu::fail("a misaligned 8-byte load");
  return *p;
#else
  return __ldcg(p);
#endif
}
