// The whole-model AdamW step of kernels/adamw.cu alone, without the Rust build: the squared
// gradient norm against a float64 sum, and every parameter and moment after each step against
// the CPU twin (src/optim.rs `fused_update`, restated below operation for operation) bit for
// bit, and against a float64 AdamW to 1e-5; over tensors of odd lengths around the chunk size
// (an empty one, one element, one chunk less one, one chunk, one more), f32 and bf16 parameters,
// a parameter without a gradient, clipped and unclipped steps. Then the step's two exits: a
// NaN gradient skips the step (nothing written, the norm read back not finite), and an update
// that overflows sets the non-finite flag.
//
//   on a GPU:    nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels kernels/check/adamw_check.cu -o aw && ./aw
//   on the CPU:  g++ -O2 -std=c++17 -DACPO_EMU -Ikernels -x c++ kernels/check/adamw_check.cu -o aw && ./aw
//
// The CPU build runs the kernels in kernels/check/cuda_emu.hpp's emulator (tests/it/optim.rs
// runs it in `cargo test`); `./aw --seeds N` repeats everything under N thread schedules.
#include "adamw.cu"

#include "harness.hpp"  // device memory (guard pages in the emulator), launches, rnd

static void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    printf("FAILED %s\n", what.c_str());
  }
}
static uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// One parameter tensor: its values on the host (p as f32, or bf16 bits), moments, gradient,
// and their device copies.
struct Param {
  size_t len;
  bool bf16, has_grad;
  std::vector<float> p, m, v, g;  // p: the values (bf16-representable when bf16)
  void *dp, *dm, *dv, *dg;
  Param(size_t n, bool bf, bool grad) : len(n), bf16(bf), has_grad(grad) {
    p.resize(n), m.resize(n), v.resize(n), g.resize(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = bf ? __bfloat162float(__float2bfloat16_rn(rnd())) : rnd();
      m[i] = 0.01f * rnd();
      v[i] = 1e-4f * std::fabs(rnd());
    }
    dp = dalloc(n * (bf ? 2 : 4)), dm = dalloc(n * 4), dv = dalloc(n * 4), dg = dalloc(n * 4);
    upload();
  }
  void upload() {
    if (bf16) {
      std::vector<__nv_bfloat16> h(len);
      for (size_t i = 0; i < len; ++i) h[i] = __float2bfloat16_rn(p[i]);
      h2d(dp, h.data(), len * 2);
    } else {
      h2d(dp, p.data(), len * 4);
    }
    h2d(dm, m.data(), len * 4), h2d(dv, v.data(), len * 4), h2d(dg, g.data(), len * 4);
  }
  void download(std::vector<float>& pp, std::vector<float>& mm, std::vector<float>& vv) const {
    pp.resize(len), mm.resize(len), vv.resize(len);
    if (bf16) {
      std::vector<__nv_bfloat16> h(len);
      d2h(h.data(), dp, len * 2);
      for (size_t i = 0; i < len; ++i) pp[i] = __bfloat162float(h[i]);
    } else {
      d2h(pp.data(), dp, len * 4);
    }
    d2h(mm.data(), dm, len * 4), d2h(vv.data(), dv, len * 4);
  }
};

// The device table of `ps` (kernels/adamw.cu's layout) and its number of chunks.
static std::vector<uint64_t> table(const std::vector<Param*>& ps, unsigned* chunks) {
  std::vector<uint64_t> w;
  for (Param* p : ps)
    w.insert(w.end(), {(uint64_t)p->dp, p->has_grad ? (uint64_t)p->dg : 0, (uint64_t)p->dm,
                       (uint64_t)p->dv, (uint64_t)p->len});
  uint64_t c = 0;
  for (Param* p : ps) {
    w.push_back(c);
    c += (p->len + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
  }
  w.push_back(c);
  *chunks = (unsigned)c;
  return w;
}

struct Hyper {
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, wd = 0.01, eps = 1e-8, max_norm;
  int t;
};

static AdamWConsts consts(const Hyper& h) {
  const double bc1 = 1 - std::pow(h.b1, h.t), bc2 = 1 - std::pow(h.b2, h.t);
  return {(float)h.b1, (float)(1 - h.b1), (float)h.b2, (float)(1 - h.b2),
          (float)(1 - h.lr * h.wd), (float)(1 / std::sqrt(bc2)), (float)h.eps,
          (float)(h.lr / bc1)};
}

// The step as the host runs it: ‖g‖² (partials, then their sum), then each dtype's update;
// returns [‖g‖², non-finite flag].
static void device_step(std::vector<Param*>& all, const Hyper& h, double out[2]) {
  unsigned chunks, n = (unsigned)all.size();
  std::vector<uint64_t> w = table(all, &chunks);
  uint64_t* dw = (uint64_t*)dalloc(w.size() * 8);
  h2d(dw, w.data(), w.size() * 8);
  double* partials = (double*)dalloc((chunks ? chunks : 1) * 8);
  double* dout = (double*)dalloc(16);
  const double poison[2] = {NAN, NAN};
  h2d(dout, poison, 16);
  if (chunks) LAUNCH(adamw_sq_partials, dim3(chunks), dim3(ADAMW_THREADS), 0, dw, n, partials);
  LAUNCH(adamw_sq_total, dim3(1), dim3(ADAMW_THREADS), 0, partials, chunks, dout);
  const AdamWConsts c = consts(h);
  for (int bf = 0; bf < 2; ++bf) {
    std::vector<Param*> these;
    for (Param* p : all)
      if (p->bf16 == (bf == 1)) these.push_back(p);
    unsigned tc, tn = (unsigned)these.size();
    std::vector<uint64_t> tw = table(these, &tc);
    if (!tc) continue;
    uint64_t* dtw = (uint64_t*)dalloc(tw.size() * 8);
    h2d(dtw, tw.data(), tw.size() * 8);
    if (bf)
      LAUNCH(adamw_update_bf16, dim3(tc), dim3(ADAMW_THREADS), 0, dtw, tn, dout, h.max_norm, c);
    else
      LAUNCH(adamw_update_f32, dim3(tc), dim3(ADAMW_THREADS), 0, dtw, tn, dout, h.max_norm, c);
    dfree(dtw);
  }
  d2h(out, dout, 16);
  dfree(dw), dfree(partials), dfree(dout);
}

// The CPU twin's element (src/optim.rs `fused_update`), in plain f32 (g++ contracts nothing
// without an FMA target).
static void twin(float g, float scale, const AdamWConsts& c, float& p, float& m, float& v) {
  const float gs = g * scale + 0.0f;
  const float m1 = (m * c.b1 + 0.0f) + (gs * c.one_minus_b1 + 0.0f);
  const float v1 = (v * c.b2 + 0.0f) + ((gs * gs) * c.one_minus_b2 + 0.0f);
  const float denom = (std::sqrt(v1) * c.inv_sqrt_bc2 + 0.0f) * 1.0f + c.eps;
  p = (p * c.decay + 0.0f) - ((m1 / denom) * c.step + 0.0f);
  m = m1, v = v1;
}

// AdamW in float64 throughout (no intermediate rounding): the twin's arithmetic must agree.
static double adamw64(double g, double scale, const Hyper& h, double p, double& m, double& v) {
  const double gs = g * scale;
  m = h.b1 * m + (1 - h.b1) * gs;
  v = h.b2 * v + (1 - h.b2) * gs * gs;
  const double bc1 = 1 - std::pow(h.b1, h.t), bc2 = 1 - std::pow(h.b2, h.t);
  return p * (1 - h.lr * h.wd) - h.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
}

static void steps(int seed) {
  const size_t C = ADAMW_CHUNK;
  std::vector<Param*> all = {new Param(C + 1, false, true),    new Param(0, false, true),
                             new Param(1, true, true),         new Param(C - 1, false, false),
                             new Param(2 * C + 37, true, true), new Param(C, false, true),
                             new Param(300, false, true)};
  double max_norms[3] = {1e9, 0.5, 1e9};  // unclipped, clipped, unclipped
  for (int t = 1; t <= 3; ++t) {
    long double sq = 0;
    for (Param* p : all)
      for (size_t i = 0; i < p->len; ++i) {
        p->g[i] = p->has_grad ? (t == 2 ? 3.0f : 0.5f) * rnd() : 0.0f;
        if (p->has_grad) sq += (long double)p->g[i] * p->g[i];
      }
    for (Param* p : all) p->upload();
    Hyper h;
    h.t = t, h.max_norm = max_norms[t - 1];
    double out[2];
    device_step(all, h, out);
    const std::string at = "seed " + std::to_string(seed) + " step " + std::to_string(t);
    const double rel = std::fabs(out[0] - (double)sq) / (double)sq;
    check(rel < 1e-12, at + ": ||g||^2 off by " + std::to_string(rel));
    check(out[1] == 0.0, at + ": non-finite flag set");
    // The host's clip scale from the kernel's own norm, as `AdamW::step` forms it.
    const double coef = h.max_norm / (std::sqrt(out[0]) + 1e-6);
    const float scale = (float)(coef < 1.0 ? coef : 1.0);
    check((t == 2) == (scale < 1.0f), at + ": clipping where it should not be, or not where it should");
    const AdamWConsts c = consts(h);
    double worst = 0;
    size_t differ = 0;
    for (Param* p : all) {
      std::vector<float> pp, mm, vv;
      p->download(pp, mm, vv);
      for (size_t i = 0; i < p->len; ++i) {
        double m64 = p->m[i], v64 = p->v[i];
        const double want = adamw64(p->g[i], scale, h, p->p[i], m64, v64);
        float tp = p->p[i], tm = p->m[i], tv = p->v[i];
        twin(p->g[i], scale, c, tp, tm, tv);
        if (p->bf16) tp = __bfloat162float(__float2bfloat16_rn(tp));
        differ += bits(tp) != bits(pp[i]) || bits(tm) != bits(mm[i]) || bits(tv) != bits(vv[i]);
        const double tol = p->bf16 ? 8e-3 : 1e-5;
        const double e = std::fabs(pp[i] - want) / std::max(std::fabs(want), 1e-3);
        worst = std::max(worst, e / tol);
        p->p[i] = pp[i], p->m[i] = mm[i], p->v[i] = vv[i];
      }
    }
    check(differ == 0, at + ": " + std::to_string(differ) + " elements differ from the CPU twin's bits");
    check(worst <= 1.0, at + ": off the float64 AdamW by " + std::to_string(worst) + "x its tolerance");
    printf("adamw step %d (%s): ||g||^2 rel err %.1e, %zu elements differ from the twin, "
           "float64 error %.2f of tolerance\n",
           t, t == 2 ? "clipped" : "unclipped", rel, differ, worst);
  }
  // A NaN gradient: the norm is not finite and the step writes nothing.
  all[0]->g[3] = NAN;
  all[0]->upload();
  Hyper h;
  h.t = 4, h.max_norm = 1.0;
  double out[2];
  device_step(all, h, out);
  check(!std::isfinite(std::sqrt(out[0])), "a NaN gradient gives a finite norm");
  size_t moved = 0;
  for (Param* p : all) {
    std::vector<float> pp, mm, vv;
    p->download(pp, mm, vv);
    for (size_t i = 0; i < p->len; ++i)
      moved += bits(pp[i]) != bits(p->p[i]) || bits(mm[i]) != bits(p->m[i]) ||
               bits(vv[i]) != bits(p->v[i]);
  }
  check(moved == 0, "a skipped step wrote " + std::to_string(moved) + " elements");
  printf("adamw NaN gradient: norm %g, %zu elements written\n", std::sqrt(out[0]), moved);
  // An update that overflows: the flag is set.
  all[0]->g[3] = 0.25f;
  all[0]->upload();
  h.lr = 1e38;
  h.wd = 0;
  device_step(all, h, out);
  check(out[1] == 1.0, "an update to ±inf leaves the non-finite flag clear");
  printf("adamw overflow: non-finite flag %g\n", out[1]);
  for (Param* p : all) {
    dfree(p->dp), dfree(p->dm), dfree(p->dv), dfree(p->dg);
    delete p;
  }
}

int main(int argc, char** argv) {
  const int seeds = seeds_arg(argc, argv);
  for (int s = 0; s < seeds; ++s) {
    use_schedule(s, 2);  // fair, or one warp lagging behind the others
    steps(s);
  }
  if (failures) {
    printf("%d checks failed\n", failures);
    return 1;
  }
  printf("all checks ok\n");
  return 0;
}
