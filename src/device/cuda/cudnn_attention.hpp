// Causal attention through cuDNN's fused flash attention (the cuDNN 9 graph API), forward and
// backward, reading q, k and v where the model's projection left them and writing the context and
// the gradients in the same layouts as the native kernels (alibi_attention.cu, gqa_attention.cu).
//
// The graph per shape is the one cuDNN's fused SDPA engines recognise: Q K^T, a scale, BLOOM's
// ALiBi bias (slope_h * (j - i); after the softmax the same as BLOOM's slope_h * j), the causal
// mask, Mistral's sliding window (the diagonal band j + window > i), a softmax that saves each row's log-sum-exp (fp32, [B, heads, T]: memory per layer O(T)),
// and P V; the backward recomputes the probabilities from that log-sum-exp. Grouped-query and
// multi-query heads are read in place (no K/V expansion). Plans are built once per shape (call
// prepare() at start-up, outside any timed loop) and cached; the calls then only execute them.
//
// Built only when cuDNN is found (SHARDLM_HAVE_CUDNN); the native kernels serve everything else.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// Where the heads of one attention layer's q, k, v, context and their gradients sit. All buffers
// are token-major: token t of sequence b starts at row (b T + t).
struct AttentionLayout {
  int B = 0, T = 0, heads = 0, kv_heads = 0, head_dim = 0;
  DType dt = DType::BF16;
  bool alibi = false;             // add slope_h * (j - i) to the scores (slopes: fp32 device [heads])
  bool bias = false;              // add a [B, 1, T, T] tensor in dt to the scores (packed rows' mask)
  // Sliding window (> 0): keys j > i - window only; 0: none. Not with a bias (packed_attention_bias
  // folds the window into it).
  int window = 0;
  float scale = 0;  // the scores' scale (a runtime input, not in key()); 0: 1 / sqrt(head_dim)
  long long row = 0;              // elements from one token's q/k/v row to the next (qkv and dqkv)
  long long head = 0;             // elements from one head to the next inside q, k or v
  long long q = 0, k = 0, v = 0;  // offset of head 0 of q, k and v inside a row
  long long out_row = 0;          // elements from one token's context row to the next (ctx and dctx)

  // Grouped-query heads (the Llama-style families): each row is q heads, then k heads, then v heads (q_proj,
  // k_proj, v_proj side by side).
  static AttentionLayout grouped(int B, int T, int heads, int kv_heads, int head_dim, DType dt);
  // Head-interleaved with ALiBi (BLOOM): each head's q, k, v side by side ([T, heads, 3, d]).
  static AttentionLayout interleaved_alibi(int B, int T, int heads, int head_dim, DType dt);

  auto key() const {
    return std::make_tuple(B, T, heads, kv_heads, head_dim, static_cast<int>(dt), alibi, bias, window, row, head, q, k,
                           v, out_row);
  }
};

class CudnnAttention {
 public:
  // Starts a cuDNN handle on the current device. Throws Error when cuDNN cannot serve this process
  // (library missing or too old, GPU below compute capability 8.0); the message says which.
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN's fused attention can run here at all, and if not why ("" when it can).
  static std::string unavailable_reason();
  // "9.19.0": the cuDNN library loaded at run time.
  static std::string version();

  // Builds the forward and backward plans of layout l (once; later calls return at once). Returns ""
  // when both exist, otherwise cuDNN's reason for refusing the shape (the caller falls back).
  std::string prepare(const AttentionLayout& l);
  // Device scratch forward() and backward() need for a prepared layout, in bytes.
  size_t workspace_bytes(const AttentionLayout& l);

  // ctx = softmax(scale q k^T + bias, causal) v; lse = each row's log-sum-exp ([B, heads, T], fp32).
  // bias: l.bias's [B, 1, T, T] tensor (packed_attention_bias), else null.
  void forward(const AttentionLayout& l, const void* qkv, void* ctx, float* lse, const float* slopes, const void* bias,
               void* workspace, cudaStream_t stream);
  // dqkv (q, k and v parts; written, not accumulated) from dctx, the forward's qkv, ctx and lse.
  void backward(const AttentionLayout& l, const void* dctx, const void* qkv, const void* ctx, const float* lse,
                void* dqkv, const float* slopes, const void* bias, void* workspace, cudaStream_t stream);

 private:
  struct Plan;
  struct Plans;
  Plans& plans(const AttentionLayout& l);
  void* handle_ = nullptr;
  std::map<decltype(AttentionLayout{}.key()), std::unique_ptr<Plans>> cache_;
};

}  // namespace shardlm::cuda
