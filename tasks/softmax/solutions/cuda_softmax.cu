// Row softmax, CUDA C++ reference solution (compiled by NVRTC through harnesslab_cuda; the
// Python wrapper cuda_softmax.py picks the variant per shape).
//
//   y = exp(x - max(x)) / sum(exp(x - max(x)))   over the last dim, fp32 math, fp16/bf16 in/out
//
// - Each row is read once when it fits registers (CHUNKS packs per thread: up to 65536 fp16/bf16
//   elements with 16-byte packs and 1024 threads): max, then the sum of exponentials, then the
//   output, all from registers. Wider rows (CHUNKS = 0) keep a running max and sum per thread
//   (rescaled when the max grows) and read the row a second time for the output.
// - VEC = 8: 16-byte loads and stores; VEC = 1 when dim % 8 != 0 or a pointer is unaligned.
// - -inf logits (attention masks) give 0; a row that is all -inf gives NaN, as torch.softmax.
// - Rows of at most 128 packs: one warp per row, shuffles only; else one row per block.
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

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide max and sum (blockDim.x a multiple of 32); every thread gets the result. Each has
// its own shared array, so calling one after the other needs no extra barrier.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part_max[32];
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) part_max[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? part_max[threadIdx.x & 31] : NEG_INF;
  return warp_max(v);
}
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part_sum[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part_sum[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? part_sum[threadIdx.x & 31] : 0.f;
  return warp_sum(v);
}

// Row in registers. LANES threads share the row: 32 (a warp, `lane` = threadIdx.x, row from
// threadIdx.y) or the block (BLOCK = true).
template <typename T, int VEC, int CHUNKS, bool BLOCK>
__device__ __forceinline__ void softmax_registers(const T* __restrict__ x, T* __restrict__ out,
                                                  long long row_pack, int npack, int lanes) {
  Pack<T, VEC> xv[CHUNKS];
  float m = NEG_INF;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * lanes;
    if (i < npack) {
      xv[c] = load_pack<T, VEC>(x, row_pack + i);
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = fmaxf(m, to_f(xv[c].v[j]));
    }
  }
  m = BLOCK ? block_max(m) : warp_max(m);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * lanes;
    if (i < npack) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += __expf(to_f(xv[c].v[j]) - m);  // exp(-inf) = 0
    }
  }
  const float inv = 1.f / (BLOCK ? block_sum(s) : warp_sum(s));
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * lanes;
    if (i < npack) {
      Pack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(__expf(to_f(xv[c].v[j]) - m) * inv);
      store_pack<T, VEC>(out, row_pack + i, o);
    }
  }
}

// One row per block: block (threads, 1, 1), grid (rows, 1, 1).
template <typename T, int VEC, int CHUNKS>
__global__ void __launch_bounds__(1024)
softmax_block(const T* __restrict__ x, T* __restrict__ out, int rows, int dim) {
  const int npack = dim / VEC;  // the host guarantees dim % VEC == 0
  const long long row_pack = (long long)blockIdx.x * npack;
  if (CHUNKS > 0) {
    softmax_registers<T, VEC, (CHUNKS > 0 ? CHUNKS : 1), true>(x, out, row_pack, npack,
                                                               blockDim.x);
    return;
  }
  // Online: running max m and sum s of exp(x - m) per thread.
  float m = NEG_INF, s = 0.f;
  for (int i = threadIdx.x; i < npack; i += blockDim.x) {
    const Pack<T, VEC> xv = load_pack<T, VEC>(x, row_pack + i);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float v = to_f(xv.v[j]);
      if (v == NEG_INF) continue;  // adds 0; exp(-inf - -inf) would be NaN
      if (v > m) {
        s = s * __expf(m - v) + 1.f;
        m = v;
      } else {
        s += __expf(v - m);
      }
    }
  }
  const float row_max = block_max(m);
  const float total = block_sum(m == NEG_INF ? 0.f : s * __expf(m - row_max));
  const float inv = 1.f / total;
  for (int i = threadIdx.x; i < npack; i += blockDim.x) {
    const Pack<T, VEC> xv = load_pack<T, VEC>(x, row_pack + i);
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(__expf(to_f(xv.v[j]) - row_max) * inv);
    store_pack<T, VEC>(out, row_pack + i, o);
  }
}

// One warp per row: block (32, rows per block, 1), grid (ceil(rows / rows per block), 1, 1).
template <typename T, int VEC, int CHUNKS>
__global__ void __launch_bounds__(1024)
softmax_warp(const T* __restrict__ x, T* __restrict__ out, int rows, int dim) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // whole warps leave: no block-wide barrier below
  const int npack = dim / VEC;
  softmax_registers<T, VEC, CHUNKS, false>(x, out, (long long)row * npack, npack, 32);
}
