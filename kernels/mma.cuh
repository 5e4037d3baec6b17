// Warp-level matrix primitives of the tensor-core kernels: mma.sync, ldmatrix, cp.async and a
// vote, as PTX inline assembly, and as the CPU emulator's twins (kernels/check/cuda_emu.hpp)
// when built with -DACPO_EMU. A kernel uses these, never `asm` of its own, so that the same
// source runs on a GPU and in the emulator.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16 operands; g = lane / 4, t = lane % 4):
// - A (16 x 16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9),
//   a3 = (g+8, 2t+8..2t+9);
// - B (16 x 8, "col"): b0 = rows 2t, 2t+1 of column g; b1 = rows 2t+8, 2t+9 of column g;
// - C/D (16 x 8, f32): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1).
// ldmatrix.x4: lanes 8i..8i+7 give the 16-byte rows of 8 x 8 matrix i; lane l receives of
// matrix i row l/4, elements 2(l%4) and 2(l%4)+1 (.trans: column l/4, rows 2(l%4), 2(l%4)+1).
#pragma once
#include "common.cuh"

// c += A·B on one 16 x 8 x 16 tile (bf16 in, f32 accumulate).
__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
#ifdef ACPO_EMU
  emu::mma_16816(c, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

#ifndef ACPO_EMU
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
#endif

// Four 8 x 8 bf16 matrices from shared memory; `row` is this lane's row address.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
#ifdef ACPO_EMU
  emu::ldmatrix(r, 4, false, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
#endif
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
#ifdef ACPO_EMU
  emu::ldmatrix(r, 4, true, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
#endif
}

// 16 bytes global -> shared without passing through registers; `in` false writes zeros (and
// reads nothing from `src`, which must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool in) {
#ifdef ACPO_EMU
  emu::cp_async(dst, src, in ? 16 : 0, 16);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(in ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef ACPO_EMU
  emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef ACPO_EMU
  emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Bit l set iff lane l's `pred` holds (every lane of the warp takes part).
__device__ __forceinline__ uint32_t warp_ballot(bool pred) {
#ifdef ACPO_EMU
  return emu::ballot(pred);
#else
  return __ballot_sync(0xffffffffu, pred);
#endif
}

// Bytes of dynamic shared memory this launch was given.
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
#ifdef ACPO_EMU
  return emu::dynamic_smem_bytes();
#else
  unsigned n;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(n));
  return n;
#endif
}

// Two floats as one register of two bf16 (lo in the low half: the lower row or column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t ld_u32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

#ifdef ACPO_EMU
#define ACPO_DYNAMIC_SMEM(name) unsigned char* name = emu::dynamic_smem()
#else
#define ACPO_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif
