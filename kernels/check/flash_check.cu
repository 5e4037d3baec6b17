// The flash attention kernels alone, without the Rust build: every forward path (the row
// kernel, the tensor-core forward, the split-K decode) and both backward paths (the row kernels,
// the tensor-core dQ and dK/dV) against a float64 reference on random bf16 inputs (left padding,
// rows that see no key, a whole sequence of padding, GQA, a cache buffer with room beyond its
// keys), each output poisoned with NaN before its launch; then, on a GPU, each timed with CUDA
// events (median of the repeats) at Qwen3-1.7B's shapes, the row kernels beside the tensor-core
// ones in the same run (kernels/NOTES.md).
//
//   on a GPU:    nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels kernels/check/flash_check.cu -o fa && ./fa
//   on the CPU:  g++ -O2 -std=c++17 -DACPO_EMU -Ikernels -x c++ kernels/check/flash_check.cu -o fa && ./fa
//
// The pipelined decode (flash_decode.cu) is checked the same way at the decode shapes that
// matter (one row of 8,192 keys, 64 rows of 1,024 and 2,047, ragged rows), and bit for bit: a
// row alone against the same row in a ragged batch, and every chunks-per-block choice against
// one chunk a block.
//
// The CPU build runs the same kernels in kernels/check/cuda_emu.hpp's emulator, checks only, at
// small shapes (tests/it/kernels.rs runs it in `cargo test`); `./fa --seeds N` repeats the
// tensor-core checks under N schedules (thread orders, a lagging warp, cp.async landing early);
// `./fa --mma` runs the tensor-core checks alone.
//
// The reference adds a hidden key's -1e9 in f32, as the kernels and their CPU twin do: a row
// that sees no key then averages V uniformly (src/fused/flash/mod.rs).
#include "flash_attn.cu"
#include "flash_mma.cu"
#include "flash_decode.cu"
#include "fp8.cu"
#include "check/harness.hpp"
#include <optional>

// A shape: B sequences, H query heads over KV heads, T query positions after `past` cached
// keys, head dim D; sequence 0 has `pad` leading invalid keys (sequence 1 too when pad1), the
// K/V buffers have `cap` columns (0: S).
struct Case {
  int B, H, KV, T, past, D, pad, cap;
  bool all_pad1 = false;  // sequence 1 is padding throughout (every row blind)
};

// The pipelined decode's instance for G query heads per KV head, as the host picks it
// (src/fused/flash/cuda.rs, `group_suffix`): compiled for 2 or 4, else the one for any count;
// `generic_decode` forces the latter (check_group_instance compares them).
static bool generic_decode = false;
#define LAUNCH_G(name, G, grid, block, smem, ...)                                          \
  do {                                                                                     \
    if ((G) == 2 && !generic_decode) LAUNCH(name##_g2, grid, block, smem, __VA_ARGS__);    \
    else if ((G) == 4 && !generic_decode) LAUNCH(name##_g4, grid, block, smem, __VA_ARGS__); \
    else LAUNCH(name, grid, block, smem, __VA_ARGS__);                                     \
  } while (0)

struct Inputs {
  Case c;
  int S, cap;
  std::vector<float> q, k, v, dout;
  std::vector<uint8_t> valid;
  bf *dq_, *dk_, *dv_, *ddo;
  uint8_t* dvalid;
  int* dfirst;
  int* dcount;  // the pipelined decode's arrival counters, (B, KV): zero, and left zero
  size_t nq, nk;
  explicit Inputs(Case c_) : c(c_) {
    S = c.past + c.T;
    cap = c.cap < S ? S : c.cap;
    nq = (size_t)c.B * c.H * c.T * c.D;
    nk = (size_t)c.B * c.KV * cap * c.D;
    q.resize(nq), k.resize(nk), v.resize(nk), dout.resize(nq);
    for (auto& x : q) x = bfr(rnd());
    for (auto& x : k) x = bfr(rnd());
    for (auto& x : v) x = bfr(rnd());
    for (auto& x : dout) x = bfr(rnd());
    valid.resize((size_t)c.B * S);
    for (int b = 0; b < c.B; ++b)
      for (int j = 0; j < S; ++j)
        valid[b * S + j] = (b == 0 && j < c.pad) || (b == 1 && c.all_pad1) ? 0 : 1;
    dq_ = upload(q), dk_ = upload(k), dv_ = upload(v), ddo = upload(dout);
    dvalid = (uint8_t*)dalloc(valid.size());
    h2d(dvalid, valid.data(), valid.size());
    dfirst = (int*)dalloc(c.B * 4);
    const std::vector<int> zeros((size_t)c.B * c.KV, 0);
    dcount = (int*)dalloc(zeros.size() * 4);
    h2d(dcount, zeros.data(), zeros.size() * 4);
  }
  static bf* upload(const std::vector<float>& x) {
    std::vector<bf> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16_rn(x[i]);
    bf* d = (bf*)dalloc(h.size() * 2);
    h2d(d, h.data(), h.size() * 2);
    return d;
  }
  ~Inputs() {
    dfree(dq_), dfree(dk_), dfree(dv_), dfree(ddo), dfree(dvalid), dfree(dfirst), dfree(dcount);
  }
  // Whether the decode left every arrival counter at zero, as the next launch needs it (counted
  // as a failure if not).
  void check_counts_zero(const char* what) const {
    std::vector<int> h((size_t)c.B * c.KV);
    d2h(h.data(), dcount, h.size() * 4);
    for (int x : h)
      if (x != 0) {
        printf("%s: FAILED (an arrival counter left at %d, not 0)\n", what, x);
        failures++;
        return;
      }
  }
  float scale() const { return 1.0f / sqrtf((float)c.D); }
};

static std::vector<float> download_bf(const bf* d, size_t n) {
  std::vector<bf> h(n);
  d2h(h.data(), d, n * 2);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
  return out;
}

// The float64 reference: O, the statistics, and the gradients of Σ O ⊙ dO.
struct Reference {
  std::vector<double> o, m, l, dq, dk, dv;
  explicit Reference(const Inputs& in) {
    const Case& c = in.c;
    const int S = in.S, G = c.H / c.KV;
    const float scale = in.scale();
    o.assign(in.nq, 0), dq.assign(in.nq, 0), dk.assign(in.nk, 0), dv.assign(in.nk, 0);
    m.assign(in.nq / c.D, 0), l.assign(in.nq / c.D, 0);
    std::vector<double> p(S), dp(S);
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < c.H; ++h)
        for (int i = 0; i < c.T; ++i) {
          const size_t row = ((size_t)b * c.H + h) * c.T + i;
          const float* qr = &in.q[row * c.D];
          const size_t kvh = ((size_t)b * c.KV + h / G) * in.cap;
          double mx = -1e300;
          for (int j = 0; j < S; ++j) {
            const float* kr = &in.k[(kvh + j) * c.D];
            double d = 0;
            for (int x = 0; x < c.D; ++x) d += (double)qr[x] * kr[x];
            const bool vis = in.valid[b * S + j] && j <= c.past + i;
            p[j] = (float)(d * scale) + (vis ? 0.0f : -1e9f);
            mx = std::max(mx, p[j]);
          }
          double sum = 0;
          for (int j = 0; j < S; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int j = 0; j < S; ++j) p[j] /= sum;
          m[row] = mx, l[row] = sum;
          const float* dor = &in.dout[row * c.D];
          double delta = 0;
          for (int x = 0; x < c.D; ++x) {
            double acc = 0;
            for (int j = 0; j < S; ++j) acc += p[j] * in.v[(kvh + j) * c.D + x];
            o[row * c.D + x] = acc;
            delta += acc * dor[x];
          }
          for (int j = 0; j < S; ++j) {
            double d = 0;
            for (int x = 0; x < c.D; ++x) d += (double)dor[x] * in.v[(kvh + j) * c.D + x];
            dp[j] = p[j] * (d - delta);  // dS
          }
          for (int j = 0; j < S; ++j)
            for (int x = 0; x < c.D; ++x) {
              dq[row * c.D + x] += scale * dp[j] * in.k[(kvh + j) * c.D + x];
              dk[(kvh + j) * c.D + x] += scale * dp[j] * qr[x];
              dv[(kvh + j) * c.D + x] += p[j] * dor[x];
            }
        }
  }
};

static void report(const char* what, const Case& c, double err, double limit) {
  const bool ok = err < limit;
  printf("%-12s B%d H%d KV%d T%d past%d D%d pad%d%s: rel err %.2e %s\n", what, c.B, c.H, c.KV,
         c.T, c.past, c.D, c.pad, c.all_pad1 ? " +blind seq" : "", err, ok ? "ok" : "FAILED");
  if (!ok) failures++;
}

enum Path { ROW, MMA, DECODE };

// The forward by `path`: O (B, H, T, D) and stats (B, H, T, 2) on the device.
static void forward(const Inputs& in, Path path, bf* o, float* stats) {
  const Case& c = in.c;
  const int S = in.S, cap = in.cap;
  const float scale = in.scale();
  LAUNCH(flash_first_valid, dim3(c.B), dim3(256), 0, in.dvalid, S, in.dfirst);
  if (path == ROW) {
    LAUNCH(flash_fwd_bf16, dim3((c.T + 3) / 4, c.H, c.B), dim3(128), 0, in.dq_, in.dk_, in.dv_,
           in.dvalid, in.dfirst, o, stats, c.H, c.KV, c.T, S, cap, c.D, c.past, scale);
  } else if (path == DECODE) {
    // the partials in a buffer kept from call to call (grown when too small), so that a timing
    // counts the kernels, not an allocation (the runs before version 5 counted a cudaMalloc and
    // a cudaFree too)
    static float* part = nullptr;
    static size_t part_n = 0;
    const int nsplit = (S + FD_SPLIT - 1) / FD_SPLIT;
    const size_t n = (size_t)c.B * c.H * nsplit * (c.D + 2);
    if (n > part_n) {
      if (part) dfree(part);
      part = (float*)dalloc(n * 4), part_n = n;
    }
    LAUNCH(flash_decode_split_bf16, dim3(nsplit, c.KV, c.B), dim3(128), 0, in.dq_, in.dk_,
           in.dv_, in.dvalid, in.dfirst, part, nsplit, c.H, c.KV, c.T, S, cap, c.D, c.past, scale);
    LAUNCH(flash_decode_combine_bf16, dim3(c.H, c.B), dim3(128), 0, part, o, stats, nsplit, c.H,
           c.D);
  } else {
    const dim3 grid((c.T + fm_fwd_rows(c.D) - 1) / fm_fwd_rows(c.D), c.H, c.B);
    if (c.D == 128)
      LAUNCH(flash_fwd_mma_d128_bf16, grid, dim3(fm_fwd_threads(128)), fm_smem_fwd(128), in.dq_,
             in.dk_, in.dv_, in.dvalid, in.dfirst, o, stats, c.H, c.KV, c.T, S, cap, c.D, c.past,
             scale);
    else
      LAUNCH(flash_fwd_mma_d64_bf16, grid, dim3(fm_fwd_threads(64)), fm_smem_fwd(64), in.dq_,
             in.dk_, in.dv_, in.dvalid, in.dfirst, o, stats, c.H, c.KV, c.T, S, cap, c.D, c.past,
             scale);
  }
}

// The backward by `path` from the forward's O and stats: dQ, dK, dV on the device (cap == S).
static void backward(const Inputs& in, Path path, const bf* o, const float* stats, float* delta,
                     bf* dq, bf* dk, bf* dv) {
  const Case& c = in.c;
  const int S = in.S, rows = c.B * c.H * c.T;
  const float scale = in.scale();
  LAUNCH(flash_delta_bf16, dim3((rows + 3) / 4), dim3(128), 0, o, in.ddo, delta, rows, c.D);
  if (path == ROW) {
    LAUNCH(flash_dq_bf16, dim3((c.T + 3) / 4, c.H, c.B), dim3(128), 0, in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dq, c.H, c.KV, c.T, S, S, c.D, c.past,
           scale);
    LAUNCH(flash_dkdv_bf16, dim3((S + 3) / 4, c.KV, c.B), dim3(128), 0, in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, c.H, c.KV, c.T, S, S, c.D, c.past,
           scale);
    return;
  }
  const dim3 gq((c.T + fm_fwd_rows(c.D) - 1) / fm_fwd_rows(c.D), c.H, c.B),
      gk((S + fm_dkdv_rows(c.D) - 1) / fm_dkdv_rows(c.D), c.KV, c.B);
  if (c.D == 128) {
    LAUNCH(flash_dq_mma_d128_bf16, gq, dim3(fm_fwd_threads(128)), fm_smem_dq(128), in.dq_, in.dk_,
           in.dv_, in.ddo, stats, delta, in.dvalid, in.dfirst, dq, c.H, c.KV, c.T, S, S, c.D,
           c.past, scale);
    LAUNCH(flash_dkdv_mma_d128_bf16, gk, dim3(fm_dkdv_threads(128)), fm_smem_dkdv(128), in.dq_, in.dk_,
           in.dv_, in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, c.H, c.KV, c.T, S, S, c.D,
           c.past, scale);
  } else {
    LAUNCH(flash_dq_mma_d64_bf16, gq, dim3(fm_fwd_threads(64)), fm_smem_dq(64), in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dq, c.H, c.KV, c.T, S, S, c.D, c.past, scale);
    LAUNCH(flash_dkdv_mma_d64_bf16, gk, dim3(fm_dkdv_threads(64)), fm_smem_dkdv(64), in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, c.H, c.KV, c.T, S, S, c.D, c.past,
           scale);
  }
}

// The backward in 5 products (flash_dkdvq_*): δ, then dK, dV and dQ from one kernel, dQ added
// up in the f32 buffer `acc` in key-block order (`count`: its tiles' counters and the blocks'
// ticket; both zeroed here), then rounded; with up to `resident` blocks resident at once in the emulator
// (interleaving), nothing different on a GPU.
static void backward5(const Inputs& in, const bf* o, const float* stats, float* delta, float* acc,
                      int* count, bf* dq, bf* dk, bf* dv, int resident) {
  const Case& c = in.c;
  const int S = in.S, rows = c.B * c.H * c.T, ntiles = (c.T + FM_COLS - 1) / FM_COLS;
  const float scale = in.scale();
  LAUNCH(flash_delta_bf16, dim3((rows + 3) / 4), dim3(128), 0, o, in.ddo, delta, rows, c.D);
  dzero(acc, in.nq * 4);
  dzero(count, ((size_t)c.B * c.H * ntiles + 1) * 4);
  const dim3 gk((S + fm_dkdv_rows(c.D) - 1) / fm_dkdv_rows(c.D), c.KV, c.B);
  use_residency(resident);
  if (c.D == 128)
    LAUNCH(flash_dkdvq_mma_d128_bf16, gk, dim3(fm_dkdv_threads(128)), fm_smem_dkdvq(128), in.dq_,
           in.dk_, in.dv_, in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, acc, count, c.H,
           c.KV, c.T, S, S, c.D, c.past, scale);
  else
    LAUNCH(flash_dkdvq_mma_d64_bf16, gk, dim3(fm_dkdv_threads(64)), fm_smem_dkdvq(64), in.dq_,
           in.dk_, in.dv_, in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, acc, count, c.H,
           c.KV, c.T, S, S, c.D, c.past, scale);
  use_residency(1);
  LAUNCH(flash_dq_acc_bf16, dim3((unsigned)((in.nq + 255) / 256)), dim3(256), 0, acc, dq,
         (int)in.nq, scale);
}

// The f32 sums a 5-product backward rounded dQ from (the bits another order of the adds would
// change; bf16's rounding hides most such changes).
static std::vector<float> backward5_sums(const Inputs& in, const bf* o, const float* stats,
                                         float* delta, bf* dq, bf* dk, bf* dv, int resident) {
  const int ntiles = (in.c.T + FM_COLS - 1) / FM_COLS;
  float* acc = (float*)dalloc(in.nq * 4);
  int* count = (int*)dalloc(((size_t)in.c.B * in.c.H * ntiles + 1) * 4);
  backward5(in, o, stats, delta, acc, count, dq, dk, dv, resident);
  std::vector<float> sums(in.nq);
  d2h(sums.data(), acc, in.nq * 4);
  dfree(acc), dfree(count);
  return sums;
}

static std::vector<uint16_t> bits_of(const bf* d, size_t n) {
  std::vector<uint16_t> h(n);
  d2h(h.data(), d, n * 2);
  return h;
}

// The 5-product backward against the float64 reference, and bit for bit: its dK and dV are the
// 7-product kernels' (`dk7`, `dv7`), and dQ's f32 sums are the same with 1 and with 3 blocks
// resident (in the emulator: blocks interleaving, in another order under each schedule; on a
// GPU, two runs).
static void check_backward5(const Inputs& in, const Reference& ref, const bf* o,
                            const float* stats, float* delta, const bf* dk7, const bf* dv7) {
  const Case& c = in.c;
  bf *dq = (bf*)dalloc(in.nq * 2), *dk = (bf*)dalloc(in.nk * 2), *dv = (bf*)dalloc(in.nk * 2);
  std::vector<float> first;
  // on a GPU the two runs are the hardware's schedules: the same sums, or the order leaks
  for (int resident : {1, 3}) {
    poison(dq, in.nq * 2), poison(dk, in.nk * 2), poison(dv, in.nk * 2);
    const std::vector<float> got = backward5_sums(in, o, stats, delta, dq, dk, dv, resident);
    if (resident == 1) {
      first = got;
      const double e = rel_err(download_bf(dq, in.nq), ref.dq);
      report("mma5 bwd", c, e, 2e-2);
      if (bits_of(dk, in.nk) != bits_of(dk7, in.nk) || bits_of(dv, in.nk) != bits_of(dv7, in.nk)) {
        printf("mma5 bwd: dK or dV differs from the 7-product kernel's FAILED\n");
        failures++;
      }
    } else if (std::memcmp(got.data(), first.data(), got.size() * 4) != 0) {
      printf("mma5 bwd: dQ's sums differ from one run to the next (%d blocks resident) FAILED\n",
             resident);
      failures++;
    }
  }
  dfree(dq), dfree(dk), dfree(dv);
}

// A forward's error against the reference: O's relative error, or the statistics' (m relative,
// 1/l against l) scaled so that 1e-3 there weighs as 1e-2 in O, whichever is larger.
static double forward_err(const Reference& ref, const std::vector<float>& got,
                          const std::vector<float>& sg) {
  double serr = 0;
  for (size_t r = 0; r < ref.m.size(); ++r) {
    const double e = std::fabs(sg[2 * r] - ref.m[r]) / std::max(1.0, std::fabs(ref.m[r])) +
                     std::fabs(sg[2 * r + 1] * ref.l[r] - 1.0);
    serr = std::max(serr, std::isnan(e) ? INFINITY : e);
  }
  return std::max(rel_err(got, ref.o), serr * 1e-2 / 1e-3);
}

static const char* name(Path p, bool bwd) {
  if (p == ROW) return bwd ? "row bwd" : "row fwd";
  if (p == DECODE) return "decode";
  return bwd ? "mma bwd" : "mma fwd";
}

// Checks the forward by `path` (and, for ROW and MMA with cap == S, its backward) against the
// float64 reference.
static void check(Case c, Path path) {
  Inputs in(c);
  const Reference ref(in);
  bf* o = (bf*)dalloc(in.nq * 2);
  float* stats = (float*)dalloc(in.nq / c.D * 8);
  poison(o, in.nq * 2), poison(stats, in.nq / c.D * 8);
  forward(in, path, o, stats);
  const std::vector<float> got = download_bf(o, in.nq);
  std::vector<float> sg(in.nq / c.D * 2);
  d2h(sg.data(), stats, sg.size() * 4);
  report(name(path, false), c, forward_err(ref, got, sg), 1e-2);
  if (path != DECODE && in.cap == in.S) {
    bf *dq = (bf*)dalloc(in.nq * 2), *dk = (bf*)dalloc(in.nk * 2), *dv = (bf*)dalloc(in.nk * 2);
    float* delta = (float*)dalloc(in.nq / c.D * 4);
    poison(dq, in.nq * 2), poison(dk, in.nk * 2), poison(dv, in.nk * 2);
    backward(in, path, o, stats, delta, dq, dk, dv);
    const double e = std::max({rel_err(download_bf(dq, in.nq), ref.dq),
                               rel_err(download_bf(dk, in.nk), ref.dk),
                               rel_err(download_bf(dv, in.nk), ref.dv)});
    report(name(path, true), c, e, 2e-2);
    if (path == MMA) check_backward5(in, ref, o, stats, delta, dk, dv);
    dfree(dq), dfree(dk), dfree(dv), dfree(delta);
  }
  dfree(o), dfree(stats);
}

// ---- the pipelined decode (flash_decode.cu)

// Row b's valid keys: the last lens[b] of the S columns (left padding before them, as the
// sampler's batches have), then the reference's inputs again.
static void set_lengths(Inputs& in, const std::vector<int>& lens) {
  for (int b = 0; b < in.c.B; ++b)
    for (int j = 0; j < in.S; ++j) in.valid[(size_t)b * in.S + j] = j >= in.S - lens[b];
  h2d(in.dvalid, in.valid.data(), in.valid.size());
}

// The host's chunks per block (src/fused/flash/cuda.rs, `pipe_chunks_per_block`): one, unless
// the grid would have more than FDP_FILL_BLOCKS blocks.
static int host_cpb(int B, int KV, int nchunk) {
  return std::max(1, std::min(nchunk, B * KV * nchunk / FDP_FILL_BLOCKS));
}

// K, V and Q as the pipelined kernel of dtype T reads them.
struct PipeOperands {
  void *q, *k, *v;
  template <typename T>
  static void* up(const std::vector<float>& x) {
    if constexpr (sizeof(T) == 2) return Inputs::upload(x);
    float* d = (float*)dalloc(x.size() * 4);
    h2d(d, x.data(), x.size() * 4);
    return d;
  }
  template <typename T>
  static PipeOperands of(const Inputs& in) {
    if constexpr (sizeof(T) == 2) return {in.dq_, in.dk_, in.dv_};
    return {up<T>(in.q), up<T>(in.k), up<T>(in.v)};
  }
  template <typename T>
  void release(const Inputs& in) {
    if (q != (void*)in.dq_) dfree(q), dfree(k), dfree(v);
  }
};

// The pipelined decode's forward, `cpb` chunks a block: first valid keys (unless `find_first`
// is false: a decode step finds them once for all its layers), then one launch for the chunks'
// partials (`part`, B·H·nchunk·(2 + D) floats) and their merge into O and the statistics.
template <typename T>
static void decode_pipe(const Inputs& in, const PipeOperands& x, float* part, T* o, float* stats,
                        int cpb, bool find_first = true) {
  const Case& c = in.c;
  const int S = in.S, nchunk = (S + FDP_CHUNK - 1) / FDP_CHUNK;
  const float scale = in.scale();
  const T *q = (const T*)x.q, *k = (const T*)x.k, *v = (const T*)x.v;
  if (find_first) LAUNCH(flash_first_valid, dim3(c.B), dim3(256), 0, in.dvalid, S, in.dfirst);
  const dim3 grid((nchunk + cpb - 1) / cpb, c.KV, c.B), block(FDP_THREADS);
  const size_t smem = fdp_smem(c.D, sizeof(T));
#define PIPE_ARGS q, k, v, in.dvalid, in.dfirst, part, o, stats, in.dcount, nchunk, cpb, c.H, c.KV, c.T, S, in.cap, c.D, c.past, scale
  if constexpr (sizeof(T) == 2) {
    if (c.D == 128) LAUNCH_G(flash_decode_pipe_d128_bf16, c.H / c.KV, grid, block, smem, PIPE_ARGS);
    else LAUNCH_G(flash_decode_pipe_d64_bf16, c.H / c.KV, grid, block, smem, PIPE_ARGS);
  } else {
    if (c.D == 128) LAUNCH_G(flash_decode_pipe_d128_f32, c.H / c.KV, grid, block, smem, PIPE_ARGS);
    else LAUNCH_G(flash_decode_pipe_d64_f32, c.H / c.KV, grid, block, smem, PIPE_ARGS);
  }
#undef PIPE_ARGS
}

static std::vector<float> download(const bf* d, size_t n) { return download_bf(d, n); }
static std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  d2h(h.data(), d, n * 4);
  return h;
}

// The partials buffer filled with valid-looking partials (m 50, l 1, every sum 1e3) where the
// other outputs are poisoned with NaN: the merge skips a partial whose l is not above 0, which
// a NaN is not, so a merge reading a chunk its launch did not write would pass unseen; a finite
// partial that outweighs every real one (e^50) spoils the row instead.
static void fake_partials(float* part, size_t records, int D) {
  std::vector<float> h(records * (2 + D), 1e3f);
  for (size_t r = 0; r < records; ++r) h[r * (2 + D)] = 50.0f, h[r * (2 + D) + 1] = 1.0f;
  h2d(part, h.data(), h.size() * 4);
}

// One run of the pipelined decode: O and the statistics as the host reads them (bits).
struct PipeOut {
  std::vector<float> o, stats;
};
// A decode launch's device buffers for `in` over rows of at most `keys` keys: the chunks'
// partials (filled by fake_partials), O in T and the statistics (poisoned); `read` checks that
// the launch left every arrival counter at zero and downloads O and the statistics.
template <typename T>
struct DecodeBuffers {
  const Inputs& in;
  float* part;
  T* o;
  float* stats;
  DecodeBuffers(const Inputs& in_, int keys) : in(in_) {
    const Case& c = in.c;
    const size_t records = (size_t)c.B * c.H * ((keys + FDP_CHUNK - 1) / FDP_CHUNK);
    part = (float*)dalloc(records * (c.D + 2) * 4);
    o = (T*)dalloc(in.nq * sizeof(T));
    stats = (float*)dalloc(in.nq / c.D * 8);
    fake_partials(part, records, c.D);
    poison(o, in.nq * sizeof(T)), poison(stats, in.nq / c.D * 8);
  }
  DecodeBuffers(const DecodeBuffers&) = delete;
  PipeOut read(const char* what) const {
    in.check_counts_zero(what);
    return {download(o, in.nq), download(stats, in.nq / in.c.D * 2)};
  }
  ~DecodeBuffers() { dfree(part), dfree(o), dfree(stats); }
};

template <typename T>
static PipeOut run_pipe(const Inputs& in, int cpb) {
  PipeOperands x = PipeOperands::of<T>(in);
  const DecodeBuffers<T> buf(in, in.S);
  decode_pipe<T>(in, x, buf.part, buf.o, buf.stats, cpb);
  PipeOut out = buf.read("decode pipe");
  x.release<T>(in);
  return out;
}

static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

static void report_lens(const char* what, const Case& c, const std::vector<int>& lens, double err,
                        double limit) {
  int lo = lens[0], hi = lens[0];
  for (int x : lens) lo = std::min(lo, x), hi = std::max(hi, x);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s, rows of %d-%d keys", what, lo, hi);
  report(buf, c, err, limit);
}

// The pipelined decode (dtype T) against the float64 reference at `cpbs[0]` chunks a block,
// rows of `lens` keys (empty: every row S keys but the case's padding), and every other cpb of
// `cpbs` bit for bit equal to the first.
template <typename T>
static void check_pipe(Case c, std::vector<int> lens, std::initializer_list<int> cpbs) {
  Inputs in(c);
  if (!lens.empty()) set_lengths(in, lens);
  else lens.assign(c.B, in.S);
  const Reference ref(in);
  const char* what = sizeof(T) == 2 ? "decode pipe" : "decode pipe f32";
  const PipeOut first = run_pipe<T>(in, *cpbs.begin());
  report_lens(what, c, lens, forward_err(ref, first.o, first.stats), sizeof(T) == 2 ? 1e-2 : 1e-4);
  for (int cpb : cpbs) {
    if (cpb == *cpbs.begin()) continue;
    const PipeOut again = run_pipe<T>(in, cpb);
    const bool same = same_bits(again.o, first.o) && same_bits(again.stats, first.stats);
    printf("%s chunks a block %d vs %d B%d H%d KV%d past%d D%d: %s\n", what, cpb, *cpbs.begin(),
           c.B, c.H, c.KV, c.past, c.D, same ? "the same bits ok" : "FAILED (bits differ)");
    if (!same) failures++;
  }
}

// Row `r` of a ragged batch (`lens` keys a row, left padding, the buffer's `cap` columns, `cpb`
// chunks a block) against the same row alone (a batch of one, its own length, no padding, no
// room, one chunk a block): the same bits of O and statistics. With `reference`, the batch is
// also checked against float64.
template <typename T>
static void check_pipe_alone(Case c, const std::vector<int>& lens, int r, int cpb,
                             bool reference = false) {
  Inputs in(c);
  set_lengths(in, lens);
  const int len = lens[r];
  Inputs one({1, c.H, c.KV, 1, len - 1, c.D, 0, 0});
  // the row's queries and keys into the lone batch
  const size_t qrow = (size_t)c.H * c.D;
  std::copy(in.q.begin() + r * qrow, in.q.begin() + (r + 1) * qrow, one.q.begin());
  for (int g = 0; g < c.KV; ++g)
    for (int j = 0; j < len; ++j)
      for (int d = 0; d < c.D; ++d) {
        const size_t from = (((size_t)r * c.KV + g) * in.cap + (in.S - len + j)) * c.D + d;
        const size_t to = ((size_t)g * len + j) * c.D + d;
        one.k[to] = in.k[from], one.v[to] = in.v[from];
      }
  dfree(one.dq_), dfree(one.dk_), dfree(one.dv_);
  one.dq_ = Inputs::upload(one.q), one.dk_ = Inputs::upload(one.k), one.dv_ = Inputs::upload(one.v);
  const PipeOut batch = run_pipe<T>(in, cpb), alone = run_pipe<T>(one, 1);
  if (reference) {
    const Reference ref(in);
    report_lens(sizeof(T) == 2 ? "decode pipe" : "decode pipe f32", c, lens,
                forward_err(ref, batch.o, batch.stats), sizeof(T) == 2 ? 1e-2 : 1e-4);
  }
  const std::vector<float> bo(batch.o.begin() + r * qrow, batch.o.begin() + (r + 1) * qrow);
  const std::vector<float> bs(batch.stats.begin() + 2 * r * c.H,
                              batch.stats.begin() + 2 * (r + 1) * c.H);
  const bool same = same_bits(bo, alone.o) && same_bits(bs, alone.stats);
  printf("%s row alone vs in a batch B%d H%d KV%d S%d cap%d D%d row %d (%d keys), chunks a block "
         "%d: %s\n",
         sizeof(T) == 2 ? "decode pipe" : "decode pipe f32", c.B, c.H, c.KV, in.S, in.cap, c.D, r,
         len, cpb, same ? "the same bits ok" : "FAILED (bits differ)");
  if (!same) failures++;
}

// Rows of lengths spread over [lo, hi] (the first `lo`, the last `hi`), drawn from the inputs'
// generator.
static std::vector<int> ragged(int B, int lo, int hi) {
  std::vector<int> lens(B);
  for (int b = 0; b < B; ++b)
    lens[b] = b == 0 ? lo : b == B - 1 ? hi : lo + (int)((rnd() * 0.5 + 0.5) * (hi - lo));
  return lens;
}

// ---- the paged decode (flash_decode.cu's flash_decode_paged_*)

// The batch of `in` (row b's keys its last lens[b] columns) copied into a pool of `block`-key
// blocks (blocks, KV, block, D) in a shuffled order, each row's table naming its blocks; the
// pool's rows that hold no key are NaN and the tables' unused entries out of range, so a read
// past a row's keys shows. Then the paged kernel (`cpb` chunks a block) against the dense one
// on the same batch, bit for bit (the dense kernel's rows are independent of their batch, so
// this is also the row alone), and against the float64 reference.
struct PagedPool {
  int longest = 0, nblk = 0, nblocks = 1;  // block 0 is the pool's scratch block
  std::vector<float> k, v;
  unsigned *dtables, *dlens;
  PagedPool(const Inputs& in, const std::vector<int>& lens, int block) {
    const Case& c = in.c;
    for (int len : lens) {
      longest = std::max(longest, len);
      nblk = std::max(nblk, (len + block - 1) / block);
      nblocks += (len + block - 1) / block;
    }
    nblocks += 3;  // blocks no row holds
    std::vector<unsigned> ids(nblocks - 1);
    for (int i = 0; i < nblocks - 1; ++i) ids[i] = i + 1;
    for (int i = nblocks - 2; i > 0; --i)
      std::swap(ids[i], ids[(int)((rnd() * 0.5 + 0.5) * i) % (i + 1)]);
    std::vector<unsigned> tables((size_t)c.B * nblk, 0xfffffff0u);
    k.assign((size_t)nblocks * c.KV * block * c.D, NAN), v.assign(k.size(), NAN);
    size_t next = 0;
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i * block < lens[b]; ++i) tables[(size_t)b * nblk + i] = ids[next++];
    for (int b = 0; b < c.B; ++b)
      for (int g = 0; g < c.KV; ++g)
        for (int j = 0; j < lens[b]; ++j) {
          const size_t from = (((size_t)b * c.KV + g) * in.cap + (in.S - lens[b] + j)) * c.D;
          const size_t to =
              (((size_t)tables[(size_t)b * nblk + j / block] * c.KV + g) * block + j % block) * c.D;
          std::copy(&in.k[from], &in.k[from] + c.D, &k[to]);
          std::copy(&in.v[from], &in.v[from] + c.D, &v[to]);
        }
    std::vector<unsigned> ulens(lens.begin(), lens.end());
    dtables = (unsigned*)dalloc(tables.size() * 4);
    dlens = (unsigned*)dalloc(ulens.size() * 4);
    h2d(dtables, tables.data(), tables.size() * 4), h2d(dlens, ulens.data(), ulens.size() * 4);
  }
  ~PagedPool() { dfree(dtables), dfree(dlens); }
};

template <typename T>
static void check_paged(Case c, const std::vector<int>& lens, int block, int cpb) {
  Inputs in(c);
  set_lengths(in, lens);
  const Reference ref(in);
  const PagedPool pool(in, lens, block);
  const int longest = pool.longest, nblk = pool.nblk;
  unsigned *dtables = pool.dtables, *dlens = pool.dlens;
  PipeOperands x = PipeOperands::of<T>(in);
  T* kpool = (T*)PipeOperands::up<T>(pool.k);
  T* vpool = (T*)PipeOperands::up<T>(pool.v);
  const int nchunk = (longest + FDP_CHUNK - 1) / FDP_CHUNK;
  const DecodeBuffers<T> out(in, longest);
  float *part = out.part, *stats = out.stats;
  T* o = out.o;
  const dim3 grid((nchunk + cpb - 1) / cpb, c.KV, c.B), blk(FDP_THREADS);
  const size_t smem = fdp_smem(c.D, sizeof(T));
  const T* q = (const T*)x.q;
#define PAGED_ARGS q, kpool, vpool, dtables, dlens, part, o, stats, in.dcount, nchunk, cpb, nblk, block, c.H, c.KV, c.D, in.scale()
  if constexpr (sizeof(T) == 2) {
    if (c.D == 128) LAUNCH_G(flash_decode_paged_d128_bf16, c.H / c.KV, grid, blk, smem, PAGED_ARGS);
    else LAUNCH_G(flash_decode_paged_d64_bf16, c.H / c.KV, grid, blk, smem, PAGED_ARGS);
  } else {
    if (c.D == 128) LAUNCH_G(flash_decode_paged_d128_f32, c.H / c.KV, grid, blk, smem, PAGED_ARGS);
    else LAUNCH_G(flash_decode_paged_d64_f32, c.H / c.KV, grid, blk, smem, PAGED_ARGS);
  }
#undef PAGED_ARGS
  const PipeOut paged = out.read("decode paged");
  const char* what = sizeof(T) == 2 ? "decode paged" : "decode paged f32";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s (blocks of %d)", what, block);
  report_lens(buf, c, lens, forward_err(ref, paged.o, paged.stats), sizeof(T) == 2 ? 1e-2 : 1e-4);
  const PipeOut dense = run_pipe<T>(in, host_cpb(c.B, c.KV, (in.S + FDP_CHUNK - 1) / FDP_CHUNK));
  const bool same = same_bits(paged.o, dense.o) && same_bits(paged.stats, dense.stats);
  printf("%s blocks of %d vs the dense kernel B%d H%d KV%d S%d D%d, chunks a block %d: %s\n", what,
         block, c.B, c.H, c.KV, in.S, c.D, cpb, same ? "the same bits ok" : "FAILED (bits differ)");
  if (!same) failures++;
  dfree(kpool), dfree(vpool);
  x.release<T>(in);
}

// ---- an FP8 KV cache (flash_decode.cu's *_fp8 instances: E4M3 keys and values, bf16 q and O)

// x rounded to the nearest E4M3 value, ties to even, saturating at ±448, as
// model::qwen::fp8_e4m3 rounds on the CPU and __nv_fp8_e4m3(float) on a GPU: its byte.
static uint8_t fp8_byte(float x) {
  static float value[127];  // codes 0 .. 0x7e, increasing: 0, the subnormals, then 2^-6 .. 448
  static bool made = false;
  if (!made) {
    for (int code = 0; code < 127; ++code) value[code] = fp8_e4m3_value(code);
    made = true;
  }
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;
  int lo = 0;
  while (value[lo + 1] <= a) ++lo;  // value[lo] <= a < value[lo + 1]
  const float below = a - value[lo], above = value[lo + 1] - a;
  const int code = below < above ? lo : above < below ? lo + 1 : lo % 2 == 0 ? lo : lo + 1;
  return sign | (uint8_t)code;
}

// The decoder against every byte: the 126 finite positive values in order from 0 to 448, each
// the negative of its sign-flipped byte, NaN at S.1111.111, and every value its own rounding.
static void check_fp8_bytes() {
  bool ok = fp8_e4m3_value(0x7e) == 448.0f && fp8_e4m3_value(0x01) == 0.001953125f &&
            fp8_e4m3_value(0x08) == 0.015625f && fp8_e4m3_value(0x38) == 1.0f &&
            std::isnan(fp8_e4m3_value(0x7f)) && std::isnan(fp8_e4m3_value(0xff)) &&
            fp8_byte(1000.0f) == 0x7e && fp8_byte(-1000.0f) == 0xfe &&
            fp8_byte(1.0625f) == 0x38 && fp8_byte(1.1875f) == 0x3a;  // ties to even
  for (int code = 0; code < 127; ++code) {
    const float x = fp8_e4m3_value(code);
    ok &= fp8_e4m3_value(code | 0x80) == -x && fp8_byte(x) == code;
    if (code > 0) ok &= x > fp8_e4m3_value(code - 1);
  }
  printf("fp8 e4m3 bytes: decode and rounding %s\n", ok ? "ok" : "FAILED");
  if (!ok) failures++;
  // fp8.cu's kernels: every bf16 number rounded to its byte (fp8_e4m3_byte's arithmetic against
  // the nearest-value search above: ties, subnormals, saturation, NaN, both zeros), and every
  // byte back to bf16.
  std::vector<bf> all(1 << 16);
  for (int i = 0; i < 1 << 16; ++i) {
    const uint16_t b = (uint16_t)i;
    std::memcpy(&all[i], &b, 2);  // the bf16 with these bits
  }
  bf* dall = (bf*)dalloc(all.size() * 2);
  h2d(dall, all.data(), all.size() * 2);
  uint8_t* dbytes = (uint8_t*)dalloc(all.size());
  poison(dbytes, all.size());
  size_t n = all.size();
  LAUNCH(fp8_e4m3_from_bf16, dim3(64), dim3(ELEM_THREADS), 0, dall, dbytes, n);
  std::vector<uint8_t> bytes(all.size());
  d2h(bytes.data(), dbytes, bytes.size());
  int wrong = 0;
  for (int i = 0; i < 1 << 16; ++i) {
    const float x = __bfloat162float(all[i]);
    const uint8_t want = fp8_byte(x);
    // a zero's sign is kept (the search above gives +0's code for both)
    wrong += bytes[i] != want && !(x == 0.0f && (bytes[i] & 0x7f) == 0);
  }
  printf("fp8 e4m3 from bf16, all 65,536 numbers: %d wrong %s\n", wrong, wrong ? "FAILED" : "ok");
  if (wrong) failures++;
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = (uint8_t)i;
  uint8_t* dcodes = (uint8_t*)dalloc(256);
  h2d(dcodes, codes.data(), 256);
  bf* dback = (bf*)dalloc(512);
  poison(dback, 512);
  n = 256;
  LAUNCH(fp8_e4m3_to_bf16, dim3(1), dim3(ELEM_THREADS), 0, dcodes, dback, n);
  const std::vector<float> back = download_bf(dback, 256);
  wrong = 0;
  for (int i = 0; i < 256; ++i) {
    const float want = fp8_e4m3_value(i);
    if (std::isnan(want)) wrong += !std::isnan(back[i]);  // a NaN's sign is the cast's
    else wrong += back[i] != want || std::signbit(back[i]) != std::signbit(want);
  }
  printf("fp8 e4m3 to bf16, all 256 bytes: %d wrong %s\n", wrong, wrong ? "FAILED" : "ok");
  if (wrong) failures++;
  dfree(dall), dfree(dbytes), dfree(dcodes), dfree(dback);
}

// The keys and values of `in` rounded to E4M3 (its bf16 copies, which hold them exactly,
// uploaded again): the reference and the bf16 kernels then see what an FP8 cache holds.
static void round_kv_fp8(Inputs& in) {
  for (auto& x : in.k) x = fp8_e4m3_value(fp8_byte(x));
  for (auto& x : in.v) x = fp8_e4m3_value(fp8_byte(x));
  dfree(in.dk_), dfree(in.dv_);
  in.dk_ = Inputs::upload(in.k), in.dv_ = Inputs::upload(in.v);
}

// E4M3 values' bytes on the device (NaN stays NaN: a read past a pool's keys still shows).
static fp8e4m3* upload_fp8(const std::vector<float>& x) {
  std::vector<uint8_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = fp8_byte(x[i]);
  fp8e4m3* d = (fp8e4m3*)dalloc(h.size());
  h2d(d, h.data(), h.size());
  return d;
}

// The FP8 kernel (dense buffer or, with `pool`, its paged instance), O in bf16; first valid
// keys as decode_pipe finds them.
static void decode_fp8(const Inputs& in, const fp8e4m3* k, const fp8e4m3* v, const PagedPool* pool,
                       int block, int cpb, float* part, bf* o, float* stats,
                       bool find_first = true) {
  const Case& c = in.c;
  const int S = pool ? pool->longest : in.S, nchunk = (S + FDP_CHUNK - 1) / FDP_CHUNK;
  const dim3 grid((nchunk + cpb - 1) / cpb, c.KV, c.B), blk(FDP_THREADS);
  const size_t smem = fdp_smem(c.D, 1);
  const bf* q = in.dq_;
  const float scale = in.scale();
  if (pool) {
#define ARGS q, k, v, pool->dtables, pool->dlens, part, o, stats, in.dcount, nchunk, cpb, pool->nblk, block, c.H, c.KV, c.D, scale
    if (c.D == 128) LAUNCH_G(flash_decode_paged_d128_fp8, c.H / c.KV, grid, blk, smem, ARGS);
    else LAUNCH_G(flash_decode_paged_d64_fp8, c.H / c.KV, grid, blk, smem, ARGS);
#undef ARGS
  } else {
    if (find_first) LAUNCH(flash_first_valid, dim3(c.B), dim3(256), 0, in.dvalid, S, in.dfirst);
#define ARGS q, k, v, in.dvalid, in.dfirst, part, o, stats, in.dcount, nchunk, cpb, c.H, c.KV, c.T, S, in.cap, c.D, c.past, scale
    if (c.D == 128) LAUNCH_G(flash_decode_pipe_d128_fp8, c.H / c.KV, grid, blk, smem, ARGS);
    else LAUNCH_G(flash_decode_pipe_d64_fp8, c.H / c.KV, grid, blk, smem, ARGS);
#undef ARGS
  }
}

// One run of decode_fp8 on fresh buffers: O and the statistics as the host reads them.
static PipeOut run_fp8(const Inputs& in, const PagedPool* pool, int block, int cpb) {
  fp8e4m3 *k = upload_fp8(pool ? pool->k : in.k), *v = upload_fp8(pool ? pool->v : in.v);
  const DecodeBuffers<bf> buf(in, pool ? pool->longest : in.S);
  decode_fp8(in, k, v, pool, block, cpb, buf.part, buf.o, buf.stats);
  PipeOut out = buf.read("decode fp8");
  dfree(k), dfree(v);
  return out;
}

// The FP8 kernel on keys and values rounded to E4M3 against the float64 reference on those
// values and, bit for bit, against the bf16 kernel on the same values (dense at the host's
// chunks a block): an FP8 cache computes what the CPU's emulated one does. With `block`, through
// a paged pool of blocks of that many keys.
static void check_fp8(Case c, std::vector<int> lens, int block, int cpb) {
  Inputs in(c);
  if (!lens.empty()) set_lengths(in, lens);
  else lens.assign(c.B, in.S);
  round_kv_fp8(in);
  const Reference ref(in);
  std::optional<PagedPool> pool;
  if (block) pool.emplace(in, lens, block);
  const PipeOut got = run_fp8(in, pool ? &*pool : nullptr, block, cpb);
  char what[64];
  if (block) std::snprintf(what, sizeof what, "decode paged fp8 (blocks of %d)", block);
  else std::snprintf(what, sizeof what, "decode pipe fp8");
  report_lens(what, c, lens, forward_err(ref, got.o, got.stats), 1e-2);
  const int bf_cpb = block ? host_cpb(c.B, c.KV, (in.S + FDP_CHUNK - 1) / FDP_CHUNK) : cpb;
  const PipeOut want = run_pipe<bf>(in, bf_cpb);
  const bool same = same_bits(got.o, want.o) && same_bits(got.stats, want.stats);
  printf("%s vs the bf16 kernel on the same values B%d H%d KV%d S%d D%d, chunks a block %d: %s\n",
         what, c.B, c.H, c.KV, in.S, c.D, cpb, same ? "the same bits ok" : "FAILED (bits differ)");
  if (!same) failures++;
}

// The instance compiled for the case's G query heads per KV head (2 or 4) against the one for
// any count, on the same inputs: the same bits (their arithmetic is one, only the registers
// they hold differ).
template <typename T>
static void check_group_instance(Case c, const std::vector<int>& lens, int cpb) {
  Inputs in(c);
  set_lengths(in, lens);
  const PipeOut fixed = run_pipe<T>(in, cpb);
  generic_decode = true;
  const PipeOut any = run_pipe<T>(in, cpb);
  generic_decode = false;
  const bool same = same_bits(fixed.o, any.o) && same_bits(fixed.stats, any.stats);
  printf("%s compiled for G %d vs for any G B%d H%d KV%d S%d D%d: %s\n",
         sizeof(T) == 2 ? "decode pipe" : "decode pipe f32", c.H / c.KV, c.B, c.H, c.KV, in.S,
         c.D, same ? "the same bits ok" : "FAILED (bits differ)");
  if (!same) failures++;
}

// The pipelined decode's checks, under the emulator schedule already set.
static void check_pipes(bool big) {
  // {B, H, KV, T, past, D, pad, cap}
  // Qwen3-1.7B's heads (16 over 8, head dim 128): ragged rows, a buffer with room, the
  // whole-chunk and tile edges (127, 128, 129 keys), several chunks a block
  check_pipe<bf>({5, 16, 8, 1, 299, 128, 0, 384}, ragged(5, 1, 300), {1, 2, 3});
  check_pipe<bf>({3, 16, 8, 1, 128, 128, 0, 0}, {127, 128, 129}, {1, 2});
  // a row that sees no key (padding throughout), padding over whole chunks, GQA 7 (28 over 4),
  // head dim 64
  check_pipe<bf>({2, 14, 2, 1, 299, 128, 170, 0, true}, {}, {1, 3});
  check_pipe<bf>({3, 28, 4, 1, 200, 64, 0, 0}, {201, 64, 33}, {1, 2});
  check_pipe<bf>({2, 8, 8, 1, 77, 64, 0, 0}, {78, 1}, {1});
  // 4 query heads a KV head (Qwen3-4B and 8B: their own instance), head dim 128 and 64
  check_pipe<bf>({3, 16, 4, 1, 200, 128, 0, 0}, {201, 64, 33}, {1, 2});
  check_pipe<bf>({2, 8, 2, 1, 150, 64, 0, 0}, {151, 20}, {1, 3});
  // the instances compiled for 2 and 4 against the one for any count: the same bits
  check_group_instance<bf>({3, 16, 8, 1, 299, 128, 0, 0}, {300, 129, 5}, 2);
  check_group_instance<bf>({3, 16, 4, 1, 200, 64, 0, 0}, {201, 64, 33}, 1);
  check_group_instance<float>({2, 4, 1, 1, 99, 128, 0, 0}, {100, 7}, 1);
  // f32
  check_pipe<float>({3, 16, 8, 1, 259, 128, 0, 300}, {260, 200, 129}, {1, 2});
  check_pipe<float>({2, 4, 1, 1, 99, 64, 0, 0}, {100, 7}, {1, 4});
  // a row alone against the same row in a batch
  check_pipe_alone<bf>({4, 16, 8, 1, 399, 128, 0, 512}, {400, 257, 129, 40}, 1, 2);
  check_pipe_alone<bf>({3, 28, 4, 1, 260, 64, 0, 0}, {100, 261, 3}, 0, 1);
  check_pipe_alone<float>({3, 4, 2, 1, 300, 128, 0, 0}, {301, 55, 200}, 2, 3);
  // through a paged pool's block tables: ragged rows, the block and chunk edges (31, 32, 33,
  // 128, 129 keys), blocks of 32 and 64, head dim 64 with GQA 7, several chunks a block, f32
  check_paged<bf>({5, 16, 8, 1, 299, 128, 0, 384}, {1, 300, 129, 32, 77}, 32, 1);
  check_paged<bf>({4, 16, 8, 1, 200, 128, 0, 0}, {31, 33, 128, 201}, 64, 2);
  check_paged<bf>({3, 28, 4, 1, 260, 64, 0, 0}, {100, 261, 3}, 32, 3);
  check_paged<float>({3, 4, 2, 1, 300, 128, 0, 0}, {301, 55, 200}, 32, 1);
  // an FP8 cache: dense with ragged rows, padding and room, several chunks a block, head dim 64
  // with GQA 7; paged at the block and chunk edges
  check_fp8_bytes();
  check_fp8({5, 16, 8, 1, 299, 128, 0, 384}, ragged(5, 1, 300), 0, 2);
  check_fp8({2, 14, 2, 1, 299, 128, 170, 0, true}, {}, 0, 3);
  check_fp8({3, 28, 4, 1, 200, 64, 0, 0}, {201, 64, 33}, 0, 1);
  check_fp8({5, 16, 8, 1, 299, 128, 0, 384}, {1, 300, 129, 32, 77}, 32, 1);
  check_fp8({3, 28, 4, 1, 260, 64, 0, 0}, {100, 261, 3}, 64, 3);
  check_fp8({3, 16, 4, 1, 200, 128, 0, 0}, {201, 64, 33}, 32, 2);
  if (!big) return;
  check_paged<bf>({64, 2, 1, 1, 2046, 128, 0, 2048}, ragged(64, 1024, 2047), 32, host_cpb(64, 8, 16));
  // the shapes of the issue: one row of 8,192 keys with Qwen3-1.7B's heads; 64 rows of 1,024
  // and of 2,047 keys, and 64 ragged rows, with its grouping (2 query heads a KV head) over one
  // KV head (the emulator is slow; the GPU's checks below take all 16 heads)
  check_pipe<bf>({1, 16, 8, 1, 8191, 128, 0, 0}, {}, {1, 8});
  check_pipe<bf>({64, 2, 1, 1, 1023, 128, 0, 2048}, {}, {1, 2});
  check_pipe<bf>({64, 2, 1, 1, 2046, 128, 0, 2048}, {}, {host_cpb(64, 8, 16)});
  check_pipe_alone<bf>({64, 2, 1, 1, 2046, 128, 0, 2048}, ragged(64, 1024, 2047), 37, 5, true);
}

#ifndef ACPO_EMU
// Median milliseconds of 7 runs of `f` (harness.hpp's median_ms).
template <typename F>
static float time_ms(F f) {
  return median_ms(f, 7);
}

// Times the forward and the backward of `path` at one shape. FLOP as FA2 counts them: the
// forward 4·B·H·D·(T·past + T²/2) (causal), the backward 2.5× that (5 products; the tensor-core
// backward here does 7, see flash_mma.cu).
static void timing(Case c, Path path) {
  Inputs in(c);
  bf* o = (bf*)dalloc(in.nq * 2);
  float* stats = (float*)dalloc(in.nq / c.D * 8);
  const double flops = 4.0 * c.B * c.H * c.D *
                       (c.T == 1 ? (double)in.S : (double)c.T * c.past + (double)c.T * c.T / 2);
  const float fwd = time_ms([&] { forward(in, path, o, stats); });
  const double bytes = (double)c.B * c.KV * in.S * c.D * 2 * 2 + in.nq * 4;
  printf("time %-8s B%d H%d KV%d T%d past%d D%d: forward %.3f ms, %.0f GB/s (K/V once), %.1f TFLOP/s",
         name(path, false), c.B, c.H, c.KV, c.T, c.past, c.D, fwd, bytes / fwd / 1e6,
         flops / fwd / 1e9);
  if (path != DECODE && in.cap == in.S) {
    bf *dq = (bf*)dalloc(in.nq * 2), *dk = (bf*)dalloc(in.nk * 2), *dv = (bf*)dalloc(in.nk * 2);
    float* delta = (float*)dalloc(in.nq / c.D * 4);
    const float bwd = time_ms([&] { backward(in, path, o, stats, delta, dq, dk, dv); });
    printf("; backward %.3f ms, %.1f TFLOP/s; forward + backward %.3f ms, %.1f TFLOP/s", bwd,
           2.5 * flops / bwd / 1e9, fwd + bwd, 3.5 * flops / (fwd + bwd) / 1e9);
    if (path == MMA) {
      // the backward in 5 products beside it (δ, the zeroed sums and counters, the fused
      // kernel, dQ's rounding), on its own line
      const int ntiles = (c.T + FM_COLS - 1) / FM_COLS;
      float* acc = (float*)dalloc(in.nq * 4);
      int* count = (int*)dalloc(((size_t)c.B * c.H * ntiles + 1) * 4);
      const float bwd5 = time_ms(
          [&] { backward5(in, o, stats, delta, acc, count, dq, dk, dv, 1); });
      printf("\ntime %-8s B%d H%d KV%d T%d past%d D%d: forward %.3f ms, %.0f GB/s (K/V once), "
             "%.1f TFLOP/s; backward %.3f ms, %.1f TFLOP/s; forward + backward %.3f ms, %.1f "
             "TFLOP/s",
             "mma5", c.B, c.H, c.KV, c.T, c.past, c.D, fwd, bytes / fwd / 1e6, flops / fwd / 1e9,
             bwd5, 2.5 * flops / bwd5 / 1e9, fwd + bwd5, 3.5 * flops / (fwd + bwd5) / 1e9);
      dfree(acc), dfree(count);
    }
    dfree(dq), dfree(dk), dfree(dv), dfree(delta);
  }
  printf("\n");
  dfree(o), dfree(stats);
}

// The device-to-device copy rate, as `acpo bench generate` measures it (src/perf/mod.rs,
// copy_bandwidth): 1 GiB copied, bytes read and written over the median time.
static double copy_gb_per_s() {
  const size_t n = (size_t)1 << 30;
  void *a = dalloc(n), *b = dalloc(n);
  const float ms = median_ms([&] { CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice)); }, 5);
  dfree(a), dfree(b);
  return 2.0 * n / ms / 1e6;
}

// Times the pipelined decode at the host's chunks per block, one launch as a decode step's layer
// runs it (its first valid keys found once a step, before), beside its prediction: the bytes it
// must move (K and V once, Q in, O out, the chunks' partials written and read back, the valid
// bits) at the copy rate measured here (src/perf/decode.rs predicts the same from the rates in
// results/gpu).
static void timing_pipe(Case c, double copy) {
  Inputs in(c);
  const int nchunk = (in.S + FDP_CHUNK - 1) / FDP_CHUNK, cpb = host_cpb(c.B, c.KV, nchunk);
  const PipeOperands x = PipeOperands::of<bf>(in);
  const DecodeBuffers<bf> buf(in, in.S);
  float *part = buf.part, *stats = buf.stats;
  bf* o = buf.o;
  // as a decode step runs it a layer: the first valid keys found once (here, before the timing)
  decode_pipe<bf>(in, x, part, o, stats, cpb);
  const float ms = time_ms([&] { decode_pipe<bf>(in, x, part, o, stats, cpb, false); });
  const double kv = (double)c.B * c.KV * in.S * c.D * 2 * 2;
  const double bytes = kv + (double)in.nq * 2 * 2 + (double)c.B * c.H * nchunk * (c.D + 2) * 4 * 2 +
                       (double)c.B * in.S + (double)c.B * c.H * 8;
  const double flops = 4.0 * c.B * c.H * c.D * in.S;
  printf("time %-8s B%d H%d KV%d T%d past%d D%d: forward %.4f ms, %.0f GB/s (K/V once), %.1f TFLOP/s\n",
         "decode pipe", c.B, c.H, c.KV, c.T, c.past, c.D, ms, kv / ms / 1e6, flops / ms / 1e9);
  // the share of the copy rate on every byte it moves, and on K, V, Q and O alone (what the
  // target is judged on: the partials, statistics and valid bits are the kernel's own overhead)
  const double kvqo = kv + (double)in.nq * 2 * 2;
  printf("predicted decode pipe B%d H%d KV%d past%d D%d: %.4f ms at the copy rate measured here "
         "(%.0f GB/s; %.1f MB); measured at %.1f %% of it (target 80 %%), %.1f %% on K, V, Q and O alone\n",
         c.B, c.H, c.KV, c.past, c.D, bytes / copy / 1e6, copy, bytes / 1e6,
         100.0 * bytes / ms / 1e6 / copy, 100.0 * kvqo / ms / 1e6 / copy);
  // The instance for any G beside the one compiled for this G (3 blocks an SM against 2):
  // what the registers' occupancy is worth
  if (c.H / c.KV == 2 || c.H / c.KV == 4) {
    generic_decode = true;
    const float any = time_ms([&] { decode_pipe<bf>(in, x, part, o, stats, cpb, false); });
    generic_decode = false;
    printf("decode pipe compiled for G %d B%d past%d: %.4f ms; the instance for any G: %.4f ms\n",
           c.H / c.KV, c.B, c.past, ms, any);
  }
  // The host's chunks per block is a guess made without a GPU (launch.cuh, FDP_FILL_BLOCKS):
  // the others beside it, to tune it (it changes no result bit)
  printf("decode pipe chunks a block B%d past%d (host %d):", c.B, c.past, cpb);
  for (int n = 1; n <= std::min(nchunk, 16); n *= 2)
    printf(" %d: %.4f ms;", n, time_ms([&] { decode_pipe<bf>(in, x, part, o, stats, n, false); }));
  printf("\n");
}

// The FP8 instance at the same shape and chunks a block, beside its prediction: the bytes above
// with K and V at one byte a number.
static void timing_pipe_fp8(Case c, double copy) {
  Inputs in(c);
  round_kv_fp8(in);
  const int nchunk = (in.S + FDP_CHUNK - 1) / FDP_CHUNK, cpb = host_cpb(c.B, c.KV, nchunk);
  fp8e4m3 *k = upload_fp8(in.k), *v = upload_fp8(in.v);
  const DecodeBuffers<bf> buf(in, in.S);
  decode_fp8(in, k, v, nullptr, 0, cpb, buf.part, buf.o, buf.stats);
  const float ms = time_ms(
      [&] { decode_fp8(in, k, v, nullptr, 0, cpb, buf.part, buf.o, buf.stats, false); });
  const double kv = (double)c.B * c.KV * in.S * c.D * 2;
  const double bytes = kv + (double)in.nq * 2 * 2 + (double)c.B * c.H * nchunk * (c.D + 2) * 4 * 2 +
                       (double)c.B * in.S + (double)c.B * c.H * 8;
  printf("time %-8s B%d H%d KV%d T%d past%d D%d: forward %.4f ms, %.0f GB/s (K/V once)\n",
         "decode pipe fp8", c.B, c.H, c.KV, c.T, c.past, c.D, ms, kv / ms / 1e6);
  printf("predicted decode pipe fp8 B%d H%d KV%d past%d D%d: %.4f ms at the copy rate measured "
         "here (%.0f GB/s; %.1f MB); measured at %.1f %% of it (target 80 %%)\n",
         c.B, c.H, c.KV, c.past, c.D, bytes / copy / 1e6, copy, bytes / 1e6,
         100.0 * bytes / ms / 1e6 / copy);
  dfree(k), dfree(v);
}
#endif

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each check's line as it ends
  const int seeds = seeds_arg(argc, argv);
  // `--mma`: the tensor-core checks alone (a quicker loop while changing flash_mma.cu)
  bool mma_only = false;
  for (int a = 1; a < argc; ++a) mma_only |= std::string(argv[a]) == "--mma";
  // {B, H, KV, T, past, D, pad, cap}
  const Case mma_cases[] = {
      {2, 4, 2, 100, 0, 128, 50, 0},    // GQA 2, left padding (blind rows), a partial tile
      {2, 4, 1, 129, 0, 64, 100, 0},    // GQA 4, head dim 64, three tiles
      {1, 2, 2, 64, 0, 128, 0, 0},      // one whole tile, no padding
      {2, 2, 1, 200, 0, 64, 130, 0},    // padding over two whole key blocks
      {2, 4, 2, 100, 30, 128, 50, 0},   // a cached prefix (the forward after a prefill)
      {2, 2, 2, 70, 0, 64, 0, 0, true}, // a sequence of padding only: every row blind
      {2, 2, 1, 300, 0, 128, 150, 0},   // three 128-row blocks, five key tiles (the ring); 150
                                        // padded keys: a 128-key block hidden, 150 rows blind
  };
  const Case row_cases[] = {{2, 4, 2, 100, 30, 128, 50, 0}, {2, 4, 1, 129, 70, 64, 100, 0},
                            {2, 2, 1, 77, 0, 32, 20, 0}};
  const Case decode_cases[] = {{3, 14, 2, 1, 1300, 128, 900, 1400}, {2, 2, 1, 1, 40, 32, 41, 0}};
  const Case gpu_cases[] = {{2, 16, 8, 300, 0, 128, 40, 0}, {2, 16, 8, 1, 1024, 128, 0, 0}};
  for (int s = 0; s < seeds; ++s) {
    use_schedule(s, 4);  // fair or one warp lagging, copies landing late or early
    for (const Case& c : mma_cases) check(c, MMA);
    if (mma_only) continue;
    check_pipes(s == 0);
    if (s == 0) {
      for (const Case& c : row_cases) check(c, ROW);
      for (const Case& c : decode_cases) check(c, DECODE);
      if (on_gpu) {
        for (const Case& c : gpu_cases) check(c, c.T == 1 ? DECODE : MMA);
        check(gpu_cases[0], ROW);
        // the issue's decode shapes with all of Qwen3-1.7B's heads
        check_pipe<bf>({1, 16, 8, 1, 8191, 128, 0, 0}, {}, {host_cpb(1, 8, 64), 4});
        check_pipe<bf>({64, 16, 8, 1, 1023, 128, 0, 2048}, {}, {host_cpb(64, 8, 8), 3});
        check_pipe<bf>({64, 16, 8, 1, 2046, 128, 0, 2048}, {}, {host_cpb(64, 8, 16), 1});
        check_pipe_alone<bf>({64, 16, 8, 1, 2046, 128, 0, 2048}, ragged(64, 1024, 2047), 5,
                             host_cpb(64, 8, 16));
        check_paged<bf>({64, 16, 8, 1, 2046, 128, 0, 2048}, ragged(64, 1024, 2047), 32,
                        host_cpb(64, 8, 16));
        check_fp8({64, 16, 8, 1, 2046, 128, 0, 2048}, ragged(64, 1024, 2047), 0, host_cpb(64, 8, 16));
        check_fp8({1, 16, 8, 1, 8191, 128, 0, 0}, {}, 0, host_cpb(1, 8, 64));
      }
    }
  }
#ifndef ACPO_EMU
  const Case times[] = {{64, 16, 8, 1, 1024, 128, 0, 2048}, {64, 16, 8, 1, 2047, 128, 0, 2048},
                        {1, 16, 8, 1, 8191, 128, 0, 0},     {64, 16, 8, 1024, 0, 128, 0, 0},
                        {2, 16, 8, 2048, 0, 128, 0, 0},     {2, 16, 8, 9220, 0, 128, 0, 0}};
  for (const Case& c : times) timing(c, c.T == 1 ? DECODE : MMA);
  const double copy = copy_gb_per_s();
  printf("copy %.0f GB/s (1 GiB device to device, read + write)\n", copy);
  for (const Case& c : times)
    if (c.T == 1) timing_pipe(c, copy);
  for (const Case& c : times)
    if (c.T == 1) timing_pipe_fp8(c, copy);
  timing({2, 16, 8, 2048, 0, 128, 0, 0}, ROW);
  timing({64, 16, 8, 1, 1024, 128, 0, 2048}, ROW);
#endif
  printf("%s\n", failures ? "FAILED" : "all checks ok");
  return failures ? 1 : 0;
}
