// The UnitModel of the CPU backend: a CpuModel with the hidden states between units held here
// (what the CPU engine held before), fp32 compute, the loss summed in double, greedy decoding
// row by row over host arrays.
#include <algorithm>
#include <vector>

#include "unit_model_internal.hpp"

namespace shardlm::model_detail {
namespace {

class CpuUnitModel final : public UnitModel {
 public:
  CpuUnitModel(std::unique_ptr<CpuModel> model, int max_batch, int max_seq)
      : model_(std::move(model)), hidden_size_(model_->config().hidden_size) {
    const std::vector<UnitLayout> layout = model_layout(model_->config());
    block_numel_ = layout.size() > 1 ? layout[1].numel : 0;
    const size_t n = static_cast<size_t>(max_batch) * max_seq * hidden_size_;
    for (int i = 0; i < 2; ++i) {
      hidden_[i].allocate(n, MemKind::Activations);
      dhidden_[i].allocate(n, MemKind::Activations);
    }
  }

  const ModelConfig& config() const override { return model_->config(); }
  DType compute_dtype() const override { return DType::F32; }

  void set_sample_starts(const int32_t* starts) override { model_->set_sample_starts(starts); }
  void set_dropout(std::optional<uint64_t> seed) override { model_->set_dropout(seed); }
  void embed_forward(UnitParams root, const int32_t* tokens, int B, int T, Stream) override {
    model_->embed_forward(floats(root), tokens, B, T, hidden_[0].data());
    cur_ = 0;
  }
  void block_forward(int layer, UnitParams params, int B, int T, Stream) override {
    model_->block_forward(layer, floats(params), hidden_[cur_].data(), hidden_[1 - cur_].data(), B, T);
    cur_ = 1 - cur_;
  }
  void head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward, UnitGrads droot,
            Stream) override {
    int64_t count = 0;
    loss_ += model_->head_loss(floats(root), hidden_[cur_].data(), targets, B, T, &count, grad_scale,
                               backward ? dhidden_[0].data() : nullptr, backward ? droot : UnitGrads{});
    dcur_ = 0;
  }
  void block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, Stream) override {
    // UnitGrads::fresh: the CPU model adds to its gradients, so the block's are zeroed first (the engine's
    // fresh-gradient schedule then runs in CI too; the GPU families write them instead).
    if (grads.fresh && grads.base) std::fill(grads.base, grads.base + block_numel_, 0.0f);
    model_->block_backward(layer, floats(params), dhidden_[dcur_].data(), dhidden_[1 - dcur_].data(), grads, B, T);
    dcur_ = 1 - dcur_;
  }
  void embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T, Stream) override {
    model_->embed_backward(floats(root), tokens, dhidden_[dcur_].data(), droot, B, T);
  }
  void reset_loss(Stream) override { loss_ = 0.0; }
  double loss_sum(Stream) override { return loss_; }

  size_t activation_bytes() const override {
    size_t floats = 0;
    for (int i = 0; i < 2; ++i) floats += hidden_[i].size() + dhidden_[i].size();
    return model_->activation_bytes() + floats * sizeof(float);
  }
  size_t head_scratch_bytes() const override { return model_->head_scratch_bytes(); }
  void* share_head_scratch(size_t bytes) override { return model_->share_head_scratch(bytes); }
  size_t backward_tail_begin() const override { return model_->backward_tail_begin(); }
  void set_backward_tail_hook(std::function<void()> hook) override { model_->set_backward_tail_hook(std::move(hook)); }
  bool writes_fresh_block_grads() const override { return true; }
  std::string attention_description() const override { return "cpu"; }
  int length_multiple() const override { return 1; }

  void decode_allocate(int slots, int max_len, int max_rows) override {
    model_->decode_begin(slots, max_len, max_rows);
    decode_rows_ = max_rows;
    for (std::vector<float>& h : decode_hidden_) h.assign(static_cast<size_t>(max_rows) * hidden_size_, 0.0f);
    decode_logits_.assign(model_->config().vocab_size, 0.0f);
  }
  void decode_free() override {
    model_->decode_end();
    decode_rows_ = decode_n_ = 0;
    for (std::vector<float>* v : {&decode_hidden_[0], &decode_hidden_[1], &decode_logits_})
      std::vector<float>().swap(*v);
  }
  void decode_embed(UnitParams root, const int32_t* tokens, int n, Stream) override {
    SHARDLM_CHECK(n >= 0 && n <= decode_rows_, "CPU decode_embed: ", n, " rows exceed the ", decode_rows_,
                  " of decode_allocate");
    // The embedding is per token: one row at a time keeps within the sizes the model was built for.
    for (int r = 0; r < n; ++r)
      model_->embed_forward(floats(root), tokens + r, 1, 1, decode_hidden_[0].data() + static_cast<size_t>(r) * hidden_size_);
    decode_n_ = n;
    decode_cur_ = 0;
  }
  void decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                    Stream) override {
    model_->block_decode(layer, floats(params), decode_hidden_[decode_cur_].data(),
                         decode_hidden_[1 - decode_cur_].data(), n, slots, positions);
    decode_cur_ = 1 - decode_cur_;
  }
  void decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits_out, Stream) override {
    const int V = model_->config().vocab_size;
    for (int i = 0; i < m; ++i) {
      SHARDLM_CHECK(rows[i] >= 0 && rows[i] < decode_n_, "CPU decode_head: logit row ", rows[i],
                    " is not one of the step's ", decode_n_, " rows");
      float* logits = logits_out ? logits_out + static_cast<size_t>(i) * V : decode_logits_.data();
      model_->head_logits(floats(root), decode_hidden_[decode_cur_].data() + static_cast<size_t>(rows[i]) * hidden_size_,
                          1, 1, logits);
      // std::max_element returns the first maximum: the lowest id on ties, as torch.argmax.
      if (next) next[i] = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
    }
  }

 private:
  static const float* floats(const void* p) { return static_cast<const float*>(p); }
  static CpuParams floats(UnitParams p) { return {floats(p.base), floats(p.adapter)}; }

  std::unique_ptr<CpuModel> model_;
  size_t hidden_size_;
  size_t block_numel_ = 0;  // a block's elements (model_layout), zeroed for a fresh backward
  Buffer<float> hidden_[2], dhidden_[2];  // h and dh between units, ping-pong
  int cur_ = 0, dcur_ = 0;                // which of each holds the current state
  double loss_ = 0.0;
  // Greedy decoding (decode_allocate to decode_free): the step's hidden states, one row of logits.
  std::vector<float> decode_hidden_[2], decode_logits_;
  int decode_rows_ = 0, decode_n_ = 0, decode_cur_ = 0;
};

}  // namespace

std::unique_ptr<UnitModel> make_cpu_unit_model(std::unique_ptr<CpuModel> model, int max_batch, int max_seq) {
  return std::make_unique<CpuUnitModel>(std::move(model), max_batch, max_seq);
}

}  // namespace shardlm::model_detail
