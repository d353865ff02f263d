// fp8_quantize: the amax of a 16-bit matrix (one grid-stride pass, a warp maximum per warp, one
// atomicMax on the bits of |x|: for non-negative floats the bit patterns order as the values, and
// NaN's lie above inf's, so both propagate; one atomic per block; skipped for an amax the caller already
// has), then its E4M3 copy and/or transpose through tiles in
// shared memory (both written coalesced): 64 x 64 tiles moved 8 elements a thread where every size is a
// multiple of 8 (the FP8 GEMMs' operands), 32 x 32 tiles element by element otherwise.
#include <cuda_fp8.h>

#include "dtype_cuda.cuh"
#include "fp8_amax.cuh"
#include "fp8_cast.hpp"

namespace shardlm::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // threads per tile column: each thread covers kTile / kTileRows rows
constexpr int kAmaxBlocksPerSm = 8;  // the amax's grid: a few blocks per SM, each looping over its share

template <typename T>
__global__ void amax_kernel(const T* x, int rows, int cols, int ld, unsigned* amax_bits) {
  const size_t n = static_cast<size_t>(rows) * cols;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned m = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t r = i / cols, c = i % cols;
    const float v = FloatConversion<T>::to(x[r * ld + c]);
    m = max(m, abs_bits(v));
  }
  publish_amax(m, amax_bits);
}

// The contiguous case (ld == cols, 16-byte aligned, n a multiple of 8): 8 elements per 16-byte load.
template <typename T>
__global__ void amax_packed_kernel(const T* x, size_t packs, unsigned* amax_bits) {
  unsigned m = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    float v[8];
    load_floats<8>(x + p * 8, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = max(m, abs_bits(v[k]));
  }
  publish_amax(m, amax_bits);
}

// The factor onto E4M3's range, and the one the GEMM multiplies back (1 both for an all-zero tensor).
__device__ __forceinline__ float scale_of(float amax) { return amax == 0.0f ? 1.0f : kFp8E4M3Max / amax; }
__device__ __forceinline__ float inv_scale_of(float amax) { return amax == 0.0f ? 1.0f : amax / kFp8E4M3Max; }

// The untransposed copy of the contiguous case: 8 elements in (16 bytes), 8 bytes out.
template <typename T>
__global__ void quantize_packed_kernel(const T* x, size_t packs, const unsigned* amax_bits, uint8_t* out,
                                       float* inv_scale) {
  const float amax = __uint_as_float(*amax_bits);
  const float scale = scale_of(amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inv_scale = inv_scale_of(amax);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    float v[8];
    load_floats<8>(x + p * 8, v);
    uint2 q;
    uint8_t* b = reinterpret_cast<uint8_t*>(&q);
#pragma unroll
    for (int k = 0; k < 8; ++k) b[k] = __nv_cvt_float_to_fp8(v[k] * scale, __NV_SATFINITE, __NV_E4M3);
    reinterpret_cast<uint2*>(out)[p] = q;
  }
}

template <typename T>
__global__ void quantize_kernel(const T* x, int rows, int cols, int ld, const unsigned* amax_bits, uint8_t* out,
                                uint8_t* out_t, float* inv_scale) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float amax = __uint_as_float(*amax_bits);
  const float scale = scale_of(amax);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
    *inv_scale = inv_scale_of(amax);
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  for (int dr = threadIdx.y; dr < kTile; dr += kTileRows) {
    const int r = r0 + dr, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = FloatConversion<T>::to(x[static_cast<size_t>(r) * ld + c]) * scale;
      const uint8_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
      if (out) out[static_cast<size_t>(r) * cols + c] = q;
      tile[dr][threadIdx.x] = q;
    }
  }
  if (!out_t) return;
  __syncthreads();
  // The transpose: thread x now walks the tile's rows, so out_t's rows (x's columns) are written coalesced.
  for (int dc = threadIdx.y; dc < kTile; dc += kTileRows) {
    const int c = c0 + dc, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out_t[static_cast<size_t>(c) * rows + r] = tile[threadIdx.x][dc];
  }
}

// The vectorised tile (rows, cols and ld multiples of 8, x 16-byte aligned): 64 x 64 elements, each thread
// loading 8 (16 bytes) and storing 8 bytes to `out` and to the tile, then 8 bytes of the transpose (eight
// rows of one column) to `out_t`. The tile's 8-byte chunks are swizzled (chunk ^ row / 8) so that the
// transposed reads of a warp fall in different banks.
constexpr int kVecTile = 64;
constexpr int kVecThreads = 256;

__device__ __forceinline__ int swizzled(int row, int col) {
  return row * kVecTile + ((((col >> 3) ^ (row >> 3)) & 7) << 3) + (col & 7);
}

template <typename T>
__global__ void quantize_tiles_kernel(const T* x, int rows, int cols, int ld, const unsigned* amax_bits, uint8_t* out,
                                      uint8_t* out_t, float* inv_scale) {
  __shared__ __align__(16) uint8_t tile[kVecTile * kVecTile];
  const float amax = __uint_as_float(*amax_bits);
  const float scale = scale_of(amax);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *inv_scale = inv_scale_of(amax);
  const int c0 = blockIdx.x * kVecTile, r0 = blockIdx.y * kVecTile;
  constexpr int kPacks = kVecTile * kVecTile / 8;
  for (int p = threadIdx.x; p < kPacks; p += kVecThreads) {
    const int dr = p >> 3, dc = (p & 7) << 3;
    const int r = r0 + dr, c = c0 + dc;
    if (r >= rows || c >= cols) continue;
    float v[8];
    load_floats<8>(x + static_cast<size_t>(r) * ld + c, v);
    uint2 q;
    uint8_t* b = reinterpret_cast<uint8_t*>(&q);
#pragma unroll
    for (int k = 0; k < 8; ++k) b[k] = __nv_cvt_float_to_fp8(v[k] * scale, __NV_SATFINITE, __NV_E4M3);
    if (out) *reinterpret_cast<uint2*>(out + static_cast<size_t>(r) * cols + c) = q;
    *reinterpret_cast<uint2*>(tile + swizzled(dr, dc)) = q;
  }
  if (!out_t) return;
  __syncthreads();
  // Thread p writes out_t's row c0 + p / 8 (x's column), elements r0 + 8 (p % 8) ... + 7.
  for (int p = threadIdx.x; p < kPacks; p += kVecThreads) {
    const int dc = p >> 3, dr = (p & 7) << 3;
    const int c = c0 + dc, r = r0 + dr;
    if (r >= rows || c >= cols) continue;
    uint2 q;
    uint8_t* b = reinterpret_cast<uint8_t*>(&q);
#pragma unroll
    for (int k = 0; k < 8; ++k) b[k] = tile[swizzled(dr + k, dc)];
    *reinterpret_cast<uint2*>(out_t + static_cast<size_t>(c) * rows + r) = q;
  }
}

}  // namespace

void fp8_quantize(const void* x, int rows, int cols, int ld, DType dt, uint8_t* out, uint8_t* out_t, float* inv_scale,
                  unsigned* amax_bits, cudaStream_t stream, bool amax_known) {
  SHARDLM_CHECK(dt == DType::BF16 || dt == DType::F16, "fp8_quantize: the input must be bf16 or fp16, not ",
                dtype_name(dt));
  SHARDLM_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "fp8_quantize: bad shape ", rows, " x ", cols, " ld ", ld);
  if (!amax_known) SHARDLM_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream));
  if (rows == 0 || cols == 0) return;
  const size_t n = static_cast<size_t>(rows) * cols;
  const bool packed = ld == cols && n % 8 == 0 && is_aligned(x, 16) && (!out || is_aligned(out, 8));
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (sizeof(T) == 2) {  // bf16 or fp16 (checked above); no fp32 instantiation
    const T* xt = static_cast<const T*>(x);
    if (!amax_known && packed) {
      amax_packed_kernel<T><<<grid_for(n / 8, kBlockThreads, kAmaxBlocksPerSm), kBlockThreads, 0, stream>>>(
          xt, n / 8, amax_bits);
      SHARDLM_CUDA_LAUNCH_CHECK();
    } else if (!amax_known) {
      amax_kernel<T><<<grid_for(n, kBlockThreads, kAmaxBlocksPerSm), kBlockThreads, 0, stream>>>(xt, rows, cols, ld,
                                                                                             amax_bits);
      SHARDLM_CUDA_LAUNCH_CHECK();
    }
    if (packed && !out_t) {
      quantize_packed_kernel<T><<<grid_for(n / 8), kBlockThreads, 0, stream>>>(xt, n / 8, amax_bits, out, inv_scale);
      SHARDLM_CUDA_LAUNCH_CHECK();
      return;
    }
    if (rows % 8 == 0 && cols % 8 == 0 && ld % 8 == 0 && is_aligned(x, 16) && (!out || is_aligned(out, 8)) &&
        (!out_t || is_aligned(out_t, 8))) {
      const dim3 grid((cols + kVecTile - 1) / kVecTile, (rows + kVecTile - 1) / kVecTile);
      quantize_tiles_kernel<T><<<grid, kVecThreads, 0, stream>>>(xt, rows, cols, ld, amax_bits, out, out_t, inv_scale);
      SHARDLM_CUDA_LAUNCH_CHECK();
      return;
    }
    const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, kTileRows);
    quantize_kernel<T><<<grid, block, 0, stream>>>(xt, rows, cols, ld, amax_bits, out, out_t, inv_scale);
    SHARDLM_CUDA_LAUNCH_CHECK();
    }
  });
}

float fp8_e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 0xf, mantissa = v & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return NAN;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

}  // namespace shardlm::cuda
