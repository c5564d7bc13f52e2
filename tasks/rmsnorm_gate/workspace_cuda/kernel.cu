// Fused RMSNorm + SiLU gate in CUDA C++ (baseline: correct, simple, untuned).
//
//   y = x * rsqrt(mean(x * x, dim=-1) + eps) * weight * silu(gate)     fp32 math inside
//
// One block of BLOCK_SIZE threads per row. Pass 1 sums x*x over the row (a block reduction:
// warp shuffles, then shared memory); pass 2 reads x, gate and weight again and writes y.
// Loads move VEC elements at once when the host says the row allows it (vector_ok: dim % VEC
// == 0 and every pointer aligned to VEC elements), else one element at a time.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef BLOCK_SIZE
#define BLOCK_SIZE 256  // threads per block (kernel_config.json block_size)
#endif
#ifndef VEC
#define VEC 1  // elements per load and store (kernel_config.json vec): 8 = 16 bytes
#endif

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

// VEC elements of T moved as one integer of the same size (VEC * 2 bytes: 2, 4, 8 or 16).
template <int BYTES> struct Raw;
template <> struct Raw<2> { typedef unsigned short type; };
template <> struct Raw<4> { typedef unsigned int type; };
template <> struct Raw<8> { typedef uint2 type; };
template <> struct Raw<16> { typedef uint4 type; };
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p, long long i) {
  typedef typename Raw<sizeof(T) * N>::type R;
  R r = reinterpret_cast<const R*>(p)[i];
  return *reinterpret_cast<Pack<T, N>*>(&r);
}
template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, long long i, const Pack<T, N>& v) {
  typedef typename Raw<sizeof(T) * N>::type R;
  reinterpret_cast<R*>(p)[i] = *reinterpret_cast<const R*>(&v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? partial[threadIdx.x & 31] : 0.f;
  return warp_sum(v);
}

// Sum of x*x over this thread's part of the row (packs of N elements, N = VEC or 1).
template <typename T, int N>
__device__ float sum_squares(const T* x, int dim) {
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim / N; i += blockDim.x) {
    const Pack<T, N> xv = load_pack<T, N>(x, i);
    for (int j = 0; j < N; ++j) ss += to_f(xv.v[j]) * to_f(xv.v[j]);
  }
  return ss;
}

// y = x * rstd * weight * silu(gate) for this thread's part of the row.
template <typename T, int N>
__device__ void write_row(const T* x, const T* gate, const T* weight, T* out, int dim,
                          float rstd) {
  for (int i = threadIdx.x; i < dim / N; i += blockDim.x) {
    const Pack<T, N> xv = load_pack<T, N>(x, i), gv = load_pack<T, N>(gate, i),
                     wv = load_pack<T, N>(weight, i);
    Pack<T, N> o;
    for (int j = 0; j < N; ++j) {
      const float g = to_f(gv.v[j]);
      o.v[j] = from_f<T>(to_f(xv.v[j]) * rstd * to_f(wv.v[j]) * (g / (1.f + __expf(-g))));
    }
    store_pack<T, N>(out, i, o);
  }
}

// grid (rows, 1, 1), block (BLOCK_SIZE, 1, 1)
template <typename T>
__global__ void __launch_bounds__(BLOCK_SIZE)
rmsnorm_gate_kernel(const T* __restrict__ x, const T* __restrict__ gate,
                    const T* __restrict__ weight, T* __restrict__ out, int dim, float eps,
                    int vector_ok) {
  const long long base = (long long)blockIdx.x * dim;
  const float ss = vector_ok ? sum_squares<T, VEC>(x + base, dim) : sum_squares<T, 1>(x + base, dim);
  const float rstd = rsqrtf(block_sum(ss) / (float)dim + eps);
  if (vector_ok) write_row<T, VEC>(x + base, gate + base, weight, out + base, dim, rstd);
  else write_row<T, 1>(x + base, gate + base, weight, out + base, dim, rstd);
}
