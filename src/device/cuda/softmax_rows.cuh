// Row kernels shared by BLOOM's and Llama's attention: one warp per row (h, i) of a sequence's
// [heads, T, T] scores, kWarpsPerBlock rows per block.
#pragma once

#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Blocks that cover the heads * seq rows of one sequence.
inline unsigned row_blocks(int heads, int seq) {
  const long long rows = static_cast<long long>(heads) * seq;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// The softmax state (max m, sum of exp(x_j - m)) of x_j = s_j + slope * j over lo <= j <= i,
// accumulated by the lanes of one warp and merged so that every lane holds the row's (BLOOM's ALiBi
// passes its head's slope, Llama 0; lo > 0 where a packed row's sample starts after position 0).
__device__ __forceinline__ void causal_row_softmax_state(const float* s, float slope, int lo, int i, int lane, float& m,
                                                         float& sum) {
  m = -INFINITY, sum = 0.0f;
  for (int j = lo + lane; j <= i; j += 32) add_to_softmax_state(s[j] + slope * static_cast<float>(j), m, sum);
  warp_merge_softmax_state(m, sum);
}

// The first key row i of a sequence attends to: where its sample starts in a packed row (row_starts:
// that sequence's [T] starts), else 0; with a sliding window (> 0) none before i - window + 1 either.
__device__ __forceinline__ int first_key(const int32_t* row_starts, int i, int window = 0) {
  const int start = row_starts ? row_starts[i] : 0;
  return window > 0 ? max(start, i - window + 1) : start;
}

// dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') for j <= i, 0 beyond (the 1/sqrt(d) goes into the
// GEMMs that follow; the keys of a packed row's earlier samples have P = 0, so their dS is 0 too). dS may alias P, or dP when T is float: the dot product is complete (a warp
// reduction) before any lane writes, and each element is then read and written by one lane.
template <typename T>
__global__ void causal_softmax_backward_kernel(const float* dprobs, const T* probs, T* dscores, int heads, int seq) {
  const int lane = threadIdx.x % 32;
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= static_cast<long long>(heads) * seq) return;
  const int i = static_cast<int>(row % seq);
  const float* dp = dprobs + row * seq;
  const T* p = probs + row * seq;
  T* ds = dscores + row * seq;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += 32) dot += to_float(p[j]) * dp[j];
  dot = warp_sum(dot);
  for (int j = lane; j < seq; j += 32) ds[j] = from_float<T>(j <= i ? to_float(p[j]) * (dp[j] - dot) : 0.0f);
}

}  // namespace
}  // namespace shardlm::cuda
