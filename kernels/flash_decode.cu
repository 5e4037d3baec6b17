// Decode attention, pipelined: one query position per (sequence, query head), T == 1, the
// sampler's decode step. The semantics are flash.cuh's (src/fused/flash/mod.rs is the CPU
// twin); flash_attn.cu's split-K decode (`flash_decode_split_*`) computes the same function and
// stays for what this kernel does not take (head dims other than 64 and 128, more than
// FDP_MAXG query heads per KV head, K/V not starting on 16 bytes).
//
// A decode step reads the KV cache once and does ~2 FLOP per byte: it is bound by memory
// bandwidth, so the kernel is built to keep bytes in flight.
// - K and V reach shared memory by 16-byte cp.async (no registers), FDP_TILE keys a stage in a
//   ring of FDP_STAGES: while a tile is computed the next FDP_STAGES - 1 are in flight.
// - Block (x, KV head, sequence) reads its keys once for all G = H / KV query heads that share
//   them (GQA); a lane holds VEC numbers of a key row (16 bytes in f32 and bf16, 8 in E4M3; LPK
//   lanes a row) and the G queries' same
//   dims in registers; a row's dot products are reduced by xor shuffles in its LPK lanes.
// - The row's keys, from its first valid key, are cut into chunks of FDP_CHUNK keys. Each chunk
//   gives one partial (m, l, acc[D]) per query head, computed the same way whichever block
//   takes it. A block takes `cpb` consecutive chunks, its ring running on across them, and the
//   host picks cpb to fill the GPU: it changes which block computes a chunk, never a result bit.
// - The last of a (sequence, KV head)'s blocks to finish merges the row's partials into O and
//   the statistics (`fdp_merge`, counted by `block_arrive_last`): no second launch, which at one
//   row of 8k keys costs about as much as the kernel's bytes (kernels/NOTES.md, version 16).
//
// `flash_decode_paged_*` is the same kernel over a paged KV cache (src/model/paged.rs): the
// pool (blocks, KV, block, DH) read through each row's block table, the row's keys from its
// first position (FdpPaged); only where a key's bytes are fetched from differs, so a row read
// through its table has the dense kernel's bits on the same keys (kernels/check/flash_check.cu).
//
// So a row's attention depends only on its own keys, their positions from its first valid key,
// and its valid bits: not on its batch (other rows, left padding, the buffer's capacity) nor on
// cpb. kernels/check/flash_check.cu checks the bits of a row alone against the same row in a
// ragged batch, and cpb 1 against larger. A row that sees no key (first valid key after `past`)
// reads every key from column 0, as the other kernels do.
//
// The order within a chunk is fixed: slot s (LPK lanes) takes keys s·KPS .. s·KPS + KPS − 1 of
// every tile, with its own running (m, l, acc); at the chunk's end the slots of a warp merge by
// xor shuffles (symmetric: both lanes get the same bits), then the warps in warp order.
//
// An FP8 KV cache (`*_fp8` instances, issue #57: half a bf16 cache's bytes, so twice the
// KV-bandwidth bound): keys and values one E4M3 byte each (`fp8e4m3`, scale 1, as fp8.cu
// writes them and `model::qwen::fp8_e4m3` rounds them), the query and O in bf16. Tiles still travel by 16-byte
// cp.async (16 numbers); the compute reads 8 numbers a lane, as the bf16 kernel does, and E4M3
// → f32 is exact, so on the same values the FP8 kernel gives the bf16 kernel's bits
// (kernels/check/flash_check.cu checks it): an FP8 cache computes what the CPU's emulated one
// (E4M3 values held in bf16) does.
#include "flash.cuh"
#include "mma.cuh"
#include "fp8.cuh"

// The 16 bytes at p (shared memory, 16-byte aligned) as f32.
__device__ __forceinline__ void fdp_unpack(const float* p, float (&x)[4]) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  x[0] = fdp_f(w.x);
  x[1] = fdp_f(w.y);
  x[2] = fdp_f(w.z);
  x[3] = fdp_f(w.w);
}
// The 8 bytes at p (shared memory, 8-byte aligned) as f32: the hardware's exact conversion on a
// GPU (two numbers an instruction, through f16, which holds every E4M3 value), the bits above in
// the emulator.
__device__ __forceinline__ void fdp_unpack(const fp8e4m3* p, float (&x)[8]) {
#ifdef ACPO_EMU
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = fp8_e4m3_value(p[i].bits);
#else
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  const uint32_t u[2] = {w.x, w.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(u[i / 2] >> (16 * (i % 2))), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
#endif
}
__device__ __forceinline__ void fdp_unpack(const __nv_bfloat16* p, float (&x)[8]) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = fdp_f(u[i] << 16);  // bf16 is the high half of an f32
    x[2 * i + 1] = fdp_f(u[i] & 0xffff0000u);
  }
}

// Where the keys of one (sequence, KV head) are, as fdp_decode reads them: keys [lo, end) of
// the row, key j's DH numbers at key(j) and val(j), visible(j) whether the query sees key j.
//
// A dense cache buffer (B, KV, cap, DH) with its valid bits: the row's keys from its first
// valid one (column 0 for a row that sees no key), the causal limit `past`.
template <typename T>
struct FdpDenseRow {
  const T *kb, *vb;
  const uint8_t* valid_b;
  int lo, end, past, dh;
  __device__ const T* key(int j) const { return kb + (size_t)j * dh; }
  __device__ const T* val(int j) const { return vb + (size_t)j * dh; }
  __device__ bool visible(int j) const { return valid_b[j] && j <= past; }
};
template <typename T>
struct FdpDense {
  const T *k, *v;
  const uint8_t* valid;
  const int* first;
  int KV, S, cap, past;
  template <int DH>
  __device__ FdpDenseRow<T> at(int bi, int g) const {
    const int f = first[bi];
    const size_t base = ((size_t)bi * KV + g) * cap * DH;
    return {k + base, v + base, valid + (size_t)bi * S, f > past ? 0 : f, S, past, DH};
  }
};

// A paged pool (blocks, KV, block, DH) (src/model/paged.rs): the row's keys are its first
// lens[bi] positions, position j in block table[j / block], row j % block; the query (the last
// position) sees every one. A row's chunks start at its key 0 as a dense row's start at its
// first valid key, so a row read through its table has the bits of the same keys read dense.
template <typename T>
struct FdpPagedRow {
  const T *k, *v;
  const unsigned* table;
  int lo, end, g, KV, block, dh;
  __device__ size_t at(int j) const {
    return (((size_t)table[j / block] * KV + g) * block + j % block) * dh;
  }
  __device__ const T* key(int j) const { return k + at(j); }
  __device__ const T* val(int j) const { return v + at(j); }
  __device__ bool visible(int) const { return true; }
};
template <typename T>
struct FdpPaged {
  const T *k, *v;
  const unsigned* tables;
  const unsigned* lens;
  int KV, nblk, block;
  template <int DH>
  __device__ FdpPagedRow<T> at(int bi, int g) const {
    return {k, v, tables + (size_t)bi * nblk, 0, (int)lens[bi], g, KV, block, DH};
  }
};

// The block's warps' running (m, l) and their sums for dim d merged in warp order: a chunk's
// partial, or a row's O before its division. Warps with l = 0 (no key) are skipped.
template <int DH>
__device__ __forceinline__ void fdp_warps_in_order(const float (&wml)[FDP_THREADS / 32][2],
                                                   const float (&wacc)[FDP_THREADS / 32][DH],
                                                   int d, float& mx, float& sum, float& acc) {
  mx = -INFINITY, sum = 0.0f, acc = 0.0f;
#pragma unroll
  for (int w = 0; w < FDP_THREADS / 32; ++w) mx = fmaxf(mx, wml[w][0]);
#pragma unroll
  for (int w = 0; w < FDP_THREADS / 32; ++w)
    if (wml[w][1] > 0.0f) {
      const float e = expf(wml[w][0] - mx);
      sum += wml[w][1] * e;
      acc += wacc[w][d] * e;
    }
}

// The merge of one (sequence, KV head)'s partials, by the last of its blocks: for each of its G
// query heads, O = Σ_c e^(m_c − m) acc_c / Σ_c e^(m_c − m) l_c over the row's chunks c < nc (the
// ones that hold keys, each with l_c ≥ 1), m the largest m_c, and the statistics (m, 1/l) as
// flash_decode_combine_* gives them. Warp w takes chunks w, w + WARPS, … in order with a running
// (m, l, acc) as a slot does in a chunk, all G heads at once, a lane DH/32 of the dims; then the
// warps in warp order. The order depends only on the row's own
// chunks, which start at its first key: a row's bits are the same alone or in any batch.
template <typename Q, int DH, int GM>
__device__ void fdp_merge(const float* __restrict__ part, Q* __restrict__ o,
                          float* __restrict__ stats, int nchunk, int nc, size_t row0, int G,
                          float (&wml)[FDP_THREADS / 32][2], float (&wacc)[FDP_THREADS / 32][DH]) {
  constexpr int WARPS = FDP_THREADS / 32, PAIRS = DH / 64;  // a lane's dims: PAIRS float2s
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float m[GM], l[GM], a[GM][2 * PAIRS];
#pragma unroll
  for (int h = 0; h < GM; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 2 * PAIRS; ++e) a[h][e] = 0.0f;
  }
  // AHEAD chunks' loads, every head's, issued before any of them is used: a warp waits for L2
  // once per AHEAD chunks, not once per chunk and head
  constexpr int AHEAD = FDP_MERGE_LOADS / GM > 1 ? FDP_MERGE_LOADS / GM : 1;
  for (int c0 = warp; c0 < nc; c0 += WARPS * AHEAD) {
    float mc[AHEAD][GM], lc[AHEAD][GM], x[AHEAD][GM][2 * PAIRS];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      const int c = c0 + u * WARPS;
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        mc[u][h] = -INFINITY, lc[u][h] = 0.0f;
#pragma unroll
        for (int e = 0; e < 2 * PAIRS; ++e) x[u][h][e] = 0.0f;
        if (h < G && c < nc) {
          const float* pc = part + ((row0 + h) * nchunk + c) * (2 + DH);
          mc[u][h] = ld_l2(pc), lc[u][h] = ld_l2(pc + 1);
#pragma unroll
          for (int p = 0; p < PAIRS; ++p) {
            const float2 y = ld_l2(reinterpret_cast<const float2*>(pc + 2 + 64 * p + 2 * lane));
            x[u][h][2 * p] = y.x, x[u][h][2 * p + 1] = y.y;
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        if (h < G) {
          // every chunk below nc holds keys (l ≥ 1); the selects only keep one that did not
          // (l = 0, acc never written) or a c past nc out of the sums
          const bool live = lc[u][h] > 0.0f;
          const float mn = live ? fmaxf(m[h], mc[u][h]) : m[h];
          const float ea = live ? expf(m[h] - mn) : 1.0f;
          const float eb = live ? expf(mc[u][h] - mn) : 0.0f;
          l[h] = l[h] * ea + (live ? lc[u][h] : 0.0f) * eb;
#pragma unroll
          for (int e = 0; e < 2 * PAIRS; ++e)
            a[h][e] = a[h][e] * ea + (live ? x[u][h][e] : 0.0f) * eb;
          m[h] = mn;
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < GM; ++h) {
    if (h < G) {
      if (lane == 0) wml[warp][0] = m[h], wml[warp][1] = l[h];
#pragma unroll
      for (int p = 0; p < PAIRS; ++p) {
        wacc[warp][64 * p + 2 * lane] = a[h][2 * p];
        wacc[warp][64 * p + 2 * lane + 1] = a[h][2 * p + 1];
      }
      __syncthreads();
      if (tid < DH) {
        float mx, sum, acc;
        fdp_warps_in_order<DH>(wml, wacc, tid, mx, sum, acc);
        const float inv = 1.0f / sum;
        const size_t row = row0 + h;
        o[row * DH + tid] = from_f<Q>(acc * inv);
        if (tid == 0) stats[2 * row] = mx, stats[2 * row + 1] = inv;
      }
      __syncthreads();  // wml and wacc take the next head
    }
  }
}

// grid (ceil(nchunk / cpb), KV, B), block FDP_THREADS, fdp_smem(DH, sizeof(T)) bytes of dynamic
// shared memory. part: (B, H, nchunk, 2 + DH) f32 = m, l, acc, scratch the kernel's own;
// nchunk = ceil(S / FDP_CHUNK), S the longest row's keys. O (B, H, DH) in Q and the statistics
// (B, H, 2) are written by each row's last block; count: (B, KV) ints, zero before the launch
// and left zero after it (the host keeps one buffer and never clears it).
template <typename Q, typename T, int DH, int GT, typename Rows>
__device__ void fdp_decode(const Q* __restrict__ q, const Rows rows, float* __restrict__ part,
                           Q* __restrict__ o, float* __restrict__ stats, int* __restrict__ count,
                           int nchunk, int cpb, int H, int KV, int D, float scale) {
  constexpr int LD = 16 / (int)sizeof(T);     // elements a 16-byte cp.async moves
  constexpr int PPR = DH / LD;                // 16-byte pieces a key row
  constexpr int VEC = sizeof(T) == 4 ? 4 : 8; // elements a lane computes (16 bytes of bf16)
  constexpr int LPK = DH / VEC;               // lanes per key row
  constexpr int SLOTS = FDP_THREADS / LPK;    // rows in work at once
  constexpr int KPS = FDP_TILE / SLOTS;       // keys per slot and tile
  constexpr int TPC = FDP_CHUNK / FDP_TILE;   // tiles per chunk
  constexpr int WARPS = FDP_THREADS / 32;
  static_assert(LPK <= 32 && 32 % LPK == 0 && FDP_TILE % SLOTS == 0, "a row in one warp");
  static_assert(FDP_CHUNK == FDP_THREADS && FDP_CHUNK % FDP_TILE == 0, "one valid bit a thread");
  static_assert(FDP_STAGES >= 2, "a ring");
  // GT query heads per KV head fixed at compile time (1..FDP_MAXG), or 0: H / KV, up to
  // FDP_MAXG, read at run time; the registers are sized for GM heads either way
  constexpr int GM = GT > 0 ? GT : FDP_MAXG;
  static_assert(GM <= FDP_MAXG, "at most FDP_MAXG query heads per KV head");
  ACPO_DYNAMIC_SMEM(smem);
  if (threadIdx.x == 0 && (D != DH || dynamic_smem_bytes() < (unsigned)fdp_smem(DH, sizeof(T)) ||
                          (GT > 0 && H != GT * KV) || H > GM * KV))
    kernel_trap();
  T* tiles = reinterpret_cast<T*>(smem);  // [FDP_STAGES][K, V][FDP_TILE][DH]
  __shared__ float bias_s[FDP_CHUNK];
  __shared__ float wml[WARPS][2];
  __shared__ float wacc[WARPS][DH];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int sub = tid % LPK, slot = tid / LPK;
  const int bi = blockIdx.z, g = blockIdx.y, G = GT > 0 ? GT : H / KV, h0 = g * G;
  const auto src = rows.template at<DH>(bi, g);
  const int lo = src.lo, S = src.end;
  // chunks [c0, c1) are this block's, [c0, cf) of them hold keys, [jbeg, jend) are their keys
  const int row_chunks = (S - lo + FDP_CHUNK - 1) / FDP_CHUNK;
  const int c0 = blockIdx.x * cpb, c1 = min(nchunk, c0 + cpb);
  const int cf = min(c1, max(c0, row_chunks));
  const int jbeg = lo + c0 * FDP_CHUNK, jend = min(S, lo + cf * FDP_CHUNK);
  const int ntile = cf > c0 ? (jend - jbeg + FDP_TILE - 1) / FDP_TILE : 0;

  // Tile t into stage t % FDP_STAGES (keys past jend zero-filled); a group every call, empty or
  // not, so that a wait counts tiles.
  auto load = [&](int t) {
    if (t < ntile) {
      T* ks = tiles + (size_t)(t % FDP_STAGES) * 2 * FDP_TILE * DH;
      T* vs = ks + FDP_TILE * DH;
      const int j0 = jbeg + t * FDP_TILE;
      for (int x = tid; x < FDP_TILE * PPR; x += FDP_THREADS) {
        const int r = x / PPR, c = (x % PPR) * LD, j = j0 + r;
        const bool in = j < jend;
        const int jr = in ? j : j0;
        cp_async16(ks + r * DH + c, src.key(jr) + c, in);
        cp_async16(vs + r * DH + c, src.val(jr) + c, in);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < FDP_STAGES - 1; ++s) load(s);

  // While the first tiles travel: this lane's dims of the G queries, and the valid bit of this
  // thread's key in the first chunk (a chunk's bits are loaded a chunk ahead).
  float qr[GM][VEC];
#pragma unroll
  for (int h = 0; h < GM; ++h)
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      qr[h][e] = h < G ? to_f(q[((size_t)bi * H + h0 + h) * DH + sub * VEC + e]) : 0.0f;
  bool vis = jbeg + tid < jend && src.visible(jbeg + tid);

  float m[GM], l[GM], acc[GM][VEC];
  auto reset = [&]() {
#pragma unroll
    for (int h = 0; h < GM; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[h][e] = 0.0f;
    }
  };
  reset();

  for (int t = 0; t < ntile; ++t) {
    const int tc = t % TPC;
    if (tc == 0) {
      // every thread is past the last chunk's merge, whose barriers follow its last read
      bias_s[tid] = vis ? 0.0f : FA_MASKED;
      const int jn = jbeg + (t + TPC) * FDP_TILE + tid;
      vis = jn < jend && src.visible(jn);
    }
    cp_async_wait<FDP_STAGES - 2>();
    __syncthreads();  // tile t and the chunk's bias are in; stage (t - 1) % FDP_STAGES is free
    load(t + FDP_STAGES - 1);
    const T* ks = tiles + (size_t)(t % FDP_STAGES) * 2 * FDP_TILE * DH;
    const T* vs = ks + FDP_TILE * DH;
    const int jt = jbeg + t * FDP_TILE;

    // scores of this slot's keys, then p = e^(s - m_new)
    float p[GM][KPS];
#pragma unroll
    for (int u = 0; u < KPS; ++u) {
      const int r = slot * KPS + u;
      float kx[VEC];
      fdp_unpack(ks + r * DH + sub * VEC, kx);
      const bool in = jt + r < jend;
      const float b = bias_s[tc * FDP_TILE + r];
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        if (h < G) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < VEC; ++e) dot += qr[h][e] * kx[e];
#pragma unroll
          for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
          // a hidden key's bias is -1e9, finite; -inf only past the row's keys
          p[h][u] = in ? dot * scale + b : -INFINITY;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < GM; ++h) {
      if (h < G) {
        float mt = m[h];
#pragma unroll
        for (int u = 0; u < KPS; ++u) mt = fmaxf(mt, p[h][u]);
        const float alpha = mt == -INFINITY ? 1.0f : expf(m[h] - mt);
        float ps = 0.0f;
#pragma unroll
        for (int u = 0; u < KPS; ++u) {
          p[h][u] = p[h][u] == -INFINITY ? 0.0f : expf(p[h][u] - mt);
          ps += p[h][u];
        }
        l[h] = l[h] * alpha + ps;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[h][e] *= alpha;
        m[h] = mt;
      }
    }
#pragma unroll
    for (int u = 0; u < KPS; ++u) {
      float vx[VEC];
      fdp_unpack(vs + (slot * KPS + u) * DH + sub * VEC, vx);
#pragma unroll
      for (int h = 0; h < GM; ++h)
        if (h < G)
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[h][e] += p[h][u] * vx[e];
    }

    if (tc == TPC - 1 || t == ntile - 1) {
      // The chunk's partial per query head: the slots of a warp by xor shuffles, then the
      // warps in order.
      const int c = c0 + t / TPC;
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        if (h < G) {
          float mh = m[h], lh = l[h];
#pragma unroll
          for (int o = 16; o >= LPK; o >>= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, mh, o);
            const float lo2 = __shfl_xor_sync(0xffffffffu, lh, o);
            const float mx = fmaxf(mh, mo);
            const float ea = lh > 0.0f ? expf(mh - mx) : 0.0f;
            const float eb = lo2 > 0.0f ? expf(mo - mx) : 0.0f;
            lh = lh * ea + lo2 * eb;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              const float ao = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
              acc[h][e] = acc[h][e] * ea + ao * eb;
            }
            mh = mx;
          }
          if (lane < LPK) {
            if (sub == 0) {
              wml[warp][0] = mh;
              wml[warp][1] = lh;
            }
#pragma unroll
            for (int e = 0; e < VEC; ++e) wacc[warp][sub * VEC + e] = acc[h][e];
          }
          __syncthreads();
          if (tid < DH) {
            float mx, sum, a;
            fdp_warps_in_order<DH>(wml, wacc, tid, mx, sum, a);
            float* pr = part + (((size_t)bi * H + h0 + h) * nchunk + c) * (2 + DH);
            pr[2 + tid] = a;
            if (tid == 0) {
              pr[0] = mx;
              pr[1] = sum;
            }
          }
          __syncthreads();
        }
      }
      reset();
    }
  }
  // This block's chunks past the row's keys have no partial: the merge reads the row's own.
  int* const row_count = count + (size_t)bi * KV + g;
  if (!block_arrive_last(row_count, gridDim.x)) return;
  fdp_merge<Q, DH, GM>(part, o, stats, nchunk, min(nchunk, row_chunks), (size_t)bi * H + h0, G, wml,
                   wacc);
  block_reset_count(row_count);
}

// q and O in Q, the keys and values in T; GT query heads per KV head (GSFX names it: `_g2`), or 0
// for any up to FDP_MAXG (no suffix). Fixed at 2 (Qwen3-1.7B) or 4 (Qwen3-4B and 8B), the
// registers hold only those heads: ~150–170 at head dim 128, so 3 blocks an SM instead of 2 in
// bf16 and FP8, where shared memory allows 3 (f32 at head dim 128 fits 1 either way; NOTES,
// version 16); the host takes them where H / KV says.
#define FDP_ENTRY(Q, T, SFX, DH, GT, GSFX)                                                      \
  extern "C" __global__ void __launch_bounds__(FDP_THREADS, GT > 0 ? 3 : 1)                     \
      flash_decode_pipe_d##DH##_##SFX##GSFX(const Q* q, const T* k, const T* v,                 \
                                            const uint8_t* valid, const int* first, float* part, \
                                            Q* o, float* stats, int* count, int nchunk, int cpb, \
                                            FA_ARGS) {                                          \
    (void)Tq;                                                                                   \
    fdp_decode<Q, T, DH, GT>(q, FdpDense<T>{k, v, valid, first, KV, S, cap, past}, part, o,    \
                             stats, count, nchunk, cpb, H, KV, D, scale);                       \
  }                                                                                             \
  /* The same through a paged pool's block tables (B, nblk), lens (B): keys a row. */           \
  extern "C" __global__ void __launch_bounds__(FDP_THREADS, GT > 0 ? 3 : 1)                     \
      flash_decode_paged_d##DH##_##SFX##GSFX(                                                   \
          const Q* q, const T* k, const T* v, const unsigned* tables, const unsigned* lens,     \
          float* part, Q* o, float* stats, int* count, int nchunk, int cpb, int nblk,           \
          int block, int H, int KV, int D, float scale) {                                       \
    fdp_decode<Q, T, DH, GT>(q, FdpPaged<T>{k, v, tables, lens, KV, nblk, block}, part, o,     \
                             stats, count, nchunk, cpb, H, KV, D, scale);                       \
  }
#define FDP_INSTANCE(Q, T, SFX, DH)   \
  FDP_ENTRY(Q, T, SFX, DH, 0, )       \
  FDP_ENTRY(Q, T, SFX, DH, 2, _g2)    \
  FDP_ENTRY(Q, T, SFX, DH, 4, _g4)

FDP_INSTANCE(__nv_bfloat16, __nv_bfloat16, bf16, 64)
FDP_INSTANCE(__nv_bfloat16, __nv_bfloat16, bf16, 128)
FDP_INSTANCE(float, float, f32, 64)
FDP_INSTANCE(float, float, f32, 128)
// An FP8 cache under a bf16 model: O in bf16.
FDP_INSTANCE(__nv_bfloat16, fp8e4m3, fp8, 64)
FDP_INSTANCE(__nv_bfloat16, fp8e4m3, fp8, 128)
