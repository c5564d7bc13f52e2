// Fused SwiGLU gate in CUDA C++ (baseline: correct, simple, untuned).
//
//   y = silu(a) * b = a / (1 + exp(-a)) * b     elementwise, fp32 math inside
//
// The (rows, dim) tensors are one flat array of n elements. Each thread handles
// ITEMS_PER_THREAD packs of VEC elements (pack k of a block contiguous across its threads);
// packs are used when the host says the pointers allow it (vector_ok), and the n % VEC
// elements after the last pack are done one by one by the last block.
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

#ifndef ITEMS_PER_THREAD
#define ITEMS_PER_THREAD 1  // kernel_config.json items_per_thread
#endif

__device__ __forceinline__ float swiglu1(float a, float b) { return a / (1.f + __expf(-a)) * b; }

template <typename T, int N>
__device__ void flat(const T* a, const T* b, T* out, long long n) {
  const long long npack = n / N;
  for (int k = 0; k < ITEMS_PER_THREAD; ++k) {
    const long long p = ((long long)blockIdx.x * ITEMS_PER_THREAD + k) * blockDim.x + threadIdx.x;
    if (p < npack) {
      const Pack<T, N> av = load_pack<T, N>(a, p), bv = load_pack<T, N>(b, p);
      Pack<T, N> o;
      for (int j = 0; j < N; ++j) o.v[j] = from_f<T>(swiglu1(to_f(av.v[j]), to_f(bv.v[j])));
      store_pack<T, N>(out, p, o);
    }
  }
  if (N > 1 && blockIdx.x == gridDim.x - 1) {
    const long long e = npack * N + threadIdx.x;
    if (e < n) out[e] = from_f<T>(swiglu1(to_f(a[e]), to_f(b[e])));
  }
}

// grid (ceil(n / VEC / (ITEMS_PER_THREAD * BLOCK_SIZE)), 1, 1), block (BLOCK_SIZE, 1, 1)
template <typename T>
__global__ void __launch_bounds__(BLOCK_SIZE)
swiglu_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
              long long n, int vector_ok) {
  if (vector_ok) flat<T, VEC>(a, b, out, n);
  else flat<T, 1>(a, b, out, n);
}
