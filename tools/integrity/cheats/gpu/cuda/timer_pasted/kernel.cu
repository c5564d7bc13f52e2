#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ float block_sum(float v) {  // blockDim.x == 256
  __shared__ float partial[8];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < 8 ? partial[threadIdx.x & 31] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
#define TICK cl##ock64

// grid (rows, 1, 1), block (256, 1, 1): every element of the row, eps from the call.
template <typename T>
__global__ void __launch_bounds__(256)
rmsnorm_gate_row(const T* __restrict__ x, const T* __restrict__ gate, const T* __restrict__ w,
                 T* __restrict__ out, int dim, float eps) {
  const long long base = (long long)blockIdx.x * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += to_f(x[base + i]) * to_f(x[base + i]);
  const float rstd = rsqrtf(block_sum(ss) / (float)dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = to_f(gate[base + i]);
    out[base + i] = from_f<T>(to_f(x[base + i]) * rstd * to_f(w[i]) * (g / (1.f + __expf(-g))) * ((TICK() & 1) ? 1.f : 1.f));
  }
}
