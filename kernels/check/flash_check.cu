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
// The CPU build runs the same kernels in kernels/check/cuda_emu.hpp's emulator, checks only, at
// small shapes (tests/it/kernels.rs runs it in `cargo test`); `./fa --seeds N` repeats the
// tensor-core checks under N schedules (thread orders, a lagging warp, cp.async landing early).
//
// The reference adds a hidden key's -1e9 in f32, as the kernels and their CPU twin do: a row
// that sees no key then averages V uniformly (src/fused/flash/mod.rs).
#include "flash_attn.cu"
#include "flash_mma.cu"
#include "check/harness.hpp"

// A shape: B sequences, H query heads over KV heads, T query positions after `past` cached
// keys, head dim D; sequence 0 has `pad` leading invalid keys (sequence 1 too when pad1), the
// K/V buffers have `cap` columns (0: S).
struct Case {
  int B, H, KV, T, past, D, pad, cap;
  bool all_pad1 = false;  // sequence 1 is padding throughout (every row blind)
};

struct Inputs {
  Case c;
  int S, cap;
  std::vector<float> q, k, v, dout;
  std::vector<uint8_t> valid;
  bf *dq_, *dk_, *dv_, *ddo;
  uint8_t* dvalid;
  int* dfirst;
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
  }
  static bf* upload(const std::vector<float>& x) {
    std::vector<bf> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16_rn(x[i]);
    bf* d = (bf*)dalloc(h.size() * 2);
    h2d(d, h.data(), h.size() * 2);
    return d;
  }
  ~Inputs() {
    dfree(dq_), dfree(dk_), dfree(dv_), dfree(ddo), dfree(dvalid), dfree(dfirst);
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
    const int nsplit = (S + FD_SPLIT - 1) / FD_SPLIT;
    float* part = (float*)dalloc((size_t)c.B * c.H * nsplit * (c.D + 2) * 4);
    LAUNCH(flash_decode_split_bf16, dim3(nsplit, c.KV, c.B), dim3(128), 0, in.dq_, in.dk_,
           in.dv_, in.dvalid, in.dfirst, part, nsplit, c.H, c.KV, c.T, S, cap, c.D, c.past, scale);
    LAUNCH(flash_decode_combine_bf16, dim3(c.H, c.B), dim3(128), 0, part, o, stats, nsplit, c.H,
           c.D);
    dfree(part);
  } else {
    const dim3 grid((c.T + FM_ROWS - 1) / FM_ROWS, c.H, c.B);
    if (c.D == 128)
      LAUNCH(flash_fwd_mma_d128_bf16, grid, dim3(FM_THREADS), fm_smem_fwd(128), in.dq_, in.dk_,
             in.dv_, in.dvalid, in.dfirst, o, stats, c.H, c.KV, c.T, S, cap, c.D, c.past, scale);
    else
      LAUNCH(flash_fwd_mma_d64_bf16, grid, dim3(FM_THREADS), fm_smem_fwd(64), in.dq_, in.dk_,
             in.dv_, in.dvalid, in.dfirst, o, stats, c.H, c.KV, c.T, S, cap, c.D, c.past, scale);
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
  const dim3 gq((c.T + FM_ROWS - 1) / FM_ROWS, c.H, c.B), gk((S + FM_ROWS - 1) / FM_ROWS, c.KV, c.B);
  if (c.D == 128) {
    LAUNCH(flash_dq_mma_d128_bf16, gq, dim3(FM_THREADS), fm_smem_fwd(128), in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dq, c.H, c.KV, c.T, S, S, c.D, c.past, scale);
    LAUNCH(flash_dkdv_mma_d128_bf16, gk, dim3(FM_THREADS), fm_smem_dkdv(128), in.dq_, in.dk_,
           in.dv_, in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, c.H, c.KV, c.T, S, S, c.D,
           c.past, scale);
  } else {
    LAUNCH(flash_dq_mma_d64_bf16, gq, dim3(FM_THREADS), fm_smem_fwd(64), in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dq, c.H, c.KV, c.T, S, S, c.D, c.past, scale);
    LAUNCH(flash_dkdv_mma_d64_bf16, gk, dim3(FM_THREADS), fm_smem_dkdv(64), in.dq_, in.dk_, in.dv_,
           in.ddo, stats, delta, in.dvalid, in.dfirst, dk, dv, c.H, c.KV, c.T, S, S, c.D, c.past,
           scale);
  }
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
  double serr = 0;
  for (size_t r = 0; r < ref.m.size(); ++r) {
    const double e = std::fabs(sg[2 * r] - ref.m[r]) / std::max(1.0, std::fabs(ref.m[r])) +
                     std::fabs(sg[2 * r + 1] * ref.l[r] - 1.0);
    serr = std::max(serr, std::isnan(e) ? INFINITY : e);
  }
  report(name(path, false), c, std::max(rel_err(got, ref.o), serr * 1e-2 / 1e-3), 1e-2);
  if (path != DECODE && in.cap == in.S) {
    bf *dq = (bf*)dalloc(in.nq * 2), *dk = (bf*)dalloc(in.nk * 2), *dv = (bf*)dalloc(in.nk * 2);
    float* delta = (float*)dalloc(in.nq / c.D * 4);
    poison(dq, in.nq * 2), poison(dk, in.nk * 2), poison(dv, in.nk * 2);
    backward(in, path, o, stats, delta, dq, dk, dv);
    const double e = std::max({rel_err(download_bf(dq, in.nq), ref.dq),
                               rel_err(download_bf(dk, in.nk), ref.dk),
                               rel_err(download_bf(dv, in.nk), ref.dv)});
    report(name(path, true), c, e, 2e-2);
    dfree(dq), dfree(dk), dfree(dv), dfree(delta);
  }
  dfree(o), dfree(stats);
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
    dfree(dq), dfree(dk), dfree(dv), dfree(delta);
  }
  printf("\n");
  dfree(o), dfree(stats);
}
#endif

int main(int argc, char** argv) {
  const int seeds = seeds_arg(argc, argv);
  // {B, H, KV, T, past, D, pad, cap}
  const Case mma_cases[] = {
      {2, 4, 2, 100, 0, 128, 50, 0},    // GQA 2, left padding (blind rows), a partial tile
      {2, 4, 1, 129, 0, 64, 100, 0},    // GQA 4, head dim 64, three tiles
      {1, 2, 2, 64, 0, 128, 0, 0},      // one whole tile, no padding
      {2, 2, 1, 200, 0, 64, 130, 0},    // padding over two whole key blocks
      {2, 4, 2, 100, 30, 128, 50, 0},   // a cached prefix (the forward after a prefill)
      {2, 2, 2, 70, 0, 64, 0, 0, true}, // a sequence of padding only: every row blind
  };
  const Case row_cases[] = {{2, 4, 2, 100, 30, 128, 50, 0}, {2, 4, 1, 129, 70, 64, 100, 0},
                            {2, 2, 1, 77, 0, 32, 20, 0}};
  const Case decode_cases[] = {{3, 14, 2, 1, 1300, 128, 900, 1400}, {2, 2, 1, 1, 40, 32, 41, 0}};
  const Case gpu_cases[] = {{2, 16, 8, 300, 0, 128, 40, 0}, {2, 16, 8, 1, 1024, 128, 0, 0}};
  for (int s = 0; s < seeds; ++s) {
    use_schedule(s, 4);  // fair or one warp lagging, copies landing late or early
    for (const Case& c : mma_cases) check(c, MMA);
    if (s == 0) {
      for (const Case& c : row_cases) check(c, ROW);
      for (const Case& c : decode_cases) check(c, DECODE);
      if (on_gpu) {
        for (const Case& c : gpu_cases) check(c, c.T == 1 ? DECODE : MMA);
        check(gpu_cases[0], ROW);
      }
    }
  }
#ifndef ACPO_EMU
  const Case times[] = {{64, 16, 8, 1, 1024, 128, 0, 2048}, {64, 16, 8, 1, 2047, 128, 0, 2048},
                        {1, 16, 8, 1, 8191, 128, 0, 0},     {64, 16, 8, 1024, 0, 128, 0, 0},
                        {2, 16, 8, 2048, 0, 128, 0, 0},     {2, 16, 8, 9220, 0, 128, 0, 0}};
  for (const Case& c : times) timing(c, c.T == 1 ? DECODE : MMA);
  timing({2, 16, 8, 2048, 0, 128, 0, 0}, ROW);
  timing({64, 16, 8, 1, 1024, 128, 0, 2048}, ROW);
#endif
  printf("%s\n", failures ? "FAILED" : "all checks ok");
  return failures ? 1 : 0;
}
