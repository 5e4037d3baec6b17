// The FP8 KV cache's writes and reads outside the decode kernel (issue #57): x rounded to E4M3
// bytes (a new key or value as it is cached), and bytes back to f32 or bf16 (a prefill reading
// the cache; exact). fp8.cuh has the arithmetic; src/fused/fp8.rs is the CPU twin.
#include "common.cuh"
#include "fp8.cuh"

template <typename T>
__device__ void fp8_from(const T* x, uint8_t* out, size_t len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = fp8_e4m3_byte(to_f(x[i]));
}

template <typename T>
__device__ void fp8_to(const uint8_t* x, T* out, size_t len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = from_f<T>(fp8_e4m3_value(x[i]));
}

#define FP8_CAST(NAME, T)                                                                      \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                  \
      fp8_e4m3_from_##NAME(const T* x, uint8_t* out, size_t len) {                            \
    fp8_from<T>(x, out, len);                                                                 \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(ELEM_THREADS)                                  \
      fp8_e4m3_to_##NAME(const uint8_t* x, T* out, size_t len) {                              \
    fp8_to<T>(x, out, len);                                                                   \
  }

FP8_CAST(f32, float)
FP8_CAST(bf16, __nv_bfloat16)
