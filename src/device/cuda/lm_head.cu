// The tied LM head and cross-entropy on the GPU, chunked over rows so that at most `chunk` rows of
// logits exist at once (V is up to 250,880): per chunk, logits = h table^T in fp32, the row kernel of
// cross_entropy_rows.cu for the loss and, for backward, dlogits = grad_scale (softmax - onehot) in dt over the same bytes, then
// dh = dlogits table and dtable += dlogits^T h (unless the table is frozen).
//
// Workspace: fp32 logits [chunk, V], then per-row losses (fp32) and target flags (int) for [chunk] rows.
// dlogits in a 16-bit dt are written in place over their own fp32 row (row stride 2V in dt elements), so
// the backward needs no second [chunk, V] buffer. Losses are summed per chunk in a fixed order (no atomics),
// so the loss is the same from run to run.
#include <algorithm>
#include <cmath>

#include "cross_entropy_rows.hpp"
#include "cuda_check.hpp"
#include "dtype_cuda.cuh"
#include "lm_head.hpp"

namespace shardlm::cuda {
namespace {

constexpr int kSumThreads = 256;

// loss_sum += sum of the chunk's row losses, count += rows with a target; one block, fixed order.
__global__ void __launch_bounds__(kSumThreads)
    sum_chunk_loss_kernel(const float* row_loss, const int* row_has_target, int rows, float* loss_sum,
                          long long* count) {
  __shared__ float shared_loss[kSumThreads];
  __shared__ int shared_count[kSumThreads];
  const int tid = threadIdx.x;
  float loss = 0.0f;
  int counted = 0;
  for (int r = tid; r < rows; r += kSumThreads) {
    loss += row_loss[r];
    counted += row_has_target[r];
  }
  shared_loss[tid] = loss;
  shared_count[tid] = counted;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half >>= 1) {
    if (tid < half) {
      shared_loss[tid] += shared_loss[tid + half];
      shared_count[tid] += shared_count[tid + half];
    }
    __syncthreads();
  }
  if (tid == 0) {
    *loss_sum += shared_loss[0];
    *count += shared_count[0];
  }
}

}  // namespace

void lm_head_loss(Gemm& gemm, const void* h, const void* table, const int32_t* targets, int n, int H, int V, int chunk,
                  float grad_scale, float* loss_sum, long long* count, void* dh, float* dtable, DType dt,
                  void* workspace, cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0 && H >= 1 && V >= 1 && chunk >= 1, "lm_head_loss: bad shape n=", n, " H=", H, " V=", V,
                " chunk=", chunk);
  SHARDLM_CHECK(n == 0 || (workspace != nullptr && loss_sum != nullptr && count != nullptr),
                "lm_head_loss: missing workspace, loss_sum or count");
  const bool backward = dh != nullptr;
  const size_t es = dtype_size(dt);
  float* logits = static_cast<float*>(workspace);
  const size_t logits_bytes = align256(static_cast<size_t>(chunk) * V * sizeof(float));
  float* row_loss = reinterpret_cast<float*>(static_cast<char*>(workspace) + logits_bytes);
  int* row_has_target = reinterpret_cast<int*>(static_cast<char*>(workspace) + logits_bytes +
                                               align256(static_cast<size_t>(chunk) * sizeof(float)));
  // dlogits row r starts where fp32 logits row r does: the row stride in dt elements.
  const int dlogits_ld = static_cast<int>(static_cast<size_t>(V) * sizeof(float) / es);

  for (int r0 = 0; r0 < n; r0 += chunk) {
    const int rows = std::min(chunk, n - r0);
    const char* h_chunk = static_cast<const char*>(h) + static_cast<size_t>(r0) * H * es;

    GemmDesc logits_gemm;  // logits[rows, V] = h_chunk table^T, fp32
    logits_gemm.trans_b = true;
    logits_gemm.M = rows, logits_gemm.N = V, logits_gemm.K = H;
    logits_gemm.A = h_chunk, logits_gemm.lda = H;
    logits_gemm.B = table, logits_gemm.ldb = H;
    logits_gemm.C = logits, logits_gemm.ldc = V;
    logits_gemm.ab_dtype = dt, logits_gemm.c_dtype = DType::F32;
    gemm.run(logits_gemm, stream);

    cross_entropy_rows(logits, rows, V, targets + r0, grad_scale, backward, row_loss, row_has_target, dt, stream);
    sum_chunk_loss_kernel<<<1, kSumThreads, 0, stream>>>(row_loss, row_has_target, rows, loss_sum, count);
    SHARDLM_CUDA_LAUNCH_CHECK();
    if (!backward) continue;

    GemmDesc dh_gemm;  // dh_chunk[rows, H] = dlogits table, in dt
    dh_gemm.M = rows, dh_gemm.N = H, dh_gemm.K = V;
    dh_gemm.A = logits, dh_gemm.lda = dlogits_ld;
    dh_gemm.B = table, dh_gemm.ldb = H;
    dh_gemm.C = static_cast<char*>(dh) + static_cast<size_t>(r0) * H * es, dh_gemm.ldc = H;
    dh_gemm.ab_dtype = dt, dh_gemm.c_dtype = dt;
    gemm.run(dh_gemm, stream);
    if (!dtable) continue;  // a frozen table: no weight gradient at all

    GemmDesc dtable_gemm;  // dtable[V, H] += dlogits^T h_chunk, fp32
    dtable_gemm.trans_a = true;
    dtable_gemm.M = V, dtable_gemm.N = H, dtable_gemm.K = rows;
    dtable_gemm.beta = 1.0f;
    dtable_gemm.A = logits, dtable_gemm.lda = dlogits_ld;
    dtable_gemm.B = h_chunk, dtable_gemm.ldb = H;
    dtable_gemm.C = dtable, dtable_gemm.ldc = H;
    dtable_gemm.ab_dtype = dt, dtable_gemm.c_dtype = DType::F32;
    gemm.run(dtable_gemm, stream);
  }
}

}  // namespace shardlm::cuda
