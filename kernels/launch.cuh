// Every number a host launch and its kernel must agree on: block shapes, tile sizes and dynamic
// shared memory. This header is their one source (after CUDA's or the emulator's headers, which
// define __host__ and __device__). The kernels include it (through common.cuh),
// and so does kernels/sizes.cu, whose PTX build.rs reads into the Rust constants of
// src/fused/launch.rs (`sizes`); the emulator's checks (kernels/check/) include it too.
#pragma once

// Threads per block of the row kernels (one block per row; a multiple of 32, as block_sum
// needs) and of the element-wise kernels' grid-stride loops.
#define ROW_THREADS 256
#define ELEM_THREADS 256

// RMSNorm's weight gradient (rms_norm.cu): columns per block, row groups per block (a block is
// RMS_DW_COLS × RMS_DW_GROUPS threads) and rows per chunk (a multiple of RMS_DW_GROUPS).
#define RMS_DW_COLS 32
#define RMS_DW_GROUPS 8
#define RMS_DW_ROWS 256

// The embedding's backward (embedding.cu): a row's positions staged in shared memory at a time.
#define EMB_TILE 256

// The decode step's fused chain (decode_chain.cu): threads per (row, head) block of the
// q/k norm + RoPE + cache write (a multiple of 32, as block_sum needs), and the largest head
// dim it takes (its shared row).
#define DEC_THREADS 128
#define DEC_MAXD 256

// The sampler (sample.cu): threads per row's block (warps own consecutive segments of the
// vocabulary), consecutive columns a lane adds, a warp's group of columns, and the dynamic
// shared memory of a row of v logits: a double per group.
#define SAMPLE_THREADS 512
#define SAMPLE_LANE 8
#define SAMPLE_GROUP (32 * SAMPLE_LANE)
#define sample_smem(v) ((((v) + SAMPLE_GROUP - 1) / SAMPLE_GROUP) * 8)

// AdamW's whole-model step (adamw.cu): parameter elements per block (a tensor's chunk) and
// threads per block (a power of two: its float64 norm reduction halves it).
#define ADAMW_CHUNK 16384
#define ADAMW_THREADS 256

// Flash attention's row kernels (flash_attn.cu): warps (rows) per block; the split-K decode's
// keys per split, warps per block and most query heads per KV head.
#define FA_WARPS 4
#define FD_SPLIT 256
#define FD_WARPS 4
#define FD_MAXG 8

// The pipelined decode (flash_decode.cu): threads per block; keys per cp.async stage; stages in
// the ring; keys per chunk, the unit of the reduction order (one partial per chunk and query
// head, merged in chunk order), whose valid bits the block's threads load one key each; the
// most query heads per KV head.
#define FDP_THREADS 128
#define FDP_TILE 32
#define FDP_STAGES 4
#define FDP_CHUNK 128
#define FDP_MAXG 8
// (chunk, query head) partials a warp of the decode's merge loads before using any: 16 / G
// chunks at a time (flash_decode.cu, fdp_merge).
#define FDP_MERGE_LOADS 16
// The host gives a block one chunk, or more where the grid would exceed this many blocks
// (enough for every SM several waves deep; fewer, longer blocks beyond).
#define FDP_FILL_BLOCKS 2048
// Dynamic shared memory of the pipelined decode at head dim d and `elt` bytes an element: K and
// V tiles, FDP_STAGES deep.
__host__ __device__ constexpr int fdp_smem(int d, int elt) { return FDP_STAGES * 2 * FDP_TILE * d * elt; }

// Tensor-core flash kernels (flash_mma.cu): warps of 16 rows (query rows for the forward and
// dQ, keys for dK/dV) walking tiles of 64 columns (keys, or query rows). At head dim 128 each
// kernel is 8 warps: blocks of 128 query rows (forward, dQ) or keys (dK/dV), so that a tile read
// from L2 serves 128 rows; the forward's and dQ's K/V tiles in three cp.async stages, dK/dV's
// Q/dO tiles in two. At head dim 64, 4 warps (64 rows) and two stages. Shared memory rows are padded by 8 bf16 (16 bytes), so
// the 8 rows one ldmatrix reads fall in distinct banks.
#define FM_COLS 64
#define FM_PAD 8
#define FM_FWD_WARPS_D128 8
#define FM_FWD_STAGES_D128 3
#define FM_FWD_WARPS_D64 4
#define FM_FWD_STAGES_D64 2
#define FM_DKDV_WARPS_D128 8
#define FM_DKDV_WARPS_D64 4

// The forward's and dQ's warps, cp.async stages, query rows and threads per block at head dim d.
__host__ __device__ constexpr int fm_fwd_warps(int d) { return d == 128 ? FM_FWD_WARPS_D128 : FM_FWD_WARPS_D64; }
__host__ __device__ constexpr int fm_fwd_stages(int d) { return d == 128 ? FM_FWD_STAGES_D128 : FM_FWD_STAGES_D64; }
__host__ __device__ constexpr int fm_fwd_rows(int d) { return 16 * fm_fwd_warps(d); }
__host__ __device__ constexpr int fm_fwd_threads(int d) { return 32 * fm_fwd_warps(d); }
// The dK/dV kernel's warps, keys and threads per block at head dim d.
__host__ __device__ constexpr int fm_dkdv_warps(int d) { return d == 128 ? FM_DKDV_WARPS_D128 : FM_DKDV_WARPS_D64; }
__host__ __device__ constexpr int fm_dkdv_rows(int d) { return 16 * fm_dkdv_warps(d); }
__host__ __device__ constexpr int fm_dkdv_threads(int d) { return 32 * fm_dkdv_warps(d); }

// Dynamic shared memory of the forward and of dQ: K and V tiles and the tiles' key-valid bits,
// one of each per stage; of the dK/dV kernel: the block's K and
// V, Q and dO tiles in two stages and the tiles' row statistics (m, 1/sum, delta). Above 48 KB
// a launch must raise the kernel's limit first (cudaFuncSetAttribute; the emulator refuses a
// launch that did not).
__host__ __device__ constexpr int fm_smem_kv(int d, int stages) {
  return stages * (2 * FM_COLS * (d + FM_PAD) * 2 + 2 * 4);
}
__host__ __device__ constexpr int fm_smem_fwd(int d) { return fm_smem_kv(d, fm_fwd_stages(d)); }
__host__ __device__ constexpr int fm_smem_dq(int d) { return fm_smem_kv(d, fm_fwd_stages(d)); }
__host__ __device__ constexpr int fm_smem_dkdv_of(int d, int rows) {
  return (2 * rows + 4 * FM_COLS) * (d + FM_PAD) * 2 + 2 * FM_COLS * 3 * 4;
}
__host__ __device__ constexpr int fm_smem_dkdv(int d) { return fm_smem_dkdv_of(d, fm_dkdv_rows(d)); }
// With the fused dQ (flash_dkdvq_*): also the tile's dS, 64 query rows by the block's keys, and
// the block's ticket (16 bytes, keeping the alignment).
__host__ __device__ constexpr int fm_smem_dkdvq_of(int d, int rows) {
  return fm_smem_dkdv_of(d, rows) + FM_COLS * (rows + FM_PAD) * 2 + 16;
}
__host__ __device__ constexpr int fm_smem_dkdvq(int d) { return fm_smem_dkdvq_of(d, fm_dkdv_rows(d)); }

// The most dynamic shared memory a block may use without asking, and with (H100, sm_90).
#define SMEM_DEFAULT_LIMIT (48 * 1024)
#define SMEM_OPT_IN_LIMIT (227 * 1024)
