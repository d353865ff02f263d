// A tensor's amax for FP8's per-tensor current scaling, as the bits of max |x|: for non-negative floats the
// bit patterns order as the values and NaN's lie above inf's, so one atomicMax on the bits keeps a NaN or an
// inf. fp8_quantize (fp8_cast.cu) reduces it in a pass of its own; a kernel that writes a tensor an FP8 GEMM
// reads next (swiglu.cu) may reduce it as it writes, into the word the quantization would (fp8_gemm.hpp).
#pragma once

#include "dtype_cuda.cuh"

namespace shardlm::cuda {

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// |v| as the T that stores it holds it (rounded to T, read back): the amax of what was written.
template <typename T>
__device__ __forceinline__ unsigned stored_abs_bits(float v) {
  return abs_bits(to_float(from_float<T>(v)));
}

// m raised to the amax of the N values v as the T that stores them holds them.
template <typename T, int N>
__device__ __forceinline__ unsigned max_stored_abs_bits(unsigned m, const float (&v)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) m = max(m, stored_abs_bits<T>(v[k]));
  return m;
}

// Zeroes an amax word on `stream` before a kernel reduces into it (host side).
inline void clear_amax(unsigned* amax_bits, cudaStream_t stream) {
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream));
}

__device__ __forceinline__ unsigned warp_max_bits(unsigned m) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  return m;
}

// A thread's largest |x| bits into *amax_bits: the warp's maximum, the block's through shared memory, then
// one atomicMax per block (one per warp serialises tens of thousands of atomics on one address). Every
// thread of the block calls it.
__device__ __forceinline__ void publish_amax(unsigned m, unsigned* amax_bits) {
  __shared__ unsigned warps[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  m = warp_max_bits(m);
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp != 0) return;
  m = warp_max_bits(lane < static_cast<int>((blockDim.x + 31) / 32) ? warps[lane] : 0u);
  if (lane == 0 && m != 0) atomicMax(amax_bits, m);
}

}  // namespace shardlm::cuda
