// The parts of a family's CpuModel every family shares (cpu_model_base.hpp).
#include "cpu_model_base.hpp"

#include <algorithm>

#include "size_checks.hpp"

namespace shardlm::model_detail {

CpuModelBase::CpuModelBase(const char* name, const ModelConfig& cfg, int max_batch, int max_seq)
    : name_(name), cfg_(cfg), max_batch_(max_batch), max_seq_(max_seq), lora_(cfg, max_batch, max_seq) {
  check_built_sizes(name, max_batch, max_seq);
  forward_shapes_.assign(std::max(cfg.num_layers, 0), {-1, -1});
}

void CpuModelBase::build_ends(size_t table, const CpuNorm* embed_norm, const CpuNorm& final_norm, size_t head) {
  const int tokens = max_batch_ * max_seq_;
  const std::optional<CpuRootNorm> normed = embed_norm ? std::optional(root_norm(cfg_, *embed_norm)) : std::nullopt;
  embedding_.emplace(name_, root_tensor(cfg_, table), normed ? &*normed : nullptr, tokens, cfg_.hidden_size,
                     cfg_.vocab_size);
  head_.emplace(name_, root_norm(cfg_, final_norm), root_tensor(cfg_, head), tokens, cfg_.hidden_size,
                cfg_.vocab_size);
}

size_t cpu_shared_bytes(const ModelConfig& cfg, bool normed_embedding, int max_batch, int max_seq) {
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  return CpuEmbedding::bytes_for(normed_embedding, tokens, cfg.hidden_size) +
         CpuLmHead::bytes_for(tokens, cfg.hidden_size, cfg.vocab_size) +
         CpuLoraBlocks::floats_for(cfg, tokens) * sizeof(float);
}

void CpuModelBase::check_shape(const char* what, int B, int T) const {
  check_batch_shape(name_, what, B, T, max_batch_, max_seq_);
}

void CpuModelBase::check_layer(const char* what, int layer) const {
  check_layer_index(name_, what, layer, cfg_.num_layers);
}

void CpuModelBase::allocate_activations(Buffer<float>& buffer, size_t floats) {
  buffer.allocate(floats, MemKind::Activations);
  activation_floats_ += floats;
}

void CpuModelBase::begin_block_forward(int layer, int B, int T) {
  check_shape("block_forward", B, T);
  check_layer("block_forward", layer);
  forward_shapes_[layer] = {B, T};
}

void CpuModelBase::check_block_backward(int layer, int B, int T) const {
  check_layer("block_backward", layer);
  const auto [batch, seq] = forward_shapes_[layer];
  SHARDLM_CHECK(B == batch && T == seq, name_, "::block_backward: layer ", layer, " shape ", B, " x ", T,
                " does not match its last block_forward (", batch, " x ", seq, ")");
}

void CpuModelBase::embed_forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0) {
  check_shape("embed_forward", B, T);
  embedding_->forward(root, tokens, B, T, h0);
}

void CpuModelBase::embed_backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot, int B,
                                  int T) {
  embedding_->backward(root, tokens, dh0, droot, B, T);  // nothing when none of its tensors is trained
}

double CpuModelBase::head_loss(CpuParams root, const float* h, const int32_t* targets, int B, int T,
                               int64_t* count, float grad_scale, float* dh, UnitGrads droot) {
  check_shape("head_loss", B, T);
  return head_->loss(root, h, targets, B, T, count, grad_scale, dh, droot);
}

void CpuModelBase::head_logits(CpuParams root, const float* h, int B, int T, float* logits) {
  check_shape("head_logits", B, T);
  head_->last_logits(root, h, B, T, logits);
}

void CpuModelBase::begin_decoding(int slots, int max_len, int max_rows, int kv_heads,
                                  std::initializer_list<size_t> scratch_floats) {
  SHARDLM_CHECK(slots >= 0 && max_len >= 0 && max_rows >= 0, name_, "::decode_begin: negative size (slots ", slots,
                ", max_len ", max_len, ", max_rows ", max_rows, ")");
  cache_.reset(cfg_.num_layers, slots, max_len, kv_heads, cfg_.head_dim());
  decode_rows_ = max_rows;
  lora_.decode_begin(max_rows);
  decode_scratch_.clear();
  for (size_t n : scratch_floats) decode_scratch_.emplace_back(n, 0.0f);
}

void CpuModelBase::decode_end() {
  cache_.clear();
  decode_rows_ = 0;
  std::vector<std::vector<float>>().swap(decode_scratch_);
}

void CpuModelBase::check_decode_rows(int layer, int n, const int* slots, const int* positions) const {
  SHARDLM_CHECK(n >= 0 && n <= decode_rows_, name_, "::block_decode: ", n, " rows exceed the ", decode_rows_,
                " of decode_begin");
  cache_.check_rows(concat(name_, "::block_decode").c_str(), layer, n, slots, positions);
}

}  // namespace shardlm::model_detail
