// The decoding head's kernels: gathering the rows whose logits are wanted, the head's GEMM, and the
// argmax of each fp32 logits row (one block per row; the lowest id wins ties, as std::max_element does).
#include <algorithm>
#include <climits>

#include "decode_head.hpp"
#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kArgmaxThreads = 256;

template <typename T>
__global__ void gather_rows_kernel(const T* __restrict__ src, const int32_t* __restrict__ rows, int m, int H,
                                   T* __restrict__ dst) {
  const long long total = static_cast<long long>(m) * H;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long i = e / H;
    dst[e] = src[static_cast<long long>(rows[i]) * H + e % H];
  }
}

// (value, id) beats (best, best_id) when larger, or equal with a lower id. NaN never wins.
__device__ __forceinline__ void take_better(float& best, int& best_id, float value, int id) {
  if (value > best || (value == best && id < best_id)) {
    best = value;
    best_id = id;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* __restrict__ x, int cols, int32_t* __restrict__ out) {
  __shared__ float shared_best[kArgmaxThreads / 32];
  __shared__ int shared_id[kArgmaxThreads / 32];
  const float* row = x + static_cast<size_t>(blockIdx.x) * cols;
  float best = -INFINITY;
  int best_id = INT_MAX;
  for (int j = threadIdx.x; j < cols; j += kArgmaxThreads) take_better(best, best_id, row[j], j);
  for (int offset = 16; offset > 0; offset >>= 1)
    take_better(best, best_id, __shfl_xor_sync(0xffffffffu, best, offset),
                __shfl_xor_sync(0xffffffffu, best_id, offset));
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) shared_best[warp] = best, shared_id[warp] = best_id;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgmaxThreads / 32; ++w) take_better(best, best_id, shared_best[w], shared_id[w]);
  out[blockIdx.x] = best_id == INT_MAX ? 0 : best_id;  // a row of NaN only: id 0
}

}  // namespace

void gather_rows(const void* src, const int32_t* rows, int m, int H, void* dst, DType dt, cudaStream_t stream) {
  SHARDLM_CHECK(m >= 0 && H >= 1, "gather_rows: bad shape m=", m, " H=", H);
  if (m == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_rows_kernel<T><<<grid_for(static_cast<size_t>(m) * H), kBlockThreads, 0, stream>>>(
        static_cast<const T*>(src), rows, m, H, static_cast<T*>(dst));
    SHARDLM_CUDA_LAUNCH_CHECK();
  });
}

void argmax_rows(const float* x, int rows, int cols, int32_t* out, cudaStream_t stream) {
  SHARDLM_CHECK(rows >= 0 && cols >= 1, "argmax_rows: bad shape rows=", rows, " cols=", cols);
  if (rows == 0) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(x, cols, out);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void decode_head_rows(Gemm& gemm, const void* x, int m, int H, const void* table, int V, int chunk, float* workspace,
                      int32_t* next, float* logits_out, DType dt, cudaStream_t stream) {
  // The caller's buffer holds every row: one GEMM.
  if (logits_out) chunk = std::max(m, 1);
  SHARDLM_CHECK(chunk >= 1, "decode_head_rows: no logits workspace (chunk ", chunk, ")");
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(dt);
  for (int r0 = 0; r0 < m; r0 += chunk) {
    const int count = std::min(chunk, m - r0);
    float* logits = logits_out ? logits_out : workspace;
    GemmDesc g;  // logits[count, V] = x table^T, fp32
    g.trans_b = true;
    g.M = count, g.N = V, g.K = H;
    g.A = static_cast<const char*>(x) + r0 * row_bytes, g.lda = H;
    g.B = table, g.ldb = H;
    g.C = logits, g.ldc = V;
    g.ab_dtype = dt, g.c_dtype = DType::F32;
    gemm.run(g, stream);
    if (next) argmax_rows(logits, count, V, next + r0, stream);
  }
}

}  // namespace shardlm::cuda
