// fp8_quantize: the amax of a 16-bit matrix (one grid-stride pass, a warp maximum per warp, one
// atomicMax on the bits of |x|: for non-negative floats the bit patterns order as the values, and
// NaN's lie above inf's, so both propagate; one atomic per block; skipped for an amax the caller already
// has), then its E4M3 copy and/or transpose: where every size is a multiple of 8 (the FP8 GEMMs' operands) each
// thread converts an 8 x 8 block and transposes it in registers; otherwise 32 x 32 tiles in shared memory,
// element by element.
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

// The vectorised case (rows, cols and ld multiples of 8, x 16-byte aligned): each thread quantizes one 8 x 8
// block of x, its eight rows loaded at once (eight 16-byte loads in flight), written to `out` as eight 8-byte rows
// and, transposed in registers (no shared memory, no barrier), to `out_t` as eight 8-byte rows. A warp covers
// 32 rows x 64 columns: its loads are 4 rows of 128 contiguous bytes, its `out_t` stores 8 rows of 32.
constexpr int kBlockRows = 8;        // a thread's block: 8 x 8 elements
constexpr int kWarpTileRows = 32;    // a warp's: 4 x 8 blocks
constexpr int kWarpTileCols = 64;
constexpr int kQuantThreads = 256;

// Byte i of the little-endian pair (lo, hi) of an 8-byte row.
__device__ __forceinline__ unsigned byte_of(unsigned lo, unsigned hi, int i) {
  return ((i < 4 ? lo : hi) >> (8 * (i & 3))) & 0xffu;
}

template <typename T>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_blocks_kernel(const T* __restrict__ x, int rows, int cols, int ld, const unsigned* __restrict__ amax_bits,
                           uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ inv_scale) {
  const float amax = __uint_as_float(*amax_bits);
  const float scale = scale_of(amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inv_scale = inv_scale_of(amax);
  const int lane = threadIdx.x & 31;
  const long long warp = static_cast<long long>(blockIdx.x) * (kQuantThreads / 32) + threadIdx.x / 32;
  const long long tiles_across = (cols + kWarpTileCols - 1) / kWarpTileCols;
  const int r0 = static_cast<int>(warp / tiles_across) * kWarpTileRows + (lane / 8) * kBlockRows;
  const int c0 = static_cast<int>(warp % tiles_across) * kWarpTileCols + (lane % 8) * kBlockRows;
  if (r0 >= rows || c0 >= cols) return;  // sizes are multiples of 8: a block is whole or outside
  Pack<T, kBlockRows> in[kBlockRows];
#pragma unroll
  for (int k = 0; k < kBlockRows; ++k) in[k] = load_pack<kBlockRows>(x + static_cast<size_t>(r0 + k) * ld + c0);
  unsigned lo[kBlockRows], hi[kBlockRows];  // row k's 8 bytes
#pragma unroll
  for (int k = 0; k < kBlockRows; ++k) {
    unsigned b[kBlockRows];
#pragma unroll
    for (int j = 0; j < kBlockRows; ++j)
      b[j] = __nv_cvt_float_to_fp8(to_float(in[k][j]) * scale, __NV_SATFINITE, __NV_E4M3);
    lo[k] = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24;
    hi[k] = b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24;
    if (out) *reinterpret_cast<uint2*>(out + static_cast<size_t>(r0 + k) * cols + c0) = make_uint2(lo[k], hi[k]);
  }
  if (!out_t) return;
  // Column j of the block (x's column c0 + j) is out_t's row c0 + j, elements r0 ... r0 + 7.
#pragma unroll
  for (int j = 0; j < kBlockRows; ++j) {
    unsigned t[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < kBlockRows; ++k) t[k / 4] |= byte_of(lo[k], hi[k], j) << (8 * (k & 3));
    *reinterpret_cast<uint2*>(out_t + static_cast<size_t>(c0 + j) * rows + r0) = make_uint2(t[0], t[1]);
  }
}

}  // namespace

void fp8_quantize(const void* x, int rows, int cols, int ld, DType dt, uint8_t* out, uint8_t* out_t, float* inv_scale,
                  unsigned* amax_bits, cudaStream_t stream, bool amax_known) {
  SHARDLM_CHECK(dt == DType::BF16 || dt == DType::F16, "fp8_quantize: the input must be bf16 or fp16, not ",
                dtype_name(dt));
  SHARDLM_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "fp8_quantize: bad shape ", rows, " x ", cols, " ld ", ld);
  if (!amax_known) clear_amax(amax_bits, stream);
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
      const long long warps = static_cast<long long>((rows + kWarpTileRows - 1) / kWarpTileRows) *
                              ((cols + kWarpTileCols - 1) / kWarpTileCols);
      const long long blocks = (warps + kQuantThreads / 32 - 1) / (kQuantThreads / 32);
      quantize_blocks_kernel<T><<<static_cast<unsigned>(blocks), kQuantThreads, 0, stream>>>(xt, rows, cols, ld,
                                                                                           amax_bits, out, out_t,
                                                                                           inv_scale);
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
