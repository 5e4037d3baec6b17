// Every kernel of kernels/ other than flash attention (flash_check.cu), alone, without the Rust
// build, against a float64 reference: RMSNorm (forward, dx, and the two-pass dw), SwiGLU
// (forward, backward), RoPE (all three layouts: in place, tokens first → heads first and back)
// and its tables of positions,
// the attention softmax, the token log-probabilities (forward, backward), the vocabulary chunks'
// statistics and gradient (a whole vocabulary walked in chunks), the embedding's backward, and
// sampling (AdamW: adamw_check.cu)
// (the CPU sampler's rule, src/rollout/sample.rs `sample_token`, on the same draws). f32 and
// bf16 storage where a kernel has both. Shapes hit the edges: rows shorter than a block, rows
// longer than a block but not a multiple of it, columns not a multiple of a tile, rows not a
// multiple of a chunk, grids shorter than the data (the grid-stride loops wrap), fully masked
// rows, zero gradients. Every output is poisoned with NaN before its launch.
//
//   on a GPU:    nvcc -O3 -std=c++17 -arch=sm_90 -cudart shared -Ikernels kernels/check/ops_check.cu -o ops && ./ops
//   on the CPU:  g++ -O2 -std=c++17 -DACPO_EMU -Ikernels -x c++ kernels/check/ops_check.cu -o ops && ./ops
//
// On a GPU it then times the kernels issue #44 changed at Qwen3-1.7B's shapes (2 x 2,048 and
// 2 x 9,220 tokens), to set beside kernels/NOTES.md's predictions.
//
// `--seeds N` repeats every check under N emulator schedules (thread orders; odd ones with a
// warp lagging behind the others, which a missing barrier does not survive).
//
// tests/it/kernels.rs runs the CPU build in `cargo test` (and once more built with
// AddressSanitizer). Tolerances are relative L2 errors: f32 outputs 1e-5, bf16
// outputs 1e-2 (their rounding alone is ~2e-3).
#include "decode_chain.cu"
#include "embedding.cu"
#include "log_probs.cu"
#include "rms_norm.cu"
#include "rope.cu"
#include "sample.cu"
#include "softmax.cu"
#include "swiglu.cu"
#include "vocab_chunk.cu"
#include "check/harness.hpp"

// ---- device buffers of f32 or bf16 from host floats, and back

template <typename T>
struct Buf {
  T* d;
  size_t n;
  explicit Buf(size_t n_) : d((T*)dalloc(n_ * sizeof(T))), n(n_) { poison(d, n * sizeof(T)); }
  Buf(const std::vector<float>& h) : Buf(h.size()) {
    std::vector<T> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = from_host(h[i]);
    h2d(d, t.data(), n * sizeof(T));
  }
  ~Buf() { dfree(d); }
  Buf(const Buf&) = delete;
  std::vector<float> get() const {
    std::vector<T> t(n);
    d2h(t.data(), d, n * sizeof(T));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = to_host(t[i]);
    return out;
  }
  static T from_host(float x);
  static float to_host(T x);
};
template <> float Buf<float>::from_host(float x) { return x; }
template <> float Buf<float>::to_host(float x) { return x; }
template <> bf Buf<bf>::from_host(float x) { return __float2bfloat16_rn(x); }
template <> float Buf<bf>::to_host(bf x) { return __bfloat162float(x); }

// Random values as the storage type holds them (so the reference sees the kernel's inputs).
template <typename T>
static std::vector<float> randoms(size_t n, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) x = Buf<T>::to_host(Buf<T>::from_host(rnd() * scale));
  return v;
}

template <typename T>
static const char* tname() {
  return sizeof(T) == 4 ? "f32" : "bf16";
}
template <typename T>
static double tol() {
  return sizeof(T) == 4 ? 1e-5 : 1e-2;
}

static void report(const std::string& what, double err, double limit) {
  const bool ok = err <= limit;
  printf("%-44s rel err %.2e (limit %.0e) %s\n", what.c_str(), err, limit, ok ? "ok" : "FAILED");
  if (!ok) failures++;
}

static unsigned blocks_for(size_t n, unsigned threads) {
  return (unsigned)std::max<size_t>(1, (n + threads - 1) / threads);
}

// ---- RMSNorm

template <typename T>
static void check_rms_norm(int rows, int n) {
  const float eps = 1e-6f;
  const auto x = randoms<T>((size_t)rows * n, 2.0f), w = randoms<T>(n, 1.0f),
             dy = randoms<T>((size_t)rows * n, 1.0f), res = randoms<T>((size_t)rows * n, 1.0f);
  std::vector<double> y(x.size()), dx(x.size()), dw(n, 0.0), dx_res(x.size());
  for (int i = 0; i < rows; ++i) {
    const float* xr = &x[(size_t)i * n];
    const float* dyr = &dy[(size_t)i * n];
    double ss = 0, gx = 0;
    for (int j = 0; j < n; ++j) ss += (double)xr[j] * xr[j], gx += (double)xr[j] * dyr[j] * w[j];
    const double r = 1.0 / std::sqrt(ss / n + eps), c = r * r * r * gx / n;
    for (int j = 0; j < n; ++j) {
      y[(size_t)i * n + j] = xr[j] * r * w[j];
      dx[(size_t)i * n + j] = r * dyr[j] * w[j] - xr[j] * c;
      dx_res[(size_t)i * n + j] = res[(size_t)i * n + j] + dx[(size_t)i * n + j];
      dw[j] += (double)dyr[j] * xr[j] * r;
    }
  }
  Buf<T> dx_(x), dw_(w), ddy(dy), dy_out((size_t)rows * n);
  Buf<T> out((size_t)(rows + 1) * n), dres(res), out_res((size_t)rows * n);
  Buf<float> rs(std::max(rows, 1)), rs_res(std::max(rows, 1));
  char what[96];
  const char* ty = tname<T>();
  if constexpr (sizeof(T) == 4) {
    LAUNCH(rms_norm_fwd_f32, dim3(rows), dim3(ROW_THREADS), 0, dx_.d, dw_.d, dy_out.d, n, eps);
    LAUNCH(rms_norm_bwd_dx_f32, dim3(rows), dim3(ROW_THREADS), 0, dx_.d, dw_.d, ddy.d, out.d,
           rs.d, n, eps);
    LAUNCH(rms_norm_bwd_dx_res_f32, dim3(rows), dim3(ROW_THREADS), 0, dx_.d, dw_.d, ddy.d,
           dres.d, out_res.d, rs_res.d, n, eps);
  } else {
    LAUNCH(rms_norm_fwd_bf16, dim3(rows), dim3(ROW_THREADS), 0, dx_.d, dw_.d, dy_out.d, n, eps);
    LAUNCH(rms_norm_bwd_dx_bf16, dim3(rows), dim3(ROW_THREADS), 0, dx_.d, dw_.d, ddy.d, out.d,
           rs.d, n, eps);
    LAUNCH(rms_norm_bwd_dx_res_bf16, dim3(rows), dim3(ROW_THREADS), 0, dx_.d, dw_.d, ddy.d,
           dres.d, out_res.d, rs_res.d, n, eps);
  }
  // the two-pass weight gradient: partial sums per (chunk, column), then the chunks in order
  const int chunks = (rows + RMS_DW_ROWS - 1) / RMS_DW_ROWS;
  Buf<float> partial((size_t)chunks * n);
  const dim3 g1((n + RMS_DW_COLS - 1) / RMS_DW_COLS, chunks), b1(RMS_DW_COLS, RMS_DW_GROUPS);
  if constexpr (sizeof(T) == 4) {
    LAUNCH(rms_norm_bwd_dw_partial_f32, g1, b1, 0, dx_.d, ddy.d, rs.d, partial.d, rows, n);
    LAUNCH(rms_norm_bwd_dw_sum_f32, dim3(blocks_for(n, ELEM_THREADS)), dim3(ELEM_THREADS), 0,
           partial.d, out.d, chunks, rows, n);
  } else {
    LAUNCH(rms_norm_bwd_dw_partial_bf16, g1, b1, 0, dx_.d, ddy.d, rs.d, partial.d, rows, n);
    LAUNCH(rms_norm_bwd_dw_sum_bf16, dim3(blocks_for(n, ELEM_THREADS)), dim3(ELEM_THREADS), 0,
           partial.d, out.d, chunks, rows, n);
  }
  const auto got = out.get();
  snprintf(what, sizeof what, "rms_norm fwd %s %dx%d", ty, rows, n);
  report(what, rel_err(dy_out.get(), y), tol<T>());
  snprintf(what, sizeof what, "rms_norm bwd dx %s %dx%d", ty, rows, n);
  report(what, rel_err(std::vector<float>(got.begin(), got.begin() + (size_t)rows * n), dx),
         tol<T>());
  snprintf(what, sizeof what, "rms_norm bwd dx + residual %s %dx%d", ty, rows, n);
  report(what, rel_err(out_res.get(), dx_res), tol<T>());
  // the same pass, so the same 1/rms for dw
  snprintf(what, sizeof what, "rms_norm bwd dx + residual: its 1/rms %s %dx%d", ty, rows, n);
  report(what, rs_res.get() == rs.get() ? 0.0 : 1.0, 0.0);
  if constexpr (sizeof(T) == 4) {
    // in f32 the one pass gives the bits of the separate add (res + dx, dx as the plain kernel
    // writes it): what the CPU twin gives
    const auto sum = out_res.get();
    size_t wrong = 0;
    for (size_t k = 0; k < sum.size(); ++k) wrong += sum[k] != res[k] + got[k];
    snprintf(what, sizeof what, "rms_norm bwd dx + residual: res + dx's bits %s %dx%d", ty, rows,
             n);
    report(what, (double)wrong, 0.0);
  }
  snprintf(what, sizeof what, "rms_norm bwd dw (two-pass) %s %dx%d", ty, rows, n);
  report(what, rel_err(std::vector<float>(got.begin() + (size_t)rows * n, got.end()), dw),
         tol<T>());
}

// ---- SwiGLU

template <typename T>
static void check_swiglu(size_t len, unsigned max_blocks) {
  const auto g = randoms<T>(len, 4.0f), u = randoms<T>(len, 2.0f), dy = randoms<T>(len, 1.0f);
  std::vector<double> y(len), dgu(2 * len);
  for (size_t i = 0; i < len; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-(double)g[i]));
    y[i] = g[i] * s * u[i];
    dgu[i] = dy[i] * u[i] * s * (1 + g[i] * (1 - s));
    dgu[len + i] = dy[i] * g[i] * s;
  }
  Buf<T> dg(g), du(u), ddy(dy), out(len), back(2 * len);
  const dim3 grid(std::min(blocks_for(len, ELEM_THREADS), max_blocks));
  if constexpr (sizeof(T) == 4) {
    LAUNCH(swiglu_fwd_f32, grid, dim3(ELEM_THREADS), 0, dg.d, du.d, out.d, len);
    LAUNCH(swiglu_bwd_f32, grid, dim3(ELEM_THREADS), 0, dg.d, du.d, ddy.d, back.d, len);
  } else {
    LAUNCH(swiglu_fwd_bf16, grid, dim3(ELEM_THREADS), 0, dg.d, du.d, out.d, len);
    LAUNCH(swiglu_bwd_bf16, grid, dim3(ELEM_THREADS), 0, dg.d, du.d, ddy.d, back.d, len);
  }
  char what[96];
  snprintf(what, sizeof what, "swiglu fwd %s len %zu, %u blocks", tname<T>(), len, grid.x);
  report(what, rel_err(out.get(), y), tol<T>());
  snprintf(what, sizeof what, "swiglu bwd %s len %zu, %u blocks", tname<T>(), len, grid.x);
  report(what, rel_err(back.get(), dgu), tol<T>());
}

// ---- RoPE: x in one layout, y in another, cos/sin (B, 1, T, D) with equal halves

template <typename T>
static void check_rope(int B, int H, int Tn, int D, bool x_heads, bool y_heads, float sign) {
  const size_t n = (size_t)B * H * Tn * D;
  const auto x = randoms<T>(n, 1.0f);
  std::vector<float> cs((size_t)B * Tn * D), sn(cs.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int j = 0; j < D / 2; ++j) {
        const float a = rnd() * 3.0f;
        for (int k : {j, j + D / 2}) {
          cs[((size_t)b * Tn + t) * D + k] = Buf<T>::to_host(Buf<T>::from_host(std::cos(a)));
          sn[((size_t)b * Tn + t) * D + k] = Buf<T>::to_host(Buf<T>::from_host(std::sin(a)));
        }
      }
  const int half = D / 2;
  std::vector<double> y(n);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < Tn; ++t) {
        const size_t xr = x_heads ? ((size_t)b * H + h) * Tn + t : ((size_t)b * Tn + t) * H + h;
        const size_t yr = y_heads ? ((size_t)b * H + h) * Tn + t : ((size_t)b * Tn + t) * H + h;
        for (int j = 0; j < half; ++j) {
          const double c = cs[((size_t)b * Tn + t) * D + j], s = sign * sn[((size_t)b * Tn + t) * D + j];
          const double x1 = x[xr * D + j], x2 = x[xr * D + half + j];
          y[yr * D + j] = x1 * c - x2 * s;
          y[yr * D + half + j] = x2 * c + x1 * s;
        }
      }
  Buf<T> dx(x), dc(cs), ds(sn), out(n);
  const size_t pairs = n / 2;
  // a grid of at most 3 blocks: the loop strides over the rest
  const dim3 grid(std::min(blocks_for(pairs, ELEM_THREADS), 3u));
  const int xh = x_heads, yh = y_heads;
  if constexpr (sizeof(T) == 4)
    LAUNCH(rope_f32, grid, dim3(ELEM_THREADS), 0, dx.d, dc.d, ds.d, out.d, H, Tn, D, sign, pairs,
           xh, yh);
  else
    LAUNCH(rope_bf16, grid, dim3(ELEM_THREADS), 0, dx.d, dc.d, ds.d, out.d, H, Tn, D, sign, pairs,
           xh, yh);
  char what[96];
  snprintf(what, sizeof what, "rope %s %s->%s sign %+.0f %dx%dx%dx%d", tname<T>(),
           x_heads ? "BHTD" : "BTHD", y_heads ? "BHTD" : "BTHD", sign, B, H, Tn, D);
  report(what, rel_err(out.get(), y), tol<T>());
}

// ---- the rotary tables of positions: cos or sin of float(p)·inv_freq[j], (B, 1, T, D) with equal
// halves. The reference takes the argument as the model's f32 formula rounds it (a position of
// 9,220 times an f32 frequency: its rounding moves cos by ~1e-4, the formula's, not the kernel's)
// and its cos/sin in float64.

template <typename T>
static void check_rope_table(int rows, int D, double theta, unsigned max_pos, bool want_sin) {
  const int half = D / 2;
  std::vector<float> inv(half);
  for (int j = 0; j < half; ++j) inv[j] = (float)(1.0 / std::pow(theta, (2.0 * j) / D));
  std::vector<uint32_t> pos(rows);
  for (int r = 0; r < rows; ++r) pos[r] = r == 0 ? 0 : (r == 1 ? max_pos : (unsigned)((rnd() + 1) * 0.5 * max_pos));
  const size_t n = (size_t)rows * D;
  std::vector<double> want(n);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < D; ++c) {
      const double f = (float)pos[r] * inv[c < half ? c : c - half];
      want[(size_t)r * D + c] = want_sin ? std::sin(f) : std::cos(f);
    }
  Buf<float> dinv(inv);
  Buf<T> out(n);
  uint32_t* dpos = (uint32_t*)dalloc(rows * 4);
  h2d(dpos, pos.data(), rows * 4);
  const dim3 grid(std::min(blocks_for(n, ELEM_THREADS), 3u));
  const int ws = want_sin;
  if constexpr (sizeof(T) == 4)
    LAUNCH(rope_table_f32, grid, dim3(ELEM_THREADS), 0, dpos, dinv.d, out.d, D, ws, n);
  else
    LAUNCH(rope_table_bf16, grid, dim3(ELEM_THREADS), 0, dpos, dinv.d, out.d, D, ws, n);
  dfree(dpos);
  char what[96];
  snprintf(what, sizeof what, "rope_table %s %s %d positions <= %u, D %d", tname<T>(),
           want_sin ? "sin" : "cos", rows, max_pos, D);
  report(what, rel_err(out.get(), want), tol<T>());
}

// ---- whole rows into a paged pool (decode_chain.cu's pool_store_*): n source rows of `bytes`
// each to the pool rows a write index of `stride` columns names (its first column read, the
// others past the pool), in words of 4 or 16 bytes, on a grid of `blocks` (few: the grid-stride
// loop wraps). Distinct rows: each holds its source's bytes and every other row its own; the
// scratch case writes `dups` more rows to pool row 0, which must then hold one of theirs.
static void check_pool_store(size_t n_pool, size_t n, size_t bytes, int word, int blocks, size_t dups) {
  const size_t stride = 3, words = bytes / word;
  std::vector<uint8_t> pool0(n_pool * bytes), src((n + dups) * bytes);
  for (size_t i = 0; i < pool0.size(); ++i) pool0[i] = (uint8_t)(i * 131 + 7);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (uint8_t)(i * 37 + 11);
  std::vector<size_t> dest(n + dups, 0);
  // distinct rows above 0 in a scrambled order (7919 is prime, no pool here a multiple of it)
  for (size_t i = 0; i < n; ++i) dest[i] = 1 + (i * 7919 + 5) % (n_pool - 1);
  std::vector<uint32_t> index((n + dups) * stride, (uint32_t)n_pool + 3);
  for (size_t i = 0; i < dest.size(); ++i) index[i * stride] = (uint32_t)dest[i];
  uint8_t* dpool = (uint8_t*)dalloc(pool0.size());
  uint8_t* dsrc = (uint8_t*)dalloc(src.size());
  uint32_t* didx = (uint32_t*)dalloc(index.size() * 4);
  h2d(dpool, pool0.data(), pool0.size());
  h2d(dsrc, src.data(), src.size());
  h2d(didx, index.data(), index.size() * 4);
  const size_t rows = n + dups;
  if (word == 16)
    LAUNCH(pool_store_w16, dim3(blocks), dim3(ELEM_THREADS), 0, (const uint4*)dsrc, (uint4*)dpool,
           didx, stride, rows, words, n_pool);
  else
    LAUNCH(pool_store_w4, dim3(blocks), dim3(ELEM_THREADS), 0, (const unsigned*)dsrc, (unsigned*)dpool,
           didx, stride, rows, words, n_pool);
  std::vector<uint8_t> got(pool0.size());
  d2h(got.data(), dpool, got.size());
  dfree(dpool);
  dfree(dsrc);
  dfree(didx);
  std::vector<long> source(n_pool, -1);
  for (size_t i = 0; i < n; ++i) source[dest[i]] = (long)i;
  size_t wrong = 0;
  for (size_t r = 1; r < n_pool; ++r)
    for (size_t j = 0; j < bytes; ++j) {
      const uint8_t want = source[r] >= 0 ? src[(size_t)source[r] * bytes + j] : pool0[r * bytes + j];
      wrong += got[r * bytes + j] != want;
    }
  // row 0: untouched without duplicates, else each word one of the duplicates' (their order is
  // not fixed)
  for (size_t w = 0; w < words; ++w) {
    bool any = false;
    if (dups == 0) any = std::memcmp(&got[w * word], &pool0[w * word], word) == 0;
    for (size_t k = n; k < n + dups && !any; ++k)
      any = std::memcmp(&got[w * word], &src[k * bytes + w * word], word) == 0;
    wrong += !any;
  }
  char what[112];
  snprintf(what, sizeof what, "pool_store w%d %zu rows of %zu B into %zu, %zu to the scratch row", word, n, bytes,
           n_pool, dups);
  report(what, wrong ? INFINITY : 0.0, 0.0);
}

// ---- the embedding's backward (embedding.cu): the f32 gradient (V, h) from dy (n, h) at ids,
// from the lm_head's share `base` where given. Its CPU twin's sums (src/fused/embedding.rs:
// `0 + base`, then each row's positions in order, in f32) must be its bits exactly, in f32 and
// from bf16; a float64 sum bounds their round-off. `ids` has one token at positions p % 7 in
// {0, 3, 5} (more positions than a load of four, not a multiple of it), others scattered, rows
// no position names; a grid of `blocks` (fewer than the chunks: the loop wraps).
static std::vector<uint32_t> skewed_ids(int n, int vocab) {
  std::vector<uint32_t> ids(n);
  for (int p = 0; p < n; ++p)
    ids[p] = p % 7 == 0 || p % 7 == 3 || p % 7 == 5 ? 2
             : p % 7 == 1                           ? (uint32_t)(((size_t)p * 13) % (vocab / 2))
                                                    : (uint32_t)(((size_t)p * 5 + 1) % (vocab / 3));
  return ids;
}

// The host's counting sort (src/fused/embedding.rs, `TokenRows`): V + 1 starts, then the
// positions grouped by token, each group in position order.
static std::vector<uint32_t> embedding_meta(const std::vector<uint32_t>& ids, int vocab) {
  const size_t n = ids.size();
  std::vector<uint32_t> meta(vocab + 1 + n, 0);
  for (size_t p = 0; p < n; ++p) meta[ids[p] + 1]++;
  for (int t = 0; t < vocab; ++t) meta[t + 1] += meta[t];
  std::vector<uint32_t> next(meta.begin(), meta.begin() + vocab);
  for (size_t p = 0; p < n; ++p) meta[vocab + 1 + next[ids[p]]++] = (uint32_t)p;
  return meta;
}

template <typename T>
static void check_embedding_grad(int vocab, int n, int h, bool has_base, int blocks) {
  const auto ids = skewed_ids(n, vocab);
  const auto meta = embedding_meta(ids, vocab);
  const auto dy = randoms<T>((size_t)n * h, 1.0f);
  auto base = randoms<T>((size_t)vocab * h, 1.0f);
  for (size_t i = 0; i < base.size(); i += 5) base[i] = -0.0f;  // `0 + b` makes them +0
  std::vector<float> twin((size_t)vocab * h);
  std::vector<double> ref((size_t)vocab * h);
  for (size_t i = 0; i < twin.size(); ++i) {
    twin[i] = has_base ? 0.0f + base[i] : 0.0f;
    ref[i] = has_base ? base[i] : 0.0;
  }
  for (int p = 0; p < n; ++p)
    for (int c = 0; c < h; ++c) {
      twin[(size_t)ids[p] * h + c] += dy[(size_t)p * h + c];
      ref[(size_t)ids[p] * h + c] += dy[(size_t)p * h + c];
    }
  Buf<T> ddy(dy), dbase(base);
  Buf<float> out((size_t)vocab * h);
  uint32_t* dmeta = (uint32_t*)dalloc(meta.size() * 4);
  h2d(dmeta, meta.data(), meta.size() * 4);
  const int hb = has_base ? 1 : 0;
  if (sizeof(T) == 4)
    LAUNCH(embedding_grad_f32, dim3(blocks), dim3(ELEM_THREADS), 0, (const float*)ddy.d, (const float*)dbase.d, hb,
           dmeta, out.d, (size_t)vocab, (size_t)h);
  else
    LAUNCH(embedding_grad_bf16, dim3(blocks), dim3(ELEM_THREADS), 0, (const bf*)ddy.d, (const bf*)dbase.d, hb, dmeta,
           out.d, (size_t)vocab, (size_t)h);
  dfree(dmeta);
  const auto got = out.get();
  size_t wrong = 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &twin[i], 4);
    wrong += a != b;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  char what[112];
  snprintf(what, sizeof what, "embedding_grad %s %dx%d from %d rows%s, %zu bits off the twin", tname<T>(), vocab, h,
           n, has_base ? " + lm_head" : "", wrong);
  report(what, wrong ? INFINITY : std::sqrt(num / std::max(den, 1e-300)), 1e-5);
}

// ---- the decode step's fused chain: q/k RMSNorm + RoPE + the KV cache's new column, and the
// residual add + RMSNorm

// Dense: k and v into column `col` of the (B, KV, cap, D) buffers. Paged: the same buffers as a
// pool of B·KV·cap rows of D, the new rows at scattered pool rows read through a write index of
// `rows_stride` columns a row (only its first is read: the others hold indices past the pool).
template <typename T>
static void check_qk_norm_rope_cache(int B, int H, int KV, int D, int cap, int col, bool norm,
                                     bool paged = false) {
  const float eps = 1e-6f;
  const auto q = randoms<T>((size_t)B * H * D, 2.0f), k = randoms<T>((size_t)B * KV * D, 2.0f),
             v = randoms<T>((size_t)B * KV * D, 1.0f), qw = randoms<T>(D, 1.0f),
             kw = randoms<T>(D, 1.0f);
  std::vector<float> cs((size_t)B * D), sn(cs.size());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < D / 2; ++j) {
      const float a = rnd() * 3.0f;
      for (int i : {j, j + D / 2}) {
        cs[(size_t)b * D + i] = Buf<T>::to_host(Buf<T>::from_host(std::cos(a)));
        sn[(size_t)b * D + i] = Buf<T>::to_host(Buf<T>::from_host(std::sin(a)));
      }
    }
  // the cache holds earlier columns the kernel must leave as they are
  const auto kc0 = randoms<T>((size_t)B * KV * cap * D, 1.0f), vc0 = randoms<T>(kc0.size(), 1.0f);
  const int half = D / 2;
  // normalised and rotated: x's row of D at `x`, its weight, into `out`
  auto reference = [&](const float* x, const std::vector<float>& w) {
    std::vector<double> nv(D);
    double ss = 0;
    for (int j = 0; j < D; ++j) ss += (double)x[j] * x[j];
    const double r = norm ? 1.0 / std::sqrt(ss / D + eps) : 1.0;
    for (int j = 0; j < D; ++j) nv[j] = norm ? x[j] * r * w[j] : x[j];
    return nv;
  };
  std::vector<double> qref((size_t)B * H * D), kref((size_t)B * KV * D), vref((size_t)B * KV * D);
  auto rotate = [&](const std::vector<double>& nv, int b, double* out) {
    for (int j = 0; j < half; ++j) {
      const double c = cs[(size_t)b * D + j], s = sn[(size_t)b * D + j];
      out[j] = nv[j] * c - nv[half + j] * s;
      out[half + j] = nv[half + j] * c + nv[j] * s;
    }
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h)
      rotate(reference(&q[((size_t)b * H + h) * D], qw), b, &qref[((size_t)b * H + h) * D]);
    for (int h = 0; h < KV; ++h) {
      rotate(reference(&k[((size_t)b * KV + h) * D], kw), b, &kref[((size_t)b * KV + h) * D]);
      for (int j = 0; j < D; ++j) vref[((size_t)b * KV + h) * D + j] = v[((size_t)b * KV + h) * D + j];
    }
  }
  // one row's q, k and v heads side by side, as the product with [Wq; Wk; Wv] gives them
  std::vector<float> qkv;
  for (int b = 0; b < B; ++b) {
    qkv.insert(qkv.end(), &q[(size_t)b * H * D], &q[(size_t)(b + 1) * H * D]);
    qkv.insert(qkv.end(), &k[(size_t)b * KV * D], &k[(size_t)(b + 1) * KV * D]);
    qkv.insert(qkv.end(), &v[(size_t)b * KV * D], &v[(size_t)(b + 1) * KV * D]);
  }
  Buf<T> dqkv(qkv), dqw(qw), dkw(kw), dc(cs), ds(sn), qo((size_t)B * H * D), kc(kc0), vc(vc0);
  // the pool row (of D) that (b, j)'s new key and value go to
  const size_t pool_rows = (size_t)B * KV * cap;
  std::vector<size_t> dest((size_t)B * KV);
  for (size_t i = 0; i < dest.size(); ++i) dest[i] = i * cap + col;
  const size_t rows_stride = 3;
  std::vector<uint32_t> index(dest.size() * rows_stride, (uint32_t)pool_rows + 7);
  if (paged) {
    // distinct rows (7919 is prime, and no pool here has a multiple of it rows) in a scrambled
    // order, many of them in other sequences' buffers
    for (size_t i = 0; i < dest.size(); ++i) dest[i] = (i * 7919 + 3) % pool_rows;
    for (size_t i = 0; i < dest.size(); ++i) index[i * rows_stride] = (uint32_t)dest[i];
  }
  uint32_t* didx = (uint32_t*)dalloc(index.size() * 4);
  h2d(didx, index.data(), index.size() * 4);
  const size_t row_stride = (size_t)KV * cap * D, head_stride = (size_t)cap * D, c = col;
  const int nm = norm;
  const dim3 grid(B * (H + 2 * KV));
  if (paged) {
    if constexpr (sizeof(T) == 4)
      LAUNCH(qk_norm_rope_paged_f32, grid, dim3(DEC_THREADS), 0, dqkv.d, dqw.d, dkw.d, dc.d,
             ds.d, qo.d, kc.d, vc.d, H, KV, D, eps, nm, didx, rows_stride, pool_rows);
    else
      LAUNCH(qk_norm_rope_paged_bf16, grid, dim3(DEC_THREADS), 0, dqkv.d, dqw.d, dkw.d, dc.d,
             ds.d, qo.d, kc.d, vc.d, H, KV, D, eps, nm, didx, rows_stride, pool_rows);
  } else if constexpr (sizeof(T) == 4) {
    LAUNCH(qk_norm_rope_cache_f32, grid, dim3(DEC_THREADS), 0, dqkv.d, dqw.d, dkw.d, dc.d,
           ds.d, qo.d, kc.d, vc.d, H, KV, D, eps, nm, row_stride, head_stride, c);
  } else {
    LAUNCH(qk_norm_rope_cache_bf16, grid, dim3(DEC_THREADS), 0, dqkv.d, dqw.d, dkw.d, dc.d,
           ds.d, qo.d, kc.d, vc.d, H, KV, D, eps, nm, row_stride, head_stride, c);
  }
  const auto kgot = kc.get(), vgot = vc.get();
  // the new rows against the reference, in (b, j) order; every other row unchanged, bit for bit
  std::vector<long> source(pool_rows, -1);
  for (size_t i = 0; i < dest.size(); ++i) source[dest[i]] = (long)i;
  std::vector<float> krows(kref.size()), vrows(vref.size());
  size_t moved = 0;
  for (size_t r = 0; r < pool_rows; ++r)
    for (int j = 0; j < D; ++j) {
      const size_t at = r * D + j;
      if (source[r] >= 0) {
        krows[(size_t)source[r] * D + j] = kgot[at];
        vrows[(size_t)source[r] * D + j] = vgot[at];
      } else if (!(kgot[at] == kc0[at] && vgot[at] == vc0[at])) {
        moved++;
      }
    }
  char what[112];
  const char* how = paged ? "paged" : "cache";
  snprintf(what, sizeof what, "qk_norm_rope_%s %s q %dx%dx%d%s", how, tname<T>(), B, H, D, norm ? "" : " no norm");
  report(what, rel_err(qo.get(), qref), tol<T>());
  if (paged)
    snprintf(what, sizeof what, "qk_norm_rope_paged %s k to %zu of %zu pool rows, kv %d", tname<T>(), dest.size(), pool_rows, KV);
  else
    snprintf(what, sizeof what, "qk_norm_rope_cache %s k col %d of %d, kv %d", tname<T>(), col, cap, KV);
  report(what, rel_err(krows, kref), tol<T>());
  snprintf(what, sizeof what, "qk_norm_rope_%s %s v copied, the rest kept", how, tname<T>());
  report(what, moved ? INFINITY : rel_err(vrows, vref), 0.0);
  if constexpr (sizeof(T) == 2) {
    // The FP8 instance on the same inputs over a cache of E4M3 bytes: q the bf16 instance's
    // bits; each new k and v the byte of the bf16 instance's value (as the composed path's
    // fp8_e4m3_from_bf16 rounds it); every other byte kept.
    std::vector<uint8_t> k8(pool_rows * D), v8(k8.size());
    for (size_t i = 0; i < k8.size(); ++i) k8[i] = (uint8_t)(i * 131 + 7), v8[i] = (uint8_t)(i * 37);
    uint8_t* dk8 = (uint8_t*)dalloc(k8.size());
    uint8_t* dv8 = (uint8_t*)dalloc(v8.size());
    h2d(dk8, k8.data(), k8.size());
    h2d(dv8, v8.data(), v8.size());
    Buf<T> qo8((size_t)B * H * D);
    if (paged)
      LAUNCH(qk_norm_rope_paged_bf16_fp8, grid, dim3(DEC_THREADS), 0, dqkv.d, dqw.d, dkw.d, dc.d,
             ds.d, qo8.d, dk8, dv8, H, KV, D, eps, nm, didx, rows_stride, pool_rows);
    else
      LAUNCH(qk_norm_rope_cache_bf16_fp8, grid, dim3(DEC_THREADS), 0, dqkv.d, dqw.d, dkw.d, dc.d,
             ds.d, qo8.d, dk8, dv8, H, KV, D, eps, nm, row_stride, head_stride, c);
    std::vector<uint8_t> k8got(k8.size()), v8got(v8.size());
    d2h(k8got.data(), dk8, k8.size());
    d2h(v8got.data(), dv8, v8.size());
    dfree(dk8);
    dfree(dv8);
    const auto q8 = qo8.get(), q16 = qo.get();
    size_t wrong = 0;
    for (size_t i = 0; i < q8.size(); ++i) wrong += fdp_bits(q8[i]) != fdp_bits(q16[i]);
    for (size_t at = 0; at < k8.size(); ++at) {
      const bool fresh = source[at / D] >= 0;
      wrong += k8got[at] != (fresh ? fp8_e4m3_byte(kgot[at]) : k8[at]);
      wrong += v8got[at] != (fresh ? fp8_e4m3_byte(vgot[at]) : v8[at]);
    }
    snprintf(what, sizeof what, "qk_norm_rope_%s bf16_fp8: the bf16 instance's q, k and v bytes, %zu wrong", how, wrong);
    report(what, wrong ? INFINITY : 0.0, 0.0);
  }
}

template <typename T>
static void check_add_rms_norm(int rows, int n) {
  const float eps = 1e-6f;
  const auto x = randoms<T>((size_t)rows * n, 2.0f), a = randoms<T>((size_t)rows * n, 2.0f),
             w = randoms<T>(n, 1.0f);
  std::vector<double> hs(x.size()), y(x.size());
  for (int i = 0; i < rows; ++i) {
    double ss = 0;
    for (int j = 0; j < n; ++j) {
      const size_t e = (size_t)i * n + j;
      // the sum as the storage type holds it: what the add's kernel writes and the norm reads
      hs[e] = Buf<T>::to_host(Buf<T>::from_host(x[e] + a[e]));
      ss += hs[e] * hs[e];
    }
    const double r = 1.0 / std::sqrt(ss / n + eps);
    for (int j = 0; j < n; ++j) y[(size_t)i * n + j] = hs[(size_t)i * n + j] * r * w[j];
  }
  Buf<T> dx(x), da(a), dw(w), dh(x.size()), dy(x.size());
  if constexpr (sizeof(T) == 4)
    LAUNCH(add_rms_norm_f32, dim3(rows), dim3(ROW_THREADS), 0, dx.d, da.d, dw.d, dh.d, dy.d, n, eps);
  else
    LAUNCH(add_rms_norm_bf16, dim3(rows), dim3(ROW_THREADS), 0, dx.d, da.d, dw.d, dh.d, dy.d, n, eps);
  char what[96];
  snprintf(what, sizeof what, "add_rms_norm %s sum %dx%d", tname<T>(), rows, n);
  report(what, rel_err(dh.get(), hs), 0.0);
  snprintf(what, sizeof what, "add_rms_norm %s norm %dx%d", tname<T>(), rows, n);
  report(what, rel_err(dy.get(), y), tol<T>());
}

// ---- attention softmax: x (B, H, T, n), bias (B, T, n)

template <typename T>
static void check_softmax(int B, int H, int Tn, int n) {
  const size_t len = (size_t)B * H * Tn * n;
  const float scale = 0.125f;
  const auto x = randoms<T>(len, 8.0f);
  std::vector<float> bias((size_t)B * Tn * n, 0.0f);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int j = 0; j < n; ++j)
        // causal with left padding on sequence 0; sequence 0's first row sees nothing
        if (j > t + (n - Tn) || (b == 0 && (j < 2 || t == 0))) bias[((size_t)b * Tn + t) * n + j] = -1e9f;
  std::vector<double> y(len);
  for (size_t row = 0; row < len / n; ++row) {
    const size_t b = row / ((size_t)H * Tn), t = row % Tn;
    const float* br = &bias[(b * Tn + t) * n];
    std::vector<double> z(n);
    double m = -INFINITY, s = 0;
    // the masked score in f32, as the kernel and its CPU twin add it: x·scale + (−1e9) keeps
    // nothing of x, so a fully masked row is uniform
    for (int j = 0; j < n; ++j) m = std::max(m, z[j] = (double)(x[row * n + j] * scale + br[j]));
    for (int j = 0; j < n; ++j) s += std::exp(z[j] - m);
    for (int j = 0; j < n; ++j) y[row * n + j] = std::exp(z[j] - m) / s;
  }
  Buf<T> dx(x), db(bias), out(len);
  const size_t per_b = (size_t)H * Tn;
  const dim3 grid((unsigned)(len / n));
  if constexpr (sizeof(T) == 4)
    LAUNCH(attention_softmax_f32, grid, dim3(ROW_THREADS), 0, dx.d, db.d, out.d, Tn, n, per_b, scale);
  else
    LAUNCH(attention_softmax_bf16, grid, dim3(ROW_THREADS), 0, dx.d, db.d, out.d, Tn, n, per_b, scale);
  char what[96];
  snprintf(what, sizeof what, "attention softmax %s %dx%dx%dx%d", tname<T>(), B, H, Tn, n);
  report(what, rel_err(out.get(), y), tol<T>());
}

// ---- token log-probabilities (f32), forward and backward; every third row's gradient is 0

static void check_log_probs(int rows, int v) {
  const auto z = randoms<float>((size_t)rows * v, 6.0f);
  std::vector<uint32_t> t(rows);
  std::vector<float> g(rows);
  for (int i = 0; i < rows; ++i) {
    t[i] = (uint32_t)((rnd() + 1) * 0.5 * v) % v;
    g[i] = i % 3 == 0 ? 0.0f : rnd();
  }
  t[rows - 1] = v - 1;  // the last column
  std::vector<double> lp(rows), dz((size_t)rows * v);
  for (int i = 0; i < rows; ++i) {
    const float* zr = &z[(size_t)i * v];
    double m = -INFINITY, s = 0;
    for (int j = 0; j < v; ++j) m = std::max(m, (double)zr[j]);
    for (int j = 0; j < v; ++j) s += std::exp(zr[j] - m);
    const double lse = m + std::log(s);
    lp[i] = zr[t[i]] - lse;
    for (int j = 0; j < v; ++j)
      dz[(size_t)i * v + j] = g[i] * ((j == (int)t[i] ? 1.0 : 0.0) - std::exp(zr[j] - lse));
  }
  Buf<float> dz_in(z), dg(g), out(rows), back((size_t)rows * v);
  uint32_t* dt = (uint32_t*)dalloc(rows * 4);
  h2d(dt, t.data(), rows * 4);
  LAUNCH(token_log_probs_f32, dim3(rows), dim3(ROW_THREADS), 0, dz_in.d, dt, out.d, v);
  LAUNCH(token_log_probs_bwd_f32, dim3(rows), dim3(ROW_THREADS), 0, dz_in.d, dt, dg.d, back.d, v);
  dfree(dt);
  char what[96];
  snprintf(what, sizeof what, "log_probs fwd f32 %dx%d", rows, v);
  report(what, rel_err(out.get(), lp), 1e-5);
  snprintf(what, sizeof what, "log_probs bwd f32 %dx%d (zero rows)", rows, v);
  report(what, rel_err(back.get(), dz), 1e-5);
}

// ---- the vocabulary in chunks: logits z (N, V) / τ walked in chunks of C columns (the last
// one short), the rows' statistics chained through them, then each chunk's dz

// `skew`: each chunk's logits and gradient one element past their buffers' 16-byte starts, so
// the kernels must take their one-number loads (the emulator refuses a misaligned 16-byte one).
template <typename T>
static void check_vocab_chunks(int rows, int v, int chunk, float temp, bool skew = false) {
  const auto z = randoms<T>((size_t)rows * v, 6.0f);
  std::vector<uint32_t> t(rows);
  std::vector<float> rowv((size_t)rows * 4);
  for (int i = 0; i < rows; ++i) t[i] = (uint32_t)((rnd() + 1) * 0.5 * v) % v;
  t[0] = v - 1;  // in the short last chunk
  std::vector<double> lp(rows), ent(rows), dz((size_t)rows * v);
  for (int i = 0; i < rows; ++i) {
    std::vector<double> zz(v);
    double m = -INFINITY, s = 0, sz = 0;
    for (int j = 0; j < v; ++j) m = std::max(m, zz[j] = (double)z[(size_t)i * v + j] / temp);
    for (int j = 0; j < v; ++j) s += std::exp(zz[j] - m), sz += std::exp(zz[j] - m) * zz[j];
    const double lse = m + std::log(s), mean_z = sz / s;
    lp[i] = zz[t[i]] - lse;
    ent[i] = lse - mean_z;
    const double g_lp = rnd(), g_ent = rnd();
    // the kernel takes the rows' values in f32, as the Rust path hands them over
    rowv[i * 4] = (float)lse, rowv[i * 4 + 1] = (float)mean_z;
    rowv[i * 4 + 2] = (float)g_lp, rowv[i * 4 + 3] = (float)g_ent;
    for (int j = 0; j < v; ++j) {
      const double p = std::exp(zz[j] - lse);
      dz[(size_t)i * v + j] =
          (((uint32_t)j == t[i] ? 1.0 : 0.0) - p) * g_lp / temp - p * (zz[j] - mean_z) * g_ent / temp;
    }
  }
  uint32_t* dt = (uint32_t*)dalloc(rows * 4);
  h2d(dt, t.data(), rows * 4);
  Buf<float> a((size_t)rows * 4), b((size_t)rows * 4), drow(rowv);
  std::vector<float> dz_got((size_t)rows * v);
  for (int c0 = 0; c0 < v; c0 += chunk) {
    const int cols = std::min(chunk, v - c0);
    const size_t off = skew ? 1 : 0;
    std::vector<float> zc((size_t)rows * cols + off, 0.0f);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) zc[off + (size_t)i * cols + j] = z[(size_t)i * v + c0 + j];
    Buf<T> dzc(zc), gc((size_t)rows * cols + off);
    T *zd = dzc.d + off, *gd = gc.d + off;
    const int first = c0 == 0;
    if constexpr (sizeof(T) == 4) {
      LAUNCH(vocab_stats_f32, dim3(rows), dim3(ROW_THREADS), 0, zd, dt, a.d, b.d, c0, cols, temp, first);
      LAUNCH(vocab_grad_f32, dim3(rows), dim3(ROW_THREADS), 0, zd, dt, drow.d, gd, c0, cols, temp);
    } else {
      LAUNCH(vocab_stats_bf16, dim3(rows), dim3(ROW_THREADS), 0, zd, dt, a.d, b.d, c0, cols, temp, first);
      LAUNCH(vocab_grad_bf16, dim3(rows), dim3(ROW_THREADS), 0, zd, dt, drow.d, gd, c0, cols, temp);
    }
    std::swap(a.d, b.d);  // this chunk's statistics are the next one's input
    const auto g = gc.get();
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) dz_got[(size_t)i * v + c0 + j] = g[off + (size_t)i * cols + j];
  }
  dfree(dt);
  const auto st4 = a.get();
  std::vector<float> lp_got(rows), ent_got(rows);
  for (int i = 0; i < rows; ++i) {
    const double m = st4[i * 4], s = st4[i * 4 + 1], u = st4[i * 4 + 2], zt = st4[i * 4 + 3];
    lp_got[i] = (float)(zt - (m + std::log(s)));
    ent_got[i] = (float)(std::log(s) - u / s);
  }
  char what[96];
  snprintf(what, sizeof what, "vocab chunk stats %s %dx%d by %d T=%.1f%s", tname<T>(), rows, v,
           chunk, temp, skew ? " skewed" : "");
  report(what, std::max(rel_err(lp_got, lp), rel_err(ent_got, ent)), 1e-5);
  snprintf(what, sizeof what, "vocab chunk grad %s %dx%d by %d T=%.1f%s", tname<T>(), rows, v,
           chunk, temp, skew ? " skewed" : "");
  report(what, rel_err(dz_got, dz), tol<T>());
}

// ---- AdamW: kernels/check/adamw_check.cu checks the whole-model step (its norm, clip and
// update) against the CPU twin's bits and a float64 AdamW (tests/it/optim.rs).

// ---- sampling: the CPU sampler's rule on the same draws

struct CpuDraw {
  uint32_t token;
  float log_prob;
  double margin;  // how far (relative to Σ) the draw lies from the nearest boundary it crossed
};

// A row as the CPU sampler sees it: z/T and the max in f32, the f64 weights exp(z/T − max) and
// their sum in index order, and the log-sum-exp.
struct CpuRow {
  std::vector<float> z;
  std::vector<double> w;
  double sum = 0, lse = 0;
  CpuRow(const float* logits, int v, float temp) : z(v), w(v) {
    for (int j = 0; j < v; ++j) z[j] = logits[j] / temp;
    float mx = -INFINITY;
    for (float x : z) mx = std::max(mx, x);
    for (int j = 0; j < v; ++j) sum += (w[j] = std::exp((double)(z[j] - mx)));
    lse = (double)mx + std::log(sum);
  }
};

// src/rollout/sample.rs `sample_token` for the full distribution, step for step.
static CpuDraw cpu_sample(const float* logits, int v, float temp, double u) {
  const CpuRow row(logits, v, temp);
  const std::vector<float>& z = row.z;
  const std::vector<double>& w = row.w;
  const double sum = row.sum, lse = row.lse, target = u * sum;
  double acc = 0;
  for (int j = 0; j < v; ++j) {
    const double before = acc;
    acc += w[j];
    if (acc > target) {
      const double margin = std::min(target - before, acc - target) / sum;
      return {(uint32_t)j, (float)(z[j] - lse), margin};
    }
  }
  return {(uint32_t)(v - 1), (float)(z[v - 1] - lse), 0.0};
}

// The GPU's draws `got` (rows × [token, log-prob]) against `cpu(i)`'s: the two sum in different
// groupings, so only a draw within rounding of a boundary may fall on the other side of it.
template <typename F>
static void compare_draws(const char* name, int rows, const std::vector<float>& got, F cpu) {
  int differ = 0, unexplained = 0;
  double lp_err = 0;
  for (int i = 0; i < rows; ++i) {
    const CpuDraw c = cpu(i);
    if ((uint32_t)got[2 * i] != c.token) {
      differ++;
      if (c.margin > 1e-12) unexplained++;
      continue;
    }
    lp_err = std::max(lp_err, (double)std::fabs(got[2 * i + 1] - c.log_prob) /
                                  std::max(1.0, (double)std::fabs(c.log_prob)));
  }
  char what[160];
  snprintf(what, sizeof what, "%s: %d/%d tokens differ, log-prob", name, differ, rows);
  report(what, unexplained ? INFINITY : lp_err, 1e-6);
}

// The sampler on f32 logits, and on bf16 ones (the lm_head's output on a GPU) against the CPU
// rule on their exact f32 values.
template <typename T>
static void check_sample(int rows, int v, float temp) {
  const auto z = randoms<T>((size_t)rows * v, 5.0f);
  std::vector<double> u(rows);
  for (int i = 0; i < rows; ++i) u[i] = (rnd() + 1) * 0.5;
  u[0] = 0.0;                      // the first token with weight
  u[rows - 1] = 0.9999999999999;   // the far end
  Buf<T> dz(z);
  Buf<float> out((size_t)rows * 2);
  double* du = (double*)dalloc(rows * 8);
  h2d(du, u.data(), rows * 8);
  if constexpr (sizeof(T) == 4)
    LAUNCH(sample_full_f32, dim3(rows), dim3(SAMPLE_THREADS), sample_smem(v), dz.d, du, out.d, v, temp);
  else
    LAUNCH(sample_full_bf16, dim3(rows), dim3(SAMPLE_THREADS), sample_smem(v), dz.d, du, out.d, v, temp);
  dfree(du);
  const auto got = out.get();
  char what[96];
  snprintf(what, sizeof what, "sample %s %dx%d T=%.2f", tname<T>(), rows, v, temp);
  compare_draws(what, rows, got, [&](int i) { return cpu_sample(&z[(size_t)i * v], v, temp, u[i]); });
}

// src/rollout/sample.rs `sample_token` with top-k (k in [1, v), else none) and top-p (p < 1,
// else none), step for step: sort by z/T (larger first, −0 with +0, then lower index), keep the
// first k, then the shortest prefix of those whose weights reach p of theirs, and draw among the
// kept columns in index order. `margin` is the nearer of the draw's and the top-p cut's
// distances from a boundary, relative to the sum each compares with.
static CpuDraw cpu_sample_trunc(const float* logits, int v, float temp, int k, double p, double u) {
  const CpuRow row(logits, v, temp);
  const std::vector<float>& z = row.z;
  const std::vector<double>& w = row.w;
  const double lse = row.lse;
  std::vector<int> order(v);
  for (int j = 0; j < v; ++j) order[j] = j;
  // z compared as floats: −0 == +0, and ties by index
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  int n = k >= 1 && k < v ? k : v;
  double margin = INFINITY;
  if (p < 1.0) {
    double total = 0;
    for (int i = 0; i < n; ++i) total += w[order[i]];
    const double need = p * total;
    double acc = 0;
    for (int i = 0; i < n; ++i) {
      const double before = acc;
      acc += w[order[i]];
      if (acc >= need) {
        margin = std::min(need - before, acc - need) / total;
        n = i + 1;
        break;
      }
    }
  }
  std::vector<char> kept(v, 0);
  for (int i = 0; i < n; ++i) kept[order[i]] = 1;
  double mass = 0;
  int last = 0;
  for (int j = 0; j < v; ++j)
    if (kept[j]) mass += w[j], last = j;
  const double target = u * mass;
  double acc = 0;
  for (int j = 0; j < v; ++j) {
    if (!kept[j]) continue;
    const double before = acc;
    acc += w[j];
    if (acc > target) {
      margin = std::min(margin, std::min(target - before, acc - target) / mass);
      return {(uint32_t)j, (float)(z[j] - lse), margin};
    }
  }
  return {(uint32_t)last, (float)(z[last] - lse), 0.0};
}

// The truncated sampler (top-k, top-p, greedy as k = 1 at T = 1) against the CPU rule, on
// random logits, or (`coarse`) on logits rounded to quarters, so that many columns tie at the
// cuts, +0 and −0 among them.
template <typename T>
static void check_trunc(int rows, int v, float temp, int k, double p, bool coarse = false) {
  auto z = randoms<T>((size_t)rows * v, 5.0f);
  if (coarse)
    for (size_t i = 0; i < z.size(); ++i) z[i] = i % 7 == 0 ? -0.0f : std::round(z[i] * 4) / 4;
  std::vector<double> u(rows);
  for (int i = 0; i < rows; ++i) u[i] = (rnd() + 1) * 0.5;
  u[0] = 0.0;
  u[rows - 1] = 0.9999999999999;
  Buf<T> dz(z);
  Buf<float> out((size_t)rows * 2);
  double* du = (double*)dalloc(rows * 8);
  h2d(du, u.data(), rows * 8);
  if constexpr (sizeof(T) == 4)
    LAUNCH(sample_trunc_f32, dim3(rows), dim3(SAMPLE_THREADS), sample_smem(v), dz.d, du, out.d, v, temp, k, p);
  else
    LAUNCH(sample_trunc_bf16, dim3(rows), dim3(SAMPLE_THREADS), sample_smem(v), dz.d, du, out.d, v, temp, k, p);
  dfree(du);
  const auto got = out.get();
  char what[96];
  snprintf(what, sizeof what, "sample %s %dx%d T=%.2f top-k %d top-p %g%s", tname<T>(), rows, v, temp, k, p,
           coarse ? " (ties)" : "");
  compare_draws(what, rows, got, [&](int i) { return cpu_sample_trunc(&z[(size_t)i * v], v, temp, k, p, u[i]); });
}

#ifndef ACPO_EMU
// Median microseconds of 21 runs of `f` (harness.hpp's median_ms).
template <typename F>
static float time_us(F f) {
  return median_ms(f, 21) * 1000.0f;
}

static void print_time(const char* what, double us, double bytes) {
  printf("time %-52s %9.1f us  %7.0f GB/s\n", what, us, bytes / us / 1e3);
}

// The kernels issue #44 changed, at Qwen3-1.7B's shapes for 2 x 2,048 and 2 x 9,220 tokens,
// bf16: time and bandwidth (the bytes each must move, once) to set beside the predictions of
// kernels/NOTES.md (version 4); and the sampler at a decode step's 64 rows of Qwen3's vocabulary
// (version 10).
static void timings() {
  {
    // bf16 logits, as a decode step's lm_head leaves them
    const int rows = 64, v = 151936;
    const auto z = randoms<bf>((size_t)rows * v, 5.0f);
    std::vector<double> u(rows, 0.5);
    Buf<bf> dz(z);
    Buf<float> out((size_t)rows * 2);
    double* du = (double*)dalloc(rows * 8);
    h2d(du, u.data(), rows * 8);
    const float us = time_us([&] {
      LAUNCH(sample_full_bf16, dim3(rows), dim3(SAMPLE_THREADS), sample_smem(v), dz.d, du, out.d, v, 1.0f);
    });
    char what[96];
    snprintf(what, sizeof what, "sample bf16 %dx%d", rows, v);
    print_time(what, us, (double)rows * v * 2.0 * 2.0);
    // the truncated kernel (version 15): top-p, top-k with top-p, greedy; the bytes are one
    // read of the logits, so the rate says how many passes it makes
    struct Trunc {
      const char* name;
      float t;
      int k;
      double p;
    } truncs[] = {{"top-p 0.95", 1.0f, 0, 0.95}, {"top-k 50 top-p 0.9", 0.7f, 50, 0.9}, {"greedy", 1.0f, 1, 1.0}};
    for (const Trunc& tr : truncs) {
      const float tus = time_us([&] {
        LAUNCH(sample_trunc_bf16, dim3(rows), dim3(SAMPLE_THREADS), sample_smem(v), dz.d, du, out.d, v, tr.t, tr.k,
               tr.p);
      });
      snprintf(what, sizeof what, "sample bf16 %dx%d %s", rows, v, tr.name);
      print_time(what, tus, (double)rows * v * 2.0);
    }
    dfree(du);
  }
  for (int tokens : {2 * 2048, 2 * 9220}) {
    {  // the embedding's backward (version 18): Qwen3's vocabulary, the tied lm_head's share
      const int vocab = 151936, h = 2048;
      const auto meta = embedding_meta(skewed_ids(tokens, vocab), vocab);
      const size_t vh = (size_t)vocab * h;
      bf *dy = (bf*)dalloc((size_t)tokens * h * 2), *base = (bf*)dalloc(vh * 2);
      float* out = (float*)dalloc(vh * 4);
      uint32_t* dmeta = (uint32_t*)dalloc(meta.size() * 4);
      CK(cudaMemset(dy, 0, (size_t)tokens * h * 2));
      CK(cudaMemset(base, 0, vh * 2));
      h2d(dmeta, meta.data(), meta.size() * 4);
      const size_t chunks = (size_t)vocab * ((h + ELEM_THREADS - 1) / ELEM_THREADS);
      const float us = time_us([&] {
        LAUNCH(embedding_grad_bf16, dim3((unsigned)std::min<size_t>(chunks, 1 << 16)), dim3(ELEM_THREADS), 0, dy,
               base, 1, dmeta, out, (size_t)vocab, (size_t)h);
      });
      char what[96];
      snprintf(what, sizeof what, "embedding grad %dx%d from %d tokens", vocab, h, tokens);
      print_time(what, us, vh * 6.0 + (double)tokens * h * 2.0 + meta.size() * 4.0);
      dfree(dy), dfree(base), dfree(out), dfree(dmeta);
    }
    struct Norm {
      const char* name;
      int rows, n;
    } norms[] = {{"q_norm", tokens * 16, 128}, {"k_norm", tokens * 8, 128}, {"hidden norm", tokens, 2048}};
    for (const Norm& nm : norms) {
      const size_t len = (size_t)nm.rows * nm.n;
      bf *x = (bf*)dalloc(len * 2), *dy = (bf*)dalloc(len * 2), *out = (bf*)dalloc(len * 2 + nm.n * 2);
      float* rs = (float*)dalloc(nm.rows * 4);
      const int chunks = (nm.rows + RMS_DW_ROWS - 1) / RMS_DW_ROWS;
      float* partial = (float*)dalloc((size_t)chunks * nm.n * 4);
      CK(cudaMemset(x, 0, len * 2));
      CK(cudaMemset(dy, 0, len * 2));
      CK(cudaMemset(rs, 0, nm.rows * 4));
      const dim3 g1((nm.n + RMS_DW_COLS - 1) / RMS_DW_COLS, chunks), b1(RMS_DW_COLS, RMS_DW_GROUPS);
      const float us = time_us([&] {
        LAUNCH(rms_norm_bwd_dw_partial_bf16, g1, b1, 0, x, dy, rs, partial, nm.rows, nm.n);
        LAUNCH(rms_norm_bwd_dw_sum_bf16, dim3(blocks_for(nm.n, ELEM_THREADS)), dim3(ELEM_THREADS), 0,
               partial, out, chunks, nm.rows, nm.n);
      });
      char what[96];
      snprintf(what, sizeof what, "rms_norm dw (two-pass) %s %dx%d", nm.name, nm.rows, nm.n);
      print_time(what, us, len * 4.0 + nm.rows * 4.0 + chunks * nm.n * 8.0);
      dfree(x), dfree(dy), dfree(out), dfree(rs), dfree(partial);
    }
    {  // q into heads first: (2, T, 16, 128) -> (2, 16, T, 128)
      const int T = tokens / 2, H = 16, D = 128;
      const size_t len = (size_t)tokens * H * D;
      bf *x = (bf*)dalloc(len * 2), *y = (bf*)dalloc(len * 2), *cs = (bf*)dalloc((size_t)tokens * D * 2);
      CK(cudaMemset(x, 0, len * 2));
      CK(cudaMemset(cs, 0, (size_t)tokens * D * 2));
      const size_t pairs = len / 2;
      const unsigned blocks = std::min<size_t>(blocks_for(pairs, ELEM_THREADS), 1 << 16);
      const float us = time_us([&] {
        LAUNCH(rope_bf16, dim3(blocks), dim3(ELEM_THREADS), 0, x, cs, cs, y, H, T, D, 1.0f, pairs, 0, 1);
      });
      char what[96];
      snprintf(what, sizeof what, "rope q BTHD->BHTD 2x%dx16x128", T);
      print_time(what, us, len * 4.0 + tokens * D * 4.0);
      dfree(x), dfree(y), dfree(cs);
    }
    {  // one vocabulary chunk of 8,192 columns
      const int rows = tokens, cols = 8192;
      const size_t len = (size_t)rows * cols;
      bf *z = (bf*)dalloc(len * 2), *dz = (bf*)dalloc(len * 2);
      uint32_t* t = (uint32_t*)dalloc(rows * 4);
      float *a = (float*)dalloc(rows * 16), *b = (float*)dalloc(rows * 16);
      CK(cudaMemset(z, 0, len * 2));
      CK(cudaMemset(t, 0, rows * 4));
      CK(cudaMemset(a, 0, rows * 16));
      const float fwd = time_us([&] {
        LAUNCH(vocab_stats_bf16, dim3(rows), dim3(ROW_THREADS), 0, z, t, a, b, 0, cols, 1.0f, 0);
      });
      const float bwd = time_us([&] {
        LAUNCH(vocab_grad_bf16, dim3(rows), dim3(ROW_THREADS), 0, z, t, a, dz, 0, cols, 1.0f);
      });
      char what[96];
      snprintf(what, sizeof what, "vocab chunk stats %dx%d", rows, cols);
      print_time(what, fwd, len * 2.0);
      snprintf(what, sizeof what, "vocab chunk grad %dx%d", rows, cols);
      print_time(what, bwd, len * 4.0);
      dfree(z), dfree(dz), dfree(t), dfree(a), dfree(b);
    }
  }
}
#endif

static void check_all() {
  // RMSNorm: a row shorter than a warp; rows longer than a block, not a multiple of it; the q/k
  // norm's 128 columns; columns not a multiple of the dw tile; rows not a multiple of a chunk
  const int norms[][2] = {{1, 7}, {37, 130}, {5, 1031}, {300, 128}, {2 * RMS_DW_ROWS + 44, 33}};
  for (const auto& s : norms) {
    check_rms_norm<float>(s[0], s[1]);
    check_rms_norm<bf>(s[0], s[1]);
  }
  for (size_t len : {(size_t)1, (size_t)1000, (size_t)5 * ELEM_THREADS + 3}) {
    check_swiglu<float>(len, 3);
    check_swiglu<bf>(len, 3);
  }
  const int ropes[][4] = {{1, 1, 1, 2}, {2, 3, 17, 16}, {1, 4, 9, 128}};
  for (const auto& s : ropes)
    for (int layout = 0; layout < 3; ++layout) {
      // in place (heads first), the forward (tokens first → heads first), the backward (back)
      const bool xh = layout != 1, yh = layout != 2;
      const float sign = layout == 2 ? -1.0f : 1.0f;
      check_rope<float>(s[0], s[1], s[2], s[3], xh, yh, sign);
      check_rope<bf>(s[0], s[1], s[2], s[3], xh, yh, sign);
    }
  // the rotary tables: one decode step's 64 rows, a prefill's rows at the paper's lengths, a
  // tiny head; Qwen3's θ = 1e6 and Qwen2's 1e4
  const int tables[][3] = {{64, 128, 9220}, {2 * 300, 128, 40960}, {7, 16, 5}, {33, 64, 2048}};
  for (const auto& t : tables)
    for (bool want_sin : {false, true}) {
      check_rope_table<float>(t[0], t[1], t[1] == 64 ? 1e4 : 1e6, t[2], want_sin);
      check_rope_table<bf>(t[0], t[1], t[1] == 64 ? 1e4 : 1e6, t[2], want_sin);
    }
  // the decode chain: Qwen3's shape (16 q heads over 8 KV heads of 128), a head dim above the
  // block (two passes a thread), a tiny one, Qwen2's (no q/k norm); the new column first, inside
  // the buffer and last; each into a dense cache's column and into a paged pool's rows
  const int chains[][6] = {{3, 16, 8, 128, 9, 4}, {2, 4, 2, 160, 3, 0}, {1, 2, 1, 16, 5, 4}, {2, 6, 2, 64, 2, 1}};
  for (const auto& c : chains) {
    for (bool paged : {false, true}) {
      check_qk_norm_rope_cache<float>(c[0], c[1], c[2], c[3], c[4], c[5], c[3] != 64, paged);
      check_qk_norm_rope_cache<bf>(c[0], c[1], c[2], c[3], c[4], c[5], c[3] != 64, paged);
    }
  }
  // the pool's stores: bf16 rows of head dim 128 (256 B, 16-byte words), FP8 rows of 128
  // (128 B), f32 rows of 24 (96 B); 4-byte words for rows of 12 B (an FP8 head of 12); a grid
  // of 1 and 3 blocks (the loop wraps), padding rows to the scratch row
  check_pool_store(97, 40, 256, 16, 3, 0);
  check_pool_store(64, 63, 128, 16, 1, 5);
  check_pool_store(50, 17, 96, 16, 2, 0);
  check_pool_store(41, 29, 12, 4, 1, 3);
  check_pool_store(300, 250, 256, 4, 7, 2);
  // the embedding's backward: a row of a block's 256 columns, rows of 37 and of 300 (a block and a
  // part), the 1.7B model's 2,048; with and without the lm_head's share; grids that wrap; a token
  // at 300 positions (two tiles of EMB_TILE, the second part-full)
  const int embeddings[][4] = {{61, 120, 37, 3}, {29, 200, 300, 7}, {13, 50, 256, 1}, {40, 30, 2048, 11}, {23, 700, 40, 2}};
  for (const auto& e : embeddings)
    for (bool has_base : {true, false}) {
      check_embedding_grad<float>(e[0], e[1], e[2], has_base, e[3]);
      check_embedding_grad<bf>(e[0], e[1], e[2], has_base, e[3]);
    }
  for (const auto& s : norms) {
    check_add_rms_norm<float>(s[0], s[1]);
    check_add_rms_norm<bf>(s[0], s[1]);
  }
  const int softmaxes[][4] = {{1, 1, 1, 1}, {2, 3, 9, 13}, {2, 2, 5, 300}};
  for (const auto& s : softmaxes) {
    check_softmax<float>(s[0], s[1], s[2], s[3]);
    check_softmax<bf>(s[0], s[1], s[2], s[3]);
  }
  check_log_probs(7, 1);
  check_log_probs(9, 1000);
  check_log_probs(4, 5003);
  for (int chunk : {256, 300, 1000, 4096}) {  // chunks: one, several with a short last one
    check_vocab_chunks<float>(5, 1000, chunk, chunk == 300 ? 0.7f : 1.0f);
    check_vocab_chunks<bf>(5, 1000, chunk, 1.0f);
  }
  // the one-number loads: f32 rows not a multiple of 4 (a last chunk of 102), and buffers off
  // their 16-byte starts (every row of the launch)
  check_vocab_chunks<float>(5, 1002, 300, 1.0f);
  check_vocab_chunks<float>(4, 1000, 256, 1.0f, true);
  check_vocab_chunks<bf>(4, 1000, 256, 0.8f, true);
  check_sample<float>(40, 1000, 1.0f);
  check_sample<float>(30, 5003, 0.7f);
  check_sample<float>(8, 3, 1.3f);
  check_sample<float>(3, 151936, 1.0f);  // Qwen3's vocabulary: every warp a segment of 38 groups
  check_sample<bf>(30, 5003, 0.7f);
  check_sample<bf>(2, 151936, 1.0f);
  // top-k, top-p, both, greedy (k = 1, T = 1), a tiny top-p, a row of 3, ties at every cut
  check_trunc<float>(40, 1000, 1.0f, 50, 1.0);
  check_trunc<float>(40, 1000, 0.7f, 0, 0.9);
  check_trunc<float>(30, 5003, 1.0f, 100, 0.8);
  check_trunc<float>(20, 1000, 1.0f, 1, 1.0);
  check_trunc<float>(20, 1000, 1.3f, 0, 1e-6);
  check_trunc<float>(8, 3, 1.0f, 2, 0.5);
  check_trunc<float>(30, 1000, 1.0f, 200, 0.7, true);
  check_trunc<float>(30, 1000, 1.0f, 1, 1.0, true);
  check_trunc<bf>(30, 5003, 1.0f, 0, 0.95);
  check_trunc<bf>(30, 5003, 0.6f, 64, 1.0);
  check_trunc<bf>(20, 1000, 1.0f, 1, 1.0);
  check_trunc<bf>(30, 1000, 1.0f, 300, 0.6, true);
  check_trunc<bf>(2, 151936, 1.0f, 0, 0.95);
  check_trunc<bf>(2, 151936, 0.7f, 50, 0.9);
}

int main(int argc, char** argv) {
#ifdef ACPO_EMU
  // `pool-store-past-the-pool`: a store whose index names a row past the pool must stop the
  // kernel (tests/it/kernels.rs reads the emulator's refusal), not write past the pool.
  if (argc == 2 && std::string(argv[1]) == "pool-store-past-the-pool") {
    uint8_t* pool = (uint8_t*)dalloc(8 * 16);
    uint8_t* src = (uint8_t*)dalloc(2 * 16);
    uint32_t* idx = (uint32_t*)dalloc(2 * 4);
    const uint32_t index[2] = {3, 8};  // the second row names row 8 of a pool of 8
    h2d(idx, index, sizeof index);
    LAUNCH(pool_store_w16, dim3(1), dim3(ELEM_THREADS), 0, (const uint4*)src, (uint4*)pool, idx,
           (size_t)1, (size_t)2, (size_t)1, (size_t)8);
    printf("ran to the end\n");
    return 0;
  }
#endif
  const int seeds = seeds_arg(argc, argv);
  for (int s = 0; s < seeds; ++s) {
    use_schedule(s, 2);  // fair, or one warp lagging behind the others
#ifdef ACPO_EMU
    printf("schedule %d\n", s);
#endif
    check_all();
  }
#ifndef ACPO_EMU
  timings();
#endif
  printf("%s\n", failures ? "FAILED" : "all checks ok");
  return failures ? 1 : 0;
}
