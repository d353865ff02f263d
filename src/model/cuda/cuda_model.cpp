// make_cuda_model: the GPU model of the family a ModelConfig names (its registry record's make_cuda).
#include "cuda_model.hpp"

namespace shardlm::cuda {

std::unique_ptr<CudaModel> make_cuda_model(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing) {
  const ModelFamily& family = model_family(cfg.arch);
  SHARDLM_CHECK(family.make_cuda, "model.arch = '", cfg.arch, "' has no CUDA model");
  return family.make_cuda(cfg, dt, max_batch, max_seq, activation_checkpointing);
}

}  // namespace shardlm::cuda
