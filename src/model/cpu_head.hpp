// Private to src/model: the ends of every family's CPU model, parameterised by the family's norms:
// the token embedding (optionally normed, as BLOOM's) and the LM head with its fused, chunked
// cross-entropy, greedy decoding's last-position logits included.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_layers.hpp"
#include "root_tensors.hpp"
#include "shardlm/core.hpp"

namespace shardlm::model_detail {

// A norm of the root unit: its tensors' offsets inside the flat parameter that holds them, and which
// one that is (RootTensor; a module's weight and bias are saved or frozen together).
struct CpuRootNorm {
  CpuNorm norm;
  bool saved = false;
  const float* params(CpuParams root) const { return saved ? root.adapter : root.base; }
  float* grads(UnitGrads droot) const { return saved ? droot.adapter : droot.base; }
};
// The norm at `model_norm`'s model_layout root offsets, placed for a run of cfg.
CpuRootNorm root_norm(const ModelConfig& cfg, const CpuNorm& model_norm);

// Errors naming who::what when a token id is outside [0, vocab_size).
void check_tokens(const int32_t* tokens, size_t n, int vocab_size, const char* who, const char* what);

// h0 = table[tokens] (then `norm`, when the family has one), over `max_tokens` tokens at most.
class CpuEmbedding {
 public:
  // `table` is the embedding matrix's place in the root; `norm` is null without a norm.
  CpuEmbedding(const char* who, RootTensor table, const CpuRootNorm* norm, int max_tokens, int hidden_size,
               int vocab_size);
  void forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0);
  // droot += the gradient of the embedding path given dh0 (the shape of the last forward), into the
  // tensors it trains (nothing when none).
  void backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot, int B, int T);
  size_t bytes() const { return (xhat_.size() + rstd_.size() + dx_.size()) * sizeof(float); }
  static size_t bytes_for(bool normed, size_t max_tokens, size_t hidden_size);

 private:
  const char* who_;
  RootTensor table_;
  bool normed_;
  CpuRootNorm norm_;
  int hidden_size_, vocab_size_;
  Buffer<float> xhat_, rstd_;  // the norm's state kept for backward
  Buffer<float> dx_;           // a row's input gradient when the table is frozen but the norm is trained
  int batch_ = -1, seq_ = -1;  // shape of the last forward
};

// Final norm, LM head (a [V, H] matrix in the root unit: the embeddings when tied) and
// cross-entropy; never more than a chunk of tokens' logits at a time.
class CpuLmHead {
 public:
  CpuLmHead(const char* who, const CpuRootNorm& norm, RootTensor head, int max_tokens, int hidden_size,
            int vocab_size);
  // CpuModel::head_loss: the sum of the token losses (count of positions with a target in *count);
  // with dh, the backward of grad_scale * sum into dh (written) and droot's trained tensors (+=).
  double loss(CpuParams root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
              float grad_scale, float* dh, UnitGrads droot);
  // CpuModel::head_logits: logits [B, V] of each sequence's last position.
  void last_logits(CpuParams root, const float* h, int B, int T, float* logits);
  size_t bytes() const;
  static size_t bytes_for(size_t max_tokens, size_t hidden_size, size_t vocab_size);
  // The logits chunk, loss()'s alone (CpuModel::head_scratch_bytes, share_head_scratch): its bytes as built
  // (scratch_bytes_for without building it), and where it is once grown to at least `bytes`.
  size_t scratch_bytes() const { return scratch_bytes_for(rows_.size(), static_cast<size_t>(vocab_size_)); }
  float* share_scratch(size_t bytes);
  static size_t scratch_bytes_for(size_t max_tokens, size_t vocab_size);

 private:
  const char* who_;
  CpuRootNorm norm_;
  RootTensor head_;
  int hidden_size_, vocab_size_;
  Buffer<int32_t> rows_;  // positions of the chunk's tokens
  Buffer<float> xhat_, rstd_, out_, grad_, logits_;
};

}  // namespace shardlm::model_detail
