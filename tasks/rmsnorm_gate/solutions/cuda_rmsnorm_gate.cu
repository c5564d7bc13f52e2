// Fused RMSNorm + SiLU gate, CUDA C++ reference solution (compiled by NVRTC through
// harnesslab_cuda; the Python wrapper cuda_rmsnorm_gate.py picks the variant per shape).
//
//   y = x * rsqrt(mean(x * x) + eps) * weight * silu(gate),   fp32 math, fp16/bf16 in and out
//
// - Each row is read once: x and gate stay in registers between the sum of squares and the
//   output (CHUNKS packs per thread), so traffic is the minimum 3 * rows * dim elements.
// - VEC = 8: 16-byte loads and stores (LDG.128 / STG.128). The host picks VEC = 1 (2-byte
//   accesses) when dim % 8 != 0 or a pointer is not 16-byte aligned: nothing is assumed.
// - Small rows (under 128 packs): one warp per row, several rows per block, the reduction is
//   warp shuffles only. Larger rows: one row per block, warp shuffles then one shared-memory step.
// - CHUNKS = 0: rows too wide for registers are read twice (sum of squares, then the output).
// - silu divides with __fdividef (below).
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

// __fdividef: an approximate reciprocal and a multiply. With the IEEE division (div.rn.f32)
// 4096x4096 took 41.5 us in bf16 and 33.5 us in fp16 on an H100, with __fdividef 32.2 us in both
// (BENCHMARKS.md, seventh session). A huge denominator (g < -88: exp overflows) gives 0, as silu.
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.f + __expf(-g)); }

template <typename T, int VEC>
__device__ __forceinline__ void write_pack(T* out, const T* weight, long long row_pack, int i,
                                           const Pack<T, VEC>& xv, const Pack<T, VEC>& gv,
                                           float rstd) {
  const Pack<T, VEC> wv = load_pack<T, VEC>(weight, i);
  Pack<T, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    o.v[j] = from_f<T>(to_f(xv.v[j]) * rstd * to_f(wv.v[j]) * silu(to_f(gv.v[j])));
  store_pack<T, VEC>(out, row_pack + i, o);
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
#pragma unroll
        for (int j = 0; j < VEC; ++j) ss += to_f(xv[c].v[j]) * to_f(xv[c].v[j]);
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
#pragma unroll
      for (int j = 0; j < VEC; ++j) ss += to_f(xv.v[j]) * to_f(xv.v[j]);
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
#pragma unroll
      for (int j = 0; j < VEC; ++j) ss += to_f(xv[c].v[j]) * to_f(xv[c].v[j]);
    }
  }
  const float rstd = rsqrtf(warp_sum(ss) / (float)dim + eps);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * 32;
    if (i < npack) write_pack<T, VEC>(out, weight, row_pack, i, xv[c], gv[c], rstd);
  }
}
