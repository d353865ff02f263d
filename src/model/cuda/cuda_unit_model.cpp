// The UnitModel of the CUDA backend: a CudaModel on the caller's stream (Stream is a
// cudaStream_t), with the loss sum and target count as device scalars (what the CUDA engine held
// before) and a pinned host scalar the loss is read back through.
#include <cuda_runtime_api.h>

#include "../unit_model_internal.hpp"
#include "cuda_check.hpp"
#include "cuda_model.hpp"
#include "device_memory.hpp"

namespace shardlm::model_detail {
namespace {

using cuda::DeviceBuffer;

cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

class CudaUnitModel final : public UnitModel {
 public:
  CudaUnitModel(std::unique_ptr<cuda::CudaModel> model, DType dt) : model_(std::move(model)), dt_(dt) {
    loss_.allocate(1);
    count_.allocate(1);
    host_loss_.allocate(1);
  }

  const ModelConfig& config() const override { return model_->config(); }
  DType compute_dtype() const override { return dt_; }

  // The CUDA models take no empty micro-batches: a rank without tokens only joins the collectives.
  void set_sample_starts(const int32_t* starts) override { model_->set_sample_starts(starts); }
  void set_dropout(std::optional<uint64_t> seed) override { model_->set_dropout(seed); }
  void embed_forward(UnitParams root, const int32_t* tokens, int B, int T, Stream s) override {
    if (B * T > 0) model_->embed_forward(root, tokens, B, T, stream_of(s));
  }
  void block_forward(int layer, UnitParams params, int B, int T, Stream s) override {
    if (B * T > 0) model_->block_forward(layer, params, B, T, stream_of(s));
  }
  void head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward, UnitGrads droot,
            Stream s) override {
    if (B * T > 0)
      model_->head(root, targets, B, T, grad_scale, backward, loss_.data(), count_.data(), droot, stream_of(s));
  }
  void block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, Stream s) override {
    if (B * T > 0) model_->block_backward(layer, params, grads, B, T, stream_of(s));
  }
  void embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T, Stream s) override {
    if (B * T > 0) model_->embed_backward(root, tokens, droot, B, T, stream_of(s));
  }
  void reset_loss(Stream s) override {
    loss_.zero(stream_of(s));
    count_.zero(stream_of(s));
  }
  double loss_sum(Stream s) override {
    SHARDLM_CUDA_CHECK(
        cudaMemcpyAsync(host_loss_.data(), loss_.data(), sizeof(float), cudaMemcpyDeviceToHost, stream_of(s)));
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(s)));
    return static_cast<double>(host_loss_.data()[0]);
  }

  size_t activation_bytes() const override { return model_->activation_bytes(); }
  std::string attention_description() const override { return model_->attention_description(); }
  int length_multiple() const override { return model_->length_multiple(); }
  std::string fp8_description() const override { return model_->fp8_description(); }
  void frozen_weights_changed() override { model_->frozen_weights_changed(); }
  size_t head_scratch_bytes() const override { return model_->head_scratch_bytes(); }
  void* share_head_scratch(size_t bytes) override { return model_->share_head_scratch(bytes); }
  void* lend_head_scratch(size_t bytes, const LendScratch& allocate) override {
    return model_->lend_head_scratch(bytes, allocate);
  }
  size_t backward_tail_begin() const override { return model_->backward_tail_begin(); }
  void set_backward_tail_hook(std::function<void()> hook) override { model_->set_backward_tail_hook(std::move(hook)); }
  bool writes_fresh_block_grads() const override { return true; }  // every CUDA family (CudaModelBase::zero_unwritten)

  void decode_allocate(int slots, int max_len, int max_rows) override {
    model_->decode_allocate(slots, max_len, max_rows);
  }
  void decode_free() override { model_->decode_free(); }
  void decode_embed(UnitParams root, const int32_t* tokens, int n, Stream s) override {
    model_->decode_embed(root, tokens, n, stream_of(s));
  }
  void decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                    Stream s) override {
    model_->decode_block(layer, params, slots, positions, n, stream_of(s));
  }
  void decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits, Stream s) override {
    model_->decode_head(root, rows, m, next, logits, stream_of(s));
  }

 private:
  std::unique_ptr<cuda::CudaModel> model_;
  DType dt_;
  DeviceBuffer<float> loss_;       // the token losses' sum since reset_loss
  DeviceBuffer<long long> count_;  // the positions with a target since reset_loss
  cuda::PinnedBuffer<float> host_loss_;
};

}  // namespace

std::unique_ptr<UnitModel> make_cuda_unit_model(std::unique_ptr<cuda::CudaModel> model, DType dt) {
  return std::make_unique<CudaUnitModel>(std::move(model), dt);
}

}  // namespace shardlm::model_detail
