// Private to src/model: the ends of every family's CPU model, parameterised by the family's norms:
// the token embedding (optionally normed, as BLOOM's) and the LM head with its fused, chunked
// cross-entropy, greedy decoding's last-position logits included.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_layers.hpp"
#include "shardlm/core.hpp"

namespace shardlm::model_detail {

// Errors naming who::what when a token id is outside [0, vocab_size).
void check_tokens(const int32_t* tokens, size_t n, int vocab_size, const char* who, const char* what);

// h0 = table[tokens] (then `norm`, when the family has one), over `max_tokens` tokens at most.
class CpuEmbedding {
 public:
  // `table` is the embedding matrix's offset in the root unit; `norm` is null without a norm.
  CpuEmbedding(const char* who, size_t table, const CpuNorm* norm, int max_tokens, int hidden_size, int vocab_size);
  void forward(const float* root, const int32_t* tokens, int B, int T, float* h0);
  // droot += the gradient of the embedding path given dh0 (the shape of the last forward).
  void backward(const float* root, const int32_t* tokens, const float* dh0, float* droot, int B, int T);
  size_t bytes() const { return (xhat_.size() + rstd_.size()) * sizeof(float); }
  static size_t bytes_for(bool normed, size_t max_tokens, size_t hidden_size);

 private:
  const char* who_;
  size_t table_;
  bool normed_;
  CpuNorm norm_;
  int hidden_size_, vocab_size_;
  Buffer<float> xhat_, rstd_;  // the norm's state kept for backward
  int batch_ = -1, seq_ = -1;  // shape of the last forward
};

// Final norm, LM head (a [V, H] matrix in the root unit: the embeddings when tied) and
// cross-entropy; never more than a chunk of tokens' logits at a time.
class CpuLmHead {
 public:
  CpuLmHead(const char* who, const CpuNorm& norm, size_t head, int max_tokens, int hidden_size, int vocab_size);
  // CpuModel::head_loss: the sum of the token losses (count of positions with a target in *count);
  // with dh, the backward of grad_scale * sum into dh (written) and droot (+=).
  double loss(const float* root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
              float grad_scale, float* dh, float* droot);
  // CpuModel::head_logits: logits [B, V] of each sequence's last position.
  void last_logits(const float* root, const float* h, int B, int T, float* logits);
  size_t bytes() const;
  static size_t bytes_for(size_t max_tokens, size_t hidden_size, size_t vocab_size);

 private:
  const char* who_;
  CpuNorm norm_;
  size_t head_;
  int hidden_size_, vocab_size_;
  Buffer<int32_t> rows_;  // positions of the chunk's tokens
  Buffer<float> xhat_, rstd_, out_, grad_, logits_;
};

}  // namespace shardlm::model_detail
