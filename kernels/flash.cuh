// What the flash attention kernels share: the masking rule, the argument list, and the tile
// sizes and shared memory of the tensor-core kernels (flash_mma.cu) that the host mirrors
// (src/fused/flash/cuda.rs). The semantics are stated once, in src/fused/flash/mod.rs (the CPU
// twin): grouped-query, key j visible to query i iff valid[b, j] and j <= past + i, a hidden
// key's score gets -1e9 added, a query that sees no key averages V uniformly over every key.
#pragma once
#include "common.cuh"

#define FA_MAXD 128
#define FA_MASKED (-1e9f)

// The shape arguments every flash kernel ends with, in this order.
#define FA_ARGS int H, int KV, int Tq, int S, int cap, int D, int past, float scale
#define FA_PASS H, KV, Tq, S, cap, D, past, scale

__device__ __forceinline__ float fa_bias(const uint8_t* valid_b, int j, int i, int past) {
  return (valid_b[j] && j <= past + i) ? 0.0f : FA_MASKED;
}

// Whether the block whose first query row is row0 holds a row that sees no key.
__device__ __forceinline__ bool fa_blind_rows(int first, int past, int row0) {
  return first > past + row0;
}
