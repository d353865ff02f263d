// TEMPORARY (replaced by the family registry's adapters): UnitModel over CpuModel / cuda::CudaModel.
#include <algorithm>

#include "shardlm/model.hpp"
#ifdef SHARDLM_HAVE_CUDA
#include "cuda_model.hpp"
#include "device_memory.hpp"
#endif

namespace shardlm {
namespace {

class CpuUnitModel final : public UnitModel {
 public:
  CpuUnitModel(std::unique_ptr<CpuModel> m, int max_batch, int max_seq) : m_(std::move(m)) {
    const size_t n = static_cast<size_t>(max_batch) * max_seq * m_->config().hidden_size;
    for (int i = 0; i < 2; ++i) h_[i].allocate(n, MemKind::Activations), dh_[i].allocate(n, MemKind::Activations);
  }
  const ModelConfig& config() const override { return m_->config(); }
  DType compute_dtype() const override { return DType::F32; }
  void embed_forward(const void* root, const int32_t* tokens, int B, int T, Stream) override {
    m_->embed_forward(f(root), tokens, B, T, h_[0].data());
    cur_ = 0;
  }
  void block_forward(int layer, const void* params, int B, int T, Stream) override {
    m_->block_forward(layer, f(params), h_[cur_].data(), h_[1 - cur_].data(), B, T);
    cur_ = 1 - cur_;
  }
  void head(const void* root, const int32_t* targets, int B, int T, float grad_scale, bool backward, float* droot,
            Stream) override {
    int64_t count = 0;
    loss_ += m_->head_loss(f(root), h_[cur_].data(), targets, B, T, &count, grad_scale,
                           backward ? dh_[0].data() : nullptr, droot);
    dcur_ = 0;
  }
  void block_backward(int layer, const void* params, float* dparams, int B, int T, Stream) override {
    m_->block_backward(layer, f(params), dh_[dcur_].data(), dh_[1 - dcur_].data(), dparams, B, T);
    dcur_ = 1 - dcur_;
  }
  void embed_backward(const void* root, const int32_t* tokens, float* droot, int B, int T, Stream) override {
    m_->embed_backward(f(root), tokens, dh_[dcur_].data(), droot, B, T);
  }
  void reset_loss(Stream) override { loss_ = 0.0; }
  double loss_sum(Stream) override { return loss_; }
  size_t activation_bytes() const override {
    return m_->activation_bytes() + 2 * (h_[0].size() + dh_[0].size()) * sizeof(float);
  }
  void decode_allocate(int slots, int max_len, int max_rows) override {
    m_->decode_begin(slots, max_len, max_rows);
    for (auto& v : dec_) v.assign(static_cast<size_t>(max_rows) * m_->config().hidden_size, 0.0f);
    logits_.assign(m_->config().vocab_size, 0.0f);
  }
  void decode_free() override {
    m_->decode_end();
    for (auto& v : dec_) std::vector<float>().swap(v);
  }
  void decode_embed(const void* root, const int32_t* tokens, int n, Stream) override {
    const size_t H = m_->config().hidden_size;
    for (int r = 0; r < n; ++r) m_->embed_forward(f(root), tokens + r, 1, 1, dec_[0].data() + r * H);
    dc_ = 0;
  }
  void decode_block(int layer, const void* params, const int32_t* slots, const int32_t* positions, int n,
                    Stream) override {
    m_->block_decode(layer, f(params), dec_[dc_].data(), dec_[1 - dc_].data(), n, slots, positions);
    dc_ = 1 - dc_;
  }
  void decode_head_argmax(const void* root, const int32_t* rows, int m, int32_t* next, Stream) override {
    const size_t H = m_->config().hidden_size;
    for (int i = 0; i < m; ++i) {
      m_->head_logits(f(root), dec_[dc_].data() + static_cast<size_t>(rows[i]) * H, 1, 1, logits_.data());
      next[i] = static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
    }
  }

 private:
  static const float* f(const void* p) { return static_cast<const float*>(p); }
  std::unique_ptr<CpuModel> m_;
  Buffer<float> h_[2], dh_[2];
  int cur_ = 0, dcur_ = 0, dc_ = 0;
  double loss_ = 0.0;
  std::vector<float> dec_[2], logits_;
};

#ifdef SHARDLM_HAVE_CUDA
class CudaUnitModel final : public UnitModel {
 public:
  CudaUnitModel(std::unique_ptr<cuda::CudaModel> m, DType dt) : m_(std::move(m)), dt_(dt) {
    loss_.allocate(1), count_.allocate(1);
    SHARDLM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), sizeof(float)));
  }
  ~CudaUnitModel() override { cudaFreeHost(host_); }
  const ModelConfig& config() const override { return m_->config(); }
  DType compute_dtype() const override { return dt_; }
  void embed_forward(const void* root, const int32_t* tokens, int B, int T, Stream s) override {
    m_->embed_forward(root, tokens, B, T, c(s));
  }
  void block_forward(int layer, const void* params, int B, int T, Stream s) override {
    m_->block_forward(layer, params, B, T, c(s));
  }
  void head(const void* root, const int32_t* targets, int B, int T, float grad_scale, bool backward, float* droot,
            Stream s) override {
    m_->head(root, targets, B, T, grad_scale, backward, loss_.data(), count_.data(), droot, c(s));
  }
  void block_backward(int layer, const void* params, float* dparams, int B, int T, Stream s) override {
    m_->block_backward(layer, params, dparams, B, T, c(s));
  }
  void embed_backward(const void* root, const int32_t* tokens, float* droot, int B, int T, Stream s) override {
    m_->embed_backward(root, tokens, droot, B, T, c(s));
  }
  void reset_loss(Stream s) override { loss_.zero(c(s)), count_.zero(c(s)); }
  double loss_sum(Stream s) override {
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(host_, loss_.data(), sizeof(float), cudaMemcpyDeviceToHost, c(s)));
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(c(s)));
    return static_cast<double>(*host_);
  }
  size_t activation_bytes() const override { return m_->activation_bytes(); }
  void decode_allocate(int slots, int max_len, int max_rows) override { m_->decode_allocate(slots, max_len, max_rows); }
  void decode_free() override { m_->decode_free(); }
  void decode_embed(const void* root, const int32_t* tokens, int n, Stream s) override {
    m_->decode_embed(root, tokens, n, c(s));
  }
  void decode_block(int layer, const void* params, const int32_t* slots, const int32_t* positions, int n,
                    Stream s) override {
    m_->decode_block(layer, params, slots, positions, n, c(s));
  }
  void decode_head_argmax(const void* root, const int32_t* rows, int m, int32_t* next, Stream s) override {
    m_->decode_head_argmax(root, rows, m, next, c(s));
  }

 private:
  static cudaStream_t c(Stream s) { return static_cast<cudaStream_t>(s); }
  std::unique_ptr<cuda::CudaModel> m_;
  DType dt_;
  cuda::DeviceBuffer<float> loss_;
  cuda::DeviceBuffer<long long> count_;
  float* host_ = nullptr;
};
#endif

}  // namespace

std::unique_ptr<UnitModel> make_unit_model(const ModelConfig& cfg, BackendKind backend, DType compute_dtype,
                                           int max_batch, int max_seq, bool activation_checkpointing) {
#ifdef SHARDLM_HAVE_CUDA
  if (backend == BackendKind::Cuda)
    return std::make_unique<CudaUnitModel>(
        cuda::make_cuda_model(cfg, compute_dtype, max_batch, max_seq, activation_checkpointing), compute_dtype);
#endif
  SHARDLM_CHECK(backend == BackendKind::Cpu, "this build has no CUDA backend");
  return std::make_unique<CpuUnitModel>(make_cpu_model(cfg, max_batch, max_seq), max_batch, max_seq);
}

}  // namespace shardlm
