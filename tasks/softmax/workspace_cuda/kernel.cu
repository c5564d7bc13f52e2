// Row softmax in CUDA C++ (baseline: correct for any width, simple, untuned).
//
//   y = exp(x - max(x)) / sum(exp(x - max(x)))     over the last dim, fp32 math inside
//
// One block of BLOCK_SIZE threads per row. Pass 1: each thread keeps a running max m and a
// running sum s of exp(x - m) over its elements (s rescaled when m grows; -inf entries add 0),
// then the block combines them (warp shuffles, then shared memory). Pass 2 reads the row again
// and writes the output. Loads move VEC elements at once when the host says the row allows it.
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

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // partial[] may still be read by the previous call
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  const bool mine = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5);
  v = mine ? partial[threadIdx.x & 31] : (is_max ? NEG_INF : 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  return v;
}

template <typename T, int N>
__device__ void online_pass(const T* x, int dim, float* m, float* s) {
  for (int i = threadIdx.x; i < dim / N; i += blockDim.x) {
    const Pack<T, N> xv = load_pack<T, N>(x, i);
    for (int j = 0; j < N; ++j) {
      const float v = to_f(xv.v[j]);
      if (v == NEG_INF) continue;
      if (v > *m) {
        *s = *s * __expf(*m - v) + 1.f;
        *m = v;
      } else {
        *s += __expf(v - *m);
      }
    }
  }
}

template <typename T, int N>
__device__ void output_pass(const T* x, T* out, int dim, float row_max, float inv) {
  for (int i = threadIdx.x; i < dim / N; i += blockDim.x) {
    const Pack<T, N> xv = load_pack<T, N>(x, i);
    Pack<T, N> o;
    for (int j = 0; j < N; ++j) o.v[j] = from_f<T>(__expf(to_f(xv.v[j]) - row_max) * inv);
    store_pack<T, N>(out, i, o);
  }
}

// grid (rows, 1, 1), block (BLOCK_SIZE, 1, 1)
template <typename T>
__global__ void __launch_bounds__(BLOCK_SIZE)
softmax_kernel(const T* __restrict__ x, T* __restrict__ out, int dim, int vector_ok) {
  const long long base = (long long)blockIdx.x * dim;
  float m = NEG_INF, s = 0.f;
  if (vector_ok) online_pass<T, VEC>(x + base, dim, &m, &s);
  else online_pass<T, 1>(x + base, dim, &m, &s);
  const float row_max = block_reduce(m, true);
  const float total = block_reduce(m == NEG_INF ? 0.f : s * __expf(m - row_max), false);
  if (vector_ok) output_pass<T, VEC>(x + base, out + base, dim, row_max, 1.f / total);
  else output_pass<T, 1>(x + base, out + base, dim, row_max, 1.f / total);
}
