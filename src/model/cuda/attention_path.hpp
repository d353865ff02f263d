// The attention a CUDA model runs, chosen once when the model is built (model.attention): cuDNN's
// fused flash attention where it can run the model's largest micro-batch, else the model's native
// kernels (alibi_attention.cu, gqa_attention.cu), with the reason either way for the run's log.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "shardlm/model.hpp"

namespace shardlm::cuda {

class CudnnAttention;

class AttentionPath {
 public:
  // alibi: the model's q/k/v rows are interleaved heads with ALiBi (BLOOM's), else grouped heads.
  // With model.attention = cudnn a path that cannot be taken is an Error naming why.
  AttentionPath(const char* model, const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool alibi);
  ~AttentionPath();
  AttentionPath(const AttentionPath&) = delete;
  AttentionPath& operator=(const AttentionPath&) = delete;

  bool fused() const { return fused_; }
  // Micro-batch lengths the path runs best at: cuDNN builds plans per shape (about 0.14 s each after
  // the first, docs/history/performance-log.md), so the fused path asks for multiples of 64; the native, any.
  int length_multiple() const { return fused_ ? 64 : 1; }
  // "cudnn (cuDNN 9.19.0 fused flash attention)" or "native (...why not cuDNN...)".
  const std::string& description() const { return description_; }
  // The workspace the fused calls need at the largest micro-batch, as cuDNN's plans report it
  // (0 when native); the model holds at least this much.
  size_t workspace_bytes() const { return capacity_; }

  // The fused calls (fused() only), in the model's layouts, with a workspace of workspace_bytes().
  // starts: packed rows (device [B*T], CudaModel::set_sample_starts) or null; packed rows are masked
  // through an additive [B, 1, T, T] bias built at the start of the workspace on every call, which then
  // holds the model's sliding window too (the graph's own window mask otherwise). `layer` (>= 0): that layer's
  // window (ModelConfig::layer_sliding_window: Gemma 3's global layers have none); -1: the model's.
  void forward(const void* qkv, void* ctx, float* lse, const float* slopes, const int32_t* starts, void* workspace,
               int B, int T, cudaStream_t s, int layer = -1);
  void backward(const void* dctx, const void* qkv, const void* ctx, const float* lse, void* dqkv, const float* slopes,
                const int32_t* starts, void* workspace, int B, int T, cudaStream_t s, int layer = -1);

 private:
  const char* model_;
  ModelConfig cfg_;
  DType dt_;
  bool alibi_;
  // Packed rows' bias at the start of the workspace (null when starts is null), with `window`.
  void* packed_bias(const int32_t* starts, void* workspace, int B, int T, int window, cudaStream_t s) const;
  int window_of(int layer) const;

  bool fused_ = false;
  size_t capacity_ = 0;    // workspace_bytes()
  size_t bias_bytes_ = 0;  // packed rows' bias (packed_attention_bias_bytes) when cfg.packed
  std::string description_;
  std::shared_ptr<CudnnAttention> cudnn_;  // shared_ptr: an incomplete type in builds without cuDNN
};

}  // namespace shardlm::cuda
