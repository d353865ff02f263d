// Shared pieces of the CUDA kernels: fp32 <-> storage-dtype conversions, 16-byte packs for vector
// loads, dispatch from DType to a C++ type, and launch shapes. Device code only in .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "cuda_check.hpp"
#include "shardlm/core.hpp"
#include "workspace_sizes.hpp"

namespace shardlm::cuda {

// ---- conversions (the intrinsics below exist on every architecture, sm_70 included) ------------

// One row per storage type: its conversion to fp32 and back. from_float rounds to nearest even,
// like the host's float_to_bf16 / float_to_fp16.
template <typename T>
struct FloatConversion;
template <>
struct FloatConversion<float> {
  static __device__ __forceinline__ float to(float v) { return v; }
  static __device__ __forceinline__ float from(float v) { return v; }
};
template <>
struct FloatConversion<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct FloatConversion<__half> {
  static __device__ __forceinline__ float to(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
};

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return FloatConversion<T>::to(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return FloatConversion<T>::from(v);
}

// ---- packs: N elements moved with one 2/4/8/16-byte access -------------------------------------

template <int Bytes>
struct RawBits;
template <>
struct RawBits<2> {
  using type = unsigned short;
};
template <>
struct RawBits<4> {
  using type = unsigned int;
};
template <>
struct RawBits<8> {
  using type = uint2;
};
template <>
struct RawBits<16> {
  using type = uint4;
};

template <typename T, int N>
struct Pack {
  T v[N];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};

// p must be aligned to sizeof(T) * N (callers check it on the host before choosing N > 1).
template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  using Raw = typename RawBits<sizeof(T) * N>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  Pack<T, N> out;
  memcpy(&out, &raw, sizeof(raw));
  return out;
}

template <int N, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& in) {
  using Raw = typename RawBits<sizeof(T) * N>::type;
  Raw raw;
  memcpy(&raw, &in, sizeof(raw));
  *reinterpret_cast<Raw*>(p) = raw;
}

template <int N, typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = load_pack<N>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_float(pack[k]);
}

template <int N, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int k = 0; k < N; ++k) pack[k] = from_float<T>(in[k]);
  store_pack<N>(p, pack);
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int vec_width() {
  return static_cast<int>(16 / sizeof(T));
}

inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- dtype dispatch ------------------------------------------------------------------------------

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T = float, __nv_bfloat16 or __half for dt; inside f,
// `using T = typename decltype(tag)::type;` names the element type.
template <typename F>
void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(TypeTag<float>{}); return;
    case DType::BF16: f(TypeTag<__nv_bfloat16>{}); return;
    case DType::F16: f(TypeTag<__half>{}); return;
  }
  throw Error(concat("CUDA kernels: unknown dtype ", static_cast<int>(dt)));
}

template <int N>
using PackWidth = std::integral_constant<int, N>;

// dispatch_dtype that also picks the pack width: calls f(TypeTag<T>{}, PackWidth<N>{}) with
// N = vec_width<T>() when rows of `cols` elements are whole packs and every pointer is 16-byte
// aligned (a pack then never straddles a row), else N = 1. Inside f,
// `constexpr int N = decltype(width)::value;` names the width.
template <typename F>
void dispatch_dtype_packed(DType dt, long long cols, std::initializer_list<const void*> pointers, F&& f) {
  dispatch_dtype(dt, [&](auto tag) {
    constexpr int N = vec_width<typename decltype(tag)::type>();
    bool packed = cols % N == 0;
    for (const void* p : pointers) packed = packed && is_aligned(p, 16);
    if (packed)
      f(tag, PackWidth<N>{});
    else
      f(tag, PackWidth<1>{});
  });
}

// ---- reductions ----------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Adds the block's sum of every thread's acc to *out: each warp's sum, then warp 0's sum of those, one atomic
// add a block (none for a zero sum). Every thread of the block calls it (it synchronises the block).
__device__ __forceinline__ void block_sum_add(double acc, double* out) {
  __shared__ double warp_sums[32];
  acc = warp_sum(acc);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    double total = lane < warps ? warp_sums[lane] : 0.0;
    total = warp_sum(total);
    if (lane == 0 && total != 0.0) atomicAdd(out, total);
  }
}

// Merges a running softmax state (max, sum of exp(x - max)) with another; empty states have
// max = -inf. Used by the attention softmax and the cross-entropy of the LM head.
__device__ __forceinline__ void merge_softmax_state(float& m, float& s, float other_m, float other_s) {
  if (other_m == -INFINITY) return;
  if (m == -INFINITY) {
    m = other_m;
    s = other_s;
  } else if (other_m > m) {
    s = s * expf(m - other_m) + other_s;
    m = other_m;
  } else {
    s += other_s * expf(other_m - m);
  }
}

// Adds x to a running softmax state (max m, sum s of exp(x_j - m)) of one thread.
__device__ __forceinline__ void add_to_softmax_state(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

// Merges the softmax states of a warp's lanes so that every lane holds the warp's.
__device__ __forceinline__ void warp_merge_softmax_state(float& m, float& s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_m = __shfl_xor_sync(0xffffffffu, m, offset);
    const float other_s = __shfl_xor_sync(0xffffffffu, s, offset);
    merge_softmax_state(m, s, other_m, other_s);
  }
}

// ---- launch shapes -------------------------------------------------------------------------------

constexpr int kBlockThreads = 256;

// Streaming multiprocessors of the current device, asked once per device.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];
  int device = 0;
  SHARDLM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  SHARDLM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  count = std::max(count, 1);
  if (device < kMaxDevices) cached[device].store(count, std::memory_order_relaxed);
  return count;
}

// Blocks for `items` work items of one thread each in a grid-stride loop: enough to fill the GPU
// several times over, no more (each thread then loops, which amortises its index arithmetic).
inline unsigned grid_for(size_t items, int block = kBlockThreads, int blocks_per_sm = 32) {
  const size_t wanted = (items + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  const size_t cap = static_cast<size_t>(sm_count()) * static_cast<size_t>(blocks_per_sm);
  return static_cast<unsigned>(std::max<size_t>(1, std::min(wanted, cap)));
}


}  // namespace shardlm::cuda
