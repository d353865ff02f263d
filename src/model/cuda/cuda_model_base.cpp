// The parts of a family's CudaModel every family shares (cuda_model_base.hpp).
#include "cuda_model_base.hpp"

#include <algorithm>

#include "../size_checks.hpp"
#include "decode_head.hpp"

namespace shardlm::cuda {

CudaModelBase::CudaModelBase(const char* name, const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                             bool activation_checkpointing, bool alibi)
    : name_(name),
      cfg_(cfg),
      dt_(dt),
      dsize_(dtype_size(dt)),
      max_tokens_(max_batch * max_seq),
      max_seq_(max_seq),
      max_batch_(max_batch),
      checkpointing_(activation_checkpointing),
      attention_(name, cfg, dt, max_batch, max_seq, alibi),
      lora_(cfg, dt, max_batch, max_seq, activation_checkpointing) {
  model_detail::check_built_sizes(name, max_batch, max_seq);
}

void CudaModelBase::written_whole(size_t numel, std::vector<std::pair<size_t, size_t>> regions) {
  std::sort(regions.begin(), regions.end());
  block_numel_ = numel;
  block_written_ = std::move(regions);
}

void CudaModelBase::zero_unwritten(const UnitGrads& grads, cudaStream_t s, bool none_written) const {
  if (!grads.fresh || !grads.base) return;
  size_t at = 0;  // the first element not yet zeroed or written
  if (!none_written)
    for (const auto& [offset, count] : block_written_) {
      if (offset > at) SHARDLM_CUDA_CHECK(cudaMemsetAsync(grads.base + at, 0, (offset - at) * sizeof(float), s));
      at = std::max(at, offset + count);
    }
  if (block_numel_ > at)
    SHARDLM_CUDA_CHECK(cudaMemsetAsync(grads.base + at, 0, (block_numel_ - at) * sizeof(float), s));
}

int CudaModelBase::length_multiple() const {
  return model_detail::fp8_length_multiple(cfg_.fp8_linear, attention_.length_multiple());
}

void CudaModelBase::check_shape(const char* what, int B, int T) const {
  model_detail::check_batch_shape(name_, what, B, T, max_batch_, max_seq_);
}

void CudaModelBase::check_layer(const char* what, int layer) const {
  model_detail::check_layer_index(name_, what, layer, cfg_.num_layers);
}

void CudaModelBase::describe_fp8(const std::vector<model_detail::Fp8Linear>& linears, const std::string& also) {
  if (!cfg_.fp8_linear) return;
  fp8_note_ = model_detail::fp8_linear_note(linears, also, max_seq_);
  if (fp8_.kept_bytes() > 0)
    fp8_note_ += concat("; weights kept in E4M3 (model.fp8_keep_weights", fp8_.kept_frozen() ? ", frozen: all run" : "",
                        "): ", format_bytes(fp8_.kept_bytes()));
}

void CudaModelBase::allocate_step_buffers(size_t hidden_bytes, size_t attention_workspace_bytes,
                                          size_t head_workspace_bytes, const Fp8ScratchSize& fp8) {
  hidden_.allocate(hidden_bytes);
  attn_ws_.allocate(std::max(attention_workspace_bytes, attention_.workspace_bytes()));
  head_ws_.allocate(head_workspace_bytes);
  head_scratch_bytes_ = head_workspace_bytes;
  fp8_.allocate(fp8);
}

void* CudaModelBase::share_head_scratch(size_t bytes) {
  if (head_lent_) return head_lent_->bytes() >= bytes ? head_lent_->data() : nullptr;
  if (head_ws_.size() < bytes) head_ws_.allocate(bytes);  // (allocate frees the old first)
  return head_ws_.data();
}

void* CudaModelBase::lend_head_scratch(size_t bytes, const UnitModel::LendScratch& allocate) {
  const size_t n = std::max(bytes, head_scratch_bytes_);
  head_ws_.release();
  head_lent_ = allocate(n);
  if (!head_lent_) head_ws_.allocate(n);
  return head_scratch();
}

void CudaModelBase::allocate_cache(int slots, int max_len, int max_rows, int kv_heads) {
  SHARDLM_CHECK(slots >= 1 && max_len >= 1 && max_rows >= 1, name_, "::decode_allocate: bad sizes slots=", slots,
                " max_len=", max_len, " max_rows=", max_rows);
  free_cache();
  layer_cache_bytes_ = static_cast<size_t>(slots) * kv_heads * max_len * cfg_.head_dim() * dsize_;
  keys_.allocate(cfg_.num_layers * layer_cache_bytes_);
  values_.allocate(cfg_.num_layers * layer_cache_bytes_);
  max_len_ = max_len, max_rows_ = max_rows;
  lora_.decode_allocate(max_rows);
}

void CudaModelBase::free_cache() {
  keys_.release();
  values_.release();
  layer_cache_bytes_ = 0;
  max_len_ = max_rows_ = 0;
  lora_.decode_free();
}

bool CudaModelBase::check_step_rows(const char* what, int n) const {
  SHARDLM_CHECK(n >= 0 && n <= max_rows_, name_, "::", what, ": ", n, " rows, scratch for ", max_rows_,
                " (decode_allocate first)");
  return n > 0;
}

bool CudaModelBase::gather_head_rows(const void* hidden, const int32_t* rows, int m, void* out, cudaStream_t s) const {
  if (!check_step_rows("decode_head", m)) return false;
  gather_rows(hidden, rows, m, cfg_.hidden_size, out, dt_, s);
  return true;
}

void CudaModelBase::head_argmax(const void* normed, int m, const void* head, int chunk, int32_t* next, float* logits,
                                cudaStream_t s) {
  decode_head_rows(gemm_, normed, m, cfg_.hidden_size, head, cfg_.vocab_size, chunk,
                   reinterpret_cast<float*>(head_scratch()), next, logits, dt_, s);
}

}  // namespace shardlm::cuda
