// Variant of tasks/rmsnorm_gate/solutions/cuda_rmsnorm_gate.cu as it was before it took __fdividef
// (issue 31, seventh session; BENCHMARKS.md has the measurements): the same kernels with
// the conversions done two elements at a time (__half2 / __nv_bfloat162: one cvt.rn.bf16x2.f32
// per pair instead of two scalar ones; -DHL_PACKED=0 turns that off) and, with -DHL_FASTDIV=1,
// silu's division as __fdividef.
// Timed beside the shipped solution by benchmarks/cuda_gpu.py --extra.
//
//   y = x * rsqrt(mean(x * x) + eps) * weight * silu(gate),   fp32 math, fp16/bf16 in and out
//
// - Each row is read once: x and gate stay in registers between the sum of squares and the
//   output (CHUNKS packs per thread), so traffic is the minimum 3 * rows * dim elements.
// - VEC = 8: 16-byte loads and stores (LDG.128 / STG.128). The host picks VEC = 1 (2-byte
//   accesses) when dim % 8 != 0 or a pointer is not 16-byte aligned: nothing is assumed.
// - Small rows (at most 128 packs): one warp per row, several rows per block, the reduction is
//   warp shuffles only. Larger rows: one row per block, warp shuffles then one shared-memory step.
// - CHUNKS = 0: rows too wide for registers are read twice (sum of squares, then the output).
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

// VEC elements moved as one integer of the same size.
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

// A pack to VEC floats and back, two at a time when VEC is even.
template <typename T> struct Pair;
template <> struct Pair<__half> {
  typedef __half2 type;
  static __device__ __forceinline__ float2 to(type v) { return __half22float2(v); }
  static __device__ __forceinline__ type from(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct Pair<__nv_bfloat16> {
  typedef __nv_bfloat162 type;
  static __device__ __forceinline__ float2 to(type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ type from(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};
#ifndef HL_PACKED
#define HL_PACKED 1
#endif
template <typename T, int VEC, bool PAIRED = (HL_PACKED && VEC % 2 == 0)> struct Conv {
  static __device__ __forceinline__ void to(const Pack<T, VEC>& p, float (&f)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = to_f(p.v[j]);
  }
  static __device__ __forceinline__ Pack<T, VEC> from(const float (&f)[VEC]) {
    Pack<T, VEC> p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) p.v[j] = from_f<T>(f[j]);
    return p;
  }
};
template <typename T, int VEC> struct Conv<T, VEC, true> {
  typedef typename Pair<T>::type P2;
  static __device__ __forceinline__ void to(const Pack<T, VEC>& p, float (&f)[VEC]) {
    const P2* q = reinterpret_cast<const P2*>(p.v);
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
      const float2 t = Pair<T>::to(q[j]);
      f[2 * j] = t.x;
      f[2 * j + 1] = t.y;
    }
  }
  static __device__ __forceinline__ Pack<T, VEC> from(const float (&f)[VEC]) {
    Pack<T, VEC> p;
    P2* q = reinterpret_cast<P2*>(p.v);
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) q[j] = Pair<T>::from(f[2 * j], f[2 * j + 1]);
    return p;
  }
};

template <typename T, int VEC>
__device__ __forceinline__ float sum_sq(const Pack<T, VEC>& p) {
  float f[VEC];
  Conv<T, VEC>::to(p, f);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) ss += f[j] * f[j];
  return ss;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.f;
  return warp_sum(v);
}

#if defined(HL_FASTDIV) && HL_FASTDIV
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.f + __expf(-g)); }
#else
__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }
#endif

template <typename T, int VEC>
__device__ __forceinline__ void write_pack(T* out, const T* weight, long long row_pack, int i,
                                           const Pack<T, VEC>& xv, const Pack<T, VEC>& gv,
                                           float rstd) {
  float xf[VEC], gf[VEC], wf[VEC];
  Conv<T, VEC>::to(xv, xf);
  Conv<T, VEC>::to(gv, gf);
  Conv<T, VEC>::to(load_pack<T, VEC>(weight, i), wf);
#pragma unroll
  for (int j = 0; j < VEC; ++j) xf[j] = xf[j] * rstd * wf[j] * silu(gf[j]);
  store_pack<T, VEC>(out, row_pack + i, Conv<T, VEC>::from(xf));
}

// One row per block: block (threads, 1, 1), grid (rows, 1, 1).
template <typename T, int VEC, int CHUNKS>
__global__ void __launch_bounds__(1024)
rmsnorm_gate_block(const T* __restrict__ x, const T* __restrict__ gate,
                   const T* __restrict__ weight, T* __restrict__ out, int rows, int dim,
                   float eps) {
  const int npack = dim / VEC;  // the host guarantees dim % VEC == 0
  const long long row_pack = (long long)blockIdx.x * npack;
  if (CHUNKS > 0) {
    Pack<T, VEC> xv[CHUNKS > 0 ? CHUNKS : 1], gv[CHUNKS > 0 ? CHUNKS : 1];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int i = threadIdx.x + c * blockDim.x;
      if (i < npack) {
        xv[c] = load_pack<T, VEC>(x, row_pack + i);
        gv[c] = load_pack<T, VEC>(gate, row_pack + i);
        ss += sum_sq<T, VEC>(xv[c]);
      }
    }
    const float rstd = rsqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int i = threadIdx.x + c * blockDim.x;
      if (i < npack) write_pack<T, VEC>(out, weight, row_pack, i, xv[c], gv[c], rstd);
    }
  } else {
    float ss = 0.f;
    for (int i = threadIdx.x; i < npack; i += blockDim.x) {
      const Pack<T, VEC> xv = load_pack<T, VEC>(x, row_pack + i);
      ss += sum_sq<T, VEC>(xv);
    }
    const float rstd = rsqrtf(block_sum(ss) / (float)dim + eps);
    for (int i = threadIdx.x; i < npack; i += blockDim.x)
      write_pack<T, VEC>(out, weight, row_pack, i, load_pack<T, VEC>(x, row_pack + i),
                         load_pack<T, VEC>(gate, row_pack + i), rstd);
  }
}

// One warp per row: block (32, rows per block, 1), grid (ceil(rows / rows per block), 1, 1).
template <typename T, int VEC, int CHUNKS>
__global__ void __launch_bounds__(1024)
rmsnorm_gate_warp(const T* __restrict__ x, const T* __restrict__ gate,
                  const T* __restrict__ weight, T* __restrict__ out, int rows, int dim,
                  float eps) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // whole warps leave: no block-wide barrier below
  const int npack = dim / VEC;
  const long long row_pack = (long long)row * npack;
  Pack<T, VEC> xv[CHUNKS], gv[CHUNKS];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * 32;
    if (i < npack) {
      xv[c] = load_pack<T, VEC>(x, row_pack + i);
      gv[c] = load_pack<T, VEC>(gate, row_pack + i);
      ss += sum_sq<T, VEC>(xv[c]);
    }
  }
  const float rstd = rsqrtf(warp_sum(ss) / (float)dim + eps);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * 32;
    if (i < npack) write_pack<T, VEC>(out, weight, row_pack, i, xv[c], gv[c], rstd);
  }
}
