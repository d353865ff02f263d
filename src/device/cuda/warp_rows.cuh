// The shape of the one-warp-per-row kernels (LayerNorm, RMSNorm, the embedding): kRowWarps rows in
// flight per block, a grid-stride loop over rows, and the host checks and grid of their launchers.
#pragma once

#include <algorithm>

#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kRowWarps = 8;  // rows in flight per block, one per warp
constexpr int kRowThreads = 32 * kRowWarps;

// Calls f(row) for each row of [0, n) this thread's warp handles.
template <typename F>
__device__ __forceinline__ void for_warp_rows(int n, F&& f) {
  const long long row_stride = static_cast<long long>(gridDim.x) * kRowWarps;
  for (long long row = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32; row < n;
       row += row_stride)
    f(row);
}

// out = dx (accumulating into it) or zeros: the start of a row's dx pack.
template <int N, typename T>
__device__ __forceinline__ void load_or_zero(bool accumulate, const T* p, float (&out)[N]) {
  if (accumulate) {
    load_floats<N>(p, out);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = 0.0f;
  }
}

// Blocks for n rows: one warp per row, at most blocks_per_sm per SM (the warps then loop).
inline unsigned warp_row_blocks(int n, long long blocks_per_sm = 8) {
  const long long wanted = (static_cast<long long>(n) + kRowWarps - 1) / kRowWarps;
  return static_cast<unsigned>(std::max(1LL, std::min(wanted, blocks_per_sm * sm_count())));
}

// The launchers' shape check: false when there are no rows (nothing to launch).
inline bool check_rows(const char* op, int n, int H) {
  SHARDLM_CHECK(n >= 0, op, ": negative row count ", n);
  if (n == 0) return false;
  SHARDLM_CHECK(H > 0, op, ": bad shape ", n, " x ", H);
  return true;
}

}  // namespace
}  // namespace shardlm::cuda
