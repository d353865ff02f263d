// make_cuda_model: the GPU model of the architecture a ModelConfig names.
#include "cuda_model.hpp"

#include "bloom_cuda.hpp"
#include "llama_cuda.hpp"

namespace shardlm::cuda {

std::unique_ptr<CudaModel> make_cuda_model(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing) {
  if (cfg.is_llama()) return std::make_unique<LlamaCuda>(cfg, dt, max_batch, max_seq, activation_checkpointing);
  SHARDLM_CHECK(cfg.arch == "bloom", "model.arch = '", cfg.arch, "' is not supported (bloom or llama)");
  return std::make_unique<BloomCuda>(cfg, dt, max_batch, max_seq, activation_checkpointing);
}

}  // namespace shardlm::cuda
