// Fused SwiGLU gate, CUDA C++ reference solution (compiled by NVRTC through harnesslab_cuda;
// the Python wrapper cuda_swiglu.py picks the variant).
//
//   y = silu(a) * b = a / (1 + exp(-a)) * b   elementwise, fp32 math, fp16/bf16 in and out
//
// Elementwise, so the rows do not matter: the (rows, dim) tensors are one flat array of n
// elements. Each thread moves ITEMS packs of VEC elements per tensor, all loads issued before
// the math (ITEMS * 16 bytes in flight per tensor and thread with VEC = 8); pack k of a block
// is contiguous across its threads (coalesced). VEC = 8 needs 16-byte aligned pointers (the
// host checks); the n % VEC elements past the last pack are done one by one by the last block.
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

template <int BYTES> struct Raw;
template <> struct Raw<16> { typedef uint4 type; };
template <> struct Raw<2> { typedef unsigned short type; };
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack(const T* p, long long i) {
  typedef typename Raw<sizeof(T) * VEC>::type R;
  R r = __ldg(reinterpret_cast<const R*>(p) + i);
  return *reinterpret_cast<Pack<T, VEC>*>(&r);
}
template <typename T, int VEC>
__device__ __forceinline__ void store_pack(T* p, long long i, const Pack<T, VEC>& v) {
  typedef typename Raw<sizeof(T) * VEC>::type R;
  reinterpret_cast<R*>(p)[i] = *reinterpret_cast<const R*>(&v);
}

// __fdividef: an approximate reciprocal and a multiply. With the IEEE division (div.rn.f32)
// 4096x11008 bf16 took 117.1 us on an H100, with __fdividef 86.2 us (BENCHMARKS.md, seventh
// session). A huge denominator (a < -88: exp overflows) gives 0, as silu does.
__device__ __forceinline__ float swiglu1(float a, float b) {
  return __fdividef(a, 1.f + __expf(-a)) * b;
}

// grid (ceil(n / VEC / (ITEMS * threads)), 1, 1), block (threads, 1, 1)
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(1024)
swiglu_flat(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, long long n) {
  const long long npack = n / VEC;
  const long long first = (long long)blockIdx.x * ITEMS * blockDim.x + threadIdx.x;
  Pack<T, VEC> av[ITEMS], bv[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const long long p = first + (long long)k * blockDim.x;
    if (p < npack) {
      av[k] = load_pack<T, VEC>(a, p);
      bv[k] = load_pack<T, VEC>(b, p);
    }
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const long long p = first + (long long)k * blockDim.x;
    if (p < npack) {
      Pack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(swiglu1(to_f(av[k].v[j]), to_f(bv[k].v[j])));
      store_pack<T, VEC>(out, p, o);
    }
  }
  if (VEC > 1 && blockIdx.x == gridDim.x - 1) {  // the tail: fewer than VEC elements
    const long long e = npack * VEC + threadIdx.x;
    if (e < n) out[e] = from_f<T>(swiglu1(to_f(a[e]), to_f(b[e])));
  }
}
