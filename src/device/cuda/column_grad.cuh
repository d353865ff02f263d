// The column-sum kernel behind the bias gradient and the norms' weight gradients: out[c] += sum_r of
// a per-element term of row r, column c. Block (32, kColumnRowLanes): lane x owns N consecutive
// columns of the block's 32 N-column tile, threadIdx.y and blockIdx.y split the rows; the block sums
// its rows in shared memory and adds one fp32 atomic per column (per-element atomics from
// row-parallel warps would serialise on the same columns).
#pragma once

#include <algorithm>

#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kColumnRowLanes = 8;

// What is summed down the columns: dy (bias), dy * xhat of RMSNorm (weight), dy * xhat and dy of
// LayerNorm (gamma into out0, beta into out1).
enum class ColumnGrad { kBias, kRmsNormWeight, kLayerNormParams };

template <ColumnGrad kGrad, typename T, int N>
__global__ void column_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, float* __restrict__ out0,
                                   float* __restrict__ out1, int rows, int cols, int rows_per_block) {
  constexpr int kSums = kGrad == ColumnGrad::kLayerNormParams ? 2 : 1;
  __shared__ float partial[kSums][kColumnRowLanes][32 * N];
  const int tile = blockIdx.x * 32 * N;
  const int c0 = tile + threadIdx.x * N;
  const int r_begin = blockIdx.y * rows_per_block;
  const int r_end = min(rows, r_begin + rows_per_block);
  float acc[kSums][N];
#pragma unroll
  for (int s = 0; s < kSums; ++s)
#pragma unroll
    for (int k = 0; k < N; ++k) acc[s][k] = 0.0f;
  if (c0 < cols) {  // N > 1 only when cols % N == 0, so a pack never straddles the last column
#pragma unroll 4
    for (int r = r_begin + threadIdx.y; r < r_end; r += kColumnRowLanes) {  // unrolled: loads in flight
      float d[N];
      load_floats<N>(dy + static_cast<size_t>(r) * cols + c0, d);
      if constexpr (kGrad == ColumnGrad::kBias) {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[0][k] += d[k];
      } else {
        float xv[N];
        load_floats<N>(x + static_cast<size_t>(r) * cols + c0, xv);
        const float rs = rstd[r];
        if constexpr (kGrad == ColumnGrad::kRmsNormWeight) {
#pragma unroll
          for (int k = 0; k < N; ++k) acc[0][k] += d[k] * (xv[k] * rs);
        } else {
          const float mu = mean[r];
#pragma unroll
          for (int k = 0; k < N; ++k) {
            acc[0][k] += d[k] * ((xv[k] - mu) * rs);
            acc[kSums - 1][k] += d[k];
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int s = 0; s < kSums; ++s) partial[s][threadIdx.y][threadIdx.x * N + k] = acc[s][k];
  __syncthreads();
  for (int j = threadIdx.y * 32 + threadIdx.x; j < 32 * N; j += 32 * kColumnRowLanes) {
    const int c = tile + j;
    if (c >= cols) break;
    float sum[kSums];
#pragma unroll
    for (int s = 0; s < kSums; ++s) sum[s] = 0.0f;
#pragma unroll
    for (int y = 0; y < kColumnRowLanes; ++y)
#pragma unroll
      for (int s = 0; s < kSums; ++s) sum[s] += partial[s][y][j];
    atomicAdd(out0 + c, sum[0]);
    if constexpr (kSums == 2) atomicAdd(out1 + c, sum[kSums - 1]);
  }
}

// Launches column_grad_kernel over a [rows, cols] gradient; x, mean, rstd and out1 as kGrad needs them
// (nullptr otherwise).
template <ColumnGrad kGrad, typename T, int N>
void launch_column_grad(const T* dy, const T* x, const float* mean, const float* rstd, float* out0, float* out1,
                        int rows, int cols, cudaStream_t stream) {
  const int tiles = (cols + 32 * N - 1) / (32 * N);
  // Enough row slices for about eight blocks per SM; at least kColumnRowLanes rows per slice.
  const int max_slices = std::max(1, (rows + kColumnRowLanes - 1) / kColumnRowLanes);
  int slices = std::min(max_slices, std::max(1, (8 * sm_count() + tiles - 1) / tiles));
  const int rows_per_block = (rows + slices - 1) / slices;
  slices = (rows + rows_per_block - 1) / rows_per_block;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slices));
  column_grad_kernel<kGrad, T, N><<<grid, dim3(32, kColumnRowLanes), 0, stream>>>(dy, x, mean, rstd, out0, out1,
                                                                                 rows, cols, rows_per_block);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace shardlm::cuda
