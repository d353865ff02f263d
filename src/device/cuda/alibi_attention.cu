// Causal ALiBi softmax attention over a head-interleaved fused QKV (BLOOM's) on the GPU,
// forward and backward, as strided-batched cuBLASLt GEMMs (one call per sequence, batched over heads)
// around two row kernels (softmax, softmax backward) that work in fp32.
//
// q, k and v of head h are strided views into qkv: row stride 3H, q at column h*3d, k at +d, v at +2d.
// A batch stride of 3d walks the heads of one sequence, but no single stride also walks the sequences,
// so each GEMM runs once per sequence. Scores and their gradient live in fp32 in the workspace for one
// sequence at a time: [heads, T, T] fp32, plus [heads, T, T] in dt for dS when dt is 16-bit (the GEMMs
// that consume dS need it in the dtype of q and k).
#include <cmath>

#include "alibi_attention.hpp"
#include "cuda_check.hpp"
#include "dtype_cuda.cuh"
#include "softmax_rows.cuh"

namespace shardlm::cuda {
namespace {

// One warp per row (h, i) of one sequence: p_j = softmax_j(scores_ij + slope_h * j) over lo <= j <= i
// (lo: where the row's sample starts in a packed row, else 0), 0 elsewhere. `scores` holds
// scale * q k^T as fp32 [heads, T, T]; `probs` is that sequence's [heads, T, T] in dt.
template <typename T>
__global__ void softmax_forward_kernel(const float* scores, T* probs, const float* slopes, const int32_t* row_starts,
                                       int heads, int seq) {
  const int lane = threadIdx.x % 32;
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= static_cast<long long>(heads) * seq) return;
  const int h = static_cast<int>(row / seq), i = static_cast<int>(row % seq);
  const int lo = first_key(row_starts, i);
  const float slope = slopes[h];
  const float* s = scores + row * seq;
  T* p = probs + row * seq;
  float m, sum;
  causal_row_softmax_state(s, slope, lo, i, lane, m, sum);
  const float inv_sum = 1.0f / sum;
  for (int j = lane; j < seq; j += 32)
    p[j] = from_float<T>(j >= lo && j <= i ? expf(s[j] + slope * static_cast<float>(j) - m) * inv_sum : 0.0f);
}

template <typename T>
void launch_softmax_forward(const float* scores, void* probs, const float* slopes, const int32_t* row_starts,
                            int heads, int seq, cudaStream_t stream) {
  softmax_forward_kernel<T><<<row_blocks(heads, seq), kWarpsPerBlock * 32, 0, stream>>>(
      scores, static_cast<T*>(probs), slopes, row_starts, heads, seq);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void launch_softmax_backward(const float* dprobs, const void* probs, void* dscores, int heads, int seq,
                             cudaStream_t stream) {
  causal_softmax_backward_kernel<T><<<row_blocks(heads, seq), kWarpsPerBlock * 32, 0, stream>>>(
      dprobs, static_cast<const T*>(probs), static_cast<T*>(dscores), heads, seq);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

// A GEMM batched over the heads of one sequence.
GemmDesc head_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
                   long long stride_a, const void* B, int ldb, long long stride_b, void* C, int ldc, long long stride_c,
                   DType ab, DType c, int heads) {
  return batched_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, 0.0f, C, ldc, stride_c, ab,
                      c, heads);
}

void check_shape(const char* what, int B, int T, int heads, int head_dim, const void* workspace) {
  SHARDLM_CHECK(B >= 0 && T >= 0 && heads >= 1 && head_dim >= 1, what, ": bad shape B=", B, " T=", T,
                " heads=", heads, " head_dim=", head_dim);
  SHARDLM_CHECK(B == 0 || T == 0 || workspace != nullptr, what, ": no workspace");
}

// One sequence's widths, sizes and the scores' scale, shared by forward and backward; made once the
// call's shape is checked.
struct Layout {
  int d, H, ld;  // head_dim, the model width, qkv's row stride 3H
  size_t es;
  long long tt;  // T * T: one head's scores
  float scale;   // 1 / sqrt(d)
  size_t qkv_bytes, ctx_bytes, probs_bytes;  // one sequence of each
  Layout(const char* what, int B, int T, int heads, int head_dim, DType dt, const void* workspace) {
    check_shape(what, B, T, heads, head_dim, workspace);
    d = head_dim;
    H = heads * d;
    ld = 3 * H;
    es = dtype_size(dt);
    tt = static_cast<long long>(T) * T;
    scale = 1.0f / std::sqrt(static_cast<float>(d));
    qkv_bytes = static_cast<size_t>(T) * ld * es;
    ctx_bytes = static_cast<size_t>(T) * H * es;
    probs_bytes = static_cast<size_t>(heads) * tt * es;
  }
};

}  // namespace

void alibi_attention_forward(Gemm& gemm, const void* qkv, void* ctx, void* probs, const float* slopes, int B, int T,
                             int heads, int head_dim, DType dt, void* workspace, cudaStream_t stream,
                             const int32_t* starts) {
  const Layout l("alibi_attention_forward", B, T, heads, head_dim, dt, workspace);
  if (B == 0 || T == 0) return;
  const int d = l.d, H = l.H, ld = l.ld;
  const size_t es = l.es;
  float* scores = static_cast<float*>(workspace);
  for (int b = 0; b < B; ++b) {
    const char* qkv_b = static_cast<const char*>(qkv) + b * l.qkv_bytes;
    char* probs_b = static_cast<char*>(probs) + b * l.probs_bytes;
    char* ctx_b = static_cast<char*>(ctx) + b * l.ctx_bytes;
    // scores_h = scale * q_h k_h^T in fp32.
    gemm.run(head_gemm(false, true, T, T, d, l.scale, qkv_b, ld, 3 * d, qkv_b + d * es, ld, 3 * d, scores, T, l.tt, dt,
                       DType::F32, heads),
             stream);
    dispatch_dtype(dt, [&](auto tag) {
      launch_softmax_forward<typename decltype(tag)::type>(scores, probs_b, slopes,
                                                           starts ? starts + static_cast<size_t>(b) * T : nullptr,
                                                           heads, T, stream);
    });
    // ctx_h = P_h v_h, written into the head's columns of ctx.
    gemm.run(head_gemm(false, false, T, d, T, 1.0f, probs_b, T, l.tt, qkv_b + 2 * d * es, ld, 3 * d, ctx_b, H, d, dt,
                       dt, heads),
             stream);
  }
}

void alibi_attention_backward(Gemm& gemm, const void* dctx, const void* qkv, const void* probs, void* dqkv,
                              const float* slopes, int B, int T, int heads, int head_dim, DType dt, void* workspace,
                              cudaStream_t stream) {
  const Layout l("alibi_attention_backward", B, T, heads, head_dim, dt, workspace);
  if (B == 0 || T == 0) return;
  const int d = l.d, H = l.H, ld = l.ld;
  const size_t es = l.es;
  float* dprobs = static_cast<float*>(workspace);
  // dS in dt: in place over dP for fp32, else in its own region after dP.
  void* dscores = dt == DType::F32 ? workspace
                                   : static_cast<char*>(workspace) + align256(static_cast<size_t>(heads) * l.tt * 4);
  for (int b = 0; b < B; ++b) {
    const char* qkv_b = static_cast<const char*>(qkv) + b * l.qkv_bytes;
    const char* q = qkv_b;
    const char* k = qkv_b + d * es;
    const char* v = qkv_b + 2 * d * es;
    char* dqkv_b = static_cast<char*>(dqkv) + b * l.qkv_bytes;
    const char* probs_b = static_cast<const char*>(probs) + b * l.probs_bytes;
    const char* dctx_b = static_cast<const char*>(dctx) + b * l.ctx_bytes;
    // dP_h = dctx_h v_h^T (fp32); dv_h = P_h^T dctx_h.
    gemm.run(head_gemm(false, true, T, T, d, 1.0f, dctx_b, H, d, v, ld, 3 * d, dprobs, T, l.tt, dt, DType::F32, heads),
             stream);
    gemm.run(head_gemm(true, false, T, d, T, 1.0f, probs_b, T, l.tt, dctx_b, H, d, dqkv_b + 2 * d * es, ld, 3 * d, dt,
                       dt, heads),
             stream);
    dispatch_dtype(dt, [&](auto tag) {
      launch_softmax_backward<typename decltype(tag)::type>(dprobs, probs_b, dscores, heads, T, stream);
    });
    // S = scale q k^T: dq_h = scale dS_h k_h, dk_h = scale dS_h^T q_h.
    gemm.run(
        head_gemm(false, false, T, d, T, l.scale, dscores, T, l.tt, k, ld, 3 * d, dqkv_b, ld, 3 * d, dt, dt, heads),
        stream);
    gemm.run(head_gemm(true, false, T, d, T, l.scale, dscores, T, l.tt, q, ld, 3 * d, dqkv_b + d * es, ld, 3 * d, dt,
                       dt, heads),
             stream);
  }
}

}  // namespace shardlm::cuda
