// One-pass AdamW on fp32 moments (the parameter is f32 or bf16; its update is computed in f32),
// after the global-norm clip coefficient `scale`: reads [m; v] as (2, N) and writes
// [p; m; v] as (3, N) in f32. CPU twin: `fused_update` in src/optim.rs, operation for operation: candle's `x * c`
// is `x·c + 0` and `x / c` is `x·(1/c) + 0` in f32, so the `_rn` intrinsics keep nvcc from
// contracting a product and a sum into one FMA (which would round once instead of twice) and
// the results are bit for bit the CPU's.
#include "common.cuh"

#define MUL __fmul_rn
#define ADD __fadd_rn
#define SUB __fsub_rn
#define DIV __fdiv_rn

template <typename T>
__device__ void adamw(const T* p, const float* g, const float* mv, float* out, size_t len,
                      float scale, float b1, float one_minus_b1, float b2, float one_minus_b2,
                      float decay, float inv_sqrt_bc2, float eps, float step) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
       i += (size_t)gridDim.x * blockDim.x) {
    const float gs = ADD(MUL(g[i], scale), 0.0f);
    const float m1 = ADD(ADD(MUL(mv[i], b1), 0.0f), ADD(MUL(gs, one_minus_b1), 0.0f));
    const float v1 =
        ADD(ADD(MUL(mv[len + i], b2), 0.0f), ADD(MUL(MUL(gs, gs), one_minus_b2), 0.0f));
    const float denom = ADD(MUL(ADD(MUL(__fsqrt_rn(v1), inv_sqrt_bc2), 0.0f), 1.0f), eps);
    out[i] = SUB(ADD(MUL(to_f(p[i]), decay), 0.0f), ADD(MUL(DIV(m1, denom), step), 0.0f));
    out[len + i] = m1;
    out[2 * len + i] = v1;
  }
}

#define ADAMW(NAME, T)                                                                         \
  extern "C" __global__ void adamw_##NAME(const T* p, const float* g, const float* mv,         \
                                          float* out, size_t len, float scale, float b1,       \
                                          float one_minus_b1, float b2, float one_minus_b2,    \
                                          float decay, float inv_sqrt_bc2, float eps,          \
                                          float step) {                                        \
    adamw<T>(p, g, mv, out, len, scale, b1, one_minus_b1, b2, one_minus_b2, decay,             \
             inv_sqrt_bc2, eps, step);                                                         \
  }

ADAMW(f32, float)
ADAMW(bf16, __nv_bfloat16)
