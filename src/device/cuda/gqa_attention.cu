// Causal softmax attention with grouped-query heads (and a sliding window: Mistral's) on the GPU (the
// Llama-style families'), forward and backward, as strided-batched cuBLASLt GEMMs around fp32 softmax
// row kernels.
//
// Query head n = g * G + j (G = heads / kv_heads query heads per kv head) reads kv head g. For a
// fixed j, the query heads g * G + j sit at a constant column stride G * d and their kv heads at a
// stride d, so every GEMM runs once per sequence and j, batched over the kv heads g. Only the
// softmax's per-row log-sum-exp is kept from forward to backward: the backward recomputes each
// sequence's scores with the forward's GEMMs and its probabilities p = exp(s - lse) with the
// forward's formula, so both passes see the same p. Scores, probabilities and their gradients live
// in the workspace for one sequence at a time; the key and value gradients of the G query heads of
// a group are summed in an fp32 workspace [T, 2 kv_heads d] (GEMMs with beta = 1), then rounded
// once into dqkv.
#include <cmath>

#include "dtype_cuda.cuh"
#include "gqa_attention.hpp"
#include "softmax_rows.cuh"

namespace shardlm::cuda {
namespace {

// Row i's p_ij = exp(s_ij - lse) for lo <= j <= i, 0 elsewhere, by the lanes of one warp: the one
// formula the forward and the backward's recomputation both use, so they see the same probabilities.
template <typename T>
__device__ __forceinline__ void write_causal_probs(const float* s, float lse, T* p, int lo, int i, int seq, int lane) {
  for (int j = lane; j < seq; j += 32) p[j] = from_float<T>(j >= lo && j <= i ? expf(s[j] - lse) : 0.0f);
}

// One warp per row (h, i) of one sequence: lse_i = log sum_j exp(scores_ij) over j <= i, then
// p_ij = exp(scores_ij - lse_i) for j <= i, 0 beyond. `scores` holds scale * q k^T as fp32
// [heads, T, T]; `probs` is that sequence's [heads, T, T] in dt, `lse` its [heads, T].
// (row_starts: a packed row's sample starts, [T], or null; the keys before them are masked too, and
// with a sliding window (> 0) those before i - window + 1.)
template <typename T>
__global__ void causal_softmax_kernel(const float* scores, T* probs, float* lse, const int32_t* row_starts, int heads,
                                      int seq, int window) {
  const int lane = threadIdx.x % 32;
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= static_cast<long long>(heads) * seq) return;
  const int i = static_cast<int>(row % seq), lo = first_key(row_starts, i, window);
  const float* s = scores + row * seq;
  T* p = probs + row * seq;
  float m, sum;
  causal_row_softmax_state(s, 0.0f, lo, i, lane, m, sum);
  // Lane 0's value for every lane: the p below are formed from exactly the lse that is saved.
  const float row_lse = __shfl_sync(0xffffffffu, m + logf(sum), 0);
  if (lane == 0) lse[row] = row_lse;
  write_causal_probs(s, row_lse, p, lo, i, seq, lane);
}

// One warp per row: the forward's probabilities again, from the recomputed scores and the saved lse.
template <typename T>
__global__ void causal_probs_from_lse_kernel(const float* scores, const float* lse, T* probs, const int32_t* row_starts,
                                             int heads, int seq, int window) {
  const int lane = threadIdx.x % 32;
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= static_cast<long long>(heads) * seq) return;
  const int i = static_cast<int>(row % seq);
  write_causal_probs(scores + row * seq, lse[row], probs + row * seq, first_key(row_starts, i, window), i, seq, lane);
}

// out[r, c] = (T) in[r, c] for a [rows, cols] fp32 block (row stride ld_in) into rows of stride ld_out.
template <typename T>
__global__ void store_rows_kernel(const float* in, int ld_in, T* out, int ld_out, int rows, int cols) {
  const long long items = static_cast<long long>(rows) * cols;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < items; e += stride) {
    const long long r = e / cols, c = e % cols;
    out[r * ld_out + c] = from_float<T>(in[r * ld_in + c]);
  }
}

void check_shape(const char* what, int B, int T, int heads, int kv_heads, int head_dim, const void* workspace) {
  SHARDLM_CHECK(B >= 0 && T >= 0 && heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 && head_dim >= 1, what,
                ": bad shape B=", B, " T=", T, " heads=", heads, " kv_heads=", kv_heads, " head_dim=", head_dim);
  SHARDLM_CHECK(B == 0 || T == 0 || workspace != nullptr, what, ": no workspace");
}

// Where the pieces of one sequence sit (byte pointers), the strides of the per-j GEMMs and the scores'
// scale, shared by forward and backward; made once the call's shape is checked.
struct Layout {
  int T, heads, kv_heads, d, G, qw, kvw, ld;
  size_t es;
  long long tt;
  float scale;  // scale_override where it is > 0 (Gemma's query_pre_attn_scalar^-1/2), else 1 / sqrt(d)
  Layout(const char* what, int B, int T_, int heads_, int kv_heads_, int d_, DType dt, const void* workspace,
         float scale_override) {
    check_shape(what, B, T_, heads_, kv_heads_, d_, workspace);  // before G divides by kv_heads
    T = T_;
    heads = heads_;
    kv_heads = kv_heads_;
    d = d_;
    G = heads / kv_heads;
    qw = heads * d;
    kvw = kv_heads * d;
    ld = qw + 2 * kvw;
    es = dtype_size(dt);
    tt = static_cast<long long>(T) * T;
    scale = scale_override > 0 ? scale_override : 1.0f / std::sqrt(static_cast<float>(d));
  }
  size_t qkv_bytes() const { return static_cast<size_t>(T) * ld * es; }  // one sequence of qkv
  size_t ctx_bytes() const { return static_cast<size_t>(T) * qw * es; }  // one sequence of ctx
  size_t lse_rows() const { return static_cast<size_t>(heads) * T; }     // one sequence of lse
  // Sequence b's q, k and v (its [Q | K | V] rows start at q).
  struct Qkv {
    const char *q, *k, *v;
  };
  Qkv sequence(const void* qkv, int b) const {
    const char* q = static_cast<const char*>(qkv) + b * qkv_bytes();
    const char* k = q + static_cast<size_t>(qw) * es;
    return {q, k, k + static_cast<size_t>(kvw) * es};
  }
};

// The workspace of one sequence (gqa_attention_workspace_bytes): fp32 scores [heads, T, T] (the
// backward's dP after them), the probabilities in dt [heads, T, T] (the backward's dS in place
// after them), the fp32 key|value gradient sums [T, 2 kv_heads d].
struct Workspace {
  float* scores;
  char* probs;
  float* dkv;
  Workspace(void* workspace, const Layout& l) {
    char* w = static_cast<char*>(workspace);
    const size_t scores_bytes = align256(static_cast<size_t>(l.heads) * l.tt * sizeof(float));
    const size_t probs_bytes = align256(static_cast<size_t>(l.heads) * l.tt * l.es);
    scores = reinterpret_cast<float*>(w);
    probs = w + scores_bytes;
    dkv = reinterpret_cast<float*>(w + scores_bytes + probs_bytes);
  }
};

// scores_n = scale * q_n k_g^T in fp32, for the query heads n = g G + j of every group g of one
// sequence. The forward and the backward's recomputation run exactly these GEMMs.
void scores_gemms(Gemm& gemm, const Layout& l, const Layout::Qkv& seq, float* scores, DType dt,
                  cudaStream_t stream) {
  const int d = l.d, G = l.G;
  const char *q = seq.q, *k = seq.k;
  for (int j = 0; j < G; ++j)
    gemm.run(batched_gemm(false, true, l.T, l.T, d, l.scale, q + static_cast<size_t>(j) * d * l.es, l.ld,
                          static_cast<long long>(G) * d, k, l.ld, d, 0.0f, scores + j * l.tt, l.T, G * l.tt, dt,
                          DType::F32, l.kv_heads),
             stream);
}

}  // namespace

void gqa_attention_forward(Gemm& gemm, const void* qkv, void* ctx, float* lse, int B, int T, int heads, int kv_heads,
                           int head_dim, DType dt, void* workspace, cudaStream_t stream, const int32_t* starts,
                           int window, float scale_override) {
  const Layout l("gqa_attention_forward", B, T, heads, kv_heads, head_dim, dt, workspace, scale_override);
  if (B == 0 || T == 0) return;
  const Workspace ws(workspace, l);
  const int d = head_dim, G = l.G;
  const size_t es = l.es;
  for (int b = 0; b < B; ++b) {
    const Layout::Qkv seq = l.sequence(qkv, b);
    char* ctx_b = static_cast<char*>(ctx) + b * l.ctx_bytes();
    scores_gemms(gemm, l, seq, ws.scores, dt, stream);
    dispatch_dtype(dt, [&](auto tag) {
      using E = typename decltype(tag)::type;
      causal_softmax_kernel<E><<<row_blocks(heads, T), kWarpsPerBlock * 32, 0, stream>>>(
          ws.scores, reinterpret_cast<E*>(ws.probs), lse + b * l.lse_rows(),
          starts ? starts + static_cast<size_t>(b) * T : nullptr, heads, T, window);
    });
    SHARDLM_CUDA_LAUNCH_CHECK();
    // ctx_n = P_n v_g, written into query head n's columns of ctx.
    for (int j = 0; j < G; ++j)
      gemm.run(batched_gemm(false, false, T, d, T, 1.0f, ws.probs + static_cast<size_t>(j) * l.tt * es, T, G * l.tt,
                            seq.v, l.ld, d, 0.0f, ctx_b + static_cast<size_t>(j) * d * es, l.qw,
                            static_cast<long long>(G) * d, dt, dt, kv_heads),
               stream);
  }
}

void gqa_attention_backward(Gemm& gemm, const void* dctx, const void* qkv, const float* lse, void* dqkv, int B, int T,
                            int heads, int kv_heads, int head_dim, DType dt, void* workspace, cudaStream_t stream,
                            const int32_t* starts, int window, float scale_override) {
  const Layout l("gqa_attention_backward", B, T, heads, kv_heads, head_dim, dt, workspace, scale_override);
  if (B == 0 || T == 0) return;
  const Workspace ws(workspace, l);
  const int d = head_dim, G = l.G;
  const size_t es = l.es;
  float* dprobs = ws.scores;  // the recomputed scores are spent once P is formed
  float* dkv = ws.dkv;
  const int ld_dkv = 2 * l.kvw;
  for (int b = 0; b < B; ++b) {
    const Layout::Qkv seq = l.sequence(qkv, b);
    const char *q = seq.q, *k = seq.k, *v = seq.v;
    char* dq = static_cast<char*>(dqkv) + b * l.qkv_bytes();
    const char* dctx_b = static_cast<const char*>(dctx) + b * l.ctx_bytes();
    // P again: the forward's scores, then p = exp(s - lse) with the saved lse.
    scores_gemms(gemm, l, seq, ws.scores, dt, stream);
    dispatch_dtype(dt, [&](auto tag) {
      using E = typename decltype(tag)::type;
      causal_probs_from_lse_kernel<E><<<row_blocks(heads, T), kWarpsPerBlock * 32, 0, stream>>>(
          ws.scores, lse + b * l.lse_rows(), reinterpret_cast<E*>(ws.probs),
          starts ? starts + static_cast<size_t>(b) * T : nullptr, heads, T, window);
    });
    SHARDLM_CUDA_LAUNCH_CHECK();
    for (int j = 0; j < G; ++j) {
      const float beta = j == 0 ? 0.0f : 1.0f;  // the group's first query head writes, the others add
      // dP_n = dctx_n v_g^T (fp32); dv_g += P_n^T dctx_n (fp32).
      gemm.run(batched_gemm(false, true, T, T, d, 1.0f, dctx_b + static_cast<size_t>(j) * d * es, l.qw,
                            static_cast<long long>(G) * d, v, l.ld, d, 0.0f, dprobs + j * l.tt, T, G * l.tt, dt,
                            DType::F32, kv_heads),
               stream);
      gemm.run(batched_gemm(true, false, T, d, T, 1.0f, ws.probs + static_cast<size_t>(j) * l.tt * es, T, G * l.tt,
                            dctx_b + static_cast<size_t>(j) * d * es, l.qw, static_cast<long long>(G) * d, beta,
                            dkv + l.kvw, ld_dkv, d, dt, DType::F32, kv_heads),
               stream);
    }
    // dS over P, in place.
    dispatch_dtype(dt, [&](auto tag) {
      using E = typename decltype(tag)::type;
      causal_softmax_backward_kernel<E><<<row_blocks(heads, T), kWarpsPerBlock * 32, 0, stream>>>(
          dprobs, reinterpret_cast<const E*>(ws.probs), reinterpret_cast<E*>(ws.probs), heads, T);
    });
    SHARDLM_CUDA_LAUNCH_CHECK();
    const char* ds = ws.probs;
    for (int j = 0; j < G; ++j) {
      const float beta = j == 0 ? 0.0f : 1.0f;
      // S = scale q k^T: dq_n = scale dS_n k_g (each query head once), dk_g += scale dS_n^T q_n (fp32).
      gemm.run(batched_gemm(false, false, T, d, T, l.scale, ds + static_cast<size_t>(j) * l.tt * es, T, G * l.tt, k,
                            l.ld, d, 0.0f, dq + static_cast<size_t>(j) * d * es, l.ld, static_cast<long long>(G) * d,
                            dt, dt, kv_heads),
               stream);
      gemm.run(batched_gemm(true, false, T, d, T, l.scale, ds + static_cast<size_t>(j) * l.tt * es, T, G * l.tt,
                            q + static_cast<size_t>(j) * d * es, l.ld, static_cast<long long>(G) * d, beta, dkv,
                            ld_dkv, d, dt, DType::F32, kv_heads),
               stream);
    }
    // The summed key|value gradients into their columns of dqkv, rounded once.
    const size_t items = static_cast<size_t>(T) * ld_dkv;
    dispatch_dtype(dt, [&](auto tag) {
      using E = typename decltype(tag)::type;
      store_rows_kernel<E><<<grid_for(items), kBlockThreads, 0, stream>>>(
          dkv, ld_dkv, reinterpret_cast<E*>(dq + static_cast<size_t>(l.qw) * es), l.ld, T, ld_dkv);
    });
    SHARDLM_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace shardlm::cuda
