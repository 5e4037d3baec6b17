// Flash attention on tensor cores: FlashAttention-2's forward and backward (Dao 2023, Alg. 1
// and 2) with mma.sync.m16n8k16 (bf16 in, f32 accumulate), head dim 64 or 128, bf16 storage.
// The row kernels of flash_attn.cu compute the same functions for every dtype and head dim and
// stay the oracle; src/fused/flash/mod.rs is the CPU twin and states the semantics
// (kernels/check/flash_check.cu and tests/it/cuda.rs hold these kernels to both).
//
// The work. Each warp owns 16 of its block's rows and walks tiles of 64 columns:
// - forward and dQ: 128 query rows (8 warps) of one (sequence, head) at head dim 128, 64 (4
//   warps) at 64, against K/V tiles of 64 keys;
// - dK/dV: 128 keys (8 warps) at head dim 128, 64 (4 warps) at 64, of one (sequence, KV head)
//   against tiles of 64 query rows of every query head that reads this KV head (GQA without
//   copying K/V; the heads are summed in head order).
// Forward and dQ blocks take their row blocks from the last down: a causal head's heaviest
// blocks first, the grid's tail on its lightest. Tiles reach shared memory by cp.async, in a
// ring of stages: the forward's and dQ's three at head dim 128 (tiles n + 1 and n + 2 load while
// tile n is computed), two elsewhere. Operands reach the tensor cores by ldmatrix (.trans where a product needs a tile's
// transpose). P and dS pass from one product's accumulators to the next product's A operand in
// registers, rounded to bf16 as FA2 rounds them.
//
// Statistics: each query row keeps {m, 1/l} (its maximum score, the inverse of its normaliser),
// as the row kernels do, and the backward recomputes p = e^{s - m} / l from them.
//
// Determinism: each output row has one owner (O and dQ by query rows, dK and dV by key rows) and
// every sum runs in a fixed order; there are no atomics. FA2 adds dQ up with atomicAdd instead;
// the price here is S and dP computed in both backward kernels (7 products where FA2 does 5).
// The fused dK/dV kernel (`DQ`, flash_dkdvq_*) does 5: dQ's shares added in key-block order,
// each tile's adds after the key blocks before it (a counter, not an atomic sum).
//
// Masking is flash.cuh's rule. A row that sees no key (a left-padding row: "blind") averages V
// over every key, so a block holding one reads every key (and the dK/dV kernel visits those rows
// for every key block). Columns hidden from every row a block computes contribute exactly 0
// (e^{-1e9 - m} = 0 in f32) and are skipped: keys before a sequence's first valid key, keys after
// the block's last row, and query rows before a key block's first key.
#include "flash.cuh"
#include "mma.cuh"

#define FM_LOG2E 1.4426950408889634f

template <int D>
using FmRow = __nv_bfloat16[D + FM_PAD];

// Rows r0..r0 + 63 of an (n, D) bf16 matrix into `dst` by cp.async, the rows past n as zeros;
// the whole block (THREADS threads) takes part, 16 bytes per copy.
template <int D, int THREADS>
__device__ __forceinline__ void fm_load(FmRow<D>* dst, const __nv_bfloat16* src, int r0, int n) {
  constexpr int VEC = D / 8;
  for (int x = threadIdx.x; x < FM_COLS * VEC; x += THREADS) {
    const int rr = x / VEC, c = (x % VEC) * 8, r = r0 + rr;
    const bool in = r < n;
    cp_async16(&dst[rr][c], src + (size_t)(in ? r : 0) * D + c, in);
  }
}

// bits[0..1] = valid[b, j0 .. j0 + 63] as bits (0 past S), by warp 0.
__device__ __forceinline__ void fm_valid_bits(uint32_t* bits, const uint8_t* valid_b, int j0,
                                              int S) {
  if (threadIdx.x < 32) {
    const int l = threadIdx.x;
    const uint32_t lo = warp_ballot(j0 + l < S && valid_b[j0 + l]);
    const uint32_t hi = warp_ballot(j0 + 32 + l < S && valid_b[j0 + 32 + l]);
    if (l == 0) {
      bits[0] = lo;
      bits[1] = hi;
    }
  }
}

// The three ways a product's operand is read from a tile of rows (l = lane):
// A (16 x 16, row-major) from rows m0.. and columns k0..;
template <int D>
__device__ __forceinline__ void fm_ld_a(uint32_t r[4], const FmRow<D>* t, int m0, int k0) {
  const int l = threadIdx.x & 31;
  ldmatrix_x4(r, &t[m0 + (l & 15)][k0 + ((l >> 4) << 3)]);
}
// B for two n-tiles (n0.., n0 + 8..) whose rows are the tile's rows n0.. (B = tileᵀ): r[0..1]
// is n-tile n0, r[2..3] n-tile n0 + 8, each over columns k0..k0 + 15;
template <int D>
__device__ __forceinline__ void fm_ld_b(uint32_t r[4], const FmRow<D>* t, int n0, int k0) {
  const int l = threadIdx.x & 31;
  ldmatrix_x4(r, &t[n0 + ((l >> 4) << 3) + (l & 7)][k0 + (((l >> 3) & 1) << 3)]);
}
// B for two n-tiles (columns n0.., n0 + 8..) of the tile itself, its rows k0..k0 + 15 the k
// index (B = tile): r[0..1] is n-tile n0, r[2..3] n-tile n0 + 8.
template <int D>
__device__ __forceinline__ void fm_ld_bt(uint32_t r[4], const FmRow<D>* t, int k0, int n0) {
  const int l = threadIdx.x & 31;
  ldmatrix_x4_trans(r, &t[k0 + (((l >> 3) & 1) << 3) + (l & 7)][n0 + ((l >> 4) << 3)]);
}

// The A operand of the next product from accumulators acc[2c], acc[2c + 1] (16 x 16).
__device__ __forceinline__ void fm_acc_to_a(uint32_t a[4], const float (*acc)[4], int c) {
  a[0] = pack_bf16(acc[2 * c][0], acc[2 * c][1]);
  a[1] = pack_bf16(acc[2 * c][2], acc[2 * c][3]);
  a[2] = pack_bf16(acc[2 * c + 1][0], acc[2 * c + 1][1]);
  a[3] = pack_bf16(acc[2 * c + 1][2], acc[2 * c + 1][3]);
}

// A's fragments of 16 rows of a (n, D) bf16 matrix straight from global memory (rows past n:
// zeros), for an operand a warp keeps in registers through its whole loop.
template <int D>
__device__ __forceinline__ void fm_rows_to_a(uint32_t (*a)[4], const __nv_bfloat16* m, int r0,
                                             int r1, int n) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    const int c = kc * 16 + 2 * tq;
    a[kc][0] = r0 < n ? ld_u32(m + (size_t)r0 * D + c) : 0u;
    a[kc][1] = r1 < n ? ld_u32(m + (size_t)r1 * D + c) : 0u;
    a[kc][2] = r0 < n ? ld_u32(m + (size_t)r0 * D + c + 8) : 0u;
    a[kc][3] = r1 < n ? ld_u32(m + (size_t)r1 * D + c + 8) : 0u;
  }
}

// The key tiles a block of query rows row0..row0 + rows - 1 reads: [kstart, kend).
struct FmKeys {
  int kstart, kend, tiles;
};
__device__ __forceinline__ FmKeys fm_keys(int first, int past, int row0, int rows, int Tq, int S) {
  const int last = min(Tq - 1, row0 + rows - 1);
  FmKeys r;
  if (fa_blind_rows(first, past, row0)) {
    r.kstart = 0;
    r.kend = S;
  } else {
    r.kend = min(S, past + last + 1);
    r.kstart = min(first, r.kend) / FM_COLS * FM_COLS;
  }
  r.tiles = (r.kend - r.kstart + FM_COLS - 1) / FM_COLS;
  return r;
}

// A score with its mask: -inf past kend (not a key of this row's sum), else s·scale plus -1e9
// when key j is hidden from query i.
__device__ __forceinline__ float fm_score(float acc, float scale, bool full, const uint32_t* bits,
                                          int jj, int j, int i, int kend, int past) {
  if (full) return acc * scale;
  if (j >= kend) return -INFINITY;
  const bool vis = ((bits[jj >> 5] >> (jj & 31)) & 1u) && j <= past + i;
  return acc * scale + (vis ? 0.0f : FA_MASKED);
}

// Whether every column of key tile j0 is a valid key below kend that every row from wrow0 on
// sees: its scores need no mask.
__device__ __forceinline__ bool fm_full(const uint32_t* bits, int j0, int kend, int past,
                                        int wrow0) {
  return bits[0] == 0xffffffffu && bits[1] == 0xffffffffu && j0 + FM_COLS <= kend &&
         j0 + FM_COLS - 1 <= past + wrow0;
}

// ---------------------------------------------------------------------------------------------
// The row block a forward or dQ block computes: the grid's x index from the last block down, so
// that the heaviest blocks of a causal head (the last rows, which read the most keys) are issued
// first and the grid ends on the lightest (a short tail on the last wave).
__device__ __forceinline__ int fm_row_block() { return gridDim.x - 1 - blockIdx.x; }

// Forward. WARPS warps of 16 query rows (a block of 16 · WARPS rows), K/V tiles in a ring of
// STAGES cp.async stages: while tile n is computed, tiles n + 1 .. n + STAGES - 1 are in flight.
// grid (ceil(Tq / (16 · WARPS)), H, B), block 32 · WARPS, fm_smem_kv(D, STAGES) bytes of
// dynamic shared memory (launch.cuh: fm_fwd_* give WARPS and STAGES per head dim).
template <int D, int WARPS, int STAGES>
__device__ void fm_forward(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                           const __nv_bfloat16* __restrict__ v, const uint8_t* __restrict__ valid,
                           const int* __restrict__ first, __nv_bfloat16* __restrict__ o,
                           float* __restrict__ stats, int H, int KV, int Tq, int S, int cap,
                           int past, float scale) {
  static_assert(STAGES >= 2, "a ring of at least two stages");
  constexpr int ROWS = 16 * WARPS, THREADS = 32 * WARPS;
  ACPO_DYNAMIC_SMEM(smem);
  if (threadIdx.x == 0 && dynamic_smem_bytes() < (unsigned)fm_smem_kv(D, STAGES)) kernel_trap();
  FmRow<D>* ks = reinterpret_cast<FmRow<D>*>(smem);  // [STAGES][64]
  FmRow<D>* vs = ks + STAGES * FM_COLS;               // [STAGES][64]
  uint32_t* vbits = reinterpret_cast<uint32_t*>(vs + STAGES * FM_COLS);  // [STAGES][2]
  constexpr int KC = D / 16, DN = D / 8, NT = FM_COLS / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int bi = blockIdx.z, hi = blockIdx.y, g = hi / (H / KV);
  const int row0 = fm_row_block() * ROWS, wrow0 = row0 + warp * 16;
  const int r0 = wrow0 + gq, r1 = r0 + 8;  // this thread's two query positions
  const __nv_bfloat16* qb = q + ((size_t)bi * H + hi) * Tq * D;
  const __nv_bfloat16* kb = k + ((size_t)bi * KV + g) * cap * D;
  const __nv_bfloat16* vb = v + ((size_t)bi * KV + g) * cap * D;
  const uint8_t* valid_b = valid + (size_t)bi * S;
  uint32_t qa[KC][4];
  fm_rows_to_a<D>(qa, qb, r0, r1, Tq);
  float oacc[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) oacc[dn][0] = oacc[dn][1] = oacc[dn][2] = oacc[dn][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const FmKeys keys = fm_keys(first[bi], past, row0, ROWS, Tq, S);
  // Tile `it` into stage it % STAGES, one commit group per tile (an empty group past the last
  // tile, so that the wait below always leaves STAGES - 2 groups in flight).
  auto load = [&](int it) {
    if (it < keys.tiles) {
      const int st = it % STAGES, j0 = keys.kstart + it * FM_COLS;
      fm_load<D, THREADS>(ks + st * FM_COLS, kb, j0, S);
      fm_load<D, THREADS>(vs + st * FM_COLS, vb, j0, S);
      fm_valid_bits(vbits + 2 * st, valid_b, j0, S);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int it = 0; it < STAGES - 1; ++it) load(it);
  for (int it = 0; it < keys.tiles; ++it) {
    const int st = it % STAGES, j0 = keys.kstart + it * FM_COLS;
    cp_async_wait<STAGES - 2>();  // this thread's copies of tile `it` have landed
    // every thread's have, and every warp is done with tile it - 1, whose stage the load
    // below refills
    __syncthreads();
    load(it + STAGES - 1);
    const FmRow<D>* kt = ks + st * FM_COLS;
    const FmRow<D>* vt = vs + st * FM_COLS;
    const uint32_t bits[2] = {vbits[2 * st], vbits[2 * st + 1]};
    float sacc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
#pragma unroll
      for (int n2 = 0; n2 < NT / 2; ++n2) {
        uint32_t b[4];
        fm_ld_b<D>(b, kt, n2 * 16, kc * 16);
        mma_bf16_16816(sacc[2 * n2], qa[kc], b[0], b[1]);
        mma_bf16_16816(sacc[2 * n2 + 1], qa[kc], b[2], b[3]);
      }
    const bool full = fm_full(bits, j0, keys.kend, past, wrow0);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jj = nt * 8 + 2 * tq + (e & 1);
        const float sc = fm_score(sacc[nt][e], scale, full, bits, jj, j0 + jj, e < 2 ? r0 : r1,
                                  keys.kend, past);
        sacc[nt][e] = sc;
        if (e < 2)
          mx0 = fmaxf(mx0, sc);
        else
          mx1 = fmaxf(mx1, sc);
      }
    // a row's 64 scores are spread over the 4 threads of its quad
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float al0 = mn0 == -INFINITY ? 1.0f : exp2f((m0 - mn0) * FM_LOG2E);
    const float al1 = mn1 == -INFINITY ? 1.0f : exp2f((m1 - mn1) * FM_LOG2E);
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mn = e < 2 ? mn0 : mn1;
        const float p = sacc[nt][e] == -INFINITY ? 0.0f : exp2f((sacc[nt][e] - mn) * FM_LOG2E);
        sacc[nt][e] = p;
        if (e < 2)
          ps0 += p;
        else
          ps1 += p;
      }
    ps0 += __shfl_xor_sync(0xffffffffu, ps0, 1);
    ps0 += __shfl_xor_sync(0xffffffffu, ps0, 2);
    ps1 += __shfl_xor_sync(0xffffffffu, ps1, 1);
    ps1 += __shfl_xor_sync(0xffffffffu, ps1, 2);
    l0 = l0 * al0 + ps0;
    l1 = l1 * al1 + ps1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      oacc[dn][0] *= al0;
      oacc[dn][1] *= al0;
      oacc[dn][2] *= al1;
      oacc[dn][3] *= al1;
    }
#pragma unroll
    for (int kc = 0; kc < FM_COLS / 16; ++kc) {
      uint32_t pa[4];
      fm_acc_to_a(pa, sacc, kc);
#pragma unroll
      for (int d2 = 0; d2 < DN / 2; ++d2) {
        uint32_t b[4];
        fm_ld_bt<D>(b, vt, kc * 16, d2 * 16);
        mma_bf16_16816(oacc[2 * d2], pa, b[0], b[1]);
        mma_bf16_16816(oacc[2 * d2 + 1], pa, b[2], b[3]);
      }
    }
  }
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
  __nv_bfloat16* ob = o + ((size_t)bi * H + hi) * Tq * D;
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) {
    const int d = dn * 8 + 2 * tq;
    if (r0 < Tq)
      *reinterpret_cast<__nv_bfloat162*>(ob + (size_t)r0 * D + d) =
          __floats2bfloat162_rn(oacc[dn][0] * inv0, oacc[dn][1] * inv0);
    if (r1 < Tq)
      *reinterpret_cast<__nv_bfloat162*>(ob + (size_t)r1 * D + d) =
          __floats2bfloat162_rn(oacc[dn][2] * inv1, oacc[dn][3] * inv1);
  }
  if (tq == 0) {
    float* sb = stats + 2 * (((size_t)bi * H + hi) * Tq);
    if (r0 < Tq) {
      sb[2 * r0] = m0;
      sb[2 * r0 + 1] = inv0;
    }
    if (r1 < Tq) {
      sb[2 * r1] = m1;
      sb[2 * r1 + 1] = inv1;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dQ = scale · dS·K with dS = P ⊙ (dO·Vᵀ − δ), P recomputed from the statistics; δ (rowsum of
// dO ⊙ O) comes from flash_delta_bf16. The forward's layout and key tiles; a key tile is taken
// in two halves of 32 keys, so S and dP of a half stay in 32 registers. The forward's blocks
// (WARPS warps of 16 query rows) and ring of STAGES stages.
// grid (ceil(Tq / (16 · WARPS)), H, B), block 32 · WARPS, fm_smem_kv(D, STAGES) bytes of dynamic
// shared memory.
template <int D, int WARPS, int STAGES>
__device__ void fm_dq(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                      const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ dout,
                      const float* __restrict__ stats, const float* __restrict__ delta,
                      const uint8_t* __restrict__ valid, const int* __restrict__ first,
                      __nv_bfloat16* __restrict__ dq, int H, int KV, int Tq, int S, int cap,
                      int past, float scale) {
  static_assert(STAGES >= 2, "a ring of at least two stages");
  constexpr int ROWS = 16 * WARPS, THREADS = 32 * WARPS;
  ACPO_DYNAMIC_SMEM(smem);
  if (threadIdx.x == 0 && dynamic_smem_bytes() < (unsigned)fm_smem_kv(D, STAGES)) kernel_trap();
  FmRow<D>* ks = reinterpret_cast<FmRow<D>*>(smem);  // [STAGES][64]
  FmRow<D>* vs = ks + STAGES * FM_COLS;               // [STAGES][64]
  uint32_t* vbits = reinterpret_cast<uint32_t*>(vs + STAGES * FM_COLS);  // [STAGES][2]
  constexpr int KC = D / 16, DN = D / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int bi = blockIdx.z, hi = blockIdx.y, g = hi / (H / KV);
  const int row0 = fm_row_block() * ROWS, wrow0 = row0 + warp * 16;
  const int r0 = wrow0 + gq, r1 = r0 + 8;
  const size_t head = ((size_t)bi * H + hi) * Tq;
  const __nv_bfloat16* kb = k + ((size_t)bi * KV + g) * cap * D;
  const __nv_bfloat16* vb = v + ((size_t)bi * KV + g) * cap * D;
  const uint8_t* valid_b = valid + (size_t)bi * S;
  uint32_t qa[KC][4], da[KC][4];
  fm_rows_to_a<D>(qa, q + head * D, r0, r1, Tq);
  fm_rows_to_a<D>(da, dout + head * D, r0, r1, Tq);
  const float mr[2] = {r0 < Tq ? stats[2 * (head + r0)] : 0.0f,
                       r1 < Tq ? stats[2 * (head + r1)] : 0.0f};
  const float ir[2] = {r0 < Tq ? stats[2 * (head + r0) + 1] : 0.0f,
                       r1 < Tq ? stats[2 * (head + r1) + 1] : 0.0f};
  const float dr[2] = {r0 < Tq ? delta[head + r0] : 0.0f, r1 < Tq ? delta[head + r1] : 0.0f};
  float dqacc[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) dqacc[dn][0] = dqacc[dn][1] = dqacc[dn][2] = dqacc[dn][3] = 0.0f;
  const FmKeys keys = fm_keys(first[bi], past, row0, ROWS, Tq, S);
  auto load = [&](int it) {  // the forward's ring
    if (it < keys.tiles) {
      const int st = it % STAGES, j0 = keys.kstart + it * FM_COLS;
      fm_load<D, THREADS>(ks + st * FM_COLS, kb, j0, S);
      fm_load<D, THREADS>(vs + st * FM_COLS, vb, j0, S);
      fm_valid_bits(vbits + 2 * st, valid_b, j0, S);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int it = 0; it < STAGES - 1; ++it) load(it);
  for (int it = 0; it < keys.tiles; ++it) {
    const int st = it % STAGES, j0 = keys.kstart + it * FM_COLS;
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    load(it + STAGES - 1);
    const FmRow<D>* kt = ks + st * FM_COLS;
    const FmRow<D>* vt = vs + st * FM_COLS;
    const uint32_t bits[2] = {vbits[2 * st], vbits[2 * st + 1]};
    const bool full = fm_full(bits, j0, keys.kend, past, wrow0);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float s[4][4], dp[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc)
#pragma unroll
        for (int n2 = 0; n2 < 2; ++n2) {
          uint32_t b[4];
          fm_ld_b<D>(b, kt, half * 32 + n2 * 16, kc * 16);
          mma_bf16_16816(s[2 * n2], qa[kc], b[0], b[1]);
          mma_bf16_16816(s[2 * n2 + 1], qa[kc], b[2], b[3]);
          fm_ld_b<D>(b, vt, half * 32 + n2 * 16, kc * 16);
          mma_bf16_16816(dp[2 * n2], da[kc], b[0], b[1]);
          mma_bf16_16816(dp[2 * n2 + 1], da[kc], b[2], b[3]);
        }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int jj = half * 32 + nt * 8 + 2 * tq + (e & 1), r = e >> 1;
          const int i = r ? r1 : r0;
          const float sc =
              fm_score(s[nt][e], scale, full, bits, jj, j0 + jj, i, keys.kend, past);
          const float p = (sc == -INFINITY || i >= Tq) ? 0.0f
                                                       : exp2f((sc - mr[r]) * FM_LOG2E) * ir[r];
          s[nt][e] = p * (dp[nt][e] - dr[r]);  // dS, unscaled
        }
#pragma unroll
      for (int kc = 0; kc < 2; ++kc) {
        uint32_t a[4];
        fm_acc_to_a(a, s, kc);
#pragma unroll
        for (int d2 = 0; d2 < DN / 2; ++d2) {
          uint32_t b[4];
          fm_ld_bt<D>(b, kt, half * 32 + kc * 16, d2 * 16);
          mma_bf16_16816(dqacc[2 * d2], a, b[0], b[1]);
          mma_bf16_16816(dqacc[2 * d2 + 1], a, b[2], b[3]);
        }
      }
    }
  }
  __nv_bfloat16* qb = dq + head * D;
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) {
    const int d = dn * 8 + 2 * tq;
    if (r0 < Tq)
      *reinterpret_cast<__nv_bfloat162*>(qb + (size_t)r0 * D + d) =
          __floats2bfloat162_rn(dqacc[dn][0] * scale, dqacc[dn][1] * scale);
    if (r1 < Tq)
      *reinterpret_cast<__nv_bfloat162*>(qb + (size_t)r1 * D + d) =
          __floats2bfloat162_rn(dqacc[dn][2] * scale, dqacc[dn][3] * scale);
  }
}

// ---------------------------------------------------------------------------------------------
// How many key blocks before key block `kb` visit the query tile at row `row0` of a head (the
// dK/dV kernel's walk, below): every key block visits the blind rows' tiles (row0 below
// tiles_a · 64); a later tile, the key blocks whose keys are not all hidden (before the first
// valid key `f`) and whose first visited tile is at or before it.
__device__ __forceinline__ int fm_visits_before(int kb, int row0, int tiles_a, int rows, int f,
                                                int past, int Tq) {
  if (row0 < tiles_a * FM_COLS) return kb;
  int n = 0;
  for (int j = 0; j < kb; ++j) {
    const int key0 = j * rows;
    const int b_start = max(tiles_a * FM_COLS, max(0, key0 - past) / FM_COLS * FM_COLS);
    n += key0 + rows > f && b_start < Tq && b_start <= row0;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// dV = Pᵀ·dO and dK = scale · dSᵀ·Q for 16 · WARPS keys of one (sequence, KV head), summed over
// the query rows of every query head that reads it. The query rows that reach these keys: the
// blind rows [0, nblind) (they see every key), then [max(nblind, key0 − past), Tq) rounded down
// to a tile, none of them when every key of the block precedes the sequence's first valid key.
// grid (ceil(S / (16 · WARPS)), KV, B), block 32 · WARPS, fm_smem_dkdv_of(D, 16 · WARPS) bytes of
// dynamic shared memory; K and V are (B, KV, S, D) (cap == S).
//
// With DQ (the backward in 5 products: FA2's, deterministic), the same kernel also adds each
// visited query tile's dQ share, dS·K over this block's keys, to an f32 buffer `dq_acc`
// (B, H, Tq, D), zeroed before the launch, in key-block order: `dq_count` (B, H, ceil(Tq / 64)
// counters and one ticket after them), zeroed too, holds per query tile how many key blocks have
// added, and block kb adds to a tile
// once the key blocks before it that visit the tile have (`fm_visits_before`, common.cuh's
// `block_wait_count` / `block_post_count`). The sum's order is then the key blocks' order, not
// the schedule's. dS goes through shared memory (query rows × this block's keys, bf16, as FA2
// rounds it); each warp computes 16 of the D columns. flash_dq_acc_bf16 then writes
// dQ = scale · dq_acc in bf16. The dQ kernel (and its recomputed S and dP) is not run.
template <int D, int WARPS, bool DQ = false>
__device__ void fm_dkdv(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                        const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ dout,
                        const float* __restrict__ stats, const float* __restrict__ delta,
                        const uint8_t* __restrict__ valid, const int* __restrict__ first,
                        __nv_bfloat16* __restrict__ dk, __nv_bfloat16* __restrict__ dv, int H,
                        int KV, int Tq, int S, int past, float scale, float* dq_acc = nullptr,
                        int* dq_count = nullptr) {
  constexpr int ROWS = 16 * WARPS, THREADS = 32 * WARPS;
  // dQ's columns: 16 a warp (D = 16 · WARPS), dS's rows are FmRow<D> (ROWS == D keys)
  static_assert(!DQ || (ROWS == D && D == 16 * WARPS), "the fused dQ's layout");
  ACPO_DYNAMIC_SMEM(smem);
  const int smem_need = DQ ? fm_smem_dkdvq_of(D, ROWS) : fm_smem_dkdv_of(D, ROWS);
  if (threadIdx.x == 0 && dynamic_smem_bytes() < (unsigned)smem_need) kernel_trap();
  FmRow<D>* ks = reinterpret_cast<FmRow<D>*>(smem);  // [ROWS]
  FmRow<D>* vs = ks + ROWS;                          // [ROWS]
  FmRow<D>* qs = vs + ROWS;                          // [2][64]
  FmRow<D>* ds = qs + 2 * FM_COLS;                   // [2][64] (dO)
  float* rs = reinterpret_cast<float*>(ds + 2 * FM_COLS);  // [2][64][3]: m, 1/l, delta
  // with DQ, the tile's dS: [64 query rows][ROWS keys], then the block's ticket
  FmRow<D>* dss = reinterpret_cast<FmRow<D>*>(rs + 2 * FM_COLS * 3);
  constexpr int KC = D / 16, DN = D / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  // the block's key block kb of KV head g of sequence bi: the grid's indices, or with DQ a
  // ticket taken at the start, key blocks first (kb = ticket / (KV · B)): every block whose adds
  // this one waits for holds a smaller ticket, so it is running or done whatever order the GPU
  // starts blocks in, and the first wave holds the first key blocks of every head (with the
  // grid's order it would hold all the key blocks of a few heads, the later ones waiting)
  volatile int* slot = reinterpret_cast<volatile int*>(dss + FM_COLS);  // {kb, g, bi}
  if constexpr (DQ) {
    if (threadIdx.x == 0) {
      const int ticket = atomicAdd(dq_count + (size_t)gridDim.z * H * ((Tq + FM_COLS - 1) / FM_COLS), 1);
      const int groups = KV * (int)gridDim.z;
      slot[0] = ticket / groups, slot[1] = ticket % groups % KV, slot[2] = ticket % groups / KV;
    }
    __syncthreads();
  }
  // kb, g or bi, read again where needed (the special registers, or the ticket's in shared
  // memory) rather than held in registers through the walk: the fused kernel is at the limit
  const auto ids = [&](int which) {
    if constexpr (!DQ) return which == 0 ? (int)blockIdx.x : which == 1 ? (int)blockIdx.y : (int)blockIdx.z;
    return (int)slot[which];
  };
  const int kb = ids(0), g = ids(1), bi = ids(2);
  const int rep = H / KV;
  const int key0 = kb * ROWS;
  const int jr[2] = {key0 + warp * 16 + gq, key0 + warp * 16 + gq + 8};  // this thread's keys
  const size_t kv_head = ((size_t)bi * KV + g) * S;
  const uint8_t* valid_b = valid + (size_t)bi * S;
  const bool vj[2] = {jr[0] < S && valid_b[jr[0]], jr[1] < S && valid_b[jr[1]]};
  const int f = first[bi];
  const int nblind = max(0, min(Tq, f - past));
  const int tiles_a = (nblind + FM_COLS - 1) / FM_COLS;
  const int b_start = max(tiles_a * FM_COLS, max(0, key0 - past) / FM_COLS * FM_COLS);
  const bool hidden = key0 + ROWS <= f;  // every key here precedes the first valid key
  const int tiles_b = (hidden || b_start >= Tq) ? 0 : (Tq - b_start + FM_COLS - 1) / FM_COLS;
  const int per_head = tiles_a + tiles_b, tiles = rep * per_head;
  float dkacc[DN][4], dvacc[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dkacc[dn][e] = dvacc[dn][e] = 0.0f;
  auto tile_row0 = [&](int it) {
    const int w = it % per_head;
    return w < tiles_a ? w * FM_COLS : b_start + (w - tiles_a) * FM_COLS;
  };
  auto load = [&](int it) {
    const int st = it & 1, i0 = tile_row0(it);
    const size_t head = ((size_t)ids(2) * H + ids(1) * rep + it / per_head) * Tq;
    fm_load<D, THREADS>(qs + st * FM_COLS, q + head * D, i0, Tq);
    fm_load<D, THREADS>(ds + st * FM_COLS, dout + head * D, i0, Tq);
    cp_async_commit();
    if (threadIdx.x < FM_COLS) {
      const int i = i0 + threadIdx.x;
      float* r = rs + (st * FM_COLS + threadIdx.x) * 3;
      r[0] = i < Tq ? stats[2 * (head + i)] : 0.0f;
      r[1] = i < Tq ? stats[2 * (head + i) + 1] : 0.0f;
      r[2] = i < Tq ? delta[head + i] : 0.0f;
    }
  };
  if (tiles > 0) {
    // the block's keys land with the first tile
#pragma unroll
    for (int c = 0; c < ROWS; c += FM_COLS) {
      fm_load<D, THREADS>(ks + c, k + kv_head * D, key0 + c, S);
      fm_load<D, THREADS>(vs + c, v + kv_head * D, key0 + c, S);
    }
    load(0);
  }
  for (int it = 0; it < tiles; ++it) {
    const int st = it & 1, i0 = tile_row0(it);
    if (it + 1 < tiles) {
      load(it + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const FmRow<D>* qt = qs + st * FM_COLS;
    const FmRow<D>* dt = ds + st * FM_COLS;
    const float* rt = rs + st * FM_COLS * 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float s[4][4], dp[4][4];  // Sᵀ and dPᵀ: rows are keys, columns query rows
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        uint32_t ka[4], va[4];
        fm_ld_a<D>(ka, ks, warp * 16, kc * 16);
        fm_ld_a<D>(va, vs, warp * 16, kc * 16);
#pragma unroll
        for (int n2 = 0; n2 < 2; ++n2) {
          uint32_t b[4];
          fm_ld_b<D>(b, qt, half * 32 + n2 * 16, kc * 16);
          mma_bf16_16816(s[2 * n2], ka, b[0], b[1]);
          mma_bf16_16816(s[2 * n2 + 1], ka, b[2], b[3]);
          fm_ld_b<D>(b, dt, half * 32 + n2 * 16, kc * 16);
          mma_bf16_16816(dp[2 * n2], va, b[0], b[1]);
          mma_bf16_16816(dp[2 * n2 + 1], va, b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ii = half * 32 + nt * 8 + 2 * tq + (e & 1), i = i0 + ii, r = e >> 1;
          const float* st3 = rt + ii * 3;
          float p = 0.0f;
          if (i < Tq) {
            const bool vis = vj[r] && jr[r] <= past + i;
            const float sc = s[nt][e] * scale + (vis ? 0.0f : FA_MASKED);
            p = exp2f((sc - st3[0]) * FM_LOG2E) * st3[1];
          }
          s[nt][e] = p;
          dp[nt][e] = p * (dp[nt][e] - st3[2]);  // dSᵀ, unscaled
          if constexpr (DQ) dss[ii][warp * 16 + gq + 8 * r] = __float2bfloat16_rn(dp[nt][e]);
        }
#pragma unroll
      for (int kc = 0; kc < 2; ++kc) {
        uint32_t pa[4], sa[4];
        fm_acc_to_a(pa, s, kc);
        fm_acc_to_a(sa, dp, kc);
#pragma unroll
        for (int d2 = 0; d2 < DN / 2; ++d2) {
          uint32_t b[4];
          fm_ld_bt<D>(b, dt, half * 32 + kc * 16, d2 * 16);
          mma_bf16_16816(dvacc[2 * d2], pa, b[0], b[1]);
          mma_bf16_16816(dvacc[2 * d2 + 1], pa, b[2], b[3]);
          fm_ld_bt<D>(b, qt, half * 32 + kc * 16, d2 * 16);
          mma_bf16_16816(dkacc[2 * d2], sa, b[0], b[1]);
          mma_bf16_16816(dkacc[2 * d2 + 1], sa, b[2], b[3]);
        }
      }
    }
    if constexpr (DQ) {
      __syncthreads();  // every warp's dS is in dss
      // this warp's 16 columns of the tile's dQ share: dS (64 x ROWS) · K (ROWS x D), added to
      // the sums once the key blocks before this one have added theirs
      float qacc[4][2][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) qacc[mt][0][e] = qacc[mt][1][e] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < ROWS / 16; ++kc) {
        uint32_t b[4];
        fm_ld_bt<D>(b, ks, kc * 16, warp * 16);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          uint32_t a[4];
          fm_ld_a<D>(a, dss, mt * 16, kc * 16);
          mma_bf16_16816(qacc[mt][0], a, b[0], b[1]);
          mma_bf16_16816(qacc[mt][1], a, b[2], b[3]);
        }
      }
      const int hq = ids(1) * rep + it / per_head;
      const size_t head = ((size_t)ids(2) * H + hq) * Tq;
      int* count = dq_count + ((size_t)ids(2) * H + hq) * ((Tq + FM_COLS - 1) / FM_COLS) + i0 / FM_COLS;
      block_wait_count(count, fm_visits_before(ids(0), i0, tiles_a, ROWS, first[ids(2)], past, Tq));
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = i0 + mt * 16 + gq + (e >= 2 ? 8 : 0);
            const int d = warp * 16 + nt * 8 + 2 * tq + (e & 1);
            if (i < Tq) ordered_add_f32(dq_acc + (head + i) * D + d, qacc[mt][nt][e]);
          }
      block_post_count(count);
    }
    __syncthreads();
  }
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) {
    const int d = dn * 8 + 2 * tq;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (jr[r] < S) {
        const size_t at = (((size_t)ids(2) * KV + ids(1)) * S + jr[r]) * D + d;
        *reinterpret_cast<__nv_bfloat162*>(dk + at) =
            __floats2bfloat162_rn(dkacc[dn][2 * r] * scale, dkacc[dn][2 * r + 1] * scale);
        *reinterpret_cast<__nv_bfloat162*>(dv + at) =
            __floats2bfloat162_rn(dvacc[dn][2 * r], dvacc[dn][2 * r + 1]);
      }
  }
}

// The kernels, with the row kernels' argument lists (flash_attn.cu) so that the host passes the
// same arguments to either; D in FA_ARGS must equal DIM.
#define FM_INSTANCE(DIM)                                                                       \
  extern "C" __global__ void __launch_bounds__(fm_fwd_threads(DIM)) flash_fwd_mma_d##DIM##_bf16( \
      const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,                  \
      const uint8_t* valid, const int* first, __nv_bfloat16* o, float* stats, FA_ARGS) {      \
    fm_forward<DIM, fm_fwd_warps(DIM), fm_fwd_stages(DIM)>(q, k, v, valid, first, o, stats, H, \
                                                           KV, Tq, S, cap, past, scale);       \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(fm_fwd_threads(DIM)) flash_dq_mma_d##DIM##_bf16( \
      const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,                  \
      const __nv_bfloat16* dout, const float* stats, const float* delta, const uint8_t* valid, \
      const int* first, __nv_bfloat16* dq, FA_ARGS) {                                          \
    fm_dq<DIM, fm_fwd_warps(DIM), fm_fwd_stages(DIM)>(q, k, v, dout, stats, delta, valid, first, \
                                                      dq, H, KV, Tq, S, cap, past, scale);     \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(fm_dkdv_threads(DIM)) flash_dkdv_mma_d##DIM##_bf16( \
      const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,                  \
      const __nv_bfloat16* dout, const float* stats, const float* delta, const uint8_t* valid, \
      const int* first, __nv_bfloat16* dk, __nv_bfloat16* dv, FA_ARGS) {                       \
    fm_dkdv<DIM, fm_dkdv_warps(DIM)>(q, k, v, dout, stats, delta, valid, first, dk, dv, H, KV, \
                                     Tq, S, past, scale);                                      \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(fm_dkdv_threads(DIM))                           \
      flash_dkdvq_mma_d##DIM##_bf16(                                                           \
          const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,              \
          const __nv_bfloat16* dout, const float* stats, const float* delta,                   \
          const uint8_t* valid, const int* first, __nv_bfloat16* dk, __nv_bfloat16* dv,        \
          float* dq_acc, int* dq_count, FA_ARGS) {                                             \
    fm_dkdv<DIM, fm_dkdv_warps(DIM), true>(q, k, v, dout, stats, delta, valid, first, dk, dv, H, \
                                           KV, Tq, S, past, scale, dq_acc, dq_count);          \
  }

FM_INSTANCE(64)
FM_INSTANCE(128)

// dQ = scale · dq_acc in bf16, n elements (the fused backward's last pass).
extern "C" __global__ void flash_dq_acc_bf16(const float* __restrict__ dq_acc,
                                             __nv_bfloat16* __restrict__ dq, int n, float scale) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dq[i] = __float2bfloat16_rn(dq_acc[i] * scale);
}
