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
// - HINTS (bits below), MAXT and MIN_BLOCKS are knobs the Python plan passes as template
//   arguments; 0, 1024 and 1 are the measured defaults (the kernels as they were before the knobs).
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

// HINTS bits: cache hints and load order, each a candidate that only a GPU run can decide
// (benchmarks/rmsnorm_cuda_variants_gpu.py). Only the 16-byte path (VEC = 8) takes the hints.
#define HINT_LOAD_NA 1     // x, gate: ld.global.nc.L1::no_allocate (read once: no L1 line)
#define HINT_LOAD_EF 2     // x, gate: and an L2 evict-first policy (createpolicy + cache_hint)
#define HINT_STORE_CS 4    // out: st.global.cs (written once, streamed)
#define HINT_W_EARLY 8     // weight loaded with x and gate, before the reduction
#define HINT_LOADS_FIRST 16  // every pack of a thread loaded before any math (CHUNKS > 1)
#define HINT_BF16_WORDS 32   // bf16 read from the packed 32-bit words at each use (below)
#define HINT_GATE_LATE 64    // gate loaded after the reduction, as FLA orders it (fewer registers)
#define HINT_L2_256 128      // x, gate: ld.global.nc.L2::256B (L2 fetches 256-byte blocks from DRAM)

template <typename T> __device__ constexpr bool is_bf16() { return false; }
template <> __device__ constexpr bool is_bf16<__nv_bfloat16>() { return true; }

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

// x and gate: read once. HINTS picks the cache operators of the 16-byte load.
template <typename T, int VEC, int HINTS>
__device__ __forceinline__ Pack<T, VEC> load_once(const T* p, long long i) {
  if (VEC != 8 || !(HINTS & (HINT_LOAD_NA | HINT_LOAD_EF | HINT_L2_256)))
    return load_pack<T, VEC>(p, i);
  const uint4* a = reinterpret_cast<const uint4*>(p) + i;
  uint4 r;
  if ((HINTS & HINT_L2_256) && !(HINTS & (HINT_LOAD_NA | HINT_LOAD_EF))) {
    asm("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(a));
  } else if (HINTS & HINT_L2_256) {  // with no L1 allocation (the evict-first policy: not taken)
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(a));
  } else if (HINTS & HINT_LOAD_EF) {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(a), "l"(policy));
  } else {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(a));
  }
  return *reinterpret_cast<Pack<T, VEC>*>(&r);
}

template <typename T, int VEC, int HINTS>
__device__ __forceinline__ void store_out(T* p, long long i, const Pack<T, VEC>& v) {
  if (VEC != 8 || !(HINTS & HINT_STORE_CS)) {
    store_pack<T, VEC>(p, i, v);
    return;
  }
  __stcs(reinterpret_cast<uint4*>(p) + i, *reinterpret_cast<const uint4*>(&v));
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

// Element j of a pack as fp32. __bfloat162float takes a 16-bit register: each bf16 of a pack is
// moved into a register of its own, and x's stay live from the sum of squares to the output
// (cuobjdump: block<bf16, 8, 2> takes 50 registers, <half, 8, 2> 32). With HINT_BF16_WORDS the
// value is cut from the packed word at each use (a shift or a mask: bf16 is fp32's top half).
template <int HINTS, typename T, int VEC>
__device__ __forceinline__ float elem(const Pack<T, VEC>& p, int j) {
  if constexpr (is_bf16<T>() && VEC % 2 == 0 && (HINTS & HINT_BF16_WORDS) != 0) {
    const unsigned w = reinterpret_cast<const unsigned*>(&p)[j >> 1];
    return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
  } else {
    return to_f(p.v[j]);
  }
}

template <typename T, int VEC, int HINTS = 0>
__device__ __forceinline__ void add_sq(float& ss, const Pack<T, VEC>& v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) ss += elem<HINTS>(v, j) * elem<HINTS>(v, j);
}

template <typename T, int VEC, int HINTS>
__device__ __forceinline__ void write_pack(T* out, long long row_pack, int i,
                                           const Pack<T, VEC>& xv, const Pack<T, VEC>& gv,
                                           const Pack<T, VEC>& wv, float rstd) {
  Pack<T, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    o.v[j] = from_f<T>(elem<HINTS>(xv, j) * rstd * elem<HINTS>(wv, j) *
                       silu(elem<HINTS>(gv, j)));
  store_out<T, VEC, HINTS>(out, row_pack + i, o);
}

// Pack i of a row: x, and gate unless HINT_GATE_LATE, and the weight with HINT_W_EARLY, loads
// issued; nothing waits for them.
template <typename T, int VEC, int HINTS>
__device__ __forceinline__ void issue_pack(const T* __restrict__ x, const T* __restrict__ gate,
                                           const T* __restrict__ weight, long long row_pack,
                                           int i, Pack<T, VEC>& xv, Pack<T, VEC>& gv,
                                           Pack<T, VEC>& wv) {
  xv = load_once<T, VEC, HINTS>(x, row_pack + i);
  if (!(HINTS & HINT_GATE_LATE)) gv = load_once<T, VEC, HINTS>(gate, row_pack + i);
  if (HINTS & HINT_W_EARLY) wv = load_pack<T, VEC>(weight, i);
}

// The CHUNKS packs of one row a thread holds, strided by `stride`, issued (issue_pack).
template <typename T, int VEC, int CHUNKS, int HINTS>
__device__ __forceinline__ void issue_row(const T* __restrict__ x, const T* __restrict__ gate,
                                          const T* __restrict__ weight, long long row_pack,
                                          int first, int stride, int npack, Pack<T, VEC>* xv,
                                          Pack<T, VEC>* gv, Pack<T, VEC>* wv) {
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = first + c * stride;
    if (i < npack)
      issue_pack<T, VEC, HINTS>(x, gate, weight, row_pack, i, xv[c], gv[c],
                                wv[(HINTS & HINT_W_EARLY) ? c : 0]);
  }
}

template <typename T, int VEC, int CHUNKS, int HINTS>
__device__ __forceinline__ float row_sq(int first, int stride, int npack,
                                        const Pack<T, VEC>* xv) {
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
    if (first + c * stride < npack) add_sq<T, VEC, HINTS>(ss, xv[c]);
  return ss;
}

// issue_row, then the sum of squares of x: with HINT_LOADS_FIRST after every load is issued,
// else pack by pack as the loads are issued (the order before the knobs).
template <typename T, int VEC, int CHUNKS, int HINTS>
__device__ __forceinline__ float load_row(const T* __restrict__ x, const T* __restrict__ gate,
                                          const T* __restrict__ weight, long long row_pack,
                                          int first, int stride, int npack, Pack<T, VEC>* xv,
                                          Pack<T, VEC>* gv, Pack<T, VEC>* wv) {
  if (HINTS & HINT_LOADS_FIRST) {
    issue_row<T, VEC, CHUNKS, HINTS>(x, gate, weight, row_pack, first, stride, npack, xv, gv, wv);
    return row_sq<T, VEC, CHUNKS, HINTS>(first, stride, npack, xv);
  }
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = first + c * stride;
    if (i < npack) {
      issue_pack<T, VEC, HINTS>(x, gate, weight, row_pack, i, xv[c], gv[c],
                                wv[(HINTS & HINT_W_EARLY) ? c : 0]);
      add_sq<T, VEC, HINTS>(ss, xv[c]);
    }
  }
  return ss;
}

// Writes the CHUNKS packs load_row read (the weight loaded here unless it came early, the gate
// here with HINT_GATE_LATE).
template <typename T, int VEC, int CHUNKS, int HINTS>
__device__ __forceinline__ void store_row(T* __restrict__ out, const T* __restrict__ gate,
                                          const T* __restrict__ weight, long long row_pack,
                                          int first, int stride, int npack,
                                          const Pack<T, VEC>* xv, const Pack<T, VEC>* gv,
                                          const Pack<T, VEC>* wv, float rstd) {
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = first + c * stride;
    if (i >= npack) continue;
    if constexpr ((HINTS & HINT_GATE_LATE) != 0)
      write_pack<T, VEC, HINTS>(out, row_pack, i, xv[c],
                                load_once<T, VEC, HINTS>(gate, row_pack + i),
                                (HINTS & HINT_W_EARLY) ? wv[c] : load_pack<T, VEC>(weight, i),
                                rstd);
    else
      write_pack<T, VEC, HINTS>(out, row_pack, i, xv[c], gv[c],
                                (HINTS & HINT_W_EARLY) ? wv[c] : load_pack<T, VEC>(weight, i),
                                rstd);
  }
}

// One row per block: block (threads, 1, 1), grid (rows, 1, 1).
template <typename T, int VEC, int CHUNKS, int HINTS = 0, int MAXT = 1024, int MIN_BLOCKS = 0>
__global__ void __launch_bounds__(MAXT, MIN_BLOCKS)
rmsnorm_gate_block(const T* __restrict__ x, const T* __restrict__ gate,
                   const T* __restrict__ weight, T* __restrict__ out, int rows, int dim,
                   float eps) {
  const int npack = dim / VEC;  // the host guarantees dim % VEC == 0
  const long long row_pack = (long long)blockIdx.x * npack;
  if (CHUNKS > 0) {
    constexpr int N = CHUNKS > 0 ? CHUNKS : 1;
    Pack<T, VEC> xv[N], gv[N], wv[(HINTS & HINT_W_EARLY) ? N : 1];
    const float ss = load_row<T, VEC, N, HINTS>(x, gate, weight, row_pack, threadIdx.x,
                                                blockDim.x, npack, xv, gv, wv);
    const float rstd = rsqrtf(block_sum(ss) / (float)dim + eps);
    store_row<T, VEC, N, HINTS>(out, gate, weight, row_pack, threadIdx.x, blockDim.x, npack, xv,
                                gv, wv, rstd);
  } else {
    float ss = 0.f;
    for (int i = threadIdx.x; i < npack; i += blockDim.x)
      add_sq<T, VEC>(ss, load_pack<T, VEC>(x, row_pack + i));
    const float rstd = rsqrtf(block_sum(ss) / (float)dim + eps);
    for (int i = threadIdx.x; i < npack; i += blockDim.x)
      write_pack<T, VEC, HINTS>(out, row_pack, i, load_pack<T, VEC>(x, row_pack + i),
                                load_pack<T, VEC>(gate, row_pack + i),
                                load_pack<T, VEC>(weight, i), rstd);
  }
}

// One warp per row: block (32, rows per block, 1), grid (ceil(rows / rows per block), 1, 1).
template <typename T, int VEC, int CHUNKS, int HINTS = 0, int MAXT = 1024, int MIN_BLOCKS = 0>
__global__ void __launch_bounds__(MAXT, MIN_BLOCKS)
rmsnorm_gate_warp(const T* __restrict__ x, const T* __restrict__ gate,
                  const T* __restrict__ weight, T* __restrict__ out, int rows, int dim,
                  float eps) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // whole warps leave: no block-wide barrier below
  const int npack = dim / VEC;
  const long long row_pack = (long long)row * npack;
  Pack<T, VEC> xv[CHUNKS], gv[CHUNKS], wv[(HINTS & HINT_W_EARLY) ? CHUNKS : 1];
  const float ss = load_row<T, VEC, CHUNKS, HINTS>(x, gate, weight, row_pack, threadIdx.x, 32,
                                                   npack, xv, gv, wv);
  const float rstd = rsqrtf(warp_sum(ss) / (float)dim + eps);
  store_row<T, VEC, CHUNKS, HINTS>(out, gate, weight, row_pack, threadIdx.x, 32, npack, xv, gv,
                                   wv, rstd);
}

// Persistent rows: block (threads, 1, 1), grid (g, 1, 1) with g <= rows; block b takes rows b,
// b + g, ... The weight stays in registers across the rows, and the next row's x and gate loads
// are issued before this row's sum of squares, reduction and stores (a warp runs in order: an
// instruction that used the next row's data would wait for it here). Twice the registers of
// rmsnorm_gate_block for the data.
template <typename T, int VEC, int CHUNKS, int HINTS = 0, int MAXT = 1024, int MIN_BLOCKS = 0>
__global__ void __launch_bounds__(MAXT, MIN_BLOCKS)
rmsnorm_gate_persist(const T* __restrict__ x, const T* __restrict__ gate,
                     const T* __restrict__ weight, T* __restrict__ out, int rows, int dim,
                     float eps) {
  constexpr int H = HINTS & ~(HINT_W_EARLY | HINT_GATE_LATE);  // the weight: once, below
  __shared__ float partial[2][32];  // one per parity of the row count: no barrier to reuse it
  const int npack = dim / VEC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  Pack<T, VEC> wv[CHUNKS], xv[CHUNKS], gv[CHUNKS];
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i < npack) wv[c] = load_pack<T, VEC>(weight, i);
  }
  int row = blockIdx.x;
  issue_row<T, VEC, CHUNKS, H>(x, gate, weight, (long long)row * npack, threadIdx.x, blockDim.x,
                               npack, xv, gv, wv);
  for (int k = 0; row < rows; ++k, row += gridDim.x) {
    const int next = row + gridDim.x;
    Pack<T, VEC> xn[CHUNKS], gn[CHUNKS];
    if (next < rows)
      issue_row<T, VEC, CHUNKS, H>(x, gate, weight, (long long)next * npack, threadIdx.x,
                                   blockDim.x, npack, xn, gn, wv);
    float total = warp_sum(row_sq<T, VEC, CHUNKS, H>(threadIdx.x, blockDim.x, npack, xv));
    if (lane == 0) partial[k & 1][warp] = total;
    __syncthreads();
    total = warp_sum(lane < (int)(blockDim.x >> 5) ? partial[k & 1][lane] : 0.f);
    const float rstd = rsqrtf(total / (float)dim + eps);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int i = threadIdx.x + c * blockDim.x;
      if (i < npack)
        write_pack<T, VEC, H>(out, (long long)row * npack, i, xv[c], gv[c], wv[c], rstd);
    }
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      xv[c] = xn[c];
      gv[c] = gn[c];
    }
  }
}
