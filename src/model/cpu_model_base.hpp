// Private to src/model: what every family's CpuModel shares (the shape checks, the count of its
// activation buffers, the token embedding, the final norm and LM head with its fused loss, greedy
// decoding's cache and scratch); a family adds its blocks, forward, backward and decoding.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "cpu_attention.hpp"
#include "cpu_head.hpp"
#include "cpu_lora.hpp"
#include "shardlm/model.hpp"

namespace shardlm::model_detail {

class CpuModelBase : public CpuModel {
 public:
  const ModelConfig& config() const override { return cfg_; }
  void embed_forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0) override;
  void embed_backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot, int B,
                      int T) override;
  double head_loss(CpuParams root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
                   float grad_scale, float* dh, UnitGrads droot) override;
  void head_logits(CpuParams root, const float* h, int B, int T, float* logits) override;
  void decode_end() override;
  void set_sample_starts(const int32_t* starts) override { starts_ = starts; }
  void set_dropout(std::optional<uint64_t> seed) override { lora_.set_dropout(seed); }
  // What the family allocated through allocate_activations, the ends and LoRA's buffers.
  size_t activation_bytes() const override { return activation_floats_ * sizeof(float) + shared_bytes(); }
  size_t head_scratch_bytes() const override { return head_ ? head_->scratch_bytes() : 0; }
  float* share_head_scratch(size_t bytes) override { return head_ ? head_->share_scratch(bytes) : nullptr; }
  void set_backward_tail_hook(std::function<void()> hook) override { tail_hook_ = std::move(hook); }

 protected:
  // `name` prefixes every error ("BloomCpu::block_forward: ...").
  CpuModelBase(const char* name, const ModelConfig& cfg, int max_batch, int max_seq);
  // The ends, located by their offsets in model_layout's root (placed for the run by root_tensor):
  // the embedding matrix at `table` (then `embed_norm` when not null), `final_norm` and the LM head's
  // [V, H] matrix at `head`.
  void build_ends(size_t table, const CpuNorm* embed_norm, const CpuNorm& final_norm, size_t head);
  // Errors naming name::what when B x T exceeds the sizes built for, or the layer does not exist.
  void check_shape(const char* what, int B, int T) const;
  void check_layer(const char* what, int layer) const;
  // block_forward's checks of B x T and the layer, which then remembers B x T for its backward.
  void begin_block_forward(int layer, int B, int T);
  // block_backward's checks: the layer exists and B x T is the shape of its last block_forward.
  void check_block_backward(int layer, int B, int T) const;
  // A family's block call: begin_block_forward for a forward, check_block_backward for a backward.
  void enter_block(int layer, int B, int T, bool forward) {
    if (forward)
      begin_block_forward(layer, B, T);
    else
      check_block_backward(layer, B, T);
  }
  size_t shared_bytes() const { return embedding_->bytes() + head_->bytes() + lora_.floats() * sizeof(float); }
  // A family's activation buffer (or workspace) of `floats` elements, counted in activation_bytes().
  void allocate_activations(Buffer<float>& buffer, size_t floats);

  // Greedy decoding: the key/value cache of `slots` sequences of `max_len` positions, kv_heads heads
  // in every layer, and one zeroed scratch array per entry of `scratch_floats`, alive until decode_end.
  void begin_decoding(int slots, int max_len, int max_rows, int kv_heads, std::initializer_list<size_t> scratch_floats);
  // name::block_decode errors for more rows than decode_begin's or rows outside the cache.
  void check_decode_rows(int layer, int n, const int* slots, const int* positions) const;
  float* scratch(size_t i) { return decode_scratch_[i].data(); }
  KvCache& cache() { return cache_; }

  const char* name_;
  ModelConfig cfg_;
  int max_batch_, max_seq_;
  const int32_t* starts_ = nullptr;  // set_sample_starts: the micro-batch's packed rows, or null
  CpuLoraBlocks lora_;               // the blocks' adapters (none without LoRA)
  // block_backward between its MLP and its attention (UnitModel::backward_tail_begin).
  void backward_tail_done() const {
    if (tail_hook_) tail_hook_();
  }

 private:
  std::optional<CpuEmbedding> embedding_;
  std::optional<CpuLmHead> head_;
  std::function<void()> tail_hook_;  // set_backward_tail_hook
  size_t activation_floats_ = 0;  // of the family's buffers
  std::vector<std::pair<int, int>> forward_shapes_;  // B x T of each layer's last block_forward
  KvCache cache_;
  int decode_rows_ = 0;
  std::vector<std::vector<float>> decode_scratch_;
};

// CpuModelBase::shared_bytes() (the ends and LoRA's buffers) without building the model, for
// cpu_activation_bytes.
size_t cpu_shared_bytes(const ModelConfig& cfg, bool normed_embedding, int max_batch, int max_seq);

}  // namespace shardlm::model_detail
